"""Priorities: due runs are claimed by a bounded head start, proven from the run streams' order.

The order runs were resumed in is read from their ``workflow.step.resumed``
events, by id (inserted as each run is claimed, in one process). The
starvation bound is proven on a worker that runs exactly at capacity:
without priorities the lowest-priority run starts at once; with them, at
most ``2 × PRIORITY_HEAD_START`` later (exactly that, here), although
higher-priority runs keep coming due long after.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import pytest

from kumiko_workflows import define_workflow, on_event, resume_due_runs, run_id_for, steps, wake_run
from kumiko_workflows import event_types as et
from kumiko_workflows.checks import check_settings
from kumiko_workflows.exceptions import WorkflowDefinitionError
from kumiko_workflows.models import Event, RunStatus, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations import rebuild
from kumiko_workflows.workflow.definition import registry
from tests.support import trigger

pytestmark = pytest.mark.django_db


def _key(event):
    return event.payload["run_key"]


def _until(ctx):
    return ctx.event.payload["until"]


def _chosen(event):
    return event.payload["priority"]


def _waiting(name: str, priority, trigger_priority=None):
    """A workflow ``name`` that waits until the trigger's ``until``, then completes."""
    return define_workflow(
        name=name,
        trigger=on_event(f"{name}.go", priority=trigger_priority),
        idempotency_key=_key,
        priority=priority,
        steps=[steps.wait(_until), steps.compute("done", lambda ctx: True)],
        register=False,
    )


HIGH = _waiting("p-high", 100)
NONE = _waiting("p-none", None)
LOW = _waiting("p-low", -100)
CHOSEN = _waiting("p-chosen", 0, trigger_priority=_chosen)


@pytest.fixture(autouse=True)
def _definitions(settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "PRIORITY_HEAD_START": 10}
    with registry.override(HIGH, NONE, LOW, CHOSEN):
        yield


def _start(workflow, key: str, until, **payload) -> uuid.UUID:
    trigger(f"{workflow.name}.go", run_key=key, until=until.isoformat(), **payload)
    return run_id_for(workflow.name, key, "default")


def resumed() -> list[uuid.UUID]:
    return list(
        Event.objects.filter(type=et.RESUMED).order_by("id").values_list("aggregate_id", flat=True)
    )


def test_due_runs_are_claimed_higher_priority_first(now):
    due = now + timedelta(minutes=1)
    low = _start(LOW, "low", due)
    none = _start(NONE, "none", due)
    high = _start(HIGH, "high", due)

    resume_due_runs(now=due + timedelta(minutes=5))

    assert resumed() == [high, none, low]
    assert list(WorkflowRun.objects.order_by("priority").values_list("priority", flat=True)) == [
        -100,
        0,
        100,
    ]


def test_the_head_start_is_bounded_a_run_due_enough_earlier_goes_first(now):
    # High priority is a 10 s head start, not a tier: a default run due 11 s
    # before a high one is claimed first, one due 9 s before is not.
    t0 = now + timedelta(minutes=1)
    high = _start(HIGH, "high", t0 + timedelta(seconds=11))
    early = _start(NONE, "early", t0)
    close = _start(NONE, "close", t0 + timedelta(seconds=2))

    resume_due_runs(now=t0 + timedelta(minutes=1))

    assert resumed() == [early, high, close]


def test_a_priority_per_start_and_the_triggers_over_the_workflows(now, caplog):
    due = now + timedelta(minutes=1)
    mid = _start(CHOSEN, "mid", due, priority=50)
    top = _start(CHOSEN, "top", due, priority=90)
    with caplog.at_level(logging.ERROR, "kumiko_workflows.runner"):
        wrong = _start(CHOSEN, "wrong", due, priority=500)
    assert "priority: a priority is from -100 to 100, got 500; the run has none" in caplog.text

    resume_due_runs(now=due + timedelta(minutes=5))

    assert resumed() == [top, mid, wrong]
    started = Event.objects.get(aggregate_id=top, type=et.RUN_STARTED)
    assert started.payload["priority"] == 90
    waiting = Event.objects.get(aggregate_id=top, type=et.WAITING)
    assert (waiting.payload["priority"], waiting.payload["head_start"]) == (90, 9.0)
    assert "priority" not in Event.objects.get(aggregate_id=wrong, type=et.WAITING).payload


def test_a_held_back_run_is_not_kept_waiting_by_an_idle_worker(now):
    due = now + timedelta(minutes=1)
    low = _start(LOW, "low", due)
    row = WorkflowRunPending.objects.get(run_id=low)
    assert row.claim_at == due + timedelta(seconds=10)

    # Due, nothing else is: taken at once, not 10 s later.
    assert resume_due_runs(now=due).completed == 1


def test_a_wake_up_keeps_the_runs_head_start(now):
    high = _start(HIGH, "high", now + timedelta(days=1))
    assert wake_run(high)
    row = WorkflowRunPending.objects.get(run_id=high)
    assert row.claim_at == row.wake_at - timedelta(seconds=10)
    woken = Event.objects.get(aggregate_id=high, type=et.WAKE_REQUESTED)
    assert woken.payload["head_start"] == 10.0


def test_a_rebuild_gives_the_same_claim_order(now):
    for i, workflow in enumerate((HIGH, NONE, LOW, HIGH, LOW)):
        _start(workflow, f"k{i}", now + timedelta(minutes=i))
    wake_run(run_id_for("p-low", "k2", "default"))
    before = list(
        WorkflowRunPending.objects.order_by("claim_at", "id").values_list(
            "run_id", "claim_at", "priority"
        )
    )
    assert rebuild.check().differences == []
    result = rebuild.rebuild(apply=True)
    assert result.differences == []
    after = list(
        WorkflowRunPending.objects.order_by("claim_at", "id").values_list(
            "run_id", "claim_at", "priority"
        )
    )
    assert [row[1:] for row in after] == [row[1:] for row in before]
    assert [row[0] for row in after] == [row[0] for row in before]


def _saturated(now, head_start: float, settings) -> tuple[int, list[int]]:
    """The pass (second) the lowest-priority run is resumed in, on a worker at capacity.

    One run of priority -100 is due at T0; two runs of priority 100 come due
    every second from T0 to T0 + 40 s; each pass (one a second) resumes two
    runs. Returns the pass of the low run and the backlog after each pass.
    """
    settings.KUMIKO_WORKFLOWS = {
        **settings.KUMIKO_WORKFLOWS,
        "PRIORITY_HEAD_START": head_start,
        "BATCH_SIZE": 2,
    }
    t0 = now + timedelta(minutes=5)
    low = _start(LOW, "low", t0)
    for second in range(41):
        for n in range(2):
            _start(HIGH, f"h{second}-{n}", t0 + timedelta(seconds=second))
    started_at = None
    backlog = []
    for second in range(41):
        at = t0 + timedelta(seconds=second)
        assert resume_due_runs(now=at, limit=2).completed == 2
        if started_at is None and WorkflowRun.objects.get(run_id=low).status == RunStatus.COMPLETED:
            started_at = second
        backlog.append(WorkflowRunPending.objects.filter(wake_at__lte=at).count())
    assert started_at is not None, "the low-priority run starved"
    return started_at, backlog


def test_without_priorities_the_low_run_starts_at_once(now, settings):
    # The baseline of the bound: PRIORITY_HEAD_START 0 is plain due order.
    started_at, backlog = _saturated(now, 0, settings)
    assert started_at == 0
    assert max(backlog) <= 1


def test_the_lowest_priority_starts_at_most_twice_the_head_start_late(now, settings):
    # Higher-priority work keeps coming due faster than the worker can
    # overtake it: strict tiers would starve the low run for all 40 passes.
    # The head start bounds its delay by 2 x PRIORITY_HEAD_START (10 s):
    # here, at capacity, it is exactly that.
    started_at, backlog = _saturated(now, 10, settings)
    assert started_at == 20
    assert max(backlog) <= 2  # the worker kept up throughout


def test_bad_priorities_are_refused_with_the_check_id():
    with pytest.raises(WorkflowDefinitionError, match=r"E115.*from -100 to 100, got 101"):
        _waiting("p-bad", 101)
    with pytest.raises(WorkflowDefinitionError, match=r"E115.*whole number.*'high'"):
        on_event("x.go", priority="high")
    with pytest.raises(WorkflowDefinitionError, match=r"E115.*whole number.*True"):
        _waiting("p-bad", True)


def test_a_bad_head_start_setting_is_reported(settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "PRIORITY_HEAD_START": -5}
    ids = [message.id for message in check_settings(None)]
    assert "kumiko_workflows.E116" in ids
