"""The step vocabulary: ``compute``, ``wait``, ``wait_for_event``, ``retry``, ``branch``.

Each function returns an immutable step object. Any argument may be a plain
value or a callable taking the run's ``ctx``; static values are checked when
the workflow is defined, callable results when the step runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from kumiko_workflows import event_types as et
from kumiko_workflows import match as match_builder
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import (
    InvalidDuration,
    InvalidMatchExpression,
    WorkflowDefinitionError,
)
from kumiko_workflows.workflow import durations, matching
from kumiko_workflows.workflow.jsonvalues import NotJSON, to_json

BACKOFFS = ("linear", "exponential")
DURATION_HINT = (
    "Give an ISO 8601 duration (PT90S, P1DT2H), an instant with an offset "
    "(2026-01-31T09:00:00Z), a timedelta or an aware datetime."
)

Path = tuple[Any, ...]
#: What a step's validation reports: (check id, message, hint). An id "E…" is an
#: error that refuses the definition; "W…" a warning (system checks only).
Problem = tuple[str, str, str]


def callable_name(fn: Any) -> str:
    """A stable name for a callable: ``module.qualname`` (identical across processes)."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qualname}"


def describe_value(value: Any) -> Any:
    """A JSON description of a static argument, or of a callable by name."""
    if isinstance(value, type) and issubclass(value, BaseException):
        return {"exception": callable_name(value)}
    if callable(value):
        return {"callable": callable_name(value)}
    return durations.describe(value)


def path_text(path: Sequence[Any]) -> str:
    """``(2, "then", 0)`` -> ``"2.then.0"``: a step's position as stored in events."""
    return ".".join(str(part) for part in path)


def is_static(value: Any) -> bool:
    """Whether a step argument is a plain value (checked at definition) or a callable."""
    return not callable(value)


class Suspend(Exception):
    """Raised by a step to suspend the run with the run event ``type`` (see :mod:`.suspensions`)."""

    def __init__(self, type: str, payload: dict[str, Any]) -> None:
        super().__init__(type)
        self.type = type
        self.payload = payload


class Execution(Protocol):
    """What the engine offers a step while it runs.

    The engine's side is :class:`kumiko_workflows.engine.segment.Executor`.

    Every method that reports a problem returns the exception to raise, so a
    step kind needs nothing from the engine's modules but this.
    """

    ctx: Any
    now: datetime

    @property
    def awaits(self) -> Mapping[str, str]:
        """The workflow's awaits keys and their event types."""

    def arg(self, path: Path, name: str, value: Any) -> Any:
        """``value``, or ``value(ctx)`` for a callable (its exception fails the step)."""

    def call(self, path: Path, fn: Callable[[Any], Any]) -> Any:
        """``fn(ctx)``; an exception it raises fails the step."""

    def store(self, path: Path, name: str, result: Any) -> None:
        """Keep ``result`` as ``ctx.steps[name]`` (refused unless it is JSON)."""

    def invalid(self, path: Path, detail: str) -> Exception:
        """The failure of a step given an invalid argument (``detail`` says which)."""

    def run_steps(self, steps: Sequence[Step], prefix: Path) -> None:
        """Run a nested step list (an arm) whose positions start with ``prefix``."""

    def run_steps_from(self, steps: Sequence[Step], prefix: Path, cursor: Any) -> None:
        """Continue a nested step list at ``cursor`` (a resume inside an arm)."""

    def attempt(self, steps: Sequence[Step], prefix: Path, attempt: int, cursor: Any = None) -> Any:
        """Run ``steps`` as one attempt whose writes roll back if it fails.

        Returns None on success, else the failure (an exception with
        ``reason``, ``step``, ``error_class``, ``detail`` and ``exc``). A
        suspension inside the attempt (a child run's wait) keeps its writes.
        ``cursor``: continue the attempt there (its resume).
        """

    def attempt_in_progress(self, path: Path) -> int:
        """The attempt of the retry (or pass of the repeat) at ``path`` a resume continues."""

    def set_attempt(self, path: Path, attempt: int | None) -> None:
        """Record (None: forget) the pass a repeat at ``path`` is in, kept across suspensions."""

    def children(self, path: Path, spec: ChildSpec) -> list[dict[str, Any]]:
        """The outcome of each child run of the step at ``path``, in item order.

        Starts them the first time (``spec.inputs()`` gives their inputs) and
        suspends the run (raises :class:`Suspend`) until the last finishes.
        Each outcome: ``run_id``, ``status`` (completed, failed, cancelled),
        ``result`` (completed) or ``reason``, ``step``, ``error_class``.
        """

    def child_failed(self, path: Path, outcome: dict[str, Any], index: int | None) -> Exception:
        """The failure of the step at ``path`` whose child (``index`` of a fan-out) failed."""

    def compensable(self, path: Path) -> None:
        """The step at ``path``, which has a compensation, finished (undone if the run fails)."""

    def resumed_attempt(self, path: Path) -> int:
        """The attempt to run at ``path``: the one a resume starts at, else 1."""

    def retried(self, path: Path, failure: Any, why: str, attempt: int, times: int) -> Exception:
        """The failure that ends the retry at ``path`` after ``failure`` (``why``: how).

        ``attempt`` is the attempt that failed last, of ``times``.
        """

    def note_retry(self, path: Path, attempt: int, times: int, failure: Any, delay: Any) -> None:
        """Log a failed attempt that will be retried, and keep its raw error on the run."""

    def awaited_event(self, awaits_key: str, event_type: str, match: Any) -> Any:
        """An event that already ends the wait (appended after the trigger), or None.

        A found event is the wait's: ``ctx.steps[awaits_key]`` is its payload.
        """

    def suspending_on_event(self) -> None:
        """Tell the engine the run is about to wait for an event (before it suspends)."""


@dataclass(frozen=True)
class ChildSpec:
    """What a step that starts child runs asks of the engine (:meth:`Execution.children`)."""

    workflow: str
    #: The children's inputs (each the payload of one child's trigger), called once.
    inputs: Callable[[], list[dict[str, Any]]]
    max_concurrency: int | None = None
    on_child_failure: str = "fail"
    on_cancel: str = "cancel"
    timeout: Any = None


class Step:
    """A step kind. Subclasses own their whole behaviour.

    Pure definitions: validation (:meth:`problems`), nested arms
    (:meth:`arms`), fingerprinting (:meth:`describe`). Running
    (:meth:`run`), through the :class:`Execution` the engine passes in. A
    step that suspends raises :class:`Suspend` with the run event of one of
    the suspension records in :mod:`kumiko_workflows.suspensions`, and
    ``resumes_from`` names those records' suspension types, so a resume
    knows the step a pending row may continue. A new step kind is a new
    subclass; nothing else in the engine names the kinds.
    """

    kind: str = ""
    #: Whether the step can suspend the run (a wait or wait_for_event).
    suspends: bool = False
    #: Suspension types (``suspensions.Record.suspension_type``) a resume of it starts from.
    resumes_from: tuple[str, ...] = ()
    #: Names of the arguments that may be callables taking ``ctx``.
    callable_args: tuple[str, ...] = ()
    #: Whether it may suspend inside a retry body (a child run's wait may; a timed wait may not).
    suspends_in_retry: bool = False

    def arms(self) -> dict[str, tuple[Step, ...]]:
        """Nested step lists, by arm name (a position's text names them, as in ``2.then.0``)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Static structure of this step alone (nested lists excluded)."""
        raise NotImplementedError

    def label(self) -> str:
        return self.kind

    def result_name(self) -> str | None:
        """The ``ctx.steps`` key its result is stored under, if it stores one."""
        return None

    def problems(self, awaits: Mapping[str, str], path: Path) -> Iterator[Problem]:
        """What is wrong with its static arguments (its arms are checked on their own)."""
        return iter(())

    def callables(self) -> Iterator[tuple[str, Callable[..., Any]]]:
        """The callables among its arguments, by argument name (for the lambda warning)."""
        for arg in self.callable_args:
            value = getattr(self, arg)
            if callable(value):
                yield arg, value

    def run(self, execution: Execution, path: Path) -> None:
        raise NotImplementedError

    def resume_in(self, execution: Execution, path: Path, arm: str, cursor: Any) -> None:
        """Continue a resumed run inside its arm ``arm`` at ``cursor``: by default, just there."""
        execution.run_steps_from(self.arms()[arm], (*path, arm), cursor)


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
            return to_json(matching.validate(match), "match")
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
    return isinstance(times, bool) or not isinstance(times, int) or times < 1


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


ON_CHILD_FAILURE = ("fail", "collect")
ON_CANCEL = ("cancel", "abandon")


def _envelope(outcome: dict[str, Any]) -> dict[str, Any]:
    """A child's outcome as ``on_child_failure="collect"`` gives it: ok, and result or why not."""
    if outcome["status"] == "completed":
        return {"ok": True, "result": outcome.get("result"), "run_id": outcome["run_id"]}
    return {"ok": False, **outcome}


class _Children(Step):
    """What ``call_workflow`` and ``fan_out`` share: child runs the step waits for."""

    name: str
    workflow: str
    on_child_failure: str
    on_cancel: str
    timeout: Any
    compensate: Callable[[Any], Any] | None
    compensate_times: int
    suspends = True
    suspends_in_retry = True
    resumes_from = ("children",)

    def label(self) -> str:
        return f"{self.kind} {self.name!r}"

    def result_name(self) -> str | None:
        return self.name

    def _shared(self) -> dict[str, Any]:
        shared = {
            "kind": self.kind,
            "name": self.name,
            "workflow": self.workflow,
            "on_child_failure": self.on_child_failure,
            "on_cancel": self.on_cancel,
            "timeout": describe_value(self.timeout),
        }
        if self.compensate is not None:
            shared["compensate"] = callable_name(self.compensate)
            shared["compensate_times"] = self.compensate_times
        return shared

    def callables(self) -> Iterator[tuple[str, Callable[..., Any]]]:
        yield from super().callables()
        if self.compensate is not None:
            yield "compensate", self.compensate

    def _stored(self, execution: Execution, path: Path, result: Any) -> None:
        execution.store(path, self.name, result)
        if self.compensate is not None:  # the children's work, undone if the run fails later
            execution.compensable(path)

    def problems(self, awaits: Mapping[str, str], path: Path) -> Iterator[Problem]:
        if self.timeout is not None and is_static(self.timeout):
            yield from _time_problem(
                f"step {path_text(path)} ({self.label()})", "timeout", self.timeout
            )

    def _spec(
        self,
        execution: Execution,
        path: Path,
        inputs: Callable[[], list[dict[str, Any]]],
        max_concurrency: int | None = None,
    ) -> ChildSpec:
        timeout = execution.arg(path, "timeout", self.timeout)
        if timeout is not None:
            timeout = _wake_time(execution, path, "timeout", timeout).isoformat()
        return ChildSpec(
            self.workflow, inputs, max_concurrency, self.on_child_failure, self.on_cancel, timeout
        )


@dataclass(frozen=True, eq=False)
class CallWorkflow(_Children):
    name: str
    workflow: str
    input: Any = None
    timeout: Any = None
    on_child_failure: str = "fail"
    on_cancel: str = "cancel"
    compensate: Callable[[Any], Any] | None = None
    compensate_times: int = 3
    kind = "call_workflow"
    callable_args = ("input", "timeout")

    def describe(self) -> dict[str, Any]:
        return {**self._shared(), "input": describe_value(self.input)}

    def run(self, execution: Execution, path: Path) -> None:
        def inputs() -> list[dict[str, Any]]:
            value = execution.arg(path, "input", self.input)
            value = {} if value is None else value
            if not isinstance(value, Mapping):
                raise execution.invalid(
                    path, f"input must give a JSON object (a dict), got {type(value).__name__}"
                )
            return [dict(value)]

        [outcome] = execution.children(path, self._spec(execution, path, inputs))
        if self.on_child_failure == "collect":
            self._stored(execution, path, _envelope(outcome))
        elif outcome["status"] == "completed":
            self._stored(execution, path, outcome.get("result"))
        else:
            raise execution.child_failed(path, outcome, None)


@dataclass(frozen=True, eq=False)
class FanOut(_Children):
    name: str
    workflow: str
    items: Any
    max_concurrency: int | None = None
    on_child_failure: str = "fail"
    on_cancel: str = "cancel"
    timeout: Any = None
    compensate: Callable[[Any], Any] | None = None
    compensate_times: int = 3
    kind = "fan_out"
    callable_args = ("items", "timeout")

    def describe(self) -> dict[str, Any]:
        return {
            **self._shared(),
            "items": describe_value(self.items),
            "max_concurrency": self.max_concurrency,
        }

    def run(self, execution: Execution, path: Path) -> None:
        def inputs() -> list[dict[str, Any]]:
            items = execution.arg(path, "items", self.items)
            if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
                raise execution.invalid(path, f"items must give a list, got {type(items).__name__}")
            return [{"item": item, "index": i} for i, item in enumerate(items)]

        outcomes = execution.children(
            path, self._spec(execution, path, inputs, self.max_concurrency)
        )
        if self.on_child_failure == "collect":
            self._stored(execution, path, [_envelope(o) for o in outcomes])
            return
        for index, outcome in enumerate(outcomes):
            if outcome["status"] not in ("completed", "not_started"):
                raise execution.child_failed(path, outcome, index)
        self._stored(execution, path, [o.get("result") for o in outcomes])


@dataclass(frozen=True, eq=False)
class Repeat(Step):
    name: str
    do: tuple[Step, ...]
    until: Any
    max_times: int
    kind = "repeat"
    callable_args = ("until",)

    def arms(self) -> dict[str, tuple[Step, ...]]:
        return {"do": self.do}

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "until": describe_value(self.until),
            "max_times": self.max_times,
        }

    def label(self) -> str:
        return f"repeat {self.name!r}"

    def result_name(self) -> str | None:
        return self.name

    def problems(self, awaits: Mapping[str, str], path: Path) -> Iterator[Problem]:
        if not self.do:
            yield (
                "E013",
                f"step {path_text(path)} ({self.label()}) has an empty body",
                ("Give repeat(do=[...]) a step."),
            )

    def run(self, execution: Execution, path: Path) -> None:
        self._passes(execution, path, 1, None)

    def resume_in(self, execution: Execution, path: Path, arm: str, cursor: Any) -> None:
        # A wait inside the body: the pass it belongs to goes on.
        self._passes(execution, path, execution.attempt_in_progress(path), cursor)

    def _passes(self, execution: Execution, path: Path, number: int, cursor: Any) -> None:
        while True:
            execution.set_attempt(path, number)
            execution.run_steps_from(self.do, (*path, "do"), cursor)
            cursor = None
            self._keep_pass(execution, path, number)
            if number >= self.max_times or (
                self.until is not None and execution.arg(path, "until", self.until)
            ):
                execution.set_attempt(path, None)
                return
            number += 1

    def _keep_pass(self, execution: Execution, path: Path, number: int) -> None:
        """Keep the pass's results as ``name#number``; ``ctx.steps[self.name]``: passes done."""
        ctx = execution.ctx
        for _, inner in iter_steps(self.do):
            name = inner.result_name()
            if name is None or name not in ctx.steps:
                continue
            if name in ctx.awaited:  # an awaited event: kept by reference, as it was taken
                ctx.awaited[f"{name}#{number}"] = ctx.awaited[name]
                ctx.steps[f"{name}#{number}"] = ctx.steps[name]
            else:
                execution.store(path, f"{name}#{number}", ctx.steps[name])
        execution.store(path, self.name, number)


def iter_steps(steps: Sequence[Step], prefix: Path = ()) -> Iterator[tuple[Path, Step]]:
    """Every step of a step list, nested ones included, with its position."""
    for i, step in enumerate(steps):
        path = (*prefix, i)
        yield path, step
        for arm, children in step.arms().items():
            yield from iter_steps(children, (*path, arm))


def _step_list(value: Any, what: str) -> tuple[Step, ...]:
    if callable(value) or isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise WorkflowDefinitionError(
            f"{what} must be a list of steps (a callable is not allowed here: the step "
            "tree is part of the definition)"
        )
    for i, item in enumerate(value):
        if not isinstance(item, Step):
            raise WorkflowDefinitionError(
                f"{what}[{i}] is {item!r}, not a step; build steps with kumiko_workflows.steps"
            )
    return tuple(value)


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


def repeat(name: str, do: Sequence[Step] = (), until: Any = None, max_times: int = 1) -> Repeat:
    """Run ``do`` again: until ``until(ctx)`` is truthy after a pass, at most ``max_times``.

    The body may wait (``wait``, ``wait_for_event``, child runs); a resume
    goes on in the pass it suspended in. Each pass's results stay
    addressable as ``ctx.steps["<result>#<pass>"]`` (passes count from 1;
    ``ctx.steps["<result>"]`` is the latest pass's), and
    ``ctx.steps[name]`` is the number of passes done. An event a wait of an
    earlier pass took is never taken again.
    """
    _step_name("repeat", name)
    if _bad_times(max_times):
        raise WorkflowDefinitionError(
            f"repeat({name!r}): max_times must be an integer >= 1, got {max_times!r}"
        )
    return Repeat(name, _step_list(do, "repeat(do=...)"), until, max_times)


def _workflow_name(kind: str, name: str, workflow: Any) -> str:
    named = getattr(workflow, "name", workflow)
    if not isinstance(named, str) or not named.strip():
        raise WorkflowDefinitionError(
            f"{kind}({name!r}, workflow=...) needs a workflow (its definition or its name), "
            f"got {workflow!r}"
        )
    return named


def _policies(kind: str, name: str, on_child_failure: Any, on_cancel: Any) -> None:
    if on_child_failure not in ON_CHILD_FAILURE:
        raise WorkflowDefinitionError(
            f"{kind}({name!r}): on_child_failure must be 'fail' or 'collect', "
            f"got {on_child_failure!r}"
        )
    if on_cancel not in ON_CANCEL:
        raise WorkflowDefinitionError(
            f"{kind}({name!r}): on_cancel must be 'cancel' or 'abandon', got {on_cancel!r}"
        )


def call_workflow(
    name: str,
    workflow: Any,
    input: Any = None,
    timeout: Any = None,
    *,
    on_child_failure: str = "fail",
    on_cancel: str = "cancel",
    compensate: Callable[[Any], Any] | None = None,
    compensate_times: int = 3,
) -> CallWorkflow:
    """Start a child run of ``workflow`` and wait until it finishes.

    ``input`` (a dict, or ``callable(ctx)`` giving one) is the payload of the
    child's trigger (``ctx.event.payload`` in the child). ``ctx.steps[name]``
    is the child's result (its workflow's ``returns``); a child that fails
    or is cancelled fails this step (``child_failed``), which a ``retry``
    around it tries again with a fresh child. ``on_child_failure="collect"``
    stores ``{"ok": ..., "result" | "reason": ...}`` instead. ``timeout``
    fails the step (``child_timeout``) and cancels the child. Cancelling
    this run cancels the child unless ``on_cancel="abandon"``.
    ``compensate`` (``undo(ctx)``) undoes the child's work if the run fails
    after the step finished (see :func:`compute`).
    """
    _step_name("call_workflow", name)
    named = _workflow_name("call_workflow", name, workflow)
    _policies("call_workflow", name, on_child_failure, on_cancel)
    if input is not None and not callable(input) and not isinstance(input, Mapping):
        raise WorkflowDefinitionError(
            f"call_workflow({name!r}, input=...) must be a dict or a callable(ctx), got {input!r}"
        )
    _compensation("call_workflow", name, compensate, compensate_times)
    return CallWorkflow(
        name, named, input, timeout, on_child_failure, on_cancel, compensate, compensate_times
    )


def fan_out(
    name: str,
    workflow: Any,
    items: Any,
    max_concurrency: int | None = None,
    on_child_failure: str = "fail",
    *,
    on_cancel: str = "cancel",
    timeout: Any = None,
    compensate: Callable[[Any], Any] | None = None,
    compensate_times: int = 3,
) -> FanOut:
    """Start one child run of ``workflow`` per item and wait until they have all finished.

    ``items`` is a list or ``callable(ctx)`` giving one; child ``i`` gets
    ``{"item": items[i], "index": i}`` as its trigger's payload. At most
    ``max_concurrency`` children run at once (the rest start as earlier ones
    finish). ``ctx.steps[name]`` is the list of the children's results in
    item order. ``on_child_failure="fail"`` fails the step when a child
    fails (no further child starts); ``"collect"`` gives each child's
    ``{"ok": True, "result": ...}`` or ``{"ok": False, "reason": ...}``.
    ``compensate`` (``undo(ctx)``, with the results in ``ctx.steps[name]``)
    undoes the children's work if the run fails after the step finished.
    """
    _step_name("fan_out", name)
    named = _workflow_name("fan_out", name, workflow)
    _policies("fan_out", name, on_child_failure, on_cancel)
    if max_concurrency is not None and _bad_times(max_concurrency):
        raise WorkflowDefinitionError(
            f"fan_out({name!r}): max_concurrency must be an integer >= 1 or None, "
            f"got {max_concurrency!r}"
        )
    if not callable(items) and (
        isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence)
    ):
        raise WorkflowDefinitionError(
            f"fan_out({name!r}, items=...) must be a list or a callable(ctx), got {items!r}"
        )
    _compensation("fan_out", name, compensate, compensate_times)
    return FanOut(
        name,
        named,
        items if callable(items) else tuple(items),
        max_concurrency,
        on_child_failure,
        on_cancel,
        timeout,
        compensate,
        compensate_times,
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
    "CallWorkflow",
    "ChildSpec",
    "Compute",
    "Execution",
    "FanOut",
    "Repeat",
    "Retry",
    "Step",
    "Suspend",
    "Wait",
    "WaitForEvent",
    "branch",
    "call_workflow",
    "compute",
    "fan_out",
    "repeat",
    "retry",
    "wait",
    "wait_for_event",
]
