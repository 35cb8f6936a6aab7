"""A run's event stream and the failures written to it.

:class:`RunStream` appends a run's events at strictly increasing versions
(the unique stream version is every race's referee); :func:`fail_run`
writes ``workflow.run-failed`` with generic text only and keeps the raw
error in the log and in the mutable ``WorkflowRun.last_error``.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kumiko_workflows import telemetry
from kumiko_workflows.exceptions import InvalidEvent
from kumiko_workflows.models import Event, WorkflowRun
from kumiko_workflows.store import db
from kumiko_workflows.store.event_pairs import append_engine_pair
from kumiko_workflows.store.events import append_event
from kumiko_workflows.store.pending_hint import pending_cleared
from kumiko_workflows.store.stream_ids import engine_stream
from kumiko_workflows.workflow import event_types, priorities

logger = logging.getLogger(__name__)

# Machine-readable reasons of workflow.run-failed.
STEP_FAILED = "step_failed"
INVALID_STEP_ARGUMENT = "invalid_step_argument"
INVALID_STEP_RESULT = "invalid_step_result"
FILTER_FAILED = "filter_failed"
IDEMPOTENCY_KEY_FAILED = "idempotency_key_failed"
DEFINITION_CHANGED = "workflow_definition_changed"
TRIGGER_EVENT_UNAVAILABLE = "trigger_event_unavailable"
AWAITED_EVENT_UNAVAILABLE = "awaited_event_unavailable"
INVALID_MATCH = "invalid_match"
INVALID_PENDING_ROW = "invalid_pending_row"
INTERNAL_ERROR = "internal_error"
RESUME_FAILED_REPEATEDLY = "resume_failed_repeatedly"
#: A child run (call_workflow, fan_out) failed or was cancelled.
CHILD_FAILED = "child_failed"
#: A call_workflow or fan_out step's children did not finish within its timeout.
CHILD_TIMEOUT = "child_timeout"
#: A compensation of a finished step failed on every attempt: not everything was undone.
COMPENSATION_FAILED = "compensation_failed"
LIMIT_KEY_FAILED = "limit_key_failed"
#: Every reason above, in the order the admin's filter lists them.
FAILURE_REASONS = (
    STEP_FAILED,
    INVALID_STEP_ARGUMENT,
    INVALID_STEP_RESULT,
    FILTER_FAILED,
    IDEMPOTENCY_KEY_FAILED,
    DEFINITION_CHANGED,
    TRIGGER_EVENT_UNAVAILABLE,
    AWAITED_EVENT_UNAVAILABLE,
    INVALID_MATCH,
    INVALID_PENDING_ROW,
    INTERNAL_ERROR,
    RESUME_FAILED_REPEATEDLY,
    CHILD_FAILED,
    CHILD_TIMEOUT,
    COMPENSATION_FAILED,
    LIMIT_KEY_FAILED,
)


#: The events whose pending row's claim order depends on the run's priority.
_RECORDS_PRIORITY = frozenset(
    {*event_types.SUSPENSIONS, event_types.WAKE_REQUESTED, event_types.SLOT_OFFERED}
)
_CLEARS_PENDING = frozenset({event_types.RUN_STARTED, event_types.RESUMED, *event_types.TERMINAL})
#: Events that leave a run's pending rows as they were (a slot or rate start taken at a claim).
_KEEPS_PENDING = frozenset({event_types.SLOT_TAKEN, event_types.RATE_TAKEN})


@dataclass
class RunStream:
    """The run's event stream, appended at strictly increasing versions."""

    run_id: uuid.UUID
    tenant_id: str
    workflow_name: str
    version: int
    fingerprint: str
    trigger_event_id: int | None
    #: False when every append happens inside an atomic block that is unwound
    #: on any error (the resume row's, the inline start's): no savepoint each.
    savepoint: bool = True
    #: The run's priority: every suspension and wake-up appended records it
    #: (and its head start), so the pending row's claim order is in the stream.
    priority: int = 0
    #: Whether this object's last append left the run without pending rows.
    _no_pending: bool = field(default=False, init=False, repr=False)
    #: An event to append with the next one (:meth:`hold`).
    _held: tuple[str, dict[str, Any]] | None = field(default=None, init=False, repr=False)
    #: A child run's parent ({"run_id", "group"}): written into its terminal
    #: event, which counts it in the parent's fan-in.
    parent: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def of_pending(cls, row: Any, *, deleted: bool = False) -> RunStream:
        """The stream of a pending row's run, positioned after its suspension.

        ``deleted``: the claim deleted the row (and, unless it waits for an
        event, the run has no wait keys either).
        """
        stream = cls(
            row.run_id,
            row.tenant_id,
            row.workflow_name,
            row.run_version,
            row.definition_fingerprint,
            row.trigger_event_id,
            priority=row.priority or 0,
        )
        stream._no_pending = deleted and not row.wait_event_type
        state = row.state if isinstance(row.state, dict) else {}
        stream.parent = state.get("parent") if isinstance(state.get("parent"), dict) else None
        return stream

    @classmethod
    def of_run(cls, run: Any) -> RunStream:
        """The stream of a run's status row, positioned after the last event it saw."""
        stream = cls(
            run.run_id,
            run.tenant_id,
            run.workflow_name,
            run.version,
            run.definition_fingerprint,
            run.trigger_event_id,
            priority=run.priority,
        )
        if run.parent_run_id is not None:  # a child run: its end counts in its parent's fan-in
            stream.parent = {"run_id": str(run.parent_run_id), "group": run.parent_group}
        return stream

    def mark(self) -> tuple[int, bool]:
        """Where the stream stands, to :meth:`rewind` to after a savepoint rolls back."""
        return self.version, self._no_pending

    def rewind(self, mark: tuple[int, bool]) -> None:
        self.version, self._no_pending = mark
        self._held = None

    def hold(self, type: str, payload: dict[str, Any]) -> None:
        """Append ``type`` together with the next event (one statement where possible).

        Only inside an atomic block unwound on any error (``savepoint`` False).
        """
        assert not self.savepoint and self._held is None, "hold() needs a block unwound on errors"
        self._held = (type, payload)

    def append(self, type: str, payload: dict[str, Any], created_by: str = "") -> Event:
        if self.priority and type in _RECORDS_PRIORITY:
            payload = priorities.recorded(payload, self.priority)
        if self.parent is not None and type in event_types.TERMINAL:
            payload = {**payload, "parent": self.parent}
        held, self._held = self._held, None
        count = 2 if held is not None else 1
        hint = None
        if self._no_pending:
            hint = pending_cleared.set((self.run_id, self.version + 1, self.version + count))
        elif held is not None and held[0] in _CLEARS_PENDING:
            # The held event's projection clears what the next one would find.
            hint = pending_cleared.set((self.run_id, self.version + 2, self.version + 2))
        by = created_by or "kumiko_workflows"
        try:
            with engine_stream():
                if held is not None:
                    _, event = append_engine_pair(
                        self.run_id,
                        event_types.RUN_AGGREGATE_TYPE,
                        held,
                        (type, payload),
                        tenant_id=self.tenant_id,
                        expected_version=self.version,
                        created_by=by,
                    )
                else:
                    event = append_event(
                        self.run_id,
                        event_types.RUN_AGGREGATE_TYPE,
                        type,
                        payload,
                        tenant_id=self.tenant_id,
                        expected_version=self.version,
                        created_by=by,
                        savepoint=self.savepoint,
                    )
        except InvalidEvent:
            self._held = held  # refused before any SQL: nothing was written
            raise
        finally:
            if hint is not None:
                pending_cleared.reset(hint)
        self.version = event.version
        # A new stream has no pending rows; a resume or an end deletes them.
        self._no_pending = type in _CLEARS_PENDING or (self._no_pending and type in _KEEPS_PENDING)
        telemetry.appended(self, type, payload)
        return event


@dataclass
class Failure(Exception):
    reason: str
    step: str
    message: str  # generic, safe for an immutable event
    error_class: str = ""
    detail: str = ""  # raw text: log and WorkflowRun.last_error only
    exc: BaseException | None = field(default=None, repr=False)
    #: The attempt of a retry that failed last, and how many it had (0: not a retry's).
    attempt: int = 0
    max_attempts: int = 0

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)


def failure_from_exception(reason: str, step: str, what: str, exc: BaseException) -> Failure:
    """A failure caused by user code raising ``exc``: generic text, class, traceback.

    Unless the engine's connection died under that code (the server ended
    it): nothing the code did wrong, so ``exc`` itself is raised again, as
    the infrastructure error it is. A worker's pass then ends, the worker
    backs off and reconnects, and the run is resumed again.
    """
    if db.connection_broken():
        raise exc
    name = type(exc).__name__
    return Failure(
        reason,
        step,
        f"{what} {name}",
        error_class=name,
        detail="".join(traceback.format_exception(exc)),
        exc=exc,
    )


#: Called as ``recorder(run_id)`` each time a run's raw error is recorded: after
#: the failed step's writes rolled back, in the run's transaction. The tasks
#: backend (kumiko_workflows.tasks) keeps each failed attempt's error there.
error_recorders: list[Callable[[uuid.UUID], None]] = []


def set_last_error(tenant_id: str, run_id: uuid.UUID, detail: str) -> None:
    if detail:
        WorkflowRun.objects.filter(tenant_id=tenant_id, run_id=run_id).update(
            last_error=detail[:20_000]
        )
    for recorder in error_recorders:
        recorder(run_id)


def fail_run(
    stream: RunStream,
    failure: Failure,
    *,
    state: dict[str, Any] | None = None,
    retry_from: str | None = None,
    suspension: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Event:
    """Append ``workflow.run-failed`` (generic text only) and record the raw error.

    ``retry_from`` is the step a rerun starts at; ``suspension``, for a run
    that failed resuming one, the suspension a rerun resumes instead
    (:func:`kumiko_workflows.workflow.suspensions.standing`).
    """
    kept = {} if suspension is None else {"suspension": suspension}
    kept.update(extra or {})
    event = stream.append(
        event_types.RUN_FAILED,
        {
            **kept,
            "workflow_name": stream.workflow_name,
            "definition_fingerprint": stream.fingerprint,
            "step": failure.step,
            "reason": failure.reason,
            "error": failure.message,
            "error_class": failure.error_class,
            "attempt": failure.attempt,
            "max_attempts": failure.max_attempts,
            "retry_from": retry_from,
            "state": state or {"results": {}, "awaited": {}},
        },
    )
    logger.error(
        "workflow=%s run=%s step=%s reason=%s failed: %s",
        stream.workflow_name,
        stream.run_id,
        failure.step,
        failure.reason,
        failure.message,
        exc_info=failure.exc,
    )
    set_last_error(stream.tenant_id, stream.run_id, failure.detail or failure.message)
    return event
