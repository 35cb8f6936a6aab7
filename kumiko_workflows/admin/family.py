"""A run's family on its admin page: its parent run, and its children with each step's progress."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.html import format_html, format_html_join

from kumiko_workflows.models import WorkflowChildGroup, WorkflowRun

#: Children linked one by one on a run page; more are a filtered list away.
CHILD_LINKS = 20


def run_link(url: str, run_id: Any) -> str:
    return format_html('<a class="kw-id" href="{}" title="{}">{}</a>', url, run_id, run_id)


def progress_text(group: WorkflowChildGroup) -> str:
    """A fan-out's progress for people: "7 of 12 children finished, 1 failed"."""
    text = f"{group.finished} of {group.total} children finished, {group.failed} failed"
    if group.closed:
        text += " (cancelled: no further child starts)"
    elif group.stopped and group.started < group.total:
        text += f" (stopped by a failure: {group.total - group.started} not started)"
    return text


def family(run: WorkflowRun, url: Callable[[Any], str], runs_list: str) -> list[tuple[str, str]]:
    """(label, html) rows: the run's parent, and per step that started children their progress.

    ``url(run_id)`` is a run's admin page; ``runs_list`` the runs' list page.
    """
    rows: list[tuple[str, str]] = []
    if run.parent_run_id is not None:
        rows.append(("Parent run", run_link(url(run.parent_run_id), run.parent_run_id)))
    groups = WorkflowChildGroup.objects.filter(
        tenant_id=run.tenant_id, parent_run_id=run.run_id
    ).order_by("id")
    for group in groups:
        children = WorkflowRun.objects.filter(
            tenant_id=run.tenant_id, parent_run_id=run.run_id, parent_group=group.group
        ).order_by("started_at", "run_id")[:CHILD_LINKS]
        links = format_html_join(
            " ", "{}", ((run_link(url(child.run_id), child.run_id),) for child in children)
        )
        rows.append(
            (
                f"Children of step {group.step}",
                format_html(
                    '{} <a href="{}">(all)</a><br>{}',
                    progress_text(group),
                    f"{runs_list}?parent_run_id={run.run_id}",
                    links,
                ),
            )
        )
    return rows
