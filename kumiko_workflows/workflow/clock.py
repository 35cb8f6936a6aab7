"""The engine's clock: the current time, unless a test set a virtual one.

Every instant the engine takes when none is passed in (an event's
``created_at``, so a run's ``ctx.now`` and the waits it computes; the
moment a resume or cron pass runs at; ``workflow_status``'s now) comes from
:func:`now`. :mod:`kumiko_workflows.testing` sets a virtual instant here, so
a run that waits three days is resumed three virtual days later, with every
timestamp it writes on the same virtual time line and no real waiting.

The virtual instant is process-wide (not per thread), as a test's clock is:
a request the test client or a live server thread handles sees it too.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

_virtual: datetime | None = None


def now() -> datetime:
    """The virtual instant if one is set, else ``django.utils.timezone.now()``."""
    return _virtual if _virtual is not None else timezone.now()


def set_virtual(instant: datetime | None) -> datetime | None:
    """Freeze :func:`now` at ``instant`` (an aware datetime), or None for real time again.

    Returns the instant set before, to restore it. Tests use
    :mod:`kumiko_workflows.testing`, which sets and restores it.
    """
    global _virtual
    if instant is not None and (instant.tzinfo is None or instant.utcoffset() is None):
        raise ValueError(f"a virtual time must be an aware datetime, got {instant!r}")
    previous, _virtual = _virtual, instant
    return previous


def is_virtual() -> bool:
    """Whether a virtual instant is set."""
    return _virtual is not None
