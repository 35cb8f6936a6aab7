"""The pending rows' admin: what each waiting run waits for, and since or until when."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import F

from kumiko_workflows.admin.base import WorkflowAdmin
from kumiko_workflows.admin.display import list_time, pre_json, zoned_title
from kumiko_workflows.admin.lists import CheapListMixin, indexed
from kumiko_workflows.admin.pictures import step_cell
from kumiko_workflows.models import (
    SuspensionType,
    WorkflowRun,
    WorkflowRunPending,
)
from kumiko_workflows.operations.words import describe_match, humanize, when
from kumiko_workflows.workflow import clock


@admin.register(WorkflowRunPending)
class WorkflowRunPendingAdmin(CheapListMixin, WorkflowAdmin):
    list_display = (
        "run",
        "workflow",
        "workflow_version",
        "tenant_id",
        "step_text",
        "suspension_type",
        "wake",
        "due",
        "awaiting",
    )
    # The first column links to the run; the step, to this row's own page.
    list_display_links = ("step_text",)
    # The workflows and versions are those the runs have (kw_run_workflow_version:
    # the pending rows have no index of their own for them), the tenants those
    # of the pending rows (kw_pending_due).
    list_filter = (
        "suspension_type",
        ("workflow_name", indexed("tenant_id", "workflow_name", source=WorkflowRun)),
        (
            "workflow_version",
            indexed(
                "tenant_id", "workflow_name", "workflow_version", nullable=True, source=WorkflowRun
            ),
        ),
        ("tenant_id", indexed("tenant_id")),
    )
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

    @admin.display(description="step", ordering="step")
    def step_text(self, row: WorkflowRunPending) -> str:
        return step_cell(row.workflow_name, row.step, row.workflow_version)

    @admin.display(description=zoned_title("wakes at"), ordering="wake_at")
    def wake(self, row: WorkflowRunPending) -> str:
        return list_time(row.wake_at)

    @admin.display(description="due")
    def due(self, row: WorkflowRunPending) -> str:
        """Due or not yet, and for how long or until when (words, not a red cross)."""
        if row.wake_at is None and row.queued_at is not None:
            key = f" of key {row.limit_key!r}" if row.limit_key else ""
            return f"queued for a concurrency slot{key}"
        if row.wake_at is None:
            return "on the event (no deadline)"
        delta = clock.now() - row.wake_at
        if delta.total_seconds() >= 0:
            return f"due, for {humanize(delta)}"
        return f"not yet: in {humanize(-delta)}"

    @admin.display(description="late by")
    def lateness(self, row: WorkflowRunPending) -> str:
        if row.wake_at is None:
            return "— (queued for a slot)" if row.queued_at is not None else "— (no deadline)"
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
        return pre_json(row.state)

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
