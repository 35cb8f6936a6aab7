"""Bad input refused: each case shows the message and that nothing else changed.

Complements tests/test_store.py (bad ``append_event`` arguments, oversized and
non-JSON payloads), tests/test_definitions.py (malformed static match
expressions, durations and awaits keys at definition time, and the property
tests of the matcher and the duration parser) and tests/test_runs.py (bad
callable arguments when a run starts). Here: the resume path, hostile
payloads through a real wake-up, and tampered pending rows.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from kumiko_workflows import append_event, resume_due_runs, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from tests.conftest import run_events, trigger, types_of

pytestmark = pytest.mark.django_db


def _pending_snapshot(run_id) -> dict:
    return WorkflowRunPending.objects.filter(run_id=run_id).values().get()


def _failed(run_id) -> tuple[dict, WorkflowRun]:
    event = run_events(run_id)[-1]
    assert event.type == et.RUN_FAILED, types_of(run_id)
    return event.payload, WorkflowRun.objects.get(run_id=run_id)


# --- hostile payloads through a real append and wake-up ------------------------------


def _nested(levels: int, leaf: object) -> object:
    for _ in range(levels):
        leaf = [leaf]
    return leaf


HOSTILE_PAYLOADS = {
    "deep nesting": {"user_id": _nested(60, "u1")},
    "deep object": {"user_id": json.loads('{"a":' * 60 + '"u1"' + "}" * 60)},
    "huge string": {"user_id": "u1" + "x" * 200_000},
    "many keys": {f"k{i}": i for i in range(5_000)},
    "list": {"user_id": ["u1"]},
    "object": {"user_id": {"u1": True}},
    "number": {"user_id": 1},
    "boolean": {"user_id": True},
    "null": {"user_id": None},
    "missing": {"user": "u1"},
    "unicode look-alike": {"user_id": "u\u0031\u200b"},
}


def test_hostile_payloads_through_a_real_wakeup_neither_match_nor_change_anything():
    event = trigger("t.signed-up", user_id="u1", timeout="P7D")
    run_id = run_id_for("t-event", event.payload["run_key"])
    before = _pending_snapshot(run_id)

    for name, payload in HOSTILE_PAYLOADS.items():
        hostile = append_event(uuid.uuid4(), "user", "t.verified", payload)
        assert Event.objects.filter(pk=hostile.pk).exists(), name  # the write stands
        assert _pending_snapshot(run_id) == before, name
    assert resume_due_runs().resumed == 0
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING_FOR_EVENT]
    assert WorkflowRun.objects.get(run_id=run_id).status == "waiting"

    # The matcher still works after all that: the real event wakes the run.
    real = append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u1"})
    assert _pending_snapshot(run_id)["awaited_event_id"] == real.id
    assert resume_due_runs().completed == 1


# --- bad step arguments when a run resumes -------------------------------------------


RESUME_ARGUMENTS = {
    "match with an empty path": (
        {"match": {"version": 1, "expr": {"kind": "atom", "path": [], "op": {"kind": "eq"}}}},
        "match expression ['expr']['path']: must be a non-empty list of keys",
    ),
    "match a string": ({"match": "user_id == 1"}, "match expression: must be a dict"),
    "match of another version": (
        {"match": {"version": 2, "expr": {}}},
        "match expression ['version']: must be 1, got 2",
    ),
    "match op unknown": (
        {
            "match": {
                "version": 1,
                "expr": {"kind": "atom", "path": ["a"], "op": {"kind": "regex", "value": ".*"}},
            }
        },
        "unknown op 'regex'",
    ),
    "timeout in months": ({"timeout": "P1M"}, "timeout='P1M': 'P1M' uses years or months"),
    "timeout instant without offset": (
        {"timeout": "2026-01-31T09:00:00"},
        "'2026-01-31T09:00:00' has no UTC offset",
    ),
    "timeout in words": ({"timeout": "tomorrow"}, "'tomorrow' is neither an ISO 8601 duration"),
    "timeout too long": ({"timeout": 10**12}, "1000000000000 seconds is longer than 1000 years"),
    "timeout negative": ({"timeout": -5}, "-5 is negative"),
    "timeout a list": ({"timeout": [1]}, "[1] is not a duration"),
}


@pytest.mark.parametrize("payload, detail", RESUME_ARGUMENTS.values(), ids=RESUME_ARGUMENTS.keys())
def test_bad_arguments_met_at_resume_fail_the_run_and_change_nothing_else(past, payload, detail):
    event = trigger("t.faults-args", **{"for": past}, **payload)
    run_id = run_id_for("t-faults-args", event.payload["run_key"])
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]

    report = resume_due_runs()

    assert (report.resumed, report.failed, report.errors) == (1, 1, 0)
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_FAILED]
    failed, run = _failed(run_id)
    assert (failed["reason"], failed["step"]) == ("invalid_step_argument", "1")
    assert failed["error"] == "step 1 (wait_for_event 'thing'): invalid argument"
    assert detail in run.last_error
    assert detail not in json.dumps(failed)  # raw text stays out of the event
    assert not WorkflowRunPending.objects.filter(run_id=run_id).exists()
    assert not Event.objects.filter(type="t.recorded", aggregate_id=event.aggregate_id).exists()


# --- results JSON cannot hold -------------------------------------------------------


JUNK = {
    "set": "ctx.steps['junk'] is a set, which is not JSON-serialisable",
    "nan": "ctx.steps['junk'] is nan, which JSON cannot hold",
    "naive": "ctx.steps['junk'] is a naive datetime (2026-01-31T09:00:00)",
    "bytes": "ctx.steps['junk'] is a bytes",
    "object": "ctx.steps['junk'] is a object",
}


@pytest.mark.parametrize("junk, detail", JUNK.items(), ids=JUNK.keys())
def test_a_result_json_cannot_hold_fails_the_run_naming_the_value(junk, detail):
    event = trigger("t.faults-result", junk=junk)
    run_id = run_id_for("t-faults-result", event.payload["run_key"])

    failed, run = _failed(run_id)
    assert failed["reason"] == "invalid_step_result"
    assert failed["error"] == "step 0 (compute 'junk'): its result is not JSON-serialisable"
    assert detail in run.last_error
    assert types_of(run_id) == [et.RUN_STARTED, et.RUN_FAILED]
    assert not Event.objects.filter(type="t.recorded", aggregate_id=event.aggregate_id).exists()
    assert Event.objects.filter(pk=event.pk).exists()


# --- oversized step results ---------------------------------------------------------


def test_a_result_too_big_to_suspend_with_fails_the_run_at_resume(past, settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "MAX_PAYLOAD_BYTES": 10_000}
    event = trigger("t.faults-big-result", size=20_000, **{"for": past})
    run_id = run_id_for("t-faults-big-result", event.payload["run_key"])

    report = resume_due_runs()

    failed, run = _failed(run_id)
    assert (report.resumed, report.failed, report.errors) == (1, 1, 0), report
    assert (failed["reason"], failed["step"]) == ("invalid_step_result", "2")
    assert failed["error"] == "step 2 (wait): the step results cannot be saved to suspend"
    assert "over the limit of 10000 bytes" in run.last_error
    assert "xxxxxxxxxx" not in json.dumps(failed)
    assert not WorkflowRunPending.objects.filter(run_id=run_id).exists()
    assert resume_due_runs().processed == 0  # not a poison row that fails every pass


# --- results too large for JSON -----------------------------------------------------


def test_a_result_json_dumps_refuses_fails_the_run_at_start():
    event = trigger("t.faults-huge-result")
    run_id = run_id_for("t-faults-huge-result", event.payload["run_key"])

    failed, run = _failed(run_id)
    assert (failed["reason"], failed["step"]) == ("invalid_step_result", "1")
    assert failed["error"] == "step 1 (compute 'huge'): its result is not JSON-serialisable"
    assert "ctx.steps['huge']['n'] is an int of more than 4000 digits" in run.last_error
    assert types_of(run_id) == [et.RUN_STARTED, et.RUN_FAILED]
    assert Event.objects.filter(pk=event.pk).exists()  # the domain write stands


def test_a_result_json_dumps_refuses_fails_the_run_at_resume_not_every_pass(now):
    event = trigger("t.faults-huge-result", wait_first=True)
    run_id = run_id_for("t-faults-huge-result", event.payload["run_key"])

    report = resume_due_runs(now=now + timedelta(minutes=1))

    assert (report.resumed, report.failed, report.errors) == (1, 1, 0), report
    failed, run = _failed(run_id)
    assert (failed["reason"], failed["step"]) == ("invalid_step_result", "1")
    assert "ctx.steps['huge']['n'] is an int of more than 4000 digits" in run.last_error
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_FAILED]
    # A one-shot pass after it has nothing left to trip over: no error, exit 0.
    out = StringIO()
    call_command("resume_due_runs", "--no-cron", stdout=out)
    assert "errors=0" in out.getvalue()


def test_a_result_json_dumps_refuses_in_a_retry_body_fails_the_run(now):
    event = trigger("t.faults-huge-retry")
    run_id = run_id_for("t-faults-huge-retry", event.payload["run_key"])
    assert types_of(run_id) == [et.RUN_STARTED, et.RETRY_SCHEDULED]

    report = resume_due_runs(now=now + timedelta(minutes=1))

    assert (report.resumed, report.failed, report.errors) == (1, 1, 0), report
    failed, run = _failed(run_id)
    assert (failed["reason"], failed["step"]) == ("invalid_step_result", "0")
    assert "ctx.steps['huge']['n'] is an int of more than 4000 digits" in run.last_error


# --- tampered pending rows ----------------------------------------------------------


TAMPERED = {
    "unknown suspension type": ({"suspension_type": "teleport"}, "with suspension 'teleport'"),
    "event suspension on a wait step": ({"suspension_type": "event"}, "with suspension 'event'"),
    "retry suspension on a wait step": ({"suspension_type": "retry"}, "with suspension 'retry'"),
    "step past the end": ({"step": "9"}, "names step '9'"),
    "step inside a compute": ({"step": "1.then.0"}, "names step '1.then.0'"),
    "step not a position": ({"step": "one"}, "names step 'one'"),
    "empty step": ({"step": ""}, "names step ''"),
}


@pytest.mark.parametrize("fields, detail", TAMPERED.values(), ids=TAMPERED.keys())
def test_a_tampered_pending_row_fails_its_run_loudly(past, fields, detail):
    event = trigger("t.wait", **{"for": past})
    run_id = run_id_for("t-wait", event.payload["run_key"])
    WorkflowRunPending.objects.filter(run_id=run_id).update(**fields)

    report = resume_due_runs()

    assert (report.failed, report.resumed, report.errors) == (1, 0, 0)
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.RUN_FAILED]
    failed, run = _failed(run_id)
    assert failed["reason"] == "invalid_pending_row"
    assert detail in run.last_error
    assert not WorkflowRunPending.objects.filter(run_id=run_id).exists()
    assert not Event.objects.filter(type="t.recorded", payload__step="after").exists()


BAD_STATES = {
    "state a list": ([1, 2], "expected an object, got list"),
    "results a string": ({"results": "x", "awaited": {}}, "'results' is not an object"),
    "awaited a list": ({"results": {}, "awaited": [7]}, "'awaited' is not an object"),
    "awaited id a string": (
        {"results": {}, "awaited": {"verified": "seven"}},
        "awaited['verified'] is not an event id",
    ),
}


@pytest.mark.parametrize("state, detail", BAD_STATES.values(), ids=BAD_STATES.keys())
def test_a_pending_row_with_tampered_state_fails_its_run_not_every_pass(past, state, detail):
    bad = run_id_for("t-wait", trigger("t.wait", **{"for": past}).payload["run_key"])
    good = run_id_for("t-wait", trigger("t.wait", **{"for": past}).payload["run_key"])
    WorkflowRunPending.objects.filter(run_id=bad).update(state=state)

    report = resume_due_runs()

    assert types_of(good)[-1] == et.RUN_COMPLETED
    assert (report.completed, report.failed, report.errors) == (1, 1, 0), report
    assert types_of(bad) == [et.RUN_STARTED, et.WAITING, et.RUN_FAILED]
    failed, run = _failed(bad)
    assert failed["reason"] == "invalid_pending_row"
    assert f"pending row has a malformed state: {detail}" in run.last_error
    assert resume_due_runs().processed == 0
