"""The step vocabulary: ``compute``, ``wait``, ``wait_for_event``, ``retry``, ``branch``.

Each function returns an immutable step object. Any argument may be a plain
value or a callable taking the run's ``ctx``; static values are checked when
the workflow is defined, callable results when the step runs. What every
step kind is (the :class:`Step` base class) is
:mod:`kumiko_workflows.workflow.step_kind`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kumiko_workflows import match as match_builder
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import (
    InvalidDuration,
    InvalidMatchExpression,
    WorkflowDefinitionError,
)
from kumiko_workflows.workflow import durations, matching
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.arguments import int_between
from kumiko_workflows.workflow.jsonvalues import NotJSON, to_json
from kumiko_workflows.workflow.step_kind import (
    Execution,
    Path,
    Problem,
    Step,
    Suspend,
    _step_list,
    callable_name,
    describe_value,
    is_static,
    iter_steps,
    path_text,
)

BACKOFFS = ("linear", "exponential")
DURATION_HINT = (
    "Give an ISO 8601 duration (PT90S, P1DT2H), an instant with an offset "
    "(2026-01-31T09:00:00Z), a timedelta or an aware datetime."
)


def _time_problem(where: str, arg: str, value: Any) -> Iterator[Problem]:
    try:
        durations.check_static(value)
    except InvalidDuration as exc:
        yield "E006", f"{where}: {arg}={value!r} is invalid: {exc}", DURATION_HINT


def _wake_time(execution: Execution, path: Path, name: str, value: Any) -> datetime:
    try:
        return durations.wake_time(value, execution.now)
    except InvalidDuration as exc:
        raise execution.invalid(path, f"{name}={value!r}: {exc}") from None


@dataclass(frozen=True, eq=False)
class Compute(Step):
    name: str
    fn: Callable[[Any], Any]
    #: ``undo(ctx)``: run, once, if the run fails after this step finished.
    compensate: Callable[[Any], Any] | None = None
    #: Attempts of the compensation (backoff exponential from RETRY_BASE_DELAY).
    compensate_times: int = 3
    kind = "compute"
    callable_args = ("fn",)

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "fn": callable_name(self.fn),
        }
        if self.compensate is not None:  # absent otherwise: existing fingerprints stay
            described["compensate"] = callable_name(self.compensate)
            described["compensate_times"] = self.compensate_times
        return described

    def label(self) -> str:
        return f"compute {self.name!r}"

    def result_name(self) -> str | None:
        return self.name

    def callables(self) -> Iterator[tuple[str, Callable[..., Any]]]:
        yield from super().callables()
        if self.compensate is not None:
            yield "compensate", self.compensate

    def run(self, execution: Execution, path: Path) -> None:
        execution.store(path, self.name, execution.call(path, self.fn))
        if self.compensate is not None:
            execution.compensable(path)


@dataclass(frozen=True, eq=False)
class Wait(Step):
    for_: Any
    kind = "wait"
    suspends = True
    resumes_from = ("wait",)
    callable_args = ("for_",)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "for": describe_value(self.for_)}

    def problems(self, awaits: Mapping[str, str], path: Path) -> Iterator[Problem]:
        if is_static(self.for_):
            yield from _time_problem(f"step {path_text(path)} ({self.label()})", "for_", self.for_)

    def run(self, execution: Execution, path: Path) -> None:
        wake_at = _wake_time(execution, path, "for_", execution.arg(path, "for_", self.for_))
        raise Suspend(et.WAITING, {"step": path_text(path), "wake_at": wake_at.isoformat()})


@dataclass(frozen=True, eq=False)
class WaitForEvent(Step):
    awaits_key: str
    match: Any = None
    timeout: Any = None
    kind = "wait_for_event"
    suspends = True
    resumes_from = ("event",)
    callable_args = ("match", "timeout")

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "awaits": self.awaits_key,
            "match": self._match_print(),
            "timeout": describe_value(self.timeout),
        }

    def _match_print(self) -> Any:
        if isinstance(self.match, match_builder.Expression):
            return self.match.fingerprint(callable_name)
        # match.ANY is stored as no match is, so it is fingerprinted alike:
        # adding it to silence W090 strands no run.
        return describe_value(None if self.match is match_builder.ANY else self.match)

    def label(self) -> str:
        return f"wait_for_event {self.awaits_key!r}"

    def callables(self) -> Iterator[tuple[str, Callable[..., Any]]]:
        yield from super().callables()
        if isinstance(self.match, match_builder.Expression):
            for where, fn in self.match.callables():
                yield f"match value of {where}", fn

    def result_name(self) -> str | None:
        return self.awaits_key

    def problems(self, awaits: Mapping[str, str], path: Path) -> Iterator[Problem]:
        where = f"step {path_text(path)} ({self.label()})"
        if self.awaits_key not in awaits:
            declared = ", ".join(sorted(awaits)) or "none"
            yield (
                "E001",
                f"{where} names awaits key {self.awaits_key!r}, which is not declared "
                f"(declared: {declared})",
                "Declare it: define_workflow(awaits={key: 'event.type'}).",
            )
        if self.match is None:
            event_type = awaits.get(self.awaits_key, "awaited")
            yield (
                "W090",
                f"{where} has no match: any {event_type!r} event ends this wait in every "
                "run waiting here (one user's event would end another user's run)",
                "Say which event is this run's, e.g. match=match.eq('user_id', "
                "match.from_trigger('user_id')) (from kumiko_workflows import match), or "
                "match=match.any() if any such event is meant to end every such wait.",
            )
        elif isinstance(self.match, match_builder.Expression):
            if self.match.is_static():
                yield from _match_problems(where, self.match.to_json)
        elif self.match is not match_builder.ANY and is_static(self.match):
            yield from _match_problems(where, lambda: matching.validate(self.match))
        if self.timeout is not None and is_static(self.timeout):
            yield from _time_problem(where, "timeout", self.timeout)

    def run(self, execution: Execution, path: Path) -> None:
        match = self._stored_match(execution, path)
        timeout = execution.arg(path, "timeout", self.timeout)
        timeout_at = None if timeout is None else _wake_time(execution, path, "timeout", timeout)
        event_type = execution.awaits[self.awaits_key]
        found = execution.awaited_event(self.awaits_key, event_type, match)
        if found is not None:
            return
        execution.suspending_on_event()
        raise Suspend(
            et.WAITING_FOR_EVENT,
            {
                "step": path_text(path),
                "awaits_key": self.awaits_key,
                "event_type": event_type,
                "match": match,
                "timeout_at": timeout_at.isoformat() if timeout_at else None,
            },
        )

    def _stored_match(self, execution: Execution, path: Path) -> dict[str, Any] | None:
        """The match as the suspension stores it: JSON, or None for any event."""
        match = self.match
        if not isinstance(match, match_builder.Expression):
            match = execution.arg(path, "match", match)  # a callable may return a builder's
        if match is None or match is match_builder.ANY:
            return None
        try:
            if isinstance(match, match_builder.Expression):
                match = match.resolve(execution.ctx, lambda fn: execution.arg(path, "match", fn))
            stored: dict[str, Any] = to_json(matching.validate(match), "match")
            return stored
        except (InvalidMatchExpression, NotJSON) as exc:
            raise execution.invalid(path, str(exc)) from None


def _match_problems(where: str, stored: Callable[[], dict[str, Any]]) -> Iterator[Problem]:
    """E002 for a malformed static match, W091 for a comparison that can never match."""
    try:
        expression = stored()
    except InvalidMatchExpression as exc:
        yield "E002", f"{where}: {exc}", "The grammar: docs/howto/match-expressions.md."
        return
    for problem in matching.never_matching(expression):
        yield (
            "W091",
            f"{where}: match expression {problem}",
            "Ordered comparisons take a number or a string; 'in' takes at least one value. "
            "The match builder (kumiko_workflows.match) refuses both when called.",
        )


@dataclass(frozen=True, eq=False)
class Retry(Step):
    times: Any
    backoff: Any
    do: tuple[Step, ...]
    base_delay: Any = None
    max_delay: Any = None
    give_up_on: tuple[type[BaseException], ...] = ()
    kind = "retry"
    resumes_from = ("retry",)
    callable_args = ("times", "backoff", "base_delay", "max_delay")

    def arms(self) -> dict[str, tuple[Step, ...]]:
        return {"do": self.do}

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "times": describe_value(self.times),
            "backoff": describe_value(self.backoff),
            "base_delay": describe_value(self.base_delay),
            "max_delay": describe_value(self.max_delay),
            "give_up_on": [callable_name(exc) for exc in self.give_up_on],
        }

    def problems(self, awaits: Mapping[str, str], path: Path) -> Iterator[Problem]:
        where = f"step {path_text(path)} ({self.label()})"
        for inner_path, inner in iter_steps(self.do, (*path, "do")):
            if inner.suspends and not inner.suspends_in_retry:
                yield (
                    "E003",
                    f"{where} contains the suspending step {path_text(inner_path)} "
                    f"({inner.label()}); a retry body may not suspend",
                    "Move waits out of retry(do=[...]).",
                )
        if is_static(self.times) and _bad_times(self.times):
            yield (
                "E004",
                f"{where}: times must be an integer >= 1, got {self.times!r}",
                "times counts all attempts, the first included.",
            )
        if is_static(self.backoff) and self.backoff not in BACKOFFS:
            yield (
                "E005",
                f"{where}: backoff must be 'linear' or 'exponential', got {self.backoff!r}",
                "linear waits base × attempt; exponential waits base × 2^(attempt-1).",
            )
        for arg in ("base_delay", "max_delay"):
            value = getattr(self, arg)
            if value is not None and is_static(value):
                try:
                    durations.as_delay(value)
                except InvalidDuration as exc:
                    yield "E006", f"{where}: {arg}={value!r} is invalid: {exc}", DURATION_HINT
        if not self.do:
            yield "E013", f"{where} has an empty body", "Give retry(do=[...]) a step."

    def run(self, execution: Execution, path: Path) -> None:
        self._attempt(execution, path, execution.resumed_attempt(path), None)

    def resume_in(self, execution: Execution, path: Path, arm: str, cursor: Any) -> None:
        # A child run's wait inside the body: the attempt it belongs to goes on.
        self._attempt(execution, path, execution.attempt_in_progress(path), cursor)

    def _attempt(self, execution: Execution, path: Path, attempt: int, cursor: Any) -> None:
        times = execution.arg(path, "times", self.times)
        backoff = execution.arg(path, "backoff", self.backoff)
        if _bad_times(times):
            raise execution.invalid(path, f"times must be an integer >= 1, got {times!r}")
        if backoff not in BACKOFFS:
            raise execution.invalid(
                path, f"backoff must be 'linear' or 'exponential', got {backoff!r}"
            )
        try:
            base_value = execution.arg(path, "base_delay", self.base_delay)
            base = durations.as_delay(
                workflow_settings.RETRY_BASE_DELAY if base_value is None else base_value
            )
            cap_value = execution.arg(path, "max_delay", self.max_delay)
            cap = None if cap_value is None else durations.as_delay(cap_value)
        except InvalidDuration as exc:
            raise execution.invalid(path, str(exc)) from None
        failure = execution.attempt(self.do, (*path, "do"), attempt, cursor)
        if failure is None:
            return
        given_up = failure.exc is not None and isinstance(failure.exc, self.give_up_on)
        if given_up or attempt >= times:
            why = "gave up on" if given_up else f"attempt {attempt} of {times} failed with"
            raise execution.retried(path, failure, why, attempt, times)
        factor = attempt if backoff == "linear" else 2 ** (attempt - 1)
        delay = base * factor
        if cap is not None:
            delay = min(delay, cap)
        execution.note_retry(path, attempt, times, failure, delay)
        raise Suspend(
            et.RETRY_SCHEDULED,
            {
                "step": path_text(path),
                "attempt": attempt,
                "max_attempts": times,
                "wake_at": (execution.now + delay).isoformat(),
                "error_class": failure.error_class,
                "failed_step": failure.step,
                "reason": failure.reason,
            },
        )


def _bad_times(times: Any) -> bool:
    return not int_between(times, 1)


@dataclass(frozen=True, eq=False)
class Branch(Step):
    if_: Any
    then: tuple[Step, ...]
    else_: tuple[Step, ...]
    kind = "branch"
    callable_args = ("if_",)

    def arms(self) -> dict[str, tuple[Step, ...]]:
        return {"then": self.then, "else": self.else_}

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "if": describe_value(self.if_)}

    def run(self, execution: Execution, path: Path) -> None:
        arm = "then" if execution.arg(path, "if_", self.if_) else "else"
        execution.run_steps(self.arms()[arm], (*path, arm))


def _step_name(kind: str, name: Any) -> None:
    if not isinstance(name, str) or not name.strip():
        raise WorkflowDefinitionError(f"{kind}() needs a non-empty name, got {name!r}")


def compute(
    name: str,
    fn: Callable[[Any], Any],
    compensate: Callable[[Any], Any] | None = None,
    compensate_times: int = 3,
) -> Compute:
    """Run ``fn(ctx)``; its JSON-serialisable result becomes ``ctx.steps[name]``.

    ``compensate`` (``undo(ctx)``) undoes the step if the run fails after it
    finished: the finished steps' compensations run in reverse order, each
    at most once, each tried up to ``compensate_times`` times (backoff
    exponential from ``RETRY_BASE_DELAY``). See docs/howto/compensation.md.
    """
    _step_name("compute", name)
    if not callable(fn):
        raise WorkflowDefinitionError(f"compute({name!r}, fn): fn must be callable, got {fn!r}")
    _compensation("compute", name, compensate, compensate_times)
    return Compute(name, fn, compensate, compensate_times)


def _compensation(kind: str, name: str, compensate: Any, times: Any) -> None:
    if compensate is not None and not callable(compensate):
        raise WorkflowDefinitionError(
            f"{kind}({name!r}, compensate=...): give a callable undo(ctx), got {compensate!r}"
        )
    if _bad_times(times):
        raise WorkflowDefinitionError(
            f"{kind}({name!r}, compensate_times=...) must be an integer >= 1, got {times!r}"
        )


def wait(for_: Any) -> Wait:
    """Suspend the run for a duration or until an instant (ISO 8601, timedelta, datetime)."""
    return Wait(for_)


def wait_for_event(awaits_key: str, match: Any = None, timeout: Any = None) -> WaitForEvent:
    """Suspend until an event of the type declared under ``awaits_key`` arrives.

    ``match`` (a :mod:`kumiko_workflows.match` expression, its stored JSON
    form, a callable returning either, or ``match.ANY``: any event; None is
    any event too, with system check W090) filters candidates; ``timeout``
    (None: wait indefinitely) bounds the wait. ``ctx.steps[awaits_key]`` is
    the event's payload, or None on timeout.
    """
    if not isinstance(awaits_key, str) or not awaits_key:
        raise WorkflowDefinitionError(
            f"wait_for_event() needs an awaits key (a string), got {awaits_key!r}"
        )
    if match is match_builder.any:
        raise WorkflowDefinitionError(
            f"wait_for_event({awaits_key!r}, match=match.any): call it, match=match.any(); "
            "uncalled it would be taken for a callable of ctx"
        )
    return WaitForEvent(awaits_key, match, timeout)


def retry(
    times: Any,
    backoff: Any = "exponential",
    do: Sequence[Step] = (),
    base_delay: Any = None,
    max_delay: Any = None,
    give_up_on: Sequence[type[BaseException]] | type[BaseException] = (),
) -> Retry:
    """Run ``do``; if it raises, roll its writes back and try again after a backoff.

    ``times`` counts all attempts. ``linear`` waits base × attempt,
    ``exponential`` base × 2^(attempt-1); ``base_delay`` defaults to
    ``KUMIKO_WORKFLOWS['RETRY_BASE_DELAY']`` and ``max_delay`` caps the wait.
    An exception listed in ``give_up_on`` fails the run at once.
    """
    if isinstance(give_up_on, type):
        give_up_on = (give_up_on,)
    give_up = tuple(give_up_on)
    for exc in give_up:
        if not (isinstance(exc, type) and issubclass(exc, BaseException)):
            raise WorkflowDefinitionError(
                f"retry(give_up_on=...) takes exception classes, got {exc!r}"
            )
    return Retry(times, backoff, _step_list(do, "retry(do=...)"), base_delay, max_delay, give_up)


def branch(if_: Any, then: Sequence[Step] = (), else_: Sequence[Step] = ()) -> Branch:
    """Run ``then`` when ``if_`` (a value or ``callable(ctx)``) is truthy, else ``else_``."""
    return Branch(if_, _step_list(then, "branch(then=...)"), _step_list(else_, "branch(else_=...)"))


__all__ = [
    "BACKOFFS",
    "Branch",
    "Compute",
    "Execution",
    "Retry",
    "Step",
    "Suspend",
    "Wait",
    "WaitForEvent",
    "branch",
    "compute",
    "retry",
    "wait",
    "wait_for_event",
]
