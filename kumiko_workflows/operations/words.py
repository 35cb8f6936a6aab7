"""Words for people: counts, instants, durations, steps, JSON and match expressions.

The small texts the explanations, the timeline, the diagram, the admin and
the commands all put things in, so a run reads the same everywhere: times
in the current time zone with the zone named, durations in two units at
most. Words, not markup.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from kumiko_workflows.workflow import matching
from kumiko_workflows.workflow.registry import registry


def plural(count: int, one: str, many: str | None = None) -> str:
    """``plural(1, "run")`` -> ``"1 run"``; ``plural(2, "pass", "passes")`` -> ``"2 passes"``."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def when(value: datetime | None, zone: Any = None) -> str:
    """An instant in ``zone`` (default: the current time zone), the zone named.

    ``2026-01-05 10:00:00 UTC``; in a schedule's zone ``2026-01-05 11:00:00 CET``.
    """
    if value is None:
        return "—"
    local = timezone.localtime(value, zone)
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or timezone.get_current_timezone_name()}"


def humanize(delta: timedelta) -> str:
    """``timedelta(seconds=192)`` -> ``"3 min 12 s"`` (two units at most)."""
    seconds = int(abs(delta.total_seconds()))
    units = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    parts: list[str] = []
    for name, size in units:
        if seconds >= size or (name == "s" and not parts):
            parts.append(f"{seconds // size} {name}")
            seconds %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def step_label(workflow_name: str, step: str, version: int | None = None) -> str:
    """``"2.else.0"`` -> ``"step 2.else.0 (retry)"`` when the workflow (at ``version``) is declared.

    ``version`` None: the highest declared version.
    """
    if not step:
        return ""
    workflow = registry.get(workflow_name, version)
    return workflow.label(step) if workflow is not None else f"step {step}"


def short_json(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pretty_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, indent=2, default=str)


def describe_match(expression: Any) -> str:
    """A stored match expression in plain words (or as JSON if it is unreadable)."""
    try:
        return matching.describe(expression)
    except (KeyError, TypeError, AttributeError):
        return f"(unreadable match expression {short_json(expression)})"


def key_text(key: str) -> str:
    """`` of key 'k'`` for a limit key, nothing for the empty key."""
    return f" of key {key!r}" if key else ""
