"""The ``dashboard`` scenario: the admin dashboard's queries on a large store.

N runs (default 1,000,000) over 90 days in 10 tenants and 8 workflows, ten
events each (10 × N in the event table), a pending row for each waiting run
(a twentieth of them due), four worker heartbeats: written by ``INSERT ...
SELECT`` over ``generate_series`` (a recursive CTE on SQLite), so building a
million runs takes seconds, not hours. Then each page's figures are timed:
the dashboard for a superuser (every tenant), for one tenant, for one
workflow, the run list's failure-reason filter, whole admin pages (the
dashboard, a workflow's page, and each list they link into:
:func:`linked_lists`), and the same again after ``VACUUM ANALYZE``
(PostgreSQL), for design rule 12: the plans may not need statistics.
The bench prints the median and p95 of each, and the plan of the two big
counts (which index serves them).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, timedelta
from typing import Any

from django.db import connection

from kumiko_workflows.models import Event, WorkerHeartbeat, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations.dashboard import dashboard, failure_reasons_present

TENANTS = 10
WORKFLOWS = 8
EVENTS_PER_RUN = 10
DAYS = 90
#: Each timing is the median of this many calls (after one warm-up).
TRIALS = 9
REASONS = ("step_failed", "invalid_step_argument", "workflow_definition_changed", "internal_error")


def _quote(model: type[Any]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _series(count: int) -> tuple[str, str, list[Any]]:
    """(WITH prefix, FROM clause, params) of the numbers 1..count, on this vendor."""
    if connection.vendor == "postgresql":
        return "", "generate_series(1, %s) AS g(i)", [count]
    return (
        "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < %s) ",
        "g",
        [count],
    )


@contextmanager
def _indexes_built_after(*models: type[Any]) -> Iterator[None]:
    """PostgreSQL: drop the tables' plain indexes, fill the tables, build the indexes again.

    One sort per index after the load is much faster than keeping each
    index up to date row by row; constraint indexes (primary and unique
    keys) stay. Elsewhere nothing changes.
    """
    if connection.vendor != "postgresql":
        yield
        return
    tables = [model._meta.db_table for model in models]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.tablename = ANY(%s) "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)",
            [tables],
        )
        found = cursor.fetchall()
        for name, _ in found:
            cursor.execute(f"DROP INDEX {connection.ops.quote_name(name)}")
    yield
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '512MB'")
        for _, definition in found:
            cursor.execute(definition)


def seed(runs: int, now: Any) -> None:
    """Write the scenario's runs, events, pending rows and heartbeats."""
    with _indexes_built_after(WorkflowRun, Event, WorkflowRunPending):
        _seed(runs, now)
    _heartbeats(now)


def _seed(runs: int, now: Any) -> None:
    pg = connection.vendor == "postgresql"
    run, event, pending = _quote(WorkflowRun), _quote(Event), _quote(WorkflowRunPending)
    status = (
        "CASE WHEN i %% 100 < 80 THEN 'completed' WHEN i %% 100 < 85 THEN 'failed' "
        "WHEN i %% 100 < 87 THEN 'cancelled' WHEN i %% 100 < 97 THEN 'waiting' ELSE 'running' END"
    )
    reasons = " ".join(f"WHEN {n} THEN '{reason}'" for n, reason in enumerate(REASONS))
    add: Callable[[str, str], str]
    if pg:
        uuid, text = "gen_random_uuid()", "i::text"
        started = f"%s::timestamptz - (i::float8 / %s) * interval '{DAYS} days'"
        seconds = "* interval '1 second'"
        add = lambda column, amount: f"{column} + ({amount}) {seconds}"  # noqa: E731
    else:
        uuid, text = "lower(hex(randomblob(16)))", "CAST(i AS TEXT)"
        started = f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', julianday(%s) - (i * 1.0 / %s) * {DAYS})"
        add = lambda column, amount: (  # noqa: E731
            f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', julianday({column}) + ({amount}) / 86400.0)"
        )
    stamp = now if pg else connection.ops.adapt_datetimefield_value(now)
    with_, source, params = _series(runs)
    with connection.cursor() as cursor:
        cursor.execute(
            f"{with_}INSERT INTO {run} (run_id, tenant_id, workflow_name, workflow_version, "  # noqa: S608
            "idempotency_key, search_key, status, step, suspension_type, wake_at, "
            "awaited_event_type, retry_attempt, failure_reason, error_class, last_error, "
            "definition_fingerprint, trigger_event_id, version, started_at, updated_at, "
            "finished_at, parent_group) "
            f"SELECT {uuid}, 'bench-tenant-' || (i %% {TENANTS}), 'bench-workflow-' || "
            f"(i %% {WORKFLOWS}), 1, 'k' || {text}, 'k' || {text}, s.status, "
            "CASE WHEN s.status IN ('waiting', 'failed', 'running') THEN '1' ELSE '' END, "
            "CASE WHEN s.status = 'waiting' THEN 'wait' ELSE '' END, NULL, '', 0, "
            f"CASE WHEN s.status = 'failed' THEN CASE i %% {len(REASONS)} {reasons} END "
            f"ELSE '' END, '', '', 'bench', NULL, {EVENTS_PER_RUN}, s.started, s.started, "
            "CASE WHEN s.status IN ('completed', 'failed', 'cancelled') "
            f"THEN {add('s.started', 'i %% 600')} END, '' "
            f"FROM (SELECT i, {status} AS status, {started} AS started FROM {source}) s",
            [stamp, runs, *params] if pg else [*params, stamp, runs],
        )
        cursor.execute(
            f"{_series(EVENTS_PER_RUN)[0]}INSERT INTO {event} (tenant_id, aggregate_id, "  # noqa: S608
            "aggregate_type, version, type, event_version, payload, metadata, created_by, "
            "created_at) "
            "SELECT r.tenant_id, r.run_id, 'workflow-run', i, CASE WHEN i = 1 THEN "
            "'workflow.run-started' WHEN i %% 2 = 0 THEN 'workflow.step.waiting' ELSE "
            f"'workflow.step.resumed' END, 1, '{{}}', '{{}}', '', {add('r.started_at', 'i')} "
            f"FROM {run} r CROSS JOIN {_series(EVENTS_PER_RUN)[1]}",
            [EVENTS_PER_RUN],
        )
        cursor.execute(
            f"INSERT INTO {pending} (tenant_id, run_id, step, workflow_name, workflow_version, "  # noqa: S608
            "suspension_type, wake_at, timeout_at, retry_attempt, definition_fingerprint, "
            "wait_event_type, awaits_key, match_expr, awaited_event_id, match_scan, "
            "trigger_event_id, run_version, state, suspended_at, due_since, resume_errors) "
            f"SELECT r.tenant_id, r.run_id, '1', r.workflow_name, 1, 'wait', "
            f"{add('%s', '3600 + length(r.idempotency_key) * 7')}, NULL, 0, "
            "'bench', '', '', NULL, NULL, false, NULL, r.version, '{}', r.started_at, NULL, 0 "
            f"FROM {run} r WHERE r.status = 'waiting'",
            [stamp],
        )
        # A twentieth of the waiting runs due, for up to an hour. On PostgreSQL
        # in plain UTC timestamps: Citus refuses timestamptz + interval (a STABLE
        # function) over a column in an UPDATE.
        due, due_stamp = add("%s", "-60 - id %% 3600"), stamp
        if pg:
            due = "(%s::timestamp + (-60 - id %% 3600) * interval '1 second') AT TIME ZONE 'UTC'"
            due_stamp = now.astimezone(UTC).replace(tzinfo=None)
        cursor.execute(
            f"UPDATE {pending} SET wake_at = {due} WHERE id %% 20 = 0",  # noqa: S608
            [due_stamp],
        )


def _heartbeats(now: Any) -> None:
    WorkerHeartbeat.objects.bulk_create(
        [
            WorkerHeartbeat(
                name=f"bench-host:{pid}",
                hostname="bench-host",
                pid=pid,
                tenants=[],
                loop=True,
                started_at=now,
                seen_at=now,
            )
            for pid in range(100, 104)
        ]
    )


def timed(fn: Callable[[], Any]) -> tuple[float, float, float]:
    """(first, median, p95) in milliseconds of ``fn``: its first call, then :data:`TRIALS` more.

    The dashboard's first view counts the past days it has not kept yet
    (:class:`~kumiko_workflows.models.RunDay`); the later ones read them.
    """
    started = time.perf_counter()
    fn()
    first = (time.perf_counter() - started) * 1000
    times = []
    for _ in range(TRIALS):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return first, statistics.median(times), p95


def pages(now: Any) -> dict[str, Callable[[], Any]]:
    """The pages timed: the figures each reads, and whole admin pages (HTTP through Django).

    ``page_*`` asks the admin for the page with Django's test client as a
    superuser: the figures, the SVG charts, the templates, the middleware.
    """
    from django.contrib.auth import get_user_model
    from django.test import Client

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench").first()
    if user is None:
        user = user_model.objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)

    def get(url: str) -> Callable[[], Any]:
        def fetch() -> Any:
            response = client.get(url)
            if response.status_code != 200:
                raise RuntimeError(f"GET {url} answered {response.status_code}")
            return response

        return fetch

    admin = "/admin/kumiko_workflows/workflowrun"
    return {
        "dashboard_all": lambda: dashboard(None, now),
        "dashboard_tenant": lambda: dashboard("bench-tenant-3", now),
        "dashboard_workflow": lambda: dashboard(None, now, "bench-workflow-5"),
        "reason_filter": lambda: failure_reasons_present(),
        "page_dashboard": get(f"{admin}/dashboard/"),
        "page_dashboard_workflow": get(f"{admin}/dashboard/?workflow=bench-workflow-5"),
        "page_workflow": get(f"{admin}/workflows/bench-workflow-5/"),
        **{f"page_{name}": get(url) for name, url in linked_lists(now).items()},
    }


def linked_lists(now: Any) -> dict[str, str]:
    """The lists the dashboard and a workflow's page link into, one of each kind of link.

    Made by the links the pages make (:class:`~kumiko_workflows.admin.pictures.Links`):
    a bucket of the hourly chart three hours back and of the daily chart
    twenty days back (started, failed), a workflow's last 24 hours (started,
    failed), a failure reason over 30 days, a workflow's runs (all, waiting,
    failed: its page's links), the due pending rows; beside them the run
    list, the pending rows and the event log as a menu opens them.
    """
    from kumiko_workflows.admin.pictures import Links
    from kumiko_workflows.operations.dashboard import day_starts, hour_starts

    links = Links("admin")
    hour, day = hour_starts(now)[-4], day_starts(now)[-21]
    hour_end, day_end = hour + timedelta(hours=1), day_starts(now)[-20]
    since_24h, since_30d = hour_starts(now)[0].isoformat(), day_starts(now)[0].isoformat()
    flow = "bench-workflow-5"
    return {
        "runs": links.runs(),
        "runs_started_hour": links.runs(
            started_at__gte=hour.isoformat(), started_at__lt=hour_end.isoformat()
        ),
        "runs_started_day": links.runs(
            started_at__gte=day.isoformat(), started_at__lt=day_end.isoformat()
        ),
        "runs_failed_day": links.runs(
            status__exact="failed",
            finished_at__gte=day.isoformat(),
            finished_at__lt=day_end.isoformat(),
        ),
        "runs_workflow_24h": links.runs(workflow_name__exact=flow, started_at__gte=since_24h),
        "runs_workflow_failed_24h": links.runs(
            workflow_name__exact=flow, status__exact="failed", finished_at__gte=since_24h
        ),
        "runs_reason_30d": links.runs(
            status__exact="failed", failure_reason="step_failed", finished_at__gte=since_30d
        ),
        "runs_workflow": links.runs(workflow_name__exact=flow),
        "runs_workflow_waiting": links.runs(workflow_name__exact=flow, status__exact="waiting"),
        "runs_workflow_failed": links.runs(workflow_name__exact=flow, status__exact="failed"),
        "runs_failed": links.runs(status__exact="failed"),
        "pending_due": links.pending(wake_at__lte=now.isoformat()),
        "pending": links.pending(),
        "events": "/admin/kumiko_workflows/event/",
    }


def plans(now: Any) -> list[str]:
    """The plans of the 30-day counts and of the run list's first page, one line each (which
    index serves them)."""
    since = now - timedelta(days=30)
    found = []
    for column in ("started_at", "finished_at"):
        query = WorkflowRun.objects.filter(**{f"{column}__gte": since, f"{column}__lte": now})
        plan = query.values_list("workflow_name").order_by().explain()
        found.append(" | ".join(line.strip() for line in plan.splitlines()))
    first_page = WorkflowRun.objects.order_by("-updated_at", "-run_id")[:100]
    found.append(" | ".join(line.strip() for line in first_page.explain().splitlines()))
    return found
