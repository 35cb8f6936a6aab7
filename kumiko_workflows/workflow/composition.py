"""The step kinds that compose workflows: child runs (``call_workflow``, ``fan_out``) and
``repeat``, a block run again that may wait.

How child runs start, fan in and are cancelled is the engine's
(:mod:`kumiko_workflows.engine.children`); these classes say what each step
asks of it, through the :class:`~kumiko_workflows.workflow.step_kind.Execution`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kumiko_workflows.exceptions import WorkflowDefinitionError
from kumiko_workflows.workflow.step_kind import (
    ChildSpec,
    Execution,
    Path,
    Problem,
    Step,
    _step_list,
    callable_name,
    describe_value,
    is_static,
    iter_steps,
    path_text,
)
from kumiko_workflows.workflow.steps import (
    _bad_times,
    _compensation,
    _step_name,
    _time_problem,
    _wake_time,
)

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
