"""The reference's resume-loop scenarios, through the public API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from kumiko_workflows import event_types as et
from kumiko_workflows import resume_due_runs, run_id_for
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from tests.support import run_events, trigger, types_of

pytestmark = pytest.mark.django_db


def test_due_wait_resumes_to_completion_and_pending_row_goes(past):
    event = trigger("t.wait", **{"for": past})
    run_id = run_id_for("t-wait", event.payload["run_key"], "default")
    assert WorkflowRunPending.objects.filter(run_id=run_id, step="1").exists()

    report = resume_due_runs()

    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_COMPLETED]
    # The completion keeps the run's final step results.
    assert run_events(run_id)[3].payload == {
        "workflow_name": "t-wait",
        "workflow_version": 1,
        "step_count": 3,
        "state": {
            "results": {
                "before": {"step": "before", "seen": []},
                "after": {"step": "after", "seen": ["before"]},
            },
            "awaited": {},
        },
    }
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


def _pending(run_id):
    return WorkflowRunPending.objects.get(run_id=run_id)


def _tamper(run_id, **fields):
    """Change a pending row behind the projection's back (as a bad deploy or a DBA might)."""
    WorkflowRunPending.objects.filter(run_id=run_id).update(**fields)


def test_changed_definition_fails_loudly_before_any_claim(past):
    event = trigger("t.wait", **{"for": past})
    run_id = run_id_for("t-wait", event.payload["run_key"])
    _tamper(run_id, definition_fingerprint="tampered-fingerprint")

    report = resume_due_runs()

    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.RUN_FAILED]
    failed = run_events(run_id)[2].payload
    assert failed["reason"] == "workflow_definition_changed"
    assert failed["step"] == "1"
    assert (report.failed, report.resumed) == (1, 0)
    assert not WorkflowRunPending.objects.filter(run_id=run_id).exists()


def test_changed_definition_names_the_changed_step(past):
    from kumiko_workflows import define_workflow, on_event, steps
    from kumiko_workflows.workflow.registry import registry
    from tests.testapp import workflows as w

    event = trigger("t.wait", **{"for": past})
    run_id = run_id_for("t-wait", event.payload["run_key"])
    changed = define_workflow(
        name="t-wait",
        trigger=on_event("t.wait"),
        idempotency_key=w.run_key,
        # A step the run has run (an edit after the wait keeps it:
        # tests/integration/test_deploys.py).
        steps=[
            steps.compute("before", w.record("renamed")),
            steps.wait(w.payload_value("for", "PT1H")),
            steps.compute("after", w.record("after")),
        ],
        register=False,
    )
    with registry.override(changed):
        resume_due_runs()

    failed = WorkflowRun.objects.get(run_id=run_id)
    assert failed.failure_reason == "workflow_definition_changed"
    assert "step 0 (compute 'before') (before step 1, where the run waits) changed" in (
        failed.last_error
    )
    assert "step 0" in run_events(run_id)[-1].payload["error"]


def test_unregistered_workflow_fails_the_same_way(past):
    from kumiko_workflows.workflow.registry import registry

    event = trigger("t.wait", **{"for": past})
    run_id = run_id_for("t-wait", event.payload["run_key"])
    with registry.without("t-wait"):
        resume_due_runs()

    failed = run_events(run_id)[-1]
    assert failed.type == et.RUN_FAILED
    assert failed.payload["reason"] == "workflow_definition_changed"
    assert "not registered" in WorkflowRun.objects.get(run_id=run_id).last_error


def test_retry_resumes_the_same_step_with_the_attempt_threaded(now):
    event = trigger("t.retry", fail_attempts=1)
    run_id = run_id_for("t-retry", event.payload["run_key"])
    assert types_of(run_id) == [et.RUN_STARTED, et.RETRY_SCHEDULED]
    scheduled = run_events(run_id)[1].payload
    assert (scheduled["step"], scheduled["attempt"], scheduled["max_attempts"]) == ("0", 1, 3)

    assert resume_due_runs(now=now + timedelta(seconds=9)).resumed == 0  # linear: 10 s × 1
    resume_due_runs(now=now + timedelta(seconds=11))

    assert types_of(run_id) == [
        et.RUN_STARTED,
        et.RETRY_SCHEDULED,
        et.RESUMED,
        et.RUN_COMPLETED,
    ]
    assert WorkflowRun.objects.get(run_id=run_id).status == "completed"


def test_retry_exhausted_fails_the_run_and_keeps_no_body_writes(now):
    from kumiko_workflows.models import Event

    event = trigger("t.retry", fail_attempts=5)
    run_id = run_id_for("t-retry", event.payload["run_key"])
    resume_due_runs(now=now + timedelta(seconds=11))  # attempt 2, next in 20 s
    resume_due_runs(now=now + timedelta(seconds=60))  # attempt 3 of 3

    assert types_of(run_id) == [
        et.RUN_STARTED,
        et.RETRY_SCHEDULED,
        et.RESUMED,
        et.RETRY_SCHEDULED,
        et.RESUMED,
        et.RUN_FAILED,
    ]
    assert [e.payload["attempt"] for e in run_events(run_id) if e.type == et.RETRY_SCHEDULED] == [
        1,
        2,
    ]
    failed = run_events(run_id)[-1].payload
    assert failed["reason"] == "step_failed" and failed["error_class"] == "FlakyError"
    assert not Event.objects.filter(type="t.gate-passed").exists()


def test_give_up_on_fails_at_once():
    event = trigger("t.give-up")
    run_id = run_id_for("t-give-up", event.payload["run_key"])
    assert types_of(run_id) == [et.RUN_STARTED, et.RUN_FAILED]
    assert "gave up on FatalError" in run_events(run_id)[-1].payload["error"]


def _verification(user_id, tenant_id="default", timeout="P7D"):
    event = trigger("t.signed-up", tenant_id=tenant_id, user_id=user_id, timeout=timeout)
    return run_id_for("t-event", event.payload["run_key"], tenant_id)


def _verify(user_id, tenant_id="default", **extra):
    import uuid

    from kumiko_workflows import append_event

    return append_event(
        uuid.uuid4(), "user", "t.verified", {"user_id": user_id, **extra}, tenant_id=tenant_id
    )


def test_matching_awaited_event_wakes_the_run_with_its_payload():
    run_id = _verification("u1")
    assert _pending(run_id).wake_at is not None and not resume_due_runs().resumed

    verified = _verify("u1", note="first")
    _verify("u1", note="second")  # the first match wins
    row = _pending(run_id)
    assert row.awaited_event_id == verified.id

    resume_due_runs()

    events = run_events(run_id)
    assert [e.type for e in events] == [
        et.RUN_STARTED,
        et.WAITING_FOR_EVENT,
        et.WAKE_REQUESTED,  # written by the wake-up: the run's stream says what woke it
        et.RESUMED,
        et.RUN_COMPLETED,
    ]
    from kumiko_workflows.models import Event

    recorded = Event.objects.get(type="t.recorded", payload__step="after")
    assert recorded.payload["steps"]["verified"] == {"user_id": "u1", "note": "first"}
    assert events[2].payload["awaited_event_id"] == verified.id
    assert events[3].payload["awaited_event_id"] == verified.id
    after = WorkflowRun.objects.get(run_id=run_id)
    assert after.status == "completed"
    # Invariant 7: the awaited payload is referenced, never copied into run events.
    assert all("first" not in str(e.payload) for e in events)


def test_non_matching_event_leaves_the_run_waiting():
    run_id = _verification("u1")
    _verify("someone-else")
    assert _pending(run_id).awaited_event_id is None
    assert resume_due_runs().resumed == 0
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING_FOR_EVENT]


def test_an_event_of_another_tenant_never_wakes_a_run():
    run_a = _verification("u1", tenant_id="tenant-a")
    run_b = _verification("u1", tenant_id="tenant-b")
    assert run_a != run_b

    _verify("u1", tenant_id="tenant-b")

    assert _pending(run_a).awaited_event_id is None
    assert _pending(run_b).awaited_event_id is not None
    report = resume_due_runs()
    assert report.completed == 1
    assert types_of(run_a) == [et.RUN_STARTED, et.WAITING_FOR_EVENT]
    assert resume_due_runs(tenant_id="tenant-a").resumed == 0


def test_timeout_resumes_with_none(now):
    from kumiko_workflows.models import Event

    run_id = _verification("u1", timeout="PT1H")
    resume_due_runs(now=now + timedelta(hours=2))

    assert types_of(run_id)[-1] == et.RUN_COMPLETED
    recorded = Event.objects.get(type="t.recorded", payload__step="after")
    assert recorded.payload["steps"] == {"verified": None}


def test_cancel_run_settles_a_waiting_run_and_removes_its_pending_row(future):
    from kumiko_workflows import cancel_run

    event = trigger("t.wait", **{"for": future})
    run_id = run_id_for("t-wait", event.payload["run_key"])

    assert cancel_run(run_id, reason="customer asked", by="support@example.com") is True

    assert types_of(run_id)[-1] == et.RUN_CANCELLED
    assert run_events(run_id)[-1].payload["reason"] == "customer asked"
    assert not WorkflowRunPending.objects.filter(run_id=run_id).exists()
    assert WorkflowRun.objects.get(run_id=run_id).status == "cancelled"
    assert cancel_run(run_id, reason="again") is False


def test_wake_run_makes_a_waiting_run_due_now(future):
    from kumiko_workflows import wake_run

    event = trigger("t.wait", **{"for": future})
    run_id = run_id_for("t-wait", event.payload["run_key"])
    assert resume_due_runs().resumed == 0

    assert wake_run(run_id, by="ops") is True
    assert resume_due_runs().completed == 1
    assert types_of(run_id) == [
        et.RUN_STARTED,
        et.WAITING,
        et.WAKE_REQUESTED,
        et.RESUMED,
        et.RUN_COMPLETED,
    ]
    assert wake_run(run_id) is False


@pytest.mark.parametrize("operation", ["cancel", "wake", "rerun"])
def test_operations_on_an_unknown_run_id_say_so(operation):
    import uuid

    from kumiko_workflows import cancel_run, rerun_run, wake_run
    from kumiko_workflows.exceptions import RunNotFound

    call = {
        "cancel": lambda rid: cancel_run(rid, reason="x"),
        "wake": wake_run,
        "rerun": rerun_run,
    }[operation]
    missing = uuid.uuid4()
    with pytest.raises(RunNotFound, match=str(missing)):
        call(missing)
    with pytest.raises(RunNotFound, match="not a run id"):
        call("not-a-uuid")


def _delete_event(event_id):
    """Remove an event with raw SQL, as a retention job or an erasure request would."""
    from django.db import connection

    from kumiko_workflows.models import Event

    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {Event._meta.db_table} WHERE id = %s", [event_id])  # noqa: S608


def test_trigger_event_gone_fails_the_run(past):
    event = trigger("t.wait", **{"for": past})
    run_id = run_id_for("t-wait", event.payload["run_key"])
    _delete_event(event.id)

    resume_due_runs()

    assert types_of(run_id)[-2:] == [et.RESUMED, et.RUN_FAILED]
    assert run_events(run_id)[-1].payload["reason"] == "trigger_event_unavailable"


def test_awaited_event_gone_fails_the_run():
    run_id = _verification("u1")
    verified = _verify("u1")
    _delete_event(verified.id)

    resume_due_runs()

    assert run_events(run_id)[-1].payload["reason"] == "awaited_event_unavailable"


def test_a_rerun_after_its_awaited_event_was_erased_waits_again_until_its_deadline():
    from kumiko_workflows import rerun_run
    from kumiko_workflows.operations.rebuild import check

    run_id = _verification("u1", timeout="P3D")
    deadline = _pending(run_id).timeout_at
    _delete_event(_verify("u1").id)
    resume_due_runs()
    assert run_events(run_id)[-1].payload["reason"] == "awaited_event_unavailable"

    assert rerun_run(run_id)
    row = _pending(run_id)
    # The wait as it was before the erased event woke it: not due, same deadline.
    assert (row.awaited_event_id, row.wake_at, row.timeout_at) == (None, deadline, deadline)
    assert not resume_due_runs().resumed
    verified = _verify("u1", note="again")  # its keys still find it
    assert _pending(run_id).awaited_event_id == verified.id
    resume_due_runs()
    assert WorkflowRun.objects.get(run_id=run_id).status == "completed"
    assert run_events(run_id)[-1].payload["state"]["awaited"] == {"verified": verified.id}
    assert check().differences == []


def test_rerun_run_reruns_a_failed_run_from_where_its_attempt_began(now):
    from kumiko_workflows import rerun_run
    from kumiko_workflows.exceptions import RunNotRerunnable

    event = trigger("t.retry", fail_attempts=1)
    run_id = run_id_for("t-retry", event.payload["run_key"])
    _tamper(run_id, definition_fingerprint="x")  # make the resume fail
    resume_due_runs(now=now + timedelta(seconds=11))
    assert WorkflowRun.objects.get(run_id=run_id).status == "failed"
    with pytest.raises(RunNotRerunnable, match="changed"):
        # The run's own fingerprint is fine: only the pending row was tampered.
        # So make the registry differ to see the refusal first.
        from kumiko_workflows.workflow.registry import registry

        with registry.without("t-retry"):
            rerun_run(run_id)

    assert rerun_run(run_id, by="ops") is True
    assert WorkflowRun.objects.get(run_id=run_id).status == "waiting"
    row = _pending(run_id)
    assert (row.suspension_type, row.retry_attempt) == ("retry", 1)  # the backoff, as it was
    resume_due_runs(now=now + timedelta(seconds=12))
    # It failed resuming its backoff, so the rerun resumed that: attempt 2 passes,
    # not attempt 1 of a fresh retry.
    assert types_of(run_id)[-3:] == [et.RERUN_REQUESTED, et.RESUMED, et.RUN_COMPLETED]
    passed = Event.objects.get(aggregate_id=event.aggregate_id, type="t.gate-passed")
    assert passed.payload == {"attempt": 2}
    with pytest.raises(RunNotRerunnable, match="completed"):
        rerun_run(run_id)


def test_tampered_pending_row_with_unknown_step_fails_the_run(past):
    event = trigger("t.wait", **{"for": past})
    run_id = run_id_for("t-wait", event.payload["run_key"])
    _tamper(run_id, step="7.then.3")

    resume_due_runs()

    assert run_events(run_id)[-1].payload["reason"] == "invalid_pending_row"
    assert not WorkflowRunPending.objects.filter(run_id=run_id).exists()


def _ping_twice():
    from kumiko_workflows import define_workflow, on_event, steps
    from tests.testapp import workflows as w

    return define_workflow(
        name="t-two-pings",
        trigger=on_event("t.two-pings"),
        idempotency_key=w.run_key,
        awaits={"first": "t.ping", "second": "t.ping"},
        steps=[
            steps.wait_for_event("first", timeout="P1D"),
            steps.wait_for_event("second", timeout="P1D"),
            steps.compute("after", w.record("after")),
        ],
        register=False,
    )


def _ping(**payload):
    import uuid

    from kumiko_workflows import append_event

    return append_event(uuid.uuid4(), "pinger", "t.ping", payload)


def test_a_second_wait_for_the_same_type_needs_a_new_event():
    from kumiko_workflows.models import Event
    from kumiko_workflows.workflow.registry import registry

    workflow = _ping_twice()
    with registry.override(workflow):
        event = trigger("t.two-pings")
        run_id = run_id_for("t-two-pings", event.payload["run_key"])
        first = _ping(n=1)
        resume_due_runs()
        # The first ping was taken by the first wait: the second still waits.
        assert types_of(run_id)[-1] == et.WAITING_FOR_EVENT
        assert _pending(run_id).step == "1"

        second = _ping(n=2)
        resume_due_runs()

    assert types_of(run_id)[-1] == et.RUN_COMPLETED
    steps_seen = Event.objects.get(type="t.recorded", payload__step="after").payload["steps"]
    assert (steps_seen["first"], steps_seen["second"]) == ({"n": 1}, {"n": 2})
    assert first.id < second.id


def test_an_event_after_the_timeout_does_not_count_however_late_the_worker(now):
    import uuid

    from kumiko_workflows import append_event
    from kumiko_workflows.models import Event

    run_id = _verification("u-late", timeout="PT1H")
    append_event(
        uuid.uuid4(),
        "user",
        "t.verified",
        {"user_id": "u-late"},
        created_at=now + timedelta(hours=2),
    )
    assert _pending(run_id).awaited_event_id is None  # the wake-up saw it was too late

    resume_due_runs(now=now + timedelta(hours=3))  # a worker that was down for hours

    recorded = Event.objects.get(type="t.recorded", payload__step="after")
    assert recorded.payload["steps"] == {"verified": None}


def test_nobody_but_the_engine_appends_to_a_run_stream(future):
    import uuid

    from kumiko_workflows import append_event
    from kumiko_workflows.exceptions import InvalidEvent

    event = trigger("t.wait", **{"for": future})
    run_id = run_id_for("t-wait", event.payload["run_key"])
    with pytest.raises(InvalidEvent, match="'workflow-run' is reserved"):
        append_event(run_id, et.RUN_AGGREGATE_TYPE, "custom.note", {})
    with pytest.raises(InvalidEvent, match="'workflow-schedule' is reserved"):
        append_event(uuid.uuid4(), et.SCHEDULE_AGGREGATE_TYPE, "custom.note", {})
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]


def test_a_resume_never_loads_another_tenants_event():
    run_id = _verification("u1", tenant_id="tenant-a")
    elsewhere = _verify("u1", tenant_id="tenant-b")
    _tamper(run_id, awaited_event_id=elsewhere.id, wake_at=timezone.now())

    resume_due_runs()

    assert run_events(run_id)[-1].payload["reason"] == "awaited_event_unavailable"


def test_the_tables_rebuild_from_the_run_streams_alone_whatever_is_registered():
    """Invariant 1 does not depend on today's definitions: a removed workflow rebuilds too."""
    from kumiko_workflows.operations.rebuild import check
    from kumiko_workflows.workflow.registry import registry

    _verification("u1")
    woken = _verification("u2")
    _verify("u2")  # wakes the second run
    assert _pending(woken).awaited_event_id is not None

    with registry.without("t-event"):
        result = check()

    assert result.differences == []
    assert result.pending == 2


def test_a_failing_run_in_a_batch_leaves_the_others_resumed_exactly_once(past):
    """Each run has its own savepoint: the failure is recorded alone, the others commit."""
    from kumiko_workflows import define_workflow, on_event, steps
    from kumiko_workflows.models import Event
    from kumiko_workflows.workflow.registry import registry
    from tests.testapp import workflows as w

    fails_after_wait = define_workflow(
        name="t-fails-after-wait",
        trigger=on_event("t.fails-after-wait"),
        idempotency_key=w.run_key,
        steps=[steps.wait(w.payload_value("for")), steps.compute("boom", w.boom)],
        register=False,
    )
    with registry.override(fails_after_wait):
        first = trigger("t.wait", **{"for": past})
        failing = trigger("t.fails-after-wait", **{"for": past})
        last = trigger("t.wait", **{"for": past})
        report = resume_due_runs()

    assert (report.resumed, report.completed, report.failed, report.errors) == (3, 2, 1, 0)
    failed_run = run_id_for("t-fails-after-wait", failing.payload["run_key"])
    assert types_of(failed_run) == [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_FAILED]
    assert not Event.objects.filter(type="t.written-before-boom").exists()
    for event in (first, last):
        run_id = run_id_for("t-wait", event.payload["run_key"])
        assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_COMPLETED]
    # The rolled-back first attempt left no trace: one "after" write per run.
    assert Event.objects.filter(type="t.recorded", payload__step="after").count() == 2
    assert not WorkflowRunPending.objects.exists()


class LedgerLocked(Exception):
    pass


def test_a_run_whose_resume_keeps_raising_is_failed_after_max_resume_errors(settings, now):
    """Nothing is retried for ever: the third pass in a row that trips over it fails it."""
    from kumiko_workflows import rerun_run
    from kumiko_workflows.operations.explain import explain
    from kumiko_workflows.operations.rebuild import check
    from kumiko_workflows.store.dispatch import registry as projections

    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "MAX_RESUME_ERRORS": 3}
    stuck = run_id_for("t-wait", trigger("t.wait", **{"for": "PT0S"}).payload["run_key"])

    def explode(event, replaying):
        if event.aggregate_id == stuck:
            raise LedgerLocked("secret-detail: the ledger is locked")

    projections.register("test.explode-on-resume", {et.RESUMED}, explode)
    try:
        for n in (1, 2):
            other = run_id_for("t-wait", trigger("t.wait", **{"for": "PT0S"}).payload["run_key"])
            report = resume_due_runs(now=now + timedelta(minutes=n))
            assert (report.completed, report.failed, report.errors) == (1, 0, 1), report
            assert types_of(other)[-1] == et.RUN_COMPLETED
            assert types_of(stuck) == [et.RUN_STARTED, et.WAITING]
            assert _pending(stuck).resume_errors == n
            facts = dict(explain(WorkflowRun.objects.get(run_id=stuck), now).facts)
            passes = "1 pass" if n == 1 else f"{n} passes"
            assert facts["Failed resumes"].startswith(f"{passes} in a row raised")
            # The count is the worker's, not the events': the tables still
            # match what the events give.
            assert check().differences == []

        report = resume_due_runs(now=now + timedelta(minutes=3))
    finally:
        projections.unregister("test.explode-on-resume")

    assert (report.failed, report.errors) == (1, 0), report
    assert types_of(stuck) == [et.RUN_STARTED, et.WAITING, et.RUN_FAILED]
    failed = run_events(stuck)[-1].payload
    assert (failed["reason"], failed["step"], failed["error_class"]) == (
        "resume_failed_repeatedly",
        "1",
        "LedgerLocked",
    )
    assert "secret-detail" not in failed["error"]
    run = WorkflowRun.objects.get(run_id=stuck)
    assert (run.status, run.failure_reason) == ("failed", "resume_failed_repeatedly")
    assert "secret-detail: the ledger is locked" in run.last_error
    assert not WorkflowRunPending.objects.filter(run_id=stuck).exists()
    assert resume_due_runs(now=now + timedelta(minutes=4)).processed == 0

    # Once the cause is gone, the run is rerun from its suspension: its wait
    # was over, so one pass runs the rest (the wait step does not run again).
    assert rerun_run(stuck, by="ops") is True
    assert _pending(stuck).resume_errors == 0
    assert resume_due_runs(now=now + timedelta(minutes=5)).completed == 1
    assert types_of(stuck)[-3:] == [et.RERUN_REQUESTED, et.RESUMED, et.RUN_COMPLETED]
    assert check().differences == []


def test_a_rerun_after_failed_resumes_keeps_the_event_waits_deadline_and_match(settings, now):
    """The issue's payment window: a timed-out wait rerun must not wait its timeout again."""
    from kumiko_workflows import rerun_run
    from kumiko_workflows.operations.rebuild import check
    from kumiko_workflows.store.dispatch import registry as projections

    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "MAX_RESUME_ERRORS": 1}
    unpaid, paid = _verification("u1", timeout="PT1H"), _verification("u2", timeout="PT1H")
    waits = {run_id: _pending(run_id) for run_id in (unpaid, paid)}

    def explode(event, replaying):
        raise LedgerLocked("the ledger is locked")

    later = now + timedelta(hours=2)  # both timed out
    projections.register("test.explode-on-resume", {et.RESUMED}, explode)
    try:
        assert resume_due_runs(now=later).failed == 2
    finally:
        projections.unregister("test.explode-on-resume")
    # While they are failed, u2's event arrives (in time: before its deadline).
    verified = _verify("u2")

    assert rerun_run(unpaid) and rerun_run(paid)
    for run_id, wait in waits.items():
        row = _pending(run_id)
        assert (row.suspension_type, row.step) == ("event", "0")
        assert (row.timeout_at, row.match_expr) == (wait.timeout_at, wait.match_expr)
    assert _pending(paid).awaited_event_id == verified.id  # found by the look-back
    assert resume_due_runs(now=later).completed == 2  # at once: no second hour of waiting

    def seen(run_id):
        return run_events(run_id)[-1].payload["state"]["awaited"]["verified"]

    assert (seen(unpaid), seen(paid)) == (None, verified.id)
    assert check().differences == []
