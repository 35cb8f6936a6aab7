"""Wake-ups under load, with real processes on PostgreSQL.

600 runs wait on distinct keys. Four appender processes append their awaited
events at once, some in autocommit, some in long transactions holding several
events open; two ``--loop`` workers resume the woken runs, and one of them is
SIGKILLed mid-way. Every run must wake with its own event, once, and none may
wait for its timeout.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from pathlib import Path

import pytest

from kumiko_workflows import append_event, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WakeCheck, WorkflowRun
from tests.support import subprocess_env
from tests.support.faults import Worker, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RUNS = 600
APPENDERS = 4

APPENDER = textwrap.dedent(
    """
    import random, sys, time, uuid
    import django
    django.setup()
    from django.db import transaction
    from kumiko_workflows import append_event

    index, total, appenders = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    mine = [f"u-{i}" for i in range(index, total, appenders)]
    rng = random.Random(index)
    while mine:
        if rng.random() < 0.5:
            # A long transaction: several events held open for a while.
            batch, mine = mine[:8], mine[8:]
            with transaction.atomic():
                for user in batch:
                    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": user})
                time.sleep(rng.uniform(0.05, 0.4))
        else:
            user = mine.pop(0)
            append_event(uuid.uuid4(), "user", "t.verified", {"user_id": user})
    """
)


def test_every_run_wakes_with_its_own_event_under_racing_appenders_and_a_killed_worker(
    tmp_path: Path,
):
    runs = {}
    for i in range(RUNS):
        key = uuid.uuid4().hex
        append_event(
            uuid.uuid4(),
            "test-source",
            "t.signed-up",
            {"run_key": key, "user_id": f"u-{i}", "timeout": "P7D"},
        )
        runs[run_id_for("t-event", key)] = f"u-{i}"

    workers = [
        Worker(tmp_path, "--loop", "--no-cron", "--interval", "1", name=f"worker-{n}")
        for n in range(2)
    ]
    appenders = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(n), str(RUNS), str(APPENDERS)],
            env=subprocess_env(),
        )
        for n in range(APPENDERS)
    ]
    try:
        wait_for(
            lambda: WorkflowRun.objects.filter(status="completed").count() >= RUNS // 4,
            "a quarter of the runs to complete",
        )
        workers[0].signal(signal.SIGKILL)
        for appender in appenders:
            assert appender.wait(timeout=120) == 0
        wait_for(
            lambda: WorkflowRun.objects.filter(status="completed").count() == RUNS,
            "every run to complete",
            timeout=120,
        )
        wait_for(lambda: not WakeCheck.objects.exists(), "no wake-up check left")
    finally:
        for worker in workers:
            worker.stop()
        for appender in appenders:
            if appender.poll() is None:
                appender.kill()

    verified = {e.id: e.payload["user_id"] for e in Event.objects.filter(type="t.verified")}
    assert sorted(verified.values()) == sorted(runs.values())
    resumed = Counter()
    for event in Event.objects.filter(aggregate_id__in=runs, type=et.RESUMED):
        resumed[event.aggregate_id] += 1
        # Woken by an event, not by the seven-day timeout.
        assert verified[event.payload["awaited_event_id"]] == runs[event.aggregate_id]
    assert resumed == dict.fromkeys(runs, 1)
    for event in Event.objects.filter(aggregate_id__in=runs, type=et.WAKE_REQUESTED):
        assert verified[event.payload["awaited_event_id"]] == runs[event.aggregate_id]
    assert "Traceback" not in workers[1].log()
