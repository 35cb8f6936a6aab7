"""The projections that keep ``WorkflowRun`` and ``WorkflowRunPending`` current.

Both are pure functions of the event store: each column comes from an event's
payload, version or ``created_at`` (never the clock), so a replay gives the
same rows; so are the wait keys stored beside a ``wait_for_event`` row. On
PostgreSQL a row becoming due now also NOTIFYs the workers, delivered when
the transaction commits. Waking runs on awaited events is a reaction, not a
projection: see :mod:`kumiko_workflows.wakeups`.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import F, Value
from django.db.models.functions import Coalesce

from kumiko_workflows import db, matching, suspensions, wakeups
from kumiko_workflows import event_types as et
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.definition import registry
from kumiko_workflows.exceptions import InvalidMatchExpression
from kumiko_workflows.models import (
    Event,
    RunStatus,
    SuspensionType,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
)
from kumiko_workflows.runner import trigger_projection
from kumiko_workflows.streams import is_cleared

logger = logging.getLogger("kumiko_workflows.projections")

_PENDING_UPDATE_FIELDS = [
    "workflow_name",
    "suspension_type",
    "wake_at",
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
]


def is_run_event(event: Event) -> bool:
    return event.aggregate_type == et.RUN_AGGREGATE_TYPE


def notify_due(tenant_id: str) -> None:
    """Wake ``--loop`` workers (PostgreSQL; delivered at commit)."""
    db.notify(workflow_settings.NOTIFY_CHANNEL, tenant_id)


# --- run status -------------------------------------------------------------


def _status_fields(event: Event) -> dict[str, Any] | None:
    payload = event.payload
    kind = event.type
    record = suspensions.for_event(kind)
    if record is not None:
        return record.status_columns(payload, event.created_at)
    if kind == et.WAKE_REQUESTED:
        return {"wake_at": event.created_at}
    if kind == et.RESUMED:
        # The engine appends the next event (suspension, completion or
        # failure) in the same transaction, and each of those sets every
        # column this one would: the row never shows "running" outside it.
        # Skipping the UPDATE saves a statement per resume.
        return None
    if kind == et.RUN_COMPLETED:
        return _settled(RunStatus.COMPLETED, event)
    if kind == et.RUN_FAILED:
        return _settled(
            RunStatus.FAILED,
            event,
            step=payload.get("step") or "",
            failure_reason=payload.get("reason", ""),
            error_class=payload.get("error_class", ""),
        )
    if kind == et.RUN_CANCELLED:
        return _settled(RunStatus.CANCELLED, event)
    return None


def _settled(status: str, event: Event, **fields: Any) -> dict[str, Any]:
    """The columns of a run that has finished, one way or another."""
    return {
        "status": status,
        "wake_at": None,
        "suspension_type": "",
        "awaited_event_type": "",
        "finished_at": event.created_at,
        **fields,
    }


def project_run_status(event: Event, replaying: bool) -> None:
    if not is_run_event(event):
        return
    if event.type == et.RUN_STARTED:
        payload = event.payload
        WorkflowRun.objects.create(
            run_id=event.aggregate_id,
            tenant_id=event.tenant_id,
            workflow_name=payload["workflow_name"],
            idempotency_key=str(payload.get("idempotency_key") or "")[:500],
            status=RunStatus.RUNNING,
            definition_fingerprint=payload["definition_fingerprint"],
            trigger_event_id=payload.get("trigger_event_id"),
            version=event.version,
            started_at=event.created_at,
            updated_at=event.created_at,
        )
        return
    fields = _status_fields(event)
    if fields is not None:
        _update(
            WorkflowRun,
            {**fields, "version": event.version, "updated_at": event.created_at},
            {"tenant_id": event.tenant_id, "run_id": event.aggregate_id},
        )


def _update(model: type[Any], values: dict[str, Any], where: dict[str, Any]) -> None:
    """``UPDATE`` rows of ``model`` matching ``where`` (field = value, ANDed)."""
    db.write_rows(model, "UPDATE", values, where)


def _delete(model: type[Any], where: dict[str, Any]) -> None:
    """``DELETE`` rows of ``model`` matching ``where`` (field = value, ANDed)."""
    db.write_rows(model, "DELETE", {}, where)


# --- pending ----------------------------------------------------------------


def _pending_row(event: Event) -> WorkflowRunPending:
    payload = event.payload
    kind = event.type
    row = WorkflowRunPending(
        tenant_id=event.tenant_id,
        run_id=event.aggregate_id,
        step=payload["step"],
        workflow_name=payload["workflow_name"],
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
        _delete(WorkflowWaitKey, where)
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
    if kind in et.SUSPENSIONS:
        row = _pending_row(event)
        keys = _wait_keys(row.match_expr) if kind == et.WAITING_FOR_EVENT else None
        row.match_scan = kind == et.WAITING_FOR_EVENT and keys is None
        # Upsert: a suspension projected twice (at-least-once) leaves one row.
        WorkflowRunPending.objects.bulk_create(
            [row],
            update_conflicts=True,
            unique_fields=["tenant_id", "run_id", "step"],
            update_fields=_PENDING_UPDATE_FIELDS,
        )
        if kind == et.WAITING_FOR_EVENT:
            _store_keys(event, row, keys or frozenset(), cleared)
        if not replaying and row.wake_at is not None and row.wake_at <= event.created_at:
            notify_due(event.tenant_id)
    elif kind == et.WAKE_REQUESTED:
        changes: dict[str, Any] = {
            "wake_at": event.created_at,
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
        if not replaying:
            notify_due(event.tenant_id)
    elif kind == et.RESUMED or kind in et.TERMINAL:
        if cleared:
            return  # the stream's previous event, in this transaction, deleted them
        where = {"tenant_id": event.tenant_id, "run_id": event.aggregate_id}
        _delete(WorkflowRunPending, where)
        if kind in et.TERMINAL or event.payload.get("suspension_type") == SuspensionType.EVENT:
            _delete(WorkflowWaitKey, where)


def register(projections: Any) -> None:
    """Register the built-in projections, in the order they must run."""
    projections.register(
        "kumiko_workflows.run_status",
        set(et.RUN_EVENTS),
        project_run_status,
        order=10,
        builtin=True,
    )
    projections.register(
        "kumiko_workflows.pending", set(et.RUN_EVENTS), project_pending, order=20, builtin=True
    )
    # The wake-up appends run events: a replay replays those, not the wake-up.
    projections.register(
        "kumiko_workflows.wakeup",
        registry.is_awaited,
        wakeups.project_wakeup,
        order=30,
        replay=False,
        builtin=True,
    )
    projections.register(
        "kumiko_workflows.trigger",
        registry.is_trigger,
        trigger_projection,
        order=40,
        replay=False,
        builtin=True,
    )
