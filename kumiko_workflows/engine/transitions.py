"""Sending the run signals (:mod:`kumiko_workflows.signals`): at least once, after commit.

A reaction to run events, registered with the projections (never
replayed). For each transition a receiver listens to, it writes a
:class:`~kumiko_workflows.models.SignalDelivery` row in the transition's
own transaction and registers a callback with the engine's ``on_commit``
that calls the receivers and then deletes the row. Django drops a callback
whose savepoint or transaction rolls back, and the database drops the row
with it, so a transition undone (a caller's rollback around an inline
start, a failing step's savepoint around a run it started, a worker's
batch rolled back after an engine error) sends nothing, and the transition
written again later sends when that commits.

A process that dies between its commit and the row's deletion leaves the
row behind; a resume worker's pass delivers it again
(:func:`deliver_leftovers`): so every committed transition reaches its
receivers at least once, and a repeat carries the same ``delivery_id``.
During a rolling deploy a worker whose code is older than a run's leaves
that run's rows to a worker with its code, as it leaves the run itself
(:mod:`kumiko_workflows.engine.deploys`): the run's sender, and the
receivers its code connects, are only there.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now
from django.dispatch import Signal

from kumiko_workflows import signals
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.engine import deploys
from kumiko_workflows.models import Event, SignalDelivery, WorkflowRun
from kumiko_workflows.store import db, statements
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import suspensions
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.registry import registry

#: Not this module's name: the logger of the signals' receivers' errors is documented
#: (docs/reference/signals.md), and sites route it.
logger = logging.getLogger("kumiko_workflows.signals")

#: Leftover deliveries one worker pass takes at most; the next pass takes more.
LEFTOVERS_PER_PASS = 100


def _started(event: Event) -> dict[str, Any]:
    return {
        "idempotency_key": event.payload.get("idempotency_key"),
        "trigger_event_id": event.payload.get("trigger_event_id"),
    }


def _suspended(event: Event) -> dict[str, Any]:
    record = suspensions.for_event(event.type)
    assert record is not None, f"{event.type} is not a suspension"
    wake_at = record.status_columns(event.payload, event.created_at)["wake_at"]
    return {
        "step": event.payload["step"],
        "suspension_type": record.suspension_type,
        "wake_at": wake_at,
    }


def _completed(event: Event) -> dict[str, Any]:
    return {}


def _failed(event: Event) -> dict[str, Any]:
    return {
        "reason": event.payload.get("reason", ""),
        "step": event.payload.get("step", ""),
        "error_class": event.payload.get("error_class", ""),
    }


def _cancelled(event: Event) -> dict[str, Any]:
    return {"reason": event.payload.get("reason", ""), "by": event.payload.get("by", "")}


Transition = tuple[Signal, Callable[[Event], dict[str, Any]]]

#: The signal of each run event that is a transition and suspends no run, and
#: its own arguments; a suspension's signal is its record's (:func:`transition`).
SIGNALS: dict[str, Transition] = {
    et.RUN_STARTED: (signals.run_started, _started),
    et.RUN_COMPLETED: (signals.run_completed, _completed),
    et.RUN_FAILED: (signals.run_failed, _failed),
    et.RUN_CANCELLED: (signals.run_cancelled, _cancelled),
}


def transition(event_type: str) -> Transition | None:
    """The signal a run event sends and the function of its arguments, or None.

    A suspending event sends the signal its suspension record names
    (``run_suspended`` for a step's wait; none for a rerun or a queued start).
    """
    found = SIGNALS.get(event_type)
    if found is not None:
        return found
    record = suspensions.for_event(event_type)
    if record is None or record.signal is None:
        return None
    return record.signal, _suspended


def handles(event_type: str) -> bool:
    """Whether a run event of ``event_type`` is a transition with a signal."""
    return transition(event_type) is not None


def sender_of(event: Event) -> Workflow | None:
    """The definition of the run's own version (not the newest), or None if not declared.

    The version comes from the event where it records it, else from the
    run's status row (which the run-status projection has already brought
    up to this event, in the same transaction).
    """
    version, fingerprint = _definition_of(event)
    return registry.of_run(event.payload.get("workflow_name", ""), version, fingerprint)


def _definition_of(event: Event, *, fingerprint_needed: bool = False) -> tuple[int | None, str]:
    """The run's version and definition fingerprint as of ``event`` ("" if unknown)."""
    payload = event.payload
    version = payload.get("workflow_version")
    fingerprint = payload.get("definition_fingerprint")
    if version is None or (fingerprint_needed and not fingerprint):
        row = (
            WorkflowRun.objects.filter(tenant_id=event.tenant_id, run_id=event.aggregate_id)
            .values_list("workflow_version", "definition_fingerprint")
            .first()
        )
        if row is not None:
            version, fingerprint = (row[0] if version is None else version), fingerprint or row[1]
    return version, fingerprint or ""


def _newer_code(event: Event) -> bool:
    """Whether ``event``'s run is on code newer than this process's (its worker delivers it)."""
    _, fingerprint = _definition_of(event, fingerprint_needed=True)
    return bool(fingerprint) and deploys.newer_than_mine(fingerprint) is not None


# --- who delivers ----------------------------------------------------------------

_HOST = socket.gethostname()[:255]
_me: tuple[int, str] | None = None


def owner() -> str:
    """This process's name on the rows it delivers: ``host:pid:token``.

    The token tells this process from an earlier one with the same host and
    pid (a restarted container); it is new after a fork.
    """
    global _me
    pid = os.getpid()
    if _me is None or _me[0] != pid:
        _me = (pid, f"{_HOST}:{pid}:{uuid.uuid4().hex[:12]}")
    return _me[1]


def _owner_gone(name: str) -> bool:
    """Whether the process named ``name`` has ended, as far as this host can tell.

    Only a process of this host can be seen to have ended (its pid is free,
    or it is this pid with another token); another host's rows wait for
    ``SIGNAL_REDELIVERY_SECONDS``.
    """
    host, _, rest = name.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return name != owner()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's), or cannot be asked
        return False
    return False


# --- pacing: the worker's heartbeat between deliveries -----------------------------

_pacer: ContextVar[Callable[[], None] | None] = ContextVar("kumiko_signal_pacer", default=None)


@contextmanager
def beating_between_receivers(beat: Callable[[], None] | None) -> Iterator[None]:
    """Call ``beat`` before each receiver during the block (a worker's heartbeat).

    However long receivers take in all, the worker's heartbeat is never
    further behind than one receiver call. ``beat`` is expected to limit
    its own rate; an error it raises is logged and ignored here (the pass's
    own heartbeat reports it).
    """
    token = _pacer.set(beat)
    try:
        yield
    finally:
        _pacer.reset(token)


def _pace() -> None:
    beat = _pacer.get()
    if beat is None:
        return
    try:
        beat()
    except Exception as exc:
        logger.debug("heartbeat between signal deliveries failed: %s", exc)


# --- delivering --------------------------------------------------------------------


def announce(event: Event, replaying: bool) -> None:
    """Record ``event``'s signal for delivery after commit, if anyone listens to it.

    Never on a replay. The common case, no receiver, costs one lookup; a
    listened-to transition costs one INSERT in its transaction and one
    DELETE after the receivers ran (which waits for no disk flush: see
    :func:`~kumiko_workflows.store.statements.delete_signal_delivery`).
    """
    if replaying or event.aggregate_type != et.RUN_AGGREGATE_TYPE:
        return
    found = transition(event.type)
    if found is None:
        return
    signal, _ = found
    if not signal.receivers:
        return
    sender = sender_of(event)
    if not signal.has_listeners(sender):
        return
    statements.add_signal_delivery(event.id, event.tenant_id, owner())
    db.on_commit(lambda: _deliver(event, sender), robust=True)


def _deliver(event: Event, sender: Workflow | None) -> None:
    """Call every receiver of ``event``'s signal, then delete its delivery row."""
    found = transition(event.type)
    assert found is not None, f"{event.type} sends no signal"
    signal, arguments = found
    kwargs = {
        "run_id": event.aggregate_id,
        "workflow_name": event.payload.get("workflow_name", ""),
        "tenant_id": event.tenant_id,
        "event": event,
        "delivery_id": event.id,
        **arguments(event),
    }
    sync_receivers, async_receivers = signal._live_receivers(sender)
    calls = [*sync_receivers, *(async_to_sync(r) for r in async_receivers)]
    for receiver in calls:
        _pace()
        try:
            receiver(signal=signal, sender=sender, **kwargs)
        except Exception as exc:
            # Logged here, once, with the run (not by Django's send_robust as well).
            logger.error(
                "run=%s workflow=%s event=%s: signal receiver %r raised %s",
                kwargs["run_id"],
                kwargs["workflow_name"],
                event.type,
                receiver,
                type(exc).__name__,
                exc_info=exc,
            )
    statements.delete_signal_delivery(event.tenant_id, event.id)


def deliver_leftovers(limit: int = LEFTOVERS_PER_PASS) -> int:
    """Deliver signals a process committed but did not finish delivering; return how many.

    A row is left over when its owner has ended (seen from this host), or
    when it was taken more than ``SIGNAL_REDELIVERY_SECONDS`` ago by the
    database's clock; a live process's fresh rows are left to it. Rows are
    taken with ``FOR UPDATE SKIP LOCKED`` and leased to this process (a
    worker killed while delivering them leaves them over again), then
    delivered outside any transaction, as after a commit. A row of a run on
    code newer than this process's is not taken (see the module's
    docstring). Refused (0) inside an atomic block, whose own uncommitted
    rows it would see.
    """
    if db.engine().in_atomic_block:
        return 0
    grace = timedelta(seconds=float(workflow_settings.SIGNAL_REDELIVERY_SECONDS))
    expired = Q(leased_at__lt=Now() - grace)
    leftover = SignalDelivery.objects.filter(expired | Q(owner__startswith=f"{_HOST}:"))
    # Found without a lock, across tenants, then locked tenant by tenant: a
    # lock names its tenant, as every one does (one shard's on Citus).
    tenants = list(leftover.order_by("tenant_id").values_list("tenant_id", flat=True).distinct())
    taken: list[int] = []
    tenant_of: dict[int, str] = {}
    found: dict[int, Event] = {}
    with db.atomic():
        for tenant_id in tenants:
            candidates = list(
                leftover.filter(tenant_id=tenant_id)
                .select_for_update(skip_locked=True)
                .annotate(expired=ExpressionWrapper(expired, output_field=BooleanField()))
                .order_by("event_id")
                .values_list("event_id", "owner", "expired")[: limit - len(taken)]
            )
            mine = [pk for pk, name, old in candidates if old or _owner_gone(name)]
            events = Event.objects.filter(tenant_id=tenant_id).in_bulk(mine)
            # A newer run's rows are left as they are, for a worker with its code.
            mine = [pk for pk in mine if pk not in events or not _newer_code(events[pk])]
            if mine:
                SignalDelivery.objects.filter(tenant_id=tenant_id, event_id__in=mine).update(
                    owner=owner(), leased_at=Now()
                )
            taken += mine
            tenant_of.update((pk, tenant_id) for pk in mine)
            found.update(events)
            if len(taken) >= limit:
                break
    for pk in taken:
        event = found.get(pk)
        if event is None or event.type not in SIGNALS:
            logger.warning("the signal of event #%s is not delivered: the event is gone", pk)
            statements.delete_signal_delivery(tenant_of[pk], pk)
            continue
        logger.info("delivering the signal of event #%s again (%s)", pk, event.type)
        _deliver(event, sender_of(event))
    return len(taken)
