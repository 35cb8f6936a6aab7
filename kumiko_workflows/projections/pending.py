"""The pending projection: ``WorkflowRunPending``, one row per suspended step, and its wait keys.

A pure function of the run's events, like the run status (a replay gives
the same rows); the equalities a ``wait_for_event`` match requires are
stored beside its row as ``WorkflowWaitKey`` rows. On PostgreSQL a row
becoming due now also NOTIFYs the workers, delivered at commit. Waking runs
on awaited events is a reaction, not a projection: see
:mod:`kumiko_workflows.engine.wakeups`.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F, Value
from django.db.models.functions import Coalesce

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import InvalidMatchExpression
from kumiko_workflows.models import (
    Event,
    SuspensionType,
    WorkflowRunPending,
    WorkflowWaitKey,
)
from kumiko_workflows.projections.run_status import is_run_event
from kumiko_workflows.store import db, statements, waiting_pairs
from kumiko_workflows.store.pending_hint import is_cleared
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import matching, priorities, suspensions

_PENDING_UPDATE_FIELDS = [
    "workflow_name",
    "workflow_version",
    "suspension_type",
    "wake_at",
    "claim_at",
    "priority",
    "timeout_at",
    "retry_attempt",
    "definition_fingerprint",
    "wait_event_type",
    "awaits_key",
    "match_expr",
    "awaited_event_id",
    "match_scan",
    "trigger_event_id",
    "run_version",
    "state",
    "suspended_at",
    "due_since",
    "limit_key",
    "queued_at",
]


def notify_due(tenant_id: str) -> None:
    """Wake ``--loop`` workers (PostgreSQL; delivered at commit)."""
    db.notify(workflow_settings.NOTIFY_CHANNEL, tenant_id)


def _pending_row(event: Event) -> WorkflowRunPending:
    payload = event.payload
    kind = event.type
    row = WorkflowRunPending(
        tenant_id=event.tenant_id,
        run_id=event.aggregate_id,
        step=payload["step"],
        workflow_name=payload["workflow_name"],
        workflow_version=payload.get("workflow_version"),
        definition_fingerprint=payload["definition_fingerprint"],
        trigger_event_id=payload.get("trigger_event_id"),
        run_version=event.version,
        state=payload.get("state") or {},
        suspended_at=event.created_at,
        retry_attempt=0,
    )
    record = suspensions.for_event(kind)
    assert record is not None, f"{kind} is not a suspension"
    for column, value in record.pending_columns(payload, event.created_at).items():
        setattr(row, column, value)
    row.priority = payload.get("priority") or 0
    row.claim_at = priorities.claim_instant(row.wake_at, payload.get("head_start") or 0)
    return row


def _wait_keys(match: Any) -> frozenset[matching.Key] | None:
    """The keys a wait is stored under; None puts it on the scan path.

    A stored match that does not validate is scanned: evaluating it then
    fails the run with ``invalid_match``, as it should.
    """
    if match is None:
        return None
    try:
        return matching.required_keys(matching.validate(match))
    except InvalidMatchExpression:
        return None


def _store_keys(
    event: Event, row: WorkflowRunPending, keys: frozenset[matching.Key], cleared: bool
) -> None:
    """Store the wait under ``keys``, replacing the run's old ones."""
    where = {"tenant_id": event.tenant_id, "run_id": event.aggregate_id}
    if not cleared:
        statements.write_rows(WorkflowWaitKey, "DELETE", {}, where)
    WorkflowWaitKey.objects.bulk_create(
        WorkflowWaitKey(**where, event_type=row.wait_event_type, path=path, value=value)
        for path, value in sorted(keys)
    )


def project_pending(event: Event, replaying: bool) -> None:
    if not is_run_event(event):
        return
    kind = event.type
    # Keys exist only while the run's pending row waits for an event: they
    # go when that wait resumes and when the run ends.
    cleared = is_cleared(event.aggregate_id, event.version)
    if et.is_suspension(kind):
        if kind == et.COMPENSATION_SCHEDULED and not cleared:
            # A cancel asking for compensation replaces the wait the run was at.
            where = {"tenant_id": event.tenant_id, "run_id": event.aggregate_id}
            statements.write_rows(WorkflowRunPending, "DELETE", {}, where)
            statements.write_rows(WorkflowWaitKey, "DELETE", {}, where)
        row = _pending_row(event)
        # A wait for an event: written by the step, or resumed by a rerun.
        waits = row.suspension_type == SuspensionType.EVENT
        keys = _wait_keys(row.match_expr) if waits else None
        row.match_scan = waits and keys is None
        # Upsert: a suspension projected twice (at-least-once) leaves one row.
        WorkflowRunPending.objects.bulk_create(
            [row],
            update_conflicts=True,
            unique_fields=["tenant_id", "run_id", "step"],
            update_fields=_PENDING_UPDATE_FIELDS,
        )
        if waits:
            _store_keys(event, row, keys or frozenset(), cleared)
        if row.wake_at is not None:
            waiting_pairs.due_from(row.wake_at)
            if not replaying and row.wake_at <= event.created_at:
                notify_due(event.tenant_id)
    elif kind == et.WAKE_REQUESTED:
        changes: dict[str, Any] = {
            "wake_at": event.created_at,
            "claim_at": priorities.claim_instant(
                event.created_at, event.payload.get("head_start") or 0
            ),
            "due_since": event.created_at,
            "run_version": event.version,
        }
        awaited = event.payload.get("awaited_event_id")
        if awaited is not None:
            # An awaited event woke the run: record which one (the first wins).
            changes["awaited_event_id"] = Coalesce(F("awaited_event_id"), Value(awaited))
        WorkflowRunPending.objects.filter(
            tenant_id=event.tenant_id, run_id=event.aggregate_id
        ).update(**changes)
        waiting_pairs.due_from(event.created_at)
        if not replaying:
            notify_due(event.tenant_id)
    elif kind == et.SLOT_OFFERED:
        # A slot freed for the run queued for it: due now, in the queue's
        # order (it keeps queued_at, should it have to queue again).
        WorkflowRunPending.objects.filter(
            tenant_id=event.tenant_id, run_id=event.aggregate_id
        ).update(
            wake_at=event.created_at,
            claim_at=priorities.claim_instant(
                event.created_at, event.payload.get("head_start") or 0
            ),
            run_version=event.version,
        )
        waiting_pairs.due_from(event.created_at)
        if not replaying:
            notify_due(event.tenant_id)
    elif kind == et.RUN_MIGRATED:
        # The suspension continues at the new version's step; its wait
        # (deadline, match, keys, state) is the same wait.
        WorkflowRunPending.objects.filter(
            tenant_id=event.tenant_id, run_id=event.aggregate_id, step=event.payload["from_step"]
        ).update(
            step=event.payload["step"],
            workflow_version=event.payload["workflow_version"],
            definition_fingerprint=event.payload["definition_fingerprint"],
            run_version=event.version,
        )
    elif kind == et.RESUMED or kind in et.TERMINAL:
        if cleared:
            return  # the stream's previous event, in this transaction, deleted them
        where = {"tenant_id": event.tenant_id, "run_id": event.aggregate_id}
        statements.write_rows(WorkflowRunPending, "DELETE", {}, where)
        if kind in et.TERMINAL or event.payload.get("suspension_type") == SuspensionType.EVENT:
            statements.write_rows(WorkflowWaitKey, "DELETE", {}, where)
