"""The operations from async code: no SynchronousOnlyOperation, same results and errors."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import SynchronousOnlyOperation

from kumiko_workflows import (
    aappend_event,
    acancel_run,
    aresume_due_runs,
    await_run_finished,
    awake_run,
    run_id_for,
)
from kumiko_workflows import append_event as sync_append_event
from kumiko_workflows.exceptions import InvalidArgument, InvalidEvent, RunNotFound


@pytest.mark.django_db
def test_an_async_view_appends_wakes_resumes_and_awaits_a_run():
    async def view():
        with pytest.raises(SynchronousOnlyOperation):
            sync_append_event(uuid.uuid4(), "t", "t.wait", {"run_key": "x", "for": "PT1H"})
        key = uuid.uuid4().hex
        event = await aappend_event(uuid.uuid4(), "t", "t.wait", {"run_key": key, "for": "PT1H"})
        run_id = run_id_for("t-wait", key)
        assert await awake_run(run_id, by="async-view") is True
        report = await aresume_due_runs(now=event.created_at + timedelta(seconds=1))
        run = await await_run_finished(run_id, timeout=5)
        return report, run

    report, run = async_to_sync(view)()
    assert (report.completed, run.status) == (1, "completed")


@pytest.mark.django_db
def test_awaiting_a_run_times_out_and_errors_are_the_sync_ones():
    async def view():
        key = uuid.uuid4().hex
        await aappend_event(uuid.uuid4(), "t", "t.wait", {"run_key": key, "for": "PT1H"})
        run_id = run_id_for("t-wait", key)
        with pytest.raises(TimeoutError, match="still waiting"):
            await await_run_finished(run_id, timeout=0.05, interval=0.01)
        assert await acancel_run(run_id, "no longer needed") is True
        assert (await await_run_finished(run_id, timeout=1)).status == "cancelled"
        with pytest.raises(RunNotFound):
            await await_run_finished(uuid.uuid4())
        with pytest.raises(InvalidArgument, match="timeout must be a positive number"):
            await await_run_finished(run_id, timeout=0)
        refusals = {
            "timeout": (10**400, "an integer of 1329 bits"),
            "interval": (float("inf"), "inf"),
        }
        for name, (value, shown) in refusals.items():
            with pytest.raises(InvalidArgument) as refused:
                await await_run_finished(run_id, **{name: value})
            assert str(refused.value) == (
                f"{name} must be a positive number of seconds (finite), got {shown}"
            )
        with pytest.raises(InvalidArgument, match=r"got nan$"):
            await await_run_finished(run_id, timeout=float("nan"))
        with pytest.raises(InvalidEvent, match="aggregate_id must be a UUID"):
            await aappend_event("nope", "t", "t.wait", {})

    async_to_sync(view)()
