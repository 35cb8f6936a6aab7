"""How the package checks an argument's kind and names a bad one in its messages.

One whole-number check (an ``int``, never a ``bool``, which Python counts as
one) and one clipped ``repr`` for error messages, so every refusal reads
alike and none prints a megabyte of bad input.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

#: How long a value named in an error message may be, in characters.
CLIP = 80


def is_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is a whole number: an ``int``, and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_between(value: Any, low: int, high: int | None = None) -> TypeGuard[int]:
    """Whether ``value`` is a whole number from ``low`` to ``high`` (no upper bound: None)."""
    return is_int(value) and value >= low and (high is None or value <= high)


def clipped_repr(value: Any) -> str:
    """``repr(value)`` for an error message, cut to :data:`CLIP` characters.

    The cut keeps the last character (a closing quote or bracket). A value
    whose ``repr`` fails (an integer of more than 4,300 digits, a broken
    ``__repr__``) is named by its kind instead.
    """
    try:
        text = repr(value)
    except Exception:
        if is_int(value):
            return f"an integer of about {int(value.bit_length() * math.log10(2))} digits"
        return f"a {type(value).__name__}"
    return text if len(text) <= CLIP else f"{text[: CLIP - 4]}...{text[-1]}"
