"""One batch of a purge: the runs it passes over, and the rows and events it removes.

A batch holds its runs' status rows locked (and finished); it passes over
a run a worker is resuming, one whose events started a run not finished
yet, and a child run whose parent stays, each with why; of the others it
deletes the leftovers (pending rows, wait keys, wake-up checks), the run
streams (archived first, :mod:`kumiko_workflows.operations.archive`), their
children's requests, the status rows, and leaves the tombstones. The purge
around it is :mod:`kumiko_workflows.operations.purge`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from django.utils import timezone

from kumiko_workflows.engine import children
from kumiko_workflows.engine.purged_runs import keeps_key
from kumiko_workflows.models import (
    SETTLED_STATUSES,
    Event,
    PurgedRun,
    TaskAttempt,
    WakeCheck,
    WorkflowChildGroup,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
)
from kumiko_workflows.operations.archive import ARCHIVE_FIELDS, Archive, _json_line
from kumiko_workflows.operations.purge_report import PurgeReport
from kumiko_workflows.store import db, statements
from kumiko_workflows.workflow import event_types as et


def chunks(values: Sequence[Any], extra: int = 10) -> Iterator[Sequence[Any]]:
    """``values`` in pieces that fit one statement's parameters (SQLite: 999)."""
    size = max(1, (db.engine().features.max_query_params or 65_535) - extra)
    for start in range(0, len(values), size):
        yield values[start : start + size]


def purge_batch(
    tenant: str,
    taken: dict[uuid.UUID, tuple[str, int | None]],
    writer: Archive | None,
    report: PurgeReport,
) -> tuple[list[uuid.UUID], dict[uuid.UUID, str]]:
    """Remove the runs ``taken`` (locked, finished; with their workflow and version).

    Returns the runs removed, and those passed over instead with why.
    """
    kept = {**_busy(tenant, list(taken)), **_still_triggering(tenant, list(taken))}
    kept.update(_parent_kept(tenant, [run_id for run_id in taken if run_id not in kept]))
    ids = [run_id for run_id in taken if run_id not in kept]
    report.passed_over += len(kept)
    if not ids:
        return ids, kept
    for chunk in chunks(ids):
        where = {"tenant_id": tenant, "run_id__in": chunk}
        report.wait_keys += WorkflowWaitKey.objects.filter(**where).delete()[0]
        report.pending += WorkflowRunPending.objects.filter(**where).delete()[0]
        report.wake_checks += WakeCheck.objects.filter(**where).delete()[0]
    report.events += _delete_events(tenant, ids, writer)
    report.events += _purge_children_requests(tenant, ids, writer)
    moment = timezone.now()
    tombstones = [
        PurgedRun(tenant_id=tenant, run_id=run_id, workflow_name=taken[run_id][0], purged_at=moment)
        for run_id in ids
        if keeps_key(*taken[run_id])
    ]
    PurgedRun.objects.bulk_create(tombstones, ignore_conflicts=True, batch_size=500)
    report.tombstones += len(tombstones)
    for chunk in chunks(ids):
        # A task's attempts (kumiko_workflows.tasks) go with its run; not counted apart.
        TaskAttempt.objects.filter(tenant_id=tenant, run_id__in=chunk).delete()
        report.runs += WorkflowRun.objects.filter(tenant_id=tenant, run_id__in=chunk).delete()[0]
    return ids, kept


def _parent_kept(tenant: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Child runs whose parent stays: they go with it (the parent's fan-in counted them)."""
    children = dict(
        WorkflowRun.objects.filter(
            tenant_id=tenant, run_id__in=ids, parent_run_id__isnull=False
        ).values_list("run_id", "parent_run_id")
    )
    going = set(ids)
    parents = {parent for parent in children.values() if parent is not None and parent not in going}
    staying = set(
        WorkflowRun.objects.filter(tenant_id=tenant, run_id__in=parents).values_list(
            "run_id", flat=True
        )
    )
    return {
        child: f"its parent run {parent} is kept"
        for child, parent in children.items()
        if parent in staying
    }


def _purge_children_requests(tenant: str, ids: list[uuid.UUID], writer: Archive | None) -> int:
    """The requests of purged runs' children (their triggers) and their fan-in rows."""
    removed = 0
    for chunk in chunks(ids):
        groups = WorkflowChildGroup.objects.filter(tenant_id=tenant, parent_run_id__in=chunk)
        requests = [
            children.call_id(tenant, children.child_key(group.parent_run_id, group.group, index))
            for group in groups
            for index in range(group.total)
        ]
        for batch in chunks(requests):
            removed += _delete_events(tenant, list(batch), writer, et.CALL_AGGREGATE_TYPE)
        groups.delete()
    return removed


def _busy(tenant: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Runs of ``ids`` with a leftover pending row another transaction holds (a worker).

    Those rows are locked here (skipping held ones), so the delete below
    never waits for a worker that may be waiting for this batch's rows.
    """
    busy: dict[uuid.UUID, str] = {}
    for chunk in chunks(ids):
        rows = WorkflowRunPending.objects.filter(tenant_id=tenant, run_id__in=chunk)
        found = dict(rows.values_list("pk", "run_id"))
        if not found or not db.overlapping_writers():
            continue
        locked = set(rows.select_for_update(skip_locked=True).values_list("pk", flat=True))
        for pk, run_id in found.items():
            if pk not in locked:
                busy[run_id] = "a worker is resuming a pending row left with it; try again"
    return busy


def _still_triggering(tenant: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Runs of ``ids`` one of whose events started a run that is not finished yet.

    A workflow triggered by a run event (say ``workflow.run-completed``)
    loads that event as ``ctx.event`` on every resume: purging it would fail
    the run with ``trigger_event_unavailable``. Asked of the status rows,
    not of the code: a run of an older version (whose trigger the newest
    may have dropped), or of a version no longer declared (rerun once it is
    declared again), keeps its trigger as any other.
    """
    kept: dict[uuid.UUID, str] = {}
    for chunk in chunks(ids):
        events = dict(
            Event.objects.filter(
                tenant_id=tenant, aggregate_type=et.RUN_AGGREGATE_TYPE, aggregate_id__in=chunk
            ).values_list("id", "aggregate_id")
        )
        for part in chunks(list(events)):
            used = (
                WorkflowRun.objects.filter(tenant_id=tenant, trigger_event_id__in=part)
                .exclude(status__in=SETTLED_STATUSES)
                .values_list("run_id", "trigger_event_id")
            )
            for user, event_id in used:
                if event_id is not None:
                    kept[events[event_id]] = f"run {user}, not finished, was started by its event"
    return kept


def _delete_events(
    tenant: str,
    ids: list[uuid.UUID],
    writer: Archive | None,
    aggregate_type: str = et.RUN_AGGREGATE_TYPE,
) -> int:
    """Delete the run streams of ``ids`` (archived first); return how many events went.

    Past the model's refusal, through :func:`kumiko_workflows.store.statements.delete_run_streams`:
    the engine's run streams of one tenant, nothing else.
    """
    deleted = 0
    lines: list[bytes] = []
    for chunk in chunks(ids):
        if writer is not None:
            rows = (
                Event.objects.filter(
                    tenant_id=tenant, aggregate_type=aggregate_type, aggregate_id__in=chunk
                )
                .order_by("id")
                .values_list(*ARCHIVE_FIELDS)
            )
            lines.extend(_json_line(row) for row in rows)
        deleted += statements.delete_run_streams(tenant, list(chunk), aggregate_type)
    if writer is not None:
        if deleted != len(lines):
            # An event committed between the read and the delete would be
            # gone without a copy: take the batch back instead.
            raise RuntimeError(
                f"the batch deleted {deleted} events but archived {len(lines)}; rolled back"
            )
        writer.write(lines)
    return deleted
