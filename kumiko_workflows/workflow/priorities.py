"""Run priorities: a bounded head start on the due time, so no priority starves another.

A run's priority is a whole number from -100 to 100 (Django's task scale;
0, the default, is none). Among due rows a worker takes the row whose
*claim instant* comes first: its due time less its priority's head start,
``priority / 100 × PRIORITY_HEAD_START`` (a negative priority holds a row
back by as much). So a run of priority ``p`` due at ``w`` is claimed before
every run of priority ``q`` that becomes due after ``w + (q - p) / 100 ×
PRIORITY_HEAD_START``: a lowest-priority run is passed over by at most the
work that becomes due in the ``2 × PRIORITY_HEAD_START`` after it, never for
ever (docs/howto/priorities.md states and proves the bound).

The priority is recorded in the run's stream (``run-started``, every
suspension and wake-up, with the head start it was given in seconds), so a
rebuild of the pending table gives the same claim order.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from kumiko_workflows.conf import workflow_settings

MIN_PRIORITY = -100
MAX_PRIORITY = 100
DEFAULT_PRIORITY = 0

#: What ``priority=`` accepts: a whole number, or a callable of the trigger event.
Priority = int | Callable[[Any], Any] | None


def problem(value: Any) -> str | None:
    """Why ``value`` is not a priority (a whole number from -100 to 100), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"a priority is a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}, got {value!r}"
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        return f"a priority is from {MIN_PRIORITY} to {MAX_PRIORITY}, got {value}"
    return None


def definition_problem(value: Any) -> str | None:
    """Why ``priority=`` of a definition is invalid (a number or a callable), or None."""
    if value is None or callable(value):
        return None
    return problem(value)


def head_start_seconds(priority: int) -> float:
    """Seconds a row of ``priority`` is claimed ahead of its due time (negative: held back)."""
    if not priority:
        return 0.0
    return priority * head_start_setting() / MAX_PRIORITY


def head_start_setting() -> float:
    """``KUMIKO_WORKFLOWS['PRIORITY_HEAD_START']`` in seconds (0 if invalid: check E116)."""
    value = workflow_settings.PRIORITY_HEAD_START
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return 0.0
    return float(value)


def claim_instant(wake_at: datetime | None, head_start: float) -> datetime | None:
    """The instant a row due at ``wake_at`` takes its turn in the claim's order."""
    if wake_at is None or not head_start:
        return wake_at
    return wake_at - timedelta(seconds=head_start)


def recorded(payload: dict[str, Any], priority: int) -> dict[str, Any]:
    """``payload`` with the run's priority and its head start, as a suspension records them."""
    if not priority:
        return payload
    return {**payload, "priority": priority, "head_start": head_start_seconds(priority)}
