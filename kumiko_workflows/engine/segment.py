"""Running a workflow's steps: the inline start and each resumed segment.

A *segment* opens with ``run-started`` or ``step.resumed`` and runs steps
from a cursor until the run suspends, completes or fails. When a step fails,
the steps' writes are rolled back to a savepoint taken before the first of
them (:class:`LazySavepoint`: none at all for steps that never query) and
``workflow.run-failed`` follows the opening event, so the transaction
around the segment (the domain write that triggered the run, or the
resume) still commits. Raw error text goes to the log and to the mutable
``WorkflowRun.last_error``, never into an event. Starting runs from their
trigger events is :mod:`kumiko_workflows.engine.starts`; the steps
themselves run in :mod:`kumiko_workflows.engine.executor`, with the
``ctx`` of :mod:`kumiko_workflows.engine.run_context`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kumiko_workflows import telemetry
from kumiko_workflows.engine import children, compensation
from kumiko_workflows.engine.executor import Cursor, Executor
from kumiko_workflows.engine.run_context import RunContext
from kumiko_workflows.exceptions import InvalidEvent, StreamMoved, VersionConflict
from kumiko_workflows.models import Event
from kumiko_workflows.store import db
from kumiko_workflows.store.streams import INVALID_STEP_RESULT, Failure, RunStream, fail_run
from kumiko_workflows.workflow import event_types
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.step_kind import Suspend, path_text


class LazySavepoint:
    """A savepoint taken only when the code it watches first touches the database.

    A failing step must take back the database writes of the segment's
    steps, but not the run's own events. Most steps never query: watching
    them costs no round trip, and a step that does query pays for the
    savepoint once, just before its first statement (on the engine's
    connection; its writes through other aliases are its own). Installed as
    an execute wrapper, so a step's own atomic blocks nest inside it.
    """

    def __init__(self) -> None:
        self._atomic: Any = None
        self._busy = False
        self.paused = False

    def _before(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if self._atomic is None and not self._busy and not self.paused:
            self._busy = True  # the SAVEPOINT statement itself passes through here
            try:
                atomic = db.atomic()
                atomic.__enter__()
                self._atomic = atomic
            finally:
                self._busy = False
        return execute(sql, params, many, context)

    @contextmanager
    def watching(self) -> Iterator[None]:
        with db.engine().execute_wrapper(self._before):
            yield

    def end(self, error: BaseException | None) -> None:
        """Release the savepoint (``error`` None) or roll back to it; a no-op if none was taken."""
        atomic, self._atomic = self._atomic, None
        if atomic is not None:
            if error is None:
                atomic.__exit__(None, None, None)
            else:
                atomic.__exit__(type(error), error, error.__traceback__)


def run_segment(
    workflow: Workflow,
    stream: RunStream,
    ctx: RunContext,
    cursor: Cursor | None,
    opening: tuple[str, dict[str, Any]],
    *,
    hold_opening: bool = False,
) -> str:
    """Append ``opening``, run steps from ``cursor``; return 'completed', 'suspended' or 'failed'.

    Raises :class:`VersionConflict` if the opening event loses its race. A
    failing step fails the run: the steps' database writes are rolled back
    (:class:`LazySavepoint`) and ``workflow.run-failed`` follows the
    opening. Any other error propagates with the run's events written so
    far: the caller's transaction (or savepoint) must be rolled back.

    ``hold_opening`` appends the opening together with the segment's last
    event (:meth:`RunStream.hold`), for a caller that holds the run (a
    resume, whose claim took its pending row) and needs no instant from it.
    """
    start_state = ctx.snapshot()
    if cursor is None or not cursor.path:
        retry_from = "0"
    elif cursor.after_step:
        retry_from = workflow.next_position(path_text(cursor.path))
    else:
        retry_from = path_text(cursor.path)
    if hold_opening:
        assert ctx.now is not None, "a held opening gives no instant to run at"
        stream.hold(*opening)
    else:
        opened = stream.append(*opening)
        if ctx.now is None:
            ctx.now = opened.created_at  # an inline start runs at its run-started instant
    savepoint = LazySavepoint()
    try:
        with savepoint.watching():
            suspension: Suspend | None = None
            try:
                Executor(workflow, ctx).run(cursor)
            except Suspend as suspended:
                suspension = suspended
            savepoint.paused = True  # the run's own events need none
            if suspension is None:
                _complete(workflow, stream, ctx)
                outcome = "completed"
            else:
                _suspend(workflow, stream, ctx, suspension)
                outcome = "suspended"
    except Failure as failure:
        if workflow.compensates and ctx.compensable:
            # Each step kept its writes (the failing one's rolled back alone):
            # the finished steps' compensations undo them, next, in a worker.
            savepoint.end(None)
            compensation.schedule(stream, workflow, ctx, failure)
            return "suspended"
        savepoint.end(failure)
        fail_run(stream, failure, state=start_state, retry_from=retry_from)
        return "failed"
    except VersionConflict as exc:
        savepoint.end(exc)
        telemetry.conflict("stream_moved")
        # Only an opening appended first races (a start's); a conflict after
        # it, or with a held opening, means the stream moved under a run
        # its caller holds: an error, not a skip.
        raise StreamMoved(f"run {stream.run_id}: {exc}") from exc
    except BaseException as exc:
        savepoint.end(exc)
        raise
    savepoint.end(None)
    return outcome


def _complete(workflow: Workflow, stream: RunStream, ctx: RunContext) -> None:
    """Append ``workflow.run-completed`` with the final step results (awaited events by id).

    The results are what a run produced; kept in the event, as every
    suspension keeps them, they outlive the run. Results too big for an
    event (refused before any SQL) are left out: the run completed all the same.
    """
    payload = {
        "workflow_name": workflow.name,
        # Names the run's version for its signal's sender without a lookup.
        "workflow_version": workflow.version,
        "step_count": len(workflow.steps),
        "state": ctx.snapshot(),
    }
    if ctx.parent is not None:
        # What the parent's call_workflow or fan_out step receives.
        payload["result"] = children.result_of(workflow, ctx)
    try:
        stream.append(event_types.RUN_COMPLETED, payload)
    except InvalidEvent:
        stream.append(event_types.RUN_COMPLETED, {**payload, "state": None})


def _suspend(workflow: Workflow, stream: RunStream, ctx: RunContext, suspension: Suspend) -> None:
    payload = {
        **suspension.payload,
        "workflow_name": workflow.name,
        "workflow_version": workflow.version,
        "definition_fingerprint": workflow.fingerprint,
        "trigger_event_id": stream.trigger_event_id,
        "state": ctx.snapshot(),
    }
    try:
        stream.append(suspension.type, payload)
    except InvalidEvent as exc:
        # Results too big to keep (refused before any SQL): fail the run, or
        # every pass would run the steps again and hit the limit again.
        step = suspension.payload["step"]
        raise Failure(
            INVALID_STEP_RESULT,
            step,
            f"{workflow.label(step)}: the step results cannot be saved to suspend",
            detail=f"{workflow.label(step)}: {exc}",
        ) from None


def fail_opened(
    stream: RunStream,
    opening: tuple[str, dict[str, Any]],
    failure: Failure,
    *,
    state: dict[str, Any] | None,
    retry_from: str | None,
    suspension: dict[str, Any] | None = None,
) -> Event:
    """Append ``opening``, then ``workflow.run-failed``: a segment failed before any step ran."""
    stream.append(*opening)
    return fail_run(stream, failure, state=state, retry_from=retry_from, suspension=suspension)
