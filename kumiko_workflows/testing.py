"""Testing workflows on a virtual clock: a pytest fixture and a context manager.

A test appends a trigger, moves the clock, and asserts on the runs; every
run that becomes due in virtual time is resumed at its own due instant, in
order, with no sleep and no real waiting::

    # conftest.py
    pytest_plugins = ["kumiko_workflows.testing"]  # the ``workflows`` fixture

    # test_orders.py
    def test_an_unpaid_order_is_cancelled_after_three_days(workflows):
        workflows.append_event(order_id, "order", "order.placed", {...})
        run_id = workflows.run_id("order-fulfilment", str(order_id))
        workflows.advance("P2DT23H")
        workflows.assert_status(run_id, "waiting")
        workflows.advance("PT1H")
        workflows.assert_step_results(run_id, {"paid": None, "cancel": "cancelled"})

In a ``TestCase``, ``self.workflows = self.enterContext(virtual_clock())``.

While a clock is active the engine's clock (:mod:`kumiko_workflows.workflow.clock`)
stands still at its virtual instant: every event appended meanwhile (by
``append_event`` or the helper's own), every ``ctx.now``, every wait and
timeout computed from it, and the run-status rows are on the virtual time
line. Steps that want the time should read ``ctx.now``, not the real clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from django.db.models import Min
from django.utils import timezone

from kumiko_workflows.engine.cron import fire_due_schedules, schedule_overview
from kumiko_workflows.engine.resume import ResumeReport, resume_due_runs
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.store.events import append_event, load_stream
from kumiko_workflows.workflow import clock
from kumiko_workflows.workflow.definition import run_id_for
from kumiko_workflows.workflow.durations import parse_duration

try:
    import pytest
except ImportError:  # pragma: no cover - the context manager works without pytest
    pytest = None  # type: ignore[assignment]

__all__ = ["Progress", "VirtualClock", "VirtualClockError", "virtual_clock", "workflows"]

#: Instants one advance may stop at before it gives up (a schedule of runs
#: that never ends, such as a cron run that waits longer than its period).
MAX_STEPS = 10_000


class VirtualClockError(AssertionError):
    """The virtual clock could not run what became due."""


@dataclass
class Progress:
    """What an :meth:`VirtualClock.advance` or :meth:`~VirtualClock.run_until_idle` did.

    The counts are summed over every resume pass (see
    :class:`~kumiko_workflows.engine.resume.ResumeReport`); ``fired`` counts
    the cron runs started; ``instants`` are the virtual instants at which
    something was resumed or fired, in order.
    """

    resumed: int = 0
    completed: int = 0
    suspended: int = 0
    failed: int = 0
    fired: int = 0
    instants: list[datetime] = field(default_factory=list)

    def add(self, report: ResumeReport, fired: int, at: datetime) -> None:
        self.resumed += report.resumed
        self.completed += report.completed
        self.suspended += report.suspended
        self.failed += report.failed
        self.fired += fired
        if (report.processed or fired) and (not self.instants or self.instants[-1] != at):
            self.instants.append(at)


def _duration(value: str | timedelta) -> timedelta:
    delta = parse_duration(value) if isinstance(value, str) else value
    if not isinstance(delta, timedelta) or delta < timedelta(0):
        raise ValueError(f"a virtual clock moves forward by a duration, got {value!r}")
    return delta


class VirtualClock:
    """A virtual time line for the engine, and assertions on the runs it moves.

    Use it as a context manager (or through the ``workflows`` fixture): on
    entry it freezes the engine's clock at ``start`` (default: now, to the
    second), on exit it restores the clock it found. Nothing moves the clock
    but :meth:`advance`, :meth:`advance_to` and :meth:`run_until_idle`.

    ``tenant_id`` is the tenant :meth:`append_event` and :meth:`run_id` use
    when given none (default: ``KUMIKO_WORKFLOWS["DEFAULT_TENANT"]``).
    ``cron=False`` leaves cron schedules alone (by default they fire at
    their slots as the clock passes them, as a worker would fire them).
    """

    def __init__(
        self,
        start: datetime | None = None,
        *,
        tenant_id: str | None = None,
        cron: bool = True,
    ) -> None:
        if start is not None and (start.tzinfo is None or start.utcoffset() is None):
            raise ValueError(f"start must be an aware datetime, got {start!r}")
        self._start = start
        self._now: datetime | None = None
        self._saved: datetime | None = None
        self.tenant_id = tenant_id
        self.cron = cron

    # -- the clock ------------------------------------------------------------------

    def __enter__(self) -> VirtualClock:
        self._now = self._start or timezone.now().replace(microsecond=0)
        self._saved = clock.set_virtual(self._now)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        clock.set_virtual(self._saved)
        self._now = None

    @property
    def now(self) -> datetime:
        """The virtual instant."""
        if self._now is None:
            raise RuntimeError("the virtual clock is not running: use it in a with block")
        return self._now

    def _move(self, instant: datetime) -> None:
        self._now = instant
        clock.set_virtual(instant)

    def advance(self, by: str | timedelta) -> Progress:
        """Move the clock forward by an ISO 8601 duration (``"P3D"``) or a ``timedelta``.

        Every run due on the way is resumed at its own due instant, and cron
        slots on the way fire at theirs, in time order: a run that waits an
        hour twice within ``advance("P1D")`` resumes twice, an hour apart.
        """
        return self.advance_to(self.now + _duration(by))

    def advance_to(self, instant: datetime) -> Progress:
        """Move the clock forward to ``instant`` (aware); see :meth:`advance`."""
        if instant.tzinfo is None or instant.utcoffset() is None:
            raise ValueError(f"instant must be an aware datetime, got {instant!r}")
        if instant < self.now:
            raise ValueError(f"the virtual clock is at {self.now.isoformat()}; it never goes back")
        progress = Progress()
        self._settle(progress)
        for _ in range(MAX_STEPS):
            following = self._next_instant()
            if following is None or following > instant:
                break
            self._move(following)
            self._settle(progress)
        else:
            raise VirtualClockError(f"still busy after {MAX_STEPS} instants before {instant}")
        if self.now < instant:
            self._move(instant)
            self._settle(progress)
        return progress

    def run_until_idle(self, *, max_steps: int = MAX_STEPS) -> Progress:
        """Move the clock from due instant to due instant until no run waits for a time.

        What is left waits for an event without a timeout (or nothing is
        left). Cron slots on the way fire; a cron schedule alone does not
        keep the clock going. Raises :class:`VirtualClockError` after
        ``max_steps`` instants.
        """
        progress = Progress()
        self._settle(progress)
        for _ in range(max_steps):
            if self._next_wake() is None:
                return progress
            following = self._next_instant()
            assert following is not None  # a wake exists
            self._move(following)
            self._settle(progress)
        raise VirtualClockError(
            f"runs still waiting for a time after {max_steps} instants (now {self.now}): "
            "a schedule of runs that never ends?"
        )

    def _settle(self, progress: Progress) -> None:
        """Fire due cron slots and resume due runs at the current instant until nothing is due."""
        for _ in range(MAX_STEPS):
            fired = fire_due_schedules(now=self.now) if self.cron else 0
            report = resume_due_runs(now=self.now)
            if report.errors:
                raise VirtualClockError(
                    f"{report.errors} run(s) could not be resumed at {self.now.isoformat()} "
                    "(an error in the engine's writes or a projection; see the log)"
                )
            progress.add(report, fired, self.now)
            if not (fired or report.processed):
                return
        raise VirtualClockError(f"runs kept becoming due at {self.now.isoformat()}")

    def _next_wake(self) -> datetime | None:
        """The earliest wake time of a pending row after now."""
        rows = WorkflowRunPending.objects.filter(wake_at__gt=self.now)
        wake: datetime | None = rows.aggregate(next=Min("wake_at"))["next"]
        return wake

    def _next_instant(self) -> datetime | None:
        """The earliest instant after now at which a run is due or a cron slot fires."""
        candidates = [self._next_wake()]
        if self.cron:
            candidates += [row["next_slot"] for row in schedule_overview(now=self.now)]
        found = [instant for instant in candidates if instant is not None and instant > self.now]
        return min(found, default=None)

    # -- appending --------------------------------------------------------------------

    def append_event(
        self,
        aggregate_id: uuid.UUID | str,
        aggregate_type: str,
        type: str,
        payload: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Event:
        """:func:`~kumiko_workflows.append_event` at the virtual instant (and the clock's tenant).

        Runs it triggers start inline, as always, on virtual time: a
        ``wait("P3D")`` is due three virtual days from now.
        """
        if self.tenant_id is not None:
            kwargs.setdefault("tenant_id", self.tenant_id)
        kwargs.setdefault("created_at", self.now)
        return append_event(aggregate_id, aggregate_type, type, payload, **kwargs)

    def run_id(self, workflow_name: str, key: str, tenant_id: str | None = None) -> uuid.UUID:
        """The id of the run ``workflow_name`` starts for idempotency key ``key``."""
        return run_id_for(workflow_name, key, tenant_id or self.tenant_id)

    # -- reading runs ------------------------------------------------------------------

    def run(self, run_id: uuid.UUID | str) -> WorkflowRun:
        """The run's status row; :class:`VirtualClockError` if there is none."""
        found = WorkflowRun.objects.filter(run_id=run_id).first()
        if found is None:
            raise VirtualClockError(f"no workflow run has id {run_id} (did its trigger start it?)")
        return found

    def events(self, run_id: uuid.UUID | str) -> list[Event]:
        """The run's own events, in order."""
        return load_stream(run_id, self.run(run_id).tenant_id)

    def event_types(self, run_id: uuid.UUID | str) -> list[str]:
        """The types of the run's events, in order (``kumiko_workflows.event_types``)."""
        return [event.type for event in self.events(run_id)]

    def step_results(self, run_id: uuid.UUID | str) -> dict[str, Any]:
        """The run's ``ctx.steps`` as last recorded: results by name, awaited payloads by key.

        From its latest event that records them: the completion, the
        current suspension, or the failure (which records the results the
        failed segment started from: its own steps were rolled back).
        """
        run = self.run(run_id)
        state: Any = None
        for event in reversed(self.events(run_id)):
            state = event.payload.get("state")
            if isinstance(state, dict):
                break
        if not isinstance(state, dict):
            return {}
        results = dict(state.get("results") or {})
        awaited = state.get("awaited") or {}
        ids = [i for i in awaited.values() if i is not None]
        payloads = Event.objects.filter(tenant_id=run.tenant_id).in_bulk(ids)
        for key, event_id in awaited.items():
            found = payloads.get(event_id)
            results[key] = None if found is None else found.payload
        return results

    # -- assertions -----------------------------------------------------------------------

    def _describe(self, run_id: uuid.UUID | str) -> str:
        run = self.run(run_id)
        lines = [f"run {run.run_id} ({run.workflow_name}) is {run.status} at step {run.step!r}"]
        if run.wake_at:
            lines.append(f"  wakes at {run.wake_at.isoformat()} (now {self.now.isoformat()})")
        if run.failure_reason:
            lines.append(f"  failed: {run.failure_reason} {run.error_class}".rstrip())
            lines.extend(f"  | {line}" for line in run.last_error.splitlines()[-5:])
        lines.append("  events: " + ", ".join(self.event_types(run_id)))
        return "\n".join(lines)

    def assert_status(self, run_id: uuid.UUID | str, status: str) -> WorkflowRun:
        """Assert the run's status (``running``, ``waiting``, ``completed``, ``failed``, ...)."""
        run = self.run(run_id)
        if run.status != status:
            raise AssertionError(f"expected status {status!r}\n{self._describe(run_id)}")
        return run

    def assert_step_results(
        self, run_id: uuid.UUID | str, expected: Mapping[str, Any], *, exact: bool = False
    ) -> None:
        """Assert the run's step results: those ``expected`` names (``exact``: all of them)."""
        results = self.step_results(run_id)
        if exact:
            wrong = results != dict(expected)
        else:
            wrong = any(name not in results or results[name] != v for name, v in expected.items())
        if wrong:
            shown = results if exact else {k: results.get(k, "<missing>") for k in expected}
            raise AssertionError(
                f"expected step results {dict(expected)!r}\n     got {shown!r}\n"
                + self._describe(run_id)
            )

    def assert_event_types(self, run_id: uuid.UUID | str, expected: list[str]) -> None:
        """Assert the run's whole event-type sequence."""
        found = self.event_types(run_id)
        if found != list(expected):
            raise AssertionError(
                f"expected the events {list(expected)!r}\n     got {found!r}\n"
                + self._describe(run_id)
            )


def virtual_clock(
    start: datetime | None = None, *, tenant_id: str | None = None, cron: bool = True
) -> VirtualClock:
    """A :class:`VirtualClock` to use in a ``with`` block (or ``TestCase.enterContext``)."""
    return VirtualClock(start, tenant_id=tenant_id, cron=cron)


if pytest is not None:

    @pytest.fixture
    def workflows(db: None) -> Iterator[VirtualClock]:
        """A running :class:`VirtualClock`, starting now; the test gets database access."""
        with virtual_clock() as running:
            yield running
