"""The resume worker as a real subprocess: signals, NOTIFY, and racing workers."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from kumiko_workflows import event_types as et
from kumiko_workflows import run_id_for
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from tests.support import manage, run_manage, trigger, types_of

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 60.0  # seconds a condition may take on a busy 2-core machine


def wait_for(condition, what: str, deadline: float = DEADLINE):
    """Poll ``condition`` until it is truthy; fail naming ``what`` after ``deadline``."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def start_worker(*args: str) -> subprocess.Popen:
    return manage("resume_due_runs", "--loop", "--no-cron", "-v", "2", *args)


def wait_for_line(process: subprocess.Popen, text: str, stream: str = "stdout") -> list[str]:
    """Read the worker's stdout (or stderr) until a line contains ``text``."""
    lines: list[str] = []
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        line = getattr(process, stream).readline()
        if not line:
            raise AssertionError(f"worker exited before printing {text!r}: {lines}")
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"timed out waiting for {text!r}")


def stop(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=DEADLINE)
    return process.returncode, out, err


def test_one_pass_resumes_due_runs_and_prints_a_summary(past):
    event = trigger("t.wait", **{"for": past})
    run_id = run_id_for("t-wait", event.payload["run_key"])

    result = run_manage("resume_due_runs", "--no-cron")

    assert result.returncode == 0, result.stderr
    assert "resumed=1 completed=1" in result.stdout
    assert types_of(run_id)[-1] == et.RUN_COMPLETED


def test_arguments_are_validated():
    result = run_manage("resume_due_runs", "--limit", "0")
    assert result.returncode != 0
    assert "--limit" in result.stderr and "must be at least 1" in result.stderr


def test_sigterm_while_idle_exits_0_at_once():
    worker = start_worker("--interval", "300")
    wait_for_line(worker, "resume_due_runs: worker started")  # idle: nothing is due

    sent = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    code, out, err = stop(worker)

    assert code == 0, err
    assert time.monotonic() - sent < 30, "the worker waited out its interval"
    assert "SIGTERM received" in err


def test_sigterm_mid_drain_finishes_the_current_run_and_exits_0(tmp_path: Path):
    keys = [f"k{i}" for i in range(3)]
    for key in keys:
        trigger("t.blocking", run_key=key, sync_dir=str(tmp_path))
    worker = start_worker("--interval", "300")

    running = wait_for(lambda: list(tmp_path.glob("running-*")), "a run to start its step")
    worker.send_signal(signal.SIGTERM)
    wait_for(lambda: worker.poll() is None, "the worker to keep running")
    (tmp_path / "release").touch()
    code, out, err = stop(worker)

    assert code == 0, err
    held_key = running[0].name.removeprefix("running-")
    held_run = run_id_for("t-blocking", held_key)
    assert types_of(held_run)[-1] == et.RUN_COMPLETED
    others = [run_id_for("t-blocking", key) for key in keys if key != held_key]
    for run_id in others:  # not started: still waiting, still pending
        assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]
        assert WorkflowRunPending.objects.filter(run_id=run_id).exists()


def test_second_sigterm_forces_exit_1(tmp_path: Path):
    trigger("t.blocking", run_key="held", sync_dir=str(tmp_path))
    worker = start_worker("--interval", "300")
    wait_for(lambda: list(tmp_path.glob("running-*")), "the run to start its step")

    worker.send_signal(signal.SIGTERM)
    wait_for_line(worker, "SIGTERM received", stream="stderr")
    worker.send_signal(signal.SIGTERM)
    code, out, err = stop(worker)
    (tmp_path / "release").touch()

    assert code == 1
    # The forced exit rolled the run's transaction back: it is still pending.
    run_id = run_id_for("t-blocking", "held")
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]
    assert WorkflowRunPending.objects.filter(run_id=run_id).exists()


@pytest.mark.postgres
def test_notify_wakes_the_worker_before_its_interval():
    from kumiko_workflows import append_event

    event = trigger("t.signed-up", user_id="u-notify", timeout="P7D")
    run_id = run_id_for("t-event", event.payload["run_key"])
    worker = start_worker("--interval", "300")
    try:
        wait_for_line(worker, "listen=on")  # started, and listening

        appended = time.monotonic()
        append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u-notify"})
        wait_for(
            lambda: WorkflowRun.objects.get(run_id=run_id).status == "completed",
            "the woken run to complete",
        )
        assert time.monotonic() - appended < 30, "woken by the interval, not by NOTIFY"
    finally:
        worker.send_signal(signal.SIGTERM)
        code, _, err = stop(worker)
    assert code == 0, err


@pytest.mark.postgres
def test_a_run_queued_by_a_request_starts_in_a_listening_worker_at_once():
    """start="worker": the trigger's commit NOTIFYs, and a worker runs the steps."""
    from kumiko_workflows.models import Event

    worker = start_worker("--interval", "300")
    try:
        wait_for_line(worker, "listen=on")  # started, and listening
        appended = time.monotonic()
        event = trigger("t.start-in-worker")
        run_id = run_id_for("t-start-in-worker", event.payload["run_key"])
        wait_for(
            lambda: WorkflowRun.objects.get(run_id=run_id).status == "completed",
            "the queued run to complete",
        )
        assert time.monotonic() - appended < 30, "started by the interval, not by NOTIFY"
        ran_in = Event.objects.get(type="t.ran-in", aggregate_id=event.aggregate_id)
        assert ran_in.payload["pid"] not in (os.getpid(), None)
    finally:
        worker.send_signal(signal.SIGTERM)
        code, _, err = stop(worker)
    assert code == 0, err


@pytest.mark.postgres
@pytest.mark.parametrize("together", [False, True], ids=["row_by_row", "batch_together"])
def test_four_workers_race_one_is_killed_and_every_run_resumes_exactly_once(
    past, together, monkeypatch
):
    if not together:  # the workers claim each row of a batch when its turn comes
        monkeypatch.setenv("KUMIKO_TEST_BATCH_TOGETHER", "0")
    runs = 2000
    keys = [f"race-{i}" for i in range(runs)]
    for key in keys:
        trigger("t.wait", run_key=key, **{"for": past})
    assert WorkflowRunPending.objects.count() == runs

    workers = [manage("resume_due_runs", "--no-cron") for _ in range(4)]
    victim = workers[0]
    wait_for(
        lambda: WorkflowRun.objects.filter(status="completed").count() >= 100,
        "the drain to get going",
    )
    assert victim.poll() is None, "the victim finished before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=DEADLINE)
    for worker in workers[1:]:
        code, out, err = stop(worker)
        assert code == 0, err

    final = run_manage("resume_due_runs", "--no-cron")
    assert final.returncode == 0, final.stderr

    assert not WorkflowRunPending.objects.exists()
    assert WorkflowRun.objects.filter(status="completed").count() == runs
    run_ids = [run_id_for("t-wait", key) for key in keys]
    for type in (et.RESUMED, et.RUN_COMPLETED):
        per_run = Event.objects.filter(aggregate_id__in=run_ids, type=type)
        assert per_run.count() == runs
        assert per_run.values("aggregate_id").distinct().count() == runs
    # The step after the wait wrote its domain event exactly once per run.
    after = Event.objects.filter(type="t.recorded", payload__step="after")
    assert after.count() == runs


def test_a_broken_cron_setting_is_loud_but_does_not_stop_resuming(past, settings):
    from django.core.management import CommandError, call_command

    from kumiko_workflows.workflow.registry import registry
    from tests.testapp import cron_workflows as cw

    event = trigger("t.wait", **{"for": past})
    run_id = run_id_for("t-wait", event.payload["run_key"])
    settings.KUMIKO_WORKFLOWS = {"CRON_TENANTS": "tests.nowhere.tenants"}

    with registry.override(cw.hourly_skip), pytest.raises(CommandError, match="1 cron pass"):
        call_command("resume_due_runs", verbosity=0)

    assert types_of(run_id)[-1] == et.RUN_COMPLETED
