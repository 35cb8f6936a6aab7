"""The awaited events' wake-up checks: left with one statement, settled together after commit.

An awaited event leaves a :class:`~kumiko_workflows.models.WakeCheck` in its
transaction (see :mod:`kumiko_workflows.engine.wakeups`). The statements here
leave it (on its own, or chained to the event's insert) and say at the same
time what may wait for the event; after commit they settle a transaction's
checks that nothing can be waiting on, in one statement (PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kumiko_workflows.models import SuspensionType, WakeCheck, WorkflowRunPending, WorkflowWaitKey
from kumiko_workflows.store.appends import _build_insert
from kumiko_workflows.store.cursors import hot_cursor
from kumiko_workflows.store.db import engine
from kumiko_workflows.store.statement_cache import statement


def wait_paths_cte(ops: Any) -> str:
    """The loose index scan of :func:`~kumiko_workflows.store.statements.wait_paths`, as the
    recursive ``WITH`` query ``paths``."""
    table = ops.quote_name(WorkflowWaitKey._meta.db_table)
    return f"""paths(path) AS (
            SELECT (
                SELECT k.path FROM {table} k WHERE k.tenant_id = %s AND k.event_type = %s
                ORDER BY k.path LIMIT 1
            )
            UNION ALL
            SELECT (
                SELECT k.path FROM {table} k
                WHERE k.tenant_id = %s AND k.event_type = %s AND k.path > p.path
                ORDER BY k.path LIMIT 1
            )
            FROM paths p WHERE p.path IS NOT NULL
        )"""  # noqa: S608 - the table name comes from the model; values are parameters


def _scanned_waits(ops: Any, given: bool) -> str:
    """SQL true where a scanned wait (a match requiring no equality) waits for the type.

    The tenant and the type: the ``given`` CTE's columns, or two parameters.
    """
    table = ops.quote_name(WorkflowRunPending._meta.db_table)
    tenant = "g.tenant_id" if given else "%s"
    event_type = "g.type" if given else "%s"
    return (
        f"EXISTS (SELECT 1 FROM {table} s WHERE s.tenant_id = {tenant} "  # noqa: S608
        f"AND s.match_scan AND s.wait_event_type = {event_type} "
        "AND s.suspension_type = %s AND s.awaited_event_id IS NULL)"
    )


def _check_sql(shape: str | None) -> str:
    """The statement that leaves an awaited event's check: see :func:`record_event_check`.

    ``shape``: the event's insert's (:func:`_build_insert`), chained first;
    the check is then made only if the event was written, and the
    statement returns the event's (id, version) before the rest, or no row.
    """
    ops = engine().ops
    columns = (
        f"INSERT INTO {ops.quote_name(WakeCheck._meta.db_table)} "
        "(tenant_id, event_id, created_at, attempts)"
    )
    if shape is None:
        source, made, head = "", f"{columns} VALUES (%s, %s, %s, 0)", ""
    else:
        source = f"ins AS ({_build_insert(shape)}), "
        made = f"{columns} SELECT %s, ins.id, %s, 0 FROM ins"  # noqa: S608 - identifiers
        head = "ins.id, ins.version, "
    return (
        f"WITH RECURSIVE {wait_paths_cte(ops)}, {source}"  # noqa: S608 - identifiers
        f"made AS ({made} RETURNING id) "
        f"SELECT {head}(SELECT id FROM made), {_scanned_waits(ops, False)}, "
        "ARRAY(SELECT path FROM paths WHERE path IS NOT NULL ORDER BY path)"
        + (" FROM ins" if shape is not None else "")
    )


def _check_params(tenant_id: str, event_type: str, middle: Sequence[Any]) -> list[Any]:
    """:func:`_check_sql`'s parameters: the wait paths', ``middle``, the scanned waits'."""
    return [
        tenant_id,
        event_type,
        tenant_id,
        event_type,
        *middle,
        tenant_id,
        event_type,
        SuspensionType.EVENT.value,
    ]


def record_event_check(
    tenant_id: str, event_id: int, event_type: str, created_at: datetime
) -> tuple[int, list[str], bool]:
    """Leave the awaited event's wake-up check and say what may wait for it (PostgreSQL).

    One prepared statement: it inserts the :class:`WakeCheck` and returns
    its id with the distinct payload paths the tenant's waits for
    ``event_type`` use (the loose index scan of
    :func:`~kumiko_workflows.store.statements.wait_paths`) and whether a
    scanned wait (a match requiring no equality) waits for it.
    No path and no scanned wait: nothing in this transaction's view can be
    woken by the event. (Where the wake-up is the event type's only
    projection, :func:`insert_checked_sql` makes this part of the insert.)
    """
    sql = statement(("record_event_check",), lambda: _check_sql(None))
    params = _check_params(tenant_id, event_type, [tenant_id, event_id, created_at])
    with hot_cursor() as cursor:
        cursor.execute(sql, params)
        check_id, scanned, paths = cursor.fetchone()
    return check_id, list(paths), bool(scanned)


def insert_checked_sql(shape: str) -> str:
    """The append's INSERT for ``shape`` with its wake-up check chained (PostgreSQL).

    :func:`record_event_check` in the same statement as the event's insert:
    returns the event's (id, version) followed by what that returns, or no
    row (the version was taken; no check is made). Its parameters are
    :func:`checked_params`. An awaited append with no run waiting is then
    one statement, as a plain one is.
    """
    return statement(("insert_checked", shape), lambda: _check_sql(shape))


def checked_params(params: list[Any], tenant_id: str, event_type: str) -> list[Any]:
    """The parameters of :func:`insert_checked_sql` around the insert's ``params``."""
    return _check_params(tenant_id, event_type, [*params, tenant_id, datetime.now(UTC)])


def settle_quiet_checks(checks: Sequence[tuple[int, str, str]]) -> set[int]:
    """Delete the awaited events' checks nothing can be waiting on now; their ids (PostgreSQL).

    ``checks`` are (check id, tenant, event type) of events whose
    transaction has committed. A check whose tenant has no wait key and no
    scanned wait for the event's type, in this statement's snapshot, is
    settled: a run that suspends on such a wait from now on commits after
    the event did, and the look-back its own check makes after its commit
    finds the event. One prepared statement for all of a transaction's
    checks, in autocommit; a check another process holds (deciding it) is
    left to that process. The rest are for :func:`decide_checks`.

    The statement commits asynchronously (``synchronous_commit`` off for
    its own transaction): it waits for no WAL flush, the cost of a second
    commit an awaited append would otherwise pay. A server crash may undo
    the deletion; the check is then decided again by a worker pass, which
    finds nothing to wake.
    """

    def build() -> str:
        ops = engine().ops
        table = ops.quote_name(WakeCheck._meta.db_table)
        keys = ops.quote_name(WorkflowWaitKey._meta.db_table)
        return (
            "WITH given(id, tenant_id, type) AS ("  # noqa: S608 - identifiers
            "SELECT u.* FROM unnest(%s::bigint[], %s::text[], %s::text[]) u, "
            "(SELECT set_config('synchronous_commit', 'off', true)) unflushed), "
            "quiet AS (SELECT g.id FROM given g WHERE NOT EXISTS ("
            f"SELECT 1 FROM {keys} k WHERE k.tenant_id = g.tenant_id AND k.event_type = g.type) "
            f"AND NOT {_scanned_waits(ops, True)}), "
            f"free AS (SELECT c.id FROM {table} c WHERE c.id IN (SELECT id FROM quiet) "
            "FOR UPDATE SKIP LOCKED) "
            f"DELETE FROM {table} c USING free f WHERE c.id = f.id RETURNING c.id"
        )

    ids = [check for check, _tenant, _type in checks]
    tenants = [tenant for _check, tenant, _type in checks]
    types = [type_ for _check, _tenant, type_ in checks]
    with hot_cursor() as cursor:
        cursor.execute(
            statement(("settle_quiet_checks",), build),
            [ids, tenants, types, SuspensionType.EVENT.value],
        )
        return {check for (check,) in cursor.fetchall()}
