"""Shared fixtures: database vendor markers, trigger helpers, subprocess helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

REPO = Path(__file__).resolve().parent.parent

# The virtual clock fixture, as a site's conftest.py would list it. As a plugin
# name, not an import: helper processes import this module before Django is set up.
pytest_plugins = ["kumiko_workflows.testing"]


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if on_postgres():
        return
    skip = pytest.mark.skip(
        reason="needs PostgreSQL: run with DATABASE_URL=postgres://postgres@127.0.0.1:5432/kumiko"
    )
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> None:
    """The test database, its workflow tables distributed when ``KUMIKO_DISTRIBUTE`` is set.

    For a run of the suite against a Citus coordinator (with ``--reuse-db``:
    the coordinator's test database must keep the extension ``setup.sh``
    put in it); ``tests/test_citus.py`` distributes on its own.
    """
    if os.environ.get("KUMIKO_DISTRIBUTE"):
        from django.core.management import call_command

        with django_db_blocker.unblock():
            call_command("distribute_workflow_tables", "--shard-count", "8", verbosity=0)


@pytest.fixture
def now():
    return timezone.now()


@pytest.fixture
def past(now):
    """An instant an hour ago, as ISO 8601: a wait until then is due at once."""
    return (now - timedelta(hours=1)).isoformat()


@pytest.fixture
def future(now):
    """An instant an hour ahead, as ISO 8601: a wait until then is not due."""
    return (now + timedelta(hours=1)).isoformat()


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
