"""Flow control for people: which runs wait for a concurrency slot or their rate, and why.

What ``workflow_status``, the admin's run page (through
:mod:`kumiko_workflows.operations.explain`) and the queued-runs gauge
(:mod:`kumiko_workflows.telemetry`) show: the runs queued per key with the
slots taken ("queued behind 2 active runs of key 'acme'"), and the runs a
rate limit holds back with when the next start is allowed ("rate limit:
next slot in 3 s"). Read-only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Min

from kumiko_workflows.models import SuspensionType, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations.explain import queue_reason, rate_reason


def queued_by_key(tenant: str | None) -> list[dict[str, Any]]:
    """The runs queued for a concurrency slot, per (tenant, workflow, key), with why.

    Read through ``kw_pending_slot_queue`` (only queued rows).
    """
    rows = WorkflowRunPending.objects.filter(queued_at__isnull=False, wake_at__isnull=True)
    if tenant is not None:
        rows = rows.filter(tenant_id=tenant)
    grouped = (
        rows.order_by()
        .values("tenant_id", "workflow_name", "limit_key")
        .annotate(queued=Count("id"), since=Min("queued_at"))
        .order_by("tenant_id", "workflow_name", "limit_key")
    )
    return [
        {
            "tenant_id": row["tenant_id"],
            "workflow_name": row["workflow_name"],
            "key": row["limit_key"],
            "queued": row["queued"],
            "oldest_queued_at": row["since"].isoformat() if row["since"] else None,
            "why": queue_reason(row["tenant_id"], row["workflow_name"], row["limit_key"]),
        }
        for row in grouped
    ]


def rate_waiting(tenant: str | None, now: datetime) -> list[dict[str, Any]]:
    """The runs a rate limit holds back, per (tenant, workflow), with the next allowed start."""
    runs = WorkflowRun.objects.filter(status="waiting", suspension_type=SuspensionType.RATE)
    if tenant is not None:
        runs = runs.filter(tenant_id=tenant)
    grouped = (
        runs.order_by()
        .values("tenant_id", "workflow_name")
        .annotate(waiting=Count("run_id"), next_at=Min("wake_at"))
        .order_by("tenant_id", "workflow_name")
    )
    return [
        {
            "tenant_id": row["tenant_id"],
            "workflow_name": row["workflow_name"],
            "waiting": row["waiting"],
            "next_start_at": row["next_at"].isoformat() if row["next_at"] else None,
            "why": rate_reason(row["next_at"], now),
        }
        for row in grouped
    ]
