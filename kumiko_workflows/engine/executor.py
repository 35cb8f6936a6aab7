"""Running a segment's steps from a cursor: the engine's side of a step kind's ``Execution``.

:class:`Executor` walks a workflow's steps from a :class:`Cursor` (a
resume's position, or the first step), runs each in a span of its own,
keeps compute results as JSON, turns a step's error into the run's
failure, and gives the step kinds what they ask of the engine: child runs,
retry attempts, awaited events already in the store. The segment around
it, its savepoint and its closing event, is :mod:`kumiko_workflows.engine.segment`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kumiko_workflows import telemetry
from kumiko_workflows.engine import children, compensation, wakeups
from kumiko_workflows.engine.run_context import RunContext
from kumiko_workflows.store.streams import (
    INVALID_STEP_ARGUMENT,
    INVALID_STEP_RESULT,
    STEP_FAILED,
    Failure,
    failure_from_exception,
    set_last_error,
)
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.jsonvalues import NotJSON, to_json
from kumiko_workflows.workflow.step_kind import ChildSpec, Step, Suspend, path_text

logger = logging.getLogger(__name__)


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

    def _step_error(self, path: tuple[Any, ...], what: str, exc: BaseException) -> Failure:
        where = f"{self._label(path)}: {what}"
        return failure_from_exception(STEP_FAILED, path_text(path), where, exc)

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
