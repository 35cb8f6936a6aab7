"""Composition under real processes on PostgreSQL: a worker killed while compensating,
and a parent resumed while its last child finishes.

Workers are real ``manage.py resume_due_runs`` processes (tests/support/faults.py).
"""

from __future__ import annotations

import signal
import uuid

import pytest
from django.db import connection

from kumiko_workflows import event_types as et
from kumiko_workflows import resume_due_runs, run_id_for, wake_run
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from tests.support import run_events, trigger, types_of
from tests.support.faults import Worker, wait_for

FAR = "2999-01-01T00:00:00Z"


def _backends(application_name: str) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application_name]
        )
        return [pid for (pid,) in cursor.fetchall()]


def _undone(run_id) -> list[str]:
    return [
        e.payload["step"]
        for e in Event.objects.filter(type="t.undone").order_by("id")
        if e.payload["run"] == str(run_id)
    ]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_compensations_run_in_reverse_order_exactly_once_across_a_sigkill(tmp_path, past):
    event = trigger("t.saga", wait_until=past, sync_dir=str(tmp_path), block="undo-b")
    run_id = run_id_for("t-saga", event.payload["run_key"])
    # Up to the failing payment: the compensations are due.
    for _ in range(5):
        resume_due_runs()
        if WorkflowRunPending.objects.filter(run_id=run_id, suspension_type="compensate").exists():
            break
    assert types_of(run_id)[-1] == et.COMPENSATION_SCHEDULED

    name = f"kumiko-compensating-{uuid.uuid4().hex[:8]}"
    doomed = Worker(tmp_path, "--no-cron", name=name)
    try:
        # c was undone, b is being undone, in the worker's open transaction.
        wait_for((tmp_path / "running-undo-b").exists, "the worker to enter b's compensation")
        doomed.signal(signal.SIGKILL)
        assert doomed.wait() == -signal.SIGKILL
    finally:
        doomed.signal(signal.SIGKILL)
        doomed.wait()
    wait_for(lambda: not _backends(name), "the killed worker's backend to go")

    # Rolled back with the worker: nothing undone, nothing recorded.
    assert _undone(run_id) == []
    assert types_of(run_id)[-1] == et.COMPENSATION_SCHEDULED
    assert WorkflowRun.objects.get(run_id=run_id).suspension_type == "compensate"

    (tmp_path / "release").touch()
    survivor = Worker(tmp_path, "--no-cron", name="kumiko-compensation-survivor")
    assert survivor.wait() == 0, survivor
    assert _undone(run_id) == ["c", "b", "a"]
    events = run_events(run_id)
    compensated = [e.payload["step"] for e in events if e.type == et.STEP_COMPENSATED]
    assert compensated == ["3", "2", "0"]
    assert events[-1].type == et.RUN_FAILED
    assert events[-1].payload["compensated"] == ["3", "2", "0"]
    assert WorkflowRun.objects.get(run_id=run_id).status == "failed"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_parent_resumed_while_its_last_child_finishes_is_not_stranded(tmp_path):
    event = trigger("t.call", n=4, wait_until=FAR)
    parent = run_id_for("t-parent-call", event.payload["run_key"])
    [child] = WorkflowRun.objects.filter(parent_run_id=parent)
    assert types_of(parent) == [et.RUN_STARTED, et.WAITING_FOR_CHILDREN]

    # The parent is woken before its child finished (an operator's wake): a
    # worker resumes it, finds the child running, and waits again; it is
    # held after that decision, before its commit.
    assert wake_run(parent)
    holder = Worker(
        tmp_path,
        "--no-cron",
        name="kumiko-parent-holder",
        KUMIKO_TEST_HOLD_CHILDREN_WAIT=str(tmp_path),
    )
    try:
        wait_for((tmp_path / "parent-suspending").exists, "the parent's resume to wait again")
        # Meanwhile the child finishes in another process: the parent's row is
        # held, its new wait not yet visible.
        assert wake_run(child.run_id)
        finisher = Worker(tmp_path, "--no-cron", name="kumiko-child-finisher")
        assert finisher.wait() == 0, finisher
        assert WorkflowRun.objects.get(run_id=child.run_id).status == "completed"
        (tmp_path / "parent-release").touch()
        assert holder.wait() == 0, holder
    finally:
        holder.stop()

    # Whichever committed second saw the other: the parent is due, not stranded.
    row = WorkflowRunPending.objects.get(run_id=parent)
    assert row.suspension_type == "children" and row.awaited_event_id is not None, row
    assert resume_due_runs().completed == 1
    assert WorkflowRun.objects.get(run_id=parent).status == "completed"
    assert run_events(parent)[-1].payload["state"]["results"]["child"] == {"doubled": 8}
