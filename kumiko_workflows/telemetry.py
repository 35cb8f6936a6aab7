"""Traces and metrics through OpenTelemetry, when its API is installed; nothing otherwise.

With ``opentelemetry-api`` (``pip install kumiko-workflows[otel]``) the engine
makes a span for each run start, each resumed segment and each step, and
records the metrics listed in docs/howto/observability.md, through the providers
the site configured (OpenTelemetry's global ones unless :func:`configure`
names others). Without the package nothing of it is imported and every hook
here is a plain call that does nothing.

A run's spans stay linked across its suspensions: the start span's context
(a W3C ``traceparent``) rides in the run's state snapshot, which its pending
row and each later suspension carry, and each resumed segment links to it.
Spans and metrics hold names, ids, positions, outcomes, failure reasons and
error classes, never payload data nor an exception's message.

Run counts (started, completed, failed, cancelled), resumes and cron slots
are counted when the transaction that wrote them commits, never for work
rolled back; step durations and conflicts are measured as they happen.

The attribute keys and the metric instruments are
:mod:`kumiko_workflows.telemetry_instruments`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from typing import Any, TypeVar, cast

from kumiko_workflows.store import db
from kumiko_workflows.telemetry_instruments import (
    ATTEMPT,
    CONFLICT,
    ERROR_KIND,
    ERROR_TYPE,
    OUTCOME,
    REASON,
    RUN_ID,
    STEP,
    STEP_KIND,
    SUSPENSION,
    TENANT,
    VERSION,
    WORKFLOW,
    Instruments,
)
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import suspensions
from kumiko_workflows.workflow.step_kind import Suspend, path_text

try:
    from opentelemetry import context, metrics, trace
    from opentelemetry.metrics._internal import _ProxyMeterProvider
except ImportError:  # the optional extra is not installed: every hook is a no-op
    context = metrics = trace = None  # type: ignore[assignment]

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

#: The segment outcome a run event that suspends no run means; a suspending
#: event's is its record's (:func:`outcome_of`).
_OUTCOMES = {
    et.RUN_STARTED: "started",
    et.RUN_COMPLETED: "completed",
    et.RUN_FAILED: "failed",
}


#: The run counter (an :class:`Instruments` attribute) each run event adds one to.
_COUNTED = {
    et.RUN_STARTED: "started",
    et.RUN_COMPLETED: "completed",
    et.RUN_FAILED: "failed",
    et.RUN_CANCELLED: "cancelled",
}


def outcome_of(event_type: str) -> str | None:
    """The outcome label a run event gives its segment's span, or None (it changes none)."""
    found = _OUTCOMES.get(event_type)
    if found is not None:
        return found
    record = suspensions.for_event(event_type)
    return None if record is None else record.outcome


def configure(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Use these providers instead of OpenTelemetry's global ones; no arguments: the global ones.

    For tests, and for a site that keeps its own providers. A no-op without
    the API installed.
    """
    global _active
    if _global is None:
        return
    if tracer_provider is None and meter_provider is None:
        _active = _global
    else:
        _active = Instruments(tracer_provider, meter_provider)


@dataclass
class _Segment:
    """The span of the run start or resumed segment that is running, and its run's link."""

    span: Any
    run_id: Any  # None until a start appends its run's first event
    link: str | None  # the run's start span, as a traceparent
    outcome: str
    #: A resume's counts, added at its commit in one go (a start's go one by one).
    counts: list[tuple[Any, dict[str, Any]]] | None = None


_segment: ContextVar[_Segment | None] = ContextVar("kumiko_telemetry_segment", default=None)


def _traceparent(span: Any) -> str | None:
    if not span.is_recording():
        return None
    found = span.get_span_context()
    return f"00-{found.trace_id:032x}-{found.span_id:016x}-{int(found.trace_flags):02x}"


def _span_context(traceparent: Any) -> Any:
    """The span context a stored traceparent names, or None (absent, or not one)."""
    found = _TRACEPARENT.fullmatch(traceparent) if isinstance(traceparent, str) else None
    if found is None:
        return None
    trace_id, span_id = int(found[1], 16), int(found[2], 16)
    if not trace_id or not span_id:
        return None
    flags = trace.TraceFlags(int(found[3], 16))
    return trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)


def _error(span: Any, error_type: str, reason: str | None) -> None:
    """Mark ``span`` failed: the error class and the reason, never a message."""
    if span.is_recording():
        span.set_attribute(ERROR_TYPE, error_type)
        if reason:
            span.set_attribute(REASON, reason)
        span.set_status(trace.Status(trace.StatusCode.ERROR, reason or error_type))


def _at_commit(func: Callable[[], Any]) -> None:
    db.on_commit(func, robust=True)


def _current(span: Any) -> Any:
    """Make ``span`` the current one; the token :func:`_end` takes.

    Cheaper than ``start_as_current_span``'s context managers, on every step.
    """
    return context.attach(trace.set_span_in_context(span))


def _end(span: Any, token: Any, outcome: str) -> None:
    context.detach(token)
    span.set_attribute(OUTCOME, outcome)
    span.end()


_F = TypeVar("_F", bound=Callable[..., Any])


def _live() -> Instruments | None:
    """The instruments to record with; None while the global providers are the API's
    proxies (no SDK set up: nothing is recorded, so no span or attribute is built).

    In a worker's batch, the answer found at its start (:func:`counting_batch`).
    """
    batch = _batch_live.get()
    if batch is not None:
        return batch[0]
    active = _active
    if active is None or active is not _global:
        return active
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        if isinstance(metrics.get_meter_provider(), _ProxyMeterProvider):
            return None
    return active


#: A worker batch's committed counts ((counter, labels) -> n) and resume lags.
_Tally = tuple[dict[tuple[Any, tuple[tuple[str, Any], ...]], int], list[tuple[float, Any]]]
_tally: ContextVar[_Tally | None] = ContextVar("kumiko_telemetry_tally", default=None)
#: :func:`_live`'s answer for a worker's batch, found at its start (None: not in one).
_batch_live: ContextVar[tuple[Instruments | None] | None] = ContextVar(
    "kumiko_telemetry_batch_live", default=None
)


@contextmanager
def counting_batch() -> Iterator[None]:
    """Around a worker's batch: its resumes' counts, gathered at their commit (never for
    one rolled back), are added at the end, one increment per workflow and outcome; the
    lags one by one (a histogram takes values)."""
    active = _live()
    # Asked a few times a run, the providers' look-up is answered once a batch.
    resolved = _batch_live.set((active,))
    try:
        if active is None:
            yield
            return
        tally: _Tally = ({}, [])
        token = _tally.set(tally)
        try:
            yield
        finally:
            _tally.reset(token)
            _add(active, tally)
    finally:
        _batch_live.reset(resolved)


def _add(active: Instruments, tally: _Tally) -> None:
    for (counter, attributes), count in tally[0].items():
        counter.add(count, dict(attributes))
    for lag, labels in tally[1]:
        active.resume_lag.record(lag, labels)


# --- hooks of the engine --------------------------------------------------------


def traced_start(start_run: _F) -> _F:
    """Decorate ``start_run(workflow, event, ...)``: a span for each run start.

    Its parent is the span current where the trigger event was appended (a
    request's, a task's); it ends with the start's outcome.
    """
    if trace is None:
        return start_run

    @wraps(start_run)
    def start(workflow: Any, event: Any, *args: Any, **kwargs: Any) -> Any:
        active = _live()
        if active is None:
            return start_run(workflow, event, *args, **kwargs)
        attributes = {WORKFLOW: workflow.name, VERSION: workflow.version, TENANT: event.tenant_id}
        span = active.tracer.start_span(f"start {workflow.name}", attributes=attributes)
        token = _current(span)
        segment = _Segment(span, None, _traceparent(span), "filtered")
        running = _segment.set(segment)
        try:
            return start_run(workflow, event, *args, **kwargs)
        except BaseException as exc:
            segment.outcome = "error"
            _error(span, type(exc).__name__, None)
            raise
        finally:
            _segment.reset(running)
            _end(span, token, segment.outcome)

    return start  # type: ignore[return-value]


def traced_resume(resume_row: _F) -> _F:
    """Decorate ``resume_row(row, trigger, now)``: a span for each resumed segment.

    The span links to the run's start span (named in the row's state); a
    claimed resume counts in ``kumiko.resumes`` and ``kumiko.resume.lag`` at
    commit.
    """
    if trace is None:
        return resume_row

    @wraps(resume_row)
    def resume(row: Any, trigger: Any, now: datetime) -> tuple[str, bool]:
        active = _live()
        if active is None:
            return cast(tuple[str, bool], resume_row(row, trigger, now))
        state = row.state if isinstance(row.state, dict) else {}
        link = state.get("trace")
        start = _span_context(link)
        record = suspensions.for_type(row.suspension_type)
        attributes = {
            RUN_ID: str(row.run_id),
            WORKFLOW: row.workflow_name,
            TENANT: row.tenant_id,
            STEP: row.step,
            SUSPENSION: row.suspension_type,
            ATTEMPT: record.attempt(row) if record is not None else 1,
        }
        if row.workflow_version is not None:  # the version the run resumes on
            attributes[VERSION] = row.workflow_version
        span = active.tracer.start_span(
            f"resume {row.workflow_name}",
            attributes=attributes,
            links=[trace.Link(start)] if start is not None else None,
        )
        token = _current(span)
        counts: list[tuple[Any, dict[str, Any]]] = []
        segment = _Segment(span, row.run_id, link if start is not None else None, "error", counts)
        running = _segment.set(segment)
        try:
            segment.outcome, claimed = resume_row(row, trigger, now)
        except BaseException as exc:
            _error(span, type(exc).__name__, None)
            raise
        finally:
            _segment.reset(running)
            _end(span, token, segment.outcome)
        # Reached only when the resume returned: its writes commit with its caller's.
        labels = {WORKFLOW: row.workflow_name}
        lag = max(0.0, (now - row.wake_at).total_seconds()) if row.wake_at else 0.0
        if claimed:
            counts.append((active.resumes, labels))
        if counts:
            # In a worker's batch, joined to its counts at commit (added at its end).
            batch = _tally.get()
            tally: _Tally = batch if batch is not None else ({}, [])

            def count() -> None:
                for counter, attributes in counts:
                    key = (counter, tuple(attributes.items()))
                    tally[0][key] = tally[0].get(key, 0) + 1
                if claimed:
                    tally[1].append((lag, labels))
                if batch is None:
                    _add(active, tally)

            _at_commit(count)
        return segment.outcome, claimed

    return resume  # type: ignore[return-value]


def run_step(execution: Any, step: Any, path: tuple[Any, ...]) -> None:
    """Run ``step`` at ``path`` in a span of its own, and time it."""
    active = _live()
    if active is None:
        step.run(execution, path)
        return
    position = path_text(path)
    ctx, workflow = execution.ctx, execution.workflow
    span = active.tracer.start_span(
        step.label(),
        attributes={
            RUN_ID: str(ctx.run_id),
            WORKFLOW: workflow.name,
            VERSION: workflow.version,
            TENANT: ctx.tenant_id,
            STEP: position,
            STEP_KIND: step.kind,
            ATTEMPT: ctx.retry_attempt,
        },
    )
    token = _current(span)
    outcome = "completed"
    began = time.perf_counter()
    try:
        step.run(execution, path)
    except Suspend:
        outcome = "suspended"
        raise
    except BaseException as exc:
        outcome = "failed"
        reason = getattr(exc, "reason", None)
        _error(span, getattr(exc, "error_class", "") or reason or type(exc).__name__, reason)
        raise
    finally:
        took = time.perf_counter() - began
        _end(span, token, outcome)
        active.step_duration.record(
            took, {WORKFLOW: workflow.name, STEP: position, OUTCOME: outcome}
        )


def carry(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (a run's snapshot) with the link to the run's start span, when it has one."""
    segment = _segment.get()
    if segment is not None and segment.link is not None:
        state["trace"] = segment.link
    return state


def appended(stream: Any, type: str, payload: dict[str, Any]) -> None:
    """A run event was appended to ``stream``: the segment's outcome, and the run counts."""
    active = _live()
    if active is None:
        return
    segment = _segment.get()
    if segment is not None and segment.run_id is None and type == et.RUN_STARTED:
        segment.run_id = stream.run_id
        segment.span.set_attribute(RUN_ID, str(stream.run_id))
    if segment is not None and segment.run_id == stream.run_id:
        segment.outcome = outcome_of(type) or segment.outcome
        if type == et.RUN_FAILED:
            reason = payload.get("reason") or ""
            _error(segment.span, payload.get("error_class") or reason, reason)
    counted = _COUNTED.get(type)
    if counted is not None:
        counter = getattr(active, counted)
        labels = {WORKFLOW: stream.workflow_name}
        if type == et.RUN_FAILED:
            labels[REASON] = payload.get("reason") or ""
        if segment is not None and segment.counts is not None and segment.run_id == stream.run_id:
            segment.counts.append((counter, labels))  # counted when the resume commits
        else:
            _at_commit(lambda: counter.add(1, labels))


def conflict(kind: str) -> None:
    """An append lost its race for a stream version: ``start`` (the run exists), ``cron``, ….

    A start that lost is a duplicate trigger: its span's outcome says so.
    """
    active = _active
    if active is None:
        return
    active.conflicts.add(1, {CONFLICT: kind})
    segment = _segment.get()
    if kind == "start" and segment is not None and segment.run_id is None:
        segment.outcome = "duplicate"


def slot_fired(workflow_name: str) -> None:
    """A cron slot of ``workflow_name`` fired (counted when its transaction commits)."""
    active = _active
    if active is not None:
        _at_commit(lambda: active.slots_fired.add(1, {WORKFLOW: workflow_name}))


def worker_pass(run_errors: int, cron_errors: int) -> None:
    """A worker pass ended, with rows whose resume raised and schedules that could not fire."""
    active = _active
    if active is None:
        return
    active.passes.add(1)
    if run_errors:
        active.worker_errors.add(run_errors, {ERROR_KIND: "run"})
    if cron_errors:
        active.worker_errors.add(cron_errors, {ERROR_KIND: "cron"})


def worker_error(kind: str) -> None:
    """A worker pass broke off: ``database`` (unreachable) or ``pass`` (anything else)."""
    active = _active
    if active is not None:
        active.worker_errors.add(1, {ERROR_KIND: kind})


#: The instruments of the global providers (which may be set later: they follow).
_global: Instruments | None = None if trace is None else Instruments()
_active: Instruments | None = _global
