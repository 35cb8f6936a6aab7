"""The event store and the tables projected from it, one module per idea.

``Event`` is the append-only log (:mod:`~kumiko_workflows.models.events`).
``WorkflowRun`` (one row per run: its status, :mod:`~kumiko_workflows.models.runs`)
and ``WorkflowRunPending`` (one row per suspended step: when it is due,
:mod:`~kumiko_workflows.models.pending`) are projections:
``rebuild_workflow_projections`` recreates them from the events. The
engine's bookkeeping (tombstones, heartbeats, the signals' outbox, deployed
definitions, task attempts) is :mod:`~kumiko_workflows.models.bookkeeping`;
the outbox on the site's databases and its relays' records,
:mod:`~kumiko_workflows.models.outbox`.
Django finds every model here, as ``kumiko_workflows.models``.
"""

from __future__ import annotations

from kumiko_workflows.models.bookkeeping import (
    DeployedDefinition,
    PurgedRun,
    SignalDelivery,
    TaskAttempt,
    WorkerHeartbeat,
)
from kumiko_workflows.models.events import Event, EventQuerySet
from kumiko_workflows.models.outbox import OutboxEntry, RelayedAppend
from kumiko_workflows.models.pending import (
    KEYED_BATCH,
    WakeCheck,
    WorkflowRunPending,
    WorkflowRunPendingQuerySet,
    WorkflowWaitKey,
)
from kumiko_workflows.models.runs import (
    SETTLED_STATUSES,
    RunStatus,
    SuspensionType,
    WorkflowRun,
    WorkflowRunQuerySet,
)

__all__ = [
    "KEYED_BATCH",
    "SETTLED_STATUSES",
    "DeployedDefinition",
    "Event",
    "EventQuerySet",
    "OutboxEntry",
    "PurgedRun",
    "RelayedAppend",
    "RunStatus",
    "SignalDelivery",
    "SuspensionType",
    "TaskAttempt",
    "WakeCheck",
    "WorkerHeartbeat",
    "WorkflowRun",
    "WorkflowRunPending",
    "WorkflowRunPendingQuerySet",
    "WorkflowRunQuerySet",
    "WorkflowWaitKey",
]
