"""The engine on ``KUMIKO_WORKFLOWS["DATABASE"] = "workflows"``, a second alias (PostgreSQL).

A real site in subprocesses (``tests/settings_alias.py``): ``default`` holds
only the site's tables, ``workflows`` the engine's. Triggers, a wait, a
wake-up by an awaited event delivered to a LISTENing ``--loop`` worker, and
the admin pages all work there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from django.db import connection

from tests.conftest import REPO, subprocess_env


def _admin(sql: str) -> None:
    import psycopg

    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    params["dbname"] = "postgres"
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture
def two_databases():
    token = uuid.uuid4().hex[:8]
    names = (f"kumiko_alias_{token}_site", f"kumiko_alias_{token}_wf")
    for name in names:
        _admin(f'CREATE DATABASE "{name}"')
    try:
        yield names
    finally:
        for name in names:
            _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _run(args, names, timeout=180):
    env = subprocess_env(
        DJANGO_SETTINGS_MODULE="tests.settings_alias",
        KUMIKO_TEST_ALIAS_DEFAULT=names[0],
        KUMIKO_TEST_ALIAS_WORKFLOWS=names[1],
    )
    env.pop("KUMIKO_TEST_DB_NAME", None)
    result = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_engine_runs_on_a_second_database_alias(two_databases):
    manage = str(REPO / "manage.py")
    _run([manage, "migrate", "-v", "0"], two_databases)
    _run([manage, "migrate", "--database", "workflows", "-v", "0"], two_databases)
    _run([manage, "check", "--fail-level", "WARNING"], two_databases)
    seen = json.loads(_run(["-m", "tests.alias_site"], two_databases).strip().splitlines()[-1])

    assert seen["default_has_engine_tables"] is False
    assert seen["workflows_has_engine_tables"] is True
    assert (seen["wait_started"], seen["pending_rows"]) == ("waiting", 1), seen
    assert seen["wait_after_pass"] == "completed", seen
    assert seen["event_started"] == "waiting", seen
    assert seen["event_after_notify"] == "completed", seen
    assert seen["notify_seconds"] < 30, "woken by the interval (300 s), not by NOTIFY"
    assert seen["admin"] == {"runs": 200, "run": 200, "events": 200, "pending": 200}, seen
    assert seen["run_page_names_run"] is True
    assert (seen["purged"], seen["run_events_left"], seen["tombstones"]) == ("purged runs=2", 0, 2)


def test_a_missing_router_or_alias_is_a_system_check_error(settings):
    from types import SimpleNamespace

    from kumiko_workflows.checks import _database_problems, check_settings

    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "DATABASE": "nowhere"}
    assert "kumiko_workflows.E025" in [e.id for e in check_settings()]
    site = SimpleNamespace(DATABASES={"default": {}, "nowhere": {}}, DATABASE_ROUTERS=[])
    assert [e.id for e in _database_problems(site)] == ["kumiko_workflows.E026"]
    site.DATABASE_ROUTERS = ["kumiko_workflows.routers.WorkflowsRouter"]
    assert _database_problems(site) == []
