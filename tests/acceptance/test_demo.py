"""``manage.py demo``: the whole lifecycle, then a clean projection check."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from kumiko_workflows import event_types as et
from kumiko_workflows.models import SETTLED_STATUSES, Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations.rebuild import check
from tests.support import run_manage


def demo(*args):
    out = io.StringIO()
    call_command("demo", "--fast", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_the_demo_finishes_every_run_and_the_projections_match_the_events():
    out = demo("--orders", "24")

    runs = WorkflowRun.objects.filter(workflow_name="order-fulfilment")
    assert runs.count() == 24
    assert set(runs.values_list("status", flat=True)) == {"completed", "failed", "cancelled"}
    assert not runs.exclude(status__in=SETTLED_STATUSES).exists()
    assert not WorkflowRunPending.objects.exists()
    # Every path of the story happened: paid, timed out, retried, failed, cancelled.
    assert Event.objects.filter(type="order.shipped").count() == 16
    assert Event.objects.filter(type="order.cancelled").count() == 4
    assert runs.filter(status="failed", failure_reason="step_failed").count() == 2
    assert runs.filter(status="cancelled").count() == 2
    assert Event.objects.filter(type=et.RETRY_SCHEDULED).count() == 4 * 2 + 2 * 3

    assert "Runs by final status" in out
    assert "completed    12  paid, charged and shipped\n" in out
    assert "completed     4  paid, charged and shipped (charge retried 2x)" in out
    assert "completed     4  not paid in time: order cancelled" in out
    assert "failed        2  failed: step_failed at step 2.else.0 (ChargeDeclined)" in out
    assert "cancelled     2  cancelled by support" in out
    assert "total        24" in out
    # The per-line fan-out, and its compensation when the charge fails or support cancels.
    assert "24 line reservations ran as child runs" in out
    assert (
        "failed        2  failed: step_failed at step 2.else.0 (ChargeDeclined), "
        "reservations released" in out
    )
    assert "cancelled     2  cancelled by support, reservations released" in out
    assert Event.objects.filter(type="order.stock-released").count() == 4
    lines = WorkflowRun.objects.filter(workflow_name="order-line-reservation")
    assert lines.count() == 24 and set(lines.values_list("status", flat=True)) == {"completed"}
    assert "Timeline of order #2 (flaky)" in out
    assert out.count(et.RETRY_SCHEDULED) == 2  # its two declined charges
    assert "python manage.py createsuperuser" in out and "python manage.py runserver" in out
    assert "runs finished: 24/24 (100%)" in out

    assert check().differences == []
    call_command("rebuild_workflow_projections", "--check", stdout=io.StringIO())


@pytest.mark.django_db
def test_check_reports_a_row_tampered_with_after_the_demo():
    demo("--orders", "12")
    run = WorkflowRun.objects.filter(status="failed").first()
    WorkflowRun.objects.filter(pk=run.pk).update(status="completed")

    out = io.StringIO()
    with pytest.raises(CommandError, match="1 row\\(s\\) differ"):
        call_command("rebuild_workflow_projections", "--check", stdout=out)

    assert f"run {run.run_id}: status: table has 'completed', events give 'failed'" in (
        out.getvalue()
    )


@pytest.mark.django_db
def test_the_demo_keeps_its_expected_failures_out_of_the_log(caplog):
    demo("--orders", "8")
    quiet = [r for r in caplog.records if r.name.startswith("kumiko_workflows")]
    caplog.clear()
    demo("--orders", "8", "-v", "2")
    loud = [r for r in caplog.records if r.name.startswith("kumiko_workflows")]

    assert quiet == []
    assert any("ChargeDeclined" in r.getMessage() for r in loud)


@pytest.mark.django_db(transaction=True)
def test_the_demo_runs_as_a_real_process():
    done = run_manage("demo", "--fast", "--orders", "12")
    check = run_manage("rebuild_workflow_projections", "--check")

    assert done.returncode == 0, done.stderr
    assert "every run finished after simulated" in done.stdout
    assert done.stderr == ""
    assert check.returncode == 0, check.stdout + check.stderr
    # 12 orders and their 12 line reservations (child runs).
    assert "No differences: 24 run(s) and 0 pending row(s)" in check.stdout


@pytest.mark.django_db
def test_the_demo_fails_loudly_when_runs_do_not_finish():
    from kumiko_workflows.workflow.registry import registry

    with registry.without("order-fulfilment"), pytest.raises(CommandError) as error:
        demo("--orders", "3")

    assert "3 run(s) had not finished after 45 s" in str(error.value)
