"""The runs' status table, ``WorkflowRun`` (one row per run), a projection of the run streams."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from kumiko_workflows.workflow import suspensions


class RunStatus(models.TextChoices):
    RUNNING = "running", "running"
    WAITING = "waiting", "waiting"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


SETTLED_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


#: The pending and status rows' ``suspension_type``: one choice per suspension
#: record (:data:`kumiko_workflows.workflow.suspensions.RECORDS`), named as its
#: member (``SuspensionType.EVENT`` is ``"event"``), labelled as the record says.
SuspensionType = models.TextChoices(  # type: ignore[call-overload]  # the functional API
    "SuspensionType",
    [(record.name, (record.suspension_type, record.label)) for record in suspensions.RECORDS],
)


class WorkflowRunQuerySet(models.QuerySet["WorkflowRun"]):
    def failed(self) -> WorkflowRunQuerySet:
        return self.filter(status=RunStatus.FAILED)

    def for_tenant(self, tenant_id: str | None) -> WorkflowRunQuerySet:
        return self if tenant_id is None else self.filter(tenant_id=tenant_id)


class WorkflowRun(models.Model):
    """The status of one run, projected from its event stream.

    Every column but ``last_error`` is a pure function of the run's events.
    ``last_error`` holds the raw text of the latest step error: it is kept out
    of the immutable events on purpose and survives a rebuild.
    """

    run_id = models.UUIDField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    workflow_name = models.CharField(max_length=200)
    workflow_version = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The version of the workflow the run resumes on: the one it started on, "
        "or was moved to. Empty: started before runs recorded their version.",
    )
    idempotency_key = models.CharField(max_length=500, blank=True, default="")
    search_key = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="What the admin's search finds the run by: the workflow's search_key(event), "
        "else its idempotency key.",
    )
    status = models.CharField(max_length=16, choices=RunStatus.choices)
    step = models.CharField(max_length=200, blank=True, default="")
    suspension_type = models.CharField(
        max_length=16, choices=SuspensionType.choices, blank=True, default=""
    )
    wake_at = models.DateTimeField(null=True, blank=True)
    awaited_event_type = models.CharField(max_length=200, blank=True, default="")
    retry_attempt = models.PositiveIntegerField(default=0)
    failure_reason = models.CharField(max_length=64, blank=True, default="")
    error_class = models.CharField(max_length=200, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    definition_fingerprint = models.CharField(max_length=64)
    trigger_event_id = models.BigIntegerField(null=True, blank=True)
    # db_default: rows written outside the ORM (bulk loads) and before priorities get 0.
    priority = models.SmallIntegerField(
        default=0,
        db_default=0,
        help_text="The run's priority, -100 to 100 (0: none), from its run-started event.",
    )
    version = models.PositiveIntegerField(help_text="Stream version of the last event seen.")
    started_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    parent_run_id = models.UUIDField(
        null=True,
        blank=True,
        help_text="The run whose call_workflow or fan_out step started this run, if any.",
    )
    # db_default: rows written outside the ORM (bulk loads) are no child's.
    parent_group = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="The parent's group of children this run belongs to (its step and attempt).",
    )

    objects = WorkflowRunQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["tenant_id", "status", "updated_at"], name="kw_run_tenant_status"),
            # A workflow's runs, by version: the run list's filters read their
            # choices from it (one probe per tenant, workflow and version), and
            # a workflow's runs of one status are found in it without reading
            # the workflow's other runs.
            models.Index(
                fields=["tenant_id", "workflow_name", "workflow_version", "status"],
                name="kw_run_workflow_version",
            ),
            # The runs an event started (the admin's link from an event to its runs).
            models.Index(fields=["tenant_id", "trigger_event_id"], name="kw_run_trigger_event"),
            # The admin's search by business key. It leads with the key, not
            # tenant_id: a superuser searches across tenants, and an index led
            # by tenant_id could not serve that. Runs without a key cost nothing.
            models.Index(
                fields=["search_key", "tenant_id"],
                condition=~Q(search_key=""),
                name="kw_run_search_key",
            ),
            # A run's children (the cancel cascade, the admin's links).
            models.Index(
                fields=["tenant_id", "parent_run_id"],
                condition=Q(parent_run_id__isnull=False),
                name="kw_run_parent",
            ),
            # The admin dashboard's counts per hour and per day: a range of
            # instants, read from the index alone (every column it groups by
            # is in it). They lead with the instant, not tenant_id: a
            # superuser's dashboard spans tenants, and a tenant's reads the
            # same range with tenant_id checked in the index.
            models.Index(
                fields=["started_at", "tenant_id", "workflow_name"], name="kw_run_started"
            ),
            models.Index(
                fields=["finished_at", "tenant_id", "workflow_name", "status", "failure_reason"],
                condition=Q(finished_at__isnull=False),
                name="kw_run_finished",
            ),
            # The run list's order, newest update first, for a superuser (every
            # tenant: an index led by tenant_id could not give one order over
            # them) and for its filters by workflow, status and failure reason,
            # checked in the index; a tenant's list reads the same order with
            # tenant_id checked.
            models.Index(
                fields=["updated_at", "tenant_id", "workflow_name", "status", "failure_reason"],
                name="kw_run_updated",
            ),
            # The failure-reason filter lists the reasons present: one probe per
            # known reason. Only failed runs are in it.
            models.Index(
                fields=["failure_reason", "tenant_id"],
                condition=Q(status="failed"),
                name="kw_run_failure_reason",
            ),
        ]
        permissions = [
            ("wake_workflowrun", "Can wake a waiting workflow run now"),
            ("cancel_workflowrun", "Can cancel a workflow run"),
            ("rerun_workflowrun", "Can rerun a failed workflow run"),
            # Cron schedules have no table of their own: their permissions live here.
            ("pause_schedule", "Can pause and resume a cron schedule"),
            ("fire_schedule", "Can fire a cron schedule now"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name} {self.run_id} ({self.status})"
