"""The reference's resume-loop scenarios, through the public API."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kumiko_workflows import event_types as et
from kumiko_workflows import resume_due_runs, run_id_for
from kumiko_workflows.models import WorkflowRun, WorkflowRunPending
from tests.conftest import run_events, trigger, types_of

pytestmark = pytest.mark.django_db


def test_due_wait_resumes_to_completion_and_pending_row_goes(past):
    event = trigger("t.wait", **{"for": past})
    run_id = run_id_for("t-wait", event.payload["run_key"], "default")
    assert WorkflowRunPending.objects.filter(run_id=run_id, step="1").exists()

    report = resume_due_runs()

    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_COMPLETED]
    assert run_events(run_id)[3].payload == {"workflow_name": "t-wait", "step_count": 3}
    assert not WorkflowRunPending.objects.filter(run_id=run_id).exists()
    assert (report.resumed, report.completed) == (1, 1)
    assert WorkflowRun.objects.get(run_id=run_id).status == "completed"


def test_not_yet_due_wait_is_left_alone(future):
    event = trigger("t.wait", **{"for": future})
    run_id = run_id_for("t-wait", event.payload["run_key"], "default")

    report = resume_due_runs()

    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]
    assert WorkflowRunPending.objects.filter(run_id=run_id).exists()
    assert report.resumed == 0


def test_a_future_wait_is_due_once_its_instant_has_passed(now):
    event = trigger("t.wait", **{"for": "PT1H"})
    run_id = run_id_for("t-wait", event.payload["run_key"], "default")

    assert resume_due_runs(now=now + timedelta(minutes=59)).resumed == 0
    assert resume_due_runs(now=now + timedelta(minutes=61)).completed == 1
    assert types_of(run_id)[-1] == et.RUN_COMPLETED
