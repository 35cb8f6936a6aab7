"""The suspended steps: ``WorkflowRunPending`` (when each is due), its wait keys and wake-up checks.

Projections of the run streams, as ``WorkflowRun`` is; an awaited event finds
the runs it may wake through the wait keys.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

from kumiko_workflows.models.runs import SuspensionType
from kumiko_workflows.workflow import clock

#: Keyed candidates of an awaited event are read this many runs at a time (see
#: ``WorkflowRunPendingQuerySet.candidates``): well inside every database's
#: limit on a statement's parameters.
KEYED_BATCH = 500


class WorkflowRunPendingQuerySet(models.QuerySet["WorkflowRunPending"]):
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
    # The claim's order: wake_at less the run's head start (its priority,
    # docs/howto/priorities.md); equal to wake_at without a priority.
    claim_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the row's turn comes among due rows: wake_at less its priority's "
        "head start (later for a negative priority).",
    )
    priority = models.SmallIntegerField(default=0, db_default=0)
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
    limit_key = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="The concurrency limit's key a run queued for a slot waits under.",
    )
    queued_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the run first queued for a concurrency slot: the queue's order.",
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
            # The claim's scan: due rows in their priority's order (store/claims.claim_due).
            models.Index(fields=["tenant_id", "claim_at", "id"], name="kw_pending_claim"),
            models.Index(
                fields=["tenant_id", "wait_event_type"],
                condition=Q(match_scan=True),
                name="kw_pending_scan",
            ),
            # The queue of one limit's key, oldest first (engine/limits).
            models.Index(
                fields=["tenant_id", "workflow_name", "limit_key", "queued_at", "id"],
                condition=Q(queued_at__isnull=False, wake_at__isnull=True),
                name="kw_pending_slot_queue",
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
