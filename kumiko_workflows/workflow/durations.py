"""ISO 8601 durations and instants, as the wait and retry steps take them.

A wait may be an ISO duration (``PT90S``, ``P1DT2H``, ``P2W``), an ISO instant
with an offset or ``Z``, a ``timedelta`` or an aware ``datetime``. Years and
months are refused: they have no fixed length.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from kumiko_workflows.exceptions import InvalidDuration
from kumiko_workflows.workflow.arguments import clipped_repr

_DURATION = re.compile(
    r"^(?P<sign>-)?P(?!$)"
    r"(?:(?P<years>\d+(?:[.,]\d+)?)Y)?"
    r"(?:(?P<months>\d+(?:[.,]\d+)?)M)?"
    r"(?:(?P<weeks>\d+(?:[.,]\d+)?)W)?"
    r"(?:(?P<days>\d+(?:[.,]\d+)?)D)?"
    r"(?:T(?=\d)"
    r"(?:(?P<hours>\d+(?:[.,]\d+)?)H)?"
    r"(?:(?P<minutes>\d+(?:[.,]\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:[.,]\d+)?)S)?"
    r")?$"
)
_MAX_DURATION = timedelta(days=365 * 1000)
_MAX_TEXT = 64


def parse_duration(text: str) -> timedelta:
    """Parse an ISO 8601 duration such as ``PT90S`` or ``P2W``."""
    if not isinstance(text, str) or len(text) > _MAX_TEXT:
        raise InvalidDuration(f"{clipped_repr(text)} is not an ISO 8601 duration")
    match = _DURATION.match(text.strip().upper())
    if not match:
        raise InvalidDuration(
            f"{clipped_repr(text)} is not an ISO 8601 duration (examples: PT90S, PT1H, P1DT2H, P2W)"
        )
    parts = match.groupdict()
    if parts["sign"]:
        raise InvalidDuration(f"{text!r} is negative; a wait cannot go back in time")
    if parts["years"] or parts["months"]:
        raise InvalidDuration(
            f"{text!r} uses years or months, which have no fixed length; use days or weeks"
        )
    try:
        seconds = sum(
            Decimal(parts[unit].replace(",", ".")) * factor
            for unit, factor in (
                ("weeks", 604800),
                ("days", 86400),
                ("hours", 3600),
                ("minutes", 60),
                ("seconds", 1),
            )
            if parts[unit]
        )
    except InvalidOperation:  # pragma: no cover - the pattern admits only digits
        raise InvalidDuration(f"{text!r} is not an ISO 8601 duration") from None
    if seconds > Decimal(_MAX_DURATION.total_seconds()):
        raise InvalidDuration(f"{text!r} is longer than 1000 years")
    return timedelta(seconds=float(seconds))


def parse_instant(text: str) -> datetime:
    """Parse an ISO 8601 instant; it must carry an offset or ``Z``."""
    if not isinstance(text, str) or len(text) > _MAX_TEXT:
        raise InvalidDuration(f"{clipped_repr(text)} is not an ISO 8601 instant")
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidDuration(
            f"{text!r} is neither an ISO 8601 duration (PT1H) nor an instant (2026-01-31T09:00:00Z)"
        ) from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidDuration(f"{text!r} has no UTC offset; add Z or +01:00")
    return value


def as_delay(value: Any) -> timedelta:
    """A non-negative delay from an ISO duration, a timedelta or seconds."""
    if isinstance(value, timedelta):
        if abs(value) > _MAX_DURATION:
            raise InvalidDuration(f"{clipped_repr(value)} is longer than 1000 years")
        delay = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidDuration(f"{value!r} is not a number of seconds")
        if abs(value) > _MAX_DURATION.total_seconds():
            raise InvalidDuration(f"{value!r} seconds is longer than 1000 years")
        delay = timedelta(seconds=value)
    elif isinstance(value, str):
        delay = parse_duration(value)
    else:
        raise InvalidDuration(
            f"{clipped_repr(value)} is not a duration "
            "(give an ISO 8601 string, a timedelta or seconds)"
        )
    if delay < timedelta(0):
        raise InvalidDuration(f"{clipped_repr(value)} is negative; a delay cannot go back in time")
    return delay


def wake_time(value: Any, now: datetime) -> datetime:
    """When a wait of ``value`` that starts at ``now`` ends, in UTC; never before ``now``.

    An instant in the past means due now.
    """
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidDuration(f"{value.isoformat()} is a naive datetime; give it a time zone")
        instant = value
    elif isinstance(value, str) and not value.strip().upper().lstrip("-").startswith("P"):
        instant = parse_instant(value)
    else:
        delay = parse_duration(value) if isinstance(value, str) else as_delay(value)
        try:
            instant = now + delay
        except OverflowError:
            raise InvalidDuration(f"{clipped_repr(value)} from now is out of range") from None
    try:
        # In UTC, so an instant at the calendar's edge fails here, not when stored.
        return max(instant, now).astimezone(UTC)
    except OverflowError:
        raise InvalidDuration(f"{clipped_repr(value)} is out of range") from None


def check_static(value: Any) -> None:
    """Validate a wait value given at definition time (raises InvalidDuration)."""
    from django.utils import timezone

    wake_time(value, timezone.now())


def describe(value: Any) -> Any:
    """A stable, JSON-able description of a static wait value, for fingerprints."""
    if isinstance(value, timedelta):
        return {"seconds": value.total_seconds()}
    if isinstance(value, datetime):
        return {"instant": value.isoformat()}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"seconds": float(value)}
    return value
