"""Running a workflow's steps: the inline start and each resumed segment.

A *segment* opens with ``run-started`` or ``step.resumed`` and runs steps
from a cursor until the run suspends, completes or fails. When a step fails,
the steps' writes are rolled back to a savepoint taken before the first of
them (:class:`LazySavepoint`: none at all for steps that never query) and
``workflow.run-failed`` follows the opening event, so the transaction
around the segment (the domain write that triggered the run, or the
resume) still commits. Raw error text goes to the log and to the mutable
``WorkflowRun.last_error``, never into an event. Starting runs from their
trigger events is :mod:`kumiko_workflows.engine.starts`.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kumiko_workflows import telemetry
from kumiko_workflows.engine import children, compensation, wakeups
from kumiko_workflows.exceptions import (
    InvalidEvent,
    StreamMoved,
    VersionConflict,
)
from kumiko_workflows.models import Event
from kumiko_workflows.store import db
from kumiko_workflows.store.events import append_event
from kumiko_workflows.store.streams import (
    INVALID_STEP_ARGUMENT,
    INVALID_STEP_RESULT,
    STEP_FAILED,
    Failure,
    RunStream,
    fail_run,
    failure_from_exception,
    set_last_error,
)
from kumiko_workflows.workflow import event_types
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.jsonvalues import NotJSON, to_json
from kumiko_workflows.workflow.step_kind import ChildSpec, Step, Suspend, path_text

logger = logging.getLogger(__name__)


class RunContext:
    """What a step's callables receive as ``ctx``.

    ``event`` is the trigger Event, ``steps`` the results so far (by compute
    name and awaits key), ``retry_attempt`` the attempt inside a retry body
    (1 on the first), ``now`` the time the current segment started.
    """

    def __init__(
        self,
        *,
        run_id: uuid.UUID,
        workflow_name: str,
        tenant_id: str,
        event: Event,
        steps: dict[str, Any] | None = None,
        awaited: dict[str, int | None] | None = None,
        now: datetime | None,
        parent: dict[str, Any] | None = None,
        attempts: dict[str, int] | None = None,
        compensable: list[str] | None = None,
    ) -> None:
        self.run_id = run_id
        self.workflow_name = workflow_name
        self.tenant_id = tenant_id
        self.event = event
        self.steps: dict[str, Any] = steps if steps is not None else {}
        self.awaited: dict[str, int | None] = awaited if awaited is not None else {}
        self.retry_attempt = 1
        self.now = now
        #: A child run's parent: {"run_id", "group", "index"} (None for other runs).
        self.parent = parent
        #: The attempt of each retry whose body the run is inside, by its position.
        self.attempts: dict[str, int] = dict(attempts or {})
        #: Positions of the finished steps with a compensation, in order; and the
        #: (step, group) of the child runs a resumed run waits for.
        self.compensable: list[str] = list(compensable or [])
        self.resumed_group: tuple[str, str] | None = None

    def __repr__(self) -> str:
        return f"<RunContext {self.workflow_name} {self.run_id}>"

    def append_event(
        self,
        aggregate_id: uuid.UUID | str,
        aggregate_type: str,
        type: str,
        payload: Mapping[str, Any] | None,
        **kwargs: Any,
    ) -> Event:
        """Append a domain event in the run's transaction (and the run's tenant)."""
        kwargs.setdefault("tenant_id", self.tenant_id)
        # A workflow name may be as long as created_by itself: cut to the column.
        limit = Event._meta.get_field("created_by").max_length
        kwargs.setdefault("created_by", f"workflow:{self.workflow_name}"[:limit])
        return append_event(aggregate_id, aggregate_type, type, payload, **kwargs)

    def snapshot(self) -> dict[str, Any]:
        """Step results for a suspension event: awaited events by reference only."""
        results = {k: v for k, v in self.steps.items() if k not in self.awaited}
        state: dict[str, Any] = {"results": results, "awaited": dict(self.awaited)}
        # Only when there is something to keep: older snapshots read the same.
        if self.parent is not None:
            state["parent"] = self.parent
        if self.attempts:
            state["attempts"] = dict(self.attempts)
        if self.compensable:
            state["compensable"] = list(self.compensable)
        return telemetry.carry(state)


@dataclass
class Cursor:
    """Where a segment starts: the step at ``path`` itself (``at``) or after it."""

    path: tuple[Any, ...] = ()
    #: Whether the run continues past the step at ``path`` (a wait resumed) or runs it.
    after_step: bool = False
    attempt: int = 1


class Executor:
    """Runs a segment's steps: the engine's side of :class:`~kumiko_workflows.steps.Execution`."""

    def __init__(self, workflow: Workflow, ctx: RunContext) -> None:
        assert ctx.now is not None, "run_segment sets ctx.now before any step runs"
        self.workflow = workflow
        self.ctx = ctx
        self.now: datetime = ctx.now
        self.awaits = workflow.awaits
        self._resume_attempt: tuple[tuple[Any, ...], int] | None = None

    def run(self, cursor: Cursor | None) -> None:
        if cursor is None or not cursor.path:
            self._run_list(self.workflow.steps, (), None)
            return
        if not cursor.after_step:
            self._resume_attempt = (cursor.path, cursor.attempt)
        self._run_list(self.workflow.steps, (), cursor)

    def _run_list(
        self, steps: Sequence[Step], prefix: tuple[Any, ...], cursor: Cursor | None
    ) -> None:
        start = 0
        if cursor is not None and cursor.path:
            start = cursor.path[0]
            rest = cursor.path[1:]
            if rest:
                self._descend(
                    steps,
                    prefix,
                    start,
                    rest[0],
                    Cursor(rest[1:], cursor.after_step, cursor.attempt),
                )
                start += 1
            elif cursor.after_step:
                start += 1
        for index in range(start, len(steps)):
            step, path = steps[index], (*prefix, index)
            if self.workflow.compensates and not step.arms():
                # Each step keeps its writes when a later one fails: the
                # compensations undo them, so they must not vanish first.
                compensation.kept(functools.partial(telemetry.run_step, self, step, path))
            else:
                telemetry.run_step(self, step, path)

    def _descend(
        self, steps: Sequence[Step], prefix: tuple[Any, ...], start: int, arm: str, cursor: Cursor
    ) -> None:
        step = steps[start]
        step.resume_in(self, (*prefix, start), arm, cursor)

    # -- the Execution a step runs with ------------------------------------------

    def _label(self, path: tuple[Any, ...]) -> str:
        return self.workflow.label(path_text(path))

    def arg(self, path: tuple[Any, ...], name: str, value: Any) -> Any:
        if not callable(value) or isinstance(value, type):
            return value
        try:
            return value(self.ctx)
        except Exception as exc:
            raise self._step_error(path, f"its {name} callable raised", exc) from exc

    def call(self, path: tuple[Any, ...], fn: Callable[[Any], Any]) -> Any:
        try:
            return fn(self.ctx)
        except Exception as exc:
            raise self._step_error(path, "raised", exc) from exc

    def store(self, path: tuple[Any, ...], name: str, result: Any) -> None:
        try:
            self.ctx.steps[name] = to_json(result, f"ctx.steps[{name!r}]")
        except NotJSON as exc:
            label = self._label(path)
            raise Failure(
                INVALID_STEP_RESULT,
                path_text(path),
                f"{label}: its result is not JSON-serialisable",
                detail=f"{label}: {exc}",
            ) from None

    def _step_error(self, path: tuple[Any, ...], what: str, exc: BaseException) -> Failure:
        where = f"{self._label(path)}: {what}"
        return failure_from_exception(STEP_FAILED, path_text(path), where, exc)

    def invalid(self, path: tuple[Any, ...], detail: str) -> Exception:
        label = self._label(path)
        return Failure(
            INVALID_STEP_ARGUMENT,
            path_text(path),
            f"{label}: invalid argument",
            detail=f"{label}: {detail}",
        )

    def run_steps(self, steps: Sequence[Step], prefix: tuple[Any, ...]) -> None:
        self._run_list(steps, prefix, None)

    def run_steps_from(self, steps: Sequence[Step], prefix: tuple[Any, ...], cursor: Any) -> None:
        self._run_list(steps, prefix, cursor)

    def attempt_in_progress(self, path: tuple[Any, ...]) -> int:
        return int(self.ctx.attempts.get(path_text(path), 1))

    def set_attempt(self, path: tuple[Any, ...], attempt: int | None) -> None:
        self.ctx.attempts.pop(path_text(path), None)
        if attempt is not None:
            self.ctx.attempts[path_text(path)] = attempt

    def children(self, path: tuple[Any, ...], spec: ChildSpec) -> list[dict[str, Any]]:
        return children.run_children(self, path, spec, children.starter())

    def child_failed(
        self, path: tuple[Any, ...], outcome: dict[str, Any], index: int | None
    ) -> Exception:
        return children.child_failure(self._label(path), path_text(path), outcome, index)

    def compensable(self, path: tuple[Any, ...]) -> None:
        self.ctx.compensable.append(path_text(path))

    def resumed_attempt(self, path: tuple[Any, ...]) -> int:
        if self._resume_attempt is not None and self._resume_attempt[0] == path:
            attempt = self._resume_attempt[1]
            self._resume_attempt = None
            return attempt
        return 1

    def attempt(
        self, steps: Sequence[Step], prefix: tuple[Any, ...], attempt: int, cursor: Any = None
    ) -> Any:
        saved_steps, saved_awaited = dict(self.ctx.steps), dict(self.ctx.awaited)
        saved_compensable = list(self.ctx.compensable)
        retry = path_text(prefix[:-1])
        self.ctx.retry_attempt = attempt
        self.ctx.attempts[retry] = attempt
        suspended = False
        try:
            compensation.kept(lambda: self._run_list(steps, prefix, cursor))
        except Suspend:
            suspended = True  # a child run's wait: the attempt goes on at its resume
            raise
        except Failure as failure:
            self.ctx.steps, self.ctx.awaited = saved_steps, saved_awaited
            self.ctx.compensable = saved_compensable
            return failure
        finally:
            self.ctx.retry_attempt = 1
            if not suspended:
                self.ctx.attempts.pop(retry, None)
        return None

    def retried(
        self, path: tuple[Any, ...], failure: Any, why: str, attempt: int, times: int
    ) -> Exception:
        return Failure(
            failure.reason,
            path_text(path),
            f"{self._label(path)}: {why} {failure.error_class or failure.reason}",
            error_class=failure.error_class,
            detail=failure.detail,
            exc=failure.exc,
            attempt=attempt,
            max_attempts=times,
        )

    def note_retry(
        self, path: tuple[Any, ...], attempt: int, times: int, failure: Any, delay: Any
    ) -> None:
        logger.warning(
            "workflow=%s run=%s step=%s attempt=%d/%d failed error=%s; retry in %ss",
            self.workflow.name,
            self.ctx.run_id,
            path_text(path),
            attempt,
            times,
            failure.error_class or failure.reason,
            delay.total_seconds(),
            exc_info=failure.exc,
        )
        set_last_error(self.ctx.tenant_id, self.ctx.run_id, failure.detail)

    def awaited_event(self, awaits_key: str, event_type: str, match: Any) -> Any:
        found = wakeups.look_back(
            self.ctx.tenant_id,
            event_type,
            match,
            self.ctx.event.id,
            wakeups.taken_by_run(self.ctx.awaited),
        )
        if found is not None:
            self.ctx.steps[awaits_key] = found.payload
            self.ctx.awaited[awaits_key] = found.id
        return found

    def suspending_on_event(self) -> None:
        wakeups.suspended_on_event(self.ctx.tenant_id, self.ctx.run_id)


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
