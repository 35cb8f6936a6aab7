"""The projections that keep ``WorkflowRun`` and ``WorkflowRunPending`` current.

Both are pure functions of the event store: each column comes from an event's
payload, version or ``created_at`` (never the clock), so a replay gives the
same rows. The wake-up projection reads domain events of awaited types and
marks matching pending rows due; on PostgreSQL a row becoming due now also
NOTIFYs the workers, delivered when the transaction commits.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils.dateparse import parse_datetime

from kumiko_workflows import event_types as et
from kumiko_workflows import matching
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.definition import registry
from kumiko_workflows.exceptions import VersionConflict
from kumiko_workflows.models import (
    Event,
    RunStatus,
    SuspensionType,
    WorkflowRun,
    WorkflowRunPending,
)

logger = logging.getLogger("kumiko_workflows.projections")

#: (run id, version) of an event about to be appended whose stream has no
#: pending rows for sure: the stream's previous event was appended by the same
#: ``RunStream`` in the same transaction and left none (a start, a resume or an
#: end). Lets the pending projection skip a DELETE that would find nothing.
pending_cleared: ContextVar[tuple[Any, int] | None] = ContextVar(
    "kumiko_pending_cleared", default=None
)

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
    "trigger_event_id",
    "run_version",
    "state",
    "suspended_at",
    "due_since",
]


def _instant(value: str | None) -> datetime | None:
    return parse_datetime(value) if value else None


def is_run_event(event: Event) -> bool:
    return event.aggregate_type == et.RUN_AGGREGATE_TYPE


def notify_due(tenant_id: str) -> None:
    """Wake ``--loop`` workers (PostgreSQL; delivered at commit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_notify(%s, %s)", [workflow_settings.NOTIFY_CHANNEL, tenant_id]
            )


# --- run status -------------------------------------------------------------


def _status_fields(event: Event) -> dict[str, Any] | None:
    payload = event.payload
    kind = event.type
    if kind == et.WAITING:
        return {
            "status": RunStatus.WAITING,
            "step": payload["step"],
            "suspension_type": SuspensionType.WAIT,
            "wake_at": _instant(payload["wake_at"]),
            "awaited_event_type": "",
            "retry_attempt": 0,
        }
    if kind == et.WAITING_FOR_EVENT:
        return {
            "status": RunStatus.WAITING,
            "step": payload["step"],
            "suspension_type": SuspensionType.EVENT,
            "wake_at": _instant(payload.get("timeout_at")),
            "awaited_event_type": payload["event_type"],
            "retry_attempt": 0,
        }
    if kind == et.RETRY_SCHEDULED:
        return {
            "status": RunStatus.WAITING,
            "step": payload["step"],
            "suspension_type": SuspensionType.RETRY,
            "wake_at": _instant(payload["wake_at"]),
            "awaited_event_type": "",
            "retry_attempt": payload["attempt"],
            "error_class": payload.get("error_class", ""),
        }
    if kind == et.RERUN_REQUESTED:
        return {
            "status": RunStatus.WAITING,
            "step": payload["step"],
            "suspension_type": SuspensionType.RERUN,
            "wake_at": event.created_at,
            "awaited_event_type": "",
            "retry_attempt": 0,
            "failure_reason": "",
            "error_class": "",
            "finished_at": None,
        }
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


_SQL_CACHE: dict[tuple[Any, ...], str] = {}


def _update(model: type[Any], values: dict[str, Any], where: dict[str, Any]) -> None:
    """``UPDATE`` rows of ``model`` matching ``where`` (field = value, ANDed)."""
    _execute(model, "UPDATE", values, where)


def _delete(model: type[Any], where: dict[str, Any]) -> None:
    """``DELETE`` rows of ``model`` matching ``where`` (field = value, ANDed)."""
    _execute(model, "DELETE", {}, where)


def _execute(model: type[Any], verb: str, values: dict[str, Any], where: dict[str, Any]) -> None:
    """One statement on ``model``'s table, every value a parameter prepared by its field.

    On the hottest path (two statements per resume) this costs a fraction of
    the ORM's query building, and a plain DELETE skips the deletion collector
    a table nothing cascades from does not need.
    """
    db = connections[DEFAULT_DB_ALIAS]  # one lookup of the thread's connection
    key = (db.vendor, model._meta.db_table, verb, tuple(values), tuple(where))
    sql = _SQL_CACHE.get(key)
    if sql is None:
        ops = db.ops
        table = ops.quote_name(model._meta.db_table)
        condition = " AND ".join(
            f"{ops.quote_name(model._meta.get_field(name).column)} = %s" for name in where
        )
        if verb == "UPDATE":
            assignments = ", ".join(
                f"{ops.quote_name(model._meta.get_field(name).column)} = %s" for name in values
            )
            sql = f"UPDATE {table} SET {assignments} WHERE {condition}"  # noqa: S608 - identifiers
        else:
            sql = f"DELETE FROM {table} WHERE {condition}"  # noqa: S608 - identifiers
        _SQL_CACHE[key] = sql
    params = [
        model._meta.get_field(name).get_db_prep_save(value, db)
        for name, value in (*values.items(), *where.items())
    ]
    with db.cursor() as cursor:
        cursor.execute(sql, params)


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
    if kind == et.WAITING:
        row.suspension_type = SuspensionType.WAIT
        row.wake_at = _instant(payload["wake_at"])
    elif kind == et.WAITING_FOR_EVENT:
        row.suspension_type = SuspensionType.EVENT
        row.wake_at = row.timeout_at = _instant(payload.get("timeout_at"))
        row.wait_event_type = payload["event_type"]
        row.awaits_key = payload["awaits_key"]
        row.match_expr = payload.get("match")
    elif kind == et.RETRY_SCHEDULED:
        row.suspension_type = SuspensionType.RETRY
        row.wake_at = _instant(payload["wake_at"])
        row.retry_attempt = payload["attempt"]
    else:  # RERUN_REQUESTED
        row.suspension_type = SuspensionType.RERUN
        row.wake_at = row.due_since = event.created_at
    return row


def project_pending(event: Event, replaying: bool) -> None:
    if not is_run_event(event):
        return
    kind = event.type
    if kind in et.SUSPENSIONS:
        row = _pending_row(event)
        # Upsert: a suspension projected twice (at-least-once) leaves one row.
        WorkflowRunPending.objects.bulk_create(
            [row],
            update_conflicts=True,
            unique_fields=["tenant_id", "run_id", "step"],
            update_fields=_PENDING_UPDATE_FIELDS,
        )
        if not replaying and row.wake_at is not None and row.wake_at <= event.created_at:
            notify_due(event.tenant_id)
    elif kind == et.WAKE_REQUESTED:
        rows = WorkflowRunPending.objects.filter(
            tenant_id=event.tenant_id, run_id=event.aggregate_id
        )
        rows.update(wake_at=event.created_at, due_since=event.created_at, run_version=event.version)
        if event.payload.get("awaited_event_id") is not None:
            # An awaited event woke the run: record which one.
            rows.filter(awaited_event_id__isnull=True).update(
                awaited_event_id=event.payload["awaited_event_id"]
            )
        if not replaying:
            notify_due(event.tenant_id)
    elif kind == et.RESUMED or kind in et.TERMINAL:
        if pending_cleared.get() == (event.aggregate_id, event.version):
            return  # the stream's previous event, in this transaction, deleted them
        _delete(WorkflowRunPending, {"tenant_id": event.tenant_id, "run_id": event.aggregate_id})


# --- event wake-up ------------------------------------------------------------


def project_wakeup(event: Event, replaying: bool) -> None:
    """Wake the pending ``wait_for_event`` rows that ``event`` satisfies.

    Each woken run gets a ``workflow.wake-requested`` event naming ``event``
    (the awaited event reference), so the pending table stays a function of
    the run streams alone. The first matching event wins: a row that already
    references an awaited event is left alone. A stored match expression
    that cannot be evaluated fails that run (``invalid_match``) instead of
    failing the domain write.
    """
    from kumiko_workflows.runner import INVALID_MATCH, Failure, RunStream, fail_run

    recheck_after_commit(event.tenant_id, event.type, event_id=event.id)
    rows = (
        WorkflowRunPending.objects.for_tenant(event.tenant_id)
        .waiting_for(event.type)
        .filter(trigger_event_id__lt=event.id)
    )
    if connection.features.has_select_for_update_skip_locked:
        # A row a worker holds is being resumed right now (its timeout, or a
        # wake request); that resume looks for this event itself. Waiting for
        # the worker's lock could deadlock against the caller's own rows.
        rows = rows.select_for_update(skip_locked=True)
    for row in rows:
        try:
            matched = _satisfies(row, event)
        except Exception as exc:
            logger.error(
                "run=%s step=%s has a match expression that cannot be evaluated: %s",
                row.run_id,
                row.step,
                exc,
            )
            try:
                fail_run(
                    RunStream.of_pending(row),
                    Failure(
                        INVALID_MATCH,
                        row.step,
                        f"step {row.step}: its match expression cannot be evaluated",
                        error_class=type(exc).__name__,
                        detail=str(exc),
                    ),
                    state=row.state,
                    retry_from=row.step,
                )
            except Exception:
                logger.exception("run=%s could not be marked failed", row.run_id)
            continue
        if matched:
            wake_with(row, event)


def wake_with(row: WorkflowRunPending, event: Event) -> bool:
    """Append ``workflow.wake-requested`` naming ``event`` as the row's awaited event.

    False if the run moved on meanwhile (resumed, cancelled): its stream
    version decides, as for every write to a run.
    """
    from kumiko_workflows.runner import RunStream

    try:
        with transaction.atomic():
            RunStream.of_pending(row).append(
                et.WAKE_REQUESTED,
                {
                    "workflow_name": row.workflow_name,
                    "step": row.step,
                    "by": "kumiko_workflows",
                    "awaited_event_id": event.id,
                },
            )
    except VersionConflict:
        return False
    return True


def recheck_after_commit(
    tenant_id: str, event_type: str, *, run_id: Any = None, event_id: int | None = None
) -> None:
    """After commit, look again for awaited events a concurrent transaction hid.

    A run suspending on ``wait_for_event`` and an awaited event appended at
    the same moment in another transaction cannot see each other's rows
    (READ COMMITTED). So each side looks again once it has committed: the
    suspension for matching events (``run_id``), the event for waiting rows
    (``event_id``). Whichever commits second sees the other, and wakes the
    run through a ``workflow.wake-requested`` event naming the awaited event.
    SQLite has one writer at a time, so it needs none of this.
    """
    if connection.vendor != "postgresql":
        return

    def recheck() -> None:
        from kumiko_workflows.runner import look_back, look_back_floor

        try:
            with transaction.atomic():
                rows = (
                    WorkflowRunPending.objects.for_tenant(tenant_id)
                    .waiting_for(event_type)
                    .select_for_update(skip_locked=True)
                )
                if run_id is not None:
                    rows = rows.filter(run_id=run_id)
                event = Event.objects.filter(pk=event_id).first() if event_id else None
                if event_id and event is None:
                    return
                for row in rows:
                    if event is not None:
                        # Ids follow insert order, not commit order: an event
                        # that committed after the run suspended may carry a
                        # lower id than its trigger, yet it came "after".
                        found = event if _satisfies(row, event, after_trigger=False) else None
                    else:
                        found = look_back(
                            tenant_id,
                            event_type,
                            row.match_expr,
                            look_back_floor(row.trigger_event_id, row.awaited_refs()),
                            until=row.timeout_at,
                        )
                    if found is not None:
                        wake_with(row, found)
        except Exception:
            logger.exception(
                "tenant=%s event_type=%s re-check for awaited events failed", tenant_id, event_type
            )

    transaction.on_commit(recheck)


def _satisfies(row: WorkflowRunPending, event: Event, *, after_trigger: bool = True) -> bool:
    """Whether ``event`` can end the row's wait: in time, new to the run, and matching."""
    from kumiko_workflows.runner import look_back_floor

    if row.timeout_at is not None and event.created_at > row.timeout_at:
        return False  # too late: the wait timed out first, however late the worker is
    if after_trigger and event.id <= look_back_floor(row.trigger_event_id, row.awaited_refs()):
        return False
    expression = None if row.match_expr is None else matching.validate(row.match_expr)
    return matching.matches(expression, event.payload)


def register(projections: Any) -> None:
    """Register the built-in projections, in the order they must run."""
    from kumiko_workflows.runner import trigger_projection

    projections.register(
        "kumiko_workflows.run_status", set(et.RUN_EVENTS), project_run_status, order=10
    )
    projections.register("kumiko_workflows.pending", set(et.RUN_EVENTS), project_pending, order=20)
    # The wake-up appends run events: a replay replays those, not the wake-up.
    projections.register(
        "kumiko_workflows.wakeup", registry.is_awaited, project_wakeup, order=30, replay=False
    )
    projections.register(
        "kumiko_workflows.trigger", registry.is_trigger, trigger_projection, order=40, replay=False
    )
