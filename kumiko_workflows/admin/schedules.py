"""The cron schedules above the run list: their slots, and the pause, resume and fire-now buttons.

Each button appends an event through the public API, with its own
permission (``pause_schedule``, ``fire_schedule``).
"""

from __future__ import annotations

import uuid
import zoneinfo
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path
from django.utils.html import format_html

from kumiko_workflows.admin.base import WorkflowAdmin, actor_of, admin_tenant, own_transaction
from kumiko_workflows.engine.cron import schedule_overview
from kumiko_workflows.engine.schedule_controls import (
    fire_schedule_now,
    pause_schedule,
    resume_schedule,
)
from kumiko_workflows.engine.starts import start_in_worker
from kumiko_workflows.exceptions import (
    InvalidArgument,
    ScheduleError,
)
from kumiko_workflows.models import (
    WorkflowRun,
)
from kumiko_workflows.operations.words import when
from kumiko_workflows.workflow.definition import run_id_for


def _zone_of(name: str) -> Any:
    """The schedule's zone, for showing its times (the current zone if it is unknown)."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        return None


class ScheduleControls(WorkflowAdmin):
    """The run admin's part that lists the cron schedules and presses their buttons."""

    def _schedules(self, request: HttpRequest) -> list[dict[str, Any]]:
        tenant = admin_tenant(request)
        can_pause = self._holds_permission(request, "pause_schedule")
        can_fire = self._holds_permission(request, "fire_schedule")
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
        if op not in needed or not self._holds_permission(request, needed[op]):
            raise PermissionDenied
        name = request.POST.get("workflow", "")
        tenant = request.POST.get("tenant", "")
        scope = admin_tenant(request)
        if scope is not None and tenant != scope:
            # Another tenant's schedule does not exist for this user.
            self.message_user(request, "No such cron schedule.", messages.ERROR)
            return back
        by = actor_of(request)
        where = f"{name} (tenant {tenant})"
        try:
            if op == "pause":
                with own_transaction():
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
                with own_transaction():
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
        with start_in_worker(), own_transaction():
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
