"""The engine's hot statements are prepared on PostgreSQL, and nothing else changes.

An append's insert, the worker's claim and a resumed run's chained insert
are prepared on a connection from their second run there (psycopg 3,
server-side), unless ``PREPARED_STATEMENTS`` is off or the database is set
up for a transaction-pooling PgBouncer (``DISABLE_SERVER_SIDE_CURSORS``).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from kumiko_workflows import append_event, load_stream, resume_due_runs, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WorkflowRun
from tests.support import trigger, types_of

pytestmark = pytest.mark.django_db


def prepared() -> dict[str, int]:
    """This session's prepared statements on the event and pending tables: text -> runs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE %s",
            ["%kumiko_workflows_%"],
        )
        return dict(cursor.fetchall())


def appends(count: int, tenant: str = "prepared") -> list[uuid.UUID]:
    streams = [uuid.uuid4() for _ in range(count)]
    for stream in streams:
        append_event(stream, "order", "t.prepared", {"n": 1}, tenant_id=tenant)
    return streams


def inserts(statements: dict[str, int]) -> list[int]:
    return [runs for sql, runs in statements.items() if sql.startswith("INSERT INTO")]


@pytest.fixture
def new_connection():
    """A connection of its own: nothing run or prepared on it yet (tests before this one
    share theirs)."""
    connection.close()
    yield
    connection.close()


#: Why the tests of prepared statements cannot run on distributed tables.
NOT_PREPARED = (
    "nothing is prepared on distributed tables (Citus refuses the generic plan of an "
    "append's INSERT ... SELECT): there is no prepared statement to count, lose or refuse"
)


@pytest.mark.not_citus(reason=NOT_PREPARED)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_append_is_prepared_from_its_second_run_on_a_connection(new_connection):
    appends(1)
    assert inserts(prepared()) == []  # one run: sent as it is, no extra round trip
    streams = appends(4)
    assert inserts(prepared()) == [4]  # prepared at the second, then only executed
    assert [e.payload for e in load_stream(streams[-1], tenant_id="prepared")] == [{"n": 1}]


@pytest.mark.not_citus(reason=NOT_PREPARED)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_resumes_row_by_row_prepare_the_claim_and_the_chained_insert(new_connection, settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_TOGETHER": False}
    events = [trigger("t.wait", **{"for": "PT0S"}) for _ in range(4)]
    report = resume_due_runs(now=events[-1].created_at + timedelta(seconds=1))
    assert report.completed == 4
    statements = prepared()
    claims = [runs for sql, runs in statements.items() if sql.startswith("WITH c AS (DELETE")]
    # The batch's first claim alone; the next three ride in the chained insert
    # of the run before, the fourth's finds nothing and the claim alone runs
    # again, its second run: prepared there.
    assert claims == [1]
    chained = [
        runs
        for sql, runs in statements.items()
        if sql.startswith("WITH first AS") and ", c AS (DELETE" in sql
    ]
    assert chained == [3]  # four runs, prepared at the second
    for event in events:
        run_id = run_id_for("t-wait", event.payload["run_key"])
        assert types_of(run_id)[-1] == et.RUN_COMPLETED


@pytest.mark.not_citus(reason=NOT_PREPARED)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_batches_claimed_together_prepare_their_claim_and_their_insert(new_connection):
    """Two passes of three runs: the batch's claim, its insert of the runs' last events and
    its update of their status rows are prepared at the second."""
    for _ in range(2):
        events = [trigger("t.wait", **{"for": "PT0S"}) for _ in range(3)]
        report = resume_due_runs(now=events[-1].created_at + timedelta(seconds=1))
        assert report.completed == 3
    statements = prepared()
    claims = [runs for sql, runs in statements.items() if "id = ANY(ARRAY(" in sql]
    together = [runs for sql, runs in statements.items() if "unnest(" in sql]
    updates = [
        runs for sql, runs in statements.items() if sql.startswith("UPDATE") and "unnest(" in sql
    ]
    assert (claims, together, updates) == ([1], [1, 1], [1]), list(statements)


@pytest.mark.not_citus(reason=NOT_PREPARED)
@pytest.mark.postgres
def test_prepared_statements_survive_a_rollback_of_the_callers_transaction():
    appends(3)
    with pytest.raises(RuntimeError), transaction.atomic():
        appends(2)
        raise RuntimeError("the view fails after appending")
    # psycopg drops its prepared statements at a rollback (here of a savepoint);
    # the next append prepares its insert again: 3 runs, not the 7 of all appends.
    streams = appends(3)
    assert Event.objects.filter(aggregate_id__in=streams).count() == 3
    assert inserts(prepared()) == [3]


@pytest.mark.postgres
def test_the_setting_turns_preparing_off(settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "PREPARED_STATEMENTS": False}
    appends(3)
    assert inserts(prepared()) == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_database_set_up_for_pgbouncer_transaction_pooling_prepares_nothing(monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    connection.close()  # the next statement opens a connection with the setting
    appends(3)
    assert inserts(prepared()) == []
    monkeypatch.undo()
    connection.close()


@pytest.mark.postgres
def test_logged_queries_show_the_statements_with_their_values():
    appends(2)
    with CaptureQueriesContext(connection) as queries:
        stream = appends(1)[0]
    assert any(str(stream) in query["sql"] for query in queries)


def test_a_setting_that_is_not_a_bool_is_refused(settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "PREPARED_STATEMENTS": "yes"}
    errors = [e for e in run_checks() if e.id == "kumiko_workflows.E029"]
    assert len(errors) == 1
    assert "PREPARED_STATEMENTS'] must be True or False, got 'yes'" in errors[0].msg


def test_runs_complete_the_same_with_preparing_on_or_off(settings):
    for flag in (True, False):
        settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "PREPARED_STATEMENTS": flag}
        events = [trigger("t.wait", **{"for": "PT0S"}) for _ in range(3)]
        assert resume_due_runs(now=events[-1].created_at + timedelta(seconds=1)).completed == 3
        run_ids = [run_id_for("t-wait", e.payload["run_key"]) for e in events]
        assert WorkflowRun.objects.filter(run_id__in=run_ids, status="completed").count() == 3


@pytest.mark.not_citus(reason=NOT_PREPARED)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_migration_on_another_connection_leaves_prepared_statements_working(new_connection):
    """A deploy migrates the event table while a worker's connection holds its prepared
    insert: PostgreSQL plans it again, and the insert names its columns, so the next
    append neither fails nor writes the wrong shape."""
    import psycopg

    appends(3)
    settings_dict = connection.settings_dict
    other = psycopg.connect(
        dbname=settings_dict["NAME"],
        user=settings_dict["USER"],
        host=settings_dict["HOST"] or None,
        port=settings_dict["PORT"] or None,
        autocommit=True,
    )
    table = Event._meta.db_table
    try:
        other.execute(f'ALTER TABLE "{table}" ADD COLUMN kumiko_test_extra integer DEFAULT 7')
        streams = appends(2)
        other.execute(f'ALTER TABLE "{table}" DROP COLUMN kumiko_test_extra')
        streams += appends(2)
    finally:
        other.execute(f'ALTER TABLE "{table}" DROP COLUMN IF EXISTS kumiko_test_extra')
        other.close()
    assert Event.objects.filter(aggregate_id__in=streams).count() == 4
    assert inserts(prepared()) == [6]  # the same prepared statement throughout


# --- a pooler that loses prepared statements (PgBouncer < 1.21 in transaction mode) ------


def _taken_by_another_client(count: int = 10) -> None:
    """Prepare psycopg's first names on this session, as another client of the same
    server connection would have behind a transaction-pooling PgBouncer."""
    with connection.cursor() as cursor:
        for n in range(count):
            cursor.execute(f"PREPARE _pg3_{n} AS SELECT {n}")


def _lost_on_the_server() -> None:
    """Drop this session's prepared statements behind psycopg's back, as a pooler does
    by handing the next transaction another server connection."""
    connection.connection.pgconn.exec_(b"DEALLOCATE ALL")


@pytest.fixture
def warnings_once(monkeypatch, caplog):
    from kumiko_workflows.store import cursors

    monkeypatch.setattr(cursors, "_warned_about_pooler", False, raising=False)
    caplog.set_level("WARNING", logger="kumiko_workflows.store.cursors")
    return caplog


def _pooler_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused a prepared statement" in r.message]


@pytest.mark.not_citus(reason=NOT_PREPARED)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_prepared_name_another_client_holds_stops_preparing_and_the_append_goes_on(
    new_connection, warnings_once
):
    _taken_by_another_client()
    streams = appends(4)  # the second would PREPARE _pg3_0: refused, sent again unprepared
    assert Event.objects.filter(aggregate_id__in=streams).count() == 4
    assert inserts(prepared()) == []  # nothing more prepared on this connection
    (warning,) = _pooler_warnings(warnings_once)
    assert 'prepared statement "_pg3_0" already exists' in warning
    assert "PREPARED_STATEMENTS" in warning


@pytest.mark.not_citus(reason=NOT_PREPARED)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_awaited_appends_in_the_callers_transaction_survive_a_refused_prepare(
    new_connection, warnings_once
):
    waiting = [trigger("t.signed-up", user_id=f"pooled-{i}", timeout="P7D") for i in range(3)]
    connection.close()
    _taken_by_another_client()
    with transaction.atomic():
        for i in range(3):
            append_event(uuid.uuid4(), "user", "t.verified", {"user_id": f"pooled-{i}"})
        # The caller's transaction is still usable, and sees its appends.
        assert Event.objects.filter(type="t.verified").count() == 3
    for event in waiting:
        run_id = run_id_for("t-event", event.payload["run_key"])
        assert et.WAKE_REQUESTED in types_of(run_id)
    assert len(_pooler_warnings(warnings_once)) == 1


@pytest.mark.not_citus(reason=NOT_PREPARED)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_prepared_statement_the_server_lost_is_sent_again_unprepared(
    new_connection, warnings_once
):
    appends(3)
    assert inserts(prepared()) == [2]
    _lost_on_the_server()
    streams = appends(2)  # in autocommit: the refused statement aborted nothing
    assert Event.objects.filter(aggregate_id__in=streams).count() == 2
    assert inserts(prepared()) == []
    (warning,) = _pooler_warnings(warnings_once)
    assert 'prepared statement "_pg3_0" does not exist' in warning


@pytest.mark.not_citus(reason=NOT_PREPARED)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_awaited_append_whose_prepared_insert_the_server_lost_runs_again_at_its_savepoint(
    new_connection, warnings_once
):
    waiting = [trigger("t.signed-up", user_id=f"lost-{i}", timeout="P7D") for i in range(3)]
    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "lost-0"})
    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "lost-1"})
    assert inserts(prepared())  # the append's insert among them
    _lost_on_the_server()
    with transaction.atomic():
        append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "lost-2"})
        assert Event.objects.filter(type="t.verified").count() == 3
    for event in waiting:
        assert et.WAKE_REQUESTED in types_of(run_id_for("t-event", event.payload["run_key"]))
    (warning,) = _pooler_warnings(warnings_once)
    assert "does not exist" in warning


@pytest.mark.not_citus(reason=NOT_PREPARED)
@pytest.mark.postgres
def test_instants_the_hot_statements_read_are_the_ones_django_reads():
    """The hot statements' cursor loads ``timestamptz`` with psycopg's compiled loader where
    Django's zone and the session's are UTC: the same instants, in the same zone object, as
    Django's own cursors read (microseconds, other offsets, before 1970, far ahead, null)."""
    from kumiko_workflows.store.cursors import hot_cursor

    query = (
        "SELECT now(), '2026-01-01 10:00:00.5+05'::timestamptz, "
        "'1969-07-20 20:17:40.000001-04'::timestamptz, '9999-12-31 23:59:59.999999Z'::timestamptz, "
        "NULL::timestamptz"
    )
    with transaction.atomic():  # one now()
        with hot_cursor() as cursor:
            cursor.execute(query)
            hot = cursor.fetchone()
            loader = cursor.cursor.adapters.get_loader(1184, 0)  # timestamptz, text
        with connection.cursor() as cursor:
            cursor.execute(query)
            django = cursor.fetchone()
    assert loader.__module__.startswith("psycopg_"), loader  # the compiled one: what changed
    assert hot == django
    assert [v.tzinfo for v in hot[:4]] == [v.tzinfo for v in django[:4]]
    assert all(v.tzinfo is django[0].tzinfo for v in hot[:4])
