"""The engine on ``KUMIKO_WORKFLOWS["DATABASE"] = "workflows"``, a second alias (PostgreSQL).

A real site in subprocesses (``tests/settings_alias.py``): ``default`` holds
only the site's tables, ``workflows`` the engine's. Triggers, a wait, a
wake-up by an awaited event delivered to a LISTENing ``--loop`` worker, and
the admin pages all work there. And what is atomic with what
(``tests/support/alias_atomic.py``, on SQLite too): an append inside the site's
transaction alone is refused; inside one on the engine's alias it commits
or rolls back with it, also when the process dies right after the commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from django.db import connection

from tests.support import REPO, subprocess_env


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
    out = _run(["-m", "tests.support.alias_site"], two_databases)
    seen = json.loads(out.strip().splitlines()[-1])

    assert seen["default_has_engine_tables"] is False
    # for OUTBOX_DATABASES (tests/multiprocess/test_outbox.py)
    assert seen["default_has_outbox"] is True
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


@pytest.fixture
def site_and_engine(request, tmp_path):
    """The names of the site's and the engine's databases, migrated: PostgreSQL's or files."""
    if connection.vendor == "postgresql":
        names = request.getfixturevalue("two_databases")
    else:
        names = (str(tmp_path / "site.sqlite3"), str(tmp_path / "workflows.sqlite3"))
    manage = str(REPO / "manage.py")
    _run([manage, "migrate", "-v", "0"], names)
    _run([manage, "migrate", "--database", "workflows", "-v", "0"], names)
    return names


def _left(names, *args):
    out = _run(["-m", "tests.support.alias_atomic", *args], names)
    return json.loads(out.strip().splitlines()[-1])


NOTHING = {"group": False, "events": [], "run": None, "signals": []}
STARTED = {
    "events": ["t.recorded", "t.wait"],  # the trigger and the first step's side event
    "run": "waiting",
    "signals": ["run_started", "run_suspended"],
}


@pytest.mark.django_db
def test_what_is_atomic_with_what_when_the_engine_has_a_database_of_its_own(site_and_engine):
    seen = _left(site_and_engine, "cases")

    # In the site's transaction alone: refused before any SQL, nothing written, and
    # the site's write rolled back with its block.
    refused = seen["refused"]
    assert {k: refused[k] for k in NOTHING} == NOTHING, refused
    assert refused["engine_statements"] == 0, refused
    assert refused["refused"].startswith(
        "append_event() was called inside a transaction on database 'default', but the "
        "engine's tables are on 'workflows' (KUMIKO_WORKFLOWS['DATABASE']), where no "
        "transaction is open"
    ), refused
    assert "transaction.atomic(using='workflows')" in refused["refused"]
    # ... and the outbox that would make the append join the site's transaction.
    assert "List 'default' in KUMIKO_WORKFLOWS['OUTBOX_DATABASES']" in refused["refused"]
    # Caught, it leaves the caller's transaction usable (and opens none on the engine's).
    caught = seen["refused_caught"]
    assert (caught["caught"], caught["engine_in_transaction"]) == (
        "CrossDatabaseTransaction",
        False,
    )
    assert {**caught, "group": False} == {
        **NOTHING,
        "caught": "CrossDatabaseTransaction",
        "engine_in_transaction": False,
    }
    assert caught["group"] is True, "the site's write after the refusal committed"

    # In transactions on both: a rollback leaves nothing, no signal; a commit leaves the
    # write, the run and its side event, and sends the signals after the commit only.
    assert {k: seen["both_rollback"][k] for k in NOTHING} == NOTHING, seen["both_rollback"]
    both = seen["both_commit"]
    assert {k: both[k] for k in STARTED} == STARTED and both["group"] is True, both
    assert both["heard_inside"] == [], "a signal was sent before the transaction committed"

    # The reverse: a transaction on the engine's alias alone holds the engine's writes.
    assert {k: seen["engine_rollback"][k] for k in NOTHING} == NOTHING, seen["engine_rollback"]
    engine = seen["engine_commit"]
    assert {k: engine[k] for k in STARTED} == STARTED and engine["heard_inside"] == [], engine
    # No transaction anywhere: the append is its own, as with one database.
    assert {k: seen["autocommit"][k] for k in STARTED} == STARTED, seen["autocommit"]

    # The other writing operations are refused alike, and the run is untouched.
    operations = seen["operations"]
    assert sorted(operations["refused_operations"]) == [
        "cancel_run",
        "fire_schedule_now",
        "rerun_run",
        "wake_run",
    ], operations
    assert all(
        message.startswith(f"{name}() was called inside a transaction on database 'default'")
        and "OUTBOX_DATABASES" not in message  # an outbox takes appends only
        for name, message in operations["refused_operations"].items()
    ), operations
    assert operations["run"] == "waiting", operations
    # The admin's actions act in a transaction of their own on the engine's alias, also
    # inside a request's transaction on the site's (ATOMIC_REQUESTS).
    admin = seen["admin"]
    assert (admin.get("admin_status"), admin.get("woken")) == (302, True), admin


@pytest.mark.django_db
def test_an_append_committed_on_both_aliases_survives_the_process_dying_at_the_commit(
    site_and_engine,
):
    key = f"crash-{uuid.uuid4().hex[:8]}"
    env = subprocess_env(
        DJANGO_SETTINGS_MODULE="tests.settings_alias",
        KUMIKO_TEST_ALIAS_DEFAULT=site_and_engine[0],
        KUMIKO_TEST_ALIAS_WORKFLOWS=site_and_engine[1],
    )
    env.pop("KUMIKO_TEST_DB_NAME", None)
    died = subprocess.run(
        [sys.executable, "-m", "tests.support.alias_atomic", "crash", key],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert died.returncode == 17, died.stderr

    left = _left(site_and_engine, "read", key)
    assert left == {**STARTED, "group": True, "signals": []}, left  # signals: this process
