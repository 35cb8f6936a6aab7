"""Argument types shared by the management commands (argparse ``type=``)."""

from __future__ import annotations

import math
from argparse import ArgumentTypeError
from datetime import datetime

from kumiko_workflows.store.events import name_problem


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


def tenant_id(text: str) -> str:
    """A tenant id the event store accepts: 1-100 characters, no control character."""
    problem = name_problem(text, "tenant_id")
    if problem:
        raise ArgumentTypeError(f"{text!r}: a tenant id {problem}")
    return text
