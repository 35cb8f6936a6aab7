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
