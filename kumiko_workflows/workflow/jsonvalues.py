"""Turning Python values into the JSON an event or a step result may hold.

Errors name the key path of the offending value (``payload['items'][2]``) so a
caller sees at once what to fix. What is refused is what some supported
database would refuse or change, so that SQLite and PostgreSQL store alike.

Django's own values are encoded as ``DjangoJSONEncoder`` encodes them
(``Decimal``, ``UUID`` and lazy text as strings, dates and times in ISO 8601,
``timedelta`` as an ISO 8601 duration), with three differences, each to keep
a guarantee: datetimes and times keep their microseconds and their offset as
``isoformat()`` writes it (the encoder cuts to milliseconds and writes UTC as
``Z``: the value would no longer read back as the instant stored, and events
appended before would no longer equal new ones); a naive datetime is refused
(the encoder writes it without an offset, an instant nobody can place); a
``Decimal`` NaN or infinity is refused, as a float one is.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.utils.duration import duration_iso_string
from django.utils.functional import Promise

MAX_DEPTH = 64

#: Integers are held exactly within the signed 64-bit range only. PostgreSQL's
#: jsonb keeps any size, but SQLite's JSON functions (which JSONField lookups
#: use there) turn a larger one into a float, and Python will not even print
#: one of more than 4,300 digits; so a bigger integer is refused everywhere.
MIN_INT, MAX_INT = -(2**63), 2**63 - 1

#: Unicode's control characters (category Cc): C0, DEL and C1.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


class NotJSON(ValueError):
    """A value cannot be stored as JSON; the message names its key path."""


class _Refused(Exception):
    """A value :func:`to_json` refuses; ``path`` collects its keys, innermost first.

    The key path of the message is only built for a refused value: formatting
    it for every accepted key was most of the cost of checking a payload.
    """

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = []


def to_json(value: Any, where: str) -> Any:
    """Return ``value`` as plain JSON types, or raise :class:`NotJSON`.

    Aware datetimes, dates and naive times become ISO 8601 strings, timedeltas
    ISO 8601 durations (``P0DT01H00M00S``), and ``Decimal``, ``UUID`` and lazy
    translations strings (see the module docstring); naive datetimes, aware
    times, NaN/infinity (float or ``Decimal``), integers beyond 64 bits
    (:data:`MIN_INT`, :data:`MAX_INT`), text with NUL or lone surrogates,
    non-string keys and any other object are refused.
    """
    if type(value) is dict:
        flat = _flat(value)
        if flat is not None:
            return flat
    try:
        return _clean(value, 0)
    except _Refused as refused:
        raise NotJSON(f"{where}{''.join(reversed(refused.path))} {refused.problem}") from None


def _flat(value: dict[Any, Any]) -> dict[str, Any] | None:
    """A copy of ``value`` if it is one level of plain scalars under string keys, else None.

    That is most event payloads, checked here in one loop without a call per
    value; anything else (nesting, another type, a NUL, a lone surrogate, a
    big integer, NaN) returns None for :func:`_clean` to check in full.
    """
    for key, item in value.items():
        if type(key) is not str or "\x00" in key or not _encodable(key):
            return None
        kind = type(item)
        if kind is str:
            if "\x00" in item or not _encodable(item):
                return None
        elif kind is int:
            if not MIN_INT <= item <= MAX_INT:
                return None
        elif kind is float:
            if not math.isfinite(item):
                return None
        elif item is not None and kind is not bool:
            return None
    return dict(value)


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _clean(value: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _Refused(f"is nested more than {MAX_DEPTH} levels deep")
    # The exact types of a parsed JSON document's branches first (no need to
    # try the scalar types on them), then each kind in turn, subclasses too.
    kind = type(value)
    if kind is dict:
        return _clean_mapping(value, depth)
    if kind is list:
        return _clean_items(value, depth)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not MIN_INT <= value <= MAX_INT:
            raise _Refused(
                "is an integer beyond the 64-bit range (-2**63 to 2**63-1) that every "
                "supported database stores exactly; store it as a string"
            )
        return value
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise _Refused(problem)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Refused(f"is {value!r}, which JSON cannot hold")
        return value
    if isinstance(value, Mapping):
        return _clean_mapping(value, depth)
    if isinstance(value, list | tuple):
        return _clean_items(value, depth)
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise _Refused(f"is a naive datetime ({value.isoformat()}); give it a time zone")
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise _Refused(f"is Decimal({str(value)!r}), which JSON cannot hold")
        return str(value)
    if isinstance(value, time):
        if value.tzinfo is not None:
            # As DjangoJSONEncoder: a zone's offset depends on the day, so a
            # time of day in a zone is no instant (and isoformat() would drop
            # a ZoneInfo without a word).
            raise _Refused(
                f"is a time with a time zone ({value.replace(tzinfo=None).isoformat()} in "
                f"{value.tzinfo}); store the naive time, or an aware datetime"
            )
        return value.isoformat()
    if isinstance(value, timedelta):
        return duration_iso_string(value)
    if isinstance(value, Promise):  # a lazy translation: its text, checked as text
        return _clean(str(value), depth)
    raise _Refused(f"is a {type(value).__name__}, which is not JSON-serialisable")


def _clean_mapping(value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise _Refused(f"has a key {key!r} that is not a string")
        problem = text_problem(key)
        if problem:
            raise _Refused(f"has a key {key!r} that {problem}")
        try:
            out[key] = _clean(item, depth + 1)
        except _Refused as refused:
            refused.path.append(f"[{key!r}]")
            raise
    return out


def _clean_items(value: list[Any] | tuple[Any, ...], depth: int) -> list[Any]:
    out = []
    for index, item in enumerate(value):
        try:
            out.append(_clean(item, depth + 1))
        except _Refused as refused:
            refused.path.append(f"[{index}]")
            raise
    return out


def text_problem(text: str, *, controls: bool = True) -> str | None:
    """Why ``text`` cannot be stored alike on every database, or None.

    ``controls=False`` also refuses control characters (newlines, escapes,
    DEL), which have no place in a name such as an event type or a tenant id.
    """
    # PostgreSQL cannot hold U+0000 in text or jsonb, and lone surrogates are
    # not encodable: refuse both here so every database behaves alike.
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which the database cannot store"
    if not text.isascii():  # (ASCII text, the usual case, holds no surrogate)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid Unicode text (it holds a lone surrogate)"
    if not controls:
        found = _CONTROL.search(text)
        if found:
            return f"contains a control character ({found.group()!r} at position {found.start()})"
    return None


#: What ``json.dumps(value, separators=(",", ":"), ensure_ascii=False)`` uses,
#: built once: ``dumps`` builds an encoder per call when given any option.
#: No check for cycles: :func:`to_json` returns trees (it copies, depth-bound).
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False)


def compact_json(value: Any) -> str:
    """``value`` (plain JSON types, as :func:`to_json` returns) as compact JSON text."""
    return _COMPACT.encode(value)


def text_size(text: str) -> int:
    """The size of ``text`` in UTF-8 bytes."""
    return len(text) if text.isascii() else len(text.encode())
