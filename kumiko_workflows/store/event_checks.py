"""What an append's arguments must be: names that fit their columns, counters, JSON objects.

Each check raises :class:`~kumiko_workflows.exceptions.InvalidEvent` naming
the argument and what was wrong with it; :func:`name_problem` says the same
without raising, for the system checks and the commands.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, cast

from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import Field

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import (
    InvalidEvent,
)
from kumiko_workflows.models import Event
from kumiko_workflows.workflow.arguments import clipped_repr, is_int
from kumiko_workflows.workflow.jsonvalues import (
    NotJSON,
    compact_json,
    text_problem,
    text_size,
    to_json,
)


def _max_length(column: str) -> int:
    length = cast("Field[Any, Any]", Event._meta.get_field(column)).max_length
    assert length is not None, column
    return length


def name_problem(value: Any, column: str, *, blank: bool = False) -> str | None:
    """Why ``value`` cannot be stored in the name column ``column`` of Event, or None.

    Checked before any SQL, so every database answers alike: PostgreSQL raises
    on an overlong value or a NUL (and the raised error aborts the caller's
    transaction) where SQLite stores them. ``blank`` allows the empty string.
    """
    if not isinstance(value, str) or not (blank or value.strip()):
        return f"must be a {'string' if blank else 'non-empty string'}, got {clipped_repr(value)}"
    limit = _max_length(column)
    if len(value) > limit:
        return f"is longer than {limit} characters"
    return text_problem(value, controls=False)


#: Names already found valid, with their column: event types, aggregate
#: types and tenants repeat, so each is checked once. Emptied when full, so
#: it never holds more than _VALID_NAMES_LIMIT (each at most 200 characters).
_valid_names: set[tuple[str, str, bool]] = set()
_VALID_NAMES_LIMIT = 4096


def _name(value: Any, column: str, *, blank: bool = False) -> str:
    if type(value) is str and (value, column, blank) in _valid_names:
        return value
    problem = name_problem(value, column, blank=blank)
    if problem:
        raise InvalidEvent(f"{column} {problem}")
    if type(value) is str:
        if len(_valid_names) >= _VALID_NAMES_LIMIT:
            _valid_names.clear()
        _valid_names.add((value, column, blank))
    return cast(str, value)  # name_problem let only a string through


@functools.cache
def _column_max(column: str) -> int:
    # The range PostgreSQL enforces for the column's type (and raises beyond,
    # aborting the transaction); SQLite would store more.
    field = Event._meta.get_field(column)
    return BaseDatabaseOperations.integer_field_ranges[field.get_internal_type()][1]


def _counter(value: Any, what: str, low: int, high: int) -> None:
    if not is_int(value) or value < low:
        raise InvalidEvent(f"{what} must be an integer >= {low}, got {clipped_repr(value)}")
    if value > high:
        raise InvalidEvent(f"{what} must be at most {high}, got {clipped_repr(value)}")


def _json_object(value: Any, what: str) -> tuple[dict[str, Any], str]:
    """``value`` as plain JSON types, and as the JSON text that is stored."""
    if value is None:
        return {}, "{}"
    if type(value) is not dict and not isinstance(value, Mapping):
        raise InvalidEvent(f"{what} must be a JSON object (a dict), got {type(value).__name__}")
    try:
        clean = to_json(value, what)
    except NotJSON as exc:
        raise InvalidEvent(str(exc)) from None
    text = compact_json(clean)
    limit = workflow_settings.MAX_PAYLOAD_BYTES
    size = text_size(text)
    if size > limit:
        raise InvalidEvent(
            f"{what} is {size} bytes of JSON, over the limit of {limit} bytes "
            "(KUMIKO_WORKFLOWS['MAX_PAYLOAD_BYTES'])"
        )
    return clean, text
