"""The admin dashboard's kept counts of past days (:class:`RunDay`): a cache of the run table."""

from __future__ import annotations

from django.db import models


class RunDay(models.Model):
    """Runs of one workflow and tenant started and finished on one past day: the dashboard's cache.

    The admin dashboard counts a day once it is over (and an hour more has
    passed), from the run table, and keeps the counts here, so its 30-day
    chart reads 29 kept days and counts only today. A row with an empty
    ``workflow_name`` and ``tenant_id`` marks a day as counted (for every
    tenant). Failed runs are counted per failure reason, a row each.
    Operations bookkeeping, like the worker heartbeats: not an event,
    not projected, never rebuilt; deleting rows only makes the next view count
    those days again. A day's counts are those the run table held when it was
    counted (a later purge or rerun leaves them as they were).
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    #: The time zone whose calendar ``day`` is in (days start at its midnight).
    zone = models.CharField(max_length=64)
    day = models.DateField()
    workflow_name = models.CharField(max_length=200)
    #: The failure reason of the failed runs counted here; "" for the row of
    #: the day's other counts (each reason has a row of its own, so a view
    #: sums small integers in SQL).
    failure_reason = models.CharField(max_length=64, blank=True, default="")
    started = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    counted_at = models.DateTimeField()

    class Meta:
        verbose_name = "run counts of a day"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "zone", "day", "workflow_name", "failure_reason"],
                name="kw_run_day",
            )
        ]
        indexes = [models.Index(fields=["zone", "day"], name="kw_run_day_zone_day")]

    def __str__(self) -> str:
        return f"runs of {self.workflow_name} on {self.day} ({self.zone}, tenant {self.tenant_id})"
