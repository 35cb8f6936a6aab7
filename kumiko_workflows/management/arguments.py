"""Argument types shared by the management commands (argparse ``type=``), and refusals."""

from __future__ import annotations

import math
from argparse import ArgumentTypeError
from datetime import datetime

from django.core.management.base import CommandError

from kumiko_workflows.store.event_checks import name_problem
from kumiko_workflows.workflow import clock


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def positive_float(text: str) -> float:
    """A finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise ArgumentTypeError(f"{text!r}: must be greater than 0")
    return value


def aware_instant(text: str) -> datetime:
    """An ISO 8601 instant with a UTC offset (or ``Z``)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ArgumentTypeError(
            f"{text!r} is not an ISO 8601 instant (e.g. 2030-01-01T09:00:00+00:00)"
        ) from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ArgumentTypeError(f"{text!r} has no UTC offset; give one, e.g. {text}+00:00")
    return value


def seconds_or_off(text: str) -> float | None:
    """A number of seconds > 0, or ``off`` (None): a limit that is not checked."""
    if text.strip().lower() == "off":
        return None
    return positive_float(text)


def refuse_writing_rehearsal(now: datetime | None, dry_run: bool, write: bool) -> None:
    """Refuse a pass at a future ``--now`` that would write, unless ``--write`` says so.

    Such a pass does for real what is not due yet (a reminder sent days
    early, a future cron slot fired, after which the schedule's catch-up
    rule skips the real slots in between). A ``--now`` in the past is
    allowed: it only resumes less than a pass now would.
    """
    if dry_run and write:
        raise CommandError("--dry-run writes nothing and --write writes: give one of them")
    current = clock.now()
    if write and (now is None or now <= current):
        raise CommandError("--write goes with a --now later than the current time")
    if now is not None and now > current and not (dry_run or write):
        raise CommandError(
            f"--now {now.isoformat()} is later than the current time "
            f"({current.isoformat(timespec='seconds')}): a pass then would do for real what is "
            "not due yet (resume runs early, fire future cron slots and move their schedules "
            "past the real slots in between). Add --dry-run to see what it would do and write "
            "nothing, or --write to write it anyway"
        )


def tenant_id(text: str) -> str:
    """A tenant id the event store accepts: 1-100 characters, no control character."""
    problem = name_problem(text, "tenant_id")
    if problem:
        raise ArgumentTypeError(f"{text!r}: a tenant id {problem}")
    return text
