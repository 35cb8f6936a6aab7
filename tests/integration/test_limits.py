"""Concurrency limits (``Limit``) and rate limits (``Rate``): one worker's semantics.

Which runs held a slot when is read from the run streams: a run holds one
from its ``workflow.slot-taken`` event to its ``workflow.slot-released``
(``holds="active"``), or to the end of the segment the slot was taken for
(``"executing"``). The race between worker processes is in
``tests/multiprocess/test_limits_race.py``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from kumiko_workflows import (
    Limit,
    Rate,
    cancel_run,
    define_workflow,
    on_event,
    resume_due_runs,
    run_id_for,
    steps,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.exceptions import WorkflowDefinitionError
from kumiko_workflows.models import Event, LimitSlot, RunStatus, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations import rebuild
from tests.support import trigger, types_of

pytestmark = pytest.mark.django_db


def _start(holds: str, key: str, wait: str, count: int = 1) -> list[uuid.UUID]:
    runs = []
    for _ in range(count):
        event = trigger(f"t.limit-{holds}", key=key, **{"for": wait})
        runs.append(run_id_for(f"t-limit-{holds}", event.payload["run_key"], "default"))
    return runs


def status(run_id: uuid.UUID) -> WorkflowRun:
    return WorkflowRun.objects.get(run_id=run_id)


def test_a_limited_run_starts_in_a_worker_and_takes_a_slot(past):
    (run,) = _start("active", "k", past)
    assert types_of(run) == [et.RUN_STARTED, et.RUN_QUEUED]

    resume_due_runs()  # to its wait
    resume_due_runs()  # past it

    assert status(run).status == RunStatus.COMPLETED
    assert types_of(run) == [
        et.RUN_STARTED,
        et.RUN_QUEUED,
        et.SLOT_TAKEN,
        et.RESUMED,
        et.WAITING,
        et.RESUMED,
        et.RUN_COMPLETED,
        et.SLOT_RELEASED,
    ]
    assert not LimitSlot.objects.filter(holder_run_id__isnull=False).exists()


def test_active_runs_over_the_cap_queue_and_start_oldest_first_as_slots_free(future, now):
    first = _start("active", "k", future, count=2)
    queued = _start("active", "k", future, count=2)
    other = _start("active", "other", future)

    resume_due_runs()

    # Two hold the key's slots through their waits; the other key is not held up.
    for run in first + other:
        assert status(run).status == RunStatus.WAITING
        assert status(run).suspension_type == "wait"
    for run in queued:
        assert status(run).suspension_type == "limited"
        assert types_of(run)[-1] == et.SLOT_WAITING
        row = WorkflowRunPending.objects.get(run_id=run)
        assert row.wake_at is None and row.limit_key == "k"
    assert LimitSlot.objects.filter(limit_key="k", holder_run_id__isnull=False).count() == 2

    # A holder ends (cancelled here): its slot goes to the oldest queued run,
    # which is due at once; the other still queues.
    cancel_run(first[0], reason="test")
    assert types_of(queued[0])[-2:] == [et.SLOT_TAKEN, et.SLOT_OFFERED]
    assert types_of(queued[1])[-1] == et.SLOT_WAITING
    resume_due_runs()
    assert status(queued[0]).suspension_type == "wait"
    assert status(queued[1]).suspension_type == "limited"

    # Each completion hands its slot on, within the pass: everyone completes.
    resume_due_runs(now=now + timedelta(days=1))
    for run in [*first[1:], *queued, *other]:
        assert status(run).status == RunStatus.COMPLETED, types_of(run)
    assert not LimitSlot.objects.filter(holder_run_id__isnull=False).exists()


def test_executing_holds_a_slot_only_while_a_segment_runs(future):
    runs = _start("executing", "k", future, count=3)

    resume_due_runs()

    # One writer at a time (SQLite) or slots locked per segment (PostgreSQL):
    # with the segments over, every run waits at its wait step, none queued.
    for run in runs:
        assert status(run).suspension_type == "wait"
        assert et.SLOT_TAKEN in types_of(run)
    assert not LimitSlot.objects.filter(holder_run_id__isnull=False).exists()


def test_the_slot_tables_rebuild_from_the_streams(future):
    _start("active", "k", future, count=3)
    resume_due_runs()
    before = sorted(
        LimitSlot.objects.filter(holder_run_id__isnull=False).values_list(
            "limit_key", "slot", "holder_run_id"
        )
    )
    pending = sorted(WorkflowRunPending.objects.values_list("run_id", "wake_at", "queued_at"))

    assert rebuild.check().differences == []
    LimitSlot.objects.update(holder_run_id=None)  # lost: the streams give them back
    rebuild.rebuild()

    after = sorted(
        LimitSlot.objects.filter(holder_run_id__isnull=False).values_list(
            "limit_key", "slot", "holder_run_id"
        )
    )
    assert after == before and len(before) == 2
    assert sorted(WorkflowRunPending.objects.values_list("run_id", "wake_at", "queued_at")) == (
        pending
    )


def test_a_key_callable_that_raises_fails_the_run(past):
    def bad_key(event):
        raise RuntimeError("no key")

    workflow = define_workflow(
        name="t-limit-bad-key",
        trigger=on_event("t.limit-bad-key"),
        concurrency=Limit(max=1, key=bad_key),
        steps=[steps.compute("one", lambda ctx: 1)],
        register=False,
    )
    from kumiko_workflows.workflow.definition import registry

    with registry.override(workflow):
        trigger("t.limit-bad-key")
        resume_due_runs()
    run = WorkflowRun.objects.get(workflow_name="t-limit-bad-key")
    assert run.status == RunStatus.FAILED
    assert run.failure_reason == "limit_key_failed"


@pytest.mark.parametrize(
    ("kwargs", "check"),
    [
        ({"concurrency": Limit(max=0)}, "E111"),
        ({"concurrency": Limit(max=10_001)}, "E111"),
        ({"concurrency": Limit(max=2, holds="always")}, "E111"),
        ({"concurrency": 2}, "E111"),
        ({"concurrency": Limit(max=2, key="customer")}, "E112"),
        ({"rate": Rate(max=0, per=1)}, "E113"),
        ({"rate": Rate(max=1, per=-1)}, "E113"),
        ({"rate": Rate(max=1, per=1, key=3)}, "E114"),
    ],
)
def test_bad_limits_are_refused_at_definition_with_their_check_id(kwargs, check):
    with pytest.raises(WorkflowDefinitionError, match=rf"\[kumiko_workflows\.{check}\]"):
        define_workflow(
            name="t-bad-limit",
            trigger=on_event("t.bad-limit"),
            steps=[steps.compute("one", lambda ctx: 1)],
            register=False,
            **kwargs,
        )


def test_the_count_from_the_streams_sees_a_third_holder():
    """The check itself can fail: three overlapping holders of a key are seen as three."""

    def event(run, type, **payload):
        return Event(tenant_id="default", aggregate_id=run, type=type, payload=payload)

    taken = {"limit_key": "k"}
    events = [
        event("a", et.SLOT_TAKEN, slot=0, **taken),
        event("b", et.SLOT_TAKEN, slot=1, **taken),
        event("c", et.SLOT_TAKEN, slot=1, **taken),
        event("a", et.SLOT_RELEASED),
    ]
    from tests.multiprocess.test_limits_race import most_holders

    most, problems = most_holders(events, "active")
    assert most == {"k": 3}
    assert problems == ["slot 1 of 'k' taken by c while held"]


# --- rate limits ------------------------------------------------------------------


def _rate_runs(count: int, key: str = "p") -> list[uuid.UUID]:
    runs = []
    for _ in range(count):
        event = trigger("t.rate", key=key, **{"for": "PT0S"})
        runs.append(run_id_for("t-rate", event.payload["run_key"], "default"))
    return runs


def starts(runs) -> list:
    """The instants of the runs' segment starts, from their ``workflow.rate-taken`` events."""
    from django.utils.dateparse import parse_datetime

    events = Event.objects.filter(aggregate_id__in=runs, type=et.RATE_TAKEN)
    return sorted(parse_datetime(e.payload["at"]) for e in events)


@pytest.fixture
def virtual_now():
    """A virtual clock (the rate limit counts on it, on PostgreSQL too), moved with ``at``."""
    from kumiko_workflows.workflow import clock

    start = timezone.now()
    previous = clock.set_virtual(start)
    yield start
    clock.set_virtual(previous)


def at(instant):
    from kumiko_workflows.workflow import clock

    clock.set_virtual(instant)
    return resume_due_runs(now=instant)


def test_a_rate_limit_lets_max_starts_a_period_and_the_rest_wait_in_order(virtual_now):
    runs = _rate_runs(5)
    other = _rate_runs(1, key="q")
    now = virtual_now

    at(now)

    # Rate(max=3, per=1): three first segments start; their second segments
    # (due at once) and the two others wait, each behind the one told
    # before, a third of the period apart; another key has its own budget.
    assert len(starts(runs)) == 3
    assert len(starts(other)) == 2  # both its segments
    told = Event.objects.filter(aggregate_id__in=runs, type=et.RATE_WAITING).order_by("id")
    wakes = [status(event.aggregate_id).wake_at for event in told]
    assert len(wakes) == 5 and wakes == sorted(wakes) and len(set(wakes)) == 5
    assert now + timedelta(seconds=1) == wakes[0]
    assert wakes[-1] <= now + timedelta(seconds=3)
    assert all(status(run).suspension_type == "rate" for run in runs)

    # A pass at each instant: never more than three starts in any second.
    for tick in range(1, 12):
        at(now + timedelta(seconds=tick / 3))
    for run in [*runs, *other]:
        assert status(run).status == RunStatus.COMPLETED, types_of(run)
    instants = starts(runs)
    assert len(instants) == 10  # two segments each
    for i, first in enumerate(instants):
        assert sum(first <= t < first + timedelta(seconds=1) for t in instants[i:]) <= 3


def test_rate_slots_rebuild_from_the_streams(virtual_now):
    from kumiko_workflows.models import RateSlot

    _rate_runs(5)
    at(virtual_now)
    before = sorted(RateSlot.objects.values_list("rate_key", "slot", "last_start"))

    assert rebuild.check().differences == []
    RateSlot.objects.update(last_start=None)  # lost: the streams give them back
    result = rebuild.rebuild()

    assert sorted(RateSlot.objects.values_list("rate_key", "slot", "last_start")) == before
    assert len(result.differences) == 4  # the three starts and the queue's tail, restored


# --- seen by people ---------------------------------------------------------------


def test_status_explain_and_admin_say_why_a_run_waits_for_a_limit(future, admin_client):
    import json

    from django.core.management import call_command

    from kumiko_workflows.operations.explain import explain

    _start("active", "acme", future, count=2)
    queued = _start("active", "acme", future, count=1)
    _rate_runs(4)
    resume_due_runs(now=timezone.now())

    why = explain(status(queued[0]), timezone.now())
    assert why.headline.startswith("Queued behind 2 active run(s) of key 'acme'")
    waiting = next(
        run.run_id
        for run in WorkflowRun.objects.filter(workflow_name="t-rate", suspension_type="rate")
    )
    assert explain(status(waiting), timezone.now()).headline.startswith("Rate limit: next slot in")

    from io import StringIO

    out = StringIO()
    call_command("workflow_status", "--json", stdout=out)
    flow = json.loads(out.getvalue())["flow_control"]
    assert flow["queued"] == [
        {
            "tenant_id": "default",
            "workflow_name": "t-limit-active",
            "key": "acme",
            "queued": 1,
            "oldest_queued_at": flow["queued"][0]["oldest_queued_at"],
            "why": "queued behind 2 active run(s) of key 'acme' "
            "(concurrency limit 2, held from start to end)",
        }
    ]
    assert flow["rate"][0]["workflow_name"] == "t-rate"
    assert flow["rate"][0]["why"].startswith("rate limit: next slot in")
    out = StringIO()
    call_command("workflow_status", stdout=out)
    assert "t-limit-active key 'acme' (tenant default): 1 queued, queued behind 2 active" in (
        out.getvalue()
    )

    page = admin_client.get(f"/admin/kumiko_workflows/workflowrun/{queued[0]}/change/")
    assert b"Queued behind 2 active run(s) of key" in page.content
    listing = admin_client.get("/admin/kumiko_workflows/workflowrun/?suspension_type=limited")
    assert str(queued[0])[:8].encode() in listing.content


def test_manage_check_reports_a_bad_limit_with_its_id():
    from kumiko_workflows.checks import check_workflows
    from kumiko_workflows.workflow.definition import Workflow

    bad = Workflow(
        "t-bad-limit-check",
        on_event("t.bad-limit-check"),
        [steps.compute("one", lambda ctx: 1)],
        concurrency=Limit(max=2, key="customer"),
        rate=Rate(max=3, per=0),
    )
    found = {message.id: message for message in check_workflows(workflows=[bad])}
    assert {"kumiko_workflows.E112", "kumiko_workflows.E113"} <= set(found)
    assert "concurrency key must be a callable" in found["kumiko_workflows.E112"].msg
    assert found["kumiko_workflows.E113"].hint


def test_a_holder_whose_release_was_missed_is_freed_when_a_run_needs_its_slot(future, now):
    """A run ended while its workflow declared no limit (an edit): its slot is freed, recorded."""
    from kumiko_workflows.workflow.definition import registry

    holders = _start("active", "k", future, count=2)
    resume_due_runs()
    limited = registry.get("t-limit-active")
    unlimited = define_workflow(
        name="t-limit-active",
        trigger=on_event("t.limit-active"),
        idempotency_key=limited.idempotency_key,
        steps=limited.steps,
        register=False,
    )
    with registry.override(unlimited):
        resume_due_runs(now=now + timedelta(days=1))  # the holders complete, unreleased
    assert all(status(run).status == RunStatus.COMPLETED for run in holders)
    assert LimitSlot.objects.filter(holder_run_id__isnull=False).count() == 2

    (late,) = _start("active", "k", future)
    resume_due_runs()

    assert status(late).suspension_type == "wait"  # took a freed slot, not queued
    assert types_of(holders[0])[-1] == et.SLOT_RELEASED
    assert rebuild.check().differences == []
