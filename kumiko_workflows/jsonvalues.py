"""Turning Python values into the JSON an event or a step result may hold.

Errors name the key path of the offending value (``payload['items'][2]``) so a
caller sees at once what to fix.
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any

MAX_DEPTH = 64
#: Most digits an int may have. Python turns at most 4300 digits into text
#: (``sys.set_int_max_str_digits``), so ``json.dumps`` refuses longer ints:
#: refused here, they fail a run once instead of every write of its state.
MAX_INT_DIGITS = 4000
#: Ints this short have too few digits for any int-to-text limit (640 at least).
_SHORT_INT_BITS = 2000


class NotJSON(ValueError):
    """A value cannot be stored as JSON; the message names its key path."""


def to_json(value: Any, where: str, _depth: int = 0) -> Any:
    """Return ``value`` as plain JSON types, or raise :class:`NotJSON`.

    Aware datetimes become ISO 8601 strings and UUIDs strings; naive datetimes,
    NaN/infinity, ints of more than :data:`MAX_INT_DIGITS` digits, non-string
    keys and any other object are refused.
    """
    if _depth > MAX_DEPTH:
        raise NotJSON(f"{where} is nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value.bit_length() > _SHORT_INT_BITS:
            _check_digits(value, where)
        return value
    if isinstance(value, str):
        problem = _text_problem(value)
        if problem:
            raise NotJSON(f"{where} {problem}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJSON(f"{where} is {value!r}, which JSON cannot hold")
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotJSON(f"{where} has a key {key!r} that is not a string")
            problem = _text_problem(key)
            if problem:
                raise NotJSON(f"{where} has a key {key!r} that {problem}")
            out[key] = to_json(item, f"{where}[{key!r}]", _depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [to_json(item, f"{where}[{i}]", _depth + 1) for i, item in enumerate(value)]
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise NotJSON(f"{where} is a naive datetime ({value.isoformat()}); give it a time zone")
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise NotJSON(f"{where} is a {type(value).__name__}, which is not JSON-serialisable")


def _check_digits(value: int, where: str) -> None:
    limit = min(MAX_INT_DIGITS, sys.get_int_max_str_digits() or MAX_INT_DIGITS)
    try:
        digits = len(str(abs(value)))
    except ValueError:  # over the interpreter's int-to-text limit
        digits = limit + 1
    if digits > limit:
        raise NotJSON(f"{where} is an int of more than {limit} digits, too long to store as JSON")


def _text_problem(text: str) -> str | None:
    # PostgreSQL's jsonb cannot hold U+0000, and lone surrogates are not
    # encodable: refuse both here so every database behaves alike.
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which the database cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text (it holds a lone surrogate)"
    return None


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
