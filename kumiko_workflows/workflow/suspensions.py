"""The suspension records: each way a run can wait, told by one run event.

The one list of suspension kinds. A record ties a suspending run event
(``workflow.step.waiting``, …) to its ``SuspensionType`` (value and label),
to the columns it gives the run's status row and its pending row, to where
a resume continues, to the run signal it sends and its telemetry outcome,
and to the words that explain it. Everything else derives from the records:
the event types (:mod:`kumiko_workflows.workflow.event_types`), the
``SuspensionType`` choices, the projections, the signals
(:mod:`kumiko_workflows.engine.transitions`), the outcome labels
(:mod:`kumiko_workflows.telemetry`) and the timeline's words
(:mod:`kumiko_workflows.operations.explain`); none of them names the kinds.
Step kinds (:mod:`kumiko_workflows.workflow.steps`) say which records they
suspend with (``Step.resumes_from``); a new step kind reuses a record, and a
new record is one more entry in :data:`RECORDS` (or, outside the package,
:func:`register`).

The record itself is :mod:`kumiko_workflows.workflow.suspension_record`;
the records a step writes are in :mod:`kumiko_workflows.workflow.step_suspensions`,
those the engine or an operator writes in
:mod:`kumiko_workflows.workflow.run_suspensions`; this module is their list,
the lookups and the registry of records added outside the package.

Pure functions of an event (or a pending row): no database access.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from kumiko_workflows.workflow.run_suspensions import (
    COMPENSATE,
    DEBOUNCED,
    HELD,
    QUEUED,
    RATE,
    RERUN,
    SLOT,
)
from kumiko_workflows.workflow.step_suspensions import CHILDREN, EVENT, RETRY, WAIT
from kumiko_workflows.workflow.suspension_record import Record

__all__ = [
    "CHILDREN",
    "COMPENSATE",
    "DEBOUNCED",
    "EVENT",
    "HELD",
    "QUEUED",
    "RATE",
    "RECORDS",
    "RERUN",
    "RETRY",
    "SLOT",
    "WAIT",
    "Record",
    "for_event",
    "for_type",
    "records",
    "register",
    "registered",
    "standing",
    "unregister",
]

#: The package's suspension records: the ``SuspensionType`` choices, in this order.
RECORDS = (WAIT, EVENT, RETRY, RERUN, QUEUED, DEBOUNCED, HELD, CHILDREN, COMPENSATE, SLOT, RATE)
_BY_EVENT = {record.event_type: record for record in RECORDS}
_BY_TYPE = {record.suspension_type: record for record in RECORDS}


def standing(row: Any, *, awaited_gone: bool = False) -> dict[str, Any] | None:
    """A pending row's suspension as it stands, for a rerun to resume (None: rerun its step).

    Written into ``workflow.run-failed`` when a run fails at the resume of a
    step's suspension before any step ran (its definition, its trigger or
    awaited event, the engine): ``rerun_run`` then resumes that suspension
    as it was, its deadline and match included, instead of running the
    wait step again with a fresh one. ``awaited_gone``: the event that woke
    the row is gone, so the wait goes on as before it arrived, until its
    deadline. A rerun or a queued start has no deadline to keep.
    """
    record = for_type(row.suspension_type)
    if record is None or not record.by_step:
        return None
    wake_at, due_since, awaited = row.wake_at, row.due_since, row.awaited_event_id
    if awaited_gone:
        wake_at, due_since, awaited = row.timeout_at, None, None
    return {
        "suspension_type": row.suspension_type,
        "wake_at": _text(wake_at),
        "timeout_at": _text(row.timeout_at),
        "retry_attempt": row.retry_attempt,
        "wait_event_type": row.wait_event_type,
        "awaits_key": row.awaits_key,
        "match": row.match_expr,
        "awaited_event_id": awaited,
        "due_since": _text(due_since),
    }


def _text(instant: datetime | None) -> str | None:
    return instant.isoformat() if instant else None


def for_event(event_type: str) -> Record | None:
    """The record a suspending run event writes, or None for any other event."""
    return _BY_EVENT.get(event_type)


def for_type(suspension_type: str) -> Record | None:
    """The record of a pending row's ``suspension_type``, or None if there is none."""
    return _BY_TYPE.get(suspension_type)


def records() -> tuple[Record, ...]:
    """Every record known now: :data:`RECORDS` and those :func:`register` added."""
    return tuple(_BY_EVENT.values())


def register(record: Record) -> Record:
    """Add a suspension record (one a step kind outside the package suspends with).

    Its event type becomes a run event, with its signal, its outcome label
    and its words; a ``SuspensionType`` choice it is not (the column's
    choices are the package's :data:`RECORDS`; rows store any value).
    """
    if not isinstance(record, Record):
        raise TypeError(f"register() takes a suspension Record, got {record!r}")
    if record.event_type in _BY_EVENT or record.suspension_type in _BY_TYPE:
        raise ValueError(
            f"a suspension record for event type {record.event_type!r} or suspension type "
            f"{record.suspension_type!r} exists already"
        )
    _BY_EVENT[record.event_type] = record
    _BY_TYPE[record.suspension_type] = record
    return record


def unregister(record: Record) -> None:
    """Remove a record :func:`register` added (never one of :data:`RECORDS`)."""
    if record in RECORDS:
        raise ValueError(f"{record.suspension_type!r} is one of the package's own records")
    _BY_EVENT.pop(record.event_type, None)
    _BY_TYPE.pop(record.suspension_type, None)


@contextmanager
def registered(*added: Record) -> Iterator[None]:
    """Records :func:`register` adds for the duration of a block (tests)."""
    for record in added:
        register(record)
    try:
        yield
    finally:
        for record in added:
            unregister(record)
