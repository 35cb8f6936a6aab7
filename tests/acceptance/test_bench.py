"""``manage.py kumiko_bench`` runs every scenario in a scratch database it drops.

No timings are asserted: the figures depend on the machine. Worker processes
need committed rows, hence ``transaction=True``. The bench works in a
database of its own (``<name>_kbench_<token>`` on PostgreSQL, a temporary
file on SQLite), so the test database must come out of it unwritten.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from kumiko_bench.scenarios import Bench
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.workflow.registry import registry
from tests.support import REPO, on_postgres, subprocess_env

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
    for name in ("append", "start", "drain", "drain_batch1", "drain_traced", "scan", "memory"):
        assert re.search(
            rf"^RESULT name=kumiko_{name} n=\d+ seconds=[\d.]+ per_sec=[\d.]+$", output, re.M
        ), output
    # The drain at the configured BATCH_SIZE and at one run per commit, each beside the floor,
    # and traced beside untraced.
    # The batched modes beside the batched floor too.
    for name in (
        "append",
        "drain",
        "drain_vs_batched_floor",
        "drain_batch1",
        "drain_traced",
        "tasks",
    ):
        assert re.search(rf"^RATIO name={name} value=[\d.]+$", output, re.M), output
    # Django tasks: enqueued, then executed beside the same number of one-step runs.
    for name in ("tasks", "tasks_enqueue"):
        assert re.search(rf"^RESULT name=kumiko_{name} n=\d+ ", output, re.M), output
    # Tracing and metrics on beside off: every run's spans were exported.
    assert re.search(
        r"^DRAIN_TRACED worker_cpu_us_per_run_off=\d+ worker_cpu_us_per_run_on=\d+ "
        r"overhead_us_per_run=-?\d+ sdk_floor_us_per_run=\d+ best_ratio=[\d.]+$",
        output,
        re.M,
    ), output
    assert re.search(r"^drain_traced .* 2 spans per run exported$", output, re.M), output
    # An awaited append beside a plain one, alone and in one transaction; the profile.
    for mode in ("awaited_append", "awaited_append_tx"):
        assert re.search(
            rf"^AWAITED_APPEND mode={mode} awaited_ms=[\d.]+ plain_ms=[\d.]+ cost=[\d.]+$",
            output,
            re.M,
        ), output
    assert re.search(
        r"^PROFILE batch=1 tracing=off runs=\d+ us_per_run=\d+ database=\d+% driver=\d+% "
        r"django=\d+% engine=\d+% other=\d+%$",
        output,
        re.M,
    ), output
    for tracing in ("off", "traced"):  # the CPU per run, unprofiled; traced with the SDK
        assert re.search(
            rf"^PROFILE_CPU batch=\d+ tracing={tracing} runs=\d+ cpu_us_per_run=\d+ "
            r"wall_us_per_run=\d+$",
            output,
            re.M,
        ), output
    # With 20 rows the planner may rightly prefer a sequential scan.
    assert re.search(r"^SCAN ms=[\d.]+ orm_ms=[\d.]+ index=(yes|no)$", output, re.M), output
    if on_postgres():
        assert re.search(r"^RESULT name=kumiko_wake n=20 ", output, re.M), output
        assert re.search(r"^RATIO name=drain_2 value=", output, re.M), output
        for name in ("drain_2_vs_1", "floor_2_vs_1", "floor_batch_2_vs_1"):
            assert re.search(rf"^RATIO name={name} value=[\d.]+$", output, re.M), output
        assert re.search(r"^RATIO name=drain_2_vs_batched_floor value=", output, re.M), output
        assert re.search(r"^RATIO name=drain_row_by_row value=", output, re.M), output
        assert re.search(r"^RESULT name=kumiko_slow_step n=20 ", output, re.M), output
        assert re.search(r"^RATIO name=fairness value=[\d.]+$", output, re.M), output
        assert re.search(
            r"^FAIRNESS small_p50_s=[\d.]+ small_p95_s=[\d.]+ small_max_s=[\d.]+ "
            r"big_rate_vs_alone=[\d.]+ big_alone_s=[\d.]+ big_beside_s=[\d.]+$",
            output,
            re.M,
        ), output
        assert re.search(r"^RATIO name=unanalysed value=[\d.]+$", output, re.M), output
        assert re.search(r"^RESULT name=kumiko_fan_out n=20 ", output, re.M), output
        assert re.search(r"^RATIO name=fan_out value=[\d.]+$", output, re.M), output
        # Each round's parts: the one transaction and the two workers' drain, on each side.
        assert re.search(
            r"^FAN_OUT n=20 fan_s=[\d.]+ parent_tx_s=[\d.]+ children_s=[\d.]+ runs_s=[\d.]+ "
            r"seed_tx_s=[\d.]+ runs_drain_s=[\d.]+ load=[\d.]+$",
            output,
            re.M,
        ), output
        assert re.search(
            r"^UNANALYSED waiting=20 p50_ms=[\d.]+ analysed_p50_ms=[\d.]+$", output, re.M
        ), output
        for name in ("slow_step", "slow_step_alone"):
            assert re.search(
                rf"^SLOW_STEP name={name} quick_p50_s=[\d.]+ quick_p95_s=[\d.]+ "
                r"quick_max_s=[\d.]+ slow_s=0.2$",
                output,
                re.M,
            ), output
    else:
        assert "SKIPPED name=kumiko_wake reason=needs PostgreSQL" in output
        assert "SKIPPED name=kumiko_drain_2" in output
        assert "SKIPPED name=kumiko_slow_step reason=SQLite allows one writer" in output
        assert "SKIPPED name=kumiko_fairness reason=SQLite allows one writer" in output
        assert "SKIPPED name=kumiko_unanalysed reason=needs PostgreSQL" in output
        assert "SKIPPED name=kumiko_fan_out reason=SQLite allows one writer" in output
    assert "scenario" in output and "per sec" in output  # the table for people


def _tables() -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.table_names(cursor))


def _scratch_name(output: str) -> str:
    found = re.search(
        r"^kumiko_bench: scratch database (\S+) \(dropped at the end\)$", output, re.M
    )
    assert found, output
    return found.group(1)


def _database_exists(name: str) -> bool:
    if not on_postgres():
        return Path(name).exists() or Path(name).parent.exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        return cursor.fetchone() is not None


def assert_untouched(configured: str, tables: set[str]) -> None:
    """The configured database is the current one again, and nothing was written to it."""
    assert connection.settings_dict["NAME"] == configured
    assert settings.DATABASES["default"]["NAME"] == configured
    assert _tables() == tables
    assert not Event.objects.exists()
    assert not WorkflowRun.objects.exists()
    assert not WorkflowRunPending.objects.exists()


def test_scenarios_run_in_process_in_a_scratch_database_it_drops(tmp_path):
    # Every scenario's lines are checked once, in the README command's real
    # process below; here two, called in this process, with the JSON report.
    configured, tables = connection.settings_dict["NAME"], _tables()
    report = tmp_path / "bench.json"

    output = _bench(
        "--n", "20", "--scenario", "append", "--scenario", "drain", "--json", str(report)
    )

    for name in ("append", "drain"):
        assert re.search(
            rf"^RESULT name=kumiko_{name} n=20 seconds=[\d.]+ per_sec=[\d.]+$", output, re.M
        ), output
        assert re.search(rf"^RATIO name={name} value=[\d.]+$", output, re.M), output
    results = json.loads(report.read_text())["results"]
    assert {"append", "drain"} <= {result["scenario"] for result in results}, results
    scratch = _scratch_name(output)
    assert scratch != configured
    if on_postgres():
        assert scratch.startswith(f"{configured}_kbench_")
    assert not _database_exists(scratch)
    assert_untouched(configured, tables)


def test_the_users_rows_are_left_alone():
    from kumiko_workflows import append_event

    mine = append_event("6f1c2e1a-7a51-4bb8-9d5e-2b1d4a0c9e11", "note", "note.added", {"n": 1})

    _bench("--n", "5", "--scenario", "append", "--scenario", "scan")

    assert list(Event.objects.values_list("pk", flat=True)) == [mine.pk]


def test_a_failing_scenario_still_stops_its_workers_and_drops_its_database(monkeypatch):
    configured, tables = connection.settings_dict["NAME"], _tables()
    workers = []

    def breaks(bench: Bench) -> None:
        bench.fresh_database()
        # A worker that has connected to the scratch database and waits for GO.
        workers.extend(bench.start_workers("drain", 1))
        raise RuntimeError("the scenario broke")

    monkeypatch.setattr(Bench, "scenario_scan", breaks)
    out = StringIO()
    with registry.override(), pytest.raises(CommandError, match="the scenario broke"):
        call_command("kumiko_bench", "--scenario", "scan", *QUICK, stdout=out)

    assert workers and all(proc.poll() is not None for proc in workers)
    assert not _database_exists(_scratch_name(out.getvalue()))
    assert_untouched(configured, tables)


@pytest.mark.postgres
def test_dashboard_data_never_replaces_a_database_the_bench_did_not_keep():
    name = f"kumiko_not_the_benchs_{os.getpid()}"
    with connection._nodb_cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
    try:
        args = ("--scenario", "dashboard", "--n", "100", "--dashboard-data", name)
        with registry.override(), pytest.raises(CommandError, match="not one the bench kept"):
            call_command("kumiko_bench", *args, *QUICK, stdout=StringIO())
        assert _database_exists(name)
    finally:
        with connection._nodb_cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(name)}")


def test_debug_on_is_refused(settings):
    # The bench no longer switches DEBUG off at run time: its settings do.
    settings.DEBUG = True

    with pytest.raises(CommandError, match="DEBUG = False"):
        call_command("kumiko_bench", "--scenario", "append")


def test_an_unknown_scenario_is_refused():
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("kumiko_bench", "--scenario", "nope")


def test_a_worker_needs_its_scratch_database():
    with pytest.raises(CommandError, match="--scratch"):
        call_command("kumiko_bench", "--worker", "drain", "--tenant", "kumiko-bench-x")


def _database_url(tmp_path: Path) -> str:
    """The test database as a URL (on SQLite, a file the bench must never create)."""
    if not on_postgres():
        return f"sqlite:///{tmp_path / 'configured.sqlite3'}"
    db = connection.settings_dict
    user = quote(db["USER"] or "", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else ""
    host = f"{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}"
    return f"postgres://{user}{password}@{host}/{db['NAME']}"


def test_the_readme_command_runs_every_scenario_on_freshly_created_databases(tmp_path):
    # What a user does (docs/discussions/performance.md): the bench's own settings, the
    # server in DATABASE_URL, a real process. Every measurement runs on a
    # database the bench has just created and migrated (so a drain's seeded
    # events have ids from 1, the ids a scratch copy of the event table hands
    # out first unless told otherwise), and none is left behind.
    configured, tables = connection.settings_dict["NAME"], _tables()
    env = subprocess_env(DATABASE_URL=_database_url(tmp_path))
    for name in ("DJANGO_SETTINGS_MODULE", "KUMIKO_TEST_DB_NAME"):
        env.pop(name)

    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "manage.py"),
            "kumiko_bench",
            "--settings",
            "kumiko_bench.settings",
            "--n",
            "20",
            *QUICK,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert_result_lines(done.stdout)
    assert not _database_exists(_scratch_name(done.stdout))
    assert not (tmp_path / "configured.sqlite3").exists()
    assert_untouched(configured, tables)
