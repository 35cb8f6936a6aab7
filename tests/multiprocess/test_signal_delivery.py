"""The run signals are delivered at least once, with an id, by the run's own version.

An outbox row (:class:`~kumiko_workflows.models.SignalDelivery`) is written
with each listened-to transition and deleted once its receivers ran; a row
left behind by a process that died is delivered again by a worker's pass.
The in-process tests make the leftovers by hand (as a dead process leaves
them); the real kills are in :func:`test_workers_sigkilled_while_delivering_lose_no_run_completed`.
"""

from __future__ import annotations

import logging
import random
import signal
import subprocess
import sys
import types
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from kumiko_workflows import define_workflow, on_event, resume_due_runs, run_id_for, signals, steps
from kumiko_workflows import event_types as et
from kumiko_workflows.engine import heartbeat as heartbeat_module
from kumiko_workflows.engine import transitions
from kumiko_workflows.engine.worker import Worker
from kumiko_workflows.models import Event, SignalDelivery, WorkerHeartbeat, WorkflowRun
from kumiko_workflows.workflow.registry import registry
from tests.support import trigger
from tests.support.faults import Worker as WorkerProcess
from tests.support.faults import wait_for
from tests.testapp import signal_log
from tests.testapp import workflows as w

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def completed():
    """Every run_completed heard in this process, as its keyword arguments (with sender)."""
    heard: list[dict] = []

    def receiver(sender, **kwargs):
        heard.append({**kwargs, "sender": sender})

    signals.run_completed.connect(receiver, weak=False, dispatch_uid="test-delivery")
    yield heard
    signals.run_completed.disconnect(dispatch_uid="test-delivery")


def _completion(run_id) -> Event:
    return Event.objects.get(aggregate_id=run_id, type=et.RUN_COMPLETED)


def _due_run(past):
    event = trigger("t.wait", **{"for": past})
    return run_id_for("t-wait", event.payload["run_key"])


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _leave_over(run_id, owner: str, leased_at=None) -> Event:
    """The run's completion as a process that died before delivering it leaves it."""
    event = _completion(run_id)
    SignalDelivery.objects.filter(event_id=event.id).delete()
    row = SignalDelivery.objects.create(event_id=event.id, tenant_id=event.tenant_id, owner=owner)
    if leased_at is not None:
        SignalDelivery.objects.filter(pk=row.pk).update(leased_at=leased_at)
    return event


def test_each_delivery_carries_the_run_events_id_and_leaves_no_row(completed, past):
    run_id = _due_run(past)
    with transaction.atomic():
        resume_due_runs()
        # Written in the transition's transaction, before the commit.
        assert SignalDelivery.objects.filter(event_id=_completion(run_id).id).exists()
        assert completed == []
    assert [heard["delivery_id"] for heard in completed] == [_completion(run_id).id]
    assert SignalDelivery.objects.count() == 0


def test_nobody_listening_writes_no_delivery_row(past):
    _due_run(past)
    resume_due_runs()
    assert SignalDelivery.objects.count() == 0


def test_a_rolled_back_transition_leaves_no_delivery_row(completed, past):
    _due_run(past)
    with pytest.raises(RuntimeError), transaction.atomic():
        resume_due_runs()
        raise RuntimeError("rolled back")
    assert SignalDelivery.objects.count() == 0 and completed == []


def test_a_worker_pass_delivers_what_a_dead_process_left_with_the_same_id(completed, past):
    run_id = _due_run(past)
    resume_due_runs()
    assert len(completed) == 1
    event = _leave_over(run_id, f"{transitions._HOST}:{_dead_pid()}:0123456789ab")

    result = Worker(cron=False, heartbeat=False).run_single_pass()

    assert result.redelivered == 1 and not result.idle
    assert [heard["delivery_id"] for heard in completed] == [event.id, event.id]
    assert completed[1]["run_id"] == run_id and completed[1]["event"].id == event.id
    assert SignalDelivery.objects.count() == 0


def test_a_live_or_distant_owners_fresh_rows_wait_for_the_redelivery_delay(completed, past):
    """Another host's process cannot be seen to be alive: its rows wait; an old one is taken."""
    runs = [_due_run(past) for _ in range(3)]
    resume_due_runs()
    completed.clear()
    live = _leave_over(runs[0], transitions.owner())  # this very process
    distant = _leave_over(runs[1], "elsewhere:1:0123456789ab")
    old = _leave_over(
        runs[2], "elsewhere:2:0123456789ab", leased_at=timezone.now() - timedelta(seconds=121)
    )

    assert transitions.deliver_leftovers() == 1
    assert [heard["delivery_id"] for heard in completed] == [old.id]
    assert set(SignalDelivery.objects.values_list("event_id", flat=True)) == {live.id, distant.id}


def test_a_restarted_process_with_the_same_pid_takes_its_predecessors_rows(completed, past):
    run_id = _due_run(past)
    resume_due_runs()
    completed.clear()
    event = _leave_over(run_id, transitions.owner().rsplit(":", 1)[0] + ":aaaaaaaaaaaa")
    assert transitions.deliver_leftovers() == 1
    assert [heard["delivery_id"] for heard in completed] == [event.id]


def test_leftovers_are_never_taken_inside_a_transaction(completed, past):
    run_id = _due_run(past)
    resume_due_runs()
    _leave_over(run_id, f"{transitions._HOST}:{_dead_pid()}:0123456789ab")
    with transaction.atomic():
        assert transitions.deliver_leftovers() == 0


def test_a_leftover_whose_event_was_purged_is_dropped_with_a_warning(completed, past, caplog):
    SignalDelivery.objects.create(
        event_id=10**12, tenant_id="default", owner=f"{transitions._HOST}:{_dead_pid()}:x"
    )
    with caplog.at_level(logging.WARNING, logger="kumiko_workflows.signals"):
        assert transitions.deliver_leftovers() == 1
    assert completed == [] and SignalDelivery.objects.count() == 0
    assert "the event is gone" in caplog.text


def test_a_raising_receiver_is_logged_once(completed, past, caplog):
    def broken(sender, **kwargs):
        raise ValueError("the receiver broke")

    _due_run(past)
    signals.run_completed.connect(broken)
    try:
        with caplog.at_level(logging.ERROR):
            resume_due_runs()
    finally:
        signals.run_completed.disconnect(broken)
    raised = [
        record
        for record in caplog.records
        if record.exc_info and isinstance(record.exc_info[1], ValueError)
    ]
    assert len(raised) == 1, [(r.name, r.getMessage()) for r in caplog.records]
    assert raised[0].name == "kumiko_workflows.signals" and "signal receiver" in raised[0].message
    assert len(completed) == 1, "the other receiver still heard it"
    assert SignalDelivery.objects.count() == 0, "a receiver's error is no reason to deliver again"


def test_slow_receivers_do_not_stop_the_workers_heartbeat(past, monkeypatch):
    """Each receiver takes 6 s (on the worker's clock), more than HEARTBEAT_SECONDS: the
    heartbeat is written between them, not only when the pass began."""
    clock = [1000.0]
    monkeypatch.setattr(heartbeat_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    assert heartbeat_module.HEARTBEAT_SECONDS < 6
    for _ in range(3):
        _due_run(past)
    table = WorkerHeartbeat._meta.db_table
    beats = [0]

    def count_beats(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith(("UPDATE", "INSERT")) and table in sql:
            beats[0] += 1
        return execute(sql, params, many, context)

    seen = []

    def slow(sender, **kwargs):
        seen.append((beats[0], WorkerHeartbeat.objects.get().seen_at))
        clock[0] += 6.0

    signals.run_completed.connect(slow, weak=False, dispatch_uid="test-slow")
    try:
        with connection.execute_wrapper(count_beats):
            result = Worker(cron=False).run_single_pass()
    finally:
        signals.run_completed.disconnect(dispatch_uid="test-slow")
    assert result.report.completed == 3 and len(seen) == 3
    # The pass's own beat, then one before each receiver after a slow one.
    assert [count for count, _ in seen] == [1, 2, 3], seen
    assert seen[0][1] <= seen[1][1] <= seen[2][1]


# --- the sender is the run's own version ------------------------------------------------


def _versioned(version: int):
    return define_workflow(
        name="t-signal-versions",
        trigger=on_event("t.signal-versions"),
        idempotency_key=w.run_key,
        version=version,
        steps=[steps.wait(w.payload_value("for", "PT1H"))],
        register=False,
    )


def test_a_v1_runs_signals_reach_the_receivers_of_v1_not_of_v2(past, future):
    v1, v2 = _versioned(1), _versioned(2)
    heard: dict[int, list[str]] = {1: [], 2: []}

    def for_version(version):
        def receiver(sender, **kwargs):
            heard[version].append(kwargs["event"].type)

        return receiver

    receivers = {version: for_version(version) for version in heard}
    for kind in (signals.run_started, signals.run_suspended, signals.run_completed):
        kind.connect(receivers[1], sender=v1, weak=False)
        kind.connect(receivers[2], sender=v2, weak=False)
    try:
        with registry.override(v1):
            event = trigger("t.signal-versions", **{"for": past})
        run_id = run_id_for("t-signal-versions", event.payload["run_key"])
        with registry.override(v1, v2):
            assert resume_due_runs().completed == 1
            trigger("t.signal-versions", **{"for": future})  # a new run: v2's
    finally:
        for kind in (signals.run_started, signals.run_suspended, signals.run_completed):
            kind.disconnect(receivers[1], sender=v1)
            kind.disconnect(receivers[2], sender=v2)
    assert WorkflowRun.objects.get(run_id=run_id).workflow_version == 1
    assert heard[1] == [et.RUN_STARTED, et.WAITING, et.RUN_COMPLETED]
    assert heard[2] == [et.RUN_STARTED, et.WAITING]


# --- real processes killed while delivering ------------------------------------------------

RUNS = 300
KILLS = 12


@pytest.mark.postgres
def test_workers_sigkilled_while_delivering_lose_no_run_completed(tmp_path, past):
    """Two workers at a time deliver through a slow receiver (20 ms) that records each
    delivery in a file; one of them is SIGKILLed after a few deliveries, again and again.
    In the end every run's run_completed was recorded, repeats with the same id."""
    runs = {str(_due_run(past)) for _ in range(RUNS)}
    log = tmp_path / "deliveries.log"
    log.touch()
    env = {"KUMIKO_TEST_SIGNAL_LOG": str(log), "KUMIKO_TEST_SIGNAL_DELAY": "0.02"}
    rng = random.Random(22)
    started = 0

    def start(*args: str) -> WorkerProcess:
        nonlocal started
        started += 1
        name = f"kumiko-signals-{started}-{uuid.uuid4().hex[:6]}"
        return WorkerProcess(tmp_path, "--no-cron", *args, name=name, **env)

    def delivered() -> int:
        return len(log.read_text().splitlines())

    def all_completed() -> bool:
        return WorkflowRun.objects.filter(status="completed").count() == RUNS

    def settled() -> bool:
        return all_completed() and not SignalDelivery.objects.exists()

    workers = [start("--loop", "--interval", "0.2") for _ in range(2)]
    kills = killed_while_delivering = 0
    try:
        while kills < KILLS and not settled():
            target = delivered() + rng.randint(1, 20)
            wait_for(
                lambda target=target: delivered() >= target or all_completed(), "more deliveries"
            )
            victim = workers.pop(rng.randrange(len(workers)))
            victim.signal(signal.SIGKILL)
            assert victim.wait() == -signal.SIGKILL, victim
            kills += 1
            killed_while_delivering += SignalDelivery.objects.filter(
                owner__contains=f":{victim.pid}:"
            ).exists()
            workers.append(start("--loop", "--interval", "0.2"))
        try:
            wait_for(settled, "every signal delivered", timeout=60)
        except AssertionError:
            pass  # what is missing is said below
    finally:
        for process in workers:
            process.signal(signal.SIGKILL)
            process.wait()

    assert killed_while_delivering >= 3, (kills, killed_while_delivering)
    deliveries = signal_log.read(log)
    completions = dict(
        Event.objects.filter(type=et.RUN_COMPLETED).values_list("aggregate_id", "id")
    )
    assert {str(run) for run in completions} == runs
    by_run: dict[str, set[int]] = {}
    for delivery_id, run_id, _ in deliveries:
        by_run.setdefault(run_id, set()).add(delivery_id)
    missing = runs - set(by_run)
    assert not missing, f"{len(missing)} of {RUNS} run_completed never delivered"
    # A repeat is recognisable: one id per run, the completion event's.
    assert all(ids == {completions[uuid.UUID(run)]} for run, ids in by_run.items())
    assert len(deliveries) >= RUNS
