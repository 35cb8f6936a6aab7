"""The run admin's actions: wake now, cancel (asking for a reason), rerun failed runs.

Each appends an event through the public API in a transaction of its own,
limited to the runs it applies to, with its own permission and a
``message_user`` report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from kumiko_workflows.admin.base import WorkflowAdmin, actor_of, own_transaction
from kumiko_workflows.admin.display import runs_text
from kumiko_workflows.engine.run_controls import cancel_run, rerun_run, wake_run
from kumiko_workflows.exceptions import (
    RunNotFound,
    RunNotRerunnable,
)
from kumiko_workflows.models import (
    SETTLED_STATUSES,
    RunStatus,
    WorkflowRun,
)

#: Runs listed by name on the cancel confirmation page; the rest are counted.
CANCEL_LIST_LIMIT = 100


class RunActions(WorkflowAdmin):
    """The run admin's actions, each limited to the runs it applies to."""

    def _report(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        done: int,
        done_text: Callable[[int], str],
        skipped: int,
        skipped_text: str,
    ) -> HttpResponse | None:
        if done:
            self.message_user(request, done_text(done), messages.SUCCESS)
        if skipped:
            self.message_user(
                request, f"Skipped {runs_text(skipped)}: {skipped_text}.", messages.WARNING
            )
        if not done and not skipped:
            self.message_user(request, "No runs were changed.", messages.WARNING)
        return self._back_to_run_page(request, queryset)

    def _back_to_run_page(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> HttpResponse | None:
        """From a button on a run's page, go back to that page."""
        if request.POST.get("_kw_return"):
            pks = list(queryset.values_list("pk", flat=True)[:2])
            if len(pks) == 1:
                return HttpResponseRedirect(self._url(WorkflowRun, pks[0]))
        return None

    @admin.action(permissions=["wake"], description="Wake now (resume on the next worker pass)")
    def wake_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        woken = skipped = 0
        for run in queryset:
            try:
                with own_transaction():
                    ok = run.status == RunStatus.WAITING and wake_run(
                        run.run_id, by=actor_of(request)
                    )
            except RunNotFound:
                ok = False
            woken += ok
            skipped += not ok
        return self._report(
            request,
            queryset,
            woken,
            lambda n: (
                f"Woke {runs_text(n)}: the next worker pass resumes "
                + ("it." if n == 1 else "them.")
            ),
            skipped,
            "not waiting",
        )

    @admin.action(permissions=["cancel"], description="Cancel (asks for a reason)")
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        reason = request.POST.get("reason", "").strip()
        if request.POST.get("kw_confirm") and reason:
            cancelled = skipped = 0
            for run in queryset:
                try:
                    with own_transaction():
                        ok = run.status not in SETTLED_STATUSES and cancel_run(
                            run.run_id, reason, by=actor_of(request)
                        )
                except RunNotFound:
                    ok = False
                cancelled += ok
                skipped += not ok
            return self._report(
                request,
                queryset,
                cancelled,
                lambda n: f"Cancelled {runs_text(n)}.",
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
    def rerun_failed(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        requested = skipped = 0
        refused: list[str] = []
        for run in queryset:
            if run.status != RunStatus.FAILED:
                skipped += 1
                continue
            try:
                with own_transaction():
                    rerun = rerun_run(run.run_id, by=actor_of(request))
                if rerun:
                    requested += 1
                else:
                    skipped += 1
            except (RunNotRerunnable, RunNotFound) as exc:
                refused.append(str(exc))
        if refused:
            self.message_user(
                request,
                f"Refused {runs_text(len(refused))}: {refused[0]}"
                + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""),
                messages.ERROR,
            )
            if not requested and not skipped:
                return self._back_to_run_page(request, queryset)
        return self._report(
            request,
            queryset,
            requested,
            lambda n: (
                f"Rerun requested for {runs_text(n)}: the next worker pass runs "
                + ("it" if n == 1 else "each")
                + " from where its failed attempt began."
            ),
            skipped,
            "not failed",
        )
