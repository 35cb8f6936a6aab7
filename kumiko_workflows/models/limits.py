"""The flow-control tables: the slots of concurrency limits and of rate limits.

Projections of the run streams (``workflow.slot-taken`` / ``-released``,
``workflow.rate-taken`` / ``-waiting``), rebuilt with the run tables; the
rows themselves are what workers lock to take a slot (:mod:`kumiko_workflows.engine.limits`).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class LimitSlot(models.Model):
    """One slot of a workflow's concurrency limit, for one key in one tenant.

    Slots ``0`` to ``max - 1`` are what runs take: a worker locks a free one
    (``FOR UPDATE SKIP LOCKED``) in the transaction of the segment it
    admits, so a crashed worker's slot comes back with its rollback. Under
    ``holds="active"`` the run is also recorded as ``holder`` from its
    ``workflow.slot-taken`` event to its ``workflow.slot-released`` one:
    the holder column is a projection of the run streams. Slot ``-1`` is the
    key's queue lock, which queuing and releasing take in turn so that no
    release misses a run that queued meanwhile.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    workflow_name = models.CharField(max_length=200)
    limit_key = models.CharField(max_length=200, blank=True, default="")
    slot = models.IntegerField()
    holder_run_id = models.UUIDField(null=True, blank=True)
    taken_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "workflow_name", "limit_key", "slot"], name="kw_limit_slot"
            ),
        ]
        indexes = [
            models.Index(
                fields=["tenant_id", "holder_run_id"],
                condition=Q(holder_run_id__isnull=False),
                name="kw_limit_holder",
            ),
        ]
        verbose_name = "concurrency slot"

    def __str__(self) -> str:
        key = f" key {self.limit_key!r}" if self.limit_key else ""
        return f"{self.workflow_name}{key} slot {self.slot}"


class RateSlot(models.Model):
    """One of the ``max`` starts a workflow's rate limit allows per period, for one key.

    ``last_start`` is the instant (the database's clock) of the latest
    segment start that took this slot; a start may take it only once
    ``per`` seconds have passed since, so no window of ``per`` seconds holds
    more than ``max`` starts. A projection of the runs' ``workflow.rate-taken``
    events.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    workflow_name = models.CharField(max_length=200)
    rate_key = models.CharField(max_length=200, blank=True, default="")
    slot = models.IntegerField()
    last_start = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "workflow_name", "rate_key", "slot"], name="kw_rate_slot"
            ),
        ]
        verbose_name = "rate limit slot"

    def __str__(self) -> str:
        key = f" key {self.rate_key!r}" if self.rate_key else ""
        return f"{self.workflow_name}{key} rate slot {self.slot}"
