"""``BATCH_TOGETHER``: a batch's rows claimed in one statement, its runs' last events in one.

PostgreSQL only (where writes chain). Each run is still resumed exactly
once: a stream that moved under the batch, a statement refused, a stop or a
slow step in the middle each leave every run resumed once, the rows not
reached put back as they were.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

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
from kumiko_workflows.store import statements
from kumiko_workflows.workflow.registry import registry
from tests.support import trigger, types_of
from tests.testapp import workflows as w
from tests.testapp.workflows import payload_value

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

_SECOND = timedelta(seconds=1)


@pytest.fixture
def together(settings):
    settings.KUMIKO_WORKFLOWS = {
        **settings.KUMIKO_WORKFLOWS,
        "BATCH_TOGETHER": True,
        "BATCH_SIZE": 50,
    }


def _due_runs(count, past):
    events = [trigger("t.wait", **{"for": past}) for _ in range(count)]
    return [run_id_for("t-wait", event.payload["run_key"]) for event in events]


def _resumed_once(runs):
    for run in runs:
        assert Event.objects.filter(aggregate_id=run, type=et.RESUMED).count() == 1, run
        assert types_of(run)[-1] == et.RUN_COMPLETED


def test_a_batch_is_claimed_in_one_statement_and_its_events_written_in_one(together, past):
    runs = _due_runs(12, past)
    with CaptureQueriesContext(connection) as queries:
        report = resume_due_runs()
    assert (report.resumed, report.completed) == (12, 12)
    _resumed_once(runs)
    assert WorkflowRun.objects.filter(run_id__in=runs, status="completed").count() == 12
    assert not WorkflowRunPending.objects.filter(run_id__in=runs).exists()
    sql = [query["sql"] for query in queries]
    claims = [q for q in sql if q.startswith("WITH c AS (DELETE")]
    events = 'INSERT INTO "kumiko_workflows_event"'
    together = [q for q in sql if q.startswith(events) and "unnest(" in q]
    pairs = [q for q in sql if q.startswith('WITH first AS (INSERT INTO "kumiko_workflows_event"')]
    # The batch's claim of its 12 rows, then the two looks of a row's own claim
    # (due by claim instant, held back) that find none left; the batch's writes
    # made no row due, so no look again. One insert of the runs' 24 last
    # events, none of a run's own.
    assert len(claims) == 3, claims
    assert (len(together), len(pairs)) == (1, 0)


def test_a_stream_that_moved_under_the_batch_is_resumed_again_alone(together, past):
    """Another writer took a run's next version: the batch rolls back and goes again a row at a
    time, where that run's conflict is its own; every other run is resumed once."""
    runs = _due_runs(6, past)
    moved = runs[3]
    row = WorkflowRunPending.objects.get(run_id=moved)
    with connection.cursor() as cursor:  # as a racing writer would, at the run's next version
        cursor.execute(
            "INSERT INTO kumiko_workflows_event (tenant_id, aggregate_id, aggregate_type, type, "
            "event_version, payload, metadata, created_by, created_at, version) "
            "VALUES (%s, %s, %s, %s, 1, '{}', '{}', 'racer', now(), %s)",
            [row.tenant_id, moved, et.RUN_AGGREGATE_TYPE, et.WAKE_REQUESTED, row.run_version + 1],
        )
    report = resume_due_runs()
    assert (report.completed, report.errors) == (5, 1), report
    _resumed_once([run for run in runs if run != moved])
    assert not Event.objects.filter(aggregate_id=moved, type=et.RESUMED).exists()
    assert WorkflowRunPending.objects.get(run_id=moved).resume_errors == 1


def test_a_refused_statement_rolls_the_batch_back_and_it_goes_again_one_by_one(together, past):
    runs = _due_runs(5, past)
    refused = []

    def refuse_the_batch_update(execute, sql, params, many, context):
        # The batch's status rows: one UPDATE, the rows as arrays.
        together = sql.startswith('UPDATE "kumiko_workflows_workflowrun"') and "unnest(" in sql
        if together and not refused:
            refused.append(sql)
            raise OperationalError("injected: the database refused the statement")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse_the_batch_update):
        report = resume_due_runs()
    assert refused, "the batch's status rows were never written together"
    assert (report.resumed, report.completed, report.errors) == (5, 5, 0), report
    _resumed_once(runs)


def test_a_stop_in_the_middle_puts_the_rows_not_reached_back(together, past):
    runs = _due_runs(5, past)
    polls = itertools.count()

    def should_stop():
        # The pass's look, the tenant's, then one before each row: two rows resumed.
        return next(polls) >= 4

    report = resume_due_runs(should_stop=should_stop)
    assert (report.resumed, report.completed) == (2, 2), report
    left = WorkflowRunPending.objects.filter(run_id__in=runs)
    assert left.count() == 3
    assert all(row.resume_errors == 0 for row in left)
    again = resume_due_runs()
    assert (again.resumed, again.completed) == (3, 3)
    _resumed_once(runs)


def test_a_batch_past_its_seconds_puts_the_rest_back_and_the_turn_goes_row_by_row(
    together, settings, past
):
    """A slow step held the batch's rows: they go back, due, and the rest of the turn takes
    a row at a time, so a second slow step holds none."""
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_SECONDS": 1e-9}
    runs = _due_runs(4, past)
    with CaptureQueriesContext(connection) as queries:
        report = resume_due_runs()
    assert (report.resumed, report.completed) == (4, 4), report
    _resumed_once(runs)
    # The first batch ended after its first run: its three other rows went back.
    put_back = [
        q
        for q in queries
        if q["sql"].startswith('INSERT INTO "kumiko_workflows_workflowrunpending"')
    ]
    assert len(put_back) == 3, [q["sql"][:60] for q in put_back]
    batch_claims = [q for q in queries if "id = ANY(ARRAY(" in q["sql"]]
    assert len(batch_claims) == 1, [q["sql"][:60] for q in batch_claims]


def test_runs_that_commit_alone_send_the_rest_of_the_turn_row_by_row(together, past):
    """A claimed row whose workflow commits per run ends its batch before it is resumed; the
    batch's rows go back, and the tenant's turn goes on a row at a time (no batch claimed to
    resume one), so that run holds no other row."""
    alone = define_workflow(
        name="t-alone",
        trigger=on_event("t.alone"),
        idempotency_key=w.run_key,
        steps=[steps.wait(payload_value("for", "PT0S")), steps.compute("n", lambda ctx: 1)],
        commit="per_run",
        register=False,
    )
    with registry.override(alone):
        firsts = [trigger("t.alone", **{"for": past}) for _ in range(3)]
        runs = _due_runs(3, past)
        with CaptureQueriesContext(connection) as queries:
            report = resume_due_runs()
    assert (report.resumed, report.completed) == (6, 6), report
    _resumed_once(runs + [run_id_for("t-alone", e.payload["run_key"]) for e in firsts])
    batch_claims = [q for q in queries if "id = ANY(ARRAY(" in q["sql"]]
    assert len(batch_claims) == 1, [q["sql"][:60] for q in batch_claims]


def test_runs_that_suspend_again_are_written_together_and_resumed_later(together, now):
    """A closing pair that suspends (a retry's wait) writes its pending row at the batch's end."""
    events = [trigger("t.retry", fail_attempts=2) for _ in range(4)]
    runs = [run_id_for("t-retry", event.payload["run_key"]) for event in events]
    assert WorkflowRunPending.objects.filter(run_id__in=runs).count() == 4
    first = resume_due_runs(now=now + timedelta(hours=1))
    assert (first.resumed, first.suspended) == (4, 4), first
    assert WorkflowRunPending.objects.filter(run_id__in=runs, retry_attempt=2).count() == 4
    second = resume_due_runs(now=now + timedelta(days=1))
    assert second.completed == 4, second
    for run in runs:
        assert types_of(run)[-1] == et.RUN_COMPLETED


@pytest.mark.parametrize("on", [True, False], ids=["together", "row_by_row"])
def test_a_wait_of_no_time_the_batch_writes_is_resumed_in_the_same_pass(settings, now, on):
    """A wait the batch's last events write, due at the pass's instant, is looked for again
    before the tenant is left, as row by row, where the next claim finds it."""
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_TOGETHER": on}
    twice = define_workflow(
        name="t-twice",
        trigger=on_event("t.twice"),
        idempotency_key=w.run_key,
        steps=[steps.wait("PT0S"), steps.wait("PT0S"), steps.compute("n", lambda ctx: 1)],
        register=False,
    )
    with registry.override(twice):
        events = [trigger("t.twice") for _ in range(3)]
        report = resume_due_runs(now=now + timedelta(days=1))
    assert (report.resumed, report.completed) == (6, 3), report
    for event in events:
        assert types_of(run_id_for("t-twice", event.payload["run_key"]))[-1] == et.RUN_COMPLETED


def test_batch_together_must_be_a_bool(settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_TOGETHER": "yes"}
    errors = [e for e in run_checks() if e.id == "kumiko_workflows.E030"]
    assert errors and "'yes'" in errors[0].msg


def test_status_rows_written_together_take_their_own_values_and_a_row_named_twice_its_last(
    past,
):
    """``update_rows``: rows of their own in one statement, the columns as arrays (a column
    of nulls and one of instants among them); a row named twice in order, its last values
    kept (one statement would keep either's)."""
    runs = _due_runs(3, past)
    tenant = WorkflowRun.objects.get(run_id=runs[0]).tenant_id
    names, keys = ("step", "wake_at", "updated_at"), ("tenant_id", "run_id")
    at = timezone.now()

    def row(run, step, seconds):
        values = {"step": step, "wake_at": None, "updated_at": at + timedelta(seconds=seconds)}
        return statements.row_params(WorkflowRun, values, {"tenant_id": tenant, "run_id": run})

    with CaptureQueriesContext(connection) as queries:
        statements.update_rows(
            WorkflowRun, names, keys, [row(run, f"s{i}", i) for i, run in enumerate(runs)]
        )
    assert len(queries) == 1 and "unnest(" in queries[0]["sql"], queries
    written = WorkflowRun.objects.filter(run_id__in=runs)
    assert {(r.run_id, r.step, r.wake_at, r.updated_at) for r in written} == {
        (run, f"s{i}", None, at + timedelta(seconds=i)) for i, run in enumerate(runs)
    }
    twice = [row(runs[0], "first", 0), row(runs[0], "last", 1)]
    with CaptureQueriesContext(connection) as queries:
        statements.update_rows(WorkflowRun, names, keys, twice)
    assert [q["sql"] for q in queries if "unnest(" in q["sql"]] == [], queries
    assert WorkflowRun.objects.values_list("step", flat=True).get(run_id=runs[0]) == "last"


def test_a_batch_s_events_take_their_ids_in_claim_order_and_each_stream_s_in_version_order(
    together,
):
    """The batch's one insert gives ids in the order its runs were claimed (here by
    priority, against the order they started in) and, within each run's stream, in version
    order, whatever plan the server picks for the insert's check (a rebuild replays by id)."""
    flows = [
        define_workflow(
            name=f"ordered-{name}",
            trigger=on_event(f"ordered.{name}", priority=priority),
            idempotency_key=lambda event: event.payload["key"],
            start="worker",
            steps=[steps.compute("done", lambda ctx: {})],
            register=False,
        )
        for name, priority in (("low", -100), ("mid", 80), ("high", 100))
    ]
    with registry.override(*flows):
        for name in ("low", "mid", "high"):
            append_event(uuid.uuid4(), "thing", f"ordered.{name}", {"key": name})
        resume_due_runs(now=timezone.now() + _SECOND)
    resumed = Event.objects.filter(type=et.RESUMED).order_by("id")
    order = [
        Event.objects.get(aggregate_id=event.aggregate_id, version=1).payload["workflow_name"]
        for event in resumed
    ]
    assert order == ["ordered-high", "ordered-mid", "ordered-low"]
    for event in resumed:
        stream = Event.objects.filter(aggregate_id=event.aggregate_id)
        assert list(stream.order_by("id")) == list(stream.order_by("version")), event


def test_an_array_bound_as_its_text_reads_as_the_driver_s_list_would():
    """``array_param``: the set statements' columns bound as an array's text read back as
    the driver's own list does, for every kind of value they bind (quotes, backslashes,
    braces, commas, spaces, an empty string, the word NULL, None, a ``TextChoices`` member,
    psycopg's ``Int4``, an ``IntEnum``, booleans, UUIDs, aware and naive instants); a value
    of another kind leaves the list to the driver."""
    import enum

    from psycopg.types.numeric import Int4

    from kumiko_workflows.models import RunStatus
    from kumiko_workflows.store.arrays import array_param

    class Size(enum.IntEnum):
        BIG = 7

    at = timezone.now()
    # (the column's type, its values): mixed kinds go element by element, one exact
    # type is joined at once (a string with a quote still quoted apart).
    columns = [
        (
            "text",
            [
                'say "hi"',
                "back\\slash",
                "{brace}",
                "a,b",
                " padded ",
                "",
                "NULL",
                None,
                "ünïcode ✓",
                RunStatus.COMPLETED,
            ],
        ),
        ("varchar", ["plain", "with space", "", "NULL", "{ü,n}"]),
        ("varchar", [uuid.uuid4().hex, 'a "quote" in one', "a \\ in another"]),
        ("int", [0, -3, 2**31 - 1, Int4(4), Size.BIG, None]),
        ("int", [0, -3, 2**31 - 1]),
        ("bigint", [2**62, -(2**62)]),
        ("boolean", [True, False, None]),
        ("uuid", [uuid.uuid4(), None]),
        ("uuid", [uuid.uuid4(), uuid.uuid4()]),
        ("timestamptz", [at, at.replace(microsecond=0), None]),
        ("timestamptz", [at, at.replace(microsecond=0)]),
        ("timestamp", [at.replace(tzinfo=None), None]),
    ]
    with connection.cursor() as cursor:
        for kind, values in columns:
            bound = array_param(values)
            assert isinstance(bound, str), (kind, bound)
            # The driver's list of the same values (it dumps no list of mixed types:
            # the subclasses as their base types).
            base = {"text": str.__str__, "int": int}.get(kind)
            plain = [v if v is None or base is None else base(v) for v in values]
            cursor.execute(f"SELECT %s::{kind}[], %s::{kind}[]", [bound, plain])
            assert cursor.fetchone() == (plain, plain), (kind, values)
    assert array_param([1.5, 2]) == [1.5, 2]  # a float: the driver's list, as it was
