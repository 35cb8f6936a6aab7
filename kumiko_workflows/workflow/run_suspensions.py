"""The suspensions the engine or an operator writes, for a run at any position.

A rerun after a failure, a queued start, a compensation, a wait for a
concurrency slot or a rate limit's budget, a debounced start, a start held
behind the run of its key: each a
:class:`~kumiko_workflows.workflow.suspension_record.Record` with
``by_step=False``; the list of all of them is
:mod:`kumiko_workflows.workflow.suspensions`. Pure: no database access.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from kumiko_workflows import signals
from kumiko_workflows.workflow.step_suspensions import EVENT, RETRY
from kumiko_workflows.workflow.suspension_record import (
    Facts,
    Record,
    Teller,
    Words,
    first_attempt,
    instant,
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


def _rerun_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    kept = payload.get("suspension")
    if not kept:  # rerun the step where the failed attempt began, now
        return _due_now(payload, at)
    return _kept_pending(kept)


def _kept_pending(kept: dict[str, Any]) -> dict[str, Any]:
    """A pending row's columns from a suspension kept by ``suspensions.standing``."""
    return {
        "suspension_type": kept["suspension_type"],
        "wake_at": instant(kept.get("wake_at")),
        "timeout_at": instant(kept.get("timeout_at")),
        "retry_attempt": kept.get("retry_attempt") or 0,
        "wait_event_type": kept.get("wait_event_type") or "",
        "awaits_key": kept.get("awaits_key") or "",
        "match_expr": kept.get("match"),
        "awaited_event_id": kept.get("awaited_event_id"),
        "due_since": instant(kept.get("due_since")),
    }


def _rerun_status(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    columns = {"wake_at": at, "failure_reason": "", "error_class": "", "finished_at": None}
    kept = payload.get("suspension")
    if kept:
        columns.update(
            suspension_type=kept["suspension_type"],
            wake_at=instant(kept.get("wake_at")),
            awaited_event_type=kept.get("wait_event_type") or "",
            retry_attempt=kept.get("retry_attempt") or 0,
        )
    return columns


#: Not a step's: ``rerun_run`` (or the admin) asks a failed run to run again:
#: due now at the step where its failed attempt began, or, for a run that
#: failed resuming a suspension, that suspension again (``suspensions.standing``).
RERUN = Record(
    "workflow.rerun-requested",
    "rerun",
    pending=_rerun_pending,
    status=_rerun_status,
    resumes_after_step=False,
    attempt=first_attempt,
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
    attempt=first_attempt,
    facts=lambda row, tell: [("Queued", f"to start in a worker since {tell.when(row.due_since)}")],
    label="queued to start",
    outcome="queued",
    by_step=False,
)


def _compensate_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {"wake_at": instant(payload["wake_at"]), "retry_attempt": payload.get("attempt") or 0}


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


#: Not a step's: a failed (or cancelled) run's finished steps are to be undone.
COMPENSATE = Record(
    "workflow.compensation.scheduled",
    "compensate",
    pending=_compensate_pending,
    status=lambda payload, at: {"wake_at": instant(payload["wake_at"])},
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
        queued_at=instant(payload["queued_at"]),
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
    columns.update(wake_at=instant(payload["wake_at"]), due_since=None)
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
    attempt=first_attempt,
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
    status=lambda payload, at: {"wake_at": instant(payload["wake_at"])},
    resumes_after_step=False,
    attempt=first_attempt,
    facts=_rate_facts,
    by_step=False,
    label="waiting for its rate limit",
    summary=_rate_summary,
)


def _debounced(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    # The burst's latest event is the run's trigger from here on.
    return {
        "wake_at": instant(payload["wake_at"]),
        "trigger_event_id": payload["trigger_event_id"],
    }


def _debounced_facts(row: Any, tell: Teller) -> Facts:
    latest = tell.latest(DEBOUNCED.event_type) or {}
    return [
        (
            "Debounced",
            f"starts at {tell.when(row.wake_at)} with event #{row.trigger_event_id}, the latest "
            f"of its key's burst ({latest.get('events', 1)} so far), unless another comes "
            f"first; at the latest at {tell.when(instant(latest.get('deadline')))}",
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
    attempt=first_attempt,
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
    attempt=first_attempt,
    facts=_held_facts,
    by_step=False,
    label="queued behind the run of its key",
    summary=_gated_summary,
)
