"""A run's step results panel: its results and awaited events, readable by people.

:func:`result_rows` lists what a run's steps kept, read from its events by
:mod:`kumiko_workflows.operations.run_path`; :func:`readable` turns each
JSON value into pairs, items and texts, to a depth, for the admin to draw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kumiko_workflows.operations.run_path import RunPath, result_producers
from kumiko_workflows.operations.words import short_json
from kumiko_workflows.workflow.definition import Workflow

#: Items of a list or keys of an object shown before "and N more".
READABLE_ITEMS = 12
#: Deeper than this, a value is shown as one line of JSON.
READABLE_DEPTH = 2


@dataclass
class Readable:
    """A JSON value for people: a text, key/value pairs, or items (nested up to a depth)."""

    kind: str
    text: str = ""
    pairs: list[tuple[str, Readable]] = field(default_factory=list)
    items: list[Readable] = field(default_factory=list)
    more: int = 0


def readable(value: Any, depth: int = 0) -> Readable:
    """``value`` (a step result) as a :class:`Readable`."""
    if value is None:
        return Readable("empty", "none")
    if isinstance(value, bool):
        return Readable("text", "yes" if value else "no")
    if isinstance(value, str):
        return Readable("text", value) if value else Readable("empty", "empty text")
    if isinstance(value, int | float):
        return Readable("text", f"{value:,}" if isinstance(value, int) else str(value))
    if depth >= READABLE_DEPTH and isinstance(value, dict | list):
        return Readable("json", short_json(value, 200))
    if isinstance(value, dict):
        if not value:
            return Readable("empty", "an empty object")
        keys = sorted(value, key=str)
        pairs = [(str(key), readable(value[key], depth + 1)) for key in keys[:READABLE_ITEMS]]
        return Readable("pairs", pairs=pairs, more=max(0, len(keys) - READABLE_ITEMS))
    if isinstance(value, list):
        if not value:
            return Readable("empty", "an empty list")
        items = [readable(item, depth + 1) for item in value[:READABLE_ITEMS]]
        return Readable("items", items=items, more=max(0, len(value) - READABLE_ITEMS))
    return Readable("text", str(value))


@dataclass
class ResultRow:
    name: str
    #: The step that made it, in words (``step 0 (compute 'welcome')``), if known.
    step: str
    at: datetime | None
    value: Readable
    #: For an awaited event: its id (None: the wait ended without one), and its page.
    awaited_event_id: int | None = None
    awaited: bool = False
    awaited_url: str = ""


def result_rows(
    workflow: Workflow | None, path: RunPath, event_url: Callable[[int], str] | None = None
) -> list[ResultRow]:
    """The run's step results, in the order they were kept; awaited events by reference.

    ``event_url`` gives an awaited event's page (the admin's), for the link.
    """
    rows = []
    for name, (value, at, producer) in sorted(path.results.items(), key=lambda item: item[1][1]):
        step = workflow.label(producer) if workflow is not None and producer else ""
        rows.append(ResultRow(name, step, at, readable(value)))
    producers = result_producers(workflow) if workflow is not None else {}
    for key, event_id in path.awaited.items():
        producer = producers.get(key, "")
        step = workflow.label(producer) if workflow is not None and producer else ""
        resumed = path.traces.get(producer)
        resumed_at = resumed.resumed_at if resumed is not None else None
        text = "" if event_id else "none: the wait ended without the event"
        rows.append(
            ResultRow(
                key,
                step,
                resumed_at,
                Readable("empty", text),
                awaited_event_id=event_id,
                awaited=True,
            )
        )
    return rows
