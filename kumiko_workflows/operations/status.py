"""The status report: runs, runs in flight, pending rows and their lag, workers, cron, health.

What ``manage.py workflow_status`` prints, as JSON-ready data: counts of runs
by workflow and status, the runs in flight per workflow and version, the
pending rows and the oldest due one with its lag, the due backlog per
tenant, the workers and when each last passed, the cron schedules, each
outbox's backlog, and the health check (``--check``). A heartbeat's age is read on the database's
clock, the one it was written with, never on this process's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import DatabaseError, InterfaceError
from django.db.models import Count
from django.utils.connection import ConnectionDoesNotExist

from kumiko_workflows.engine.cron import schedule_overview
from kumiko_workflows.models import (
    RunStatus,
    SuspensionType,
    WorkerHeartbeat,
    WorkflowRun,
    WorkflowRunPending,
)
from kumiko_workflows.operations.limits import queued_by_key, rate_waiting
from kumiko_workflows.operations.version_table import (
    stale_workers,
    version_table,
)
from kumiko_workflows.operations.words import humanize, step_label
from kumiko_workflows.store import claims, db, outbox


def status_report(
    tenant: str | None, now: datetime, failed_limit: int | None = None
) -> dict[str, Any]:
    """Everything the command prints, as JSON-ready data."""
    runs = WorkflowRun.objects.for_tenant(tenant)
    statuses = [choice.value for choice in RunStatus]
    workflows: dict[str, dict[str, int]] = {}
    for row in runs.order_by().values("workflow_name", "status").annotate(n=Count("run_id")):
        counts = workflows.setdefault(row["workflow_name"], dict.fromkeys(statuses, 0))
        counts[row["status"]] = counts.get(row["status"], 0) + row["n"]
    for counts in workflows.values():
        counts["total"] = sum(counts.values())

    pending = WorkflowRunPending.objects.for_tenant(tenant)
    due = pending.due(now)
    report: dict[str, Any] = {
        "now": now.isoformat(),
        "tenant": tenant,
        "workflows": dict(sorted(workflows.items())),
        "in_flight": [row.as_dict() for row in version_table(tenant) if row.in_flight],
        "pending": {
            "total": pending.count(),
            "due": due.count(),
            "oldest_due": oldest_due(tenant, now),
            "due_by_tenant": due_by_tenant(tenant, now),
            "gated": gated_starts(pending),
        },
        "workers": workers(tenant),
        # Runs a concurrency limit queues (per key) or a rate limit holds back, and why.
        "flow_control": {"queued": queued_by_key(tenant), "rate": rate_waiting(tenant, now)},
    }
    report["cron"] = cron_schedules(tenant, now)
    report["outbox"] = outbox_backlog(tenant)
    if failed_limit is not None:
        rows = runs.failed().order_by("-finished_at", "-updated_at")[:failed_limit]
        report["failed"] = [
            {
                "run_id": str(run.run_id),
                "tenant_id": run.tenant_id,
                "workflow_name": run.workflow_name,
                "idempotency_key": run.idempotency_key,
                "reason": run.failure_reason,
                "step": run.step,
                "workflow_version": run.workflow_version,
                "step_label": step_label(run.workflow_name, run.step, run.workflow_version),
                "error_class": run.error_class,
                "failed_at": run.finished_at.isoformat() if run.finished_at else None,
            }
            for run in rows
        ]
    return report


#: Due rows counted per tenant up to this many (the due-backlog gauge's cap).
DUE_CAP = 100_000


def due_by_tenant(tenant: str | None, now: datetime) -> dict[str, int]:
    """The backlog per tenant: due rows of each tenant that has some, largest first.

    Counted up to :data:`DUE_CAP` each, one index range per tenant (see
    ``claims.due_backlog``). A pass takes a turn of each of them in turn.
    """
    rows = [
        (each, count)
        for each, count in claims.due_backlog(now, DUE_CAP)
        if count and (tenant is None or each == tenant)
    ]
    return dict(sorted(rows, key=lambda row: (-row[1], row[0])))


def gated_starts(pending: Any) -> dict[str, int]:
    """Runs not started yet behind their key's gate: debounced, and held (singleton queue)."""
    kinds = (SuspensionType.DEBOUNCED, SuspensionType.HELD)
    counts = dict.fromkeys((str(kind) for kind in kinds), 0)
    rows = pending.filter(suspension_type__in=kinds).order_by().values("suspension_type")
    for row in rows.annotate(n=Count("id")):
        counts[row["suspension_type"]] = row["n"]
    return counts


def oldest_due(tenant: str | None, now: datetime) -> dict[str, Any] | None:
    """The oldest due pending row and how long it has waited for a worker (its lag), or None.

    Without a tenant, one probe of ``kw_pending_due`` per tenant that has due
    rows (the index leads with the tenant), the oldest of them kept.
    """
    tenants = [tenant] if tenant is not None else claims.due_tenants(now)
    found = []
    for each in tenants:
        due = WorkflowRunPending.objects.filter(tenant_id=each).due(now)
        row = due.order_by("wake_at", "id").first()
        if row is not None and row.wake_at is not None:
            found.append(row)
    if not found:
        return None
    oldest = min(found, key=lambda row: (row.wake_at, row.id))
    assert oldest.wake_at is not None
    lag = now - oldest.wake_at
    return {
        "run_id": str(oldest.run_id),
        "tenant_id": oldest.tenant_id,
        "workflow_name": oldest.workflow_name,
        "step": oldest.step,
        "suspension_type": oldest.suspension_type,
        "due_since": oldest.wake_at.isoformat(),
        "lag_seconds": round(lag.total_seconds(), 3),
        "lag": humanize(lag),
    }


def outbox_backlog(tenant: str | None = None) -> dict[str, dict[str, Any]]:
    """Each outbox's backlog (``KUMIKO_WORKFLOWS['OUTBOX_DATABASES']``), by alias.

    Appends committed in a site's transaction and not yet relayed to the
    engine's database: a few for an instant after each commit; more, or an
    old one, when processes die after their commits and no worker passes,
    or a relay keeps failing (``held``). An alias that cannot be read says
    why, and the others are still shown.
    """
    found: dict[str, dict[str, Any]] = {}
    for alias in outbox.aliases():
        try:
            found[alias] = outbox.backlog(alias, tenant)
        except (DatabaseError, InterfaceError, ConnectionDoesNotExist) as exc:
            found[alias] = {"error": " ".join(f"{type(exc).__name__}: {exc}".split())}
    return found


def outbox_problems(backlogs: dict[str, dict[str, Any]], max_lag: float | None) -> list[str]:
    """What ``--check`` says of the outboxes: unreadable, rows held, or one older than max_lag."""
    problems = []
    for alias, backlog in backlogs.items():
        if "error" in backlog:
            problems.append(f"the outbox on {alias!r} cannot be read: {backlog['error']}")
            continue
        if backlog["held"]:
            problems.append(
                f"the outbox on {alias!r} holds {backlog['held']} append(s) whose relay failed "
                f"every time (the oldest: {backlog['last_error']})"
            )
        age = backlog["oldest_seconds"]
        if max_lag is not None and age is not None and age > max_lag:
            problems.append(
                f"the outbox on {alias!r} has an append waiting {age:g} s to be relayed: more "
                f"than {max_lag:g} s (no worker passes, or its relay fails)"
            )
    return problems


def workers(tenant: str | None = None, host: str | None = None) -> list[dict[str, Any]]:
    """The workers' heartbeats, freshest first: those serving ``tenant``, on ``host``.

    Their age is measured on the database's clock, as they were written
    (:meth:`kumiko_workflows.engine.heartbeat.Heartbeat.beat`).
    """
    now = db.database_now()
    rows = []
    for beat in WorkerHeartbeat.objects.order_by("-seen_at", "name"):
        serves = not beat.tenants or tenant is None or tenant in beat.tenants
        if not serves or (host is not None and beat.hostname != host):
            continue
        age = now - beat.seen_at
        rows.append(
            {
                "name": beat.name,
                "hostname": beat.hostname,
                "pid": beat.pid,
                "tenants": beat.tenants or None,
                "loop": beat.loop,
                "started_at": beat.started_at.isoformat(),
                "seen_at": beat.seen_at.isoformat(),
                "age_seconds": round(age.total_seconds(), 3),
                "age": humanize(age),
                # Newer definitions whose runs it leaves: its code is stale.
                "left_code": beat.left_code or [],
            }
        )
    return rows


def health(
    tenant: str | None,
    now: datetime,
    *,
    max_lag: float | None,
    max_heartbeat_age: float | None,
    host: str | None = None,
) -> dict[str, Any]:
    """What ``--check`` decides: the lag, the freshest heartbeat, the problems (none: healthy).

    A limit of None is not checked (its reading is still reported).
    """
    due = oldest_due(tenant, now)
    beats = workers(tenant, host)
    problems = []
    if max_lag is not None and due is not None and due["lag_seconds"] > max_lag:
        problems.append(
            f"the oldest due run ({due['run_id']}, {due['workflow_name']}, tenant "
            f"{due['tenant_id']}) has waited {due['lag']} for a worker: more than {max_lag:g} s"
        )
    live = [
        beat
        for beat in beats
        if max_heartbeat_age is None or beat["age_seconds"] <= max_heartbeat_age
    ]
    problems.extend(stale_workers(tenant, now, {beat["name"] for beat in live}))
    freshest = beats[0] if beats else None
    where = f" on host {host}" if host is not None else ""
    serving = f" serving tenant {tenant}" if tenant is not None else ""
    limit = max_heartbeat_age
    if limit is not None and freshest is None:
        problems.append(f"no worker{where}{serving} has ever passed (no heartbeat)")
    elif limit is not None and freshest is not None and freshest["age_seconds"] > limit:
        problems.append(
            f"no worker{where}{serving} has passed in the last {limit:g} s "
            f"(the latest, {freshest['name']}, {freshest['age']} ago)"
        )
    backlogs = outbox_backlog(tenant)
    problems.extend(outbox_problems(backlogs, max_lag))
    return {
        "healthy": not problems,
        "problems": problems,
        "outbox": backlogs,
        "max_lag_seconds": max_lag,
        "max_heartbeat_age_seconds": max_heartbeat_age,
        "oldest_due": due,
        "worker": freshest,
    }


def cron_schedules(tenant: str | None, now: datetime) -> list[dict[str, Any]]:
    """Each cron workflow's last fired and next slot, per cron tenant."""

    rows = []
    for row in schedule_overview(now=now):
        if tenant is not None and row["tenant_id"] != tenant:
            continue
        rows.append(
            {
                **row,
                "started_at": row["started_at"].isoformat() if row["started_at"] else None,
                "last_slot": row["last_slot"].isoformat() if row["last_slot"] else None,
                "last_run_id": str(row["last_run_id"]) if row["last_run_id"] else None,
                "next_slot": row["next_slot"].isoformat() if row["next_slot"] else None,
                "paused_at": row["paused_at"].isoformat() if row["paused_at"] else None,
            }
        )
    return rows
