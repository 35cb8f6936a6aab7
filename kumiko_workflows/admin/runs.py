"""The runs' admin: the list, the run page (its explanation, timeline and buttons).

The actions (wake now, cancel, rerun) are :mod:`kumiko_workflows.admin.actions`,
the cron schedules above the list :mod:`kumiko_workflows.admin.schedules`.
"""

from __future__ import annotations

import functools
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from kumiko_workflows.admin.actions import RunActions
from kumiko_workflows.admin.base import WorkflowAdmin, admin_tenant, many_tenants
from kumiko_workflows.admin.dashboard import PagesMixin
from kumiko_workflows.admin.display import breakable, clipped_text, list_time, short_id, zoned_title
from kumiko_workflows.admin.family import family
from kumiko_workflows.admin.lists import CheapListMixin, indexed
from kumiko_workflows.admin.pictures import EMPTY, Links, run_picture, status_badge, step_cell
from kumiko_workflows.admin.schedules import ScheduleControls
from kumiko_workflows.models import (
    SETTLED_STATUSES,
    Event,
    RunStatus,
    SuspensionType,
    WorkflowRun,
)
from kumiko_workflows.operations.dashboard import failure_reasons_present
from kumiko_workflows.operations.explain import Explanation, attempt_text, explain
from kumiko_workflows.operations.status import outbox_backlog, outbox_problems
from kumiko_workflows.operations.timeline import awaited_events, timeline
from kumiko_workflows.operations.version_table import failing_versions, stale_workers
from kumiko_workflows.operations.words import plural, step_label, when
from kumiko_workflows.workflow import clock

#: The leading columns of the runs' index by workflow and version (``kw_run_workflow_version``).
VERSION_INDEX = ("tenant_id", "workflow_name", "workflow_version")

#: Seconds an outbox's oldest append may wait before the run list says so
#: (``workflow_status --check``'s default ``--max-lag``).
OUTBOX_MAX_AGE = 60.0


class FailureReasonFilter(admin.SimpleListFilter):
    """The failure reasons the user's failed runs have (one index probe per known reason)."""

    title = "failure reason"
    parameter_name = "failure_reason"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        present = failure_reasons_present(model_admin.get_queryset(request))
        chosen = self.value()
        if chosen and chosen not in present:
            present.append(chosen)  # what the list is filtered by stays named
        return [(reason, reason) for reason in present]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(failure_reason=value) if value else queryset


@admin.register(WorkflowRun)
class WorkflowRunAdmin(CheapListMixin, PagesMixin, RunActions, ScheduleControls, WorkflowAdmin):
    list_display = (
        "run",
        "workflow",
        "workflow_version",
        "status_badge",
        "failure",
        "step_now",
        "search",
        "updated",
    )
    list_filter = (
        "status",
        FailureReasonFilter,
        "suspension_type",  # "queued for a concurrency slot", "waiting for its rate limit", ...
        # Their choices from kw_run_workflow_version, one probe per value.
        ("workflow_name", indexed("tenant_id", "workflow_name")),
        ("workflow_version", indexed(*VERSION_INDEX, nullable=True)),
        ("tenant_id", indexed("tenant_id")),
    )
    search_fields = ("search_key",)
    search_help_text = (
        "A run id (whole, or its first 8 characters), or a search key, exactly: the "
        "workflow's search_key, else the idempotency key."
    )
    ordering = ("-updated_at",)
    actions = ["wake_now", "cancel_runs", "rerun_failed"]
    change_form_template = "admin/kumiko_workflows/workflowrun/change_form.html"
    change_list_template = "admin/kumiko_workflows/workflowrun/change_list.html"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "run_id",
                    "workflow_name",
                    "workflow_version",
                    "tenant_id",
                    "trigger_event",
                    "idempotency_key",
                    "search_key",
                    "status",
                    "current_step",
                    "started",
                    "updated_text",
                    "finished",
                )
            },
        ),
        ("Suspension", {"fields": ("suspension_type", "wake_at_text", "awaited_event_type")}),
        ("Failure", {"fields": ("failure_reason", "error_class", "attempt")}),
        (
            "Stream",
            {"classes": ("collapse",), "fields": ("version", "definition_fingerprint")},
        ),
    )
    readonly_fields = (
        "current_step",
        "trigger_event",
        "started",
        "updated_text",
        "finished",
        "wake_at_text",
        "attempt",
    )

    def get_ordering(self, request: HttpRequest) -> Any:
        """Newest update first; a list filtered by when runs started or finished (the
        dashboard's links), newest start or finish first.

        Then the range's own index (``kw_run_started``, ``kw_run_finished``)
        gives the rows in order and the page stops at its last row; ordered
        by update, the planner may read the newest updates back to the
        range instead (it takes the two instants to be unrelated).
        """
        for column in ("finished_at", "started_at"):
            if any(key.startswith(f"{column}__") for key in request.GET):
                return (f"-{column}",)
        return super().get_ordering(request)

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = list(super().get_list_display(request))
        if many_tenants(request):
            # Under the workflow rather than a column of its own: room for the
            # failure reason and the search key at 1280 px.
            shown[shown.index("workflow")] = "workflow_and_tenant"
        return shown

    @admin.display(description="workflow (tenant)", ordering="workflow_name")
    def workflow_and_tenant(self, run: WorkflowRun) -> str:
        return format_html(
            '{}<div class="kw-tenant">{}</div>', breakable(run.workflow_name), run.tenant_id
        )

    def search_matches(self, term: str) -> Q | None:
        return Q(search_key=term)

    @admin.display(description="run", ordering="run_id")
    def run(self, run: WorkflowRun) -> str:
        return short_id(run.run_id)

    @admin.display(description="failure", ordering="failure_reason")
    def failure(self, run: WorkflowRun) -> str:
        return breakable(run.failure_reason) if run.failure_reason else EMPTY

    @admin.display(description="current step", ordering="step")
    def current_step(self, run: WorkflowRun) -> str:
        return breakable(step_label(run.workflow_name, run.step, run.workflow_version) or EMPTY)

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: WorkflowRun) -> str:
        return status_badge(run.status)

    @admin.display(description="current step", ordering="step")
    def step_now(self, run: WorkflowRun) -> str:
        """Where a run in flight is: its position, its step's symbol and title under it."""
        if run.status in SETTLED_STATUSES:
            return EMPTY  # a finished run is at no step (a failed one's is on its page)
        return step_cell(run.workflow_name, run.step, run.workflow_version)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The sections that apply to the run: no suspension unless waiting, no failure unless
        failed (or a retry waits after a failed attempt), no current step once finished."""
        if obj is None:
            return super().get_fieldsets(request, obj)
        settled = obj.status in SETTLED_STATUSES
        retrying = obj.status == RunStatus.WAITING and obj.retry_attempt
        shown = []
        for title, options in self.fieldsets or ():
            fields = tuple(options["fields"])
            if title is None:
                dropped = "current_step" if settled else "finished"
                fields = tuple(field for field in fields if field != dropped)
            if title == "Suspension" and obj.status != RunStatus.WAITING:
                continue
            if title == "Failure" and obj.status != RunStatus.FAILED and not retrying:
                continue
            shown.append((title, {**options, "fields": fields}))
        return shown

    def tenant_of(self, request: HttpRequest) -> str | None:
        return admin_tenant(request)

    def get_urls(self) -> Any:
        return [*self.page_urls(), *super().get_urls()]

    @admin.display(description="search key", ordering="search_key")
    def search(self, run: WorkflowRun) -> str:
        return clipped_text(run.search_key)

    @admin.display(description=zoned_title("updated"), ordering="updated_at")
    def updated(self, run: WorkflowRun) -> str:
        return list_time(run.updated_at)

    @admin.display(description="started")
    def started(self, run: WorkflowRun) -> str:
        return when(run.started_at)

    @admin.display(description="updated")
    def updated_text(self, run: WorkflowRun) -> str:
        return when(run.updated_at)

    @admin.display(description="finished")
    def finished(self, run: WorkflowRun) -> str:
        return when(run.finished_at)

    @admin.display(description="wakes at")
    def wake_at_text(self, run: WorkflowRun) -> str:
        return when(run.wake_at)

    @admin.display(description="retry attempt")
    def attempt(self, run: WorkflowRun) -> str:
        return attempt_text(run)

    @admin.display(description="trigger event")
    def trigger_event(self, run: WorkflowRun) -> str:
        if run.trigger_event_id is None:
            return EMPTY
        event = Event.objects.filter(tenant_id=run.tenant_id, id=run.trigger_event_id).first()
        if event is None:
            return format_html("#{} (gone)", run.trigger_event_id)
        return self._event_link(event.id, f" {event.type}, {when(event.created_at)}")

    # --- permissions of the actions -------------------------------------------

    def has_wake_permission(self, request: HttpRequest) -> bool:
        return self._holds_permission(request, "wake_workflowrun")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._holds_permission(request, "cancel_workflowrun")

    def has_rerun_permission(self, request: HttpRequest) -> bool:
        # The permission kept its first codename, so existing grants still apply.
        return self._holds_permission(request, "rerun_workflowrun")

    # --- the run list -----------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = dict(extra_context or {})
        context["kw_schedules"] = self._schedules(request)
        context["kw_schedule_url"] = reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_schedule"
        )
        context["kw_show_tenant"] = len({row["tenant_id"] for row in context["kw_schedules"]}) > 1
        context["kw_deploy_problems"] = self._deploy_problems(request)
        # Appends committed in a site's transaction that no relay took (the
        # health check's verdict on the outboxes, this staff user's tenant).
        backlogs = outbox_backlog(admin_tenant(request))
        context["kw_outbox_problems"] = outbox_problems(backlogs, OUTBOX_MAX_AGE)
        return super().changelist_view(request, context)

    def _deploy_problems(self, request: HttpRequest) -> list[str]:
        """Workers whose code is older than runs they left, and waiting runs this code would fail.

        Read with the code this admin runs: opened on a new deploy before its
        workers start, it says which waiting runs the edit would fail.
        """
        tenant = admin_tenant(request)
        lines = stale_workers(tenant, clock.now())
        for row in failing_versions(tenant):
            for group in row.failing:
                lines.append(
                    f"{plural(group['runs'], 'waiting run')} of workflow {row.workflow_name!r} "
                    f"version {row.version} at step {group['step']} would fail on this code: "
                    f"{group['why']}"
                )
        return lines

    # --- the run page ---------------------------------------------------------

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        run = self.get_object(request, unquote(object_id))
        context = dict(extra_context or {})
        if run is not None:
            # Django's form reads the run again (get_object): it gets this one,
            # so the heading, the explanation and the buttons tell one state.
            request._kw_run_snapshot = (unquote(object_id), run)  # type: ignore[attr-defined]
            entries = timeline(run)
            explanation = explain(run, clock.now())
            context["kw_explanation"] = explanation
            context["kw_timeline"] = [
                {
                    "entry": entry,
                    "url": self._url(Event, entry.event_id),
                    "refs": [
                        (what, self._url(Event, event_id), event_id)
                        for what, event_id in entry.refs
                    ],
                }
                for entry in entries
            ]
            context["kw_related"] = self._related(run, awaited_events(entries))
            context["kw_buttons"] = self._buttons(request, run, explanation)
            context["kw_changelist_url"] = self._changelist_url(WorkflowRun)
            stream = Event.objects.filter(tenant_id=run.tenant_id, aggregate_id=run.run_id)
            events = list(stream.order_by("version"))
            context.update(run_picture(run, events, clock.now(), Links(self.admin_site.name)))
        return super().change_view(request, object_id, form_url, context)

    def _related(self, run: WorkflowRun, awaited: list[tuple[str, int]]) -> list[tuple[str, str]]:
        """(label, link) of the events the run refers to: its trigger, those it awaited."""
        related = [("Trigger event", self.trigger_event(run))]
        found = Event.objects.filter(tenant_id=run.tenant_id).in_bulk(
            [event_id for _, event_id in awaited]
        )
        for what, event_id in awaited:
            event = found.get(event_id)
            text = f" {event.type}, {when(event.created_at)}" if event else " (gone)"
            related.append((what.capitalize(), self._event_link(event_id, text)))
        page = functools.partial(self._url, WorkflowRun)
        return related + family(run, page, self._changelist_url(WorkflowRun))

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        snapshot = getattr(request, "_kw_run_snapshot", None)
        if snapshot is not None and from_field is None and snapshot[0] == object_id:
            return snapshot[1]
        return super().get_object(request, object_id, from_field)

    def _buttons(
        self, request: HttpRequest, run: WorkflowRun, explanation: Explanation
    ) -> list[tuple[str, str, str]]:
        """The actions the explanation leaves open, each with its note (none on a stale read)."""
        if explanation.moved:
            return []
        allowed = self.get_actions(request)
        buttons = []
        waking = run.status == RunStatus.WAITING and not explanation.due
        if "wake_now" in allowed and waking:
            note = (
                "Resumes as if the wait had timed out."
                if run.suspension_type == SuspensionType.EVENT
                else "Resumes on the next worker pass."
            )
            buttons.append(("wake_now", "Wake now", note))
        if "rerun_failed" in allowed and explanation.rerunnable:
            buttons.append(
                (
                    "rerun_failed",
                    "Rerun",
                    "Runs again from where the failed attempt began, or resumes the wait it "
                    "failed at with its deadline.",
                )
            )
        if "cancel_runs" in allowed and run.status not in SETTLED_STATUSES:
            buttons.append(("cancel_runs", "Cancel…", "Asks for a reason first."))
        return buttons
