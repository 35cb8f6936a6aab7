"""Django admin for the event store, the workflow runs, the pending rows and the cron schedules.

Everything is read-only: events are an append-only log and the two other
tables are projections of it. What changes a run are the actions (wake now,
cancel, rerun), and what changes a cron schedule are its buttons (pause,
resume, fire now), each appending an event through the public API, each
with its own permission. ``KUMIKO_WORKFLOWS["ADMIN_TENANT"]`` (``request ->
tenant id or None``) limits a staff user to one tenant's rows; superusers
see all.

One module per screen: :mod:`~kumiko_workflows.admin.events`,
:mod:`~kumiko_workflows.admin.runs` (with its
:mod:`~kumiko_workflows.admin.actions` and the cron
:mod:`~kumiko_workflows.admin.schedules` above its list) and
:mod:`~kumiko_workflows.admin.pending`, on a read-only, tenant-scoped base
(:mod:`~kumiko_workflows.admin.base`), shared display helpers
(:mod:`~kumiko_workflows.admin.display`) and what keeps the big lists
cheap (:mod:`~kumiko_workflows.admin.lists`). Importing this package registers
the three admins, as ``django.contrib.admin``'s autodiscovery expects.
"""

from __future__ import annotations

from kumiko_workflows.admin.base import WorkflowAdmin, admin_tenant
from kumiko_workflows.admin.events import EventAdmin
from kumiko_workflows.admin.pending import WorkflowRunPendingAdmin
from kumiko_workflows.admin.runs import FailureReasonFilter, WorkflowRunAdmin

__all__ = [
    "EventAdmin",
    "FailureReasonFilter",
    "WorkflowAdmin",
    "WorkflowRunAdmin",
    "WorkflowRunPendingAdmin",
    "admin_tenant",
]
