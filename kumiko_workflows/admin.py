"""Django admin for the event store, the workflow runs and the pending rows.

Everything is read-only: events are an append-only log and the two other
tables are projections of it. What changes a run are the actions (wake now,
cancel, rerun), each appending an event through the public API, each with its
own permission. ``KUMIKO_WORKFLOWS["ADMIN_TENANT"]`` (``request -> tenant id
or None``) limits a staff user to one tenant's rows; superusers see all.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote, unquote
from django.db.models import F, Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from kumiko_workflows import event_types as et
from kumiko_workflows.conf import import_callable, workflow_settings
from kumiko_workflows.engine.cron import schedule_overview
from kumiko_workflows.engine.resume import cancel_run, rerun_run, wake_run
from kumiko_workflows.exceptions import RunNotFound, RunNotRerunnable
from kumiko_workflows.models import (
    SETTLED_STATUSES,
    Event,
    RunStatus,
    SuspensionType,
    WorkflowRun,
    WorkflowRunPending,
)
from kumiko_workflows.operations.explain import (
    describe_match,
    explain,
    humanize,
    pretty_json,
    step_label,
    timeline,
)
from kumiko_workflows.workflow import clock

#: Runs listed by name on the cancel confirmation page; the rest are counted.
CANCEL_LIST_LIMIT = 100


def admin_tenant(request: HttpRequest) -> str | None:
    """The tenant this request's user is limited to, or None for all tenants."""
    if getattr(request.user, "is_superuser", False):
        return None
    if not hasattr(request, "_kumiko_admin_tenant"):
        scope = import_callable(workflow_settings.ADMIN_TENANT, "ADMIN_TENANT")
        tenant = scope(request) if scope is not None else None
        request._kumiko_admin_tenant = None if tenant is None else str(tenant)  # type: ignore[attr-defined]
    return request._kumiko_admin_tenant  # type: ignore[attr-defined]


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def _actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


def _pre(value: Any) -> str:
    return format_html("<pre>{}</pre>", pretty_json(value))


class WorkflowAdmin(admin.ModelAdmin):
    """Read-only and tenant-scoped: the base of the three admins below."""

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        tenant = admin_tenant(request)
        return queryset if tenant is None else queryset.filter(tenant_id=tenant)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _url(self, model: type[Model], pk: Any) -> str:
        opts = model._meta
        return reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",
            args=[quote(pk)],
        )

    def _run_link(self, run_id: Any) -> str:
        return format_html('<a href="{}">{}</a>', self._url(WorkflowRun, run_id), run_id)


@admin.register(Event)
class EventAdmin(WorkflowAdmin):
    list_display = (
        "id",
        "created_at",
        "type",
        "aggregate_type",
        "aggregate_id",
        "version",
        "tenant_id",
    )
    list_filter = ("type", "aggregate_type", "tenant_id")
    search_fields = ("aggregate_id",)
    ordering = ("-id",)
    list_per_page = 100
    # Counting a large log on every page costs more than it tells.
    show_full_result_count = False
    fields = (
        "id",
        "created_at",
        "tenant_id",
        "type",
        "event_version",
        "aggregate_type",
        "aggregate_id",
        "version",
        "workflow_run",
        "created_by",
        "payload_json",
        "metadata_json",
    )
    readonly_fields = ("workflow_run", "payload_json", "metadata_json")

    @admin.display(description="payload")
    def payload_json(self, event: Event) -> str:
        return _pre(event.payload)

    @admin.display(description="metadata")
    def metadata_json(self, event: Event) -> str:
        return _pre(event.metadata)

    @admin.display(description="workflow run")
    def workflow_run(self, event: Event) -> str:
        if event.aggregate_type != et.RUN_AGGREGATE_TYPE:
            return "—"
        return self._run_link(event.aggregate_id)


@admin.register(WorkflowRun)
class WorkflowRunAdmin(WorkflowAdmin):
    list_display = (
        "run_id",
        "workflow_name",
        "tenant_id",
        "status",
        "current_step",
        "wake_at",
        "updated_at",
    )
    list_filter = ("status", "workflow_name", "tenant_id")
    search_fields = ("run_id", "idempotency_key")
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
                    "tenant_id",
                    "idempotency_key",
                    "status",
                    "current_step",
                    "started_at",
                    "updated_at",
                    "finished_at",
                )
            },
        ),
        ("Suspension", {"fields": ("suspension_type", "wake_at", "awaited_event_type")}),
        ("Failure", {"fields": ("failure_reason", "error_class", "retry_attempt")}),
        (
            "Stream",
            {
                "classes": ("collapse",),
                "fields": ("trigger_event", "version", "definition_fingerprint"),
            },
        ),
    )
    readonly_fields = ("current_step", "trigger_event")

    @admin.display(description="current step", ordering="step")
    def current_step(self, run: WorkflowRun) -> str:
        return step_label(run.workflow_name, run.step) or "—"

    @admin.display(description="trigger event")
    def trigger_event(self, run: WorkflowRun) -> str:
        if run.trigger_event_id is None:
            return "—"
        return format_html(
            '<a href="{}">#{}</a>', self._url(Event, run.trigger_event_id), run.trigger_event_id
        )

    # --- permissions of the actions -------------------------------------------

    def _has(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def has_wake_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "wake_workflowrun")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "cancel_workflowrun")

    def has_rerun_permission(self, request: HttpRequest) -> bool:
        # The permission kept its first codename, so existing grants still apply.
        return self._has(request, "rerun_workflowrun")

    # --- the run list -----------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:

        tenant = admin_tenant(request)
        context = dict(extra_context or {})
        context["kw_schedules"] = [
            {
                **row,
                "last_run_url": self._url(WorkflowRun, row["last_run_id"])
                if row["last_run_id"]
                else None,
            }
            for row in schedule_overview()
            if tenant is None or row["tenant_id"] == tenant
        ]
        return super().changelist_view(request, context)

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
            context["kw_explanation"] = explain(run, clock.now())
            context["kw_timeline"] = [
                {"entry": entry, "url": self._url(Event, entry.event_id)} for entry in timeline(run)
            ]
            context["kw_buttons"] = self._buttons(request, run)
            context["kw_changelist_url"] = reverse(
                f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_changelist"
            )
        return super().change_view(request, object_id, form_url, context)

    def _buttons(self, request: HttpRequest, run: WorkflowRun) -> list[tuple[str, str, str]]:
        allowed = self.get_actions(request)
        buttons = []
        if "wake_now" in allowed and run.status == RunStatus.WAITING:
            note = (
                "Resumes as if the wait had timed out."
                if run.suspension_type == SuspensionType.EVENT
                else "Resumes on the next worker pass."
            )
            buttons.append(("wake_now", "Wake now", note))
        if "rerun_failed" in allowed and run.status == RunStatus.FAILED:
            buttons.append(
                ("rerun_failed", "Rerun", "Runs again from where the failed attempt began.")
            )
        if "cancel_runs" in allowed and run.status not in SETTLED_STATUSES:
            buttons.append(("cancel_runs", "Cancel…", "Asks for a reason first."))
        return buttons

    # --- actions --------------------------------------------------------------

    def _done(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        done: int,
        done_text: str,
        skipped: int,
        skipped_text: str,
    ) -> HttpResponse | None:
        if done:
            self.message_user(request, done_text.format(runs=_runs(done)), messages.SUCCESS)
        if skipped:
            self.message_user(
                request, f"Skipped {_runs(skipped)}: {skipped_text}.", messages.WARNING
            )
        if not done and not skipped:
            self.message_user(request, "No runs were changed.", messages.WARNING)
        return self._back(request, queryset)

    def _back(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """From a button on a run's page, go back to that page."""
        if request.POST.get("_kw_return"):
            pks = list(queryset.values_list("pk", flat=True)[:2])
            if len(pks) == 1:
                return HttpResponseRedirect(self._url(WorkflowRun, pks[0]))
        return None

    @admin.action(permissions=["wake"], description="Wake now (resume on the next worker pass)")
    def wake_now(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        woken = skipped = 0
        for run in queryset:
            try:
                ok = run.status == RunStatus.WAITING and wake_run(run.run_id, by=_actor(request))
            except RunNotFound:
                ok = False
            woken += ok
            skipped += not ok
        return self._done(
            request,
            queryset,
            woken,
            "Woke {runs}: the next worker pass resumes them.",
            skipped,
            "not waiting",
        )

    @admin.action(permissions=["cancel"], description="Cancel (asks for a reason)")
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        reason = request.POST.get("reason", "").strip()
        if request.POST.get("kw_confirm") and reason:
            cancelled = skipped = 0
            for run in queryset:
                try:
                    ok = run.status not in SETTLED_STATUSES and cancel_run(
                        run.run_id, reason, by=_actor(request)
                    )
                except RunNotFound:
                    ok = False
                cancelled += ok
                skipped += not ok
            return self._done(
                request,
                queryset,
                cancelled,
                "Cancelled {runs}.",
                skipped,
                "already finished",
            )
        runs = list(queryset.order_by("-updated_at"))
        eligible = [run for run in runs if run.status not in SETTLED_STATUSES]
        context = {
            **self.admin_site.each_context(request),
            "title": "Cancel workflow runs",
            "opts": self.opts,
            "runs": runs,
            "eligible_shown": eligible[:CANCEL_LIST_LIMIT],
            "eligible_count": len(eligible),
            "eligible_hidden": max(0, len(eligible) - CANCEL_LIST_LIMIT),
            "finished_count": len(runs) - len(eligible),
            "action": "cancel_runs",
            "checkbox_name": ACTION_CHECKBOX_NAME,
            "kw_return": bool(request.POST.get("_kw_return")),
            "error": "Give a reason." if request.POST.get("kw_confirm") else "",
            "reason": reason,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/kumiko_workflows/workflowrun/cancel_confirmation.html", context
        )

    @admin.action(
        permissions=["rerun"], description="Rerun failed runs from where the failed attempt began"
    )
    def rerun_failed(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        requested = skipped = 0
        refused: list[str] = []
        for run in queryset:
            if run.status != RunStatus.FAILED:
                skipped += 1
                continue
            try:
                if rerun_run(run.run_id, by=_actor(request)):
                    requested += 1
                else:
                    skipped += 1
            except (RunNotRerunnable, RunNotFound) as exc:
                refused.append(str(exc))
        if refused:
            self.message_user(
                request,
                f"Refused {_runs(len(refused))}: {refused[0]}"
                + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""),
                messages.ERROR,
            )
            if not requested and not skipped:
                return self._back(request, queryset)
        return self._done(
            request,
            queryset,
            requested,
            "Rerun requested for {runs}: the next worker pass runs each from where its failed "
            "attempt began.",
            skipped,
            "not failed",
        )


@admin.register(WorkflowRunPending)
class WorkflowRunPendingAdmin(WorkflowAdmin):
    list_display = (
        "run",
        "workflow_name",
        "tenant_id",
        "step",
        "suspension_type",
        "wake_at",
        "due",
        "lateness",
        "awaiting",
    )
    list_filter = ("suspension_type", "workflow_name", "tenant_id")
    search_fields = ("run_id",)
    ordering = (F("wake_at").asc(nulls_last=True), "id")
    fields = (
        "run",
        "workflow_name",
        "tenant_id",
        "step",
        "suspension_type",
        "wake_at",
        "due",
        "lateness",
        "timeout_at",
        "retry_attempt",
        "resume_errors",
        "awaiting",
        "awaited_event_id",
        "due_since",
        "suspended_at",
        "run_version",
        "trigger_event_id",
        "definition_fingerprint",
        "state_json",
    )
    readonly_fields = ("run", "due", "lateness", "awaiting", "state_json")

    @admin.display(description="run", ordering="run_id")
    def run(self, row: WorkflowRunPending) -> str:
        return self._run_link(row.run_id)

    @admin.display(description="due", boolean=True)
    def due(self, row: WorkflowRunPending) -> bool:
        return row.wake_at is not None and row.wake_at <= clock.now()

    @admin.display(description="late by")
    def lateness(self, row: WorkflowRunPending) -> str:
        if row.wake_at is None:
            return "— (no deadline)"
        delta = clock.now() - row.wake_at
        if delta.total_seconds() >= 0:
            return humanize(delta)
        return f"due in {humanize(-delta)}"

    @admin.display(description="awaiting")
    def awaiting(self, row: WorkflowRunPending) -> str:
        if row.suspension_type != SuspensionType.EVENT:
            return "—"
        return f"{row.wait_event_type} where {describe_match(row.match_expr)}"

    @admin.display(description="state")
    def state_json(self, row: WorkflowRunPending) -> str:
        return _pre(row.state)
