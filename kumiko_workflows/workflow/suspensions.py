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

Pure functions of an event (or a pending row): no database access.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.dispatch import Signal
from django.utils.dateparse import parse_datetime

from kumiko_workflows import signals

Facts = list[tuple[str, str]]


class Teller(Protocol):
    """What an explanation is told with (the admin's :mod:`kumiko_workflows.operations.explain`)."""

    #: The run's status row.
    run: Any

    def when(self, instant: datetime | None) -> str:
        """An instant for people."""

    def match(self, expression: Any) -> str:
        """A stored match expression in words."""

    def latest(self, event_type: str) -> dict[str, Any] | None:
        """The payload of the run's latest event of ``event_type``, if any."""


class Words(Protocol):
    """What a run event is put in words with (a timeline entry: no run at hand)."""

    def instant(self, value: Any) -> str:
        """An instant written in a payload (ISO 8601 text), for people."""

    def match(self, expression: Any) -> str:
        """A stored match expression in words."""


def _instant(value: str | None) -> datetime | None:
    return parse_datetime(value) if value else None


@dataclass(frozen=True)
class Record:
    """One kind of suspension; see the module docstring."""

    #: The run event that suspends a run this way.
    event_type: str
    #: ``SuspensionType`` of the pending and status rows.
    suspension_type: str
    #: The pending row's columns (beyond those every suspension has).
    pending: Callable[[dict[str, Any], datetime], dict[str, Any]]
    #: The run status row's columns while it waits (beyond status and step).
    status: Callable[[dict[str, Any], datetime], dict[str, Any]]
    #: Whether a resume continues after the step (a wait) or runs it again.
    resumes_after_step: bool
    #: The attempt a resume at the step runs, from the pending row.
    attempt: Callable[[Any], int]
    #: What to tell people about a pending row of this kind.
    facts: Callable[[Any, Teller], Facts]
    #: The ``SuspensionType`` choice's label (its value is ``suspension_type``).
    label: str = ""
    #: The run signal its event sends (:data:`kumiko_workflows.signals.run_suspended`
    #: for a step's wait), or None: a rerun or a queued start is no transition.
    signal: Signal | None = None
    #: The segment outcome its event means in telemetry (``kumiko.segment`` spans).
    outcome: str | None = None
    #: The event in words on the run's timeline (None: its payload's fields).
    summary: Callable[[dict[str, Any], Words], str] | None = None
    #: Written by a step (which lists it in ``Step.resumes_from``), or by the
    #: engine or an operator for a run at any position (a rerun, a queued start).
    by_step: bool = True

    @property
    def name(self) -> str:
        """The ``SuspensionType`` member's name: ``"WAIT"`` for ``"wait"``."""
        return self.suspension_type.upper()

    def pending_columns(self, payload: dict[str, Any], at: datetime) -> dict[str, Any]:
        return {"suspension_type": self.suspension_type, **self.pending(payload, at)}

    def status_columns(self, payload: dict[str, Any], at: datetime) -> dict[str, Any]:
        return {
            "status": "waiting",
            "step": payload["step"],
            "suspension_type": self.suspension_type,
            "awaited_event_type": "",
            "retry_attempt": 0,
            **self.status(payload, at),
        }


def _first_attempt(row: Any) -> int:
    return 1


def _timed(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {"wake_at": _instant(payload["wake_at"])}


def _event_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    timeout_at = _instant(payload.get("timeout_at"))
    return {
        "wake_at": timeout_at,
        "timeout_at": timeout_at,
        "wait_event_type": payload["event_type"],
        "awaits_key": payload["awaits_key"],
        "match_expr": payload.get("match"),
    }


def _event_status(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {
        "wake_at": _instant(payload.get("timeout_at")),
        "awaited_event_type": payload["event_type"],
    }


def _event_facts(row: Any, tell: Teller) -> Facts:
    facts = [
        ("Waiting for", f"a {row.wait_event_type!r} event where {tell.match(row.match_expr)}"),
        (
            "Deadline",
            tell.when(row.timeout_at)
            if row.timeout_at
            else "none: only the event, a wake or a cancel ends the wait",
        ),
    ]
    if row.awaited_event_id is not None:
        arrived = tell.when(row.due_since)
        facts.append(("Awaited event", f"#{row.awaited_event_id} arrived at {arrived}"))
    return facts


def _retry_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {"wake_at": _instant(payload["wake_at"]), "retry_attempt": payload["attempt"]}


def _retry_status(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {
        "wake_at": _instant(payload["wake_at"]),
        "retry_attempt": payload["attempt"],
        "error_class": payload.get("error_class", ""),
    }


def _retry_facts(row: Any, tell: Teller) -> Facts:
    scheduled = tell.latest(RETRY.event_type) or {}
    most = scheduled.get("max_attempts") or "?"
    error = tell.run.error_class or "an error"
    return [
        (
            "Retry",
            f"attempt {row.retry_attempt} of {most} failed with {error}; "
            f"attempt {row.retry_attempt + 1} at {tell.when(row.wake_at)}",
        )
    ]


def _attempts(payload: dict[str, Any]) -> str:
    """``"attempt 2 of 3"`` from a payload's ``attempt`` and ``max_attempts``."""
    return f"attempt {payload.get('attempt')} of {payload.get('max_attempts') or '?'}"


def _wait_summary(payload: dict[str, Any], words: Words) -> str:
    return f"waits until {words.instant(payload.get('wake_at'))}"


def _event_summary(payload: dict[str, Any], words: Words) -> str:
    timeout_at = payload.get("timeout_at")
    deadline = words.instant(timeout_at) if timeout_at else "none"
    return (
        f"waits for a {payload.get('event_type')!r} event where "
        f"{words.match(payload.get('match'))}; deadline {deadline}"
    )


def _retry_summary(payload: dict[str, Any], words: Words) -> str:
    # Counted as the error text counts them: a retry that schedules attempt 2
    # says attempt 1 failed.
    return (
        f"{_attempts(payload)} failed with {payload.get('error_class') or payload.get('reason')}; "
        f"attempt {(payload.get('attempt') or 0) + 1} at {words.instant(payload.get('wake_at'))}"
    )


def _rerun_summary(payload: dict[str, Any], words: Words) -> str:
    kept = payload.get("suspension")
    if not isinstance(kept, dict):
        return "runs again from where the failed attempt began"
    kind = kept.get("suspension_type")
    if kind == EVENT.suspension_type:
        deadline = words.instant(kept.get("timeout_at")) if kept.get("timeout_at") else "none"
        return f"resumes its wait for the event as it was; deadline {deadline}"
    if kind == RETRY.suspension_type:
        return (
            f"resumes its retry backoff as it was: attempt "
            f"{(kept.get('retry_attempt') or 0) + 1} at {words.instant(kept.get('wake_at'))}"
        )
    return f"resumes its wait as it was, until {words.instant(kept.get('wake_at'))}"


def _due_now(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {"wake_at": at, "due_since": at}


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


def _rerun_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    kept = payload.get("suspension")
    if not kept:  # rerun the step where the failed attempt began, now
        return _due_now(payload, at)
    return _kept_pending(kept)


def _kept_pending(kept: dict[str, Any]) -> dict[str, Any]:
    """A pending row's columns from a suspension kept by :func:`standing`."""
    return {
        "suspension_type": kept["suspension_type"],
        "wake_at": _instant(kept.get("wake_at")),
        "timeout_at": _instant(kept.get("timeout_at")),
        "retry_attempt": kept.get("retry_attempt") or 0,
        "wait_event_type": kept.get("wait_event_type") or "",
        "awaits_key": kept.get("awaits_key") or "",
        "match_expr": kept.get("match"),
        "awaited_event_id": kept.get("awaited_event_id"),
        "due_since": _instant(kept.get("due_since")),
    }


def _rerun_status(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    columns = {"wake_at": at, "failure_reason": "", "error_class": "", "finished_at": None}
    kept = payload.get("suspension")
    if kept:
        columns.update(
            suspension_type=kept["suspension_type"],
            wake_at=_instant(kept.get("wake_at")),
            awaited_event_type=kept.get("wait_event_type") or "",
            retry_attempt=kept.get("retry_attempt") or 0,
        )
    return columns


WAIT = Record(
    "workflow.step.waiting",
    "wait",
    pending=_timed,
    status=_timed,
    resumes_after_step=True,
    attempt=_first_attempt,
    facts=lambda row, tell: [("Wakes at", tell.when(row.wake_at))],
    label="wait",
    signal=signals.run_suspended,
    outcome="suspended",
    summary=_wait_summary,
)
EVENT = Record(
    "workflow.step.waiting-for-event",
    "event",
    pending=_event_pending,
    status=_event_status,
    resumes_after_step=True,
    attempt=_first_attempt,
    facts=_event_facts,
    label="wait for event",
    signal=signals.run_suspended,
    outcome="suspended",
    summary=_event_summary,
)
RETRY = Record(
    "workflow.retry.scheduled",
    "retry",
    pending=_retry_pending,
    status=_retry_status,
    resumes_after_step=False,
    attempt=lambda row: row.retry_attempt + 1,
    facts=_retry_facts,
    label="retry backoff",
    signal=signals.run_suspended,
    outcome="suspended",
    summary=_retry_summary,
)
#: Not a step's: ``rerun_run`` (or the admin) asks a failed run to run again:
#: due now at the step where its failed attempt began, or, for a run that
#: failed resuming a suspension, that suspension again (:func:`standing`).
RERUN = Record(
    "workflow.rerun-requested",
    "rerun",
    pending=_rerun_pending,
    status=_rerun_status,
    resumes_after_step=False,
    attempt=_first_attempt,
    facts=lambda row, tell: [("Rerun", f"requested at {tell.when(row.due_since)}")],
    label="rerun after failure",
    summary=_rerun_summary,
    by_step=False,
)
#: Not a step's: a run of a workflow that starts in the worker, due at once
#: at its first step (``define_workflow(..., start="worker")``).
QUEUED = Record(
    "workflow.run-queued",
    "queued",
    pending=_due_now,
    status=lambda payload, at: {"wake_at": at},
    resumes_after_step=False,
    attempt=_first_attempt,
    facts=lambda row, tell: [("Queued", f"to start in a worker since {tell.when(row.due_since)}")],
    label="queued to start",
    outcome="queued",
    by_step=False,
)


def _children_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    timeout_at = _instant(payload.get("timeout_at"))
    return {"wake_at": timeout_at, "timeout_at": timeout_at, "awaits_key": payload["group"]}


def _children_facts(row: Any, tell: Teller) -> Facts:
    suspended = tell.latest(CHILDREN.event_type) or {}
    facts = [
        (
            "Waiting for",
            f"{suspended.get('total', '?')} child run(s) of {suspended.get('workflow', '?')!r} "
            "to finish",
        )
    ]
    if row.timeout_at:
        facts.append(("Deadline", tell.when(row.timeout_at)))
    if row.awaited_event_id is not None:
        facts.append(("Children", f"all finished (the last: event #{row.awaited_event_id})"))
    return facts


def _compensate_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {"wake_at": _instant(payload["wake_at"]), "retry_attempt": payload.get("attempt") or 0}


def _compensate_facts(row: Any, tell: Teller) -> Facts:
    kept = (row.state or {}).get("compensation") or {}
    left = kept.get("left") or []
    why = "cancelled" if kept.get("cancel") else "a step failed"
    return [
        (
            "Compensating",
            f"{why}: {len(left)} step(s) left to undo ({', '.join(left)}), "
            f"next at {tell.when(row.wake_at)}",
        )
    ]


#: A ``call_workflow`` or ``fan_out`` step waits for its child runs; the last
#: to finish wakes it (or its timeout does). The step runs again at its
#: resume, and finds its children's results.
CHILDREN = Record(
    "workflow.step.waiting-for-children",
    "children",
    pending=_children_pending,
    status=lambda payload, at: {"wake_at": _instant(payload.get("timeout_at"))},
    resumes_after_step=False,
    attempt=_first_attempt,
    facts=_children_facts,
    label="child runs",
    signal=signals.run_suspended,
    outcome="suspended",
)
#: Not a step's: a failed (or cancelled) run's finished steps are to be undone.
COMPENSATE = Record(
    "workflow.compensation.scheduled",
    "compensate",
    pending=_compensate_pending,
    status=lambda payload, at: {"wake_at": _instant(payload["wake_at"])},
    resumes_after_step=False,
    attempt=lambda row: row.retry_attempt + 1,
    facts=_compensate_facts,
    by_step=False,
    label="compensating",
    signal=signals.run_suspended,
    outcome="suspended",
)


def _slot_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    # The suspension it was claimed from, kept as it stood (None: a queued
    # start or a rerun, which run their step again), out of the due range
    # until a slot is offered.
    kept = payload.get("suspension")
    columns = _kept_pending(kept) if kept else {}
    columns.update(
        wake_at=None,
        limit_key=payload["limit_key"],
        queued_at=_instant(payload["queued_at"]),
    )
    return columns


def _slot_facts(row: Any, tell: Teller) -> Facts:
    key = f" of key {row.limit_key!r}" if row.limit_key else ""
    waiting = tell.latest(SLOT.event_type) or {}
    held = waiting.get("holders")
    behind = f"behind {held} active run(s){key}" if held is not None else f"for a slot{key}"
    return [("Queued", f"{behind} (concurrency limit) since {tell.when(row.queued_at)}")]


def _rate_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    kept = payload.get("suspension")
    columns = _kept_pending(kept) if kept else {}
    columns.update(wake_at=_instant(payload["wake_at"]), due_since=None)
    return columns


def _rate_facts(row: Any, tell: Teller) -> Facts:
    return [("Rate limit", f"next start allowed at {tell.when(row.wake_at)}")]


def _key_words(payload: dict[str, Any]) -> str:
    key = payload.get("limit_key") or ""
    return f" of key {key!r}" if key else ""


def _slot_summary(payload: dict[str, Any], words: Words) -> str:
    get = payload.get
    return f"queues for a slot{_key_words(payload)}: {get('holders')} of {get('max')} taken"


def _rate_summary(payload: dict[str, Any], words: Words) -> str:
    get = payload.get
    return (
        f"rate limit of {get('max')} per {get('per')} s spent: "
        f"next start at {words.instant(get('wake_at'))}"
    )


def _gated_summary(payload: dict[str, Any], words: Words) -> str:
    type = DEBOUNCED.event_type if "trigger_event_id" in payload else HELD.event_type
    return gated_text(type, payload, words.instant)


#: Not a step's: a run of a workflow with a concurrency limit (``Limit``)
#: found every slot of its key taken when it was due; it waits, out of the
#: due range, until a slot is offered to it (``workflow.slot-offered``),
#: then resumes the suspension it was claimed from.
SLOT = Record(
    "workflow.slot-waiting",
    "limited",
    pending=_slot_pending,
    status=lambda payload, at: {"wake_at": None},
    resumes_after_step=False,
    attempt=_first_attempt,
    facts=_slot_facts,
    by_step=False,
    label="queued for a concurrency slot",
    summary=_slot_summary,
)
#: Not a step's: a run of a rate-limited workflow (``Rate``) found its
#: budget spent; it is due again when the budget allows a start.
RATE = Record(
    "workflow.rate-waiting",
    "rate",
    pending=_rate_pending,
    status=lambda payload, at: {"wake_at": _instant(payload["wake_at"])},
    resumes_after_step=False,
    attempt=_first_attempt,
    facts=_rate_facts,
    by_step=False,
    label="waiting for its rate limit",
    summary=_rate_summary,
)


def _debounced(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    # The burst's latest event is the run's trigger from here on.
    return {
        "wake_at": _instant(payload["wake_at"]),
        "trigger_event_id": payload["trigger_event_id"],
    }


def _debounced_facts(row: Any, tell: Teller) -> Facts:
    latest = tell.latest(DEBOUNCED.event_type) or {}
    return [
        (
            "Debounced",
            f"starts at {tell.when(row.wake_at)} with event #{row.trigger_event_id}, the latest "
            f"of its key's burst ({latest.get('events', 1)} so far), unless another comes "
            f"first; at the latest at {tell.when(_instant(latest.get('deadline')))}",
        )
    ]


def _held_facts(row: Any, tell: Teller) -> Facts:
    held = tell.latest(HELD.event_type) or {}
    return [
        (
            "Queued",
            f"behind the active run of key {held.get('key', '?')!r} (singleton): starts when "
            "the runs of its key before it have ended",
        )
    ]


def gated_text(type: str, payload: dict[str, Any], when: Callable[[Any], str]) -> str:
    """A debounced or held run event in words (the run's timeline)."""
    get = payload.get
    if type == DEBOUNCED.event_type:
        return (
            f"debounced: starts at {when(get('wake_at'))} with event "
            f"#{get('trigger_event_id')} (event {get('events')} of its key's burst), unless "
            f"another comes first; at the latest at {when(get('deadline'))}"
        )
    return (
        f"queued behind run {get('behind')} of key {get('key')!r} (singleton): starts "
        "when the runs of its key before it have ended"
    )


#: Not a step's: a run of a debounced trigger (``on_event(debounce=...)``),
#: due when its key's burst of events has been quiet for the period.
DEBOUNCED = Record(
    "workflow.run-debounced",
    "debounced",
    pending=_debounced,
    status=_debounced,
    resumes_after_step=False,
    attempt=_first_attempt,
    facts=_debounced_facts,
    by_step=False,
    label="debounced start",
    summary=_gated_summary,
)
#: Not a step's: a run of a ``singleton="queue"`` workflow behind the active
#: run of its key; never due until the gate wakes it.
HELD = Record(
    "workflow.run-held",
    "held",
    pending=lambda payload, at: {"wake_at": None},
    status=lambda payload, at: {"wake_at": None},
    resumes_after_step=False,
    attempt=_first_attempt,
    facts=_held_facts,
    by_step=False,
    label="queued behind the run of its key",
    summary=_gated_summary,
)

#: The package's suspension records: the ``SuspensionType`` choices, in this order.
RECORDS = (WAIT, EVENT, RETRY, RERUN, QUEUED, DEBOUNCED, HELD, CHILDREN, COMPENSATE, SLOT, RATE)
_BY_EVENT = {record.event_type: record for record in RECORDS}
_BY_TYPE = {record.suspension_type: record for record in RECORDS}


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
