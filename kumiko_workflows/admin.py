"""Django admin for the event store, the workflow runs, the pending rows and the cron schedules.

Everything is read-only: events are an append-only log and the two other
tables are projections of it. What changes a run are the actions (wake now,
cancel, rerun), and what changes a cron schedule are its buttons (pause,
resume, fire now), each appending an event through the public API, each
with its own permission. ``KUMIKO_WORKFLOWS["ADMIN_TENANT"]`` (``request ->
tenant id or None``) limits a staff user to one tenant's rows; superusers
see all.

The lists fit a 1280 px screen: ids show their first 8 characters (the
whole id is the text, so hovering and copying give it), times drop the
zone (the column title names it), and a tenant-scoped user sees no tenant
column.
"""

from __future__ import annotations

import functools
import operator
import uuid
import zoneinfo
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import F, Model, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import lazy
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import mark_safe

from kumiko_workflows import event_types as et
from kumiko_workflows.conf import import_callable, workflow_settings
from kumiko_workflows.engine.cron import (
    fire_schedule_now,
    pause_schedule,
    resume_schedule,
    schedule_overview,
)
from kumiko_workflows.engine.resume import cancel_run, rerun_run, wake_run
from kumiko_workflows.engine.segment import start_in_worker
from kumiko_workflows.exceptions import (
    InvalidArgument,
    RunNotFound,
    RunNotRerunnable,
    ScheduleError,
)
from kumiko_workflows.models import (
    SETTLED_STATUSES,
    Event,
    RunStatus,
    SuspensionType,
    WorkflowChildGroup,
    WorkflowRun,
    WorkflowRunPending,
)
from kumiko_workflows.operations.explain import (
    Explanation,
    attempt_text,
    awaited_events,
    describe_match,
    explain,
    humanize,
    plural,
    pretty_json,
    step_label,
    timeline,
    when,
)
from kumiko_workflows.operations.versions import stale_workers, version_table
from kumiko_workflows.store import db
from kumiko_workflows.store.streams import FAILURE_REASONS
from kumiko_workflows.workflow import clock
from kumiko_workflows.workflow.definition import run_id_for


def _own_transaction() -> transaction.Atomic:
    """A transaction on the engine's database for one of the admin's operations (wake, cancel...).

    Each acts at once, committed on its own: a request's transaction on
    another database (``ATOMIC_REQUESTS`` on the site's, the engine's tables
    on a database of their own) is not the operation's to join, and the
    operation would refuse to run inside it alone (``CrossDatabaseTransaction``).
    """
    return db.atomic()


#: Runs listed by name on the cancel confirmation page; the rest are counted.
CANCEL_LIST_LIMIT = 100
#: Runs an event page links to, per kind (started, woken); the rest are counted.
RUN_LINK_LIMIT = 20
#: Wake-ups after an event that its page looks through for the runs it woke.
WAKE_WINDOW = 10_000

_ENGINE_AGGREGATE_TYPES = (et.RUN_AGGREGATE_TYPE, et.SCHEDULE_AGGREGATE_TYPE)


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
    return plural(count, "run")


def _actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


def _pre(value: Any) -> str:
    return format_html("<pre>{}</pre>", pretty_json(value))


def _short_id(value: Any, url: str | None = None) -> str:
    """An id cut to its first 8 characters on screen; the text (hover, copy) is whole."""
    text = str(value)
    if url is None:
        return format_html('<span class="kw-id" title="{}">{}</span>', text, text)
    return format_html('<a class="kw-id" href="{}" title="{}">{}</a>', url, text, text)


def _clipped(text: str) -> str:
    """Long text in a list cell, cut on screen; the whole of it on hover and copy."""
    if not text:
        return "—"
    return format_html('<span class="kw-clip" title="{}">{}</span>', text, text)


def _breakable(text: str) -> str:
    """Text that may wrap after an underscore or a dot (reasons, step labels, event types)."""
    return mark_safe(escape(text).replace("_", "_<wbr>").replace(".", ".<wbr>"))


def _time(value: datetime | None) -> str:
    """An instant in a list, in the current time zone; the column title names the zone.

    The date and the time may wrap onto two lines, which keeps the column narrow.
    """
    if value is None:
        return "—"
    local = timezone.localtime(value)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        value.isoformat(),
        when(value),
        f"{local:%Y-%m-%d %H:%M:%S}",
    )


def _zone_title(label: str) -> str:
    return f"{label} ({timezone.get_current_timezone_name()})"


#: A column title naming the zone its times are in, as of the request rendering it.
_zoned: Callable[[str], str] = lazy(_zone_title, str)


def _id_range(term: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The ids a search term names: a whole UUID, or its first 8 to 31 hex digits."""
    digits = term.replace("-", "").lower()
    if not 8 <= len(digits) <= 32 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def _id_match(field: str, term: str) -> Q | None:
    """A filter on the UUID column ``field`` for a search term, or None if it is no id.

    A range on the column, not a text match: the index serves it on every
    database, a shortened id copied from a list included.
    """
    found = _id_range(term)
    if found is None:
        return None
    low, high = found
    if low == high:
        return Q(**{field: low})
    return Q(**{f"{field}__gte": low, f"{field}__lte": high})


def _many_tenants(request: HttpRequest) -> bool:
    """Whether the lists need a tenant column: the user is not scoped, and runs of two exist."""
    if admin_tenant(request) is not None:
        return False
    if not hasattr(request, "_kumiko_many_tenants"):
        tenants = WorkflowRun.objects.order_by("tenant_id").values_list("tenant_id", flat=True)
        request._kumiko_many_tenants = len(tenants.distinct()[:2]) > 1  # type: ignore[attr-defined]
    return request._kumiko_many_tenants  # type: ignore[attr-defined]


class WorkflowAdmin(admin.ModelAdmin):
    """Read-only and tenant-scoped: the base of the three admins below."""

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        tenant = admin_tenant(request)
        return queryset if tenant is None else queryset.filter(tenant_id=tenant)

    #: The UUID column the search box finds ids in (whole, or their first 8+ hex digits).
    id_field = "run_id"

    def search_matches(self, term: str) -> Q | None:
        """What else a search term finds, besides ids (None: nothing)."""
        return None

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """Ids and :meth:`search_matches`, exactly: index look-ups, never a text scan."""
        term = search_term.strip()
        if not term:
            return queryset, False
        found = [q for q in (_id_match(self.id_field, term), self.search_matches(term)) if q]
        if not found:
            return queryset.none(), False
        return queryset.filter(functools.reduce(operator.or_, found)), False

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = super().get_list_display(request)
        if not _many_tenants(request):  # a column that would say the same on every row
            shown = [name for name in shown if name != "tenant_id"]
        return shown

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="workflow", ordering="workflow_name")
    def workflow(self, obj: Any) -> str:
        return _breakable(obj.workflow_name)

    def _url(self, model: type[Model], pk: Any) -> str:
        opts = model._meta
        return reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",
            args=[quote(pk)],
        )

    def _changelist_url(self, model: type[Model]) -> str:
        opts = model._meta
        return reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist")

    def _run_link(self, run_id: Any) -> str:
        return _short_id(run_id, self._url(WorkflowRun, run_id))

    def _event_link(self, event_id: int | None, text: str = "") -> str:
        if event_id is None:
            return "—"
        return format_html('<a href="{}">#{}{}</a>', self._url(Event, event_id), event_id, text)


@admin.register(Event)
class EventAdmin(WorkflowAdmin):
    list_display = (
        "id",
        "created",
        "type",
        "aggregate_type",
        "aggregate",
        "version",
        "tenant_id",
    )
    list_filter = ("type", "aggregate_type", "tenant_id")
    search_fields = ("aggregate_id",)
    search_help_text = "An aggregate id (whole, or its first 8 characters), or an event id."
    ordering = ("-id",)
    list_per_page = 100
    # Counting a large log on every page costs more than it tells.
    show_full_result_count = False
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

    @admin.display(description=_zoned("created"), ordering="id")
    def created(self, event: Event) -> str:
        return _time(event.created_at)

    @admin.display(description="aggregate id", ordering="aggregate_id")
    def aggregate(self, event: Event) -> str:
        if event.aggregate_type == et.RUN_AGGREGATE_TYPE:
            return self._run_link(event.aggregate_id)
        return _short_id(event.aggregate_id)

    @admin.display(description="payload")
    def payload_json(self, event: Event) -> str:
        return _pre(event.payload)

    @admin.display(description="metadata")
    def metadata_json(self, event: Event) -> str:
        return _pre(event.metadata)

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

    def _run_lines(self, label: str, runs: QuerySet) -> list[tuple[str, str]]:
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


class FailureReasonFilter(admin.SimpleListFilter):
    """The reasons a run can fail with (not a scan of the runs for the ones that occur)."""

    title = "failure reason"
    parameter_name = "failure_reason"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(reason, reason) for reason in FAILURE_REASONS]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(failure_reason=value) if value else queryset


def _run_link(url: str, run_id: Any) -> str:
    return format_html('<a class="kw-id" href="{}" title="{}">{}</a>', url, run_id, run_id)


def progress_text(group: WorkflowChildGroup) -> str:
    """A fan-out's progress for people: "7 of 12 children finished, 1 failed"."""
    text = f"{group.finished} of {group.total} children finished, {group.failed} failed"
    if group.closed:
        text += " (cancelled: no further child starts)"
    elif group.stopped and group.started < group.total:
        text += f" (stopped by a failure: {group.total - group.started} not started)"
    return text


@admin.register(WorkflowRun)
class WorkflowRunAdmin(WorkflowAdmin):
    list_display = (
        "run",
        "workflow",
        "workflow_version",
        "status",
        "failure",
        "current_step",
        "search",
        "updated",
    )
    list_filter = ("status", FailureReasonFilter, "workflow_name", "workflow_version", "tenant_id")
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

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = list(super().get_list_display(request))
        if _many_tenants(request):
            # Under the workflow rather than a column of its own: room for the
            # failure reason and the search key at 1280 px.
            shown[shown.index("workflow")] = "workflow_and_tenant"
        return shown

    @admin.display(description="workflow (tenant)", ordering="workflow_name")
    def workflow_and_tenant(self, run: WorkflowRun) -> str:
        return format_html(
            '{}<div class="kw-tenant">{}</div>', _breakable(run.workflow_name), run.tenant_id
        )

    def search_matches(self, term: str) -> Q | None:
        return Q(search_key=term)

    @admin.display(description="run", ordering="run_id")
    def run(self, run: WorkflowRun) -> str:
        return _short_id(run.run_id)

    @admin.display(description="failure", ordering="failure_reason")
    def failure(self, run: WorkflowRun) -> str:
        return _breakable(run.failure_reason) if run.failure_reason else "—"

    @admin.display(description="current step", ordering="step")
    def current_step(self, run: WorkflowRun) -> str:
        return _breakable(step_label(run.workflow_name, run.step, run.workflow_version) or "—")

    @admin.display(description="search key", ordering="search_key")
    def search(self, run: WorkflowRun) -> str:
        return _clipped(run.search_key)

    @admin.display(description=_zoned("updated"), ordering="updated_at")
    def updated(self, run: WorkflowRun) -> str:
        return _time(run.updated_at)

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
            return "—"
        event = Event.objects.filter(tenant_id=run.tenant_id, id=run.trigger_event_id).first()
        if event is None:
            return format_html("#{} (gone)", run.trigger_event_id)
        return self._event_link(event.id, f" {event.type}, {when(event.created_at)}")

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
        context = dict(extra_context or {})
        context["kw_schedules"] = self._schedules(request)
        context["kw_schedule_url"] = reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_schedule"
        )
        context["kw_show_tenant"] = len({row["tenant_id"] for row in context["kw_schedules"]}) > 1
        context["kw_deploy_problems"] = self._deploy_problems(request)
        return super().changelist_view(request, context)

    def _deploy_problems(self, request: HttpRequest) -> list[str]:
        """Workers whose code is older than runs they left, and waiting runs this code would fail.

        Read with the code this admin runs: opened on a new deploy before its
        workers start, it says which waiting runs the edit would fail.
        """
        tenant = admin_tenant(request)
        lines = stale_workers(tenant, clock.now())
        for row in version_table(tenant):
            for group in row.failing:
                lines.append(
                    f"{plural(group['runs'], 'waiting run')} of workflow {row.workflow_name!r} "
                    f"version {row.version} at step {group['step']} would fail on this code: "
                    f"{group['why']}"
                )
        return lines

    def _schedules(self, request: HttpRequest) -> list[dict[str, Any]]:
        tenant = admin_tenant(request)
        can_pause = self._has(request, "pause_schedule")
        can_fire = self._has(request, "fire_schedule")
        rows = []
        for row in schedule_overview():
            if tenant is not None and row["tenant_id"] != tenant:
                continue
            zone = row["timezone"]
            in_zone = _zone_of(zone)
            rows.append(
                {
                    **row,
                    "last_run_url": self._url(WorkflowRun, row["last_run_id"])
                    if row["last_run_id"]
                    else None,
                    "last_slot_text": when(row["last_slot"], in_zone),
                    "next_slot_text": when(row["next_slot"], in_zone),
                    "paused_at_text": when(row["paused_at"], in_zone),
                    "can_pause": can_pause,
                    "can_fire": can_fire,
                    # One press of this button fires once, however often it is posted.
                    "fire_key": uuid.uuid4().hex,
                }
            )
        return rows

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.schedule_view)
        view.model_admin = self  # type: ignore[attr-defined]  # as ModelAdmin's own views
        name = f"{self.opts.app_label}_{self.opts.model_name}_schedule"
        return [path("schedules/", view, name=name), *super().get_urls()]

    def schedule_view(self, request: HttpRequest) -> HttpResponse:
        """Pause, resume or fire a cron schedule now (the buttons above the run list)."""
        back = HttpResponseRedirect(self._changelist_url(WorkflowRun) + "#kw-cron-schedules")
        if request.method != "POST":
            return back
        if not self.has_view_permission(request):
            raise PermissionDenied
        op = request.POST.get("op", "")
        needed = {"pause": "pause_schedule", "resume": "pause_schedule", "fire": "fire_schedule"}
        if op not in needed or not self._has(request, needed[op]):
            raise PermissionDenied
        name = request.POST.get("workflow", "")
        tenant = request.POST.get("tenant", "")
        scope = admin_tenant(request)
        if scope is not None and tenant != scope:
            # Another tenant's schedule does not exist for this user.
            self.message_user(request, "No such cron schedule.", messages.ERROR)
            return back
        by = _actor(request)
        where = f"{name} (tenant {tenant})"
        try:
            if op == "pause":
                with _own_transaction():
                    paused = pause_schedule(name, tenant, by=by)
                if paused:
                    self.message_user(
                        request,
                        f"Paused {where}: no slot fires until it is resumed, and the slots "
                        "it misses meanwhile never do.",
                        messages.SUCCESS,
                    )
                else:
                    self.message_user(request, f"{where} was paused already.", messages.WARNING)
            elif op == "resume":
                with _own_transaction():
                    resumed = resume_schedule(name, tenant, by=by)
                if resumed:
                    self.message_user(
                        request,
                        f"Resumed {where}: its slots from now on fire.",
                        messages.SUCCESS,
                    )
                else:
                    self.message_user(request, f"{where} was not paused.", messages.WARNING)
            else:
                self._fire(request, name, tenant, where, by)
        except InvalidArgument:
            self.message_user(request, "No such cron schedule.", messages.ERROR)
        except ScheduleError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        return back

    def _fire(self, request: HttpRequest, name: str, tenant: str, where: str, by: str) -> None:
        key = request.POST.get("key") or uuid.uuid4().hex
        # The admin request only queues the run; a worker runs its steps.
        with start_in_worker(), _own_transaction():
            run_id = fire_schedule_now(name, tenant, key=key, by=by)
        if run_id is not None:
            self.message_user(
                request,
                format_html(
                    'Fired {} now: run <a href="{}">{}</a>.',
                    where,
                    self._url(WorkflowRun, run_id),
                    run_id,
                ),
                messages.SUCCESS,
            )
            return
        existing = run_id_for(name, f"now:{key}", tenant)
        self.message_user(
            request,
            format_html(
                'That button press fired {} already (run <a href="{}">{}</a>); '
                "nothing fired again.",
                where,
                self._url(WorkflowRun, existing),
                existing,
            ),
            messages.WARNING,
        )

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
        return related + self._family(run)

    #: Children linked one by one on a run page; more are a filtered list away.
    CHILD_LINKS = 20

    def _family(self, run: WorkflowRun) -> list[tuple[str, str]]:
        """The run's parent and, per step that started children, their progress and links."""
        rows: list[tuple[str, str]] = []
        if run.parent_run_id is not None:
            rows.append(
                (
                    "Parent run",
                    _run_link(self._url(WorkflowRun, run.parent_run_id), run.parent_run_id),
                )
            )
        groups = WorkflowChildGroup.objects.filter(
            tenant_id=run.tenant_id, parent_run_id=run.run_id
        ).order_by("id")
        for group in groups:
            children = WorkflowRun.objects.filter(
                tenant_id=run.tenant_id, parent_run_id=run.run_id, parent_group=group.group
            ).order_by("started_at", "run_id")[: self.CHILD_LINKS]
            links = format_html_join(
                " ",
                "{}",
                ((_run_link(self._url(WorkflowRun, c.run_id), c.run_id),) for c in children),
            )
            everyone = f"{self._changelist_url(WorkflowRun)}?parent_run_id={run.run_id}"
            rows.append(
                (
                    f"Children of step {group.step}",
                    format_html(
                        '{} <a href="{}">(all)</a><br>{}',
                        progress_text(group),
                        everyone,
                        links,
                    ),
                )
            )
        return rows

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

    # --- actions --------------------------------------------------------------

    def _done(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        done: int,
        done_text: Callable[[int], str],
        skipped: int,
        skipped_text: str,
    ) -> HttpResponse | None:
        if done:
            self.message_user(request, done_text(done), messages.SUCCESS)
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
                with _own_transaction():
                    ok = run.status == RunStatus.WAITING and wake_run(
                        run.run_id, by=_actor(request)
                    )
            except RunNotFound:
                ok = False
            woken += ok
            skipped += not ok
        return self._done(
            request,
            queryset,
            woken,
            lambda n: (
                f"Woke {_runs(n)}: the next worker pass resumes " + ("it." if n == 1 else "them.")
            ),
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
                    with _own_transaction():
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
                lambda n: f"Cancelled {_runs(n)}.",
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
                with _own_transaction():
                    rerun = rerun_run(run.run_id, by=_actor(request))
                if rerun:
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
            lambda n: (
                f"Rerun requested for {_runs(n)}: the next worker pass runs "
                + ("it" if n == 1 else "each")
                + " from where its failed attempt began."
            ),
            skipped,
            "not failed",
        )


def _zone_of(name: str) -> Any:
    """The schedule's zone, for showing its times (the current zone if it is unknown)."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        return None


@admin.register(WorkflowRunPending)
class WorkflowRunPendingAdmin(WorkflowAdmin):
    list_display = (
        "run",
        "workflow",
        "workflow_version",
        "tenant_id",
        "step",
        "suspension_type",
        "wake",
        "due",
        "awaiting",
    )
    # The first column links to the run; the step, to this row's own page.
    list_display_links = ("step",)
    list_filter = ("suspension_type", "workflow_name", "workflow_version", "tenant_id")
    search_fields = ("run_id",)
    search_help_text = "A run id (whole, or its first 8 characters)."
    ordering = (F("wake_at").asc(nulls_last=True), "id")
    fields = (
        "run",
        "workflow_name",
        "workflow_version",
        "tenant_id",
        "step",
        "suspension_type",
        "wake_at_text",
        "due",
        "lateness",
        "timeout_at_text",
        "retry_attempt",
        "resume_errors",
        "awaiting",
        "awaited_event",
        "due_since_text",
        "suspended_at_text",
        "run_version",
        "trigger_event",
        "definition_fingerprint",
        "state_json",
    )
    readonly_fields = (
        "run",
        "due",
        "lateness",
        "awaiting",
        "state_json",
        "wake_at_text",
        "timeout_at_text",
        "due_since_text",
        "suspended_at_text",
        "awaited_event",
        "trigger_event",
    )

    @admin.display(description="run", ordering="run_id")
    def run(self, row: WorkflowRunPending) -> str:
        return self._run_link(row.run_id)

    @admin.display(description=_zoned("wakes at"), ordering="wake_at")
    def wake(self, row: WorkflowRunPending) -> str:
        return _time(row.wake_at)

    @admin.display(description="due")
    def due(self, row: WorkflowRunPending) -> str:
        """Due or not yet, and for how long or until when (words, not a red cross)."""
        if row.wake_at is None:
            return "on the event (no deadline)"
        delta = clock.now() - row.wake_at
        if delta.total_seconds() >= 0:
            return f"due, for {humanize(delta)}"
        return f"not yet: in {humanize(-delta)}"

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

    @admin.display(description="wakes at")
    def wake_at_text(self, row: WorkflowRunPending) -> str:
        return when(row.wake_at)

    @admin.display(description="timeout at")
    def timeout_at_text(self, row: WorkflowRunPending) -> str:
        return when(row.timeout_at)

    @admin.display(description="due since")
    def due_since_text(self, row: WorkflowRunPending) -> str:
        return when(row.due_since)

    @admin.display(description="suspended at")
    def suspended_at_text(self, row: WorkflowRunPending) -> str:
        return when(row.suspended_at)

    @admin.display(description="awaited event")
    def awaited_event(self, row: WorkflowRunPending) -> str:
        return self._event_link(row.awaited_event_id)

    @admin.display(description="trigger event")
    def trigger_event(self, row: WorkflowRunPending) -> str:
        return self._event_link(row.trigger_event_id)
