"""What starts a workflow's runs: an event of a type (:func:`on_event`), or cron slots.

The cron trigger and its slots are :mod:`kumiko_workflows.workflow.cron`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kumiko_workflows.exceptions import (
    WorkflowDefinitionError,
)
from kumiko_workflows.workflow.cron import CronTrigger
from kumiko_workflows.workflow.step_kind import callable_name


@dataclass(frozen=True, eq=False)
class EventTrigger:
    event_type: str
    filter: Callable[[Any], Any] | None = None
    kind = "event"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "event",
            "type": self.event_type,
            "filter": callable_name(self.filter) if self.filter else None,
        }


def on_event(event_type: str, filter: Callable[[Any], Any] | None = None) -> EventTrigger:
    """Start a run whenever an event of ``event_type`` is appended (and ``filter(event)``)."""
    if not isinstance(event_type, str) or not event_type.strip():
        raise WorkflowDefinitionError(f"on_event() needs an event type, got {event_type!r}")
    if filter is not None and not callable(filter):
        raise WorkflowDefinitionError(f"on_event(filter=...) must be callable, got {filter!r}")
    return EventTrigger(event_type, filter)


#: Either kind of trigger.
Trigger = EventTrigger | CronTrigger
