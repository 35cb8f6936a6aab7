"""The run signals: once per transition, after commit, never for what was rolled back.

The tests commit for real (``transaction=True``): a signal is sent by
``on_commit``, which a test wrapped in one transaction never reaches.
"""

from __future__ import annotations

import io
import logging
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from kumiko_workflows import (
    cancel_run,
    resume_due_runs,
    run_id_for,
    signals,
    steps,
)
from kumiko_workflows.workflow.registry import registry
from tests.integration.test_runs import workflow
from tests.support import trigger, types_of
from tests.testapp.workflows import payload_value

pytestmark = pytest.mark.django_db(transaction=True)

_SECOND = timedelta(seconds=1)
SIGNALS = {
    "started": signals.run_started,
    "suspended": signals.run_suspended,
    "completed": signals.run_completed,
    "failed": signals.run_failed,
    "cancelled": signals.run_cancelled,
}
#: How often each run's steps ran (by run key): proof that a redo happened.
EXECUTIONS: dict[str, int] = {}


def counted(ctx):
    key = ctx.event.payload["run_key"]
    EXECUTIONS[key] = EXECUTIONS.get(key, 0) + 1
    return EXECUTIONS[key]


def fails(ctx):
    raise RuntimeError("secret-detail: the step broke")


def start_child_then_fail(ctx):
    """Start another workflow's run inline (it completes), then fail: both are rolled back."""
    ctx.append_event(ctx.event.aggregate_id, "test-source", "s.child", {"run_key": "child"})
    raise RuntimeError("after starting a child")


WAIT = workflow(
    "s-wait",
    [
        steps.compute("first", counted),
        steps.wait(payload_value("for", "PT1H")),
        steps.compute("after", counted),
    ],
)
FAIL = workflow("s-fail", [steps.compute("boom", fails)])
PARENT = workflow("s-parent", [steps.compute("child", start_child_then_fail)])
CHILD = workflow("s-child", [steps.compute("done", counted)])
RETRY = workflow(
    "s-retry",
    [steps.retry(times=2, backoff="linear", base_delay="PT10S", do=[steps.compute("x", fails)])],
)
EVENT = workflow(
    "s-event",
    [steps.wait_for_event("paid", timeout="P3D")],
    awaits={"paid": "s.paid"},
)


@pytest.fixture
def heard():
    """Every signal sent, as (name, run_id, kwargs) in order, while the test runs."""
    EXECUTIONS.clear()
    received: list[tuple[str, object, dict]] = []
    receivers = {}
    for name, signal in SIGNALS.items():

        def receiver(sender, name=name, **kwargs):
            kwargs["sender"] = sender
            received.append((name, kwargs["run_id"], kwargs))

        signal.connect(receiver, weak=False)
        receivers[name] = receiver
    with registry.override(WAIT, FAIL, PARENT, CHILD, RETRY, EVENT):
        yield received
    for name, signal in SIGNALS.items():
        signal.disconnect(receivers[name])


def _names(received, run_id=None):
    return [name for name, run, _ in received if run_id is None or run == run_id]


def test_an_inline_start_signals_when_the_callers_transaction_commits(heard):
    with transaction.atomic():
        event = trigger("s.wait")
        assert heard == [], "nothing may be sent before the commit"
    run_id = run_id_for("s-wait", event.payload["run_key"])

    assert _names(heard) == ["started", "suspended"]
    started, suspended = (kwargs for _, _, kwargs in heard)
    assert started["sender"] is WAIT
    assert started["workflow_name"] == "s-wait" and started["tenant_id"] == "default"
    assert started["trigger_event_id"] == event.id
    assert started["idempotency_key"] == event.payload["run_key"]
    assert started["event"].type == "workflow.run-started"
    assert suspended["step"] == "1" and suspended["suspension_type"] == "wait"
    # The run's steps run at its run-started instant (ctx.now).
    assert suspended["wake_at"] == started["event"].created_at + timedelta(hours=1)

    report = resume_due_runs(now=event.created_at + timedelta(hours=1, seconds=1))
    assert report.completed == 1
    assert _names(heard, run_id) == ["started", "suspended", "completed"]


def test_a_rolled_back_caller_sends_nothing(heard):
    with pytest.raises(RuntimeError), transaction.atomic():
        trigger("s.wait")
        raise RuntimeError("the domain write is abandoned")
    assert heard == []


def test_a_failing_step_signals_the_failure_once_and_nothing_of_what_it_rolled_back(heard):
    """The parent's step started a child run (which completed), then raised: the step's
    savepoint takes the child run back, and with it the child's signals."""
    event = trigger("s.parent")
    parent = run_id_for("s-parent", event.payload["run_key"])
    child = run_id_for("s-child", "child")

    assert [(name, run) for name, run, _ in heard] == [("started", parent), ("failed", parent)]
    failed = heard[-1][2]
    assert (failed["reason"], failed["step"], failed["error_class"]) == (
        "step_failed",
        "0",
        "RuntimeError",
    )
    assert EXECUTIONS == {"child": 1}, "the child did run, inside the rolled-back savepoint"
    assert types_of(child) == []


@pytest.mark.parametrize(
    ("together", "executions"),
    # Row by row: the start, the rolled-back resume, the resume that committed. Together,
    # also the batch whose set writes were refused before it went again row by row.
    [(False, 3), pytest.param(True, 4, marks=pytest.mark.postgres)],
    ids=["row_by_row", "together"],
)
def test_a_batch_rolled_back_by_an_engine_error_signals_only_what_committed(
    heard, settings, together, executions
):
    """Run 2's status UPDATE is refused: the batch (run 1 done, run 2 half done) rolls back
    and is redone without run 2. Run 1's steps ran again, its completion is heard once."""
    settings.KUMIKO_WORKFLOWS = {
        **settings.KUMIKO_WORKFLOWS,
        "BATCH_SIZE": 50,
        "BATCH_TOGETHER": together,
    }
    events = [trigger("s.wait", **{"for": "PT0S"}) for _ in range(3)]
    runs = [run_id_for("s-wait", event.payload["run_key"]) for event in events]
    heard.clear()

    from tests.integration.test_batches import _fail_run_status_update_of

    with connection.execute_wrapper(_fail_run_status_update_of(runs[1])):
        report = resume_due_runs(now=events[-1].created_at + _SECOND)

    assert (report.completed, report.errors) == (2, 1), report
    keys = [event.payload["run_key"] for event in events]
    assert EXECUTIONS[keys[0]] == executions
    assert [(name, run) for name, run, _ in heard] == [
        ("completed", runs[0]),
        ("completed", runs[2]),
    ]


def test_suspensions_failures_and_cancellations_are_heard_with_their_arguments(heard):
    retry = trigger("s.retry")
    waiting = trigger("s.event")
    retry_run = run_id_for("s-retry", retry.payload["run_key"])
    event_run = run_id_for("s-event", waiting.payload["run_key"])
    assert cancel_run(event_run, reason="customer asked", by="alice")
    resume_due_runs(now=retry.created_at + timedelta(seconds=11))

    assert [(name, run) for name, run, _ in heard] == [
        ("started", retry_run),
        ("suspended", retry_run),
        ("started", event_run),
        ("suspended", event_run),
        ("cancelled", event_run),
        ("failed", retry_run),
    ]
    by_name = {(name, run): kwargs for name, run, kwargs in heard}
    retried = by_name[("suspended", retry_run)]
    assert (retried["suspension_type"], retried["step"]) == ("retry", "0")
    started_at = {
        run: kwargs["event"].created_at for name, run, kwargs in heard if name == "started"
    }
    assert retried["wake_at"] == started_at[retry_run] + timedelta(seconds=10)
    waited = by_name[("suspended", event_run)]
    assert waited["suspension_type"] == "event"
    assert waited["wake_at"] == started_at[event_run] + timedelta(days=3)
    cancelled = by_name[("cancelled", event_run)]
    assert (cancelled["reason"], cancelled["by"]) == ("customer asked", "alice")


def test_a_receiver_for_one_workflow_hears_only_that_one(heard):
    only_wait = []

    def receiver(sender, **kwargs):
        only_wait.append(kwargs["workflow_name"])

    signals.run_started.connect(receiver, sender=WAIT)
    try:
        trigger("s.wait")
        trigger("s.fail")
    finally:
        signals.run_started.disconnect(receiver, sender=WAIT)
    assert only_wait == ["s-wait"]
    assert _names(heard) == ["started", "suspended", "started", "failed"]


def test_a_run_whose_workflow_is_gone_fails_with_no_sender(heard):
    event = trigger("s.wait", **{"for": "PT0S"})
    run_id = run_id_for("s-wait", event.payload["run_key"])
    with registry.without("s-wait"):
        resume_due_runs(now=event.created_at + _SECOND)
    name, run, failed = heard[-1]
    assert (name, run, failed["sender"]) == ("failed", run_id, None)
    assert failed["reason"] == "workflow_definition_changed"


def test_a_receiver_that_raises_is_logged_and_harms_nothing(heard, caplog):
    def broken(sender, **kwargs):
        raise ValueError("the receiver broke")

    signals.run_started.connect(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="kumiko_workflows.signals"):
            event = trigger("s.wait")
    finally:
        signals.run_started.disconnect(broken)
    run_id = run_id_for("s-wait", event.payload["run_key"])
    assert _names(heard) == ["started", "suspended"], "the other receivers were still called"
    assert types_of(run_id)[-1] == "workflow.step.waiting"
    assert "signal receiver" in caplog.text and "ValueError" in caplog.text


def test_a_rebuild_replays_events_and_sends_nothing(heard):
    trigger("s.wait")
    trigger("s.fail")
    heard.clear()
    call_command("rebuild_workflow_projections", stdout=io.StringIO(), verbosity=0)
    assert heard == []


def test_nothing_is_registered_on_commit_when_nobody_listens():
    """No receiver: the transition costs no on_commit callback at all."""
    with registry.override(WAIT), transaction.atomic():
        trigger("s.wait")
        assert connection.run_on_commit == [] or all(
            "announce" not in repr(func) and "_send" not in repr(func)
            for _, func, _ in connection.run_on_commit
        )
