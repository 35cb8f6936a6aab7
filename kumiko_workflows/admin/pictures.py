"""What the admin draws of runs: status badges, step cells, payload previews, a run's picture.

A status is a badge (a colour, a symbol and the word); a step position
carries its step's symbol and title; an event's payload is a one-line
preview; a run's page gets its workflow drawn as a diagram with the run's
path (:mod:`kumiko_workflows.operations.diagram`), its step results and its
folded engine details. Every text reaches the page through a template or
``format_html``, so it is escaped (workflow inputs, step results and event
payloads are user data).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse
from django.utils.html import format_html

from kumiko_workflows.models import Event, WorkflowRun
from kumiko_workflows.operations import diagram
from kumiko_workflows.operations.timeline import describe_event, short_payload
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.registry import registry

#: The one placeholder of an empty cell or fact.
EMPTY = "—"
#: Aggregate types of the engine's own streams (runs, cron schedules).
ENGINE_AGGREGATE_TYPES = (et.RUN_AGGREGATE_TYPE, et.SCHEDULE_AGGREGATE_TYPE)

#: A status's symbol, shown beside its colour and its word.
STATUS_SYMBOLS: dict[str, str] = {
    "running": "▶",
    "waiting": "‖",
    "completed": "✓",
    "failed": "✗",
    "cancelled": "⊘",
}


def status_badge(status: str) -> str:
    """A run's status as a badge: a colour, a symbol and the word."""
    return format_html(
        '<span class="kw-badge kw-badge--{}"><span class="kw-sym" aria-hidden="true">{}</span>{}'
        "</span>",
        status,
        STATUS_SYMBOLS.get(status, "•"),
        status,
    )


@functools.lru_cache(maxsize=1024)
def _pair(key: str, value: str) -> str:
    return urlencode({key: value})


def _query(filters: dict[str, Any]) -> str:
    """``filters`` as a query string; each pair encoded once (a chart repeats its instants)."""
    return "&".join(_pair(key, str(value)) for key, value in filters.items())


class Links:
    """The admin URLs the pages link to, for one admin site."""

    def __init__(self, site_name: str) -> None:
        self.site = site_name
        self._reversed: dict[str, str] = {}

    def _name(self, model: str, view: str) -> str:
        # A chart's table links each bucket twice: reverse each list's URL once.
        name = f"{self.site}:kumiko_workflows_{model}_{view}"
        if name not in self._reversed:
            self._reversed[name] = reverse(name)
        return self._reversed[name]

    def runs(self, **filters: Any) -> str:
        url = self._name("workflowrun", "changelist")
        return f"{url}?{_query(filters)}" if filters else url

    def pending(self, **filters: Any) -> str:
        url = self._name("workflowrunpending", "changelist")
        return f"{url}?{_query(filters)}" if filters else url

    def run(self, run_id: Any) -> str:
        return reverse(f"{self.site}:kumiko_workflows_workflowrun_change", args=[str(run_id)])

    def event(self, event_id: Any) -> str:
        return reverse(f"{self.site}:kumiko_workflows_event_change", args=[event_id])

    def dashboard(self, workflow: str = "") -> str:
        url = self._name("workflowrun", "dashboard")
        return f"{url}?{urlencode({'workflow': workflow})}" if workflow else url

    def workflow(self, name: str) -> str:
        return reverse(f"{self.site}:kumiko_workflows_workflowrun_workflow", args=[name])


def step_cell(workflow_name: str, step: str, version: int | None) -> str:
    """A step position with its step's symbol and title under it (``1.then.1`` / ``◷ wait``)."""
    if not step:
        return EMPTY
    workflow = registry.get(workflow_name, version)
    found = workflow.step_at(step) if workflow is not None else None
    if found is None:
        return format_html('<span class="kw-nowrap">{}</span>', step)
    shape = diagram.shape_of(found)
    return format_html(
        '<span class="kw-nowrap">{}</span><span class="kw-step-name">'
        '<span aria-hidden="true">{} </span>{}</span>',
        step,
        shape.glyph,
        shape.title(found),
    )


def payload_preview(event: Event) -> str:
    """An event's payload in a line: the engine's in words, a domain event's as key=value."""
    payload = event.payload or {}
    if event.aggregate_type in ENGINE_AGGREGATE_TYPES:
        text = describe_event(event.type, payload)
    else:
        text = short_payload(payload, 100, type=event.type) if payload else ""
    if not text:
        return EMPTY
    return format_html('<span class="kw-preview" title="{}">{}</span>', text, text)


def run_picture(
    run: WorkflowRun, events: list[Event], now: datetime, links: Links
) -> dict[str, Any]:
    """A run page's diagram, step results and folded engine details."""
    workflow = registry.of_run(run.workflow_name, run.workflow_version, run.definition_fingerprint)
    if workflow is None:
        workflow = registry.get(run.workflow_name, run.workflow_version)
    context: dict[str, Any] = {"kw_workflow_url": links.workflow(run.workflow_name)}
    if workflow is not None:
        nodes, path = diagram.run_nodes(workflow, run, events, now)
        context["kw_nodes"] = nodes
        shown = {node.state for top in nodes for node in top.walk()} - {"static"}
        context["kw_legend"] = [
            (state, text) for state, text in diagram.STATES.items() if state in shown
        ]
    else:
        path = diagram.read_path(None, events)
        context["kw_nodes"] = None
    context["kw_results"] = diagram.result_rows(workflow, path, links.event)
    internals = [
        ("Definition fingerprint", run.definition_fingerprint),
        ("Stream version", str(run.version)),
    ]
    internals.extend((f"State: {key}", str(value)) for key, value in sorted(path.internals.items()))
    context["kw_internals"] = internals
    return context
