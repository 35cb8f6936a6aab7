"""``workflow_status``, ``rebuild_workflow_projections`` and the progress output."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from kumiko_workflows import append_event, cancel_run, rerun_run, resume_due_runs, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations.progress import Progress
from kumiko_workflows.operations.rebuild import check, rebuild
from kumiko_workflows.operations.status import status_report
from tests.support import run_manage, trigger

pytestmark = pytest.mark.django_db


def start(type_, name, tenant="default", **payload):
    event = trigger(type_, tenant_id=tenant, **payload)
    return run_id_for(name, event.payload["run_key"], tenant)


def command(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def lifecycle(past, future):
    """Runs in every state, in two tenants, through every kind of run event."""
    runs = {
        "due": start("t.wait", "t-wait", **{"for": past}),
        "later": start("t.wait", "t-wait", **{"for": future}),
        "failed": start("t.fail", "t-fail"),
        "other_tenant": start("t.wait", "t-wait", tenant="acme", **{"for": future}),
        "awaiting": start("t.signed-up", "t-event", user_id="u1"),
        "answered": start("t.signed-up", "t-event", user_id="u2"),
        "retrying": start("t.retry", "t-retry", fail_attempts=1),
        "cancelled": start("t.wait", "t-wait", **{"for": future}),
        "woken": start("t.wait", "t-wait", **{"for": future}),
        "rerun": start("t.fail", "t-fail"),
        "branch": start("t.branch", "t-branch", **{"for": future}),
    }
    append_event("00000000-0000-0000-0000-000000000001", "user", "t.verified", {"user_id": "u2"})
    cancel_run(runs["cancelled"], "test", by="tests")
    from kumiko_workflows import wake_run

    wake_run(runs["woken"], by="tests")
    rerun_run(runs["rerun"], by="tests")
    resume_due_runs()
    return runs


# --- workflow_status ----------------------------------------------------------------


def test_workflow_status_counts_runs_and_shows_the_oldest_due_row(past, future):
    due = start("t.wait", "t-wait", **{"for": past})
    start("t.wait", "t-wait", **{"for": future})
    start("t.fail", "t-fail")
    start("t.wait", "t-wait", tenant="acme", **{"for": future})

    out, _ = command("workflow_status")

    lines = out.splitlines()
    assert "Workflow runs (all tenants)" in lines[0]
    assert lines[1].split() == [
        "workflow",
        "running",
        "waiting",
        "completed",
        "failed",
        "cancelled",
        "total",
    ]
    assert lines[2].split() == ["t-fail", "0", "0", "0", "1", "0", "1"]
    assert lines[3].split() == ["t-wait", "0", "3", "0", "0", "0", "3"]
    assert "3 suspended step(s), 1 due now" in out
    assert f"oldest due: run {due} (t-wait, tenant default, step 1, wait) due since " in out
    assert ", lag " in out
    assert "  due by tenant (tenants take turns): default 1" in lines


def test_the_lag_is_how_long_the_oldest_due_row_has_waited_for_a_worker(past):
    due = start("t.wait", "t-wait", **{"for": past})  # a past instant: due when it suspends
    start("t.wait", "t-wait", **{"for": "PT30M"})
    wake_at = WorkflowRunPending.objects.get(run_id=due).wake_at

    report = status_report(None, wake_at + timedelta(hours=1, minutes=2))

    oldest = report["pending"]["oldest_due"]
    assert oldest["run_id"] == str(due)
    assert (oldest["lag_seconds"], oldest["lag"]) == (3720.0, "1 h 2 min")
    assert report["pending"]["due"] == 2


def test_the_backlog_per_tenant_largest_first(past, future):
    for tenant, count in (("acme", 1), ("big", 3), ("idle", 0)):
        for _ in range(count):
            start("t.wait", "t-wait", tenant=tenant, **{"for": past})
    start("t.wait", "t-wait", tenant="idle", **{"for": future})

    now = timezone.now() + timedelta(seconds=1)
    assert status_report(None, now)["pending"]["due_by_tenant"] == {"big": 3, "acme": 1}
    assert status_report("acme", now)["pending"]["due_by_tenant"] == {"acme": 1}


def test_workflow_status_failed_lists_reason_and_step(past):
    failed = start("t.fail", "t-fail")
    start("t.wait", "t-wait", **{"for": past})

    out, _ = command("workflow_status", "--failed")

    assert "Failed runs (1 shown)" in out
    assert str(failed) in out
    assert "reason step_failed at step 0 (compute 'boom'), RuntimeError" in out
    assert "hunter2" not in out  # raw error text stays in the admin


def test_workflow_status_json_for_machines(past, future):
    due = start("t.wait", "t-wait", **{"for": past})
    start("t.wait", "t-wait", tenant="acme", **{"for": future})
    failed = start("t.fail", "t-fail", tenant="acme")

    data = json.loads(command("workflow_status", "--json", "--failed")[0])
    scoped = json.loads(command("workflow_status", "--json", "--tenant", "acme")[0])

    assert data["workflows"]["t-wait"]["waiting"] == 2
    assert data["workflows"]["t-fail"] == {
        "running": 0,
        "waiting": 0,
        "completed": 0,
        "failed": 1,
        "cancelled": 0,
        "total": 1,
    }
    assert data["pending"]["total"] == 2 and data["pending"]["due"] == 1
    oldest = data["pending"]["oldest_due"]
    assert oldest["run_id"] == str(due)
    assert 0 <= oldest["lag_seconds"] < 60
    assert [row["run_id"] for row in data["failed"]] == [str(failed)]
    assert data["failed"][0]["reason"] == "step_failed"
    assert data["failed"][0]["step_label"] == "step 0 (compute 'boom')"
    assert scoped["tenant"] == "acme" and "failed" not in scoped
    assert scoped["pending"] == {
        "total": 1,
        "due": 0,
        "oldest_due": None,
        "due_by_tenant": {},
        "gated": {"debounced": 0, "held": 0},
    }
    assert data["pending"]["due_by_tenant"] == {"default": 1}


def test_workflow_status_with_nothing_to_show():
    out, _ = command("workflow_status", "--failed")

    assert "no runs" in out and "nothing is due" in out and "none" in out


# --- rebuild_workflow_projections ----------------------------------------------------


def test_check_finds_no_difference_after_a_whole_lifecycle(lifecycle):
    assert WorkflowRun.objects.filter(status="completed").exists()  # the fixture did work
    assert Event.objects.filter(type=et.RERUN_REQUESTED).exists()

    result = check()

    assert result.differences == []
    assert result.runs == WorkflowRun.objects.count() == len(lifecycle)
    assert result.pending == WorkflowRunPending.objects.count()
    out, _ = command("rebuild_workflow_projections", "--check")
    assert "No differences: 11 run(s) and" in out


def test_check_reports_tampered_rows_and_exits_1_without_changing_them(lifecycle):
    later = lifecycle["later"]
    WorkflowRun.objects.filter(run_id=later).update(status="completed")
    WorkflowRunPending.objects.filter(run_id=lifecycle["awaiting"]).delete()
    WorkflowRunPending.objects.filter(run_id=lifecycle["other_tenant"]).update(
        wake_at=timezone.now()
    )

    out = io.StringIO()
    with pytest.raises(CommandError, match="3 row\\(s\\) differ from the event store"):
        call_command("rebuild_workflow_projections", "--check", stdout=out, stderr=io.StringIO())

    text = out.getvalue()
    assert f"run {later}: status: table has 'completed', events give 'waiting'" in text
    assert f"pending row of run {lifecycle['awaiting']} at step '0' (tenant default): " in text
    assert "missing from the table" in text
    assert f"pending row of run {lifecycle['other_tenant']} at step '1' (tenant acme): " in text
    assert "wake_at: table has" in text
    assert WorkflowRun.objects.get(run_id=later).status == "completed"  # --check changed nothing
    assert not WorkflowRunPending.objects.filter(run_id=lifecycle["awaiting"]).exists()


def test_rebuild_repairs_the_tables_and_keeps_last_error(lifecycle):
    failed = lifecycle["failed"]
    assert "hunter2" in WorkflowRun.objects.get(run_id=failed).last_error
    WorkflowRun.objects.filter(run_id=lifecycle["later"]).delete()
    WorkflowRun.objects.filter(run_id=failed).update(failure_reason="tampered")
    WorkflowRunPending.objects.filter(run_id=lifecycle["branch"]).delete()
    stray = WorkflowRunPending.objects.get(run_id=lifecycle["later"])
    stray.pk, stray.step = None, "7"
    stray.save()

    out, _ = command("rebuild_workflow_projections")

    assert "4 row(s) differed from before" in out
    assert check().differences == []
    run = WorkflowRun.objects.get(run_id=failed)
    assert run.failure_reason == "step_failed" and "hunter2" in run.last_error
    assert WorkflowRun.objects.filter(run_id=lifecycle["later"], status="waiting").exists()
    assert not WorkflowRunPending.objects.filter(step="7").exists()


def test_a_rebuilt_table_keeps_working(past):
    run_id = start("t.wait", "t-wait", **{"for": past})

    rebuild()

    assert resume_due_runs().completed == 1
    assert WorkflowRun.objects.get(run_id=run_id).status == "completed"


def test_rebuild_shows_progress_as_plain_lines_off_a_terminal(lifecycle):
    out, err = command("rebuild_workflow_projections")
    quiet_out, quiet_err = command("rebuild_workflow_projections", "-v", "0")

    total = check().events
    assert total > 20
    assert err.splitlines()[-1] == f"Replaying events: {total}/{total} (100%)"
    assert "\r" not in err
    assert f"from {total} event(s)" in out
    assert quiet_err == ""


@pytest.mark.django_db(transaction=True)
def test_check_exits_1_as_a_real_process(past):
    run_id = start("t.wait", "t-wait", **{"for": past})

    clean = run_manage("rebuild_workflow_projections", "--check")
    WorkflowRun.objects.filter(run_id=run_id).update(step="9")
    dirty = run_manage("rebuild_workflow_projections", "--check")

    assert clean.returncode == 0, clean.stderr
    assert dirty.returncode == 1
    assert f"run {run_id}: step: table has '9', events give '1'" in dirty.stdout
    assert "Traceback" not in dirty.stderr and "1 row(s) differ" in dirty.stderr


# --- progress -------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_on_a_terminal_redraws_one_line():
    stream, clock = io.StringIO(), FakeClock()
    bar = Progress(10, "work", stream, tty=True, clock=clock)

    bar.update(1)
    bar.update(2)  # within the redraw interval: not drawn
    clock.now = 1.0
    bar.update(5, "half")
    bar.note("a line of its own")
    bar.finish()

    assert stream.getvalue() == (
        "\r\x1b[Kwork [##--------------------------]  10% 1/10"
        "\r\x1b[Kwork [##############--------------]  50% 5/10  half"
        "\r\x1b[Ka line of its own\n"
        "\r\x1b[Kwork [##############--------------]  50% 5/10  half"
        "\r\x1b[Kwork [##############--------------]  50% 5/10  half\n"
    )


def test_progress_elsewhere_writes_a_line_per_tenth_or_interval():
    stream, clock = io.StringIO(), FakeClock()
    bar = Progress(100, "work", stream, tty=False, interval=5.0, clock=clock)

    for done in range(1, 26):
        bar.update(done)
    clock.now = 6.0
    bar.update(26)
    bar.update(27)
    bar.finish()

    assert stream.getvalue().splitlines() == [
        "work: 10/100 (10%)",
        "work: 20/100 (20%)",
        "work: 26/100 (26%)",
        "work: 27/100 (27%)",
    ]


def test_progress_reads_isatty_from_the_stream():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert Progress(1, "x", Terminal()).tty is True
    assert Progress(1, "x", io.StringIO()).tty is False
