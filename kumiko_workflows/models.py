"""The event store and the two tables projected from it.

``Event`` is the append-only log. ``WorkflowRun`` (one row per run: its status)
and ``WorkflowRunPending`` (one row per suspended step: when it is due) are
projections: ``rebuild_workflow_projections`` recreates them from the events.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from kumiko_workflows.exceptions import AppendOnlyError
from kumiko_workflows.workflow import clock


class EventQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("Events are append-only: QuerySet.update() is refused.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Events are append-only: QuerySet.delete() is refused.")

    def of_type_after(self, tenant_id: str, type: str, after_id: int) -> EventQuerySet:
        """Events of one type in one tenant appended after event id ``after_id``."""
        return self.filter(tenant_id=tenant_id, type=type, id__gt=after_id).order_by("id")


class Event(models.Model):
    """One immutable domain or workflow event.

    ``id`` is the global order. A stream is ``(tenant_id, aggregate_id)`` and
    ``(tenant_id, aggregate_id, version)`` is unique: two writers appending
    the same version of a stream cannot both succeed. The stream's first
    event fixes its aggregate type, and no stream starts with an id another
    tenant's stream has (``append_event`` checks both). Rows are written by
    :func:`kumiko_workflows.append_event`; ``save()`` of an existing row,
    ``delete()`` and ``QuerySet.update()/delete()`` refuse.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    aggregate_id = models.UUIDField()
    aggregate_type = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    type = models.CharField(max_length=200)
    event_version = models.PositiveSmallIntegerField(default=1)
    payload = models.JSONField(default=dict)
    metadata = models.JSONField(default=dict, blank=True)
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    objects = EventQuerySet.as_manager()

    class Meta:
        constraints = [
            # Leads with tenant_id, as every key does, so the table shards by
            # tenant (Citus) unchanged.
            models.UniqueConstraint(
                fields=["tenant_id", "aggregate_id", "version"],
                name="kw_event_tenant_stream_version",
            ),
            models.CheckConstraint(condition=Q(version__gte=1), name="kw_event_version_gte_1"),
        ]
        indexes = [
            models.Index(fields=["tenant_id", "type", "id"], name="kw_event_tenant_type_id"),
            # A stream's first event, in any tenant: whether an id is taken
            # when a stream starts. The one lookup that cannot lead with
            # tenant_id (it is there to find another tenant's stream); one
            # small entry per stream.
            models.Index(
                fields=["aggregate_id"], condition=Q(version=1), name="kw_event_stream_head"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.id} ({self.aggregate_type} {self.aggregate_id} v{self.version})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError(
                f"Event #{self.pk} is append-only and cannot be changed; append a new event."
            )
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise AppendOnlyError(f"Event #{self.pk} is append-only and cannot be deleted.")


class RunStatus(models.TextChoices):
    RUNNING = "running", "running"
    WAITING = "waiting", "waiting"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


SETTLED_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class SuspensionType(models.TextChoices):
    WAIT = "wait", "wait"
    EVENT = "event", "wait for event"
    RETRY = "retry", "retry backoff"
    RERUN = "rerun", "rerun after failure"
    QUEUED = "queued", "queued to start"
    CHILDREN = "children", "child runs"
    COMPENSATE = "compensate", "compensating"


class WorkflowRunQuerySet(models.QuerySet):
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
    version = models.PositiveIntegerField(help_text="Stream version of the last event seen.")
    started_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    parent_run_id = models.UUIDField(
        null=True,
        blank=True,
        help_text="The run whose call_workflow or fan_out step started this run, if any.",
    )
    parent_group = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="The parent's group of children this run belongs to (its step and attempt).",
    )

    objects = WorkflowRunQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["tenant_id", "status", "updated_at"], name="kw_run_tenant_status"),
            models.Index(fields=["tenant_id", "workflow_name"], name="kw_run_tenant_workflow"),
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


#: Keyed candidates of an awaited event are read this many runs at a time (see
#: ``WorkflowRunPendingQuerySet.candidates``): well inside every database's
#: limit on a statement's parameters.
KEYED_BATCH = 500


class WorkflowRunPendingQuerySet(models.QuerySet):
    def due(self, now: datetime | None = None) -> WorkflowRunPendingQuerySet:
        return self.filter(wake_at__lte=now or clock.now())

    def waiting_for(self, event_type: str) -> WorkflowRunPendingQuerySet:
        """``wait_for_event`` rows of that event type not yet woken by an event."""
        return self.filter(
            wait_event_type=event_type,
            suspension_type=SuspensionType.EVENT,
            awaited_event_id__isnull=True,
        )

    def for_tenant(self, tenant_id: str | None) -> WorkflowRunPendingQuerySet:
        return self if tenant_id is None else self.filter(tenant_id=tenant_id)

    def candidates(
        self, tenant_id: str, event_type: str, keys: set[tuple[str, str]]
    ) -> list[WorkflowRunPendingQuerySet]:
        """``wait_for_event`` rows an event of the tenant offering ``keys`` may end.

        Those whose match requires no equality (the scan path) and those
        stored under one of the keys: querysets each served by its own index
        (one OR of both would scan every waiting row). The keyed runs' ids
        are read first and their rows then found by id, in batches of
        ``KEYED_BATCH``: a join of keys and rows in one statement lets a
        planner without statistics (a table never analysed) drive from the
        waiting rows and probe the keys once per waiting run, a cost that
        grows with the square of the waiting runs (design rule 12).
        """
        found = [self.filter(tenant_id=tenant_id, match_scan=True).waiting_for(event_type)]
        if keys:
            offered = Q()
            for path, value in keys:
                offered |= Q(path=path, value=value)
            stored = WorkflowWaitKey.objects.filter(
                offered, tenant_id=tenant_id, event_type=event_type
            )
            run_ids = sorted(set(stored.values_list("run_id", flat=True)))
            for start in range(0, len(run_ids), KEYED_BATCH):
                batch = run_ids[start : start + KEYED_BATCH]
                found.append(
                    self.filter(tenant_id=tenant_id, run_id__in=batch).waiting_for(event_type)
                )
        return [rows.order_by("pk") for rows in found]


class WorkflowRunPending(models.Model):
    """One suspended step of one run, and when it is due.

    Written by the pending projection from suspension events, deleted when the
    run is resumed, completes, fails or is cancelled. ``run_version`` is the
    stream version the resume claim must follow; ``state`` is the snapshot of
    step results (with awaited events by reference) the run resumes with.

    ``resume_errors`` is the one column not projected from the events: how
    many passes in a row a resume of this suspension raised. It is the
    worker's bookkeeping (an event per failed pass would move the stream and
    hold raw errors); it lives and dies with the suspension it counts, and a
    rebuild starts it at 0 again.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    run_id = models.UUIDField()
    step = models.CharField(max_length=200)
    workflow_name = models.CharField(max_length=200)
    workflow_version = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The version of the workflow the run resumes on. Empty: suspended by an "
        "engine that did not record it (the declared version with its fingerprint is used).",
    )
    suspension_type = models.CharField(max_length=16, choices=SuspensionType.choices)
    wake_at = models.DateTimeField(null=True, blank=True)
    timeout_at = models.DateTimeField(null=True, blank=True)
    retry_attempt = models.PositiveIntegerField(default=0)
    definition_fingerprint = models.CharField(max_length=64)
    wait_event_type = models.CharField(max_length=200, blank=True, default="")
    awaits_key = models.CharField(max_length=200, blank=True, default="")
    match_expr = models.JSONField(null=True, blank=True)
    awaited_event_id = models.BigIntegerField(null=True, blank=True)
    # db_default True: a row written by code that predates wait keys (a
    # rolling deploy) has none, so it must be scanned to be found at all.
    match_scan = models.BooleanField(
        default=False,
        db_default=True,
        help_text="The match requires no equality, so every event of the type is evaluated.",
    )
    trigger_event_id = models.BigIntegerField(null=True, blank=True)
    run_version = models.PositiveIntegerField()
    state = models.JSONField(default=dict)
    suspended_at = models.DateTimeField()
    due_since = models.DateTimeField(
        null=True, blank=True, help_text="When an event or a wake request made the row due."
    )
    # db_default: rows inserted outside the ORM (bulk loads, the load test) get 0 too.
    resume_errors = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Passes in a row whose resume of this row raised; "
        "KUMIKO_WORKFLOWS['MAX_RESUME_ERRORS'] of them fail the run.",
    )

    objects = WorkflowRunPendingQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "run_id", "step"], name="kw_pending_run_step"
            ),
        ]
        indexes = [
            models.Index(fields=["tenant_id", "wake_at", "id"], name="kw_pending_due"),
            models.Index(
                fields=["tenant_id", "wait_event_type"],
                condition=Q(match_scan=True),
                name="kw_pending_scan",
            ),
        ]
        verbose_name = "pending workflow run"

    def __str__(self) -> str:
        return f"{self.workflow_name} {self.run_id} at step {self.step} ({self.suspension_type})"

    def awaited_refs(self) -> dict[str, Any]:
        """Awaited events the run already took, by awaits key (ids, or None)."""
        state = self.state if isinstance(self.state, dict) else {}
        awaited = state.get("awaited")
        return awaited if isinstance(awaited, dict) else {}


class WorkflowWaitKey(models.Model):
    """One equality a waiting run's match requires: how an awaited event finds it.

    A wait whose match requires ``user_id = 42`` is stored under
    (``user.verified``, ``["user_id"]``, ``42``); one that accepts any of
    several values (``in``, ``or``) under each. Written by the pending
    projection with the ``waiting-for-event`` event, so it rebuilds from the
    run streams, and deleted when that wait resumes or the run ends.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    run_id = models.UUIDField()
    event_type = models.CharField(max_length=200)
    path = models.CharField(max_length=255, help_text="The payload path, as canonical JSON.")
    value = models.CharField(max_length=255, help_text="The value, as canonical JSON.")

    class Meta:
        indexes = [
            models.Index(
                fields=["tenant_id", "event_type", "path", "value"], name="kw_waitkey_lookup"
            ),
            models.Index(fields=["tenant_id", "run_id"], name="kw_waitkey_run"),
        ]
        verbose_name = "wait key"

    def __str__(self) -> str:
        return f"{self.event_type} {self.path} = {self.value} (run {self.run_id})"


class WorkflowChildGroup(models.Model):
    """The children one ``call_workflow`` or ``fan_out`` step of a run started: its fan-in.

    A projection: created by the first child's request (``workflow.call-requested``),
    counted up by each child's ``run-started`` and terminal event, closed by
    the parent's cancel. The child that brings ``finished`` to what was
    started (all of them, or fewer once a failure stopped the fan-out) wakes
    the parent, once; no child scans the others.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    parent_run_id = models.UUIDField()
    group = models.CharField(max_length=200, help_text="The step's position and its attempts.")
    step = models.CharField(max_length=200)
    workflow_name = models.CharField(max_length=200, help_text="The children's workflow.")
    total = models.PositiveIntegerField()
    max_concurrency = models.PositiveIntegerField(null=True, blank=True)
    on_child_failure = models.CharField(max_length=16, default="fail")
    on_cancel = models.CharField(max_length=16, default="cancel")
    started = models.PositiveIntegerField(default=0)
    finished = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    #: A child failed under on_child_failure="fail": no further child starts.
    stopped = models.BooleanField(default=False)
    #: The parent was cancelled: no further child starts, the parent is not woken.
    closed = models.BooleanField(default=False)
    last_event_id = models.BigIntegerField(
        null=True, blank=True, help_text="The terminal event of the child that finished last."
    )
    timeout_at = models.DateTimeField(
        null=True, blank=True, help_text="When the step gives up on its children (its timeout)."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "parent_run_id", "group"], name="kw_child_group"
            ),
        ]
        verbose_name = "group of child runs"

    def __str__(self) -> str:
        return f"{self.finished} of {self.total} children of {self.parent_run_id} ({self.step})"

    @property
    def done(self) -> bool:
        """Every child that will run has finished."""
        return self.finished >= self.started and (self.started >= self.total or self.stopped)


class WakeCheck(models.Model):
    """A wake-up still to be decided after its transaction commits (PostgreSQL).

    Two transactions cannot see each other's rows until they commit, so an
    awaited event (``event_id``) and a run suspending on ``wait_for_event``
    (``run_id``) each leave one of these, in their own transaction. Whoever
    takes it after the commit (the appending process at once, or any worker
    pass) matches it against what is committed then, and deletes it in the
    same transaction as the wake-up it caused. It stays while a candidate row
    is locked by someone else, so a lock never makes a wake-up vanish.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    event_id = models.BigIntegerField(null=True, blank=True)
    run_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    attempts = models.PositiveSmallIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["tenant_id", "id"], name="kw_wakecheck_tenant")]
        constraints = [
            models.CheckConstraint(
                condition=Q(event_id__isnull=False) | Q(run_id__isnull=False),
                name="kw_wakecheck_has_subject",
            ),
        ]
        verbose_name = "pending wake-up check"

    def __str__(self) -> str:
        subject = f"event #{self.event_id}" if self.event_id else f"run {self.run_id}"
        return f"wake-up check of {subject}"


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
