"""Flow control a definition declares: concurrency (:class:`Limit`) and rate limits (:class:`Rate`).

A :class:`Limit` caps how many runs of a workflow hold a slot at once, per
key (a callable of the trigger event) or for the whole workflow, in each
tenant; ``holds`` says whether a run holds its slot from its start to its
end, waits included (``"active"``), or only while one of its segments runs
(``"executing"``). A :class:`Rate` caps how many segments of a workflow's
runs start per period, per key or for the whole workflow. Neither is part
of a definition's fingerprint: they decide when a run's steps run, never
what they do, so changing a cap strands no run.

Pure values and their validation (check ids ``E111``-``E114``); the engine
side is :mod:`kumiko_workflows.engine.limits`. No database access here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kumiko_workflows.workflow.step_kind import callable_name

#: How a run holds its slot: from its start to its end, or while a segment runs.
HOLDS = ("active", "executing")
#: The longest key a limit keeps (``WorkflowRunPending.limit_key``).
KEY_LENGTH = 200
#: The highest ``max`` of a limit or a rate: each is that many rows per key.
MOST_SLOTS = 10_000


@dataclass(frozen=True, eq=False, kw_only=True)
class Limit:
    """At most ``max`` runs of the workflow (of one ``key``) hold a slot at once, per tenant.

    ``key``: a callable of the trigger event returning a string (one
    customer, one device), or None for every run of the workflow in the
    tenant. ``holds="active"``: a run holds its slot from its first step
    until it finishes, waits included; ``"executing"``: only while one of
    its segments runs. A run over the cap waits, visibly, and starts (or
    resumes) oldest first when a slot frees.
    """

    max: int
    key: Callable[[Any], Any] | None = None
    holds: str = "active"

    def describe(self) -> dict[str, Any]:
        return {
            "max": self.max,
            "holds": self.holds,
            "key": callable_name(self.key) if self.key else None,
        }


@dataclass(frozen=True, eq=False, kw_only=True)
class Rate:
    """At most ``max`` segment starts of the workflow's runs (of one ``key``) per ``per`` seconds.

    ``per`` is a number of seconds or a ``timedelta``; ``key`` as for
    :class:`Limit`. A run over budget waits until the budget allows, in
    order. Counted per tenant, in the database, so every worker shares one
    budget.
    """

    max: int
    per: float | timedelta
    key: Callable[[Any], Any] | None = None

    @property
    def seconds(self) -> float:
        per = self.per
        return per.total_seconds() if isinstance(per, timedelta) else float(per)

    def describe(self) -> dict[str, Any]:
        return {
            "max": self.max,
            "per": self.seconds,
            "key": callable_name(self.key) if self.key else None,
        }


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 1 <= value <= MOST_SLOTS


#: (check id, message, hint) of one problem.
Problem = tuple[str, str, str]


def limit_problems(limit: Any) -> Iterator[Problem]:
    """Every problem of a ``concurrency=`` argument (``E111``, ``E112``)."""
    if limit is None:
        return
    if not isinstance(limit, Limit):
        yield (
            "E111",
            f"concurrency must be a Limit(...) or None, got {limit!r}",
            'Write concurrency=Limit(max=2, key=lambda event: ..., holds="active").',
        )
        return
    if not _positive_int(limit.max):
        yield (
            "E111",
            f"concurrency max must be an integer from 1 to {MOST_SLOTS}, got {limit.max!r}",
            "Limit(max=N): how many runs may hold a slot at once (1 runs them one at a time).",
        )
    if limit.holds not in HOLDS:
        yield (
            "E111",
            f"concurrency holds must be one of {', '.join(map(repr, HOLDS))}, got {limit.holds!r}",
            '"active": from start to end, waits included; "executing": while a segment runs.',
        )
    yield from _key_problem(
        "E112",
        "concurrency",
        limit.key,
        "Limit(key=lambda event: event.payload['customer_id'], ...), or no key "
        "to limit the whole workflow.",
    )


def _key_problem(check: str, what: str, key: Any, hint: str) -> Iterator[Problem]:
    if key is not None and (not callable(key) or isinstance(key, type)):
        yield (
            check,
            f"{what} key must be a callable of the trigger event or None, got {key!r}",
            hint,
        )


def rate_problems(rate: Any) -> Iterator[Problem]:
    """Every problem of a ``rate=`` argument (``E113``, ``E114``)."""
    if rate is None:
        return
    if not isinstance(rate, Rate):
        yield (
            "E113",
            f"rate must be a Rate(...) or None, got {rate!r}",
            "Write rate=Rate(max=10, per=60) for at most 10 segment starts a minute.",
        )
        return
    if not _positive_int(rate.max):
        yield (
            "E113",
            f"rate max must be an integer from 1 to {MOST_SLOTS}, got {rate.max!r}",
            "Rate(max=N, per=seconds): at most N segment starts per period.",
        )
    per = rate.per
    if isinstance(per, timedelta):
        ok = per.total_seconds() > 0
    else:
        ok = not isinstance(per, bool) and isinstance(per, int | float) and 0 < per < float("inf")
    if not ok:
        yield (
            "E113",
            f"rate per must be a positive number of seconds or a timedelta, got {per!r}",
            "Rate(max=10, per=60), or per=timedelta(minutes=1).",
        )
    yield from _key_problem(
        "E114",
        "rate",
        rate.key,
        "Rate(key=lambda event: event.payload['partner'], ...), or no key for one "
        "budget for the whole workflow.",
    )


class UnusableKey(Exception):
    """A limit's key callable raised or returned something unusable (the message says which)."""


def key_of(fn: Callable[[Any], Any] | None, event: Any) -> str:
    """The key ``fn`` gives the trigger ``event`` ("" without ``fn``), or :class:`UnusableKey`."""
    if fn is None:
        return ""
    try:
        value = fn(event)
    except Exception as exc:
        raise UnusableKey(f"the limit's key callable raised {type(exc).__name__}") from exc
    if isinstance(value, bool) or not isinstance(value, str | int | uuid.UUID):
        raise UnusableKey(f"the limit's key callable returned {type(value).__name__}, not a string")
    text = str(value)
    if len(text) > KEY_LENGTH:
        raise UnusableKey(f"the limit's key callable returned {len(text)} characters, over 200")
    if "\x00" in text:
        raise UnusableKey("the limit's key callable returned a NUL character")
    return text
