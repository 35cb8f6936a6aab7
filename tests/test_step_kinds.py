"""A step kind added by one module in tests/ runs, suspends and resumes through the engine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kumiko_workflows import define_workflow, on_event, resume_due_runs, run_id_for, steps
from kumiko_workflows import event_types as et
from kumiko_workflows.exceptions import WorkflowDefinitionError
from kumiko_workflows.models import WorkflowRun, WorkflowRunPending
from kumiko_workflows.steps import Step
from kumiko_workflows.workflow.registry import registry
from kumiko_workflows.workflow.suspensions import RECORDS
from tests.conftest import trigger, types_of
from tests.step_kinds import nap_until
from tests.testapp import workflows as w


def _first(ctx):
    return {"n": 1}


def _second(ctx):
    return ctx.steps["first"]["n"] + 1


def _napping(nap, **kwargs):
    return define_workflow(
        name="t-napping",
        trigger=on_event("t.nap"),
        idempotency_key=w.run_key,
        steps=[steps.compute("first", _first), nap, steps.compute("second", _second)],
        register=False,
        **kwargs,
    )


def _next_hour(after: datetime, hour: int) -> datetime:
    at = after.astimezone(UTC).replace(hour=hour, minute=0, second=0, microsecond=0)
    return at if at > after else at + timedelta(days=1)


@pytest.mark.django_db
def test_a_step_kind_from_the_tests_runs_suspends_and_resumes():
    with registry.override(_napping(nap_until(3))):
        event = trigger("t.nap")
        run_id = run_id_for("t-napping", event.payload["run_key"])
        run = WorkflowRun.objects.get(run_id=run_id)
        wake_at = _next_hour(run.started_at, 3)

        assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]
        pending = WorkflowRunPending.objects.get(run_id=run_id)
        assert (pending.step, pending.suspension_type, pending.wake_at) == ("1", "wait", wake_at)

        assert resume_due_runs(now=wake_at - timedelta(seconds=1)).processed == 0
        report = resume_due_runs(now=wake_at)

    assert (report.resumed, report.completed, report.errors) == (1, 1, 0), report
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_COMPLETED]
    assert WorkflowRun.objects.get(run_id=run_id).status == "completed"


@pytest.mark.django_db
def test_the_test_kind_resumes_inside_a_branch_and_its_callable_result_is_checked():
    nested = steps.branch(if_=True, then=[nap_until(lambda ctx: 23)])
    with registry.override(_napping(nested)):
        event = trigger("t.nap")
        run_id = run_id_for("t-napping", event.payload["run_key"])
        assert WorkflowRunPending.objects.get(run_id=run_id).step == "1.then.0"
        report = resume_due_runs(now=datetime.now(UTC) + timedelta(days=2))
    assert report.completed == 1
    assert types_of(run_id)[-1] == et.RUN_COMPLETED

    with registry.override(_napping(nap_until(lambda ctx: 99))):
        event = trigger("t.nap")
        run_id = run_id_for("t-napping", event.payload["run_key"])
    failed = types_of(run_id)
    assert failed == [et.RUN_STARTED, et.RUN_FAILED]
    run = WorkflowRun.objects.get(run_id=run_id)
    assert run.failure_reason == "invalid_step_argument"
    assert "hour must be an integer from 0 to 23, got 99" in run.last_error


def test_the_test_kinds_own_validation_runs_at_definition_time():
    with pytest.raises(WorkflowDefinitionError, match=r"E901.*hour must be an integer"):
        _napping(nap_until(24))


def test_every_suspension_record_agrees_with_the_models_choices():
    from kumiko_workflows.models import RunStatus, SuspensionType

    assert {r.suspension_type for r in RECORDS} == set(SuspensionType.values)
    assert {r.event_type for r in RECORDS} == set(et.SUSPENSIONS)
    assert RunStatus.WAITING == "waiting"
    # Every built-in suspending kind resumes from a record that exists.
    kinds = {
        cls for cls in Step.__subclasses__() if cls.__module__ == "kumiko_workflows.workflow.steps"
    }
    assert {cls.kind for cls in kinds} >= {"wait", "wait_for_event", "retry"}
    assert {t for cls in kinds for t in cls.resumes_from} <= set(SuspensionType.values)
