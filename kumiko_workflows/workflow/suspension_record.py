"""The suspension record: what one kind of suspension is, and what it is told with.

A :class:`Record` ties a suspending run event to its ``SuspensionType``, its
rows' columns, where a resume continues, its signal, its telemetry outcome
and its words; :mod:`kumiko_workflows.workflow.suspensions` holds the list
of them. Pure: no database access.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.dispatch import Signal
from django.utils.dateparse import parse_datetime

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


def instant(value: str | None) -> datetime | None:
    """An instant written in a payload (ISO 8601 text, or None)."""
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


def first_attempt(row: Any) -> int:
    """The attempt of a resume that runs its step afresh: the first."""
    return 1
