"""The flow-control statements: concurrency slots taken and queued for, rate slots, held-back runs.

Every statement of :mod:`kumiko_workflows.engine.limits` (and the counts
that :mod:`kumiko_workflows.operations.limits` and the queued-runs gauge
read): slot rows locked ``FOR UPDATE SKIP LOCKED`` where writers overlap
(PostgreSQL), without locks on SQLite's one writer at a time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, F

from kumiko_workflows.models import LimitSlot, RateSlot, WorkflowRun, WorkflowRunPending
from kumiko_workflows.store.cursors import hot_cursor
from kumiko_workflows.store.db import engine, overlapping_writers


def ensure_slots(
    model: type[Any], tenant_id: str, workflow_name: str, key: str, count: int
) -> None:
    """Make the slot rows ``-1`` (the queue lock) to ``count - 1`` of one key, where missing.

    ``ON CONFLICT DO NOTHING``: rows already there (committed) are left as
    they are, without waiting for anyone's lock on them. Nothing is written
    when the key has them all (one index range counted).
    """
    column = "limit_key" if model is LimitSlot else "rate_key"
    have = model.objects.filter(
        tenant_id=tenant_id, workflow_name=workflow_name, **{column: key}, slot__lt=count
    ).count()
    if have >= count + 1:
        return
    table = engine().ops.quote_name(model._meta.db_table)
    slots = list(range(-1, count))
    with engine().cursor() as cursor:
        for start in range(0, len(slots), 500):  # within every database's parameter limit
            chunk = slots[start : start + 500]
            values = ", ".join(["(%s, %s, %s, %s)"] * len(chunk))
            sql = (
                f"INSERT INTO {table} (tenant_id, workflow_name, {column}, slot) "  # noqa: S608
                f"VALUES {values} ON CONFLICT (tenant_id, workflow_name, {column}, slot) "
                "DO NOTHING"
            )
            params: list[Any] = []
            for slot in chunk:
                params += [tenant_id, workflow_name, key, slot]
            cursor.execute(sql, params)


def take_limit_slot(
    tenant_id: str, workflow_name: str, key: str, most: int, *, free_only: bool
) -> int | None:
    """Lock a slot below ``most`` of the key that nobody holds nor locks; its number, or None.

    ``FOR UPDATE SKIP LOCKED``: a slot another transaction locks (a segment
    running under ``holds="executing"``, or a run taking or releasing it)
    is passed over, never waited for; the lock lasts until this transaction
    ends, so a crashed worker's slot comes back with its rollback.
    ``free_only`` (``holds="active"``) also passes over slots whose holder
    is recorded. Lowest number first.
    """
    table = engine().ops.quote_name(LimitSlot._meta.db_table)
    free = " AND holder_run_id IS NULL" if free_only else ""
    # SQLite's one writer at a time needs no row lock.
    lock = " FOR UPDATE SKIP LOCKED" if overlapping_writers() else ""
    sql = (
        f"SELECT slot FROM {table} WHERE tenant_id = %s AND workflow_name = %s "  # noqa: S608
        f"AND limit_key = %s AND slot >= 0 AND slot < %s{free} ORDER BY slot LIMIT 1{lock}"
    )
    with hot_cursor() as cursor:
        cursor.execute(sql, [tenant_id, workflow_name, key, most])
        found = cursor.fetchone()
    return None if found is None else int(found[0])


def lock_limit_queue(tenant_id: str, workflow_name: str, key: str) -> None:
    """Wait for and lock the key's queue lock (slot ``-1``) until the transaction ends.

    Queuing a run and releasing a slot take it in turn: a run that found no
    free slot looks once more under it before it queues, and a release
    looks for queued runs under it, so no release misses a run that queued
    meanwhile (and no run queues behind a slot freed meanwhile).
    """
    table = engine().ops.quote_name(LimitSlot._meta.db_table)
    lock = " FOR UPDATE" if overlapping_writers() else ""
    sql = (
        f"SELECT slot FROM {table} WHERE tenant_id = %s AND workflow_name = %s "  # noqa: S608
        f"AND limit_key = %s AND slot = -1{lock}"
    )
    with hot_cursor() as cursor:
        cursor.execute(sql, [tenant_id, workflow_name, key])
        cursor.fetchall()


def held_slot(tenant_id: str, run_id: Any) -> tuple[str, str, int] | None:
    """(workflow, key, slot) the run holds (``holds="active"``), or None."""
    found = (
        LimitSlot.objects.filter(tenant_id=tenant_id, holder_run_id=run_id)
        .values_list("workflow_name", "limit_key", "slot")
        .first()
    )
    return None if found is None else (found[0], found[1], found[2])


def limit_holders(tenant_id: str, workflow_name: str, key: str) -> int:
    """How many runs hold a slot of the key (``holds="active"``), as committed."""
    return LimitSlot.objects.filter(
        tenant_id=tenant_id,
        workflow_name=workflow_name,
        limit_key=key,
        slot__gte=0,
        holder_run_id__isnull=False,
    ).count()


def settled_holders(tenant_id: str, workflow_name: str, key: str) -> list[WorkflowRun]:
    """Runs recorded as holding a slot of the key that have ended (their release was missed).

    Only a definition edited to drop its limit while runs held slots leaves
    such holders (the release follows a run's end where the limit is
    declared); the slow path of a claim that found no slot frees them.
    """
    held = LimitSlot.objects.filter(
        tenant_id=tenant_id,
        workflow_name=workflow_name,
        limit_key=key,
        holder_run_id__isnull=False,
    ).values("holder_run_id")
    return list(
        WorkflowRun.objects.filter(
            tenant_id=tenant_id,
            run_id__in=held,
            status__in=["completed", "failed", "cancelled"],
        )
    )


def oldest_queued(tenant_id: str, workflow_name: str, key: str) -> WorkflowRunPending | None:
    """The key's queued run (waiting for a slot) queued first that nobody locks, locked; or None.

    Through ``kw_pending_slot_queue``: one index probe however long the
    queue. A row someone locks (a cancel, a wake) is passed over.
    """
    rows = WorkflowRunPending.objects.filter(
        tenant_id=tenant_id,
        workflow_name=workflow_name,
        limit_key=key,
        queued_at__isnull=False,
        wake_at__isnull=True,
    ).order_by("queued_at", "id")
    if overlapping_writers():
        rows = rows.select_for_update(skip_locked=True)
    return rows.first()


def free_rate_slots(
    tenant_id: str, workflow_name: str, key: str, most: int
) -> list[tuple[int, datetime | None]]:
    """The key's rate slots below ``most`` that nobody locks, locked, least recently taken first.

    ``FOR UPDATE SKIP LOCKED``: a slot a running segment's transaction took
    is passed over (it was taken just now); the caller takes the first if
    its last start is a period old, else reads when the budget allows.
    """
    rows = RateSlot.objects.filter(
        tenant_id=tenant_id, workflow_name=workflow_name, rate_key=key, slot__gte=0, slot__lt=most
    ).order_by(F("last_start").asc(nulls_first=True), "slot")
    if overlapping_writers():
        rows = rows.select_for_update(skip_locked=True)
    return [(slot, last) for slot, last in rows.values_list("slot", "last_start")]


def rate_tail(tenant_id: str, workflow_name: str, key: str) -> datetime | None:
    """The latest instant a run of the key was told to wait until for its rate (slot ``-1``)."""
    return (
        RateSlot.objects.filter(
            tenant_id=tenant_id, workflow_name=workflow_name, rate_key=key, slot=-1
        )
        .values_list("last_start", flat=True)
        .first()
    )


def held_back_by_tenant() -> list[tuple[str, str, int]]:
    """(tenant, suspension type, count) of runs a limit holds back: queued for a slot, or rate.

    What the queued-runs gauge reports (:mod:`kumiko_workflows.telemetry`).
    """
    rows = (
        WorkflowRun.objects.filter(status="waiting", suspension_type__in=["limited", "rate"])
        .order_by()
        .values_list("tenant_id", "suspension_type")
        .annotate(n=Count("run_id"))
        .order_by("tenant_id", "suspension_type")
    )
    return [(tenant, kind, int(n)) for tenant, kind, n in rows]
