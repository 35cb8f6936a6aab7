"""A workflow's steps as a diagram, and a run's path through them.

:func:`workflow_nodes` turns a definition into a tree of :class:`Node`
(one per step, its arms nested); :func:`run_nodes` adds what a run did at
each: done, where it waits now, where it failed, an arm not taken, with how
long each step took and how it ended, read from the run's events. The
admin draws the tree as HTML (``admin/kumiko_workflows/diagram.html``);
nothing here is markup, so every text is escaped where it is drawn.

How a step kind looks is a :class:`Shape`: a short symbol, a title, a
detail line, and how its arms are laid out (``alternatives`` side by side,
one of them taken; ``parallel`` side by side, all of them run; ``body``
inside a frame, as a retry's; ``sequence`` one after another). The kinds
of :mod:`kumiko_workflows.steps` have theirs in :data:`SHAPES`. A step kind
of its own may describe itself with a ``diagram()`` method returning a
dict of the same keys (``glyph``, ``title``, ``detail``, ``layout``,
``arm_labels``); any other kind is drawn from its ``label()`` and its arms.

What a compute step did is known from its result (kept in the events that
end each segment); its duration is that of the segment it ran in, the only
clock the events have for it. A wait's duration is from its suspension to
its resume. Which arm of a branch ran is recorded only by what ran inside
it: an arm with a step that would have left a trace and left none was not
taken; with no trace either way the diagram says "not known".

The run's events are read by :mod:`kumiko_workflows.operations.run_path`;
the step results panel beside the diagram is
:mod:`kumiko_workflows.operations.step_results` (its :func:`result_rows`,
:func:`readable` and :data:`READABLE_ITEMS` are named here too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kumiko_workflows.models import RunStatus
from kumiko_workflows.operations.run_path import RunPath, Trace, read_path
from kumiko_workflows.operations.step_results import READABLE_ITEMS, readable, result_rows
from kumiko_workflows.operations.words import describe_match, humanize, when
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.positions import reached
from kumiko_workflows.workflow.step_kind import Step, callable_name, path_text

__all__ = [
    "LAYOUTS",
    "READABLE_ITEMS",
    "SHAPES",
    "STATES",
    "Arm",
    "Node",
    "RunPath",
    "Shape",
    "read_path",
    "readable",
    "result_rows",
    "run_nodes",
    "shape_of",
    "took",
    "workflow_nodes",
]

#: Layouts of a step's arms (see the module docstring).
LAYOUTS = ("sequence", "alternatives", "parallel", "body")

#: A node's states, with the words shown beside their colour.
STATES = {
    "done": "done",
    "current": "waiting here",
    "due": "due: the next worker pass runs it",
    "running": "running",
    "failed": "failed here",
    "cancelled": "cancelled here",
    "pending": "not yet",
    "not_run": "not run",
    "skipped": "arm not taken",
    "unknown": "not known",
    "static": "",
}


def _fn(value: Any) -> str:
    """A callable by its short name (``send_welcome()``), a value as it is."""
    if callable(value):
        name = callable_name(value).rsplit(".", 1)[-1]
        return f"{name}(ctx)"
    return str(value)


def _when_text(value: Any) -> str:
    if value is None:
        return "no deadline"
    if isinstance(value, timedelta):
        return humanize(value)
    if isinstance(value, datetime):
        return when(value)
    return _fn(value)


@dataclass(frozen=True)
class Shape:
    """How a step kind is drawn: see the module docstring."""

    glyph: str
    title: Callable[[Any], str]
    detail: Callable[[Any], str] = lambda step: ""
    layout: str = "sequence"
    arm_label: Callable[[Any, str], str] = lambda step, arm: arm


def _wait_detail(step: Any) -> str:
    value = step.for_
    if isinstance(value, str) and value.upper().startswith("P"):
        return f"for {value}"
    if isinstance(value, str | datetime):
        return f"until {_when_text(value)}"
    if callable(value):
        return f"for or until {_fn(value)}"
    return f"for {_when_text(value)}"


def _event_detail(step: Any) -> str:
    match = step.match
    if match is None:
        which = "any event"
    elif callable(match):
        which = f"the event {_fn(match)} matches"
    elif isinstance(match, dict):
        which = f"where {describe_match(match)}"
    else:
        which = "the event its match expression names"
    timeout = step.timeout
    limit = "no deadline" if timeout is None else f"timeout {_when_text(timeout)}"
    return f"{which}; {limit}"


def _retry_detail(step: Any) -> str:
    times = step.times if not callable(step.times) else _fn(step.times)
    backoff = step.backoff if not callable(step.backoff) else _fn(step.backoff)
    text = f"up to {times} attempts, {backoff} backoff"
    if step.base_delay is not None:
        text += f" from {_when_text(step.base_delay)}"
    if step.give_up_on:
        names = ", ".join(exc.__name__ for exc in step.give_up_on)
        text += f"; gives up on {names}"
    return text


def _branch_arm(step: Any, arm: str) -> str:
    return f"if {_fn(step.if_)} is true" if arm == "then" else "otherwise"


#: The shapes of the package's step kinds, by ``Step.kind``.
SHAPES: dict[str, Shape] = {
    "compute": Shape("ƒ", lambda step: step.name, lambda step: _fn(step.fn)),
    "wait": Shape("◷", lambda step: "wait", _wait_detail),
    "wait_for_event": Shape("✉", lambda step: f"wait for {step.awaits_key!r}", _event_detail),
    "retry": Shape("↻", lambda step: "retry", _retry_detail, layout="body"),
    "branch": Shape(
        "◇",
        lambda step: "branch",
        lambda step: f"on {_fn(step.if_)}",
        layout="alternatives",
        arm_label=_branch_arm,
    ),
}


def _generic(step: Step) -> Shape:
    """A kind with no shape: its label, its arms one after another, or its own ``diagram()``."""
    own = getattr(step, "diagram", None)
    described: Mapping[str, Any] = own() if callable(own) else {}
    labels = described.get("arm_labels") or {}
    layout = described.get("layout", "sequence")
    return Shape(
        str(described.get("glyph", "▪")),
        lambda s: str(described.get("title") or s.label()),
        lambda s: str(described.get("detail") or ""),
        layout=layout if layout in LAYOUTS else "sequence",
        arm_label=lambda s, arm: str(labels.get(arm, arm)),
    )


def shape_of(step: Step) -> Shape:
    """The step's :class:`Shape`: its kind's in :data:`SHAPES`, else its own or a generic one."""
    return SHAPES.get(step.kind) or _generic(step)


@dataclass
class Arm:
    name: str
    label: str
    nodes: list[Node]
    #: True taken, False not taken, None not known (or no run).
    taken: bool | None = None


@dataclass
class Node:
    path: str
    kind: str
    glyph: str
    title: str
    detail: str
    layout: str
    arms: list[Arm] = field(default_factory=list)
    state: str = "static"
    duration: str = ""
    outcome: str = ""
    #: Whether the run's current place is this step or inside it.
    here: bool = False

    @property
    def state_text(self) -> str:
        return STATES.get(self.state, self.state)

    def walk(self) -> Iterable[Node]:
        yield self
        for arm in self.arms:
            for node in arm.nodes:
                yield from node.walk()


def _nodes(steps: Iterable[Step], prefix: tuple[Any, ...]) -> list[Node]:
    nodes = []
    for i, step in enumerate(steps):
        path = (*prefix, i)
        shape = shape_of(step)
        node = Node(
            path=path_text(path),
            kind=step.kind or type(step).__name__,
            glyph=shape.glyph,
            title=shape.title(step),
            detail=shape.detail(step),
            layout=shape.layout,
        )
        for arm, children in step.arms().items():
            node.arms.append(Arm(arm, shape.arm_label(step, arm), _nodes(children, (*path, arm))))
        nodes.append(node)
    return nodes


def workflow_nodes(workflow: Workflow) -> list[Node]:
    """The definition's steps as a tree, with no run's states."""
    return _nodes(workflow.steps, ())


def _inside(path: str, position: str) -> bool:
    return position == path or position.startswith(path + ".")


def _leaves_trace(nodes: list[Node], workflow: Workflow) -> bool:
    """Whether running these steps would have left a result or a suspension behind."""
    for node in nodes:
        for each in node.walk():
            step = workflow.step_at(each.path)
            if step is not None and (step.result_name() is not None or step.suspends):
                return True
    return False


def _has_trace(nodes: list[Node], path: RunPath) -> bool:
    return any(
        each.path in path.traces
        or any(producer == each.path for _, _, producer in path.results.values())
        for node in nodes
        for each in node.walk()
    )


def run_nodes(
    workflow: Workflow, run: Any, events: Iterable[Any], now: datetime
) -> tuple[list[Node], RunPath]:
    """The definition's tree with the run's path: each step's state, duration and outcome."""
    path = read_path(workflow, events)
    nodes = workflow_nodes(workflow)
    position = run.step or ""
    status = run.status
    if status == RunStatus.FAILED and path.failed_step:
        position = path.failed_step
    _mark(nodes, workflow, run, path, position, status, now, arm_taken=True)
    return nodes, path


def _state(
    node: Node, run: Any, position: str, status: str, arm_taken: bool | None
) -> tuple[str, bool]:
    """(state, here) of a step, from where the run is and whether its arm ran."""
    if arm_taken is False:
        return "skipped", False
    if arm_taken is None:
        return "unknown", False
    if status == RunStatus.COMPLETED:
        return "done", False
    if not position:
        # Failed or cancelled before any step, or not started: nothing ran.
        return ("pending" if status in (RunStatus.WAITING, RunStatus.RUNNING) else "not_run"), False
    if _inside(node.path, position):
        if status == RunStatus.FAILED:
            return "failed", True
        if status == RunStatus.CANCELLED:
            return "cancelled", True
        if status == RunStatus.RUNNING:
            return "running", True
        if run.suspension_type in ("rerun", "queued"):
            return "due", True
        return "current", True
    if reached(node.path, position):
        return "done", False
    return ("pending" if status in (RunStatus.WAITING, RunStatus.RUNNING) else "not_run"), False


def _mark(
    nodes: list[Node],
    workflow: Workflow,
    run: Any,
    path: RunPath,
    position: str,
    status: str,
    now: datetime,
    arm_taken: bool | None,
) -> None:
    for node in nodes:
        node.state, node.here = _state(node, run, position, status, arm_taken)
        found = path.traces.get(node.path)
        if found is not None and node.state not in ("skipped", "unknown"):
            node.duration, node.outcome = _told(node, found, run, now)
        for arm in node.arms:
            arm.taken = _taken(node, arm, workflow, path, position, status)
            inner = arm_taken if arm_taken is not True else arm.taken
            if node.state in ("pending", "not_run"):
                inner = True  # not reached: its arms are simply not yet run
            _mark(arm.nodes, workflow, run, path, position, status, now, inner)
            if node.state in ("pending", "not_run"):
                arm.taken = None


def _taken(
    node: Node, arm: Arm, workflow: Workflow, path: RunPath, position: str, status: str
) -> bool | None:
    """Whether the run ran ``arm`` of ``node`` (None: not known, or not a choice)."""
    if node.layout != "alternatives":
        return True
    if node.state in ("pending", "not_run"):
        return True
    prefix = f"{node.path}.{arm.name}"
    if position and _inside(prefix, position):
        return True
    others = [other for other in node.arms if other is not arm]
    if position and any(_inside(f"{node.path}.{other.name}", position) for other in others):
        return False
    if _has_trace(arm.nodes, path):
        return True
    if any(_has_trace(other.nodes, path) for other in others):
        return False
    # No trace in any arm: an arm that would have left one did not run.
    if _leaves_trace(arm.nodes, workflow):
        return False
    possible = [other for other in others if not _leaves_trace(other.nodes, workflow)]
    return True if not possible else None


def took(delta: timedelta) -> str:
    """A duration in words, to the millisecond under a second (``"12 ms"``, ``"3 min 12 s"``)."""
    seconds = delta.total_seconds()
    if 0 <= seconds < 1:
        return f"{round(seconds * 1000)} ms"
    return humanize(delta)


def _told(node: Node, found: Trace, run: Any, now: datetime) -> tuple[str, str]:
    """(duration, outcome) of a step, in words, from its trace."""
    if node.kind == "retry" and (found.attempts or found.failed):
        most = found.max_attempts or "?"
        end = found.retry_ended
        length = f"took {took(end - found.retry_started)}" if end and found.retry_started else ""
        if found.failed:
            return length, f"gave up after attempt {found.attempts or '?'} of {most}"
        if node.state == "current":
            failed = f"attempt {found.attempts} of {most} failed"
            return length, f"{failed}; attempt {found.attempts + 1} next"
        return length, f"succeeded on attempt {found.attempts + 1} of {most}"
    if found.suspended_at is not None:
        if found.resumed_at is not None:
            return (
                f"took {took(found.resumed_at - found.suspended_at)}",
                found.resumed_with or f"resumed at {when(found.resumed_at)}",
            )
        if node.state == "current":
            return f"{took(now - found.suspended_at)} so far", f"since {when(found.suspended_at)}"
        return "", f"suspended at {when(found.suspended_at)}"
    if found.ran_at is not None:
        length = f"ran in a segment of {took(found.segment)}" if found.segment is not None else ""
        return length, f"result kept at {when(found.ran_at)}"
    if found.failed:
        return "", "raised: see the error below"
    return "", ""
