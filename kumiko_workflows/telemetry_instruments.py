"""The telemetry's vocabulary and its metric instruments, from one pair of providers.

The attribute keys spans and metrics share, the instruments the engine
records with (counters, histograms with their advised buckets) and the
gauges read when a metric reader collects (the due backlog, the runs a
limit holds back). :mod:`kumiko_workflows.telemetry` makes them from the
providers it is configured with, and its hooks record with them. Nothing of
OpenTelemetry is imported without its API installed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from django.utils import timezone

from kumiko_workflows import __version__
from kumiko_workflows.store import claims, db, slots

try:
    from opentelemetry import metrics, trace
except ImportError:  # the optional extra is not installed: no instruments are made
    metrics = trace = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

# Attribute keys, on spans and metrics alike.
RUN_ID = "kumiko.run_id"
WORKFLOW = "kumiko.workflow"
VERSION = "kumiko.workflow_version"
TENANT = "kumiko.tenant"
STEP = "kumiko.step"
STEP_KIND = "kumiko.step_kind"
ATTEMPT = "kumiko.attempt"
OUTCOME = "kumiko.outcome"
SUSPENSION = "kumiko.suspension"
REASON = "kumiko.failure_reason"
CONFLICT = "kumiko.conflict"
ERROR_KIND = "kumiko.error"
ERROR_TYPE = "error.type"  # OpenTelemetry's semantic convention for the error class

#: Most due rows the backlog gauge counts per tenant, so a scrape stays cheap.
BACKLOG_CAP = 100_000
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Instruments:
    """The tracer and the metric instruments, from one pair of providers."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self.tracer = trace.get_tracer("kumiko_workflows", __version__, tracer_provider)
        meter = metrics.get_meter("kumiko_workflows", __version__, meter_provider)
        runs = "{run}"
        self.started = meter.create_counter("kumiko.runs.started", runs, "Runs started")
        self.completed = meter.create_counter("kumiko.runs.completed", runs, "Runs completed")
        self.failed = meter.create_counter("kumiko.runs.failed", runs, "Runs failed, by reason")
        self.cancelled = meter.create_counter("kumiko.runs.cancelled", runs, "Runs cancelled")
        self.resumes = meter.create_counter(
            "kumiko.resumes", runs, "Suspensions resumed by a worker"
        )
        self.conflicts = meter.create_counter(
            "kumiko.claim.conflicts",
            "{conflict}",
            "Appends that lost a race for a stream version, by kind",
        )
        self.resume_lag = meter.create_histogram(
            "kumiko.resume.lag",
            "s",
            "From the moment a suspension was due to the moment a worker resumed it",
            explicit_bucket_boundaries_advisory=LAG_BUCKETS,
        )
        self.step_duration = meter.create_histogram(
            "kumiko.step.duration",
            "s",
            "How long a step ran, by workflow, step and outcome",
            explicit_bucket_boundaries_advisory=STEP_BUCKETS,
        )
        self.passes = meter.create_counter(
            "kumiko.worker.passes", "{pass}", "Passes of resume_due_runs workers"
        )
        self.worker_errors = meter.create_counter(
            "kumiko.worker.errors", "{error}", "Errors of resume_due_runs workers, by kind"
        )
        self.slots_fired = meter.create_counter(
            "kumiko.cron.slots_fired", "{slot}", "Cron slots fired"
        )
        meter.create_observable_gauge(
            "kumiko.runs.due",
            [_observe_due],
            runs,
            f"Due runs waiting for a worker, per tenant (counted up to {BACKLOG_CAP:,})",
        )
        meter.create_observable_gauge(
            "kumiko.runs.queued",
            [_observe_queued],
            runs,
            "Runs a flow-control limit holds back, per tenant and kind "
            "(limited: queued for a concurrency slot; rate: waiting for the rate limit)",
        )


# --- the due backlog gauge ------------------------------------------------------------


def _observe_due(options: Any) -> Iterable[Any]:
    """Due rows per tenant, read when a metric reader collects (a scrape, an export)."""
    rows = _read("due backlog", lambda: claims.due_backlog(timezone.now(), BACKLOG_CAP))
    return [metrics.Observation(count, {TENANT: tenant}) for tenant, count in rows]


def _observe_queued(options: Any) -> Iterable[Any]:
    """Runs held back by a concurrency or rate limit, per tenant and kind, read when collected."""
    return [
        metrics.Observation(count, {TENANT: tenant, SUSPENSION: kind})
        for tenant, kind, count in _read("queued runs", slots.held_back_by_tenant)
    ]


def _read(what: str, query: Callable[[], list[Any]]) -> list[Any]:
    """A gauge's rows, or none: a collecting thread's failure never reaches the reader."""
    connection = db.engine()
    opened = connection.connection is None
    try:
        return query()
    except Exception as exc:
        # The reader's thread may have no usable connection (or none allowed):
        # no observation this time, and the reader carries on.
        logger.warning("%s not observed: %s", what, type(exc).__name__)
        return []
    finally:
        # A reader's thread (an exporter's, a scrape's) must not keep a connection open.
        if opened and not connection.in_atomic_block:
            connection.close()
