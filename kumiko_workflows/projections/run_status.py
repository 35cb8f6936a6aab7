"""The run-status projection: ``WorkflowRun``, one row per run.

A pure function of the run's events: each column comes from an event's
payload, version or ``created_at`` (never the clock), so a replay gives the
same rows. A suspension's columns come from its record
(:mod:`kumiko_workflows.workflow.suspensions`).
"""

from __future__ import annotations

from typing import Any

from kumiko_workflows.models import Event, RunStatus, WorkflowRun
from kumiko_workflows.store import statements
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import suspensions


def handles(event_type: str) -> bool:
    """Whether both projections handle ``event_type``: the run events (records' included)."""
    return et.is_run_event(event_type)


def is_run_event(event: Event) -> bool:
    return event.aggregate_type == et.RUN_AGGREGATE_TYPE


def _status_fields(event: Event) -> dict[str, Any] | None:
    payload = event.payload
    kind = event.type
    record = suspensions.for_event(kind)
    if record is not None:
        fields = record.status_columns(payload, event.created_at)
        # The definition the run suspended on: its own, or an edit it resumed on (engine/deploys).
        fields["definition_fingerprint"] = payload["definition_fingerprint"]
        if payload.get("workflow_version") is not None:
            # A run started before versions were recorded learns its version
            # from its first suspension written by an engine that records it.
            fields["workflow_version"] = payload["workflow_version"]
        return fields
    if kind == et.RUN_MIGRATED:
        return {
            "step": payload["step"],
            "definition_fingerprint": payload["definition_fingerprint"],
            "workflow_version": payload["workflow_version"],
        }
    if kind in (et.WAKE_REQUESTED, et.SLOT_OFFERED):
        return {"wake_at": event.created_at}
    if kind in (et.SLOT_TAKEN, et.SLOT_RELEASED, et.RATE_TAKEN):
        # Only the version moves (operations append at the row's version).
        return {}
    if kind == et.RESUMED:
        if "definition_fingerprint" in payload:
            # Resumed on an edited definition it survives (engine/deploys): it is on it now.
            # (Appended alone, so the segment's events write after it.)
            return {
                "definition_fingerprint": payload["definition_fingerprint"],
                "workflow_version": payload["workflow_version"],
            }
        # The engine appends the next event (suspension, completion or
        # failure) in the same transaction, and each of those sets every
        # column this one would: the row never shows "running" outside it.
        # Skipping the UPDATE saves a statement per resume.
        return None
    if kind == et.RUN_COMPLETED:
        return _settled(RunStatus.COMPLETED, event)
    if kind == et.RUN_FAILED:
        failed = _settled(
            RunStatus.FAILED,
            event,
            step=payload.get("step") or "",
            failure_reason=payload.get("reason", ""),
            error_class=payload.get("error_class", ""),
        )
        if "attempt" in payload:  # older failures do not say: the column stays as it was
            failed["retry_attempt"] = payload["attempt"] or 0
        return failed
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


def _search_key(payload: dict[str, Any]) -> str:
    # A workflow without search_key (and every run started before there were
    # search keys: migration 0011 gave their rows the same) is searched by
    # its idempotency key.
    key = payload["search_key"] if "search_key" in payload else payload.get("idempotency_key")
    return str(key or "")[:200]


def project_run_status(event: Event, replaying: bool) -> None:
    if not is_run_event(event):
        return
    if event.type == et.RUN_STARTED:
        payload = event.payload
        parent = payload.get("parent") if isinstance(payload.get("parent"), dict) else {}
        WorkflowRun.objects.create(
            parent_run_id=parent.get("run_id"),
            parent_group=str(parent.get("group") or "")[:200],
            run_id=event.aggregate_id,
            tenant_id=event.tenant_id,
            workflow_name=payload["workflow_name"],
            # Absent from streams started before versions were recorded.
            workflow_version=payload.get("workflow_version"),
            idempotency_key=str(payload.get("idempotency_key") or "")[:500],
            search_key=_search_key(payload),
            status=RunStatus.RUNNING,
            definition_fingerprint=payload["definition_fingerprint"],
            trigger_event_id=payload.get("trigger_event_id"),
            priority=payload.get("priority") or 0,
            version=event.version,
            started_at=event.created_at,
            updated_at=event.created_at,
        )
        return
    write = status_write(event)
    if write is not None:
        statements.write_rows(write[0], "UPDATE", write[1], write[2])


def status_write(event: Event) -> statements.Write | None:
    """The ``UPDATE`` of the run's status row that ``event`` makes (not its start), or None."""
    if not is_run_event(event) or event.type == et.RUN_STARTED:
        return None
    fields = _status_fields(event)
    if fields is None:
        return None
    return (
        WorkflowRun,
        {**fields, "version": event.version, "updated_at": event.created_at},
        {"tenant_id": event.tenant_id, "run_id": event.aggregate_id},
    )
