"""Statements the ORM cannot say well, and the differences between databases.

Capability flags here stand for the databases' differences, so engine code
asks "can writers overlap?" instead of naming a vendor.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connection

from kumiko_workflows.models import WorkflowRunPending, WorkflowWaitKey


def overlapping_writers() -> bool:
    """Whether two transactions can write at once (PostgreSQL), or one at a time (SQLite).

    With one writer at a time, a transaction sees every committed row and no
    other write can be in flight: a wake-up decided inside it is final.
    """
    return connection.vendor != "sqlite"


def has_payload_containment() -> bool:
    """Whether ``payload @> {...}`` is served by an index (PostgreSQL's GIN)."""
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


def claim_due(tenant_id: str, now: datetime, passed_over: set[int]) -> WorkflowRunPending | None:
    """Lock the tenant's next due pending row that nobody holds (oldest first), or None.

    A statement built once per shape (no ORM compilation per claim): the
    worker's hottest query.
    ``passed_over`` rows (lost races, errors in this pass) are not taken again.
    """
    skip = sorted(passed_over)
    model = WorkflowRunPending
    columns = [str(field.column) for field in model._meta.concrete_fields]

    def build() -> str:
        ops = connection.ops
        where = f"{ops.quote_name('tenant_id')} = %s AND {ops.quote_name('wake_at')} <= %s"
        if skip:
            where += f" AND {ops.quote_name('id')} NOT IN ({', '.join(['%s'] * len(skip))})"
        lock = (
            " FOR UPDATE SKIP LOCKED"
            if connection.features.has_select_for_update_skip_locked
            else ""
        )
        selected = ", ".join(ops.quote_name(column) for column in columns)
        order = f"{ops.quote_name('wake_at')}, {ops.quote_name('id')}"
        return (
            f"SELECT {selected} FROM {ops.quote_name(model._meta.db_table)} "  # noqa: S608
            f"WHERE {where} ORDER BY {order} LIMIT 1{lock}"
        )

    sql = statement(("claim_due", len(skip)), build)
    return next(iter(model.objects.raw(sql, [tenant_id, now, *skip])), None)
