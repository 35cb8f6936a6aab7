"""The suspensions a step writes: a timed wait, a wait for an event, a retry's backoff, child runs.

Each is a :class:`~kumiko_workflows.workflow.suspension_record.Record` that
a built-in step kind lists in ``Step.resumes_from``; the list of all of
them is :mod:`kumiko_workflows.workflow.suspensions`. Pure: no database
access.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kumiko_workflows import signals
from kumiko_workflows.workflow.suspension_record import (
    Facts,
    Record,
    Teller,
    Words,
    first_attempt,
    instant,
)


def _timed(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {"wake_at": instant(payload["wake_at"])}


def _event_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    timeout_at = instant(payload.get("timeout_at"))
    return {
        "wake_at": timeout_at,
        "timeout_at": timeout_at,
        "wait_event_type": payload["event_type"],
        "awaits_key": payload["awaits_key"],
        "match_expr": payload.get("match"),
    }


def _event_status(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {
        "wake_at": instant(payload.get("timeout_at")),
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
    return {"wake_at": instant(payload["wake_at"]), "retry_attempt": payload["attempt"]}


def _retry_status(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {
        "wake_at": instant(payload["wake_at"]),
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


WAIT = Record(
    "workflow.step.waiting",
    "wait",
    pending=_timed,
    status=_timed,
    resumes_after_step=True,
    attempt=first_attempt,
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
    attempt=first_attempt,
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


def _children_pending(payload: dict[str, Any], at: datetime) -> dict[str, Any]:
    timeout_at = instant(payload.get("timeout_at"))
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


#: A ``call_workflow`` or ``fan_out`` step waits for its child runs; the last
#: to finish wakes it (or its timeout does). The step runs again at its
#: resume, and finds its children's results.
CHILDREN = Record(
    "workflow.step.waiting-for-children",
    "children",
    pending=_children_pending,
    status=lambda payload, at: {"wake_at": instant(payload.get("timeout_at"))},
    resumes_after_step=False,
    attempt=first_attempt,
    facts=_children_facts,
    label="child runs",
    signal=signals.run_suspended,
    outcome="suspended",
)
