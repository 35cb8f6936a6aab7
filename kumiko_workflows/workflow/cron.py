"""Cron triggers: the expression's validation and the pure arithmetic of its slots.

Slots are wall-clock times in the schedule's time zone. They are enumerated
on naive local time (so each wall time exists once) and then placed on the
time line: a wall time in a skipped hour fires at the end of the gap, a wall
time in a repeated hour fires once, at its first occurrence after the last
fired slot. (croniter itself fires a repeated wall time twice.)

Firing the slots (the schedule streams) is the engine's: :mod:`kumiko_workflows.engine.cron`.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kumiko_workflows.exceptions import (
    WorkflowDefinitionError,
)

CATCH_UP_POLICIES = ("skip", "latest", "all")
#: A cron expression must fire within this many years of its definition.
CRON_HORIZON_YEARS = 5
#: croniter's random (R) and hashed (H) fields, as croniter itself matches them.
_HASHED_FIELD = re.compile(r"([hr])(\(\d+-\d+\))?(/\d+)?", re.IGNORECASE | re.ASCII)


@dataclass(frozen=True, eq=False)
class CronTrigger:
    expression: str
    timezone: str = "UTC"
    catch_up: str = "latest"
    kind = "cron"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "cron",
            "expression": self.expression,
            "timezone": self.timezone,
            "catch_up": self.catch_up,
        }

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)


def cron_problem(
    expression: Any, timezone: Any, catch_up: Any, *, now: datetime | None = None
) -> str | None:
    """Why a cron trigger's arguments are invalid, or None.

    Besides syntax: every slot must be a fixed time (no random or hashed
    field), and the expression must fire within :data:`CRON_HORIZON_YEARS`
    after ``now`` (default: the current time).
    """
    from croniter import CroniterBadDateError, croniter

    if not isinstance(expression, str) or not expression.strip():
        return f"cron expression must be a non-empty string, got {expression!r}"
    fields = expression.split()
    if len(fields) not in (5, 6):
        return (
            f"cron expression {expression!r} has {len(fields)} fields; give 5 "
            "(minute hour day month weekday) or 6 (with seconds last)"
        )
    for field in fields:
        hashed = _HASHED_FIELD.fullmatch(field)
        if hashed and hashed.group(1).lower() == "r":
            # croniter accepts R, then draws a new value each time it reads the
            # expression: each pass would see another slot (a daily R R * * *
            # polled every minute fired 55 runs a day).
            return (
                f"cron expression {expression!r} has the random field {field!r}: croniter "
                "draws a new value each time it reads it, so each scheduler pass would see "
                "another slot and fire again; write the time out"
            )
        if hashed:
            return (
                f"cron expression {expression!r} has the hashed field {field!r}, which "
                "croniter resolves only with a hash id that on_cron does not take; write "
                "the time out"
            )
    try:
        if not croniter.is_valid(expression):
            return f"cron expression {expression!r} is not valid"
    except Exception as exc:  # croniter raises assorted errors on odd input
        return f"cron expression {expression!r} is not valid: {exc}"
    if not isinstance(timezone, str):
        return f"cron timezone must be an IANA name like 'Europe/Berlin', got {timezone!r}"
    try:
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f"cron timezone {timezone!r} is not a known IANA time zone"
    if catch_up not in CATCH_UP_POLICIES:
        return f"cron catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, got {catch_up!r}"
    start = (now or datetime.now(UTC)).astimezone(zoneinfo.ZoneInfo(timezone))
    try:
        croniter(
            expression, start.replace(tzinfo=None), max_years_between_matches=CRON_HORIZON_YEARS
        ).get_next(datetime)
    except CroniterBadDateError:
        # Valid to croniter, yet no date matches (30 February): every pass and
        # every look at the next slot would raise.
        return (
            f"cron expression {expression!r} never fires within the next "
            f"{CRON_HORIZON_YEARS} years: no date matches its day, month and weekday fields"
        )
    return None


def on_cron(expression: str, timezone: str = "UTC", catch_up: str = "latest") -> CronTrigger:
    """Start a run at each slot of a cron expression, in ``timezone``.

    ``catch_up`` says what a pass does with slots missed while no scheduler
    ran: ``skip`` fires none, ``latest`` fires the most recent once, ``all``
    fires each (at most ``KUMIKO_WORKFLOWS['CRON_CATCH_UP_LIMIT']`` a pass).
    """
    problem = cron_problem(expression, timezone, catch_up)
    if problem:
        raise WorkflowDefinitionError(f"[kumiko_workflows.E008] {problem}")
    return CronTrigger(expression, timezone, catch_up)


# --- the time line ------------------------------------------------------------


def _wall(instant: datetime, trigger: CronTrigger) -> datetime:
    """The naive local wall time of ``instant`` in the schedule's zone."""
    return instant.astimezone(trigger.zone).replace(tzinfo=None)


def _place(wall: datetime, trigger: CronTrigger, after: datetime) -> datetime:
    """The UTC instant a slot at local ``wall`` fires, given the last slot was ``after``.

    A wall time that does not exist (the spring gap) fires when the gap ends;
    one that exists twice (the autumn fold) fires at its first occurrence
    later than ``after``.
    """
    zone = trigger.zone
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if _wall(first, trigger) != wall:
        # In a gap PEP 495 gives two instants around the transition: fold=1
        # (the later offset) is before it, fold=0 after it. Find the first
        # second whose wall time has reached ``wall``: the end of the gap.
        low, high = int(min(first, second).timestamp()), int(max(first, second).timestamp())
        while high - low > 1:
            middle = (low + high) // 2
            if _wall(datetime.fromtimestamp(middle, UTC), trigger) >= wall:
                high = middle
            else:
                low = middle
        return datetime.fromtimestamp(high, UTC)
    if first != second and first <= after:
        return second
    return first


def _walls(trigger: CronTrigger, start: datetime) -> Iterator[datetime]:
    """Naive wall times of the expression's slots strictly after naive ``start``."""
    from croniter import croniter

    cron = croniter(trigger.expression, start)
    while True:
        yield cron.get_next(datetime)


def _walls_before(trigger: CronTrigger, start: datetime, count: int) -> datetime:
    """The wall time ``count`` slots before naive ``start`` (``start`` itself for 0)."""
    from croniter import croniter

    cron = croniter(trigger.expression, start)
    wall = start
    for _ in range(count):
        wall = cron.get_prev(datetime)
    return wall


def slots_between(
    trigger: CronTrigger, after: datetime, until: datetime, *, start_wall: datetime | None = None
) -> Iterator[datetime]:
    """UTC instants of the slots in ``(after, until]``, in order, each instant once."""
    last = after
    wall_after = _wall(after, trigger)
    for wall in _walls(trigger, max(wall_after, start_wall) if start_wall else wall_after):
        instant = _place(wall, trigger, after)
        if instant > until:
            return
        if instant > last:  # several skipped wall times share the end of their gap
            last = instant
            yield instant


def next_slot(trigger: CronTrigger, after: datetime) -> datetime:
    """The first slot strictly after ``after`` (UTC)."""
    for wall in _walls(trigger, _wall(after, trigger)):
        instant = _place(wall, trigger, after)
        if instant > after:
            return instant
    raise AssertionError("unreachable")  # pragma: no cover - the iterator is endless
