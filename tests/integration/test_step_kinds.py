"""A step kind added by one module in tests/ runs, suspends and resumes through the engine."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from kumiko_workflows import define_workflow, on_event, resume_due_runs, run_id_for, signals, steps
from kumiko_workflows import event_types as et
from kumiko_workflows.engine import transitions
from kumiko_workflows.exceptions import WorkflowDefinitionError
from kumiko_workflows.models import SuspensionType, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations.explain import describe_event, explain
from kumiko_workflows.projections import run_status
from kumiko_workflows.steps import Step, Suspend, path_text
from kumiko_workflows.telemetry import outcome_of
from kumiko_workflows.workflow import suspensions
from kumiko_workflows.workflow.registry import registry
from kumiko_workflows.workflow.suspensions import RECORDS
from tests.support import trigger, types_of
from tests.support.step_kinds import nap_until
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


def test_the_suspension_type_choices_are_the_records():
    assert SuspensionType.choices == [(r.suspension_type, r.label) for r in RECORDS]
    assert [member.name for member in SuspensionType] == [r.name for r in RECORDS]
    assert SuspensionType.EVENT == suspensions.EVENT.suspension_type


# --- a new kind of suspension: one record ----------------------------------------

#: A way to wait that the package does not have: parked until a worker passes.
PARKED = suspensions.Record(
    "tests.step.parked",
    "parked",
    pending=lambda payload, at: {"wake_at": at, "due_since": at},
    status=lambda payload, at: {"wake_at": at},
    resumes_after_step=True,
    attempt=lambda row: 1,
    facts=lambda row, tell: [("Parked", f"since {tell.when(row.suspended_at)}")],
    label="parked",
    signal=signals.run_suspended,
    outcome="suspended",
    summary=lambda payload, words: f"parked at step {payload['step']}",
)


@dataclass(frozen=True, eq=False)
class Park(Step):
    kind = "park"
    suspends = True
    resumes_from = (PARKED.suspension_type,)

    def describe(self):
        return {"kind": self.kind}

    def run(self, execution, path):
        raise Suspend(PARKED.event_type, {"step": path_text(path)})


def test_a_suspension_record_is_all_a_new_kind_of_suspension_takes():
    """Its event type, signal, outcome label and words exist once the record does, and only then."""
    kind = PARKED.event_type
    with suspensions.registered(PARKED):
        assert et.is_run_event(kind) and et.is_suspension(kind) and kind in et.run_events()
        assert run_status.handles(kind)  # both projections take it
        assert transitions.handles(kind)
        assert transitions.transition(kind)[0] is signals.run_suspended
        assert outcome_of(kind) == "suspended"
        assert describe_event(kind, {"step": "1"}) == "parked at step 1"
    assert not et.is_run_event(kind) and not et.is_suspension(kind)
    assert not run_status.handles(kind) and transitions.transition(kind) is None
    assert outcome_of(kind) is None
    assert describe_event(kind, {"step": "1", "note": "x"}) == "note=x"  # its fields alone


@pytest.mark.django_db
def test_a_run_suspends_and_resumes_with_a_suspension_record_added_outside_the_package():
    with suspensions.registered(PARKED):
        workflow = define_workflow(
            "t-parked",
            on_event("t.parked"),
            [steps.compute("first", _first), Park(), steps.compute("second", _second)],
            idempotency_key=w.run_key,
            register=False,
        )
        with registry.override(workflow):
            event = trigger("t.parked")
            run_id = run_id_for("t-parked", event.payload["run_key"])
            run = WorkflowRun.objects.get(run_id=run_id)
            assert (run.status, run.suspension_type, run.step) == ("waiting", "parked", "1")
            row = WorkflowRunPending.objects.get(run_id=run_id)
            assert row.suspension_type == "parked" and row.wake_at is not None
            assert "Parked" in dict(explain(run, row.wake_at).facts)
            assert resume_due_runs(now=row.wake_at + timedelta(seconds=1)).completed == 1
            run.refresh_from_db()
            assert run.status == "completed"
            assert types_of(run_id)[1] == PARKED.event_type
