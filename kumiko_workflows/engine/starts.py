"""Starting runs from trigger events: one run per workflow an event triggers, once per key.

The run starts in the transaction that appended its trigger and runs its
first segment there (:func:`~kumiko_workflows.engine.segment.run_segment`),
or, for ``start="worker"`` and inside :func:`start_in_worker`, is queued
for a worker.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any, cast

from kumiko_workflows import telemetry
from kumiko_workflows.engine import children, gates
from kumiko_workflows.engine.run_context import RunContext
from kumiko_workflows.engine.segment import fail_opened, run_segment
from kumiko_workflows.exceptions import (
    VersionConflict,
)
from kumiko_workflows.models import Event
from kumiko_workflows.store import db
from kumiko_workflows.store.streams import (
    FILTER_FAILED,
    IDEMPOTENCY_KEY_FAILED,
    INTERNAL_ERROR,
    Failure,
    RunStream,
    failure_from_exception,
)
from kumiko_workflows.workflow import event_types, priorities
from kumiko_workflows.workflow.cron import CronTrigger
from kumiko_workflows.workflow.definition import Workflow, run_id_for
from kumiko_workflows.workflow.jsonvalues import text_problem
from kumiko_workflows.workflow.registry import registry
from kumiko_workflows.workflow.triggers import EventTrigger

logger = logging.getLogger(__name__)


def _idempotency_key(workflow: Workflow, event: Event) -> str:
    if isinstance(workflow.trigger, CronTrigger):
        # A cron run is keyed by its slot instant (kumiko_workflows.engine.cron), so
        # schedulers that fire the same slot address the same run; a run
        # fired outside the slots, by the key its caller gave.
        if event.type == event_types.SCHEDULE_FIRED_NOW:
            return str(event.payload["idempotency_key"])
        return str(event.payload["slot"])
    key = workflow.idempotency_key
    if key is None:
        return uuid.uuid4().hex
    if callable(key):
        key = key(event)
    if isinstance(key, bool) or not isinstance(key, str | int | uuid.UUID):
        raise TypeError(f"idempotency_key returned {key!r}; return a string")
    return str(key)


_in_worker: ContextVar[bool] = ContextVar("kumiko_start_in_worker", default=False)


@contextmanager
def start_in_worker() -> Iterator[None]:
    """Queue the runs that appends inside the block start, as ``start="worker"`` does.

    For one call where the workflow's default is to start inline: a web
    request appends its trigger and returns without running any step; a
    worker (woken by NOTIFY on PostgreSQL) runs them right after the commit.
    """
    token = _in_worker.set(True)
    try:
        yield
    finally:
        _in_worker.reset(token)


#: The longest search key a run keeps (``WorkflowRun.search_key``).
SEARCH_KEY_LENGTH = 200


def search_key_of(workflow: Workflow, event: Event) -> str:
    """What the admin's search finds the run by: the workflow's ``search_key(event)``.

    A search key only helps people find a run, so a callable that raises or
    returns something unusable is logged and the run goes on without one.
    """
    assert workflow.search_key is not None
    try:
        value = workflow.search_key(event)
    except Exception:
        logger.exception(
            "workflow=%s trigger_event=%s search_key raised; the run has no search key",
            workflow.name,
            event.id,
        )
        return ""
    if value is None:
        return ""
    problem = None
    if isinstance(value, bool) or not isinstance(value, str | int | uuid.UUID):
        problem = f"returned {type(value).__name__}, not a string"
    else:
        value = str(value)
        if len(value) > SEARCH_KEY_LENGTH:
            problem = f"returned {len(value)} characters, over {SEARCH_KEY_LENGTH}"
        else:
            problem = text_problem(value, controls=False)
    if problem:
        logger.error(
            "workflow=%s trigger_event=%s search_key %s; the run has no search key",
            workflow.name,
            event.id,
            problem,
        )
        return ""
    return cast(str, value)


def _at_first_step(
    workflow: Workflow, event: Event, parent: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The payload of a suspension before the run's first step (queued, debounced, held).

    ``parent``: a child run's parent (``call_workflow``, ``fan_out``), kept in its state.
    """
    state: dict[str, Any] = {"results": {}, "awaited": {}}
    if parent:
        state["parent"] = parent
    return {
        "step": "0",
        "workflow_name": workflow.name,
        "workflow_version": workflow.version,
        "definition_fingerprint": workflow.fingerprint,
        "trigger_event_id": event.id,
        "state": telemetry.carry(state),
    }


def priority_of(workflow: Workflow, event: Event) -> int:
    """The priority of the run ``event`` starts: the trigger's, else the workflow's, else 0.

    Either may be a callable of the event (a priority per start). A priority
    only orders due work, so a callable that raises or returns something
    else than a whole number from -100 to 100 is logged and the run starts
    with none.
    """
    trigger = workflow.trigger
    value = getattr(trigger, "priority", None)
    if value is None:
        value = workflow.priority
    if value is None:
        return priorities.DEFAULT_PRIORITY
    if callable(value):
        try:
            value = value(event)
        except Exception:
            logger.exception(
                "workflow=%s trigger_event=%s priority raised; the run has none",
                workflow.name,
                event.id,
            )
            return priorities.DEFAULT_PRIORITY
        wrong = priorities.problem(value)
        if wrong:
            logger.error(
                "workflow=%s trigger_event=%s priority: %s; the run has none",
                workflow.name,
                event.id,
                wrong,
            )
            return priorities.DEFAULT_PRIORITY
    return int(value)


@telemetry.traced_start
def start_run(
    workflow: Workflow,
    event: Event,
    *,
    now: datetime | None = None,
    key: str | None = None,
    parent: dict[str, Any] | None = None,
) -> uuid.UUID | None:
    """Start one run of ``workflow`` for ``event``: run it inline until it suspends, or queue it.

    A workflow defined with ``start="worker"`` (or a trigger appended inside
    :func:`start_in_worker`) is queued: ``workflow.run-queued`` makes it due
    at its first step at once, for a worker.

    A child run (``call_workflow``, ``fan_out``) is started with its ``key``
    (derived from its parent's run and step) and its ``parent``
    ({"run_id", "group", "index"}), recorded in its ``run-started``.

    Returns the run id, or None when the filter declined or the run already
    existed. Never raises for a failing workflow: invariant 3.
    """
    filter_error: Failure | None = None
    trigger = workflow.trigger
    if key is not None:
        pass  # a child run: its parent asked for it, no filter applies
    elif isinstance(trigger, EventTrigger) and trigger.filter is not None:
        try:
            if not trigger.filter(event):
                return None
        except Exception as exc:
            filter_error = failure_from_exception(
                FILTER_FAILED, "", "the trigger filter raised", exc
            )
    try:
        if key is None:
            key = _idempotency_key(workflow, event)
    except Exception as exc:
        key = uuid.uuid4().hex
        filter_error = filter_error or failure_from_exception(
            IDEMPOTENCY_KEY_FAILED, "", "the idempotency_key callable raised", exc
        )
    run_id = run_id_for(workflow.name, key, event.tenant_id)
    priority = priority_of(workflow, event)
    started = {
        "workflow_name": workflow.name,
        "workflow_version": workflow.version,
        "definition_fingerprint": workflow.fingerprint,
        "step_fingerprints": workflow.step_fingerprints,
        "idempotency_key": key,
        "trigger_event_id": event.id,
    }
    if workflow.search_key is not None:  # else the idempotency key is the search key
        started["search_key"] = search_key_of(workflow, event)
    if priority:
        started["priority"] = priority
    if parent is not None:
        started["parent"] = parent
    gated = filter_error is None and gates.is_gated(workflow)
    # Every append below happens in an atomic block that an error unwinds.
    stream = RunStream(
        run_id,
        event.tenant_id,
        workflow.name,
        0,
        workflow.fingerprint,
        event.id,
        savepoint=False,
        priority=priority,
    )
    stream.parent = parent
    opening = (event_types.RUN_STARTED, started)
    fresh = stream.mark()
    try:
        # One savepoint for the whole start: an error in the engine's own
        # writes takes them all back, and the domain write still commits.
        with db.atomic():
            admission = None
            if gated:
                admission = gates.admit(
                    workflow, event, key, lambda k: run_id_for(workflow.name, k, event.tenant_id)
                )
                if admission.run_key is None:
                    return None  # skipped, or the burst's open run took the event
                # Each gated start is a run of its own, found by the gate's key.
                started.setdefault("search_key", key)
                started[gates.GATE_KEY] = key
                key = started["idempotency_key"] = admission.run_key
                run_id = stream.run_id = run_id_for(workflow.name, key, event.tenant_id)
            if filter_error is not None:
                fail_opened(stream, opening, filter_error, state=None, retry_from=None)
            elif admission is not None and admission.opening is not None:
                stream.append(*opening)
                kind, waits = admission.opening
                stream.append(kind, {**_at_first_step(workflow, event, parent), **waits})
            elif workflow.start == "worker" or workflow.limited or _in_worker.get():
                # A limited workflow's segments, its first included, are
                # admitted by a worker (engine/limits).
                stream.append(*opening)
                stream.append(event_types.RUN_QUEUED, _at_first_step(workflow, event, parent))
            else:
                ctx = RunContext(
                    run_id=run_id,
                    workflow_name=workflow.name,
                    tenant_id=event.tenant_id,
                    event=event,
                    now=now,
                    parent=parent,
                )
                run_segment(workflow, stream, ctx, None, opening)
        return run_id
    except VersionConflict:
        telemetry.conflict("start")
        logger.info(
            "workflow=%s key=%s tenant=%s run=%s exists already; trigger event %s ignored",
            workflow.name,
            key,
            event.tenant_id,
            run_id,
            event.id,
        )
        return None
    except Exception as exc:
        # Our own bookkeeping failed (not a step: those are recorded above).
        # The domain write must still commit, so record what we can.
        logger.exception(
            "workflow=%s trigger_event=%s run=%s could not be started",
            workflow.name,
            event.id,
            run_id,
        )
        stream.rewind(fresh)  # the failed block's appends were rolled back
        failure = Failure(
            INTERNAL_ERROR,
            "",
            f"starting the run raised {type(exc).__name__}",
            error_class=type(exc).__name__,
            detail=str(exc),
        )
        try:
            with db.atomic():
                fail_opened(stream, opening, failure, state=None, retry_from=None)
        except Exception:
            logger.exception(
                "workflow=%s run=%s failure could not be recorded", workflow.name, run_id
            )
        return run_id


def trigger_projection(event: Event, replaying: bool) -> None:
    """Start a run of each workflow triggered by ``event``'s type."""
    if replaying:
        return
    for workflow in registry.triggered_by(event.type):
        start_run(workflow, event)


# Child runs (call_workflow, fan_out) are started with start_run.
children.set_starter(start_run)
