"""Rehearsals that write nothing: ``resume_due_runs --dry-run`` and ``fire_schedules --dry-run``.

A pass at a future ``--now`` that commits does for real what is not due yet:
it sends a reminder days early, and it fires a future cron slot, after which
the schedule's catch-up rule treats the real slots in between as missed and
skips them. So a rehearsal runs the pass inside one transaction that is
rolled back at its end: every table, cron schedules included, is as it was,
and the next real pass sees the real history. What the pass wrote is
collected as it is written (each event, through ``post_save``), so the
command can say what would have happened.

Not rolled back: what a step does outside this database (an email sent, an
HTTP request, a file, a write to another database); a rehearsal runs the
steps' code. Nothing waits for the commit that never comes: transition
signals and other ``on_commit`` callbacks are dropped, and no NOTIFY is sent.
PostgreSQL's id sequences are not transactional: ids the rehearsal took are
skipped. The transaction holds the rows it claimed (and, on SQLite, the
write lock) until the pass ends.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.db.models.signals import post_save

from kumiko_workflows.engine.deploys import not_registering_on_connect
from kumiko_workflows.models import Event
from kumiko_workflows.store import db
from kumiko_workflows.workflow import event_types as et

T = TypeVar("T")

#: Said with every rehearsal's report: what the rollback cannot take back.
NOT_ROLLED_BACK = (
    "rolled back: no table was changed and no cron schedule moved; but a step's own calls "
    "outside this database (emails, HTTP requests, files, other databases) were made for "
    "real and are not rolled back"
)


@dataclass
class Rehearsal(Generic[T]):
    """What a rolled-back pass returned, and the events it wrote (in order) before the rollback."""

    result: T
    written: list[Event] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per stream written to, first written first: what, where, which events."""
        streams: dict[tuple[str, uuid.UUID], list[Event]] = {}
        for event in self.written:
            streams.setdefault((event.tenant_id, event.aggregate_id), []).append(event)
        return [_describe(events) for events in streams.values()]

    def report(self, command: str, now: datetime | None, summary: str) -> list[str]:
        """What ``command``'s dry run prints: what it would write, ``summary``, the rollback."""
        at = f" at {now.isoformat()}" if now is not None else ""
        return [
            f"{command}: dry run{at}; it would write:",
            *(f"  {line}" for line in self.lines() or ["nothing"]),
            f"{command}: would have done {summary}",
            f"{command}: {NOT_ROLLED_BACK}",
        ]


def _describe(events: list[Event]) -> str:
    first = events[0]
    name = next((e.payload["workflow_name"] for e in events if "workflow_name" in e.payload), "")
    types = ", ".join(event.type for event in events)
    if first.aggregate_type == et.RUN_AGGREGATE_TYPE:
        where = f"run {first.aggregate_id} ({name})"
    elif first.aggregate_type == et.SCHEDULE_AGGREGATE_TYPE:
        slots = [e.payload["slot"] for e in events if e.type == et.SCHEDULE_SLOT_FIRED]
        where = f"cron schedule {name}" + (f" (slot {', '.join(slots)})" if slots else "")
    else:
        where = f"{first.aggregate_type} {first.aggregate_id}"
    return f"{where} tenant={first.tenant_id}: {types}"


def rehearse(work: Callable[[], T]) -> Rehearsal[T]:
    """Run ``work()`` in a transaction rolled back at its end; return its result and its events.

    The rollback happens however ``work`` ends (an exception propagates,
    after it). Call it outside any transaction of the caller's: inside one,
    the rollback would be a savepoint's, and a caller's later commit would
    not bring back what the rehearsal saw.
    """
    written: list[Event] = []

    def collect(sender: Any, instance: Event, created: bool, raw: bool, **kwargs: Any) -> None:
        if created and not raw:
            written.append(instance)

    post_save.connect(collect, sender=Event, weak=False)
    try:
        with not_registering_on_connect(), db.atomic():
            try:
                result = work()
            finally:
                db.set_rollback(True)
    finally:
        post_save.disconnect(collect, sender=Event)
    return Rehearsal(result, written)
