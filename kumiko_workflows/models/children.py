"""The fan-in of child runs: one row per step that started some (a projection)."""

from __future__ import annotations

from django.db import models


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
