"""A run's events read for its diagram and its step results panel.

:func:`read_path` goes through a run's events once, oldest first, and keeps
what each step position did (:class:`RunPath`): when it suspended and
resumed, the segment its result was kept in, its retry attempts, where the
run failed; the results and awaited events of its latest state. The
diagram (:mod:`kumiko_workflows.operations.diagram`) and the results panel
(:mod:`kumiko_workflows.operations.step_results`) are drawn from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.step_kind import iter_steps, path_text


@dataclass
class Trace:
    """What a run's events say about one step position."""

    suspended_at: datetime | None = None
    resumed_at: datetime | None = None
    ran_at: datetime | None = None
    segment: timedelta | None = None
    attempts: int = 0
    max_attempts: Any = None
    retry_started: datetime | None = None
    retry_ended: datetime | None = None
    resumed_with: str = ""
    failed: bool = False


@dataclass
class RunPath:
    """A run's events read for the diagram and the results panel."""

    traces: dict[str, Trace]
    #: Result name -> (value, when it was first kept, the step position that made it).
    results: dict[str, tuple[Any, datetime, str]]
    #: Awaits key -> the awaited event's id (None: the wait timed out or was woken).
    awaited: dict[str, int | None]
    #: Engine internals of the latest state (trace links and the like).
    internals: dict[str, Any]
    failed_step: str = ""


def result_producers(workflow: Workflow) -> dict[str, str]:
    """The step position that makes each result name, the first one if several do."""
    found: dict[str, str] = {}
    for path, step in iter_steps(workflow.steps):
        name = step.result_name()
        if name is not None:
            found.setdefault(name, path_text(path))
    return found


def read_path(workflow: Workflow | None, events: Iterable[Any]) -> RunPath:
    """The traces, results and awaited events of a run's events (oldest first)."""
    producers = result_producers(workflow) if workflow is not None else {}
    traces: dict[str, Trace] = {}
    results: dict[str, tuple[Any, datetime, str]] = {}
    awaited: dict[str, int | None] = {}
    internals: dict[str, Any] = {}
    failed_step = ""
    opened: datetime | None = None
    retrying: str | None = None

    def trace(step: str) -> Trace:
        return traces.setdefault(step, Trace())

    for event in events:
        payload = event.payload or {}
        at = event.created_at
        step = payload.get("step") or ""
        if event.type in (et.RUN_STARTED, et.RESUMED):
            opened = at
            if event.type == et.RESUMED and step:
                kind = payload.get("suspension_type") or ""
                if kind == "retry":
                    retrying = step
                elif kind in ("wait", "event"):
                    found = trace(step)
                    found.resumed_at = at
                    if kind == "event":
                        event_id = payload.get("awaited_event_id")
                        found.resumed_with = (
                            f"the awaited event #{event_id} arrived"
                            if event_id
                            else "no event: the deadline passed, or it was woken"
                        )
            continue
        if event.type == et.RERUN_REQUESTED:
            failed_step = ""
            for found in traces.values():
                found.failed = False
            continue
        if event.type not in (*et.SUSPENSIONS, *et.TERMINAL):
            continue
        segment = at - opened if opened is not None else None
        state = payload.get("state")
        if isinstance(state, dict):
            for name, value in (state.get("results") or {}).items():
                if name not in results:
                    producer = producers.get(name, "")
                    results[name] = (value, at, producer)
                    if producer:
                        ran = trace(producer)
                        ran.ran_at, ran.segment = at, segment
                else:
                    results[name] = (value, results[name][1], results[name][2])
            for key, event_id in (state.get("awaited") or {}).items():
                awaited[key] = event_id
            internals = {k: v for k, v in state.items() if k not in ("results", "awaited")}
        if retrying is not None and not (event.type == et.RETRY_SCHEDULED and step == retrying):
            trace(retrying).retry_ended = at
            retrying = None
        if event.type in (et.WAITING, et.WAITING_FOR_EVENT) and step:
            trace(step).suspended_at = at
        elif event.type == et.RETRY_SCHEDULED and step:
            found = trace(step)
            found.attempts = max(found.attempts, int(payload.get("attempt") or 0))
            found.max_attempts = payload.get("max_attempts")
            if found.retry_started is None:
                found.retry_started = opened
        elif event.type == et.RUN_FAILED:
            failed_step = step
            if step:
                found = trace(step)
                found.failed = True
                if payload.get("attempt"):
                    found.attempts = int(payload["attempt"])
                    found.max_attempts = payload.get("max_attempts")
        opened = None
    return RunPath(traces, results, awaited, internals, failed_step)
