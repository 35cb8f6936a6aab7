"""Helpers the tests share: triggering runs, reading their streams, real subprocesses.

The fixtures are ``tests/conftest.py``'s; the modules beside this one are the
helpers of the multi-process tests (``faults``: a TCP proxy and worker
processes; ``skewed_clock``; ``alias_atomic`` and ``alias_site``: a site on
two database aliases) and a step kind written outside the package
(``step_kinds``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from django.db import connection

REPO = Path(__file__).resolve().parent.parent.parent


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


def waits_for_a_lock(application_name: str | None = None) -> bool:
    """Whether a backend of this test database (of that process, if named) waits for a lock now.

    On distributed tables (Citus) a lock on a row is taken on the worker that
    holds it, where the coordinator's backend waits for the answer (as a
    client read, not a lock): Citus's view of the cluster's lock waits says
    which of the coordinator's backends wait there.
    """
    from kumiko_workflows.store import distribution

    named = "" if application_name is None else " AND application_name = %s"
    params = [] if application_name is None else [application_name]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # a fresh look in this transaction
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "  # noqa: S608
            f"WHERE datname = current_database() AND wait_event_type = 'Lock'{named}",
            params,
        )
        if cursor.fetchone()[0] > 0:
            return True
        if not distribution.distributed():
            return False
        cursor.execute(
            "SELECT count(*) FROM citus_lock_waits w "  # noqa: S608
            "JOIN citus_stat_activity a ON a.global_pid = w.waiting_gpid "
            f"WHERE a.datname = current_database(){named}",
            params,
        )
        return cursor.fetchone()[0] > 0


def trigger(type: str, tenant_id: str = "default", **payload: Any):
    """Append a domain event (which may start runs) and return it."""
    from kumiko_workflows import append_event

    payload.setdefault("run_key", uuid.uuid4().hex)
    return append_event(uuid.uuid4(), "test-source", type, payload, tenant_id=tenant_id)


def run_events(run_id) -> list:
    from kumiko_workflows import load_stream

    return load_stream(run_id)


def types_of(run_id) -> list[str]:
    return [event.type for event in run_events(run_id)]


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that uses this test database."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["KUMIKO_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def manage(*args: str, **kwargs: Any) -> subprocess.Popen:
    """Start ``manage.py`` with the test settings as a real subprocess."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "manage.py"), *args],
        cwd=REPO,
        env=subprocess_env(),
        stdout=kwargs.pop("stdout", subprocess.PIPE),
        stderr=kwargs.pop("stderr", subprocess.PIPE),
        text=True,
        **kwargs,
    )


def run_manage(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), *args],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_python(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -c script args...`` as a real subprocess on the test database."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
