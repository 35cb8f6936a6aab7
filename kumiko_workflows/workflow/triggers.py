"""What starts a workflow's runs: an event of a type (:func:`on_event`), or cron slots.

The cron trigger and its slots are :mod:`kumiko_workflows.workflow.cron`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kumiko_workflows.exceptions import (
    InvalidDuration,
    WorkflowDefinitionError,
)
from kumiko_workflows.workflow import priorities
from kumiko_workflows.workflow.cron import CronTrigger
from kumiko_workflows.workflow.durations import as_delay
from kumiko_workflows.workflow.step_kind import callable_name


@dataclass(frozen=True, eq=False)
class EventTrigger:
    event_type: str
    filter: Callable[[Any], Any] | None = None
    #: The runs' priority (a number, or a callable of the event), over the workflow's.
    priority: priorities.Priority = None
    #: A burst of events of one key starts one run, with its last event, once
    #: quiet for ``debounce`` (at the latest ``debounce_max`` after its first).
    debounce: timedelta | None = None
    debounce_max: timedelta | None = None
    kind = "event"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "event",
            "type": self.event_type,
            "filter": callable_name(self.filter) if self.filter else None,
        }


def on_event(
    event_type: str,
    filter: Callable[[Any], Any] | None = None,
    *,
    priority: priorities.Priority = None,
    debounce: Any = None,
    debounce_max: Any = None,
) -> EventTrigger:
    """Start a run whenever an event of ``event_type`` is appended (and ``filter(event)``).

    ``priority`` (-100 to 100, or a callable of the event returning one)
    gives the runs this trigger starts their priority, over the workflow's.
    ``debounce`` (seconds, an ISO duration or a timedelta): a burst of
    events of one key (the workflow's ``idempotency_key``) starts one run,
    with the burst's last event, once no event of the key came for that
    long; ``debounce_max`` (default 10 × ``debounce``) bounds the wait from
    the burst's first event (docs/howto/priorities.md).
    """
    if not isinstance(event_type, str) or not event_type.strip():
        raise WorkflowDefinitionError(f"on_event() needs an event type, got {event_type!r}")
    if filter is not None and not callable(filter):
        raise WorkflowDefinitionError(f"on_event(filter=...) must be callable, got {filter!r}")
    wrong = priorities.definition_problem(priority)
    if wrong:
        raise WorkflowDefinitionError(f"[kumiko_workflows.E115] on_event(priority=...): {wrong}")
    period, longest = _debounce_periods(debounce, debounce_max)
    return EventTrigger(event_type, filter, priority, period, longest)


def _debounce_periods(
    debounce: Any, debounce_max: Any
) -> tuple[timedelta | None, timedelta | None]:
    """``on_event``'s debounce and its bound as timedeltas (None, None: no debounce)."""
    if debounce is None:
        if debounce_max is not None:
            raise WorkflowDefinitionError(
                "[kumiko_workflows.E117] on_event(debounce_max=...) needs debounce=..."
            )
        return None, None
    try:
        period = as_delay(debounce)
        longest = period * 10 if debounce_max is None else as_delay(debounce_max)
    except InvalidDuration as exc:
        raise WorkflowDefinitionError(
            f"[kumiko_workflows.E117] on_event(debounce): {exc}"
        ) from None
    if period <= timedelta(0):
        raise WorkflowDefinitionError(
            "[kumiko_workflows.E117] on_event(debounce=...) must be longer than 0"
        )
    if longest < period:
        raise WorkflowDefinitionError(
            f"[kumiko_workflows.E117] on_event(debounce_max=...) ({longest}) is shorter than "
            f"debounce ({period})"
        )
    return period, longest


@dataclass(frozen=True, eq=False)
class CallTrigger:
    """Runs started only by a parent's ``call_workflow`` or ``fan_out`` step."""

    kind = "call"

    def describe(self) -> dict[str, Any]:
        return {"kind": "call"}


def on_call() -> CallTrigger:
    """A workflow started only as a child run (``steps.call_workflow``, ``steps.fan_out``).

    Any workflow may be called; one with this trigger is never started by an
    event or a schedule. Its run's trigger is the parent's request, whose
    payload is the child's input.
    """
    return CallTrigger()


#: Any kind of trigger.
Trigger = EventTrigger | CronTrigger | CallTrigger
