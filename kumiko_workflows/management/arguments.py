"""Argument types shared by the management commands (argparse ``type=``)."""

from __future__ import annotations

import math
from argparse import ArgumentTypeError


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


def seconds_or_off(text: str) -> float | None:
    """A number of seconds > 0, or ``off`` (None): a limit that is not checked."""
    if text.strip().lower() == "off":
        return None
    return positive_float(text)
