"""The step vocabulary: ``compute``, ``wait``, ``wait_for_event``, ``retry``, ``branch``.

Each function returns an immutable step object. Any argument may be a plain
value or a callable taking the run's ``ctx``; static values are checked when
the workflow is defined, callable results when the step runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kumiko_workflows.exceptions import WorkflowDefinitionError

BACKOFFS = ("linear", "exponential")


def callable_name(fn: Any) -> str:
    """A stable name for a callable: ``module.qualname`` (identical across processes)."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qualname}"


def describe_value(value: Any) -> Any:
    """A JSON description of a static argument, or of a callable by name."""
    from kumiko_workflows import durations

    if isinstance(value, type) and issubclass(value, BaseException):
        return {"exception": callable_name(value)}
    if callable(value):
        return {"callable": callable_name(value)}
    return durations.describe(value)


class Step:
    kind: str = ""
    #: Whether the step can suspend the run (a wait or wait_for_event).
    suspends: bool = False

    def arms(self) -> dict[str, tuple[Step, ...]]:
        """Nested step lists, by arm name (``then``/``else``/``do``)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Static structure of this step alone (nested lists excluded)."""
        raise NotImplementedError

    def label(self) -> str:
        return self.kind


@dataclass(frozen=True, eq=False)
class Compute(Step):
    name: str
    fn: Callable[[Any], Any]
    kind = "compute"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "fn": callable_name(self.fn)}

    def label(self) -> str:
        return f"compute {self.name!r}"


@dataclass(frozen=True, eq=False)
class Wait(Step):
    for_: Any
    kind = "wait"
    suspends = True

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "for": describe_value(self.for_)}


@dataclass(frozen=True, eq=False)
class WaitForEvent(Step):
    awaits_key: str
    match: Any = None
    timeout: Any = None
    kind = "wait_for_event"
    suspends = True

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "awaits": self.awaits_key,
            "match": describe_value(self.match),
            "timeout": describe_value(self.timeout),
        }

    def label(self) -> str:
        return f"wait_for_event {self.awaits_key!r}"


@dataclass(frozen=True, eq=False)
class Retry(Step):
    times: Any
    backoff: Any
    do: tuple[Step, ...]
    base_delay: Any = None
    max_delay: Any = None
    give_up_on: tuple[type[BaseException], ...] = ()
    kind = "retry"

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


@dataclass(frozen=True, eq=False)
class Branch(Step):
    if_: Any
    then: tuple[Step, ...]
    else_: tuple[Step, ...]
    kind = "branch"

    def arms(self) -> dict[str, tuple[Step, ...]]:
        return {"then": self.then, "else": self.else_}

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "if": describe_value(self.if_)}


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


def compute(name: str, fn: Callable[[Any], Any]) -> Compute:
    """Run ``fn(ctx)``; its JSON-serialisable result becomes ``ctx.steps[name]``."""
    if not isinstance(name, str) or not name.strip():
        raise WorkflowDefinitionError(f"compute() needs a non-empty name, got {name!r}")
    if not callable(fn):
        raise WorkflowDefinitionError(f"compute({name!r}, fn): fn must be callable, got {fn!r}")
    return Compute(name, fn)


def wait(for_: Any) -> Wait:
    """Suspend the run for a duration or until an instant (ISO 8601, timedelta, datetime)."""
    return Wait(for_)


def wait_for_event(awaits_key: str, match: Any = None, timeout: Any = None) -> WaitForEvent:
    """Suspend until an event of the type declared under ``awaits_key`` arrives.

    ``match`` (a match expression, a callable returning one, or None for any
    event) filters candidates; ``timeout`` (None: wait indefinitely) bounds
    the wait. ``ctx.steps[awaits_key]`` is the event's payload, or None on
    timeout.
    """
    if not isinstance(awaits_key, str) or not awaits_key:
        raise WorkflowDefinitionError(
            f"wait_for_event() needs an awaits key (a string), got {awaits_key!r}"
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
    "Retry",
    "Step",
    "Wait",
    "WaitForEvent",
    "branch",
    "compute",
    "retry",
    "wait",
    "wait_for_event",
]
