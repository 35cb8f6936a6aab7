"""Purged runs stay purged: the check where a run starts or is rerun.

``purge_workflow_runs`` (:mod:`kumiko_workflows.operations.purge`) leaves a
:class:`~kumiko_workflows.models.PurgedRun` tombstone per run it removes.
The projection registered here (before the ones that write a run's rows)
reads it: a trigger whose idempotency key belonged to a purged run does not
start that run again, and a rerun racing a purge finds the run gone instead
of leaving an event in a purged stream.
"""

from __future__ import annotations

import logging
from typing import Any

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import VersionConflict
from kumiko_workflows.models import Event, WorkflowRun
from kumiko_workflows.store import statements
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.cron import CronTrigger
from kumiko_workflows.workflow.registry import registry

logger = logging.getLogger(__name__)


def keeps_key(workflow_name: str, version: int | None) -> bool:
    """Whether a run of the workflow at ``version`` may be started again with the same id.

    A version without an ``idempotency_key`` starts every run with a new
    random key: no trigger can address a purged run of it again, so it needs
    no tombstone. Every other run does, whichever version new runs start on
    now (a rollback may make an older one the newest again); so does a run
    of a version no longer declared, or not recorded: what it was is unknown.
    """
    workflow = None if version is None else registry.get(workflow_name, version)
    if workflow is None:
        return True
    return workflow.idempotency_key is not None or isinstance(workflow.trigger, CronTrigger)


def refuse_purged_runs(event: Event, replaying: bool) -> None:
    """Keep purged runs purged: a projection that refuses, never writes.

    - ``run-started`` of a run id that was purged (a trigger with a used
      idempotency key): :class:`VersionConflict`, which the start path
      takes as "the run exists already". On PostgreSQL the insert of the
      first event waits for a purge deleting that stream to commit, and
      this query runs after it, so it sees the tombstone.
    - ``rerun-requested`` (``rerun_run``, the one append to a finished
      run): the status row is locked first, so a rerun racing a purge
      waits for it and then finds the run gone instead of leaving an
      event behind in a purged stream.
    """
    if replaying or event.aggregate_type != et.RUN_AGGREGATE_TYPE:
        return
    if event.type == et.RUN_STARTED:
        if workflow_settings.REUSE_PURGED_KEYS:
            return
        payload = event.payload
        if not keeps_key(str(payload.get("workflow_name", "")), payload.get("workflow_version")):
            return
        if statements.is_purged(event.tenant_id, event.aggregate_id):
            logger.info(
                "workflow=%s tenant=%s run=%s was purged; its idempotency key stays used",
                event.payload.get("workflow_name"),
                event.tenant_id,
                event.aggregate_id,
            )
            raise VersionConflict(
                f"run {event.aggregate_id} was purged; its idempotency key stays used "
                "(KUMIKO_WORKFLOWS['REUSE_PURGED_KEYS'])",
                aggregate_id=event.aggregate_id,
                expected_version=0,
            )
    elif event.type == et.RERUN_REQUESTED:
        row = WorkflowRun.objects.select_for_update().filter(
            tenant_id=event.tenant_id, run_id=event.aggregate_id
        )
        if not list(row.values_list("pk", flat=True)):
            raise VersionConflict(
                f"run {event.aggregate_id} was purged",
                aggregate_id=event.aggregate_id,
                expected_version=event.version - 1,
            )


def register(projections: Any) -> None:
    """Register the guard, before the projections that would write the run's rows.

    One of the engine's own (``builtin``): it raises only the
    :class:`VersionConflict` its two callers (the start path, ``rerun_run``)
    take as "the run exists" or "the run moved", never inside a worker's
    resume, so workers need no savepoint per run for it.
    """
    projections.register(
        "kumiko_workflows.purged_runs",
        {et.RUN_STARTED, et.RERUN_REQUESTED},
        refuse_purged_runs,
        order=5,
        replay=False,
        builtin=True,
    )
