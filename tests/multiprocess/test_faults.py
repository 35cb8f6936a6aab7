"""Faults survived: killed workers, killed connections, a database that goes away.

Workers are real ``manage.py resume_due_runs`` processes. The database going
away is a TCP proxy (tests/support/faults.py) that the test kills and
restarts; the shared PostgreSQL server itself is never stopped.
"""

from __future__ import annotations

import json
import signal
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction

from kumiko_workflows import append_event, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from tests.support import run_events, run_python, subprocess_env, trigger, types_of
from tests.support.faults import Proxy, Worker, database_url, free_port, wait_for

COMPLETED_RUN = [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_COMPLETED]


def _backends(application_name: str, *, listening: bool = False) -> list[int]:
    """Its backends' pids; ``listening``: only those whose (last) statement was a LISTEN."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
            " AND (NOT %s OR left(query, 7) = 'LISTEN ')",
            [application_name, listening],
        )
        return [pid for (pid,) in cursor.fetchall()]


def _status(run_id) -> str | None:
    return WorkflowRun.objects.filter(run_id=run_id).values_list("status", flat=True).first()


def _due_wait_run(past: str):
    event = trigger("t.wait", **{"for": past})
    return run_id_for("t-wait", event.payload["run_key"])


def _blocking_run(workflow: str, event_type: str, sync_dir, past: str):
    event = trigger(event_type, sync_dir=str(sync_dir), **{"for": past})
    key = event.payload["run_key"]
    return run_id_for(workflow, key), sync_dir / f"running-{key}"


def _resumed_once(run_id) -> None:
    assert types_of(run_id).count(et.RESUMED) == 1, types_of(run_id)


# --- a worker SIGKILLed inside a step --------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_worker_killed_inside_a_step_rolls_back_and_the_run_is_resumed_once(tmp_path, past):
    run_id, running = _blocking_run(
        "t-faults-side-effect", "t.faults-side-effect-start", tmp_path, past
    )
    doomed = Worker(tmp_path, "--no-cron", name=f"kumiko-doomed-{uuid.uuid4().hex[:8]}")
    try:
        wait_for(
            running.exists,
            "the first worker to enter the step",
        )
        # The step wrote its side effect and holds the row: a second worker
        # passes it over (SKIP LOCKED) instead of resuming it a second time.
        bystander = Worker(tmp_path, "--no-cron", name="kumiko-bystander")
        assert bystander.wait() == 0, bystander
        assert "resumed=0" in bystander.out(), bystander.out()

        doomed.signal(signal.SIGKILL)
        assert doomed.wait() == -signal.SIGKILL
    finally:
        doomed.signal(signal.SIGKILL)
        doomed.wait()
    # The server notices the dead client and rolls its transaction back.
    wait_for(lambda: not _backends(doomed.name), "the killed worker's backend to go")

    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]
    assert not Event.objects.filter(type="t.faults-side-effect").exists()
    assert WorkflowRunPending.objects.filter(run_id=run_id).count() == 1
    assert _status(run_id) == "waiting"

    running.unlink()
    (tmp_path / "release").touch()
    survivor = Worker(tmp_path, "--no-cron", name="kumiko-survivor")
    assert survivor.wait() == 0, survivor
    assert "resumed=1 completed=1" in survivor.out(), survivor.out()

    assert types_of(run_id) == COMPLETED_RUN
    side_effects = Event.objects.filter(type="t.faults-side-effect")
    assert [e.payload["run_key"] for e in side_effects] == [
        run_events(run_id)[0].payload["idempotency_key"]
    ]
    assert _status(run_id) == "completed"
    assert not WorkflowRunPending.objects.filter(run_id=run_id).exists()


# --- the server terminates the worker's connection --------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_connection_terminated_by_the_server_mid_loop_is_survived(tmp_path, past, now):
    later = (now - timedelta(minutes=30)).isoformat()
    name = f"kumiko-terminated-{uuid.uuid4().hex[:8]}"
    worker = Worker(tmp_path, "--loop", "--no-cron", "--interval", "0.5", name=name)
    try:
        first = _due_wait_run(past)
        wait_for(lambda: _status(first) == "completed", "the loop to resume a first run")

        # One batch: the held run first, two more behind it in the same transaction.
        with transaction.atomic():
            held, running = _blocking_run("t-blocking", "t.blocking", tmp_path, past)
            behind = [_due_wait_run(later) for _ in range(2)]
        wait_for(running.exists, "the worker to enter the blocking step")
        # Its connection, in the step's transaction, and its LISTEN connection.
        killed = _backends(name)
        assert killed, "the worker's backends are not in pg_stat_activity"
        assert set(_backends(name, listening=True)) & set(killed), (
            "the worker's listener is not among them"
        )
        with connection.cursor() as cursor:
            for pid in killed:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_for(lambda: not set(killed) & set(_backends(name)), "the backends to be gone")
        (tmp_path / "release").touch()

        wait_for(lambda: _status(held) == "completed", f"the held run to complete {worker!r}")
        after = _due_wait_run(past)
        wait_for(lambda: _status(after) == "completed", "the loop to go on after reconnecting")
        assert worker.alive(), worker
        # Between passes that made progress the worker may hold no connection
        # at all (CONN_MAX_AGE=0 closes it at each pass; its listener comes
        # back only before it next sleeps): wait for that listener, a new one.
        relistening = wait_for(
            lambda: _backends(name, listening=True), f"the worker to LISTEN again {worker!r}"
        )
        assert not set(relistening) & set(killed), (relistening, killed)
    finally:
        code = worker.stop()
    assert code == 0, worker

    log = worker.log()
    # One clear line and a back-off, not a traceback for every row of the batch.
    assert "database unavailable (OperationalError: terminating connection" in log, log
    assert "could not be resumed" not in log, log
    for run_id in (first, held, after, *behind):
        _resumed_once(run_id)
        assert _status(run_id) == "completed"
    assert types_of(held) == COMPLETED_RUN
    assert not WorkflowRunPending.objects.exists()


# --- the database goes away ----------------------------------------------------------


def _count(text: str, needle: str) -> int:
    return text.count(needle)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_database_down_at_start_and_mid_loop_worker_retries_then_resumes(tmp_path, past):
    proxy = Proxy(int(connection.settings_dict.get("PORT") or 5432))
    worker = Worker(
        tmp_path,
        "--loop",
        "--no-cron",
        "--interval",
        "0.5",
        name="kumiko-proxied",
        DATABASE_URL=database_url(proxy.port),
    )
    unavailable = "database unavailable"
    try:
        # Down when the loop starts: it logs and backs off, 1 s then 2 s...
        wait_for(lambda: _count(worker.log(), unavailable) >= 2, f"two retries {worker!r}")
        assert worker.alive()
        log = worker.log()
        assert "retrying in 1s" in log and "retrying in 2s" in log, log
        assert "OperationalError" in log, log

        first = _due_wait_run(past)
        proxy.start()
        wait_for(lambda: _status(first) == "completed", f"the first run {worker!r}")

        # Gone mid-loop: every connection through the proxy breaks at once.
        seen = _count(worker.log(), unavailable)
        proxy.stop()
        second = _due_wait_run(past)
        wait_for(lambda: _count(worker.log(), unavailable) > seen, "a retry after the outage")
        assert _status(second) == "waiting"
        proxy.start()
        wait_for(lambda: _status(second) == "completed", f"the second run {worker!r}")
        assert worker.alive()
    finally:
        code = worker.stop()
        proxy.stop()
    assert code == 0, worker
    for run_id in (first, second):
        assert types_of(run_id) == [
            et.RUN_STARTED,
            et.WAITING,
            et.RESUMED,
            et.RUN_COMPLETED,
        ]
    assert Event.objects.filter(type="t.recorded", payload__step="after").count() == 2


def test_one_shot_pass_against_an_unreachable_database_exits_non_zero(tmp_path):
    import subprocess
    import sys

    from tests.support import REPO

    if connection.vendor == "postgresql":
        extra = {"DATABASE_URL": database_url(free_port())}
    else:
        missing = str(tmp_path / "no-such-dir" / "db.sqlite3")
        extra = {"DATABASE_URL": f"sqlite:///{missing}", "KUMIKO_TEST_DB_NAME": missing}
    result = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "resume_due_runs", "--no-cron"],
        cwd=REPO,
        env=subprocess_env(**extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result
    assert "CommandError: the database is unavailable:" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


# --- a projection that raises inside an append ---------------------------------------


def _deep(levels: int):
    node: object = "x"
    for _ in range(levels):
        node = {"kind": "and", "nodes": [node]}
    return {"version": 1, "expr": node}


HOSTILE_MATCHES = {
    "unknown kind": {"version": 1, "expr": {"kind": "regex", "pattern": "(a+)+$"}},
    "unknown op": {
        "version": 1,
        "expr": {"kind": "atom", "path": ["user_id"], "op": {"kind": "like", "value": "%"}},
    },
    "not a dict": "user_id == 'u1'",
    "a list": [1, 2, 3],
    "wrong version": {"version": 99, "expr": {}},
    "nested 200 deep": _deep(200),
    "a huge value": {
        "version": 1,
        "expr": {"kind": "atom", "path": ["user_id"], "op": {"kind": "eq", "value": "u" * 70_000}},
    },
}


@pytest.mark.django_db
@pytest.mark.parametrize("tampered", HOSTILE_MATCHES.values(), ids=HOSTILE_MATCHES.keys())
def test_an_unevaluable_match_fails_the_run_not_the_domain_write(tampered, caplog):
    event = trigger("t.signed-up", user_id="u1", timeout="P7D")
    run_id = run_id_for("t-event", event.payload["run_key"])
    WorkflowRunPending.objects.filter(run_id=run_id).update(match_expr=tampered)

    verified = append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u1"})

    assert Event.objects.filter(pk=verified.pk).exists()  # the domain write stands
    failed = run_events(run_id)[-1]
    assert failed.type == et.RUN_FAILED
    assert failed.payload["reason"] == "invalid_match"
    assert failed.payload["error"] == "step 0: its match expression cannot be evaluated"
    run = WorkflowRun.objects.get(run_id=run_id)
    assert (run.status, run.failure_reason) == ("failed", "invalid_match")
    assert "match expression" in run.last_error
    assert not WorkflowRunPending.objects.filter(run_id=run_id).exists()
    assert "cannot be evaluated" in caplog.text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_unevaluable_match_fails_the_run_and_the_write_commits_in_another_process():
    """The same through a separate process's committed transaction (PostgreSQL)."""
    event = trigger("t.signed-up", user_id="u1", timeout="P7D")
    run_id = run_id_for("t-event", event.payload["run_key"])
    WorkflowRunPending.objects.filter(run_id=run_id).update(
        match_expr=HOSTILE_MATCHES["unknown op"]
    )
    script = (
        "import django, json, uuid; django.setup()\n"
        "from kumiko_workflows import append_event\n"
        "e = append_event(uuid.uuid4(), 'user', 't.verified', {'user_id': 'u1'})\n"
        "print(json.dumps({'id': e.id}))\n"
    )
    result = run_python(script)
    assert result.returncode == 0, result.stderr
    committed = json.loads(result.stdout)["id"]
    assert Event.objects.filter(pk=committed, type="t.verified").exists()
    assert WorkflowRun.objects.get(run_id=run_id).failure_reason == "invalid_match"
