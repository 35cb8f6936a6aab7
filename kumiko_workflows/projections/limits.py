"""The limits projection: who holds a concurrency slot, and when each rate slot was last taken.

A pure function of the run streams, like the run tables: ``workflow.slot-taken``
of a run under ``holds="active"`` makes it the holder of its slot
(:class:`~kumiko_workflows.models.LimitSlot`) and ``workflow.slot-released``
frees it; ``workflow.rate-taken`` stamps its rate slot
(:class:`~kumiko_workflows.models.RateSlot`) with the start's instant, and
``workflow.rate-waiting`` moves the key's queue tail (slot ``-1``). A
rebuild replays them into the same rows. Which run is offered a freed slot
is a reaction, in :mod:`kumiko_workflows.engine.limits`.
"""

from __future__ import annotations

from django.db.models import Q
from django.utils.dateparse import parse_datetime

from kumiko_workflows.models import Event, LimitSlot, RateSlot
from kumiko_workflows.projections.run_status import is_run_event
from kumiko_workflows.workflow import event_types as et

HANDLED = frozenset({et.SLOT_TAKEN, et.SLOT_RELEASED, et.RATE_TAKEN, et.RATE_WAITING})


def project_limits(event: Event, replaying: bool) -> None:
    if not is_run_event(event):
        return
    payload = event.payload
    if event.type == et.SLOT_TAKEN:
        if payload.get("holds") != "active":
            return  # "executing": the slot is the segment's row lock, nothing to keep
        LimitSlot.objects.bulk_create(
            [
                LimitSlot(
                    tenant_id=event.tenant_id,
                    workflow_name=payload["workflow_name"],
                    limit_key=payload["limit_key"],
                    slot=payload["slot"],
                    holder_run_id=event.aggregate_id,
                    taken_at=event.created_at,
                )
            ],
            update_conflicts=True,
            unique_fields=["tenant_id", "workflow_name", "limit_key", "slot"],
            update_fields=["holder_run_id", "taken_at"],
        )
    elif event.type == et.SLOT_RELEASED:
        LimitSlot.objects.filter(
            tenant_id=event.tenant_id, holder_run_id=event.aggregate_id
        ).update(holder_run_id=None, taken_at=None)
    elif event.type == et.RATE_TAKEN:
        RateSlot.objects.bulk_create(
            [
                RateSlot(
                    tenant_id=event.tenant_id,
                    workflow_name=payload["workflow_name"],
                    rate_key=payload["rate_key"],
                    slot=payload["slot"],
                    last_start=parse_datetime(payload["at"]),
                )
            ],
            update_conflicts=True,
            unique_fields=["tenant_id", "workflow_name", "rate_key", "slot"],
            update_fields=["last_start"],
        )
    elif event.type == et.RATE_WAITING:
        # The queue's tail (slot -1): the latest instant a run of the key was
        # told to wait until, so the next one waits behind it.
        wake_at = parse_datetime(payload["wake_at"])
        tail = {
            "tenant_id": event.tenant_id,
            "workflow_name": payload["workflow_name"],
            "rate_key": payload["rate_key"],
            "slot": -1,
        }
        moved = (
            RateSlot.objects.filter(**tail)
            .filter(Q(last_start__isnull=True) | Q(last_start__lt=wake_at))
            .update(last_start=wake_at)
        )
        if not moved and not RateSlot.objects.filter(**tail).exists():
            RateSlot.objects.create(**tail, last_start=wake_at)
