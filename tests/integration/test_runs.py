"""Runs through the public API: suspension events, branches, idempotency, failures."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import transaction
from django.utils.dateparse import parse_datetime

from kumiko_workflows import (
    append_event,
    define_workflow,
    on_event,
    resume_due_runs,
    run_id_for,
    steps,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.workflow.registry import registry
from tests.support import run_events, trigger, types_of
from tests.testapp.workflows import payload_value, run_key

pytestmark = pytest.mark.django_db


class AlwaysFails(Exception):
    pass


def always_fails(ctx):
    raise AlwaysFails("secret-detail: still down")


def before(ctx):
    return {"n": 1, "from": ctx.event.payload["run_key"]}


def saw(ctx):
    """Record what the step sees, as a domain event the test can read."""
    ctx.append_event(
        ctx.event.aggregate_id, ctx.event.aggregate_type, "r.saw", {"steps": ctx.steps}
    )
    return None


def emit_done(ctx):
    ctx.append_event(uuid.uuid4(), "test", "r.done", {"key": ctx.event.payload["run_key"]})
    return None


def key_match(ctx):
    return {
        "version": 1,
        "expr": {
            "kind": "atom",
            "path": ["key"],
            "op": {"kind": "eq", "value": ctx.event.payload["run_key"]},
        },
    }


def junk(ctx):
    return {"ok": [1, {2, 3}]}


def filter_event(event):
    if event.payload.get("explode"):
        raise ValueError("secret-detail: filter broke")
    return event.payload.get("go", True)


def workflow(name, step_list, filter=None, **kwargs):
    """A test workflow ``r-x`` triggered by ``r.x``, keyed by the payload's run_key."""
    trigger = on_event(name.replace("-", ".", 1), filter=filter)
    return define_workflow(name, trigger, step_list, run_key, register=False, **kwargs)


WORKFLOWS = [
    workflow(
        "r-backoff",
        step_list=[
            steps.retry(
                times=5,
                backoff=payload_value("backoff", "exponential"),
                base_delay=payload_value("base", "PT10S"),
                max_delay=payload_value("cap"),
                do=[steps.compute("flaky", always_fails)],
            )
        ],
    ),
    workflow(
        "r-carry",
        awaits={"ping": "r.ping"},
        step_list=[
            steps.compute("before", before),
            steps.wait(payload_value("for", "PT0S")),
            steps.wait_for_event("ping", match=key_match, timeout="P1D"),
            steps.compute("after", saw),
        ],
    ),
    workflow(
        "r-args",
        awaits={"thing": "r.thing"},
        step_list=[
            steps.wait_for_event(
                "thing", match=payload_value("match"), timeout=payload_value("timeout")
            )
        ],
    ),
    workflow(
        "r-junk",
        step_list=[steps.compute("fine", before), steps.compute("junk", junk)],
    ),
    workflow(
        "r-filter",
        filter=filter_event,
        step_list=[steps.compute("ran", before)],
    ),
    workflow(
        "r-lookback",
        awaits={"done": "r.done"},
        step_list=[
            steps.compute("emit", emit_done),
            steps.wait_for_event("done", match=key_match, timeout="PT1H"),
            steps.compute("after", saw),
        ],
    ),
    workflow(
        "r-await",
        awaits={"done": "r.done"},
        step_list=[
            steps.wait(payload_value("for", "PT0S")),
            steps.wait_for_event("done", match=key_match, timeout="PT1H"),
            steps.compute("after", saw),
        ],
    ),
]


@pytest.fixture(autouse=True)
def run_workflows():
    with registry.override(*WORKFLOWS):
        yield


def start(type, tenant_id="default", **payload):
    event = trigger(type, tenant_id=tenant_id, **payload)
    name = next(w.name for w in registry.triggered_by(type))
    return event, run_id_for(name, event.payload["run_key"], tenant_id)


def instant(text):
    return parse_datetime(text)


# --- suspension events ---------------------------------------------------------


def test_wait_suspends_with_step_wake_at_fingerprint_and_results(future):
    event, run_id = start("t.wait", **{"for": future})
    workflow = registry.get("t-wait")

    events = run_events(run_id)
    assert [e.type for e in events] == [et.RUN_STARTED, et.WAITING]
    started, waiting = events
    assert started.payload == {
        "workflow_name": "t-wait",
        "workflow_version": 1,
        "definition_fingerprint": workflow.fingerprint,
        "step_fingerprints": workflow.step_fingerprints,
        "idempotency_key": event.payload["run_key"],
        "trigger_event_id": event.id,
    }
    assert waiting.payload == {
        "step": "1",
        "wake_at": instant(future).isoformat(),
        "workflow_name": "t-wait",
        "workflow_version": 1,
        "definition_fingerprint": workflow.fingerprint,
        "trigger_event_id": event.id,
        "state": {
            "results": {"before": {"step": "before", "seen": []}},
            "awaited": {},
        },
    }
    assert (started.tenant_id, started.aggregate_type) == ("default", "workflow-run")
    run = WorkflowRun.objects.get(run_id=run_id)
    assert (run.status, run.step, run.wake_at) == ("waiting", "1", instant(future))
    assert run.workflow_version == 1


def test_wait_for_event_suspends_with_awaits_key_type_match_and_timeout(future):
    event, run_id = start("t.signed-up", user_id="u-1", timeout=future)

    waiting = run_events(run_id)[-1]
    assert waiting.type == et.WAITING_FOR_EVENT
    assert waiting.payload["step"] == "0"
    assert waiting.payload["awaits_key"] == "verified"
    assert waiting.payload["event_type"] == "t.verified"
    assert waiting.payload["match"] == {
        "version": 1,
        "expr": {"kind": "atom", "path": ["user_id"], "op": {"kind": "eq", "value": "u-1"}},
    }
    assert waiting.payload["timeout_at"] == instant(future).isoformat()
    assert waiting.payload["definition_fingerprint"] == registry.get("t-event").fingerprint
    pending = WorkflowRunPending.objects.get(run_id=run_id)
    assert (pending.wait_event_type, pending.awaits_key, pending.timeout_at) == (
        "t.verified",
        "verified",
        instant(future),
    )


def test_retry_scheduled_carries_attempt_backoff_and_error_class_only(now):
    event, run_id = start("t.retry", fail_attempts=2)

    started, scheduled = run_events(run_id)
    assert scheduled.type == et.RETRY_SCHEDULED
    payload = scheduled.payload
    assert (payload["step"], payload["attempt"], payload["max_attempts"]) == ("0", 1, 3)
    assert (payload["error_class"], payload["failed_step"]) == ("FlakyError", "0.do.0")
    wake_at = instant(payload["wake_at"])
    # The inline start's clock reading lies between these two appends.
    assert started.created_at + timedelta(seconds=10) <= wake_at
    assert wake_at <= scheduled.created_at + timedelta(seconds=10)
    # The gate's write in the failed attempt was rolled back.
    assert not Event.objects.filter(type="t.gate-passed", aggregate_id=event.aggregate_id).exists()

    later = wake_at + timedelta(seconds=1)
    assert resume_due_runs(now=later).suspended == 1
    second = run_events(run_id)[-1]
    assert second.payload["attempt"] == 2
    assert instant(second.payload["wake_at"]) == later + timedelta(seconds=20)  # linear: 10 s × 2

    assert resume_due_runs(now=later + timedelta(seconds=20)).completed == 1
    assert types_of(run_id)[-1] == et.RUN_COMPLETED
    passed = Event.objects.get(type="t.gate-passed", aggregate_id=event.aggregate_id)
    assert passed.payload == {"attempt": 3}


@pytest.mark.parametrize(
    "backoff, cap, delays",
    [
        ("exponential", None, [20, 40, 80]),
        ("exponential", "PT30S", [20, 30, 30]),
        ("linear", None, [20, 30, 40]),
        ("linear", "PT25S", [20, 25, 25]),
    ],
)
def test_retry_backoff_is_exact_and_capped(now, backoff, cap, delays):
    _, run_id = start("r.backoff", backoff=backoff, base="PT10S", cap=cap)
    clock = now + timedelta(minutes=1)

    for attempt, delay in enumerate(delays, start=2):
        assert resume_due_runs(now=clock).suspended == 1
        scheduled = run_events(run_id)[-1]
        assert scheduled.type == et.RETRY_SCHEDULED
        assert (scheduled.payload["attempt"], scheduled.payload["max_attempts"]) == (attempt, 5)
        assert instant(scheduled.payload["wake_at"]) == clock + timedelta(seconds=delay)
        assert scheduled.payload["error_class"] == "AlwaysFails"
        clock += timedelta(seconds=delay)

    assert resume_due_runs(now=clock).failed == 1
    failed = run_events(run_id)[-1]
    assert failed.type == et.RUN_FAILED
    assert failed.payload["error"] == "step 0 (retry): attempt 5 of 5 failed with AlwaysFails"
    assert "secret-detail" in WorkflowRun.objects.get(run_id=run_id).last_error


# --- branches and results across suspension --------------------------------------


def test_a_wait_inside_a_branch_resumes_in_the_branch_then_after_it(past):
    event, run_id = start("t.branch", **{"for": past})

    waiting = run_events(run_id)[-1]
    assert (waiting.type, waiting.payload["step"]) == (et.WAITING, "1.then.1")
    assert sorted(waiting.payload["state"]["results"]) == ["first", "then_before"]
    assert WorkflowRunPending.objects.get(run_id=run_id).step == "1.then.1"

    assert resume_due_runs().completed == 1

    recorded = Event.objects.filter(type="t.recorded", aggregate_id=event.aggregate_id)
    assert [e.payload["step"] for e in recorded.order_by("id")] == [
        "first",
        "then_before",
        "then_after",
        "last",
    ]
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_COMPLETED]


def test_the_else_arm_runs_without_suspending():
    event, run_id = start("t.branch", go_then=False)

    assert types_of(run_id) == [et.RUN_STARTED, et.RUN_COMPLETED]
    recorded = Event.objects.filter(type="t.recorded", aggregate_id=event.aggregate_id)
    assert [e.payload["step"] for e in recorded.order_by("id")] == ["first", "else_only", "last"]


def test_results_and_awaited_payloads_survive_two_suspensions(past):
    event, run_id = start("r.carry", **{"for": past})
    key = event.payload["run_key"]

    assert resume_due_runs().suspended == 1  # the wait, then wait_for_event
    waiting = run_events(run_id)[-1]
    assert waiting.type == et.WAITING_FOR_EVENT
    ping = append_event(uuid.uuid4(), "test", "r.ping", {"key": key, "note": "pong-body"})
    assert resume_due_runs().completed == 1

    seen = Event.objects.get(type="r.saw", aggregate_id=event.aggregate_id)
    assert seen.payload == {
        "steps": {"before": {"n": 1, "from": key}, "ping": {"key": key, "note": "pong-body"}}
    }
    resumed = [e for e in run_events(run_id) if e.type == et.RESUMED][-1]
    assert resumed.payload["awaited_event_id"] == ping.id
    # Run events reference the awaited event by id, never copy its payload.
    assert not any("pong-body" in json.dumps(e.payload) for e in run_events(run_id))


# --- idempotency and tenants ------------------------------------------------------


def test_same_key_in_one_tenant_starts_one_run(future, caplog):
    first = trigger("t.wait", run_key="order-1", **{"for": future})
    run_id = run_id_for("t-wait", "order-1", "default")

    with caplog.at_level(logging.INFO, logger="kumiko_workflows.engine.starts"):
        second = trigger("t.wait", run_key="order-1", **{"for": future})

    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]
    assert run_events(run_id)[0].payload["trigger_event_id"] == first.id
    assert Event.objects.filter(pk=second.pk).exists()
    assert (
        WorkflowRun.objects.filter(workflow_name="t-wait", idempotency_key="order-1").count() == 1
    )
    assert any(
        "exists already" in r.getMessage() and str(second.id) in r.getMessage()
        for r in caplog.records
    )


def test_same_key_in_two_tenants_starts_two_runs(future):
    trigger("t.wait", run_key="order-1", **{"for": future})
    trigger("t.wait", tenant_id="acme", run_key="order-1", **{"for": future})
    ours, theirs = (
        run_id_for("t-wait", "order-1", "default"),
        run_id_for("t-wait", "order-1", "acme"),
    )

    assert ours != theirs
    assert types_of(ours) == types_of(theirs) == [et.RUN_STARTED, et.WAITING]
    assert {e.tenant_id for e in run_events(theirs)} == {"acme"}
    assert WorkflowRun.objects.get(run_id=theirs).tenant_id == "acme"


# --- failures ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_failing_step_fails_the_run_but_the_domain_write_commits(caplog):
    with caplog.at_level(logging.ERROR, logger="kumiko_workflows"), transaction.atomic():
        event = trigger("t.fail")
        run_id = run_id_for("t-fail", event.payload["run_key"], "default")
    # The atomic block committed: the trigger event is really stored.
    assert Event.objects.filter(pk=event.pk).exists()

    assert types_of(run_id) == [et.RUN_STARTED, et.RUN_FAILED]
    failed = run_events(run_id)[-1].payload
    assert failed["reason"] == "step_failed"
    assert failed["error_class"] == "RuntimeError"
    assert failed["error"] == "step 0 (compute 'boom'): raised RuntimeError"
    assert failed["step"] == "0"
    # The step's own write was rolled back with it.
    assert not Event.objects.filter(type="t.written-before-boom").exists()
    # No event anywhere carries the raw error text; the mutable row and the log do.
    for stored in Event.objects.all():
        assert "secret-detail" not in json.dumps([stored.payload, stored.metadata])
    run = WorkflowRun.objects.get(run_id=run_id)
    assert (run.status, run.failure_reason, run.error_class) == (
        "failed",
        "step_failed",
        "RuntimeError",
    )
    assert "secret-detail: database password is hunter2" in run.last_error
    logged = [r for r in caplog.records if r.exc_info]
    assert any("hunter2" in str(r.exc_info[1]) for r in logged)


@pytest.mark.parametrize("value", ["-PT5S", "soon", "P1M", "2026-01-01T00:00:00"])
def test_a_wait_callable_returning_a_bad_value_fails_the_run(value):
    event, run_id = start("t.wait", **{"for": value})

    assert types_of(run_id) == [et.RUN_STARTED, et.RUN_FAILED]
    failed = run_events(run_id)[-1].payload
    assert (failed["reason"], failed["step"]) == ("invalid_step_argument", "1")
    assert failed["error"] == "step 1 (wait): invalid argument"
    last_error = WorkflowRun.objects.get(run_id=run_id).last_error
    assert last_error.startswith(f"step 1 (wait): for_={value!r}: ")
    # The compute before the wait wrote a domain event; it was rolled back.
    assert not Event.objects.filter(type="t.recorded", aggregate_id=event.aggregate_id).exists()
    assert Event.objects.filter(pk=event.pk).exists()


@pytest.mark.parametrize(
    "payload, detail",
    [
        (
            {"match": {"version": 1, "expr": {"kind": "nope"}}},
            "match expression ['expr']['kind']: must be 'and', 'or' or 'atom', got 'nope'",
        ),
        ({"match": "anything"}, "match expression: must be a dict"),
        ({"timeout": "soon"}, "timeout='soon': 'soon' is neither an ISO 8601 duration"),
        ({"timeout": "-PT5S"}, "timeout='-PT5S': '-PT5S' is negative"),
    ],
)
def test_wait_for_event_callables_returning_bad_values_fail_the_run(payload, detail):
    _, run_id = start("r.args", **payload)

    failed = run_events(run_id)[-1]
    assert failed.type == et.RUN_FAILED
    assert (failed.payload["reason"], failed.payload["step"]) == ("invalid_step_argument", "0")
    assert detail in WorkflowRun.objects.get(run_id=run_id).last_error


def test_a_result_json_cannot_hold_fails_the_run_naming_the_step():
    _, run_id = start("r.junk")

    failed = run_events(run_id)[-1].payload
    assert failed["reason"] == "invalid_step_result"
    assert failed["step"] == "1"
    assert failed["error"] == "step 1 (compute 'junk'): its result is not JSON-serialisable"
    last_error = WorkflowRun.objects.get(run_id=run_id).last_error
    assert "ctx.steps['junk']['ok'][1] is a set" in last_error


def test_a_false_filter_starts_no_run():
    event, run_id = start("r.filter", go=False)

    assert types_of(run_id) == []
    assert not WorkflowRun.objects.filter(run_id=run_id).exists()
    assert Event.objects.filter(pk=event.pk).exists()
    _, started = start("r.filter", go=True)
    assert types_of(started) == [et.RUN_STARTED, et.RUN_COMPLETED]


def test_a_raising_filter_records_a_failed_run():
    event, run_id = start("r.filter", explode=True)

    assert types_of(run_id) == [et.RUN_STARTED, et.RUN_FAILED]
    failed = run_events(run_id)[-1].payload
    assert (failed["reason"], failed["error_class"]) == ("filter_failed", "ValueError")
    assert "secret-detail" not in json.dumps(failed)
    assert "secret-detail: filter broke" in WorkflowRun.objects.get(run_id=run_id).last_error
    assert Event.objects.filter(pk=event.pk).exists()


# --- look-back ------------------------------------------------------------------------


def test_an_event_appended_after_the_start_resolves_the_wait_at_once():
    event, run_id = start("r.lookback")
    key = event.payload["run_key"]

    assert types_of(run_id) == [et.RUN_STARTED, et.RUN_COMPLETED]
    seen = Event.objects.get(type="r.saw", aggregate_id=event.aggregate_id)
    assert seen.payload == {"steps": {"emit": None, "done": {"key": key}}}


def test_an_event_that_came_while_the_run_slept_resolves_the_wait_at_once(past):
    event, run_id = start("r.await", **{"for": past})
    key = event.payload["run_key"]
    append_event(uuid.uuid4(), "test", "r.done", {"key": "someone-else"})
    first = append_event(uuid.uuid4(), "test", "r.done", {"key": key, "n": 1})
    append_event(uuid.uuid4(), "test", "r.done", {"key": key, "n": 2})

    assert resume_due_runs().completed == 1

    assert et.WAITING_FOR_EVENT not in types_of(run_id)
    seen = Event.objects.get(type="r.saw", aggregate_id=event.aggregate_id)
    assert seen.payload["steps"]["done"] == {"key": key, "n": 1}  # the earliest
    assert first.id < seen.id


def test_look_back_ignores_other_tenants_and_events_before_the_trigger(past):
    key = uuid.uuid4().hex
    append_event(uuid.uuid4(), "test", "r.done", {"key": key})  # before the trigger
    event, run_id = start("r.await", run_key=key, **{"for": past})
    append_event(uuid.uuid4(), "test", "r.done", {"key": key}, tenant_id="acme")

    resume_due_runs()

    assert types_of(run_id)[-1] == et.WAITING_FOR_EVENT
    assert WorkflowRun.objects.get(run_id=run_id).status == "waiting"
    assert resume_due_runs().resumed == 0
    assert not Event.objects.filter(type="r.saw").exists()

    append_event(uuid.uuid4(), "test", "r.done", {"key": key})
    assert resume_due_runs().completed == 1


# --- what a failed retry says, search keys ----------------------------------------------


def test_a_failed_retry_records_the_attempt_its_error_text_names(now):
    event, run_id = start("t.retry", fail_attempts=5)
    for minutes in (10, 20):
        resume_due_runs(now=now + timedelta(minutes=minutes))

    failed = run_events(run_id)[-1]
    assert failed.type == et.RUN_FAILED
    assert failed.payload["error"] == "step 0 (retry): attempt 3 of 3 failed with FlakyError"
    assert (failed.payload["attempt"], failed.payload["max_attempts"]) == (3, 3)
    # The status row said 2 (the last scheduled attempt) before failures named theirs.
    assert WorkflowRun.objects.get(run_id=run_id).retry_attempt == 3


def test_a_failure_outside_a_retry_has_no_attempt():
    event = trigger("t.fail")
    run_id = run_id_for("t-fail", event.payload["run_key"], "default")

    failed = run_events(run_id)[-1].payload
    assert (failed["attempt"], failed["max_attempts"]) == (0, 0)
    assert WorkflowRun.objects.get(run_id=run_id).retry_attempt == 0


def order_number(event):
    return f"order-{event.payload['order']}"


def broken_key(event):
    raise KeyError("secret-detail: no order")


def searchable(key_fn):
    return define_workflow(
        "r-search",
        on_event("r.search"),
        [steps.compute("ran", before)],
        run_key,
        search_key=key_fn,
        register=False,
    )


def test_a_run_keeps_the_search_key_its_workflow_gives_in_its_started_event():
    with registry.override(searchable(order_number)):
        event, run_id = start("r.search", order=1234)

    started = run_events(run_id)[0]
    assert started.payload["search_key"] == "order-1234"
    run = WorkflowRun.objects.get(run_id=run_id)
    assert (run.search_key, run.idempotency_key) == ("order-1234", event.payload["run_key"])


def test_without_search_key_a_run_is_found_by_its_idempotency_key():
    event = trigger("t.fail")
    run_id = run_id_for("t-fail", event.payload["run_key"], "default")

    assert "search_key" not in run_events(run_id)[0].payload
    assert WorkflowRun.objects.get(run_id=run_id).search_key == event.payload["run_key"]


@pytest.mark.parametrize(
    "key_fn, logged",
    [
        (broken_key, "search_key raised"),
        (lambda event: {"order": 1}, "search_key returned dict, not a string"),
        (lambda event: "x" * 201, "search_key returned 201 characters, over 200"),
        (lambda event: "two\nlines", "search_key contains a control character"),
        (lambda event: None, None),
    ],
)
def test_a_search_key_that_cannot_be_kept_leaves_the_run_without_one(key_fn, logged, caplog):
    """A search key only helps people find a run: the run goes on, the log says why."""
    with caplog.at_level(logging.ERROR, logger="kumiko_workflows"):
        with registry.override(searchable(key_fn)):
            event, run_id = start("r.search", order=1)

    run = WorkflowRun.objects.get(run_id=run_id)
    assert (run.status, run.search_key) == ("completed", "")
    assert run_events(run_id)[0].payload["search_key"] == ""
    if logged:
        assert any(logged in record.getMessage() for record in caplog.records)
    assert not any("secret-detail" in json.dumps(e.payload) for e in Event.objects.all())


def test_search_keys_and_attempts_rebuild_from_the_events(now):
    from kumiko_workflows.operations.rebuild import check

    with registry.override(searchable(order_number)):
        start("r.search", order=7)
    start("t.retry", fail_attempts=5)
    for minutes in (10, 20):
        resume_due_runs(now=now + timedelta(minutes=minutes))

    assert check().differences == []


def test_migration_0008_gives_older_runs_their_idempotency_key_as_search_key():
    """What the projection gives a run-started event without search_key, and the same."""
    from importlib import import_module

    from django.apps import apps
    from django.db import connection

    migration = import_module(
        "kumiko_workflows.migrations.0011_run_search_key_and_schedule_actions"
    )
    event = trigger("t.fail")
    run_id = run_id_for("t-fail", event.payload["run_key"], "default")
    WorkflowRun.objects.filter(run_id=run_id).update(search_key="")

    migration.backfill_search_keys(apps, SimpleNamespace(connection=connection))

    assert WorkflowRun.objects.get(run_id=run_id).search_key == event.payload["run_key"]
