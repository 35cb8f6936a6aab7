"""A run's event timeline in words: each run event summarised, its references, in full.

:func:`timeline` lists a run's events oldest first, each with its step, a
summary (:func:`describe_event`: the suspension records' own words for a
suspending event), the events it refers to and its whole payload, for the
admin's run page and the commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kumiko_workflows.models import Event, WorkflowRun
from kumiko_workflows.operations.words import (
    describe_match,
    key_text,
    pretty_json,
    short_json,
    step_label,
    when,
)
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import suspensions
from kumiko_workflows.workflow.arguments import is_int

#: Payload keys a timeline leaves out: bulky or shown in a column of their own.
_TIMELINE_HIDDEN = frozenset(
    {
        "workflow_name",
        "definition_fingerprint",
        "from_fingerprint",
        "step_fingerprints",
        "state",
        "step",
        "by",
    }
)


def short_payload(payload: dict[str, Any], limit: int = 120, *, type: str = "") -> str:
    """``key=value`` pairs of a run event's payload, leaving out the bulky ones."""
    parts = []
    for key, value in sorted(payload.items()):
        if key in _TIMELINE_HIDDEN or value in (None, "", {}, []):
            continue
        if key == "trigger_event_id" and type != et.RUN_STARTED:
            continue  # the same on every event of the run
        if key == "match":
            shown = describe_match(value)
        else:
            shown = value if isinstance(value, str) else short_json(value, 60)
        parts.append(f"{key}={shown}")
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _instant(value: Any) -> str:
    try:
        return when(datetime.fromisoformat(value)) if value else "—"
    except (TypeError, ValueError):
        return str(value)


class _Words:
    """How the timeline puts a payload's instants and matches (:class:`suspension_record.Words`)."""

    def instant(self, value: Any) -> str:
        return _instant(value)

    def match(self, expression: Any) -> str:
        return describe_match(expression)


_WORDS = _Words()


def describe_event(type: str, payload: dict[str, Any]) -> str:
    """One run event in words: what the timeline shows before its details are opened.

    Attempts are counted as the error text counts them: a retry that
    schedules attempt 2 says attempt 1 failed, the resume that follows runs
    attempt 2.
    """
    get = payload.get
    if type == et.RUN_STARTED:
        text = f"key {get('idempotency_key')}"
        if get("search_key"):
            text += f", search key {get('search_key')}"
        if get("priority"):
            text += f", priority {get('priority')}"
        return text + f"; trigger event #{get('trigger_event_id')}"
    record = suspensions.for_event(type)
    if record is not None:
        if record.summary is None:
            return short_payload(payload, type=type)
        return record.summary(payload, _WORDS)
    if type == et.RESUMED:
        kind = get("suspension_type")
        if kind == "retry":
            return f"runs attempt {(get('retry_attempt') or 0) + 1}"
        if kind == "event":
            if get("awaited_event_id"):
                return f"with the awaited event #{get('awaited_event_id')}"
            return "without the awaited event (the deadline passed, or it was woken)"
        return f"after the {kind or 'wait'}"
    if type == et.RUN_COMPLETED:
        return "every step ran"
    if type == et.RUN_FAILED:
        return f"{get('reason')}: {get('error') or '—'}"
    if type == et.RUN_CANCELLED:
        return f"reason: {get('reason') or '—'}"
    if type == et.WAKE_REQUESTED:
        if get("awaited_event_id"):
            return f"the awaited event #{get('awaited_event_id')} arrived"
        return "woken by hand: due now"
    if type == et.SLOT_TAKEN:
        how = "from start to end" if get("holds") == "active" else "for this segment"
        given = ", offered" if get("offered") else ""
        return f"takes slot {get('slot')}{key_text(get('limit_key') or '')} {how}{given}"
    if type == et.SLOT_RELEASED:
        return f"frees slot {get('slot')}{key_text(get('limit_key') or '')}"
    if type == et.SLOT_OFFERED:
        return f"a slot{key_text(get('limit_key') or '')} freed: due now"
    if type == et.RATE_TAKEN:
        return f"starts at {_instant(get('at'))} (rate slot {get('slot')})"
    return short_payload(payload, type=type)


def referenced_events(type: str, payload: dict[str, Any]) -> list[tuple[str, int]]:
    """(what, event id) of the events a run event refers to: its trigger, awaited ones."""
    refs: list[tuple[str, int]] = []
    if type == et.RUN_STARTED and _is_id(payload.get("trigger_event_id")):
        refs.append(("trigger event", payload["trigger_event_id"]))
    if _is_id(payload.get("awaited_event_id")):
        refs.append(("awaited event", payload["awaited_event_id"]))
    state = payload.get("state")
    awaited = state.get("awaited") if isinstance(state, dict) else None
    if isinstance(awaited, dict):
        refs.extend(
            (f"awaited event ({key})", event_id)
            for key, event_id in sorted(awaited.items())
            if _is_id(event_id)
        )
    return refs


def _is_id(value: Any) -> bool:
    return is_int(value)


@dataclass
class TimelineEntry:
    event_id: int
    version: int
    created_at: datetime
    type: str
    step: str
    summary: str
    by: str
    #: The whole payload, as pretty JSON: what the summary leaves out.
    details: str = ""
    #: (what, event id) of the events this one refers to.
    refs: list[tuple[str, int]] = field(default_factory=list)


def timeline(run: WorkflowRun) -> list[TimelineEntry]:
    """The run's events, oldest first, each with its step, in words and in full."""
    entries = []
    stream = Event.objects.filter(tenant_id=run.tenant_id, aggregate_id=run.run_id)
    version = run.workflow_version
    for event in stream.order_by("version"):
        payload = event.payload or {}
        if event.type in (et.RUN_STARTED, et.RUN_MIGRATED):
            version = payload.get("workflow_version", version)  # the steps' version from here
        step = payload.get("step") or ""
        entries.append(
            TimelineEntry(
                event_id=event.id,
                version=event.version,
                created_at=event.created_at,
                type=event.type,
                step=step_label(run.workflow_name, step, version) if step else "",
                summary=describe_event(event.type, payload),
                by=payload.get("by") or "",
                details=pretty_json(payload),
                refs=referenced_events(event.type, payload),
            )
        )
    return entries


def awaited_events(entries: list[TimelineEntry]) -> list[tuple[str, int]]:
    """The awaited events a run took, first mention first, each once."""
    seen: dict[int, str] = {}
    for entry in entries:
        for what, event_id in entry.refs:
            if what != "trigger event":
                seen.setdefault(event_id, what)
    return [(what, event_id) for event_id, what in seen.items()]
