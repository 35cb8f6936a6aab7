"""The engine's bookkeeping tables: tombstones, heartbeats, the signals' outbox, deployments, tasks.

Tombstones of purged runs, workers' heartbeats, the run signals' outbox, the
deployed definitions and the task attempts.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class PurgedRun(models.Model):
    """A run ``purge_workflow_runs`` removed: what is left so its id stays used.

    The run's stream, status row and any leftovers are gone; this row keeps a
    trigger with the same idempotency key (so the same run id, see
    :func:`~kumiko_workflows.run_id_for`) from starting the run again, unless
    ``KUMIKO_WORKFLOWS["REUSE_PURGED_KEYS"]`` allows it. Not a projection: a
    rebuild neither reads nor writes it.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    run_id = models.UUIDField()
    workflow_name = models.CharField(max_length=200)
    purged_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "run_id"], name="kw_purged_run"),
        ]
        verbose_name = "purged workflow run"

    def __str__(self) -> str:
        return f"{self.workflow_name} {self.run_id} (purged {self.purged_at.isoformat()})"


class WorkerHeartbeat(models.Model):
    """A resume worker process (``manage.py resume_due_runs``) and when it last passed.

    Each worker writes its own row (``host:pid``) at most every few seconds,
    at the start of a pass; a ``--loop`` worker deletes it when it stops. It
    is operations bookkeeping, not workflow state: not an event, not
    projected, never rebuilt, and not a tenant's (a worker serves tenants).
    ``workflow_status --check`` reads it to tell whether a worker has passed
    recently.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=300, unique=True, help_text="host:pid")
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    tenants = models.JSONField(
        default=list, blank=True, help_text="The tenants it resumes (--tenant); empty: every one."
    )
    loop = models.BooleanField(default=False, help_text="A --loop worker (else one pass).")
    started_at = models.DateTimeField()
    seen_at = models.DateTimeField(
        help_text="When it last began a pass (written every 5 s at most)."
    )
    # Nullable: a worker of the code before this column (a rolling deploy) inserts none.
    left_code = models.JSONField(
        null=True,
        default=list,
        blank=True,
        help_text="Definitions newer than this worker's code that it met and leaves to workers "
        "that have them (it should be restarted): fingerprint, workflow, version, first seen.",
    )

    class Meta:
        verbose_name = "worker heartbeat"

    def __str__(self) -> str:
        return f"worker {self.name} (seen {self.seen_at.isoformat()})"


class SignalDelivery(models.Model):
    """A run signal not yet handed to every receiver: the signals' outbox.

    Written with the transition's run event, in its transaction, when a
    receiver listens; deleted once the receivers were called after commit.
    A row left behind (its process died) is delivered again by a resume
    worker's pass. Not workflow state: not an event, not projected, never
    rebuilt.
    """

    event_id = models.BigIntegerField(
        primary_key=True,
        help_text="The run event whose signal it is; receivers get it as delivery_id.",
    )
    tenant_id = models.CharField(max_length=100)
    owner = models.CharField(
        max_length=300, help_text="host:pid:token of the process delivering it"
    )
    leased_at = models.DateTimeField(
        db_default=Now(), help_text="When its owner took it (the database's clock)."
    )

    class Meta:
        verbose_name = "signal delivery"
        verbose_name_plural = "signal deliveries"

    def __str__(self) -> str:
        return f"signal of event #{self.event_id} (owner {self.owner})"


class DeployedDefinition(models.Model):
    """A workflow definition (by fingerprint) some process ran, and when it was first seen.

    Each process that writes run events or resumes runs registers the
    definitions its code declares, on the database's clock, once; a row is
    never changed. A worker that meets a run whose definition it lacks tells
    from these rows which side is newer: a definition first seen after the
    worker's own newest one belongs to newer code, and the worker leaves the
    run (see :mod:`kumiko_workflows.engine.deploys`). Not an event, not
    projected, not a tenant's (code serves every tenant).
    """

    id = models.BigAutoField(primary_key=True)
    fingerprint = models.CharField(max_length=64, unique=True)
    workflow_name = models.CharField(max_length=200)
    workflow_version = models.PositiveIntegerField()
    step_fingerprints = models.JSONField(
        default=dict, help_text="The fingerprint of each step position, and of the header."
    )
    first_seen_at = models.DateTimeField(help_text="On the database's clock.")
    first_seen_by = models.CharField(max_length=300, help_text="host:pid of that process")

    class Meta:
        verbose_name = "deployed workflow definition"

    def __str__(self) -> str:
        return (
            f"{self.workflow_name} v{self.workflow_version} {self.fingerprint[:12]} "
            f"(first seen {self.first_seen_at.isoformat()} by {self.first_seen_by})"
        )


class TaskAttempt(models.Model):
    """A failed attempt of a Django task run by ``kumiko_workflows.tasks`` (a task workflow's run).

    Mutable bookkeeping beside the run, as ``WorkflowRun.last_error`` is: the
    traceback is raw error text, which never goes into an immutable event.
    Written in the attempt's transaction after its writes rolled back, so an
    attempt a killed worker never committed leaves no row; deleted with its
    run by retention. (The successful attempt is in the run's completed event.)
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    run_id = models.UUIDField()
    attempt = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=300)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    exception_class_path = models.CharField(max_length=500)
    traceback = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = "task attempt"
        indexes = [models.Index(fields=["run_id", "attempt"], name="kumiko_task_attempt_run")]

    def __str__(self) -> str:
        return f"task run {self.run_id} attempt {self.attempt}"
