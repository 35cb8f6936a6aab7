"""What a step kind is: the :class:`Step` base class, and what a step kind works with.

:class:`Execution` is what a step runs against, :class:`Suspend` what it
raises to wait, and the helpers (:func:`describe_value`, :func:`is_static`,
:func:`path_text`, :func:`callable_name`, :func:`iter_steps`) what it
describes and checks its arguments with.

The built-in kinds (``compute``, ``wait``, ``wait_for_event``, ``retry``,
``branch``) are :mod:`kumiko_workflows.workflow.steps`; a step kind written
outside the package subclasses :class:`Step` the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from kumiko_workflows.exceptions import (
    WorkflowDefinitionError,
)
from kumiko_workflows.workflow import durations

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

    The engine's side is :class:`kumiko_workflows.engine.executor.Executor`.

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
    the suspension records in :mod:`kumiko_workflows.workflow.suspensions`, and
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
