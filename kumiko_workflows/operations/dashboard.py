"""The admin dashboard's figures: runs per hour and per day, the due backlog, failures, workers.

Each figure is one grouped query over a time range of an index, so a page
costs what the range holds, never what the tables hold:

- runs started per hour (last 24 hours) and per day (last 30 days) read the
  range of ``kw_run_started`` (``started_at, tenant_id``, covering the
  workflow name on PostgreSQL);
- runs completed, failed and cancelled, the failure rate and the top failure
  reasons read the range of ``kw_run_finished`` (``finished_at, tenant_id``,
  only finished runs, covering status, workflow and reason);
- the due backlog reads the due range of ``kw_pending_due`` per tenant
  (:func:`kumiko_workflows.store.db.due_backlog`, counted up to
  :data:`DUE_CAP`), and the oldest due row one index probe per tenant;
- the workers are the heartbeat table (a row per worker process), their
  ages on the database's clock.

The event table is never read: runs carry when they started and finished.
Runs purged by retention are gone from the figures as they are from the lists.
Pure reads; the admin draws them (:mod:`kumiko_workflows.operations.charts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Min
from django.db.models.functions import Trunc
from django.utils import timezone

from kumiko_workflows.models import RunStatus, WorkerHeartbeat, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations.explain import humanize
from kumiko_workflows.store import db

#: What the charts count, in the order they are drawn.
KINDS = ("started", "completed", "failed", "cancelled")
#: Finished statuses, by the kind they count as.
_FINISHED = {
    RunStatus.COMPLETED: "completed",
    RunStatus.FAILED: "failed",
    RunStatus.CANCELLED: "cancelled",
}
#: Due rows counted per tenant up to this many (as the due-backlog gauge does).
DUE_CAP = 100_000
#: Failure reasons listed, most frequent first.
TOP_REASONS = 5
#: A heartbeat older than this many seconds is called stale on the dashboard.
STALE_AFTER = 60


@dataclass
class Series:
    """Counts per bucket (an hour or a day), for each of :data:`KINDS`."""

    unit: str
    starts: list[datetime]
    counts: dict[str, list[int]]

    def total(self, kind: str) -> int:
        return sum(self.counts[kind])

    def peak(self) -> int:
        return max((max(values) for values in self.counts.values() if values), default=0)


@dataclass
class Figures:
    """One workflow's figures (or every workflow's, ``name`` empty)."""

    name: str
    hourly: Series
    daily: Series
    due: int = 0
    oldest_due: datetime | None = None
    reasons: dict[str, int] = field(default_factory=dict)
    reasons_24h: dict[str, int] = field(default_factory=dict)

    def failure_rate(self, series: Series) -> float | None:
        """Failed runs among the runs that finished in ``series`` (None: none finished)."""
        done = series.total("completed") + series.total("failed")
        return None if not done else series.total("failed") / done

    @property
    def rate_24h(self) -> float | None:
        return self.failure_rate(self.hourly)

    @property
    def rate_30d(self) -> float | None:
        return self.failure_rate(self.daily)

    def top_reasons(self, limit: int = TOP_REASONS) -> list[tuple[str, int]]:
        return sorted(self.reasons.items(), key=lambda item: (-item[1], item[0]))[:limit]


@dataclass
class Dashboard:
    now: datetime
    tenant: str | None
    #: Every workflow's figures together.
    overall: Figures
    #: Per workflow, by name.
    workflows: list[Figures]
    #: Due rows, per tenant counted up to :data:`DUE_CAP` (``due_capped``: a cap was hit).
    due: int
    due_capped: bool
    #: The oldest due row: run id, tenant, workflow, step, since, lag (or None).
    oldest_due: dict[str, Any] | None
    workers: list[dict[str, Any]]


def hour_starts(now: datetime, hours: int = 24) -> list[datetime]:
    """The starts of the last ``hours`` hours in the current time zone, the current one last."""
    zone = timezone.get_current_timezone()
    local = timezone.localtime(now).replace(minute=0, second=0, microsecond=0)
    # Hours counted in UTC, so a day with a clock change has its 23 or 25 hours.
    last = local.astimezone(UTC)
    return [(last - timedelta(hours=back)).astimezone(zone) for back in range(hours - 1, -1, -1)]


def day_starts(now: datetime, days: int = 30) -> list[datetime]:
    """The starts (local midnights) of the last ``days`` days, today last."""
    zone = timezone.get_current_timezone()
    today = timezone.localtime(now).date()
    midnight = datetime.min.time()
    return [
        timezone.make_aware(datetime.combine(today - timedelta(days=back), midnight), zone)
        for back in range(days - 1, -1, -1)
    ]


def _empty(unit: str, starts: list[datetime]) -> Series:
    return Series(unit, starts, {kind: [0] * len(starts) for kind in KINDS})


def _runs(tenant: str | None, workflow: str | None) -> Any:
    runs = WorkflowRun.objects.for_tenant(tenant)
    return runs if workflow is None else runs.filter(workflow_name=workflow)


def _index(starts: list[datetime], bucket: datetime) -> int | None:
    """The position of ``bucket`` (a truncated instant) among ``starts``, or None."""
    for i, start in enumerate(starts):
        if start == bucket:
            return i
    return None


def _fill(
    tenant: str | None,
    workflow: str | None,
    now: datetime,
    unit: str,
    starts: list[datetime],
    by_name: dict[str, Figures],
    overall: Figures,
) -> None:
    """Count runs started and finished per ``unit`` since ``starts[0]``, into the figures."""
    zone = timezone.get_current_timezone()
    since = starts[0]
    runs = _runs(tenant, workflow)

    def series(name: str) -> Series:
        figures = by_name.get(name)
        if figures is None:
            figures = by_name[name] = Figures(
                name, _empty("hour", hour_starts(now)), _empty("day", day_starts(now))
            )
        return figures.hourly if unit == "hour" else figures.daily

    started = (
        runs.filter(started_at__gte=since, started_at__lte=now)
        .annotate(bucket=Trunc("started_at", unit, tzinfo=zone))
        .order_by()
        .values_list("workflow_name", "bucket")
        .annotate(n=Count("pk"))
    )
    positions: dict[datetime, int | None] = {}
    for name, bucket, n in started:
        at = positions.setdefault(bucket, _index(starts, bucket))
        if at is None:
            continue
        series(name).counts["started"][at] += n
        (overall.hourly if unit == "hour" else overall.daily).counts["started"][at] += n

    finished = (
        runs.filter(finished_at__gte=since, finished_at__lte=now)
        .annotate(bucket=Trunc("finished_at", unit, tzinfo=zone))
        .order_by()
        .values_list("workflow_name", "bucket", "status", "failure_reason")
        .annotate(n=Count("pk"))
    )
    for name, bucket, status, reason, n in finished:
        kind = _FINISHED.get(status)
        at = positions.setdefault(bucket, _index(starts, bucket))
        if kind is None or at is None:
            continue
        series(name).counts[kind][at] += n
        (overall.hourly if unit == "hour" else overall.daily).counts[kind][at] += n
        if kind == "failed":
            for figures in (by_name[name], overall):
                reasons = figures.reasons if unit == "day" else figures.reasons_24h
                key = reason or "(no reason recorded)"
                reasons[key] = reasons.get(key, 0) + n


def due_backlog(tenant: str | None, now: datetime) -> tuple[int, bool]:
    """Due pending rows (each tenant counted up to :data:`DUE_CAP`), and whether a cap was hit."""
    counts = [
        count
        for each, count in db.due_backlog(now, DUE_CAP)
        if count and (tenant is None or each == tenant)
    ]
    return sum(counts), any(count >= DUE_CAP for count in counts)


def due_by_tenant(tenant: str | None, now: datetime) -> dict[str, int]:
    """The backlog per tenant: due rows of each tenant that has some, largest first.

    Counted up to :data:`DUE_CAP` each, one index range per tenant (see
    ``db.due_backlog``). A pass takes a turn of each of them in turn.
    """
    rows = [
        (each, count)
        for each, count in db.due_backlog(now, DUE_CAP)
        if count and (tenant is None or each == tenant)
    ]
    return dict(sorted(rows, key=lambda row: (-row[1], row[0])))


def oldest_due(tenant: str | None, now: datetime) -> dict[str, Any] | None:
    """The oldest due pending row and how long it has waited for a worker (its lag), or None.

    Without a tenant, one probe of ``kw_pending_due`` per tenant that has due
    rows (the index leads with the tenant), the oldest of them kept.
    """
    tenants = [tenant] if tenant is not None else db.due_tenants(now)
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


def workers(tenant: str | None = None, host: str | None = None) -> list[dict[str, Any]]:
    """The workers' heartbeats, freshest first: those serving ``tenant``, on ``host``.

    Their age is measured on the database's clock, as they were written
    (:meth:`kumiko_workflows.engine.worker.Heartbeat.beat`).
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


def _due_per_workflow(tenant: str | None, workflow: str | None, now: datetime) -> list[Any]:
    pending = WorkflowRunPending.objects.for_tenant(tenant).due(now)
    if workflow is not None:
        pending = pending.filter(workflow_name=workflow)
    return list(
        pending.order_by()
        .values_list("workflow_name")
        .annotate(n=Count("pk"), oldest=Min("wake_at"))
    )


def dashboard(tenant: str | None, now: datetime, workflow: str | None = None) -> Dashboard:
    """Every figure of the dashboard, for ``tenant`` (None: all) and ``workflow`` (None: all)."""
    by_name: dict[str, Figures] = {}
    overall = Figures("", _empty("hour", hour_starts(now)), _empty("day", day_starts(now)))
    _fill(tenant, workflow, now, "hour", overall.hourly.starts, by_name, overall)
    _fill(tenant, workflow, now, "day", overall.daily.starts, by_name, overall)
    for name, n, oldest in _due_per_workflow(tenant, workflow, now):
        figures = by_name.get(name)
        if figures is None:
            figures = by_name[name] = Figures(
                name, _empty("hour", hour_starts(now)), _empty("day", day_starts(now))
            )
        figures.due, figures.oldest_due = n, oldest
    if workflow is None:
        due, capped = due_backlog(tenant, now)
        oldest = oldest_due(tenant, now)
    else:
        due, capped = sum(figures.due for figures in by_name.values()), False
        found = by_name.get(workflow)
        oldest = None
        if found is not None and found.oldest_due is not None:
            lag = now - found.oldest_due
            oldest = {
                "workflow_name": workflow,
                "due_since": found.oldest_due.isoformat(),
                "lag_seconds": round(lag.total_seconds(), 3),
                "lag": humanize(lag),
            }
    overall.due = due
    return Dashboard(
        now=now,
        tenant=tenant,
        overall=overall,
        workflows=[by_name[name] for name in sorted(by_name)],
        due=due,
        due_capped=capped,
        oldest_due=oldest,
        workers=workers(tenant),
    )
