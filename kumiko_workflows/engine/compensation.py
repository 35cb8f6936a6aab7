"""Compensations: undoing a failed (or cancelled) run's finished steps, in reverse order.

A ``compute`` step given ``compensate=undo`` is recorded as finished in the
run's state (``compensable``, in the order the steps finished). In a
workflow with such steps each step keeps its own writes when a later one
fails (the failing step's roll back alone), so that what finished is what
the compensations undo. When a step then fails, instead of
``workflow.run-failed`` the run gets ``workflow.compensation.scheduled``,
due at once: a worker resumes it and runs the compensations, newest first,
each in a savepoint, each followed by ``workflow.step.compensated`` in the
same transaction, so each is done (and recorded) once however often a
worker dies. A compensation that raises is tried again after a backoff
(exponential from ``RETRY_BASE_DELAY``), up to its step's
``compensate_times``; then the run fails with ``compensation_failed``,
listing what was and was not undone. When all went well the run fails with
the original reason, listing the compensations (``compensated``); a run
cancelled with ``cancel_run(..., compensate=True)`` ends cancelled instead.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.store import db
from kumiko_workflows.store.streams import (
    COMPENSATION_FAILED,
    Failure,
    RunStream,
    fail_run,
    set_last_error,
)
from kumiko_workflows.workflow import durations
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.step_kind import Suspend

logger = logging.getLogger("kumiko_workflows.compensation")


def kept(body: Callable[[], None]) -> None:
    """Run ``body`` in a savepoint: rolled back if it raises, kept if it suspends the run."""
    suspension: Suspend | None = None
    with db.atomic():
        try:
            body()
        except Suspend as suspended:
            suspension = suspended
    if suspension is not None:
        raise suspension


def plan(
    compensable: list[str], failure: dict[str, Any] | None, cancel: dict[str, Any] | None
) -> dict[str, Any]:
    """The compensations still to run (newest first), kept in the run's state."""
    return {
        "left": list(reversed(compensable)),
        "done": [],
        "attempt": 0,
        "failure": failure,
        "cancel": cancel,
    }


def scheduled(
    *,
    step: str,
    workflow_name: str,
    workflow_version: int | None,
    fingerprint: str,
    trigger_event_id: int | None,
    state: dict[str, Any],
    wake_at: datetime,
    cancel: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The payload of ``workflow.compensation.scheduled``."""
    return {
        "step": step,
        "workflow_name": workflow_name,
        "workflow_version": workflow_version,
        "definition_fingerprint": fingerprint,
        "trigger_event_id": trigger_event_id,
        "wake_at": wake_at.isoformat(),
        "attempt": state["compensation"]["attempt"],
        "left": len(state["compensation"]["left"]),
        "cancel": cancel,
        "state": state,
    }


def schedule(stream: RunStream, workflow: Workflow, ctx: Any, failure: Failure) -> None:
    """A step failed after compensable steps finished: compensate them next (due at once)."""
    state = ctx.snapshot()
    state["compensation"] = plan(
        ctx.compensable,
        {
            "reason": failure.reason,
            "step": failure.step,
            "error": failure.message,
            "error_class": failure.error_class,
            "attempt": failure.attempt,
            "max_attempts": failure.max_attempts,
        },
        None,
    )
    stream.append(
        et.COMPENSATION_SCHEDULED,
        scheduled(
            step=failure.step,
            workflow_name=workflow.name,
            workflow_version=workflow.version,
            fingerprint=workflow.fingerprint,
            trigger_event_id=stream.trigger_event_id,
            state=state,
            wake_at=ctx.now,
        ),
    )
    logger.error(
        "workflow=%s run=%s step=%s reason=%s failed: %s; compensating %d step(s)",
        workflow.name,
        ctx.run_id,
        failure.step,
        failure.reason,
        failure.message,
        len(ctx.compensable),
        exc_info=failure.exc,
    )
    set_last_error(ctx.tenant_id, ctx.run_id, failure.detail or failure.message)


def compensate(
    workflow: Workflow,
    stream: RunStream,
    ctx: Any,
    state: dict[str, Any],
    opening: tuple[str, dict[str, Any]],
    now: datetime,
) -> str:
    """Run the compensations left in ``state``; return 'suspended' (a backoff) or 'failed'."""
    kept = state["compensation"]
    left, done, attempt = list(kept["left"]), list(kept["done"]), int(kept["attempt"])
    stream.hold(*opening)
    while left:
        path = left[0]
        step = workflow.step_at(path)
        undo = getattr(step, "compensate", None)
        error: BaseException | None = None
        if undo is None:
            error = LookupError(f"step {path} has no compensation in this definition")
        else:
            try:
                with db.atomic():
                    undo(ctx)
            except Exception as exc:
                error = exc
        if error is not None:
            attempt += 1
            times = getattr(step, "compensate_times", 1)
            detail = "".join(traceback.format_exception(error))
            logger.warning(
                "workflow=%s run=%s: the compensation of step %s raised %s (attempt %d of %d)",
                workflow.name,
                ctx.run_id,
                path,
                type(error).__name__,
                attempt,
                times,
                exc_info=error,
            )
            set_last_error(ctx.tenant_id, ctx.run_id, detail)
            if attempt < times:
                base = durations.as_delay(workflow_settings.RETRY_BASE_DELAY)
                _again(
                    workflow,
                    stream,
                    ctx,
                    state,
                    left,
                    done,
                    attempt,
                    now + base * 2 ** (attempt - 1),
                )
                return "suspended"
            _end(workflow, stream, ctx, kept, done, left, type(error).__name__)
            return "failed"
        stream.append(
            et.STEP_COMPENSATED,
            {
                "workflow_name": workflow.name,
                "step": path,
                "name": getattr(step, "name", ""),
                "attempt": attempt + 1,
            },
        )
        done.append(path)
        left.pop(0)
        attempt = 0
    _end(workflow, stream, ctx, kept, done, [], "")
    return "failed"


def _again(
    workflow: Workflow,
    stream: RunStream,
    ctx: Any,
    state: dict[str, Any],
    left: list[str],
    done: list[str],
    attempt: int,
    wake_at: datetime,
) -> None:
    again = {**state, "compensation": {**state["compensation"], "left": left, "done": done}}
    again["compensation"]["attempt"] = attempt
    stream.append(
        et.COMPENSATION_SCHEDULED,
        scheduled(
            step=(state["compensation"].get("failure") or {}).get("step", ""),
            workflow_name=workflow.name,
            workflow_version=workflow.version,
            fingerprint=workflow.fingerprint,
            trigger_event_id=stream.trigger_event_id,
            state=again,
            wake_at=wake_at,
            cancel=state["compensation"].get("cancel"),
        ),
    )


def _end(
    workflow: Workflow,
    stream: RunStream,
    ctx: Any,
    kept: dict[str, Any],
    done: list[str],
    left: list[str],
    error_class: str,
) -> None:
    """The run's last event: failed (or cancelled), with the compensations listed."""
    listed: dict[str, Any] = {"compensated": done}
    cancel = kept.get("cancel")
    if left:
        listed["not_compensated"] = left
    if cancel and not left:
        stream.append(
            et.RUN_CANCELLED,
            {
                "workflow_name": workflow.name,
                "reason": cancel.get("reason", ""),
                "by": cancel.get("by", ""),
                **listed,
            },
            created_by=cancel.get("by", ""),
        )
        return
    original = kept.get("failure") or {}
    if left:
        failure = Failure(
            COMPENSATION_FAILED,
            left[0],
            f"the compensation of {workflow.label(left[0])} failed on every attempt",
            error_class=error_class,
        )
        listed["original_reason"] = original.get("reason") or ("cancelled" if cancel else "")
    else:
        failure = Failure(
            original.get("reason", ""),
            original.get("step", ""),
            original.get("error", ""),
            error_class=original.get("error_class", ""),
            attempt=original.get("attempt") or 0,
            max_attempts=original.get("max_attempts") or 0,
        )
    state = ctx.snapshot()
    fail_run(stream, failure, state=state, retry_from=None, extra=listed)
