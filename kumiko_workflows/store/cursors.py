"""The hot statements' cursor: kept open on the connection, preparing what it runs again,
and preparing it anew once the tables it reads have grown."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.store.db import engine, settings_generation
from kumiko_workflows.store.distribution import distributed

logger = logging.getLogger(__name__)

try:
    import psycopg
    from psycopg.types.datetime import TimestamptzLoader
except ImportError:  # a site on SQLite need not have it
    psycopg = None  # type: ignore[assignment]


@contextmanager
def hot_cursor(db: BaseDatabaseWrapper | None = None) -> Iterator[CursorWrapper]:
    """A cursor for a hot statement on ``db`` (default: the engine's); see :func:`_kept_cursor`."""
    cursor, kept = _kept_cursor(db or engine())
    try:
        yield cursor
    finally:
        if not kept:
            cursor.close()


def _kept_cursor(db: BaseDatabaseWrapper) -> tuple[CursorWrapper, bool]:
    """Django's cursor for the hot statements on ``db``, and whether it is kept open.

    The hot statements are the ones run per append and per resumed run: the
    appends' inserts, the worker's claim and the projections' row writes.
    Opening and closing a cursor per statement cost about a tenth of an
    append. The cursor is wrapped as Django wraps its own (execute wrappers,
    query logging and error translation all apply), kept on the connection
    wrapper while the driver connection, the query logging and the settings
    it was made for stay the same. Where :func:`prepares` says so, and
    queries are not being logged (``DEBUG``, ``assertNumQueries``: the log
    shows each statement with its values, which a prepared one does not
    give), it prepares what it runs again (:class:`_PreparingCursor`).
    Every call still does what ``db.cursor()`` does before it opens one:
    the health check, connecting (which refuses in async code and where
    tests block the database) and the thread check. A connection whose
    ``cursor`` is wrapped on the instance (the debug toolbar, a tracer, a
    test forbidding queries) or that threads share gets Django's plain
    cursor each time, closed after use.
    """
    attributes = vars(db)
    if "cursor" in attributes or db.allow_thread_sharing:
        return db.cursor(), False
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    logged = db.queries_logged
    made_for = (db.connection, logged, settings_generation())
    kept = attributes.get("_kumiko_kept_cursor")
    if kept is not None and kept[0] == made_for:
        return kept[1], True
    if not logged and prepares(db):
        cursor = db.make_cursor(_preparing(db))
    else:
        cursor = db.cursor()
    attributes["_kumiko_kept_cursor"] = (made_for, cursor)
    return cursor, True


def _preparing(db: BaseDatabaseWrapper) -> Any:
    """A :class:`_PreparingCursor` on ``db``'s connection, loading instants as Django would.

    Django loads ``timestamptz`` with psycopg's Python loader and then puts
    its own zone on each value. Where that zone is UTC and so is the
    session's, psycopg's compiled loader gives the same values (zone
    ``timezone.utc``) at a fraction of the cost, a few times a claimed row.
    """
    cursor = _PreparingCursor(db.connection)
    if db.timezone is UTC and db.connection.info.parameter_status("TimeZone") == "UTC":
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
    return cursor


def prepares(db: BaseDatabaseWrapper) -> bool:
    """Whether the hot statements are prepared on ``db``'s connection.

    On PostgreSQL through psycopg 3, unless ``PREPARED_STATEMENTS`` is off,
    the database is set up for a transaction-pooling PgBouncer
    (``DISABLE_SERVER_SIDE_CURSORS``, as Django documents for it), which
    could hand a prepared statement's next run to a server connection that
    does not know it, or the engine's tables are distributed (Citus): once
    PostgreSQL settles on a generic plan for an append's ``INSERT ...
    SELECT`` (after five runs, sooner on tables never analysed), Citus
    refuses it ("could not create distributed plan").
    """
    return (
        psycopg is not None
        and isinstance(db.connection, psycopg.Connection)
        and bool(workflow_settings.PREPARED_STATEMENTS)
        and not db.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
        and not distributed()
    )


#: psycopg 3's cursor, where it is installed (a site on SQLite need not have it).
_DriverCursor: Any = object if psycopg is None else psycopg.Cursor


class _PreparingCursor(_DriverCursor):  # type: ignore[misc]  # psycopg.Cursor, or object without it
    """A psycopg cursor that binds on the server and prepares a statement it runs again.

    A statement's first run on a connection is sent as it is; from its
    second on, it is prepared there once (psycopg keeps the names, and
    drops them all after a rollback or DDL) and then only executed, which
    skips the parse and, once PostgreSQL settles on a generic plan after
    five runs, the planning: most of a hot statement's server time. A
    statement run once per connection (a web request's one append on a
    fresh connection) costs no extra round trip.

    psycopg prepares nothing on a connection whose ``prepare_threshold`` is
    None, Django's default (its own cursors bind on the client and never
    prepare): the first of these cursors on such a connection sets it to a
    count no statement reaches, so that still only what these cursors ask
    for is prepared.

    A pooler that does not keep prepared statements with their session
    (PgBouncer before 1.21 in transaction mode) shows itself by refusing
    one: "prepared statement "_pg3_0" already exists" (another client's, on
    the server connection this transaction got) or "... does not exist"
    (ours is on another). The first such refusal on a connection turns
    preparing off on it for good, with one warning per process naming the
    setting; the statement is then sent again unprepared where nothing was
    lost, that is, outside a transaction block. Inside one, the refused
    statement has aborted the transaction, which only a savepoint taken
    before it could have saved, and one before every prepared run would
    cost every site a subtransaction per statement: the error propagates,
    and :func:`lost_prepared_statement` tells it apart, for the engine's
    appends to run again at their own savepoint.
    """

    def __init__(self, connection: Any) -> None:
        if connection.prepare_threshold is None:
            connection.prepare_threshold = _NEVER
        super().__init__(connection)
        self._seen: set[Any] = set()
        self.preparing = True

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, **kwargs: Any
    ) -> Any:
        seen = query in self._seen
        if not seen:
            self._seen.add(query)
        if not self.preparing:
            prepare = False
        elif prepare is None:
            prepare = seen
        if not prepare:
            return super().execute(query, params, prepare=prepare, **kwargs)
        try:
            return super().execute(query, params, prepare=True, **kwargs)
        except _POOLER_REFUSALS as exc:
            self._stop_preparing(exc)
            if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                raise
        return super().execute(query, params, prepare=False, **kwargs)

    def _stop_preparing(self, exc: Exception) -> None:
        global _warned_about_pooler
        self.preparing = False
        if not _warned_about_pooler:
            _warned_about_pooler = True
            logger.warning(
                "the database refused a prepared statement (%s): a pooler in transaction "
                "mode? Nothing more is prepared on this connection; set "
                "KUMIKO_WORKFLOWS['PREPARED_STATEMENTS'] = False (or DATABASES "
                "DISABLE_SERVER_SIDE_CURSORS = True) for such a pooler",
                str(exc).strip(),
            )


#: What a pooler that loses prepared statements makes the server say (see
#: :class:`_PreparingCursor`).
_POOLER_REFUSALS: tuple[type[Exception], ...] = (
    ()
    if psycopg is None
    else (psycopg.errors.DuplicatePreparedStatement, psycopg.errors.InvalidSqlStatementName)
)

#: Whether this process has said once that a pooler refused a prepared statement.
_warned_about_pooler = False


def lost_prepared_statement(exc: BaseException) -> bool:
    """Whether ``exc`` (as Django raised it) is a pooler's refusal of a prepared statement.

    The connection prepares nothing more (:class:`_PreparingCursor`), so
    the work whose transaction (or savepoint) it aborted can run again.
    """
    return isinstance(exc, _POOLER_REFUSALS) or isinstance(exc.__cause__, _POOLER_REFUSALS)


#: A prepare threshold no statement reaches (see :class:`_PreparingCursor`).
_NEVER = 2**62


# --- planned again as the tables grow ------------------------------------------------
#
# PostgreSQL plans a prepared statement once for any values (its generic plan,
# after five runs) and keeps that plan until the statement is dropped or a
# table's definition or statistics change. Where no statistics come (autovacuum
# off, design rule 12), a plan made while the engine's tables held a few rows
# (a new site, a worker started on empty tables) may pick a table scan or an
# index that reads a tenant's every row, cheap then; kept as the tables grow
# to millions of rows, it reads them all at every run. A table that has doubled
# since the connection's statements were prepared has them prepared again
# (``DEALLOCATE ALL``, which psycopg follows): they are planned for the
# tables' size now, at most once per doubling.

#: The tables whose growth changes the hot statements' plans.
_TABLES = (Event, WorkflowRun, WorkflowRunPending)
#: Below this size (bytes) a table counts as this size: a few rows' growth never replans.
_SMALL = 10 * 8192

#: Per connection (Django's, one a thread): its driver connection, and the tables' sizes
#: when that one's plans were made.
_PLANNED_AT: weakref.WeakKeyDictionary[BaseDatabaseWrapper, tuple[Any, tuple[int, ...]]] = (
    weakref.WeakKeyDictionary()
)


def replan_if_grown(*, every: float | None = None) -> bool:
    """Drop the engine connection's prepared statements if a table has doubled since they
    were made (see the comment above); whether it did. One catalog read a call; with
    ``every`` (seconds), none if the last call in this process was more recent."""
    global _checked
    if every is not None and time.monotonic() - _checked < every:
        return False
    _checked = time.monotonic()
    db = engine()
    if db.queries_logged or not prepares(db):
        return False  # nothing is prepared while queries are logged (_kept_cursor)
    tables = [db.ops.quote_name(model._meta.db_table) for model in _TABLES]
    with db.cursor() as cursor:
        cursor.execute(
            "SELECT " + ", ".join(["pg_relation_size(%s::regclass)"] * len(tables)), tables
        )
        sizes = tuple(int(size) for size in cursor.fetchone())
        planned = _PLANNED_AT.get(db)
        if planned is not None and planned[0] is db.connection:
            then = planned[1]
            if not any(now >= 2 * max(was, _SMALL) for now, was in zip(sizes, then, strict=True)):
                return False
            cursor.execute("DEALLOCATE ALL")  # psycopg forgets its names with them
            grown = True
        else:
            grown = False  # a connection first seen: its statements are planned from now on
    _PLANNED_AT[db] = (db.connection, sizes)
    return grown


#: When :func:`replan_if_grown` last read the sizes (``time.monotonic()``).
_checked = float("-inf")
