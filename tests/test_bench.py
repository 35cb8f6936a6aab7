"""``manage.py kumiko_bench`` runs every scenario at a tiny size and leaves nothing behind.

No timings are asserted: the figures depend on the machine. Worker processes
need committed rows, hence ``transaction=True``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from urllib.parse import quote

import pytest
from django.core.management import call_command
from django.db import connection

from kumiko_workflows.bench import SCENARIOS
from kumiko_workflows.definition import registry
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from tests.conftest import REPO, on_postgres, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

#: One round, and a slow step of slow_step that sleeps 0.2 s instead of 5.
QUICK = ("--rounds", "1", "--slow-seconds", "0.2")


def _bench(*args: str) -> str:
    out = StringIO()
    # The bench registers its own workflows: keep them out of the other tests.
    with registry.override():
        call_command("kumiko_bench", *args, *QUICK, stdout=out)
    return out.getvalue()


def assert_result_lines(output: str) -> None:
    """Every scenario at ``--n 20`` printed its lines (or, on SQLite, why it was skipped)."""
    for name in ("append", "start", "drain", "drain_batch1", "scan", "memory"):
        assert re.search(
            rf"^RESULT name=kumiko_{name} n=\d+ seconds=[\d.]+ per_sec=[\d.]+$", output, re.M
        ), output
    # The drain at the configured BATCH_SIZE and at one run per commit, each beside the floor.
    for name in ("append", "drain", "drain_batch1"):
        assert re.search(rf"^RATIO name={name} value=[\d.]+$", output, re.M), output
    # With 20 rows the planner may rightly prefer a sequential scan.
    assert re.search(r"^SCAN ms=[\d.]+ index=(yes|no)$", output, re.M), output
    if on_postgres():
        assert re.search(r"^RESULT name=kumiko_wake n=20 ", output, re.M), output
        assert re.search(r"^RATIO name=drain_2 value=", output, re.M), output
        assert re.search(r"^RATIO name=drain_2_vs_1 value=", output, re.M), output
        assert re.search(r"^RESULT name=kumiko_slow_step n=20 ", output, re.M), output
        assert re.search(
            r"^SLOW_STEP quick_p50_s=[\d.]+ quick_p95_s=[\d.]+ quick_max_s=[\d.]+ slow_s=0.2$",
            output,
            re.M,
        ), output
    else:
        assert "SKIPPED name=kumiko_wake reason=needs PostgreSQL" in output
        assert "SKIPPED name=kumiko_drain_2" in output
        assert "SKIPPED name=kumiko_slow_step reason=SQLite allows one writer" in output
    assert "scenario" in output and "per sec" in output  # the table for people


def _tables() -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.table_names(cursor))


def test_every_scenario_prints_its_result_lines_and_removes_its_scratch_data(tmp_path):
    tables = _tables()
    report = tmp_path / "bench.json"

    output = _bench("--n", "20", "--json", str(report))

    assert_result_lines(output)
    assert '"results"' in report.read_text()

    tenant = re.search(r"tenant=(kumiko-bench-\w+)", output).group(1)
    assert not Event.objects.filter(tenant_id=tenant).exists()
    assert not WorkflowRun.objects.filter(tenant_id=tenant).exists()
    assert not WorkflowRunPending.objects.filter(tenant_id=tenant).exists()
    assert _tables() == tables


def test_the_users_rows_are_left_alone():
    from kumiko_workflows import append_event

    mine = append_event("6f1c2e1a-7a51-4bb8-9d5e-2b1d4a0c9e11", "note", "note.added", {"n": 1})

    _bench("--n", "5", "--scenario", "append", "--scenario", "scan")

    assert list(Event.objects.values_list("pk", flat=True)) == [mine.pk]


def test_an_unknown_scenario_is_refused():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="invalid choice"):
        call_command("kumiko_bench", "--scenario", "nope")


@pytest.fixture
def fresh_database_url(tmp_path: Path) -> Iterator[str]:
    """A brand-new, empty database on the test database's server, dropped afterwards."""
    if not on_postgres():
        yield f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
        return
    import psycopg
    from psycopg import sql

    db = connection.settings_dict
    name = f"kumiko_bench_fresh_{uuid.uuid4().hex[:12]}"
    server = {
        "host": db["HOST"] or None,
        "port": db["PORT"] or None,
        "user": db["USER"] or None,
        "password": db["PASSWORD"] or None,
    }
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        user = quote(db["USER"] or "", safe="")
        password = f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else ""
        yield f"postgres://{user}{password}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{name}"
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def test_the_bench_runs_on_a_freshly_migrated_database(fresh_database_url):
    # What a user does (README, Performance): the example project's settings,
    # a new database, migrate, then the bench, each a real process.
    env = subprocess_env(
        DJANGO_SETTINGS_MODULE="example_project.settings", DATABASE_URL=fresh_database_url
    )
    env.pop("KUMIKO_TEST_DB_NAME")

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(REPO / "manage.py"), *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    manage("migrate", "-v", "0")
    # drain first: its seeded events then have ids from 1, the very ids a
    # scratch copy of the event table hands out first unless told otherwise.
    order = ["drain", *(name for name in SCENARIOS if name != "drain")]
    scenarios = [arg for name in order for arg in ("--scenario", name)]
    output = manage("kumiko_bench", "--n", "20", *QUICK, *scenarios)

    assert_result_lines(output)
