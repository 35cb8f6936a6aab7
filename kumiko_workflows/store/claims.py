"""Claiming due pending rows: the worker's hottest statement, and which tenants have due rows."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.backends.utils import CursorWrapper

from kumiko_workflows.models import (
    Event,
    WorkflowRunPending,
)
from kumiko_workflows.store.cursors import hot_cursor
from kumiko_workflows.store.db import chains_writes, engine
from kumiko_workflows.store.distribution import distributed
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
    """Take the tenant's next due pending row nobody holds (earliest claim instant), or None.

    The row is deleted as it is taken (a resume ends its suspension) and
    returned with its run's trigger event (None if that event is gone): on
    PostgreSQL one statement, the worker's hottest, locking the row with
    ``FOR UPDATE SKIP LOCKED`` so racing workers never take the same one; on
    SQLite, whose one writer at a time needs no lock, a read and a delete.
    Built once per shape (no ORM compilation per claim). ``passed_over``
    rows (errors in this pass) are not taken again, nor rows of the
    ``leaving`` definitions (newer code than this process's: see
    :mod:`kumiko_workflows.engine.deploys`).

    Due rows are taken in the order of their claim instant (``claim_at``:
    the due time less the priority's head start, see
    :mod:`kumiko_workflows.workflow.priorities`), scanning ``kw_pending_claim``
    up to ``now``. Only when no row is due by that order, rows whose claim
    instant is still ahead (held back by a negative priority, or written
    without one) are taken, oldest due first: a held-back row waits for
    other due work, never for an idle worker.
    """
    shape, rest = _filters(passed_over, leaving)
    chained = chains_writes()
    ordered = statement(("claim_due", *shape), lambda: _build_claim(False, shape, chained))

    def bound(params: list[Any]) -> list[Any]:
        # Chained, the DELETE and the join name the tenant too (one shard's).
        return [tenant_id, *params, tenant_id] if chained else params

    with hot_cursor() as cursor:
        if not chained:
            _take_write_lock(cursor)
        cursor.execute(ordered, bound([tenant_id, now, now, *rest]))
        found = cursor.fetchone()
        if found is None:
            held = statement(("claim_due_held", *shape), lambda: _build_claim(True, shape, chained))
            cursor.execute(held, bound([tenant_id, now, *rest]))
            found = cursor.fetchone()
        if found is not None and not chained:
            delete = statement(
                ("claim_due_delete",),
                lambda: (
                    f"DELETE FROM {engine().ops.quote_name(WorkflowRunPending._meta.db_table)} "  # noqa: S608
                    "WHERE id = %s"
                ),
            )
            cursor.execute(delete, [found[0]])
    if found is None:
        return None
    return claimed_row(tenant_id, found)


def _filters(
    passed_over: Collection[int], leaving: Collection[str]
) -> tuple[tuple[int, int, int], list[Any]]:
    """A claim's shape (rows passed over, definitions leaving, workflows claimed only) and
    the parameters of those filters, in :func:`_claim_parts`'s order."""
    skip, foreign, only = sorted(passed_over), sorted(leaving), claim_only.get() or ()
    return (len(skip), len(foreign), len(only)), [*skip, *foreign, *only]


def claimed_row(tenant_id: str, found: Sequence[Any]) -> tuple[WorkflowRunPending, Event | None]:
    """The pending row and trigger event of a claim's returned columns."""
    width = len(WorkflowRunPending._meta.concrete_fields)
    row = _instance_of(WorkflowRunPending, found[:width])
    trigger = None if found[width] is None else _instance_of(Event, found[width:])
    if trigger is None and row.trigger_event_id is not None:
        # The row may have been taken in the version a transaction that
        # committed during the statement wrote (a debounced trigger moving
        # the row to its new event): the lock returns that version, the
        # join reads the statement's older snapshot. Read the event again.
        trigger = Event.objects.filter(tenant_id=tenant_id, pk=row.trigger_event_id).first()
    return row, trigger


def _claim_parts(
    held: bool, shape: tuple[int, int, int], chained: bool, many: bool = False
) -> tuple[str, str]:
    """The claim's ``DELETE … RETURNING`` (chained) or ``SELECT`` (not), and its select list.

    Chained: (the ``DELETE`` of the row, to be named ``c`` in a ``WITH``;
    the select list and join reading it). Not chained: (the whole ``SELECT``, "").
    ``many`` (chained only): the ``DELETE`` takes up to a number of rows, a
    parameter after the others of its ``WHERE``.
    """
    ops = engine().ops
    pending, event = WorkflowRunPending._meta, Event._meta
    table = ops.quote_name(pending.db_table)
    row_columns = ", ".join(f"c.{ops.quote_name(str(f.column))}" for f in pending.concrete_fields)
    returned = ", ".join(ops.quote_name(str(f.column)) for f in pending.concrete_fields)
    event_columns = ", ".join(f"e.{ops.quote_name(str(f.column))}" for f in event.concrete_fields)
    alias = "" if chained else "c."
    # In turn: the claim instant's order, due rows only; then the due rows
    # the claim instant holds back (see claim_due).
    order = f"{alias}wake_at, {alias}id" if held else f"{alias}claim_at, {alias}id"
    where = f"{alias}tenant_id = %s AND {alias}wake_at <= %s"
    if not held:
        where = f"{alias}tenant_id = %s AND {alias}claim_at <= %s AND {alias}wake_at <= %s"
    skip, foreign, only = shape
    if skip:
        where += f" AND {alias}id NOT IN ({', '.join(['%s'] * skip)})"
    if foreign:
        where += f" AND {alias}definition_fingerprint NOT IN ({', '.join(['%s'] * foreign)})"
    if only:
        where += f" AND {alias}workflow_name IN ({', '.join(['%s'] * only)})"
    if chained:
        # Every table named with the tenant as a value, the DELETE's too:
        # one shard's statement on Citus (its planner routes a statement
        # by the distribution column's values, not by a join's).
        join = (
            f"LEFT JOIN {ops.quote_name(event.db_table)} e "
            "ON e.id = c.trigger_event_id AND e.tenant_id = %s"
        )
        taken = "id = ANY(ARRAY(" if many else "id = ("
        delete = (
            f"DELETE FROM {table} WHERE tenant_id = %s AND {taken}"  # noqa: S608
            f"SELECT id FROM {table} WHERE {where} ORDER BY {order} "
            f"LIMIT {'%s' if many else '1'} FOR UPDATE SKIP LOCKED){')' if many else ''} "
            f"RETURNING {returned}"
        )
        return delete, f"{row_columns}, {event_columns} FROM c {join}"
    join = (
        f"LEFT JOIN {ops.quote_name(event.db_table)} e "
        "ON e.id = c.trigger_event_id AND e.tenant_id = c.tenant_id"
    )
    select = (
        f"SELECT {row_columns}, {event_columns} FROM {table} c {join} "  # noqa: S608
        f"WHERE {where} ORDER BY {order} LIMIT 1"
    )
    return select, ""


def claim_batch(
    tenant_id: str, now: datetime, count: int, passed_over: set[int], leaving: Collection[str] = ()
) -> list[tuple[WorkflowRunPending, Event | None]]:
    """Take up to ``count`` of the tenant's due rows in one statement, in :func:`claim_due`'s order.

    Where the database chains writes (PostgreSQL) only: the rows a worker
    batch resumes, claimed at its start (see
    :func:`kumiko_workflows.engine.resume._drain_tenant`). The rows held back
    by their claim instant are left to :func:`claim_due`, which the batch
    falls back to once these are resumed.
    """
    assert chains_writes(), "a batch's claim is one statement where writes chain"
    shape, rest = _filters(passed_over, leaving)

    def build() -> str:
        delete, rest = _claim_parts(False, shape, True, many=True)
        # Both parts are statements of identifiers and placeholders (_claim_parts).
        return "WITH c AS (" + delete + ") SELECT " + rest + " ORDER BY c.claim_at, c.id"

    sql = statement(("claim_batch", *shape), build)
    params = [tenant_id, tenant_id, now, now, *rest, count, tenant_id]
    with hot_cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    return [claimed_row(tenant_id, row) for row in found]


def _build_claim(held: bool, shape: tuple[int, int, int], chained: bool) -> str:
    first, rest = _claim_parts(held, shape, chained)
    # Both parts are statements of identifiers and placeholders (_claim_parts).
    return "WITH c AS (" + first + ") SELECT " + rest if chained else first


@dataclass
class NextClaim:
    """A worker's wish to claim a batch's next row in the statement that ends a run's segment.

    Set (:data:`next_claim`) around one run's resume inside a batch working
    row by row (not claimed together: see :func:`claim_batch`); the
    engine's two-event append that ends that run's segment
    (:mod:`kumiko_workflows.store.event_pairs`) adds the claim of the next
    due row to its statement, if ``wanted()`` still says so then, and leaves
    it in ``found``: a round trip fewer per run, and the row is still taken
    only when the run before it is done (a slow step holds no row it has not
    reached). The claim is the ordered probe of :func:`claim_due` alone: when
    it finds nothing, ``found`` stays None and the worker claims as usual.
    """

    run_id: Any
    tenant_id: str
    due: datetime
    passed_over: Collection[int]
    leaving: Collection[str]
    wanted: Callable[[], bool]
    asked: bool = False
    found: tuple[WorkflowRunPending, Event | None] | None = None

    def parts(self) -> tuple[str, str, list[Any], list[Any]]:
        """(the ``DELETE``, its select list, their parameters): see :func:`_claim_parts`."""
        shape, rest_params = _filters(self.passed_over, self.leaving)
        delete = statement(("claim_next", *shape), lambda: _claim_parts(False, shape, True)[0])
        rest = statement(("claim_next_rest", *shape), lambda: _claim_parts(False, shape, True)[1])
        due = self.due
        return (
            delete,
            rest,
            [self.tenant_id, self.tenant_id, due, due, *rest_params],
            [self.tenant_id],
        )


#: The claim a worker wants to ride in the statement that ends the running resume.
next_claim: ContextVar[NextClaim | None] = ContextVar("kumiko_next_claim", default=None)


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
    gauge (:mod:`kumiko_workflows.telemetry`) how many. Distributed (Citus),
    the same scan runs in each shard (:func:`_due_backlog_per_shard`).
    """
    if distributed():
        return _due_backlog_distributed(now, cap)

    with engine().cursor() as cursor:
        cursor.execute(statement(("due_backlog",), lambda: _backlog_sql(False)), [now, cap])
        return [(tenant, int(count)) for tenant, count in cursor.fetchall()]


def _backlog_sql(per_shard: bool) -> str:
    """The backlog's loose index scan: over the table, or as the command run in each shard.

    In a shard's command the table is the shard's (``%1$s``, which
    ``run_command_on_shards`` fills in) and the instant and the cap are
    ``:now`` and ``:cap`` (which the server replaces by the quoted values);
    its tenants come back as one JSON array.
    """
    table = "%1$s" if per_shard else engine().ops.quote_name(WorkflowRunPending._meta.db_table)
    now = ":now::timestamptz" if per_shard else "%s"
    cap = ":cap" if per_shard else "%s"
    scan = f"""
            WITH RECURSIVE tenants(tenant_id) AS (
                SELECT MIN(tenant_id) FROM {table}
                UNION ALL
                SELECT (SELECT MIN(p.tenant_id) FROM {table} p WHERE p.tenant_id > t.tenant_id)
                FROM tenants t WHERE t.tenant_id IS NOT NULL
            )
            SELECT t.tenant_id, (
                SELECT COUNT(*) FROM (
                    SELECT 1 FROM {table} d
                    WHERE d.tenant_id = t.tenant_id AND d.wake_at <= {now} LIMIT {cap}
                ) due
            )
            FROM tenants t WHERE t.tenant_id IS NOT NULL
        """  # noqa: S608 - the table name comes from the model; values are parameters
    if not per_shard:
        return scan
    return (
        "WITH backlog(tenant_id, due) AS ("  # noqa: S608 - the scan above, no value
        + scan
        + ") SELECT COALESCE(json_agg(json_build_array(tenant_id, due)), '[]') FROM backlog"
    )


def _due_backlog_grouped(now: datetime, cap: int) -> list[tuple[str, int]]:
    """:func:`due_backlog` as one grouped count (Citus pushes it down to each shard)."""

    def build() -> str:
        table = engine().ops.quote_name(WorkflowRunPending._meta.db_table)
        return (
            "SELECT tenant_id, LEAST(COUNT(*) FILTER (WHERE wake_at <= %s), %s) "  # noqa: S608
            f"FROM {table} GROUP BY tenant_id ORDER BY tenant_id"
        )

    with engine().cursor() as cursor:
        cursor.execute(statement(("due_backlog_grouped",), build), [now, cap])
        return [(tenant, int(count)) for tenant, count in cursor.fetchall()]


def _due_backlog_distributed(now: datetime, cap: int) -> list[tuple[str, int]]:
    """:func:`due_backlog` on distributed tables (Citus): the same scan in every shard.

    Citus refuses a recursive query over a distributed table unless it
    names one shard, so the loose index scan runs in each shard of the
    pending table (``run_command_on_shards``, in parallel, each returning
    its tenants as JSON); a tenant lives in one shard, so nothing is
    counted twice. The instant and the cap are parameters, quoted into the
    command by the server (``quote_literal``), as it sends the command on.

    ``run_command_on_shards`` works on connections of its own, which cannot
    see what the caller's open transaction wrote: inside one, a grouped
    count that Citus pushes down to every shard answers instead (it reads
    each pending row, not only the due range).
    """
    if engine().in_atomic_block:
        return _due_backlog_grouped(now, cap)
    command = statement(("due_backlog_per_shard",), lambda: _backlog_sql(True))
    table = WorkflowRunPending._meta.db_table
    rows: list[tuple[str, int]] = []
    with engine().cursor() as cursor:
        cursor.execute(
            "SELECT success, result FROM run_command_on_shards(%s::regclass, "
            "replace(replace(%s, ':now', quote_literal(%s::timestamptz)), ':cap', %s::int::text))",
            [table, command, now, cap],
        )
        for success, result in cursor.fetchall():
            if not success:
                raise RuntimeError(f"the due backlog could not be read from a shard: {result}")
            rows.extend((str(tenant), int(due)) for tenant, due in json.loads(result))
    return sorted(rows)
