"""Admitting segments under a workflow's concurrency limit, and offering freed slots.

A worker that claims a due run of a limited workflow (``define_workflow(...,
concurrency=Limit(...))``) admits its segment here before any step runs:

- ``holds="executing"``: the segment locks a free slot row of its key
  (``FOR UPDATE SKIP LOCKED``) in the claim's transaction and holds it
  until that commits; a crashed worker's rollback frees it. Nothing about
  the slot outlives the transaction but its ``workflow.slot-taken`` event.
- ``holds="active"``: the run's first segment takes a slot the same way and
  records itself as the slot's holder (``workflow.slot-taken``, projected
  into :class:`~kumiko_workflows.models.LimitSlot`); later segments find it
  holding one. ``workflow.slot-released`` follows the run's end, in the
  same transaction, and hands the slot to the key's oldest queued run.

A run that finds no free slot queues (``workflow.slot-waiting``): its pending
row leaves the due range, keeping the suspension it was claimed from. A
segment's end (``"executing"``) or a holder's end (``"active"``) offers the
freed slot to the oldest queued run of the key (``workflow.slot-offered``),
which makes it due and NOTIFYs a worker, as any wake-up. Queuing and
offering take the key's queue lock in turn (:func:`slots.lock_limit_queue`), so
no offer misses a run that queued meanwhile. No serializable transaction,
no counter: row locks and the streams decide.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kumiko_workflows.models import Event, LimitSlot, RateSlot, WorkflowRunPending
from kumiko_workflows.store import db, slots
from kumiko_workflows.store.streams import RunStream
from kumiko_workflows.workflow import clock, suspensions
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.limits import Limit, Rate, UnusableKey, key_of
from kumiko_workflows.workflow.registry import registry

logger = logging.getLogger("kumiko_workflows.limits")

__all__ = ["Admission", "UnusableKey", "admit", "after_segment", "release_on_end"]


@dataclass
class Admission:
    """What :func:`admit` decided for one claimed row."""

    #: Whether the segment may run now; else the run was queued.
    admitted: bool
    #: The limit whose slot the segment took under ``holds="executing"``
    #: (offered to the next queued run when the segment ends), and its key.
    executing: Limit | None = None
    key: str = ""


ADMITTED = Admission(True)


def admit(
    workflow: Workflow, row: WorkflowRunPending, stream: RunStream, trigger: Event, now: datetime
) -> Admission:
    """Admit the segment that resumes ``row`` under the workflow's limits, or make the run wait.

    Runs in the claim's transaction, before the segment's opening event:
    the concurrency limit first (a run queued for a slot spends no rate
    budget), then the rate limit. Raises :class:`UnusableKey` when a
    limit's key callable cannot key the run (the caller fails it).
    """
    admission = _admit_concurrency(workflow, row, stream, trigger)
    if admission.admitted and workflow.rate is not None:
        if not _admit_rate(workflow, workflow.rate, row, stream, trigger, now):
            return Admission(False, admission.executing, admission.key)
    return admission


def _admit_concurrency(
    workflow: Workflow, row: WorkflowRunPending, stream: RunStream, trigger: Event
) -> Admission:
    limit = workflow.concurrency
    if limit is None:
        return ADMITTED
    key = key_of(limit.key, trigger)
    active = limit.holds == "active"
    if active and slots.held_slot(row.tenant_id, row.run_id) is not None:
        return ADMITTED  # its first segment took one; it holds it until it ends
    tenant, name = row.tenant_id, workflow.name
    slot = slots.take_limit_slot(tenant, name, key, limit.max, free_only=active)
    if slot is None:
        # The key's rows may not exist yet (its first run, or a raised max).
        slots.ensure_slots(LimitSlot, tenant, name, key, limit.max)
        slots.lock_limit_queue(tenant, name, key)
        slot = slots.take_limit_slot(tenant, name, key, limit.max, free_only=active)
        if slot is None and active and _release_settled(tenant, name, key):
            slot = slots.take_limit_slot(tenant, name, key, limit.max, free_only=True)
    if slot is None:
        _queue(workflow, row, stream, key, limit)
        return Admission(False)
    stream.append(
        et.SLOT_TAKEN,
        {
            "workflow_name": workflow.name,
            "limit_key": key,
            "slot": slot,
            "holds": limit.holds,
            "step": row.step,
        },
    )
    return Admission(True, None if active else limit, key)


def rate_clock(now: datetime) -> datetime:
    """The instant a rate limit counts a start at: one clock for every worker.

    The database's where writers on several hosts overlap (PostgreSQL),
    unless a test set a virtual clock; the pass's ``now`` on SQLite, whose
    writers share one host (and whose tests pass ``now=``).
    """
    if clock.is_virtual() or not db.overlapping_writers():
        return now
    return db.database_now()


def _admit_rate(
    workflow: Workflow,
    rate: Rate,
    row: WorkflowRunPending,
    stream: RunStream,
    trigger: Event,
    now: datetime,
) -> bool:
    """Take one of the key's starts of the period (``workflow.rate-taken``), or make the run wait.

    A start takes a rate slot (one of ``max`` rows of the key) whose last
    start is at least ``per`` ago, under the slot's row lock, and stamps it
    with its own instant: each slot's starts are ``per`` apart, so no
    window of ``per`` seconds holds more than ``max`` starts, whatever the
    workers. With none free, the run waits (``workflow.rate-waiting``)
    until the budget allows, behind the runs already told to wait.
    """
    key = key_of(rate.key, trigger)
    at = rate_clock(now)
    period = timedelta(seconds=rate.seconds)
    free = slots.free_rate_slots(row.tenant_id, workflow.name, key, rate.max)
    if _spent(free, at, period) and len(free) < rate.max:
        # The key's rows may not exist yet (its first start, or a raised max).
        slots.ensure_slots(RateSlot, row.tenant_id, workflow.name, key, rate.max)
        free = slots.free_rate_slots(row.tenant_id, workflow.name, key, rate.max)
    if not _spent(free, at, period):
        slot, _ = free[0]
        stream.append(
            et.RATE_TAKEN,
            {
                "workflow_name": workflow.name,
                "rate_key": key,
                "slot": slot,
                "at": at.isoformat(),
                "step": row.step,
            },
        )
        return True
    # Slots others lock were taken just now: free a period from now at the latest.
    allowed = min([at + period, *(last + period for _, last in free if last is not None)])
    tail = slots.rate_tail(row.tenant_id, workflow.name, key)
    if tail is not None and tail >= allowed - period:
        # Behind the runs told to wait already, each a share of the period later.
        allowed = max(allowed, tail + period / rate.max)
    stream.append(
        et.RATE_WAITING,
        {
            **_kept(row),
            "rate_key": key,
            "max": rate.max,
            "per": rate.seconds,
            "wake_at": allowed.isoformat(),
        },
    )
    return False


def _kept(row: WorkflowRunPending) -> dict[str, Any]:
    """A waiting event's columns that keep the suspension ``row`` was claimed from."""
    return {
        "step": row.step,
        "workflow_name": row.workflow_name,
        "workflow_version": row.workflow_version,
        "definition_fingerprint": row.definition_fingerprint,
        "trigger_event_id": row.trigger_event_id,
        "state": row.state or {},
        "suspension": suspensions.standing(row),
    }


def _spent(free: list[tuple[int, datetime | None]], at: datetime, period: timedelta) -> bool:
    """Whether no slot of ``free`` (least recently taken first) allows a start at ``at``."""
    return not free or (free[0][1] is not None and free[0][1] > at - period)


def _queue(
    workflow: Workflow, row: WorkflowRunPending, stream: RunStream, key: str, limit: Limit
) -> None:
    """Queue the run for a slot of ``key``: ``workflow.slot-waiting``, keeping its suspension."""
    queued_at = row.queued_at or row.wake_at or row.suspended_at
    holders = (
        slots.limit_holders(row.tenant_id, workflow.name, key)
        if limit.holds == "active"
        else limit.max
    )
    stream.append(
        et.SLOT_WAITING,
        {
            **_kept(row),
            "limit_key": key,
            "holds": limit.holds,
            "max": limit.max,
            "holders": holders,
            "queued_at": queued_at.isoformat(),
        },
    )
    logger.info(
        "workflow=%s run=%s key=%r queued: %d of %d slots taken",
        workflow.name,
        row.run_id,
        key,
        holders,
        limit.max,
    )


def _release_settled(tenant_id: str, workflow_name: str, key: str) -> bool:
    """Free the slots of holders that have ended (``workflow.slot-released``); whether any."""
    ended = slots.settled_holders(tenant_id, workflow_name, key)
    for run in ended:
        held = slots.held_slot(tenant_id, run.run_id)
        stream = RunStream(
            run.run_id, tenant_id, workflow_name, run.version, run.definition_fingerprint, None
        )
        stream.append(
            et.SLOT_RELEASED,
            {
                "workflow_name": workflow_name,
                "limit_key": key,
                "slot": held[2] if held else None,
                "late": True,
            },
        )
        logger.warning(
            "workflow=%s run=%s key=%r ended holding a slot; released now",
            workflow_name,
            run.run_id,
            key,
        )
    return bool(ended)


def after_segment(tenant_id: str, workflow_name: str, admission: Admission) -> None:
    """A segment admitted under ``holds="executing"`` ended: offer its slot to the next queued run.

    The slot's lock itself goes with this transaction's commit, when the
    offered run becomes due (both at once).
    """
    if admission.executing is not None:
        slots.lock_limit_queue(tenant_id, workflow_name, admission.key)
        _offer(tenant_id, workflow_name, admission.key, None)


def _offer(tenant_id: str, workflow_name: str, key: str, slot: int | None) -> None:
    """Make the key's oldest queued run due (``workflow.slot-offered``), handing it ``slot``.

    ``slot`` (``holds="active"``): the freed slot, recorded as the offered
    run's (``workflow.slot-taken`` on its stream), so no run that was not
    queued takes it first. Under the key's queue lock.
    """
    row = slots.oldest_queued(tenant_id, workflow_name, key)
    if row is None:
        return
    stream = RunStream.of_pending(row)
    if slot is not None:
        stream.append(
            et.SLOT_TAKEN,
            {
                "workflow_name": workflow_name,
                "limit_key": key,
                "slot": slot,
                "holds": "active",
                "step": row.step,
                "offered": True,
            },
        )
    stream.append(et.SLOT_OFFERED, {"workflow_name": workflow_name, "limit_key": key})


def _holds_active(workflow_name: str) -> bool:
    """Whether any declared version of the workflow limits it with ``holds="active"``."""
    return any(
        w.concurrency is not None and w.concurrency.holds == "active"
        for w in registry.versions(workflow_name)
    )


def release_on_end(event: Event, replaying: bool) -> None:
    """A run ended: release the slot it holds (``holds="active"``) and offer it to the next.

    A reaction to ``workflow.run-completed``, ``-failed`` and ``-cancelled``
    in the ending transaction (never replayed: the events it appends are).
    Asks the database only for workflows declared with an active limit.
    """
    if replaying or event.aggregate_type != et.RUN_AGGREGATE_TYPE:
        return
    payload: dict[str, Any] = event.payload
    name = payload.get("workflow_name")
    if not isinstance(name, str) or not _holds_active(name):
        return
    held = slots.held_slot(event.tenant_id, event.aggregate_id)
    if held is None:
        return
    workflow_name, key, slot = held
    slots.lock_limit_queue(event.tenant_id, workflow_name, key)
    stream = RunStream(
        event.aggregate_id,
        event.tenant_id,
        workflow_name,
        event.version,
        payload.get("definition_fingerprint") or "",
        None,
    )
    stream.append(
        et.SLOT_RELEASED, {"workflow_name": workflow_name, "limit_key": key, "slot": slot}
    )
    _offer(event.tenant_id, workflow_name, key, slot)
