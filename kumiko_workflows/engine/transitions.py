"""Sending the run signals (:mod:`kumiko_workflows.signals`) once their transaction commits.

A reaction to run events, registered with the projections (never
replayed): for each transition a receiver listens to, it registers a
callback with the engine's ``on_commit``. Django drops a callback whose
savepoint or transaction rolls back, so a transition undone (a caller's
rollback around an inline start, a failing step's savepoint around a run it
started, a worker's batch rolled back after an engine error) sends nothing,
and the transition written again later sends once, when that commits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

from kumiko_workflows import event_types as et
from kumiko_workflows import signals
from kumiko_workflows.models import Event
from kumiko_workflows.store import db
from kumiko_workflows.workflow import suspensions
from kumiko_workflows.workflow.definition import registry

logger = logging.getLogger("kumiko_workflows.signals")


def _started(event: Event) -> dict[str, Any]:
    return {
        "idempotency_key": event.payload.get("idempotency_key"),
        "trigger_event_id": event.payload.get("trigger_event_id"),
    }


def _suspended(event: Event) -> dict[str, Any]:
    record = suspensions.for_event(event.type)
    assert record is not None, f"{event.type} is not a suspension"
    wake_at = record.status_columns(event.payload, event.created_at)["wake_at"]
    return {
        "step": event.payload["step"],
        "suspension_type": record.suspension_type,
        "wake_at": wake_at,
    }


def _completed(event: Event) -> dict[str, Any]:
    return {}


def _failed(event: Event) -> dict[str, Any]:
    return {
        "reason": event.payload.get("reason", ""),
        "step": event.payload.get("step", ""),
        "error_class": event.payload.get("error_class", ""),
    }


def _cancelled(event: Event) -> dict[str, Any]:
    return {"reason": event.payload.get("reason", ""), "by": event.payload.get("by", "")}


#: The signal of each run event that is a transition, and its own arguments.
SIGNALS: dict[str, tuple[Signal, Callable[[Event], dict[str, Any]]]] = {
    et.RUN_STARTED: (signals.run_started, _started),
    et.WAITING: (signals.run_suspended, _suspended),
    et.WAITING_FOR_EVENT: (signals.run_suspended, _suspended),
    et.RETRY_SCHEDULED: (signals.run_suspended, _suspended),
    et.RUN_COMPLETED: (signals.run_completed, _completed),
    et.RUN_FAILED: (signals.run_failed, _failed),
    et.RUN_CANCELLED: (signals.run_cancelled, _cancelled),
}
HANDLED = frozenset(SIGNALS)


def announce(event: Event, replaying: bool) -> None:
    """Send ``event``'s signal after commit, if anyone listens to it (never on a replay)."""
    if replaying or event.aggregate_type != et.RUN_AGGREGATE_TYPE:
        return
    signal, arguments = SIGNALS[event.type]
    if not signal.receivers:
        return  # the common case costs one lookup
    workflow_name = event.payload.get("workflow_name", "")
    sender = registry.get(workflow_name)
    if not signal.has_listeners(sender):
        return
    kwargs = {
        "run_id": event.aggregate_id,
        "workflow_name": workflow_name,
        "tenant_id": event.tenant_id,
        "event": event,
        **arguments(event),
    }
    db.on_commit(lambda: _send(signal, sender, kwargs), robust=True)


def _send(signal: Signal, sender: Any, kwargs: dict[str, Any]) -> None:
    for receiver, response in signal.send_robust(sender, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "run=%s workflow=%s event=%s: signal receiver %r raised %s",
                kwargs["run_id"],
                kwargs["workflow_name"],
                kwargs["event"].type,
                receiver,
                type(response).__name__,
                exc_info=response,
            )
