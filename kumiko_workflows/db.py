"""Statements the ORM cannot say well, and the differences between databases.

Capability flags here stand for the databases' differences, so engine code
asks "can writers overlap?" instead of naming a vendor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.db import connection

from kumiko_workflows.models import Event, WorkflowRunPending, WorkflowWaitKey


def overlapping_writers() -> bool:
    """Whether two transactions can write at once (PostgreSQL), or one at a time (SQLite).

    With one writer at a time, a transaction sees every committed row and no
    other write can be in flight: a wake-up decided inside it is final.
    """
    return connection.vendor != "sqlite"


def has_payload_containment() -> bool:
    """Whether ``payload @> {...}`` is served by an index (PostgreSQL's GIN)."""
    return connection.vendor == "postgresql"


def chains_writes() -> bool:
    """Whether one statement can chain writes (a data-modifying ``WITH``: PostgreSQL)."""
    return connection.vendor == "postgresql"


def wait_paths(tenant_id: str, event_type: str) -> list[str]:
    """The distinct payload paths waits of the tenant use for ``event_type``.

    A loose index scan over ``kw_waitkey_lookup``: one index probe per
    distinct path, however many runs wait.
    """
    table = connection.ops.quote_name(WorkflowWaitKey._meta.db_table)
    sql = f"""
        WITH RECURSIVE paths(path) AS (
            SELECT MIN(path) FROM {table} WHERE tenant_id = %s AND event_type = %s
            UNION ALL
            SELECT (
                SELECT MIN(k.path) FROM {table} k
                WHERE k.tenant_id = %s AND k.event_type = %s AND k.path > p.path
            )
            FROM paths p WHERE p.path IS NOT NULL
        )
        SELECT path FROM paths WHERE path IS NOT NULL
    """  # noqa: S608 - the table name comes from the model; values are parameters
    params: list[Any] = [tenant_id, event_type, tenant_id, event_type]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [path for (path,) in cursor.fetchall()]


_SQL: dict[tuple[Any, ...], str] = {}


def statement(key: tuple[Any, ...], build: Callable[[], str]) -> str:
    """The statement ``build`` makes for ``key``, built once per key and database vendor."""
    full = (connection.vendor, *key)
    sql = _SQL.get(full)
    if sql is None:
        sql = _SQL[full] = build()
    return sql


def _rows_of(model: type[Any], values: Sequence[Any]) -> Any:
    """An instance of ``model`` from its concrete columns' raw values, as the ORM would load it.

    The converters (JSON text to objects, SQLite's timestamps, ...) are the
    ones a query's compiler would apply, found once per model and vendor.
    """
    fields = model._meta.concrete_fields
    key = ("converters", model._meta.label)
    converters = _CONVERTERS.get((connection.vendor, *key))
    if converters is None:
        converters = []
        for field in fields:
            col = field.get_col(model._meta.db_table)
            found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            converters.append((col, found))
        _CONVERTERS[(connection.vendor, *key)] = converters
    row = list(values)
    for index, (col, found) in enumerate(converters):
        for convert in found:
            row[index] = convert(row[index], col, connection)
    return model.from_db(connection.alias, None, row)


_CONVERTERS: dict[tuple[Any, ...], list[tuple[Any, list[Any]]]] = {}


def claim_due(
    tenant_id: str, now: datetime, passed_over: set[int]
) -> tuple[WorkflowRunPending, Event | None] | None:
    """Take the tenant's next due pending row that nobody holds (oldest first), or None.

    The row is deleted as it is taken (a resume ends its suspension) and
    returned with its run's trigger event (None if that event is gone): on
    PostgreSQL one statement, the worker's hottest, locking the row with
    ``FOR UPDATE SKIP LOCKED`` so racing workers never take the same one; on
    SQLite, whose one writer at a time needs no lock, a read and a delete.
    Built once per shape (no ORM compilation per claim). ``passed_over``
    rows (errors in this pass) are not taken again.
    """
    skip = sorted(passed_over)
    pending, event = WorkflowRunPending._meta, Event._meta
    width = len(pending.concrete_fields)
    chained = chains_writes()

    def build() -> str:
        ops = connection.ops
        table = ops.quote_name(pending.db_table)
        pending_fields, event_fields = pending.concrete_fields, event.concrete_fields
        row_columns = ", ".join(f"c.{ops.quote_name(str(f.column))}" for f in pending_fields)
        returned = ", ".join(ops.quote_name(str(f.column)) for f in pending_fields)
        event_columns = ", ".join(f"e.{ops.quote_name(str(f.column))}" for f in event_fields)
        alias = "" if chained else "c."
        where = f"{alias}tenant_id = %s AND {alias}wake_at <= %s"
        if skip:
            where += f" AND {alias}id NOT IN ({', '.join(['%s'] * len(skip))})"
        join = (
            f"LEFT JOIN {ops.quote_name(event.db_table)} e "
            "ON e.id = c.trigger_event_id AND e.tenant_id = c.tenant_id"
        )
        if chained:
            return (
                f"WITH c AS (DELETE FROM {table} WHERE id = ("  # noqa: S608 - identifiers
                f"SELECT id FROM {table} WHERE {where} ORDER BY wake_at, id LIMIT 1 "
                f"FOR UPDATE SKIP LOCKED) RETURNING {returned}) "
                f"SELECT {row_columns}, {event_columns} FROM c {join}"
            )
        return (
            f"SELECT {row_columns}, {event_columns} FROM {table} c {join} "  # noqa: S608
            f"WHERE {where} ORDER BY c.wake_at, c.id LIMIT 1"
        )

    sql = statement(("claim_due", len(skip)), build)
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant_id, now, *skip])
        found = cursor.fetchone()
        if found is not None and not chained:
            delete = statement(
                ("claim_due_delete",),
                lambda: f"DELETE FROM {connection.ops.quote_name(pending.db_table)} "  # noqa: S608
                "WHERE id = %s",
            )
            cursor.execute(delete, [found[0]])
    if found is None:
        return None
    row = _rows_of(WorkflowRunPending, found[:width])
    trigger = None if found[width] is None else _rows_of(Event, found[width:])
    return row, trigger
