"""The purge's cut-off: ``--older-than`` durations and instants, and the ``RETENTION`` setting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import InvalidArgument, InvalidDuration
from kumiko_workflows.workflow.arguments import clipped_repr
from kumiko_workflows.workflow.durations import parse_duration

# --- the cut-off ------------------------------------------------------------------


def parse_cutoff(value: Any, now: datetime | None = None) -> datetime:
    """The instant runs must have finished before to be purged, in UTC.

    ``value`` is an ISO 8601 duration (``P30D``: finished more than 30 days
    before ``now``) or instant with a UTC offset, a ``timedelta`` or an aware
    ``datetime``. A negative duration, an instant after ``now`` (a mistyped
    year would purge everything; ``PT0S`` says "until now"), a naive instant
    and anything unparsable raise :class:`InvalidArgument`.
    """
    moment = timezone.now() if now is None else now
    if isinstance(value, str):
        text = value.strip()
        if text.upper().startswith(("P", "-P")):
            if text.startswith("-"):
                raise InvalidArgument(
                    f"{clipped_repr(value)} is a negative duration; give how long finished runs "
                    "are kept, e.g. P30D"
                )
            try:
                value = parse_duration(text)
            except InvalidDuration as exc:
                raise InvalidArgument(str(exc)) from None
        else:
            try:
                value = datetime.fromisoformat(text)
            except ValueError:
                raise InvalidArgument(
                    f"{clipped_repr(value)} is neither an ISO 8601 duration (P30D, PT12H) nor an "
                    "instant with a UTC offset (2026-01-31T00:00:00Z)"
                ) from None
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise InvalidArgument(f"{value} is a negative duration")
        try:
            return (moment - value).astimezone(UTC)
        except OverflowError:
            raise InvalidArgument(f"{value} before now is out of range") from None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgument(f"{value.isoformat()} has no UTC offset; add Z or +01:00")
        try:
            instant = value.astimezone(UTC)
        except OverflowError:  # 0001-01-01T00:00:00+14:00 is before the year 1 in UTC
            raise InvalidArgument(
                f"{value.isoformat()} is out of range: it falls outside the years 1-9999 in UTC"
            ) from None
        if instant > moment:
            raise InvalidArgument(
                f"{value.isoformat()} is in the future; to purge every run finished until now, "
                "give PT0S"
            )
        return instant
    raise InvalidArgument(
        f"{clipped_repr(value)} is not a cut-off: give an ISO 8601 duration (P30D) or instant, "
        "a timedelta or an aware datetime"
    )


def retention_problem(value: Any) -> str | None:
    """Why ``value`` cannot be ``KUMIKO_WORKFLOWS["RETENTION"]``, or None."""
    if value is None:
        return None
    if isinstance(value, str) and not value.strip().upper().startswith(("P", "-P")):
        return f"must be an ISO 8601 duration such as 'P30D', got {clipped_repr(value)}"
    if not isinstance(value, str | timedelta):
        shown = clipped_repr(value)
        return f"must be an ISO 8601 duration such as 'P30D' or a timedelta, got {shown}"
    try:
        parse_cutoff(value)
    except InvalidArgument as exc:
        return str(exc)
    return None


def default_retention() -> Any:
    """``KUMIKO_WORKFLOWS["RETENTION"]`` (None when unset)."""
    return workflow_settings.RETENTION
