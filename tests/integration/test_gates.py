"""Debounced triggers and singleton workflows: one gate stream per key, proven from the streams.

Trigger events are appended with their own ``created_at`` (a burst spread
over virtual seconds) and passes run at given instants: no sleeping.
"""

from __future__ import annotations

import io
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from kumiko_workflows import (
    append_event,
    cancel_run,
    define_workflow,
    on_event,
    resume_due_runs,
    steps,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.engine import gates
from kumiko_workflows.exceptions import WorkflowDefinitionError
from kumiko_workflows.models import Event, RunStatus, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations import rebuild
from kumiko_workflows.operations.explain import describe_event, explain
from kumiko_workflows.workflow.definition import registry

pytestmark = pytest.mark.django_db


def _doc(event):
    return event.payload["doc"]


def _seen(ctx):
    return {"n": ctx.event.payload["n"], "trigger": ctx.event.id}


DEBOUNCED = define_workflow(
    name="g-debounce",
    trigger=on_event("g.edited", debounce=30, debounce_max=120),
    idempotency_key=_doc,
    steps=[steps.compute("seen", _seen)],
    register=False,
)
SKIP = define_workflow(
    name="g-skip",
    trigger=on_event("g.sync"),
    idempotency_key=_doc,
    singleton="skip",
    steps=[steps.compute("seen", _seen), steps.wait("PT1H")],
    register=False,
)
QUEUE = define_workflow(
    name="g-queue",
    trigger=on_event("g.bill"),
    idempotency_key=_doc,
    singleton="queue",
    steps=[steps.compute("seen", _seen), steps.wait("PT1H")],
    register=False,
)


@pytest.fixture(autouse=True)
def _definitions():
    with registry.override(DEBOUNCED, SKIP, QUEUE):
        yield


def emit(type: str, doc: str, n: int, at) -> Event:
    return append_event(uuid.uuid4(), "doc", type, {"doc": doc, "n": n}, created_at=at)


def runs_of(name: str) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(workflow_name=name).order_by("started_at", "run_id"))


def seen_by(run: WorkflowRun) -> int:
    done = Event.objects.get(aggregate_id=run.run_id, type=et.RUN_COMPLETED)
    return done.payload["state"]["results"]["seen"]["n"]


def gate_types(name: str, key: str) -> list[str]:
    gate = gates.gate_id("default", name, key)
    return list(
        Event.objects.filter(aggregate_id=gate).order_by("version").values_list("type", flat=True)
    )


# --- debounce -------------------------------------------------------------------


def test_a_burst_starts_one_run_with_its_last_event_once_quiet(now):
    t = now + timedelta(minutes=1)
    events = [emit("g.edited", "d1", n, t + timedelta(seconds=10 * n)) for n in range(3)]
    other = emit("g.edited", "d2", 7, t)  # another key: a burst of its own

    (run,) = [r for r in runs_of("g-debounce") if r.idempotency_key.startswith("d1#")]
    assert run.status == RunStatus.WAITING and run.suspension_type == "debounced"
    assert run.trigger_event_id == events[-1].id
    assert run.wake_at == t + timedelta(seconds=50)  # 30 s after the last event
    # Quiet for 29 s after the last: nothing starts.
    assert resume_due_runs(now=t + timedelta(seconds=49)).completed == 1  # d2's, due at t + 30
    assert resume_due_runs(now=t + timedelta(seconds=50)).completed == 1

    d1 = [r for r in runs_of("g-debounce") if r.idempotency_key.startswith("d1#")]
    assert len(d1) == 1 and seen_by(WorkflowRun.objects.get(run_id=run.run_id)) == 2
    assert Event.objects.filter(aggregate_id=run.run_id, type=et.RUN_DEBOUNCED).count() == 3
    assert gate_types("g-debounce", "d1") == [et.GATE_OPENED, et.GATE_RELEASED]
    assert [seen_by(r) for r in runs_of("g-debounce") if r.idempotency_key.startswith("d2#")] == [
        other.payload["n"]
    ]

    # The next event of the key opens a new burst: a second run.
    later = emit("g.edited", "d1", 9, t + timedelta(seconds=60))
    resume_due_runs(now=t + timedelta(seconds=90))
    d1 = [r for r in runs_of("g-debounce") if r.idempotency_key.startswith("d1#")]
    assert sorted(seen_by(r) for r in d1) == [2, 9]
    assert later.id in {r.trigger_event_id for r in d1}
    assert gate_types("g-debounce", "d1") == [et.GATE_OPENED, et.GATE_RELEASED] * 2


def test_a_burst_that_never_pauses_starts_at_its_maximum_wait(now):
    # An event every 20 s: never 30 s quiet. debounce_max 120 s bounds the wait.
    t = now + timedelta(minutes=1)
    for n in range(6):  # t .. t + 100
        emit("g.edited", "busy", n, t + timedelta(seconds=20 * n))
    (run,) = runs_of("g-debounce")
    assert run.wake_at == t + timedelta(seconds=120)

    assert resume_due_runs(now=t + timedelta(seconds=119)).completed == 0
    assert resume_due_runs(now=t + timedelta(seconds=120)).completed == 1
    assert seen_by(runs_of("g-debounce")[0]) == 5  # the last event before it started


def test_a_debounced_run_is_explained_and_rebuilt_the_same(now):
    t = now + timedelta(minutes=1)
    for n in range(3):
        emit("g.edited", "d1", n, t + timedelta(seconds=n))
    (run,) = runs_of("g-debounce")
    facts = dict(explain(run, t).facts)
    assert "(3 so far)" in facts["Debounced"] and "at the latest" in facts["Debounced"]
    last = Event.objects.filter(aggregate_id=run.run_id, type=et.RUN_DEBOUNCED).last()
    assert "event 3 of its key's burst" in describe_event(last.type, last.payload)

    assert rebuild.check().differences == []
    assert rebuild.rebuild(apply=True).differences == []
    row = WorkflowRunPending.objects.get(run_id=run.run_id)
    assert (row.suspension_type, row.wake_at) == ("debounced", t + timedelta(seconds=32))


# --- singleton -----------------------------------------------------------------------


def test_singleton_skip_skips_a_trigger_while_the_keys_run_is_active(now):
    first = emit("g.sync", "acct", 1, now)
    emit("g.sync", "acct", 2, now + timedelta(seconds=1))  # skipped: acct is active
    emit("g.sync", "other", 3, now + timedelta(seconds=2))  # another key: runs
    assert sorted(seen_by_step(r) for r in runs_of("g-skip")) == [1, 3]
    gate = gates.read_gate("default", "g-skip", "acct")
    skipped = Event.objects.get(aggregate_id=gate.id, type=et.GATE_SKIPPED)
    assert skipped.payload["active"] == str(runs_of("g-skip")[0].run_id)
    assert first.id == runs_of("g-skip")[0].trigger_event_id

    # Once the active run ended, a trigger starts a run again.
    resume_due_runs(now=now + timedelta(hours=2))
    emit("g.sync", "acct", 4, now + timedelta(hours=2))
    acct = [r for r in runs_of("g-skip") if r.idempotency_key.startswith("acct#")]
    assert sorted(seen_by_step(r) for r in acct) == [1, 4]
    assert gate_types("g-skip", "acct") == [
        et.GATE_OPENED,
        et.GATE_SKIPPED,
        et.GATE_RELEASED,
        et.GATE_OPENED,
    ]


def seen_by_step(run: WorkflowRun) -> int:
    """The ``n`` the run's first step saw (from its first suspension or its end)."""
    event = (
        Event.objects.filter(aggregate_id=run.run_id, type__in=[et.WAITING, et.RUN_COMPLETED])
        .order_by("version")
        .first()
    )
    return event.payload["state"]["results"]["seen"]["n"]


def test_singleton_queue_runs_the_keys_runs_one_after_another_in_order(now):
    for n in range(3):
        emit("g.bill", "cust", n, now + timedelta(seconds=n))
    active, *held = runs_of("g-queue")
    assert [r.suspension_type for r in held] == ["held", "held"]
    assert all(r.wake_at is None for r in held)
    facts = dict(explain(held[0], now).facts)
    assert "behind the active run of key 'cust'" in facts["Queued"]

    for hours in (2, 4, 6):
        resume_due_runs(now=now + timedelta(hours=hours))
    runs = runs_of("g-queue")
    assert {r.status for r in runs} == {RunStatus.COMPLETED}
    assert [seen_by_step(r) for r in runs] == [0, 1, 2]
    # Never two at once, read from the streams: each run's first step ran
    # after the run before it completed.
    completed = [Event.objects.get(aggregate_id=r.run_id, type=et.RUN_COMPLETED).id for r in runs]
    first_steps = [
        Event.objects.filter(aggregate_id=r.run_id, type=et.WAITING).first().id for r in runs
    ]
    assert first_steps[1] > completed[0] and first_steps[2] > completed[1]
    assert gate_types("g-queue", "cust") == [
        et.GATE_OPENED,
        et.GATE_QUEUED,
        et.GATE_QUEUED,
        et.GATE_RELEASED,
        et.GATE_RELEASED,
        et.GATE_RELEASED,
    ]
    assert gates.read_gate("default", "g-queue", "cust").active is None
    assert rebuild.check().differences == []


def test_a_cancelled_queued_run_leaves_the_queue(now):
    for n in range(3):
        emit("g.bill", "cust", n, now + timedelta(seconds=n))
    active, first_held, second_held = runs_of("g-queue")
    assert cancel_run(first_held.run_id, reason="not needed")
    gate = gates.read_gate("default", "g-queue", "cust")
    assert gate.active == str(active.run_id) and gate.queue == [str(second_held.run_id)]
    resume_due_runs(now=now + timedelta(hours=2))
    assert WorkflowRun.objects.get(run_id=second_held.run_id).suspension_type == "wait"


def test_bad_gate_arguments_are_refused_with_the_check_id():
    with pytest.raises(WorkflowDefinitionError, match=r"E117.*longer than 0"):
        on_event("x", debounce=0)
    with pytest.raises(WorkflowDefinitionError, match=r"E117.*shorter than debounce"):
        on_event("x", debounce=60, debounce_max=30)
    with pytest.raises(WorkflowDefinitionError, match=r"E117.*needs debounce"):
        on_event("x", debounce_max=30)
    with pytest.raises(WorkflowDefinitionError, match=r"E117.*not an ISO 8601"):
        on_event("x", debounce="soon")
    with pytest.raises(WorkflowDefinitionError, match=r"E118.*'skip', 'queue'"):
        define_workflow("x", on_event("x"), [steps.wait("PT1S")], singleton="always")
    with pytest.raises(WorkflowDefinitionError, match=r"E119"):
        define_workflow("x", on_event("x", debounce=5), [steps.wait("PT1S")], singleton="skip")


# --- racing processes (PostgreSQL) -------------------------------------------------

RACED = (
    define_workflow(
        name="g-race-debounce",
        trigger=on_event("g.burst", debounce=0.05, debounce_max=0.3),
        idempotency_key=_doc,
        steps=[steps.compute("seen", _seen)],
        register=False,
    ),
    define_workflow(
        name="g-race-queue",
        trigger=on_event("g.serial"),
        idempotency_key=_doc,
        singleton="queue",
        steps=[steps.compute("seen", _seen), steps.wait("PT0S")],
        register=False,
    ),
)

APPEND_MANY = """
import sys, uuid
import django
django.setup()
from kumiko_workflows import append_event
from kumiko_workflows.workflow.definition import registry
from tests.integration.test_gates import RACED
with registry.override(*RACED):
    for n in range(int(sys.argv[2])):
        append_event(uuid.uuid4(), "doc", sys.argv[1], {"doc": "k", "n": n})
"""


def _race(type: str, per_process: int, processes: int = 3) -> list[Event]:
    """``processes`` appenders of ``type`` events of one key, while this process resumes runs."""
    import subprocess
    import sys

    from tests.support import REPO, subprocess_env

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", APPEND_MANY, type, str(per_process)],
            cwd=REPO,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        while any(proc.poll() is None for proc in procs):
            resume_due_runs()  # claims racing the appends
    finally:
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
    for _ in range(per_process * processes):
        if not resume_due_runs(now=timezone.now() + timedelta(hours=1)).processed:
            break
    return list(Event.objects.filter(type=type).order_by("id"))


def _gate_events(name: str) -> list[Event]:
    gate = gates.gate_id("default", name, "k")
    return list(Event.objects.filter(aggregate_id=gate).order_by("version"))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_racing_appenders_and_a_worker_give_each_event_to_exactly_one_burst():
    with registry.override(*RACED):
        triggers = _race("g.burst", 150)
        assert len(triggers) == 450
        runs = runs_of("g-race-debounce")
        assert {r.status for r in runs} == {RunStatus.COMPLETED}
        # Every event went to exactly one burst (opened it or moved it), none lost.
        taken = list(
            Event.objects.filter(type=et.RUN_DEBOUNCED, tenant_id="default").values_list(
                "payload__trigger_event_id", flat=True
            )
        )
        assert sorted(taken) == [event.id for event in triggers]
        # The gate opened and released in turn: never two bursts of the key at once.
        kinds = [
            (e.type, e.payload.get("active"), e.payload.get("run_id"))
            for e in _gate_events("g-race-debounce")
        ]
        assert [kind for kind, _, _ in kinds] == [et.GATE_OPENED, et.GATE_RELEASED] * len(runs)
        for (_, opened, _), (_, _, released) in zip(kinds[::2], kinds[1::2], strict=True):
            assert opened == released
        # Each run ran once, with the last event of its burst.
        for run in runs:
            last = Event.objects.filter(aggregate_id=run.run_id, type=et.RUN_DEBOUNCED).last()
            done = Event.objects.get(aggregate_id=run.run_id, type=et.RUN_COMPLETED)
            seen = done.payload["state"]["results"]["seen"]["trigger"]
            assert seen == last.payload["trigger_event_id"] == run.trigger_event_id


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_racing_appenders_of_a_singleton_queue_never_run_two_of_a_key_at_once():
    with registry.override(*RACED):
        triggers = _race("g.serial", 25)
        runs = runs_of("g-race-queue")
        assert len(runs) == len(triggers) == 75
        assert {r.status for r in runs} == {RunStatus.COMPLETED}
        # From the run streams: a run's first step ran after the run before it
        # completed (event ids are taken at insert; a run starts only after
        # its predecessor's end committed).
        spans = sorted(
            (
                Event.objects.get(aggregate_id=r.run_id, type=et.WAITING).id,
                Event.objects.get(aggregate_id=r.run_id, type=et.RUN_COMPLETED).id,
            )
            for r in runs
        )
        for (_, ended), (began, _) in zip(spans, spans[1:], strict=False):
            assert began > ended
        assert gates.read_gate("default", "g-race-queue", "k").active is None


def test_workflow_status_counts_the_gated_starts(now):
    from django.core.management import call_command

    from kumiko_workflows.management.commands.workflow_status import status_report

    emit("g.edited", "d1", 0, now)
    for n in range(3):
        emit("g.bill", "cust", n, now + timedelta(seconds=n))
    assert status_report(None, now)["pending"]["gated"] == {"debounced": 1, "held": 2}
    out = io.StringIO()
    call_command("workflow_status", stdout=out)
    assert "debounced starts waiting for their burst to end: 1" in out.getvalue()
    assert "queued behind their key's active run (singleton): 2" in out.getvalue()


def test_a_held_run_is_not_woken_by_hand(now):
    from kumiko_workflows import wake_run

    for n in range(2):
        emit("g.bill", "cust", n, now + timedelta(seconds=n))
    active, held = runs_of("g-queue")
    assert not wake_run(held.run_id)  # its turn comes when the active run ends
    assert wake_run(active.run_id)
