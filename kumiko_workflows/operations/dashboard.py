"""The admin dashboard's figures: runs per hour and per day, the due backlog, failures, workers.

Each figure is a grouped query over a time range of an index, so a page
costs what the range holds, never what the tables hold:

- runs started per hour over the last 24 hours, and per day today, read the
  range of ``kw_run_started`` (``started_at, tenant_id, workflow_name``:
  the index alone answers);
- runs completed, failed and cancelled, the failure rate and the failure
  reasons, the range of ``kw_run_finished`` (``finished_at, tenant_id,
  workflow_name, status, failure_reason``, finished runs only);
- the 29 days before today are counted once each, an hour after the day
  ends, and kept (:class:`~kumiko_workflows.models.RunDay`): the 30-day
  chart then reads 29 kept days and counts only today. The first view
  after a deploy counts the month once;
- the failure reasons present read ``kw_run_failure_reason`` (failed runs
  only), one probe per known reason;
- the due backlog reads the due range of ``kw_pending_due`` per tenant
  (:func:`kumiko_workflows.store.claims.due_backlog`, counted up to
  :data:`DUE_CAP`), and the oldest due row one index probe per tenant;
- the workers are the heartbeat table (a row per worker process), their
  ages on the database's clock.

The event table is never read: runs carry when they started and finished.
Runs purged by retention are gone from the live figures as from the lists
(a kept day keeps what it counted). Pure reads but for the kept days; the
admin draws them (:mod:`kumiko_workflows.operations.charts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Sum
from django.db.models.functions import Trunc
from django.utils import timezone

from kumiko_workflows.models import (
    RunDay,
    RunStatus,
    WorkflowRun,
    WorkflowRunPending,
)
from kumiko_workflows.operations.status import DUE_CAP, due_by_tenant, oldest_due, workers
from kumiko_workflows.operations.words import humanize
from kumiko_workflows.store import db
from kumiko_workflows.store.streams import FAILURE_REASONS

#: What the charts count, in the order they are drawn.
KINDS = ("started", "completed", "failed", "cancelled")
#: Finished statuses, by the kind they count as.
_FINISHED = {
    RunStatus.COMPLETED: "completed",
    RunStatus.FAILED: "failed",
    RunStatus.CANCELLED: "cancelled",
}
#: Failure reasons listed, most frequent first.
TOP_REASONS = 5
#: A day's counts are kept (:class:`RunDay`) once it has been over this long.
SETTLE = timedelta(hours=1)
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


class _Tally:
    """Adds counts into the figures: per workflow (made as met) and overall."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.hours = hour_starts(now)
        self.days = day_starts(now)
        self.by_name: dict[str, Figures] = {}
        self.overall = self.figures_for("")

    def figures_for(self, name: str) -> Figures:
        return Figures(name, _empty("hour", self.hours), _empty("day", self.days))

    def named(self, name: str) -> Figures:
        found = self.by_name.get(name)
        if found is None:
            found = self.by_name[name] = self.figures_for(name)
        return found

    def add(self, unit: str, at: int, name: str, kind: str, n: int, reason: str = "") -> None:
        for figures in (self.named(name), self.overall):
            series = figures.hourly if unit == "hour" else figures.daily
            series.counts[kind][at] += n
            if kind == "failed":
                reasons = figures.reasons if unit == "day" else figures.reasons_24h
                key = reason or "(no reason recorded)"
                reasons[key] = reasons.get(key, 0) + n


def _finished(runs: Any, column: str, since: datetime, until: datetime) -> Any:
    return runs.filter(**{f"{column}__gte": since, f"{column}__lt": until})


def _count_live(
    tally: _Tally,
    runs: Any,
    unit: str,
    starts: list[datetime],
    until: datetime,
    days_too: Sequence[datetime] = (),
) -> None:
    """Count runs started and finished per ``unit`` from ``starts[0]`` to ``until``, live.

    Hours are added to the days of ``days_too`` they fall in as well (the
    days the last 24 hours hold whole, today's part: one read for both).
    """
    zone = timezone.get_current_timezone()
    positions = {start: i for i, start in enumerate(starts)}
    offset = (tally.hours if unit == "hour" else tally.days).index(starts[0])
    day_of: dict[int, int] = {}
    for hour_at, hour in enumerate(starts if unit == "hour" else ()):
        inside = [day for day in days_too if day <= hour < _day_end(day)]
        if inside:
            day_of[hour_at] = tally.days.index(inside[0])
    started = (
        _finished(runs, "started_at", starts[0], until)
        .annotate(bucket=Trunc("started_at", unit, tzinfo=zone))
        .order_by()
        .values_list("workflow_name", "bucket")
        .annotate(n=Count("pk"))
    )
    for name, bucket, n in started:
        if bucket in positions:
            at = positions[bucket]
            tally.add(unit, offset + at, name, "started", n)
            if at in day_of:
                tally.add("day", day_of[at], name, "started", n)
    finished = (
        _finished(runs, "finished_at", starts[0], until)
        .annotate(bucket=Trunc("finished_at", unit, tzinfo=zone))
        .order_by()
        .values_list("workflow_name", "bucket", "status", "failure_reason")
        .annotate(n=Count("pk"))
    )
    for name, bucket, status, reason, n in finished:
        kind = _FINISHED.get(status)
        if kind is not None and bucket in positions:
            at = positions[bucket]
            tally.add(unit, offset + at, name, kind, n, reason)
            if at in day_of:
                tally.add("day", day_of[at], name, kind, n, reason)


def _day_end(start: datetime) -> datetime:
    following = timezone.localtime(start).date() + timedelta(days=1)
    return timezone.make_aware(datetime.combine(following, datetime.min.time()))


def keep_days(starts: Sequence[datetime], now: datetime) -> None:
    """Count every tenant's runs of the local days from ``starts`` and keep them (:class:`RunDay`).

    Two grouped reads of the days' range of the run indexes (by tenant,
    workflow and day), whatever the number of days; the rows and each day's
    marker are inserted together, ignoring conflicts, so two views counting
    one day at once keep one copy.
    """
    if not starts:
        return
    zone = timezone.get_current_timezone()
    zone_name = timezone.get_current_timezone_name()
    wanted = {timezone.localtime(start).date() for start in starts}
    since, until = min(starts), _day_end(max(starts))
    rows: dict[tuple[str, str, Any, str], RunDay] = {}

    def row(tenant: str, name: str, bucket: datetime, reason: str = "") -> RunDay | None:
        day = timezone.localtime(bucket).date()
        if day not in wanted:
            return None  # a day between the missing ones, kept already
        found = rows.get((tenant, name, day, reason))
        if found is None:
            found = rows[(tenant, name, day, reason)] = RunDay(
                tenant_id=tenant,
                zone=zone_name,
                day=day,
                workflow_name=name,
                failure_reason=reason,
                counted_at=now,
            )
        return found

    runs = WorkflowRun.objects.all()
    started = (
        _finished(runs, "started_at", since, until)
        .annotate(bucket=Trunc("started_at", "day", tzinfo=zone))
        .order_by()
        .values_list("tenant_id", "workflow_name", "bucket")
        .annotate(n=Count("pk"))
    )
    for tenant, name, bucket, n in started:
        kept = row(tenant, name, bucket)
        if kept is not None:
            kept.started += n
    finished = (
        _finished(runs, "finished_at", since, until)
        .annotate(bucket=Trunc("finished_at", "day", tzinfo=zone))
        .order_by()
        .values_list("tenant_id", "workflow_name", "bucket", "status", "failure_reason")
        .annotate(n=Count("pk"))
    )
    for tenant, name, bucket, status, reason, n in finished:
        kind = _FINISHED.get(status)
        if kind is None:
            continue
        kept = row(
            tenant,
            name,
            bucket,
            (reason or "(no reason recorded)")[:64] if kind == "failed" else "",
        )
        if kept is not None:
            setattr(kept, kind, getattr(kept, kind) + n)
    markers = [
        RunDay(tenant_id="", zone=zone_name, day=day, workflow_name="", counted_at=now)
        for day in sorted(wanted)
    ]
    with db.atomic():
        RunDay.objects.bulk_create([*rows.values(), *markers], ignore_conflicts=True)


def _count_kept(
    tally: _Tally, tenant: str | None, workflow: str | None, starts: list[datetime]
) -> None:
    """Add the kept counts of the days from ``starts``, counting the days not yet kept."""
    zone = timezone.get_current_timezone_name()
    days = {timezone.localtime(start).date(): start for start in starts}
    kept = RunDay.objects.filter(zone=zone, day__in=list(days))
    counted = set(kept.filter(workflow_name="", tenant_id="").values_list("day", flat=True))
    keep_days([start for day, start in days.items() if day not in counted], tally.now)
    rows = kept.exclude(workflow_name="")
    if tenant is not None:
        rows = rows.filter(tenant_id=tenant)
    if workflow is not None:
        rows = rows.filter(workflow_name=workflow)
    position = {day: tally.days.index(start) for day, start in days.items()}
    # Summed in SQL over the tenants: a row per day, workflow and reason.
    summed = (
        rows.order_by()
        .values_list("day", "workflow_name", "failure_reason")
        .annotate(
            started_n=Sum("started"),
            completed_n=Sum("completed"),
            cancelled_n=Sum("cancelled"),
            failed_n=Sum("failed"),
        )
    )
    for day, name, reason, started, completed, cancelled, failed in summed:
        at = position[day]
        for kind, n in (("started", started), ("completed", completed), ("cancelled", cancelled)):
            if n:
                tally.add("day", at, name, kind, n)
        if failed:
            tally.add("day", at, name, "failed", failed, reason)


def failure_reasons_present(runs: Any = None) -> list[str]:
    """The failure reasons that failed runs (of ``runs``, default all) have, in the known order.

    One probe of ``kw_run_failure_reason`` (failed runs only) per known
    reason: the run list's filter offers only these, whatever the table's
    size. ``runs``: a queryset of runs (the admin's, scoped to a tenant).
    """
    failed = (WorkflowRun.objects.all() if runs is None else runs).filter(status=RunStatus.FAILED)
    return [reason for reason in FAILURE_REASONS if failed.filter(failure_reason=reason).exists()]


def _due_per_workflow(
    tenants: Sequence[str], workflow: str | None, now: datetime
) -> list[tuple[str, int, datetime]]:
    """Due rows per workflow, and the oldest's wake time: the due range of ``kw_pending_due``
    of each tenant that has due rows (never the rows due later)."""
    found: dict[str, tuple[int, datetime]] = {}
    for tenant in tenants:
        pending = WorkflowRunPending.objects.filter(tenant_id=tenant).due(now)
        if workflow is not None:
            pending = pending.filter(workflow_name=workflow)
        grouped = pending.order_by().values_list("workflow_name")
        for name, n, oldest in grouped.annotate(n=Count("pk"), oldest=Min("wake_at")):
            before = found.get(name)
            if before is not None:
                n, oldest = n + before[0], min(oldest, before[1])
            found[name] = (n, oldest)
    return [(name, n, oldest) for name, (n, oldest) in sorted(found.items())]


def dashboard(tenant: str | None, now: datetime, workflow: str | None = None) -> Dashboard:
    """Every figure of the dashboard, for ``tenant`` (None: all) and ``workflow`` (None: all)."""
    tally = _Tally(now)
    runs = _runs(tenant, workflow)
    settled = [start for start in tally.days if _day_end(start) + SETTLE <= now]
    unsettled = tally.days[len(settled) :]
    # Today (and a day over for less than an hour, if the last 24 hours hold
    # all of it) is counted from the hours; only a day they do not hold is read.
    within = [start for start in unsettled if start >= tally.hours[0]]
    _count_live(tally, runs, "hour", tally.hours, now, within)
    _count_kept(tally, tenant, workflow, settled)
    rest = [start for start in unsettled if start not in within]
    if rest:
        _count_live(tally, runs, "day", rest, _day_end(rest[-1]))
    by_name, overall = tally.by_name, tally.overall
    backlog = due_by_tenant(tenant, now)
    for name, n, since in _due_per_workflow(list(backlog), workflow, now):
        figures = tally.named(name)
        figures.due, figures.oldest_due = n, since
    oldest: dict[str, Any] | None
    if workflow is None:
        due = sum(backlog.values())
        capped = any(count >= DUE_CAP for count in backlog.values())
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
