"""start="worker": a trigger queues the run, and a worker runs its steps after the commit."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kumiko_workflows import (
    define_workflow,
    on_event,
    resume_due_runs,
    run_id_for,
    start_in_worker,
    steps,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.exceptions import WorkflowDefinitionError
from kumiko_workflows.models import WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations.explain import explain
from kumiko_workflows.workflow.registry import registry
from tests.support import trigger, types_of
from tests.testapp import workflows as w

EXECUTED: list[str] = []


def record(ctx):
    EXECUTED.append(ctx.event.payload["run_key"])
    if ctx.event.payload.get("boom"):
        raise RuntimeError("the first step failed")
    return len(EXECUTED)


def _queued(start: str = "worker"):
    return define_workflow(
        name="t-queued",
        trigger=on_event("t.queued"),
        idempotency_key=w.run_key,
        steps=[steps.compute("first", record), steps.wait("PT1H"), steps.compute("last", record)],
        start=start,
        register=False,
    )


@pytest.fixture(autouse=True)
def _clean():
    EXECUTED.clear()


@pytest.mark.django_db
def test_a_queued_run_runs_no_step_in_the_appending_transaction():
    with registry.override(_queued()):
        event = trigger("t.queued")
        run_id = run_id_for("t-queued", event.payload["run_key"])

        assert EXECUTED == []  # the request returned without running a step
        assert types_of(run_id) == [et.RUN_STARTED, et.RUN_QUEUED]
        run = WorkflowRun.objects.get(run_id=run_id)
        assert (run.status, run.suspension_type, run.step) == ("waiting", "queued", "0")
        pending = WorkflowRunPending.objects.get(run_id=run_id)
        assert pending.wake_at == pending.suspended_at  # due at once, as it was queued
        assert pending.wake_at - event.created_at < timedelta(seconds=1)
        facts = dict(explain(run, event.created_at).facts)
        assert facts["Queued"].startswith("to start in a worker since")

        report = resume_due_runs(now=event.created_at + timedelta(seconds=1))
    assert (report.resumed, report.suspended, report.errors) == (1, 1, 0), report
    assert EXECUTED == [event.payload["run_key"]]
    assert types_of(run_id) == [et.RUN_STARTED, et.RUN_QUEUED, et.RESUMED, et.WAITING]
    # Its timer runs from the moment the worker ran the step, not from the trigger.
    wake_at = WorkflowRunPending.objects.get(run_id=run_id).wake_at
    assert wake_at == event.created_at + timedelta(seconds=1, hours=1)


@pytest.mark.django_db
def test_a_failing_first_step_fails_the_run_in_the_worker_not_the_request():
    with registry.override(_queued()):
        event = trigger("t.queued", boom=True)  # the append itself succeeds
        run_id = run_id_for("t-queued", event.payload["run_key"])
        assert WorkflowRun.objects.get(run_id=run_id).status == "waiting"
        report = resume_due_runs(now=event.created_at + timedelta(seconds=1))
    assert (report.failed, report.errors) == (1, 0)
    run = WorkflowRun.objects.get(run_id=run_id)
    assert (run.status, run.failure_reason) == ("failed", "step_failed")


@pytest.mark.django_db
def test_start_in_worker_queues_one_call_of_an_inline_workflow():
    with registry.override(_queued(start="inline")):
        inline = trigger("t.queued")
        with start_in_worker():
            queued = trigger("t.queued")
        again = trigger("t.queued")
    assert types_of(run_id_for("t-queued", inline.payload["run_key"]))[-1] == et.WAITING
    assert types_of(run_id_for("t-queued", queued.payload["run_key"])) == [
        et.RUN_STARTED,
        et.RUN_QUEUED,
    ]
    assert types_of(run_id_for("t-queued", again.payload["run_key"]))[-1] == et.WAITING


def test_an_unknown_start_mode_is_refused():
    with pytest.raises(WorkflowDefinitionError, match="start must be one of inline, worker"):
        _queued(start="later")
