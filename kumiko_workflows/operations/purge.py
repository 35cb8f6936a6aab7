"""Retention: removing finished runs, the one way events ever leave the store.

The event table is append-only for every caller (``Event.delete()`` and
``QuerySet.delete()/update()`` refuse). :func:`purge_runs` is the single,
explicit exception: it deletes the engine's own run streams (aggregate type
``workflow-run``) of runs that completed, failed or were cancelled before a
cut-off, with their status rows and any leftovers (pending rows, wait keys,
wake-up checks). Domain events, including trigger and awaited events, and
cron schedule streams are never touched.

It works in batches, each its own short transaction. A batch locks the
status rows it takes with ``SKIP LOCKED`` (a run someone is changing is left
for later), and re-reads their status under that lock, so a run that is not
finished is never touched, whatever was asked. Each purged run leaves a
:class:`~kumiko_workflows.models.PurgedRun` tombstone, and
:mod:`kumiko_workflows.engine.purged_runs` refuses to start a run with a
purged run's id (the same idempotency key) again, unless
``KUMIKO_WORKFLOWS["REUSE_PURGED_KEYS"]`` allows it.

With an archive, every event a batch deletes is first written to one file
as gzip-compressed JSON lines, one gzip member per batch, flushed to disk
before the batch commits: ``zcat PATH | jq`` reads it
(:mod:`kumiko_workflows.operations.archive`). The cut-off is
:mod:`kumiko_workflows.operations.cutoff`'s; one batch's work is
:mod:`kumiko_workflows.operations.purge_batch`, the report
:mod:`kumiko_workflows.operations.purge_report`.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kumiko_workflows.engine.purged_runs import keeps_key
from kumiko_workflows.exceptions import InvalidArgument
from kumiko_workflows.models import (
    SETTLED_STATUSES,
    Event,
    PurgedRun,
    WakeCheck,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
)
from kumiko_workflows.operations.archive import Archive
from kumiko_workflows.operations.cutoff import parse_cutoff
from kumiko_workflows.operations.purge_batch import chunks, purge_batch
from kumiko_workflows.operations.purge_report import PurgeReport
from kumiko_workflows.store import db, statements
from kumiko_workflows.store.event_checks import name_problem
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.arguments import is_int

__all__ = ["DEFAULT_BATCH", "MAX_BATCH", "PurgeReport", "purge_runs"]

logger = logging.getLogger(__name__)

DEFAULT_BATCH = 500
MAX_BATCH = 10_000


@dataclass
class _Filters:
    cutoff: datetime
    tenant_id: str | None
    workflow_name: str | None
    run_ids: list[uuid.UUID] | None


def _runs(filters: _Filters, tenant_id: str | None = None) -> Any:
    """The finished runs the purge may remove: settled before the cut-off, as filtered.

    ``updated_at`` equals ``finished_at`` on a finished run; the condition on
    it lets the ``(tenant_id, status, updated_at)`` index find them.
    """
    runs = WorkflowRun.objects.filter(
        status__in=SETTLED_STATUSES,
        updated_at__lt=filters.cutoff,
        finished_at__lt=filters.cutoff,
    )
    tenant = tenant_id if tenant_id is not None else filters.tenant_id
    if tenant is not None:
        runs = runs.filter(tenant_id=tenant)
    if filters.workflow_name is not None:
        runs = runs.filter(workflow_name=filters.workflow_name)
    if filters.run_ids is not None:
        runs = runs.filter(run_id__in=filters.run_ids)
    return runs


def _check_name(value: Any, what: str, column: str) -> None:
    if value is not None:
        problem = name_problem(value, column)
        if problem:
            raise InvalidArgument(f"{what} {problem}")


def _as_run_ids(values: Iterable[Any]) -> list[uuid.UUID]:
    ids = []
    for value in values:
        try:
            ids.append(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
        except ValueError:
            raise InvalidArgument(f"{value!r} is not a run id (a UUID)") from None
    return ids


def purge_runs(
    finished_before: Any,
    *,
    now: datetime | None = None,
    tenant_id: str | None = None,
    workflow_name: str | None = None,
    run_ids: Iterable[uuid.UUID | str] | None = None,
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    archive: str | os.PathLike[str] | None = None,
    progress: Callable[[PurgeReport], None] | None = None,
) -> PurgeReport:
    """Remove the runs that completed, failed or were cancelled before a cut-off.

    ``finished_before`` is what :func:`parse_cutoff` takes (``"P30D"``, an
    instant, a timedelta), counted back from ``now``. For each run: its
    ``workflow-run`` events, its ``WorkflowRun`` row, and any pending rows,
    wait keys and wake-up checks left with it; and a
    :class:`~kumiko_workflows.models.PurgedRun` tombstone. ``tenant_id``,
    ``workflow_name`` and ``run_ids`` narrow the runs; a run asked for by id
    that is not finished, finished after the cut-off or does not match the
    other filters is left alone and listed in ``report.refused``.

    Batches of ``batch_size`` runs, each its own transaction when called
    outside one (call it so: inside a transaction every lock is held to its
    end). ``dry_run`` only counts (an upper bound: runs a batch would pass
    over are counted too). ``archive`` names a file to append every removed
    event to first (see :class:`Archive`). ``progress`` is called with the
    report after each batch. Bad arguments raise :class:`InvalidArgument`
    before any SQL.
    """
    try:
        cutoff = parse_cutoff(finished_before, now)
    except InvalidArgument as exc:
        raise InvalidArgument(f"finished_before {exc}") from None
    _check_name(tenant_id, "tenant_id", "tenant_id")
    if workflow_name is not None and (not isinstance(workflow_name, str) or not workflow_name):
        raise InvalidArgument(f"workflow_name must be a non-empty string, got {workflow_name!r}")
    asked = None if run_ids is None else _as_run_ids(run_ids)
    if not is_int(batch_size):
        raise InvalidArgument(f"batch_size must be a whole number, got {batch_size!r}")
    if not 1 <= batch_size <= MAX_BATCH:
        raise InvalidArgument(f"batch_size must be from 1 to {MAX_BATCH}, got {batch_size}")
    filters = _Filters(cutoff, tenant_id, workflow_name, asked)
    report = PurgeReport(cutoff=cutoff, dry_run=dry_run)
    writer = None if archive is None or dry_run else Archive(archive)
    try:
        if asked is not None:
            _explain_asked(filters, report)
        if dry_run:
            _count(filters, report)
            return report
        report.total = _runs(filters).count()
        tenants = [tenant_id] if tenant_id is not None else _tenants(filters)
        for tenant in tenants:
            _purge_tenant(filters, tenant, batch_size, writer, report, progress)
        if asked is not None:
            _explain_left(asked, report)
    finally:
        if writer is not None:
            writer.close()
    logger.info(
        "purged runs finished before %s: %s batches=%d", cutoff.isoformat(), report, report.batches
    )
    return report


def _tenants(filters: _Filters) -> list[str]:
    rows = _runs(filters).order_by("tenant_id").values_list("tenant_id", flat=True).distinct()
    return list(rows)


def _explain_asked(filters: _Filters, report: PurgeReport) -> None:
    """Say why each run asked for by id will not be purged (if it will not)."""
    assert filters.run_ids is not None
    found: dict[uuid.UUID, WorkflowRun] = {}
    for chunk in chunks(filters.run_ids):
        found.update(WorkflowRun.objects.in_bulk(list(chunk)))
    missing = [run_id for run_id in filters.run_ids if run_id not in found]
    purged: set[uuid.UUID] = set()
    for chunk in chunks(missing):
        tombstones = PurgedRun.objects.filter(run_id__in=chunk)
        if filters.tenant_id is not None:
            tombstones = tombstones.filter(tenant_id=filters.tenant_id)
        purged.update(tombstones.values_list("run_id", flat=True))
    for run_id in dict.fromkeys(filters.run_ids):
        run = found.get(run_id)
        why = None
        if run is None:
            if run_id in purged:
                report.already_purged.append(str(run_id))
            else:
                why = "no workflow run has this id"
        elif filters.tenant_id is not None and run.tenant_id != filters.tenant_id:
            why = "no workflow run has this id in this tenant"
        elif filters.workflow_name is not None and run.workflow_name != filters.workflow_name:
            why = f"it is a run of {run.workflow_name!r}, not of {filters.workflow_name!r}"
        elif run.status not in SETTLED_STATUSES:
            why = f"it is {run.status}, not finished"
        elif run.finished_at is None or run.finished_at >= filters.cutoff:
            finished = run.finished_at.isoformat() if run.finished_at else "?"
            why = f"it finished at {finished}, not before {filters.cutoff.isoformat()}"
        if why is not None:
            report.refused.append((str(run_id), why))


def _explain_left(asked: list[uuid.UUID], report: PurgeReport) -> None:
    """Say why a run asked for that looked purgeable was left after all."""
    settled = {run_id for run_id, _ in report.refused} | set(report.already_purged)
    settled |= report.purged_ids
    for run_id in dict.fromkeys(str(run_id) for run_id in asked):
        if run_id not in settled:
            why = report.passed.get(run_id, "another transaction was changing it; try again")
            report.refused.append((run_id, why))


def _count(filters: _Filters, report: PurgeReport) -> None:
    """Fill ``report`` with what a purge would remove now, changing nothing."""
    tenants = [filters.tenant_id] if filters.tenant_id is not None else _tenants(filters)
    for tenant in tenants:
        runs = _runs(filters, tenant)
        ids = runs.values("run_id")
        report.runs += runs.count()
        report.events += Event.objects.filter(
            tenant_id=tenant, aggregate_type=et.RUN_AGGREGATE_TYPE, aggregate_id__in=ids
        ).count()
        report.pending += WorkflowRunPending.objects.filter(
            tenant_id=tenant, run_id__in=ids
        ).count()
        report.wait_keys += WorkflowWaitKey.objects.filter(tenant_id=tenant, run_id__in=ids).count()
        report.wake_checks += WakeCheck.objects.filter(tenant_id=tenant, run_id__in=ids).count()
        versions = runs.order_by().values_list("workflow_name", "workflow_version").distinct()
        for name, version in versions:
            if keeps_key(name, version):
                report.tombstones += runs.filter(
                    workflow_name=name, workflow_version=version
                ).count()
    report.total = report.runs


def _hold_writes() -> None:
    """SQLite: take the write lock first, so the batch's reads cannot go stale under it.

    (PostgreSQL locks the rows the batch reads instead.)
    """
    if not db.overlapping_writers():
        statements.lock_projection_tables()


def _purge_tenant(
    filters: _Filters,
    tenant: str,
    batch_size: int,
    writer: Archive | None,
    report: PurgeReport,
    progress: Callable[[PurgeReport], None] | None,
) -> None:
    passed_over: set[uuid.UUID] = set()
    while True:
        with db.atomic():
            _hold_writes()
            runs = _runs(filters, tenant)
            if passed_over:
                runs = runs.exclude(run_id__in=list(passed_over))
            # SKIP LOCKED: a run another transaction is changing (a retry) is
            # not waited for; the status is read again under the lock.
            taken = {
                run_id: (name, version)
                for run_id, name, version in runs.select_for_update(skip_locked=True)
                .order_by()
                .values_list("run_id", "workflow_name", "workflow_version")[:batch_size]
            }
            if not taken:
                return
            purged, kept = purge_batch(tenant, taken, writer, report)
        passed_over.update(kept)
        if filters.run_ids is not None:
            report.purged_ids.update(str(run_id) for run_id in purged)
            report.passed.update((str(run_id), why) for run_id, why in kept.items())
        report.batches += 1
        if progress is not None:
            progress(report)
