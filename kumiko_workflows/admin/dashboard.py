"""The admin dashboard and a workflow's own page: their context and their views.

The figures come from :mod:`kumiko_workflows.operations.dashboard`, the
charts' geometry from :mod:`kumiko_workflows.operations.charts`, the
diagram from :mod:`kumiko_workflows.operations.diagram`; this module turns
them into template context with the links into the filtered lists, and
serves both pages as views of the run admin (:class:`PagesMixin`), with its
permission and its tenant scoping.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from kumiko_workflows.admin.pictures import EMPTY, Links
from kumiko_workflows.models import RunStatus
from kumiko_workflows.operations import charts, diagram
from kumiko_workflows.operations.dashboard import (
    KINDS,
    STALE_AFTER,
    Dashboard,
    Figures,
    Series,
    dashboard,
)
from kumiko_workflows.operations.words import humanize, when
from kumiko_workflows.workflow import clock
from kumiko_workflows.workflow.cron import CronTrigger
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.registry import registry
from kumiko_workflows.workflow.step_kind import callable_name
from kumiko_workflows.workflow.triggers import EventTrigger


def _iso(instant: datetime) -> str:
    return instant.isoformat()


def _percent(rate: float | None) -> str:
    return EMPTY if rate is None else f"{rate * 100:.1f} %"


def _hour_label(start: datetime) -> str:
    return f"{timezone.localtime(start):%H:00}"


def _day_label(start: datetime) -> str:
    return f"{timezone.localtime(start):%b %d}"


def _chart(
    series: Series,
    label: Callable[[datetime], str],
    links: Links,
    workflow: str,
    what: str,
    tick_every: int,
) -> dict[str, Any]:
    chart = charts.bar_chart(series, label, tick_every=tick_every, what=what)
    scope = {"workflow_name__exact": workflow} if workflow else {}
    rows = []
    for i, start in enumerate(series.starts):
        end = bucket_end(series, i)
        rows.append(
            {
                "label": label(start)
                if series.unit == "hour"
                else f"{timezone.localtime(start):%Y-%m-%d}",
                **{f"{kind}_text": f"{series.counts[kind][i]:,}" for kind in KINDS},
                "started": series.counts["started"][i],
                "failed": series.counts["failed"][i],
                "started_url": links.runs(
                    started_at__gte=_iso(start), started_at__lt=_iso(end), **scope
                ),
                "failed_url": links.runs(
                    status__exact=RunStatus.FAILED,
                    finished_at__gte=_iso(start),
                    finished_at__lt=_iso(end),
                    **scope,
                ),
            }
        )
    totals = [(kind, f"{series.total(kind):,}") for kind in KINDS]
    return {
        "chart": chart,
        "bars": svg_bars(chart),
        "rows": figure_rows(list(reversed(rows))),
        "totals": totals,
    }


def svg_bars(chart: charts.Chart) -> str:
    """The chart's bars as SVG rectangles, each with its title (escaped, as all text here)."""
    return format_html_join(
        "",
        '<rect class="kw-bar--{}" x="{}" y="{}" width="{}" height="{}"><title>{}</title></rect>',
        (
            (bar.kind, f"{bar.x:g}", f"{bar.y:g}", f"{bar.width:g}", f"{bar.height:g}", bar.title)
            for bar in chart.bars
        ),
    )


def spark(chart: charts.Chart) -> str:
    """A small chart of runs started per hour, hidden from screen readers (its row has the
    figures)."""
    started = [bar for bar in chart.bars if bar.kind == "started"]
    return format_html(
        '<svg viewBox="0 0 {} {}" aria-hidden="true" focusable="false" '
        'preserveAspectRatio="none">{}</svg>',
        chart.width,
        chart.height,
        format_html_join(
            "",
            '<rect class="kw-bar--started" x="{}" y="{}" width="{}" height="{}"></rect>',
            ((f"{b.x:g}", f"{b.y:g}", f"{b.width:g}", f"{b.height:g}") for b in started),
        ),
    )


def _count_cell(count: int, text: str, url: str) -> str:
    return format_html('<a href="{}">{}</a>', url, text) if count else "0"


def figure_rows(rows: list[dict[str, Any]]) -> str:
    """The rows of a chart's table: a bucket, its counts, those that count runs linked."""
    return format_html_join(
        "",
        '<tr><th scope="row">{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
        (
            (
                row["label"],
                _count_cell(row["started"], row["started_text"], row["started_url"]),
                row["completed_text"],
                _count_cell(row["failed"], row["failed_text"], row["failed_url"]),
                row["cancelled_text"],
            )
            for row in rows
        ),
    )


def bucket_end(series: Series, i: int) -> datetime:
    """The end of bucket ``i``: an hour later (in UTC: a clock change has its hours), or the
    next local midnight."""
    start = series.starts[i]
    if series.unit == "hour":
        return start.astimezone(UTC) + timedelta(hours=1)
    following = timezone.localtime(start).date() + timedelta(days=1)
    return timezone.make_aware(datetime.combine(following, time.min))


def _workflow_row(figures: Figures, links: Links, now: datetime) -> dict[str, Any]:
    hourly = figures.hourly
    since = _iso(hourly.starts[0])
    oldest = figures.oldest_due
    return {
        "name": figures.name,
        "page_url": links.workflow(figures.name),
        "runs_url": links.runs(workflow_name__exact=figures.name, started_at__gte=since),
        "failed_url": links.runs(
            workflow_name__exact=figures.name,
            status__exact=RunStatus.FAILED,
            finished_at__gte=since,
        ),
        **{kind: f"{hourly.total(kind):,}" for kind in KINDS},
        "failed": hourly.total("failed"),
        "rate": _percent(figures.rate_24h),
        "due": f"{figures.due:,}",
        "oldest_due": f"{humanize(now - oldest)} ago" if oldest else EMPTY,
        "spark": spark(charts.bar_chart(hourly, _hour_label, width=120, height=24, compact=True)),
    }


def _trigger_text(workflow: Workflow) -> str:
    trigger = workflow.trigger
    if isinstance(trigger, CronTrigger):
        return f"cron {trigger.expression} in {trigger.timezone} (catch-up {trigger.catch_up})"
    if not isinstance(trigger, EventTrigger):
        return "called by a parent run (call_workflow, fan_out)"
    text = f"each {trigger.event_type!r} event"
    if trigger.filter is not None:
        text += f" that {callable_name(trigger.filter).rsplit('.', 1)[-1]}(event) passes"
    return text


def dashboard_context(
    tenant: str | None, now: datetime, links: Links, workflow: str
) -> dict[str, Any]:
    """The dashboard page's context (see ``admin/kumiko_workflows/dashboard.html``)."""
    figures: Dashboard = dashboard(tenant, now, workflow or None)
    overall = figures.overall
    names = sorted({w.name for w in registry.all()} | {f.name for f in figures.workflows})
    finished_24h = overall.hourly.total("completed") + overall.hourly.total("failed")
    stale = [w for w in figures.workers if w["age_seconds"] > STALE_AFTER]
    oldest = figures.oldest_due
    scope = {"workflow_name__exact": workflow} if workflow else {}
    workers = []
    for worker in figures.workers:
        late = worker["age_seconds"] > STALE_AFTER
        workers.append(
            {
                **worker,
                "state": "stale" if late else "alive",
                "state_text": "not seen lately" if late else "alive",
                "tenants_text": ", ".join(worker["tenants"])
                if worker["tenants"]
                else "every tenant",
                "started_text": when(datetime.fromisoformat(worker["started_at"])),
            }
        )
    since_30d = _iso(overall.daily.starts[0])
    reasons = [
        {
            "reason": reason,
            "count": f"{count:,}",
            "recent": f"{overall.reasons_24h.get(reason, 0):,}",
            "url": links.runs(
                status__exact=RunStatus.FAILED,
                failure_reason=reason,
                finished_at__gte=since_30d,
                **scope,
            ),
        }
        for reason, count in overall.top_reasons()
    ]
    due_text = f"{figures.due:,}{'+' if figures.due_capped else ''}"
    return {
        "kw": figures,
        "kw_workflow": workflow,
        "kw_workflow_names": names,
        "kw_zone": timezone.get_current_timezone_name(),
        "kw_now_text": when(now),
        "kw_due_text": f"{due_text} run{'s' if figures.due != 1 else ''}",
        "kw_due_url": links.pending(wake_at__lte=_iso(now), **scope),
        "kw_oldest_url": links.run(oldest["run_id"]) if oldest and "run_id" in oldest else "",
        "kw_oldest_since": when(datetime.fromisoformat(oldest["due_since"])) if oldest else "",
        "kw_rate_24h": _percent(overall.rate_24h),
        "kw_rate_24h_note": (
            f"{overall.hourly.total('failed'):,} of {finished_24h:,} finished runs failed"
            if finished_24h
            else "no run finished"
        ),
        "kw_rate_30d": _percent(overall.rate_30d),
        "kw_started_24h": f"{overall.hourly.total('started'):,}",
        "kw_started_30d": f"{overall.daily.total('started'):,}",
        "kw_started_url": links.runs(started_at__gte=_iso(overall.hourly.starts[0]), **scope),
        "kw_workers": workers,
        "kw_workers_alive": len(figures.workers) - len(stale),
        "kw_workers_stale": len(stale),
        "kw_stale_after": humanize(timedelta(seconds=STALE_AFTER)),
        "kw_hourly": _chart(
            overall.hourly,
            _hour_label,
            links,
            workflow,
            "runs per hour, last 24 hours",
            3,
        ),
        "kw_daily": _chart(
            overall.daily,
            _day_label,
            links,
            workflow,
            "runs per day, last 30 days",
            5,
        ),
        "kw_rows": [_workflow_row(f, links, now) for f in figures.workflows],
        "kw_reasons": reasons,
    }


def workflow_context(
    tenant: str | None, now: datetime, links: Links, name: str, version: int | None
) -> dict[str, Any]:
    """A workflow's page: its definition, its steps as a diagram, its last 24 hours."""
    workflow = registry.get(name, version)
    context: dict[str, Any] = {"kw_name": name, "kw_version": version}
    context["kw_dashboard_url"] = links.dashboard()
    if workflow is None:
        return context
    figures = dashboard(tenant, now, name)
    hourly = figures.overall.hourly
    counts = ", ".join(f"{hourly.total(kind):,} {kind}" for kind in KINDS)
    context.update(
        kw_definition=workflow,
        kw_versions=[each.version for each in registry.versions(name)],
        kw_trigger=_trigger_text(workflow),
        kw_awaits=sorted(workflow.awaits.items()),
        kw_nodes=diagram.workflow_nodes(workflow),
        kw_runs_url=links.runs(workflow_name__exact=name),
        kw_waiting_url=links.runs(workflow_name__exact=name, status__exact=RunStatus.WAITING),
        kw_failed_url=links.runs(workflow_name__exact=name, status__exact=RunStatus.FAILED),
        kw_workflow_dashboard_url=links.dashboard(name),
        kw_figures_text=f"{counts}; {figures.due:,} due now",
    )
    return context


class PagesMixin:
    """The dashboard and the workflows' pages, for the run admin (:class:`WorkflowRunAdmin`).

    Each needs the view permission on runs, as the run list does, and shows
    only the runs of the user's tenant (``tenant_of``).
    """

    admin_site: Any
    opts: Any
    #: The user's tenant (None: every tenant), and the run admin's view permission.
    tenant_of: Callable[[HttpRequest], str | None]
    has_view_permission: Callable[..., bool]

    def page_urls(self) -> list[URLPattern]:
        names = f"{self.opts.app_label}_{self.opts.model_name}"
        dashboard_view = self.admin_site.admin_view(self.dashboard_view)
        workflow_view = self.admin_site.admin_view(self.workflow_view)
        for view in (dashboard_view, workflow_view):
            view.model_admin = self  # as ModelAdmin's own views
        return [
            path("dashboard/", dashboard_view, name=f"{names}_dashboard"),
            path("workflows/<path:name>/", workflow_view, name=f"{names}_workflow"),
        ]

    def _page(
        self, request: HttpRequest, template: str, title: str, context: dict[str, Any]
    ) -> Any:
        if not self.has_view_permission(request):
            raise PermissionDenied
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request,
            template,
            {
                **self.admin_site.each_context(request),
                "title": title,
                "opts": self.opts,
                "app_label_name": self.opts.app_config.verbose_name,
                **context,
            },
        )

    def dashboard_view(self, request: HttpRequest) -> Any:
        workflow = request.GET.get("workflow", "").strip()[:200]
        context = dashboard_context(
            self.tenant_of(request), clock.now(), Links(self.admin_site.name), workflow
        )
        title = f"Dashboard: {workflow}" if workflow else "Workflows dashboard"
        return self._page(request, "admin/kumiko_workflows/dashboard.html", title, context)

    def workflow_view(self, request: HttpRequest, name: str) -> Any:
        version_text = request.GET.get("version", "")
        version = int(version_text) if version_text.isdigit() and len(version_text) < 7 else None
        context = workflow_context(
            self.tenant_of(request), clock.now(), Links(self.admin_site.name), name, version
        )
        return self._page(
            request, "admin/kumiko_workflows/workflow.html", f"Workflow {name}", context
        )
