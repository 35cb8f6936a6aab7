"""The event store and the tables projected from it, one module per idea.

``Event`` is the append-only log (:mod:`~kumiko_workflows.models.events`).
``WorkflowRun`` (one row per run: its status, :mod:`~kumiko_workflows.models.runs`)
and ``WorkflowRunPending`` (one row per suspended step: when it is due,
:mod:`~kumiko_workflows.models.pending`) are projections:
``rebuild_workflow_projections`` recreates them from the events. The
engine's bookkeeping (tombstones, heartbeats, the signals' outbox, deployed
definitions, task attempts) is :mod:`~kumiko_workflows.models.bookkeeping`;
the admin dashboard's kept counts of past days,
:mod:`~kumiko_workflows.models.dashboard`; the outbox on the site's
databases and its relays' records, :mod:`~kumiko_workflows.models.outbox`; the flow-control slots
(``LimitSlot``, ``RateSlot``, projections too),
:mod:`~kumiko_workflows.models.limits`.
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
from kumiko_workflows.models.children import WorkflowChildGroup
from kumiko_workflows.models.dashboard import RunDay
from kumiko_workflows.models.events import Event, EventQuerySet
from kumiko_workflows.models.limits import LimitSlot, RateSlot
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
    "LimitSlot",
    "SETTLED_STATUSES",
    "DeployedDefinition",
    "Event",
    "EventQuerySet",
    "OutboxEntry",
    "PurgedRun",
    "RateSlot",
    "RelayedAppend",
    "RunDay",
    "RunStatus",
    "SignalDelivery",
    "SuspensionType",
    "TaskAttempt",
    "WakeCheck",
    "WorkerHeartbeat",
    "WorkflowChildGroup",
    "WorkflowRun",
    "WorkflowRunPending",
    "WorkflowRunPendingQuerySet",
    "WorkflowRunQuerySet",
    "WorkflowWaitKey",
]
