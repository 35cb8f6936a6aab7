"""Gated starts: debounced triggers and singleton workflows, one gate stream per key.

A workflow whose trigger debounces (``on_event(debounce=...)``) or that is a
singleton (``define_workflow(singleton="skip" | "queue")``) starts its runs
through a *gate*: one engine stream per (tenant, workflow, key) whose every
event holds the gate's state after it (``active``: the open run or None;
``queue``: the runs waiting behind it). The gate's stream version referees
racing triggers as a run's does, so two processes never open two runs of a
key at once; and as every decision is an event, a rebuild gives the same
runs and rows.

- **Debounce.** The first event of a burst opens the gate with a new run,
  which waits (``workflow.run-debounced``) until ``debounce`` after the
  event. Each later event of the key while the run waits appends
  ``workflow.run-debounced`` again, with itself as the trigger and a wait of
  ``debounce`` from it, never past ``debounce_max`` after the burst's first
  event. The worker that claims the run releases the gate, in the claim's
  transaction, and runs the steps from the first with the burst's last
  event: the next event of the key opens a new burst.
- **Singleton.** A trigger while the gate has an active run is skipped
  (``workflow.gate.skipped``) or queued: its run is started held
  (``workflow.run-held``, never due by itself). When the active run ends
  (completed, failed or cancelled), the gate passes to the first queued run
  and wakes it.

A gated run's idempotency key is the gate's key and its trigger event's id:
each burst, each singleton run, is a run of its own.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from kumiko_workflows.exceptions import VersionConflict
from kumiko_workflows.models import Event, SuspensionType, WorkflowRunPending
from kumiko_workflows.store import db
from kumiko_workflows.store.events import append_event
from kumiko_workflows.store.stream_ids import engine_stream
from kumiko_workflows.store.streams import RunStream
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.registry import registry

logger = logging.getLogger("kumiko_workflows.gates")

_GATE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://kumiko-workflows/workflow-gate")
#: Races lost in a row before a trigger gives up (each loss means another
#: process moved the gate; it is read again each time).
ATTEMPTS = 10
#: The payload key of ``run-started`` naming a gated run's key.
GATE_KEY = "gate_key"


def is_gated(workflow: Workflow) -> bool:
    return workflow.singleton is not None or getattr(workflow.trigger, "debounce", None) is not None


def gate_id(tenant_id: str, workflow_name: str, key: str) -> uuid.UUID:
    """The id of the gate stream of ``key`` (stable for ever, like a run id)."""
    return uuid.uuid5(_GATE_NAMESPACE, f"{tenant_id}\x1f{workflow_name}\x1f{key}")


def run_key(key: str, event: Event) -> str:
    """The idempotency key of the gated run ``event`` opens: one run per burst or start."""
    return f"{key}#{event.id}"


@dataclass
class Gate:
    tenant_id: str
    workflow_name: str
    key: str
    version: int = 0
    active: str | None = None
    queue: list[str] = field(default_factory=list)

    @property
    def id(self) -> uuid.UUID:
        return gate_id(self.tenant_id, self.workflow_name, self.key)

    def append(self, type: str, **changes: Any) -> None:
        """Append ``type`` with the gate's state after it; VersionConflict if the gate moved."""
        active: str | None = changes.pop("active", self.active)
        queue: list[str] = list(changes.pop("queue", self.queue))
        payload = {
            "workflow_name": self.workflow_name,
            "key": self.key,
            "active": active,
            "queue": queue,
            **changes,
        }
        with engine_stream():
            append_event(
                self.id,
                et.GATE_AGGREGATE_TYPE,
                type,
                payload,
                tenant_id=self.tenant_id,
                expected_version=self.version,
            )
        self.version += 1
        self.active, self.queue = active, queue


def read_gate(tenant_id: str, workflow_name: str, key: str) -> Gate:
    """The gate of ``key`` as its last event left it (a fresh, closed gate if it has none)."""
    gate = Gate(tenant_id, workflow_name, key)
    last = (
        Event.objects.filter(tenant_id=tenant_id, aggregate_id=gate.id)
        .order_by("-version")
        .values_list("version", "payload")
        .first()
    )
    if last is not None:
        gate.version = last[0]
        gate.active = last[1].get("active")
        gate.queue = list(last[1].get("queue") or [])
    return gate


@dataclass
class Admission:
    """What a gate decided for a trigger event.

    ``run_key`` is the idempotency key of the run to start (None: start
    none); ``opening`` the suspension that run starts in (None: it starts
    as the workflow's runs do); ``run_id`` the run the event went to.
    """

    run_key: str | None
    opening: tuple[str, dict[str, Any]] | None = None
    run_id: uuid.UUID | None = None


def admit(workflow: Workflow, event: Event, key: str, run_id_of: Any) -> Admission:
    """Decide, through the gate of ``key``, what ``event`` starts; record the decision.

    Called in the start's atomic block. The triggers of one gate take turns
    (a lock held to the end of the transaction), so each reads the gate as
    the one before it left it; the gate's stream version still referees the
    writers that do not take turns (a claim ending a burst, a run's end).
    """
    gate = read_gate(event.tenant_id, workflow.name, key)
    db.lock_name(f"kumiko-gate:{gate.id}")
    for _ in range(ATTEMPTS):
        gate = read_gate(event.tenant_id, workflow.name, key)
        try:
            with db.atomic():
                if getattr(workflow.trigger, "debounce", None) is not None:
                    return _debounce(workflow, event, gate, run_id_of)
                return _singleton(workflow, event, gate, run_id_of)
        except VersionConflict:
            continue
    raise VersionConflict(
        f"workflow {workflow.name!r} key {key!r}: the gate moved {ATTEMPTS} times in a row"
    )


def _debounce(workflow: Workflow, event: Event, gate: Gate, run_id_of: Any) -> Admission:
    trigger = workflow.trigger
    period, longest = trigger.debounce, trigger.debounce_max  # type: ignore[union-attr]
    assert period is not None and longest is not None
    at = event.created_at
    if gate.active is not None:
        extended = _extend(workflow, event, gate, at, period)
        if extended is not None:
            return extended
        # The open run no longer waits: a claim took it (and released the
        # gate when it committed, which finding no row waited for), or it
        # ended otherwise. Read the gate again: a new burst either way.
        gate = read_gate(gate.tenant_id, gate.workflow_name, gate.key)
    key = run_key(gate.key, event)
    run_id = run_id_of(key)
    gate.append(et.GATE_OPENED, active=str(run_id), queue=[], trigger_event_id=event.id)
    return Admission(
        key,
        (
            et.RUN_DEBOUNCED,
            {
                "wake_at": (at + period).isoformat(),
                "deadline": (at + longest).isoformat(),
                "first_at": at.isoformat(),
                "events": 1,
            },
        ),
        run_id,
    )


def _extend(
    workflow: Workflow, event: Event, gate: Gate, at: datetime, period: Any
) -> Admission | None:
    """Move the open burst's run to ``event`` (its trigger, a wait from it); None if it moved on."""
    assert gate.active is not None
    run_id = uuid.UUID(gate.active)
    # The lock order of every writer to a run: its pending row, then its
    # stream. A worker claiming the run holds the row: this waits for its
    # commit, then finds no row (the burst ended with that claim).
    row = (
        WorkflowRunPending.objects.select_for_update()
        .filter(tenant_id=event.tenant_id, run_id=run_id, suspension_type=SuspensionType.DEBOUNCED)
        .first()
    )
    if row is None:
        return None
    latest = (
        Event.objects.filter(tenant_id=event.tenant_id, aggregate_id=run_id, type=et.RUN_DEBOUNCED)
        .order_by("-version")
        .values_list("payload", flat=True)
        .first()
    ) or {}
    deadline = parse_datetime(latest.get("deadline") or "") or at
    stream = RunStream.of_pending(row)
    stream.append(
        et.RUN_DEBOUNCED,
        {
            "step": row.step,
            "workflow_name": row.workflow_name,
            "workflow_version": row.workflow_version,
            "definition_fingerprint": row.definition_fingerprint,
            "trigger_event_id": event.id,
            "state": row.state,
            "wake_at": min(at + period, deadline).isoformat(),
            "deadline": deadline.isoformat(),
            "first_at": latest.get("first_at"),
            "events": int(latest.get("events") or 1) + 1,
        },
    )
    return Admission(None, None, run_id)


def _singleton(workflow: Workflow, event: Event, gate: Gate, run_id_of: Any) -> Admission:
    if gate.active is None:
        key = run_key(gate.key, event)
        run_id = run_id_of(key)
        gate.append(et.GATE_OPENED, active=str(run_id), queue=[], trigger_event_id=event.id)
        return Admission(key, None, run_id)
    if workflow.singleton == "skip":
        gate.append(et.GATE_SKIPPED, trigger_event_id=event.id)
        logger.info(
            "workflow=%s key=%s tenant=%s: run %s is active; trigger event %s skipped",
            workflow.name,
            gate.key,
            gate.tenant_id,
            gate.active,
            event.id,
        )
        return Admission(None)
    key = run_key(gate.key, event)
    run_id = run_id_of(key)
    gate.append(
        et.GATE_QUEUED,
        queue=[*gate.queue, str(run_id)],
        run_id=str(run_id),
        trigger_event_id=event.id,
    )
    return Admission(key, (et.RUN_HELD, {"key": gate.key, "behind": gate.active}), run_id)


def _key_of_run(tenant_id: str, run_id: uuid.UUID) -> str | None:
    started = (
        Event.objects.filter(tenant_id=tenant_id, aggregate_id=run_id, version=1)
        .values_list("payload", flat=True)
        .first()
    )
    return None if not started else started.get(GATE_KEY)


def release_debounced(row: WorkflowRunPending) -> None:
    """The burst of the claimed debounced ``row`` ends: its gate opens for the next event.

    In the claim's transaction; a trigger extending the burst meanwhile
    holds the row, so the claim never sees a burst still moving.
    """
    key = _key_of_run(row.tenant_id, row.run_id)
    if key is None:
        return
    gate = read_gate(row.tenant_id, row.workflow_name, key)
    if gate.active == str(row.run_id):
        gate.append(et.GATE_RELEASED, active=None, queue=[], run_id=str(row.run_id))


def release_ended(event: Event, replaying: bool) -> None:
    """A singleton run ended: its gate passes to the first run queued behind it (woken now).

    A reaction to the run's terminal event, in its transaction. A queued run
    that ends before its turn (cancelled) leaves the queue.
    """
    if replaying or event.aggregate_type != et.RUN_AGGREGATE_TYPE:
        return
    workflow = registry.get(str(event.payload.get("workflow_name", "")))
    if workflow is None or workflow.singleton is None:
        return
    key = _key_of_run(event.tenant_id, event.aggregate_id)
    if key is None:
        return
    ended = str(event.aggregate_id)
    # Takes turns with the gate's triggers, which never wait for a run's rows.
    db.lock_name(f"kumiko-gate:{gate_id(event.tenant_id, workflow.name, key)}")
    for _ in range(ATTEMPTS):
        gate = read_gate(event.tenant_id, workflow.name, key)
        try:
            with db.atomic():
                if gate.active == ended:
                    following = gate.queue[0] if gate.queue else None
                    gate.append(
                        et.GATE_RELEASED, active=following, queue=gate.queue[1:], run_id=ended
                    )
                    if following is not None:
                        _wake(event.tenant_id, uuid.UUID(following))
                elif ended in gate.queue:
                    gate.append(
                        et.GATE_RELEASED,
                        queue=[run for run in gate.queue if run != ended],
                        run_id=ended,
                    )
            return
        except VersionConflict:
            continue
    raise VersionConflict(f"workflow {workflow.name!r} key {key!r}: the gate moved too often")


def _wake(tenant_id: str, run_id: uuid.UUID) -> None:
    """Make the held run due now: ``workflow.wake-requested``, its pending row locked first."""
    row = (
        WorkflowRunPending.objects.select_for_update()
        .filter(tenant_id=tenant_id, run_id=run_id, suspension_type=SuspensionType.HELD)
        .first()
    )
    if row is None:
        return  # not held (any more): nothing to wake
    RunStream.of_pending(row).append(
        et.WAKE_REQUESTED,
        {"workflow_name": row.workflow_name, "step": row.step, "by": "kumiko_workflows"},
    )
