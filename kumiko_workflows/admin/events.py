"""The event log's admin: read-only, with the runs each event started or woke."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from kumiko_workflows.admin.base import WorkflowAdmin
from kumiko_workflows.admin.display import list_time, pre_json, short_id, zoned_title
from kumiko_workflows.admin.lists import CheapListMixin, indexed
from kumiko_workflows.admin.pictures import payload_preview
from kumiko_workflows.models import (
    Event,
    WorkflowRun,
)
from kumiko_workflows.workflow import event_types as et

#: Runs an event page links to, per kind (started, woken); the rest are counted.
RUN_LINK_LIMIT = 20
#: Wake-ups after an event that its page looks through for the runs it woke.
WAKE_WINDOW = 10_000

_ENGINE_AGGREGATE_TYPES = (
    et.RUN_AGGREGATE_TYPE,
    et.SCHEDULE_AGGREGATE_TYPE,
    et.GATE_AGGREGATE_TYPE,
)


class EventKindFilter(admin.SimpleListFilter):
    """Domain events (the site's) apart from the engine's (runs' and schedules' streams)."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("domain", "domain events"), ("engine", "engine events (runs, schedules)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "domain":
            return queryset.exclude(aggregate_type__in=_ENGINE_AGGREGATE_TYPES)
        if self.value() == "engine":
            return queryset.filter(aggregate_type__in=_ENGINE_AGGREGATE_TYPES)
        return queryset


@admin.register(Event)
class EventAdmin(CheapListMixin, WorkflowAdmin):
    list_display = (
        "id",
        "created",
        "type",
        "aggregate_type",
        "aggregate",
        "version",
        "preview",
        "tenant_id",
    )
    # The choices from an index, one probe per tenant and value: the types from
    # kw_event_tenant_type_id, the aggregate types from the streams' first
    # events (kw_event_tenant_head_type: a stream keeps its aggregate type).
    list_filter = (
        EventKindFilter,
        ("type", indexed("tenant_id", "type")),
        ("aggregate_type", indexed("tenant_id", "aggregate_type", where={"version": 1})),
        ("tenant_id", indexed("tenant_id")),
    )
    search_fields = ("aggregate_id",)
    search_help_text = "An aggregate id (whole, or its first 8 characters), or an event id."
    ordering = ("-id",)
    list_per_page = 100
    fields = (
        "id",
        "created",
        "tenant_id",
        "type",
        "event_version",
        "aggregate_type",
        "aggregate_id",
        "version",
        "workflow_runs",
        "created_by",
        "payload_json",
        "metadata_json",
    )
    readonly_fields = ("created", "workflow_runs", "payload_json", "metadata_json")

    id_field = "aggregate_id"

    def search_matches(self, term: str) -> Q | None:
        number = term.removeprefix("#")
        return Q(id=int(number)) if number.isdigit() and len(number) <= 18 else None

    @admin.display(description=zoned_title("created"), ordering="id")
    def created(self, event: Event) -> str:
        return list_time(event.created_at)

    @admin.display(description="payload")
    def preview(self, event: Event) -> str:
        return payload_preview(event)

    @admin.display(description="aggregate id", ordering="aggregate_id")
    def aggregate(self, event: Event) -> str:
        if event.aggregate_type == et.RUN_AGGREGATE_TYPE:
            return self._run_link(event.aggregate_id)
        return short_id(event.aggregate_id)

    @admin.display(description="payload")
    def payload_json(self, event: Event) -> str:
        return pre_json(event.payload)

    @admin.display(description="metadata")
    def metadata_json(self, event: Event) -> str:
        return pre_json(event.metadata)

    @admin.display(description="workflow runs")
    def workflow_runs(self, event: Event) -> str:
        """The run whose stream this is, the runs it started, the runs it woke."""
        lines: list[tuple[str, str]] = []
        if event.aggregate_type == et.RUN_AGGREGATE_TYPE:
            lines.append(("its stream's run", self._run_link(event.aggregate_id)))
        started = WorkflowRun.objects.filter(tenant_id=event.tenant_id, trigger_event_id=event.id)
        lines.extend(self._run_lines("started", started.order_by("started_at")))
        if event.aggregate_type not in _ENGINE_AGGREGATE_TYPES:
            lines.extend(self._woken_lines(event))
        if not lines:
            return "none: it started no run and woke none"
        return format_html_join(
            "", '<div class="kw-run-ref">{}: {}</div>', ((label, link) for label, link in lines)
        )

    def _run_lines(self, label: str, runs: QuerySet[Any]) -> list[tuple[str, str]]:
        found = list(runs[: RUN_LINK_LIMIT + 1])
        lines: list[tuple[str, str]] = [
            (
                label,
                format_html(
                    "{} {} ({})", self._run_link(run.run_id), run.workflow_name, run.status
                ),
            )
            for run in found[:RUN_LINK_LIMIT]
        ]
        if len(found) > RUN_LINK_LIMIT:
            lines.append((label, f"and {runs.count() - RUN_LINK_LIMIT} more"))
        return lines

    def _woken_lines(self, event: Event) -> list[tuple[str, str]]:
        # A wake-up names its awaited event in its payload and comes after it;
        # engine streams have no payload index, so look through a window.
        wakes = Event.objects.filter(
            tenant_id=event.tenant_id, type=et.WAKE_REQUESTED, id__gt=event.id
        )
        window = wakes.order_by("id").values("id")[:WAKE_WINDOW]
        woken = Event.objects.filter(id__in=window, payload__awaited_event_id=event.id)
        run_ids = list(dict.fromkeys(woken.order_by("id").values_list("aggregate_id", flat=True)))
        runs = WorkflowRun.objects.filter(tenant_id=event.tenant_id, run_id__in=run_ids)
        lines = self._run_lines("woke", runs.order_by("started_at"))
        beyond = wakes.order_by("id").values_list("id", flat=True)[WAKE_WINDOW : WAKE_WINDOW + 1]
        if list(beyond):
            lines.append(("woke", f"(only the {WAKE_WINDOW:,} wake-ups after it were looked at)"))
        return lines
