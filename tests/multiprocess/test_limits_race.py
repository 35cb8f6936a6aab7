"""Concurrency limits under racing worker processes on PostgreSQL, one of them SIGKILLed.

500 runs over 20 keys with ``Limit(max=2)``, four ``resume_due_runs --loop``
workers, one killed while a step of its runs: at no point do more than two
runs of a key hold a slot, read from the run streams' event order (ids),
and every run completes exactly once. An event's id is taken at its insert;
a run takes a freed slot only after the transaction that freed it (and
inserted the event saying so) committed, so ids order the slot's holders.
"""

from __future__ import annotations

import signal
from collections import defaultdict
from pathlib import Path

import pytest

from kumiko_workflows import event_types as et
from kumiko_workflows import run_id_for
from kumiko_workflows.models import Event, RunStatus, WorkflowRun
from tests.support import trigger

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RUNS, KEYS, MAX = 500, 20, 2
#: Events that end the segment a ``holds="executing"`` slot was taken for.
SEGMENT_ENDS = frozenset({*et.SUSPENSIONS, *et.TERMINAL})


def most_holders(events: list[Event], holds: str) -> tuple[dict[str, int], list[str]]:
    """The most runs of each key that held a slot at once, from the events in id order.

    Also the problems seen: a slot number held twice at once, a release of
    a slot not held.
    """
    held: dict[str, dict] = defaultdict(dict)  # key -> run -> slot
    key_of_run: dict = {}
    most: dict[str, int] = defaultdict(int)
    problems: list[str] = []
    for event in events:
        run = event.aggregate_id
        if event.type == et.SLOT_TAKEN:
            key, slot = event.payload["limit_key"], event.payload["slot"]
            if slot in held[key].values():
                problems.append(f"slot {slot} of {key!r} taken by {run} while held")
            if run in held[key]:
                problems.append(f"{run} took a second slot of {key!r}")
            held[key][run] = slot
            key_of_run[run] = key
            most[key] = max(most[key], len(held[key]))
        elif run in key_of_run and run in held[key_of_run[run]]:
            ends = (
                event.type == et.SLOT_RELEASED if holds == "active" else event.type in SEGMENT_ENDS
            )
            if ends:
                del held[key_of_run[run]][run]
        elif event.type == et.SLOT_RELEASED:
            problems.append(f"{run} released a slot it did not hold")
    return dict(most), problems


@pytest.mark.parametrize("holds", ["active", "executing"])
def test_no_key_ever_has_more_than_max_holders_under_racing_killed_workers(
    tmp_path: Path, holds: str
):
    from tests.support.faults import Worker as WorkerProcess
    from tests.support.faults import wait_for

    block = tmp_path / "block"
    block.mkdir()
    name = f"t-limit-{holds}"
    runs = []
    # Key after key: the workers' oldest-first claims pile onto one key at a time.
    for i in range(RUNS):
        extra = {"block_dir": str(block)} if i == 30 else {}
        event = trigger(
            f"t.limit-{holds}", key=f"k{i * KEYS // RUNS}", hold="0.02", **{"for": "PT0S"}, **extra
        )
        runs.append(run_id_for(name, event.payload["run_key"], "default"))
    workers = [
        WorkerProcess(tmp_path, "--loop", "--no-cron", "--interval", "1", name=f"{holds}-w{i}")
        for i in range(4)
    ]
    try:
        # A worker is inside the blocking step: kill it there, mid-run.
        running = wait_for(lambda: list(block.glob("running-*")), "a worker inside the step")
        pid = int(running[0].read_text())
        doomed = next(w for w in workers if w.pid == pid)
        doomed.signal(signal.SIGKILL)
        assert doomed.wait() == -signal.SIGKILL
        (block / "release").touch()
        wait_for(
            lambda: (
                WorkflowRun.objects.filter(workflow_name=name, status=RunStatus.COMPLETED).count()
                == RUNS
            ),
            f"{RUNS} runs to complete",
            timeout=600,
        )
    finally:
        for worker in workers:
            worker.stop()

    events = list(
        Event.objects.filter(aggregate_type=et.RUN_AGGREGATE_TYPE, aggregate_id__in=runs).order_by(
            "id"
        )
    )
    most, problems = most_holders(events, holds)
    assert not problems
    assert len(most) == KEYS
    assert max(most.values()) == MAX, most  # the cap was reached, and never passed
    completed = defaultdict(int)
    for event in events:
        if event.type == et.RUN_COMPLETED:
            completed[event.aggregate_id] += 1
    assert set(completed) == set(runs) and set(completed.values()) == {1}
    # Runs did queue behind the cap, and were offered the freed slots.
    queued = sum(event.type == et.SLOT_WAITING for event in events)
    assert queued > 0
    assert sum(event.type == et.SLOT_OFFERED for event in events) > 0
    print(f"holds={holds}: {queued} times a run queued for a slot; most holders {most}")


def crowded_windows(instants: list, most: int, per: float) -> list:
    """Starts that begin a window of ``per`` seconds holding more than ``most`` starts."""
    from datetime import timedelta

    ordered = sorted(instants)
    period = timedelta(seconds=per)
    return [
        first
        for i, first in enumerate(ordered)
        if sum(1 for t in ordered[i:] if t < first + period) > most
    ]


def test_no_window_of_the_period_holds_more_starts_than_the_budget_with_three_workers(
    tmp_path: Path,
):
    from django.utils.dateparse import parse_datetime

    from tests.support.faults import Worker as WorkerProcess
    from tests.support.faults import wait_for

    count = 15  # 30 starts: ten seconds of the budget, three workers racing for it
    runs = []
    for _ in range(count):
        event = trigger("t.rate", key="partner", hold="0.01", **{"for": "PT0S"})
        runs.append(run_id_for("t-rate", event.payload["run_key"], "default"))
    workers = [
        WorkerProcess(tmp_path, "--loop", "--no-cron", "--interval", "1", name=f"rate-w{i}")
        for i in range(3)
    ]
    try:
        wait_for(
            lambda: (
                WorkflowRun.objects.filter(run_id__in=runs, status=RunStatus.COMPLETED).count()
                == count
            ),
            f"{count} rate-limited runs to complete",
            timeout=300,
        )
    finally:
        for worker in workers:
            worker.stop()

    taken = Event.objects.filter(aggregate_id__in=runs, type=et.RATE_TAKEN)
    instants = [parse_datetime(event.payload["at"]) for event in taken]
    assert len(instants) == 2 * count  # each run's two segments, each started once
    # Rate(max=3, per=1): no second of starts holds more than three, and the
    # budget was used (some second holds three).
    assert crowded_windows(instants, 3, 1.0) == []
    assert crowded_windows(instants, 2, 1.0) != []
    resumed = Event.objects.filter(aggregate_id__in=runs, type=et.RESUMED).count()
    assert resumed == 2 * count
