"""Bad input refused: each case shows the message and that nothing else changed.

Complements tests/integration/test_store.py (bad ``append_event`` arguments, oversized and
non-JSON payloads), tests/unit/test_definitions.py (malformed static match
expressions, durations and awaits keys at definition time, and the property
tests of the matcher and the duration parser) and tests/integration/test_runs.py (bad
callable arguments when a run starts). Here: the resume path, hostile
payloads through a real wake-up, tampered pending rows, and strings and
integers a database would refuse or garble, through every entry point that
writes them.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction

from kumiko_workflows import append_event, resume_due_runs, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.exceptions import InvalidArgument, InvalidEvent
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from tests.support import run_events, trigger, types_of

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


def test_results_too_big_to_keep_at_completion_are_left_out_and_the_run_completes(settings):
    """The completion keeps the final results when they fit; when not, the run still completes."""
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "MAX_PAYLOAD_BYTES": 10_000}
    small = trigger("t.fine-result", size=10)
    big = trigger("t.fine-result", size=20_000)

    for event, state in (
        (small, {"results": {"big": "x" * 10}, "awaited": {}}),
        (big, None),
    ):
        run_id = run_id_for("t-fine-result", event.payload["run_key"])
        assert types_of(run_id) == [et.RUN_STARTED, et.RUN_COMPLETED]
        assert run_events(run_id)[-1].payload["state"] == state
        assert WorkflowRun.objects.get(run_id=run_id).status == "completed"


# --- results too large for JSON -----------------------------------------------------


def test_a_result_json_dumps_refuses_fails_the_run_at_start():
    event = trigger("t.faults-huge-result")
    run_id = run_id_for("t-faults-huge-result", event.payload["run_key"])

    failed, run = _failed(run_id)
    assert (failed["reason"], failed["step"]) == ("invalid_step_result", "1")
    assert failed["error"] == "step 1 (compute 'huge'): its result is not JSON-serialisable"
    assert "ctx.steps['huge']['n'] is an integer beyond the 64-bit range" in run.last_error
    assert types_of(run_id) == [et.RUN_STARTED, et.RUN_FAILED]
    assert Event.objects.filter(pk=event.pk).exists()  # the domain write stands


def test_a_result_json_dumps_refuses_fails_the_run_at_resume_not_every_pass(now):
    event = trigger("t.faults-huge-result", wait_first=True)
    run_id = run_id_for("t-faults-huge-result", event.payload["run_key"])

    report = resume_due_runs(now=now + timedelta(minutes=1))

    assert (report.resumed, report.failed, report.errors) == (1, 1, 0), report
    failed, run = _failed(run_id)
    assert (failed["reason"], failed["step"]) == ("invalid_step_result", "1")
    assert "ctx.steps['huge']['n'] is an integer beyond the 64-bit range" in run.last_error
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
    assert "ctx.steps['huge']['n'] is an integer beyond the 64-bit range" in run.last_error


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


# --- strings and numbers a database would refuse or garble ----------------------------
#
# Each is refused by append_event before any SQL, with InvalidEvent naming the
# field, on SQLite as on PostgreSQL (where the raw error would abort the
# caller's transaction); the same transaction then goes on writing.


NAME_FIELDS = ("tenant_id", "type", "aggregate_type", "created_by")


#: A value (None: one character over the column's max_length) and the problem.
BAD_NAMES = {
    "NUL": ("acme\x00x", "contains a NUL character"),
    "lone surrogate": ("acme\ud800", "is not valid Unicode text"),
    "newline": ("acme\nx", r"contains a control character \('\\n' at position 4\)"),
    "escape": ("\x1b[31macme", r"contains a control character \('\\x1b' at position 0\)"),
    "DEL": ("acme\x7f", "contains a control character"),
    "C1 control": ("acme\x85", "contains a control character"),
    "too long": (None, "is longer than {max_length} characters"),
}


def _arguments(stream, **overrides) -> dict:
    return {
        "aggregate_id": stream,
        "aggregate_type": "thing",
        "type": "t.thing",
        "payload": {},
        "tenant_id": "default",
    } | overrides


@pytest.mark.parametrize("field", NAME_FIELDS)
@pytest.mark.parametrize("value, message", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_a_bad_name_is_refused_before_any_sql_and_the_transaction_goes_on(
    field, value, message, django_assert_num_queries
):
    stream = uuid.uuid4()
    max_length = Event._meta.get_field(field).max_length
    if value is None:
        value = "x" * (max_length + 1)
    with transaction.atomic():
        with django_assert_num_queries(0), pytest.raises(InvalidEvent) as refused:
            append_event(**_arguments(stream, **{field: value}))
        written = append_event(**_arguments(stream))

    assert re.match(f"{field} {message.format(max_length=max_length)}", str(refused.value))
    assert [event.id for event in Event.objects.filter(aggregate_id=stream)] == [written.id]


def test_a_name_at_the_column_length_with_tabs_elsewhere_is_fine():
    """The limits are the columns' own, and only names refuse control characters."""
    stream = uuid.uuid4()
    values = {field: "n" * Event._meta.get_field(field).max_length for field in NAME_FIELDS}
    event = append_event(**_arguments(stream, **values, payload={"note": "a\tb\nc"}))

    stored = Event.objects.get(pk=event.pk)
    assert {field: getattr(stored, field) for field in NAME_FIELDS} == values
    assert stored.payload == {"note": "a\tb\nc"}


@pytest.mark.django_db(transaction=True)
def test_an_overlong_created_by_leaves_the_callers_transaction_usable_and_it_commits():
    stream, other = uuid.uuid4(), uuid.uuid4()
    with transaction.atomic():
        with pytest.raises(InvalidEvent, match="created_by is longer than 200 characters"):
            append_event(stream, "thing", "t.thing", {}, created_by="a" * 300)
        append_event(other, "thing", "t.thing", {}, created_by="b" * 200)

    # Committed (this test runs outside a test transaction): read back fresh.
    assert not Event.objects.filter(aggregate_id=stream).exists()
    assert Event.objects.get(aggregate_id=other).created_by == "b" * 200


OTHER_ARGUMENTS = {
    # PostgreSQL raises "smallint/integer out of range" (aborting the
    # transaction) where SQLite stores the number.
    "event_version over smallint": (
        {"event_version": 32768},
        "event_version must be at most 32767, got 32768",
    ),
    "expected_version at the column's top": (
        {"expected_version": 2**31 - 1},
        "expected_version must be at most 2147483646, got 2147483647",
    ),
    # Python cannot print these integers: the message must not try.
    "tenant_id a huge integer": (
        {"tenant_id": 10**5000},
        "tenant_id must be a non-empty string, got an integer of about 5000 digits",
    ),
    "aggregate_id a huge integer": (
        {"aggregate_id": -(10**5000)},
        "aggregate_id must be a UUID or a saved model instance, got an integer of about "
        "5000 digits",
    ),
    "created_by a long list": (
        {"created_by": ["x"] * 100},
        r"created_by must be a string, got \['x', 'x', .*\.\.\.\]$",
    ),
}


@pytest.mark.parametrize("overrides, message", OTHER_ARGUMENTS.values(), ids=OTHER_ARGUMENTS)
def test_numbers_over_their_column_and_unprintable_values_are_refused_before_any_sql(
    overrides, message, django_assert_num_queries
):
    stream = uuid.uuid4()
    append_event(**_arguments(stream))
    with transaction.atomic():
        with django_assert_num_queries(0), pytest.raises(InvalidEvent, match=message):
            append_event(**_arguments(stream, **overrides))
        written = append_event(**_arguments(stream))

    assert [event.version for event in Event.objects.filter(aggregate_id=stream)] == [1, 2]
    assert written.version == 2


# JSON numbers: every supported database must hold the integer exactly.
# PostgreSQL's jsonb keeps any size, but SQLite's JSON functions (which the
# JSONField lookups use) turn integers beyond 64 bits into floats, and Python
# refuses to print integers of more than 4,300 digits at all.

BIG_INTEGERS = {
    "2**63": ({"n": 2**63}, r"payload\['n'\] is an integer beyond the 64-bit range"),
    "-2**63 - 1": ({"a": [-(2**63) - 1]}, r"payload\['a'\]\[0\] is an integer beyond"),
    "5,000 digits": ({"n": {"m": 10**5000}}, r"payload\['n'\]\['m'\] is an integer beyond"),
}


@pytest.mark.parametrize("payload, message", BIG_INTEGERS.values(), ids=BIG_INTEGERS.keys())
@pytest.mark.parametrize("where", ["payload", "metadata"])
def test_an_integer_json_cannot_hold_exactly_is_refused_naming_its_key_path(
    where, payload, message, django_assert_num_queries
):
    stream = uuid.uuid4()
    message = message.replace("payload", where)
    with django_assert_num_queries(0), pytest.raises(InvalidEvent, match=message):
        append_event(**_arguments(stream, **{where: payload}))
    assert not Event.objects.filter(aggregate_id=stream).exists()


def test_the_64_bit_extremes_round_trip_and_can_be_queried():
    edges = {"max": 2**63 - 1, "min": -(2**63)}
    event = append_event(**_arguments(uuid.uuid4(), payload=edges, metadata=edges))

    stored = Event.objects.get(pk=event.pk)
    assert stored.payload == stored.metadata == edges
    assert Event.objects.filter(pk=event.pk, payload__max=2**63 - 1).exists()
    assert Event.objects.filter(pk=event.pk, payload__min=-(2**63)).exists()


def test_a_step_result_of_a_5000_digit_integer_fails_the_run_naming_it():
    event = trigger("t.faults-result", junk="huge int")
    run_id = run_id_for("t-faults-result", event.payload["run_key"])

    failed, run = _failed(run_id)
    assert failed["reason"] == "invalid_step_result"
    assert "ctx.steps['junk'] is an integer beyond the 64-bit range" in run.last_error
    assert Event.objects.filter(pk=event.pk).exists()


# --- the other entry points that write these strings ---------------------------------


BAD_BY = {
    "too long": ("a" * 300, "by is longer than 200 characters"),
    "NUL": ("admin:\x00", "by contains a NUL character"),
    "lone surrogate": ("admin:\udfff", "by is not valid Unicode text"),
    "newline": ("admin:\nroot", "by contains a control character"),
    "not a string": (7, "by must be a string, got 7"),
}


def _operation(name):
    from kumiko_workflows import cancel_run, rerun_run, wake_run

    return {
        "cancel": lambda run_id, by: cancel_run(run_id, "duplicate", by=by),
        "wake": lambda run_id, by: wake_run(run_id, by=by),
        "rerun": lambda run_id, by: rerun_run(run_id, by=by),
    }[name]


@pytest.mark.parametrize("operation", ["cancel", "wake", "rerun"])
@pytest.mark.parametrize("by, message", BAD_BY.values(), ids=BAD_BY.keys())
def test_a_bad_by_is_refused_before_any_sql_and_the_run_is_untouched(
    operation, by, message, future, django_assert_num_queries
):
    event = trigger("t.wait", **{"for": future})
    run_id = run_id_for("t-wait", event.payload["run_key"])
    with transaction.atomic():
        with django_assert_num_queries(0), pytest.raises(InvalidArgument, match=message):
            _operation(operation)(run_id, by)
        assert _operation("wake")(run_id, "admin:root") is True  # the transaction goes on

    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.WAKE_REQUESTED]


def _schedule_operation(name):
    from kumiko_workflows import fire_schedule_now, pause_schedule, resume_schedule
    from tests.testapp import cron_workflows as cw

    return {
        "pause": lambda by: pause_schedule(cw.hourly_all.name, by=by),
        "resume": lambda by: resume_schedule(cw.hourly_all.name, by=by),
        "fire now": lambda by: fire_schedule_now(cw.hourly_all.name, by=by),
    }[name]


@pytest.mark.parametrize("operation", ["pause", "resume", "fire now"])
@pytest.mark.parametrize("by, message", BAD_BY.values(), ids=BAD_BY.keys())
def test_a_bad_by_of_a_schedule_operation_is_refused_before_any_sql(
    operation, by, message, django_assert_num_queries
):
    from kumiko_workflows.workflow.registry import registry
    from tests.testapp import cron_workflows as cw

    with registry.override(cw.hourly_all), transaction.atomic():
        with django_assert_num_queries(0), pytest.raises(InvalidArgument, match=re.escape(message)):
            _schedule_operation(operation)(by)
        assert _schedule_operation("pause")("ops") is True  # the transaction goes on

    assert (
        not Event.objects.filter(aggregate_type=et.SCHEDULE_AGGREGATE_TYPE)
        .exclude(type__in=[et.SCHEDULE_STARTED, et.SCHEDULE_PAUSED])
        .exists()
    )


BAD_REASONS = {
    "NUL": ("dup\x00licate", "reason contains a NUL character"),
    "lone surrogate": ("dup\ud800", "reason is not valid Unicode text"),
}


@pytest.mark.parametrize("reason, message", BAD_REASONS.values(), ids=BAD_REASONS.keys())
def test_a_bad_cancel_reason_is_refused_before_any_sql(
    reason, message, future, django_assert_num_queries
):
    from kumiko_workflows import cancel_run

    run_id = run_id_for("t-wait", trigger("t.wait", **{"for": future}).payload["run_key"])
    with django_assert_num_queries(0), pytest.raises(InvalidArgument, match=message):
        cancel_run(run_id, reason, by="admin:root")
    # A reason may span lines: only names refuse control characters.
    assert cancel_run(run_id, "duplicate\norder", by="admin:root") is True
    assert run_events(run_id)[-1].payload["reason"] == "duplicate\norder"


@pytest.mark.parametrize("value, message", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_a_bad_tenant_for_resume_due_runs_is_refused_before_any_sql(
    value, message, django_assert_num_queries
):
    tenant = "t" * 101 if value is None else value
    message = "tenant_id " + message.format(max_length=100)
    with django_assert_num_queries(0), pytest.raises(InvalidArgument, match=message):
        resume_due_runs(tenant_id=tenant)


@pytest.mark.parametrize(
    "command",
    [["resume_due_runs"], ["resume_due_runs", "--loop"], ["workflow_versions"]],
    ids=" ".join,
)
def test_a_bad_tenant_on_the_command_line_is_one_clear_line_and_a_non_zero_exit(command):
    from tests.support import run_manage

    done = run_manage(*command, "--tenant", "a\x01")

    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].endswith(
        "error: argument --tenant: 'a\\x01': a tenant id contains a control character "
        "('\\x01' at position 1)"
    )


STEP_APPENDS = {
    "overlong created_by": ("long created_by", "created_by is longer than 200 characters"),
    "NUL in type": ("NUL type", "type contains a NUL character"),
    "newline in aggregate_type": ("newline aggregate_type", "aggregate_type contains a control"),
    "huge integer": ("huge payload", r"payload['n'] is an integer beyond the 64-bit range"),
}


@pytest.mark.parametrize("bad, detail", STEP_APPENDS.values(), ids=STEP_APPENDS.keys())
def test_a_bad_append_from_a_step_fails_the_run_not_the_trigger_write(bad, detail):
    event = trigger("t.step-appends", bad=bad)
    run_id = run_id_for("t-step-appends", event.payload["run_key"])

    failed, run = _failed(run_id)
    assert (failed["reason"], run.error_class) == ("step_failed", "InvalidEvent")
    assert detail in run.last_error
    assert Event.objects.filter(pk=event.pk).exists()
    assert not Event.objects.filter(aggregate_id=event.aggregate_id).exclude(pk=event.pk).exists()


def test_a_step_of_a_workflow_with_a_200_character_name_can_append():
    """ctx.append_event's default created_by ('workflow:<name>') fits its column."""
    from kumiko_workflows import define_workflow, on_event, steps
    from kumiko_workflows.workflow.registry import registry
    from tests.testapp.workflows import append_as_told, run_key

    name = "w" * 200
    workflow = define_workflow(
        name,
        on_event("t.long-name"),
        [steps.compute("append", append_as_told)],
        idempotency_key=run_key,
        register=False,
    )
    with registry.override(workflow):
        event = trigger("t.long-name", bad="nothing")

    run = WorkflowRun.objects.get(run_id=run_id_for(name, event.payload["run_key"]))
    assert run.status == "completed", run.last_error
    written = Event.objects.get(aggregate_id=event.aggregate_id, type="t.appended")
    assert written.created_by == f"workflow:{name}"[:200]
