"""Claiming due pending rows: the worker's hottest statement, and which tenants have due rows.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

from django.db.backends.utils import CursorWrapper

from kumiko_workflows.models import (
    Event,
    WorkflowRunPending,
)
from kumiko_workflows.store.cursors import hot_cursor
from kumiko_workflows.store.db import chains_writes, engine
from kumiko_workflows.store.statement_cache import _instance_of, statement

#: The workflows a worker claims runs of (None: every workflow): ``resume_due_runs
#: --queue`` limits a worker to some task queues' workflows (kumiko_workflows.tasks).
claim_only: ContextVar[tuple[str, ...] | None] = ContextVar("kumiko_claim_only", default=None)


@contextmanager
def claiming_only(workflow_names: Sequence[str] | None) -> Iterator[None]:
    """Claim only runs of ``workflow_names`` inside the block (None: every workflow)."""
    token = claim_only.set(None if workflow_names is None else tuple(sorted(workflow_names)))
    try:
        yield
    finally:
        claim_only.reset(token)


def claim_due(
    tenant_id: str, now: datetime, passed_over: set[int], leaving: Collection[str] = ()
) -> tuple[WorkflowRunPending, Event | None] | None:
    """Take the tenant's next due pending row that nobody holds (oldest first), or None.

    The row is deleted as it is taken (a resume ends its suspension) and
    returned with its run's trigger event (None if that event is gone): on
    PostgreSQL one statement, the worker's hottest, locking the row with
    ``FOR UPDATE SKIP LOCKED`` so racing workers never take the same one; on
    SQLite, whose one writer at a time needs no lock, a read and a delete.
    Built once per shape (no ORM compilation per claim). ``passed_over``
    rows (errors in this pass) are not taken again, nor rows of the
    ``leaving`` definitions (newer code than this process's: see
    :mod:`kumiko_workflows.engine.deploys`).
    """
    skip = sorted(passed_over)
    foreign = sorted(leaving)
    only = claim_only.get() or ()
    pending, event = WorkflowRunPending._meta, Event._meta
    width = len(pending.concrete_fields)
    chained = chains_writes()

    def build() -> str:
        ops = engine().ops
        table = ops.quote_name(pending.db_table)
        pending_fields, event_fields = pending.concrete_fields, event.concrete_fields
        row_columns = ", ".join(f"c.{ops.quote_name(str(f.column))}" for f in pending_fields)
        returned = ", ".join(ops.quote_name(str(f.column)) for f in pending_fields)
        event_columns = ", ".join(f"e.{ops.quote_name(str(f.column))}" for f in event_fields)
        alias = "" if chained else "c."
        where = f"{alias}tenant_id = %s AND {alias}wake_at <= %s"
        if skip:
            where += f" AND {alias}id NOT IN ({', '.join(['%s'] * len(skip))})"
        if foreign:
            marks = ", ".join(["%s"] * len(foreign))
            where += f" AND {alias}definition_fingerprint NOT IN ({marks})"
        if only:
            where += f" AND {alias}workflow_name IN ({', '.join(['%s'] * len(only))})"
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

    sql = statement(("claim_due", len(skip), len(foreign), len(only)), build)
    with hot_cursor() as cursor:
        if not chained:
            _take_write_lock(cursor)
        cursor.execute(sql, [tenant_id, now, *skip, *foreign, *only])
        found = cursor.fetchone()
        if found is not None and not chained:
            delete = statement(
                ("claim_due_delete",),
                lambda: (
                    f"DELETE FROM {engine().ops.quote_name(pending.db_table)} "  # noqa: S608
                    "WHERE id = %s"
                ),
            )
            cursor.execute(delete, [found[0]])
    if found is None:
        return None
    row = _instance_of(WorkflowRunPending, found[:width])
    trigger = None if found[width] is None else _instance_of(Event, found[width:])
    return row, trigger


def _take_write_lock(cursor: CursorWrapper) -> None:
    """Take SQLite's write lock now, with a write that touches no row.

    A transaction that reads first and writes later cannot wait for the lock
    another process's write holds: SQLite fails it at once with "database is
    locked" (waiting could deadlock). Taking the lock first waits instead,
    up to the connection's ``timeout``. (Once it is held, this is a no-op.)
    """
    cursor.execute(
        statement(
            ("write_lock",),
            lambda: (
                f"DELETE FROM {engine().ops.quote_name(WorkflowRunPending._meta.db_table)} "  # noqa: S608
                "WHERE id = -1"
            ),
        )
    )


def due_tenants(now: datetime) -> list[str]:
    """Tenants that have at least one due row: :func:`due_backlog`, each counted up to 1."""
    return [tenant for tenant, due in due_backlog(now, 1) if due]


def due_backlog(now: datetime, cap: int) -> list[tuple[str, int]]:
    """Due pending rows per tenant that has pending rows, each counted up to ``cap``.

    A loose index scan on ``kw_pending_due`` (tenant_id, wake_at) finds the
    tenants, one index probe each however many rows they have; each tenant's
    count reads only its due range of the index, never its rows due later.
    The worker asks which tenants have due rows (``cap`` 1); the due-backlog
    gauge (:mod:`kumiko_workflows.telemetry`) how many.
    """

    def build() -> str:
        table = engine().ops.quote_name(WorkflowRunPending._meta.db_table)
        return f"""
            WITH RECURSIVE tenants(tenant_id) AS (
                SELECT MIN(tenant_id) FROM {table}
                UNION ALL
                SELECT (SELECT MIN(p.tenant_id) FROM {table} p WHERE p.tenant_id > t.tenant_id)
                FROM tenants t WHERE t.tenant_id IS NOT NULL
            )
            SELECT t.tenant_id, (
                SELECT COUNT(*) FROM (
                    SELECT 1 FROM {table} d
                    WHERE d.tenant_id = t.tenant_id AND d.wake_at <= %s LIMIT %s
                ) due
            )
            FROM tenants t WHERE t.tenant_id IS NOT NULL
        """  # noqa: S608 - the table name comes from the model; values are parameters

    with engine().cursor() as cursor:
        cursor.execute(statement(("due_backlog",), build), [now, cap])
        return [(tenant, int(count)) for tenant, count in cursor.fetchall()]
