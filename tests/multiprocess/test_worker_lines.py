"""What a worker says and what it refuses, as a real process.

A ``--loop`` worker says at start where and how it works, stays quiet while
idle, and counts at the end only what it did; a second worker on one SQLite
database is refused with one line; ``--now`` makes one pass at a given instant.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from kumiko_workflows import event_types as et
from kumiko_workflows import run_id_for
from kumiko_workflows.engine.worker import Worker
from kumiko_workflows.models import WorkflowRunPending
from kumiko_workflows.store import db
from tests.multiprocess.test_worker import DEADLINE, stop, wait_for, wait_for_line
from tests.support import manage, on_postgres, run_manage, trigger, types_of

pytestmark = pytest.mark.django_db(transaction=True)


def loop_worker(*args: str) -> subprocess.Popen:
    return manage("resume_due_runs", "--loop", "--no-cron", *args)


def due_runs(past: str, count: int) -> list:
    return [
        run_id_for("t-wait", trigger("t.wait", **{"for": past}).payload["run_key"])
        for _ in range(count)
    ]


def terminate(worker: subprocess.Popen) -> tuple[int, str, str]:
    worker.send_signal(signal.SIGTERM)
    return stop(worker)


# --- the start line ------------------------------------------------------------------


def test_a_loop_worker_says_where_and_how_it_works_when_it_starts():
    worker = loop_worker("--tenant", "a", "--tenant", "b", "--interval", "7", "--limit", "9")
    try:
        (line,) = wait_for_line(worker, "worker started")
    finally:
        code, out, err = terminate(worker)
    assert code == 0, err

    vendor = connection.vendor
    listen = "on" if on_postgres() else "off"
    assert line.startswith(f"resume_due_runs: worker started pid={worker.pid} database=default ")
    assert f" vendor={vendor} " in line
    assert (
        f" tenants=a,b interval=7s listen={listen} cron=off batch_size=50 batch_seconds=0.5 "
        "limit=9 max_runs=none" in line
    )
    if on_postgres():
        settings = connection.settings_dict
        assert f" name={settings['NAME']} host=" in line
    else:
        assert f" file={connection.settings_dict['NAME']} " in line
    # Alone on its database, it warns of nothing.
    assert err.strip().splitlines() == [
        line for line in err.strip().splitlines() if "SIGTERM received" in line
    ]


def test_the_start_line_names_no_user_and_no_password(settings):
    settings.KUMIKO_WORKFLOWS = {"BATCH_SIZE": 1}
    saved = dict(connection.settings_dict)
    connection.settings_dict.update(USER="alice-the-user", PASSWORD="s3cret-word")
    try:
        line = Worker(cron=False).describe("off")
    finally:
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)

    assert "alice-the-user" not in line and "s3cret-word" not in line
    assert db.database_description() in line
    assert "batch_size=1 (a commit per run)" in line


# --- quiet while idle, truthful at the end -----------------------------------------


def test_an_idle_worker_prints_nothing_and_its_totals_are_what_it_did(past):
    worker = loop_worker("--interval", "0.1")
    try:
        wait_for_line(worker, "worker started")
        time.sleep(0.5)  # idle passes, every 0.1 s
        runs = due_runs(past, 3)
        wait_for(lambda: not WorkflowRunPending.objects.exists(), "the runs to be resumed")
    finally:
        code, out, err = terminate(worker)
    assert code == 0, err

    lines = out.splitlines()  # (after the start line)
    summaries = lines[:-1]
    # Every printed pass did something; the idle ones (many, at 0.1 s) printed nothing.
    assert summaries, out
    assert all(not line.startswith("resume_due_runs: resumed=0 ") for line in lines)
    done = sum(int(re.search(r" completed=(\d+)", line)[1]) for line in summaries)
    assert done == 3
    passes = int(re.search(r"stopped after (\d+) pass\(es\)", lines[-1])[1])
    assert passes > len(summaries)
    assert lines[-1].endswith("resumed=3 completed=3 suspended=0 failed=0 errors=0 fired=0"), lines[
        -1
    ]
    for run_id in runs:
        assert types_of(run_id)[-1] == et.RUN_COMPLETED


def test_at_verbosity_3_idle_passes_are_printed():
    worker = loop_worker("--interval", "0.1", "-v", "3")
    try:
        wait_for_line(worker, "resume_due_runs: resumed=0 completed=0 ")
    finally:
        code, _, err = terminate(worker)
    assert code == 0, err


def test_max_runs_counts_runs_the_worker_moved_on(past):
    due_runs(past, 7)
    worker = loop_worker("--max-runs", "5", "--interval", "300")
    code, out, err = stop(worker)

    assert code == 0, err
    assert out.splitlines()[-1].endswith(
        "resumed=5 completed=5 suspended=0 failed=0 errors=0 fired=0"
    ), out
    assert WorkflowRunPending.objects.count() == 2


# --- one worker per SQLite database --------------------------------------------------


def test_a_second_worker_on_sqlite_is_refused_with_one_line_and_the_first_counts_truly(past):
    if on_postgres():
        pytest.skip("PostgreSQL takes many workers (tests/multiprocess/test_worker.py races four)")
    first = loop_worker("--interval", "0.2")
    try:
        wait_for_line(first, "worker started")
        refusal = (
            f"CommandError: another resume worker (pid {first.pid}) is running on the SQLite "
            f"database {connection.settings_dict['NAME']}; SQLite allows one at a time: stop "
            "it first, or use PostgreSQL for several workers"
        )
        second = run_manage("resume_due_runs", "--loop", "--no-cron")
        assert (second.returncode, second.stdout, second.stderr.splitlines()) == (
            1,
            "",
            [refusal],
        )
        single_pass = run_manage("resume_due_runs", "--no-cron")
        assert (single_pass.returncode, single_pass.stderr.splitlines()) == (1, [refusal])

        runs = due_runs(past, 30)
        wait_for(lambda: not WorkflowRunPending.objects.exists(), "the first to resume them")
    finally:
        code, out, err = terminate(first)
    assert code == 0, err

    assert "database is locked" not in err and "SQLite allows" not in err, err
    assert out.splitlines()[-1].endswith(
        "resumed=30 completed=30 suspended=0 failed=0 errors=0 fired=0"
    ), out
    for run_id in runs:
        assert types_of(run_id).count(et.RESUMED) == 1
    # The first one gone, the next one starts.
    after = run_manage("resume_due_runs", "--no-cron")
    assert after.returncode == 0, after.stderr


def test_a_killed_sqlite_worker_leaves_no_stale_lock():
    if on_postgres():
        pytest.skip("the lock is SQLite's")
    doomed = loop_worker("--interval", "300")
    wait_for_line(doomed, "worker started")
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate(timeout=DEADLINE)

    after = run_manage("resume_due_runs", "--no-cron")

    assert after.returncode == 0, after.stderr
    assert after.stdout.startswith("resume_due_runs: resumed=0 ")


# --- --now -------------------------------------------------------------------------


def test_now_makes_one_pass_at_that_instant(future):
    run_id = run_id_for("t-wait", trigger("t.wait", **{"for": future}).payload["run_key"])
    later = (timezone.now() + timedelta(hours=2)).isoformat()

    call_command("resume_due_runs", "--no-cron", verbosity=0)
    assert types_of(run_id)[-1] == et.WAITING
    result = run_manage("resume_due_runs", "--no-cron", "--now", later, "--write")

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("resume_due_runs: resumed=1 completed=1 ")
    assert types_of(run_id)[-1] == et.RUN_COMPLETED


BAD_NOW = {
    "not an instant": (
        ["--now", "tomorrow"],
        "argument --now: 'tomorrow' is not an ISO 8601 instant (e.g. 2030-01-01T09:00:00+00:00)",
    ),
    "no offset": (
        ["--now", "2030-01-01T09:00:00"],
        "argument --now: '2030-01-01T09:00:00' has no UTC offset; give one, "
        "e.g. 2030-01-01T09:00:00+00:00",
    ),
    "with --loop": (
        ["--now", "2030-01-01T09:00:00Z", "--loop"],
        "--now makes one pass at a fixed instant; a --loop worker runs on the clock",
    ),
}


@pytest.mark.parametrize("args, message", BAD_NOW.values(), ids=BAD_NOW)
def test_a_bad_now_is_refused_saying_why(args, message):
    with pytest.raises(CommandError) as refused:
        call_command("resume_due_runs", *args)
    assert str(refused.value) == f"Error: {message}" or str(refused.value) == message
