"""Rolling deploys: old code leaves new runs alone, and edits a run has not reached keep it.

Each in-process test deploys "code" with ``registry.override(...)``; the
two-process test runs two real workers on PostgreSQL, one started with the
code from before a step was appended (``KUMIKO_TEST_DEPLOY=old``, see
``tests/testapp/workflows.py``). Instants are passed in, never waited for.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from kumiko_workflows import (
    RunNotRerunnable,
    define_workflow,
    on_event,
    rerun_run,
    resume_due_runs,
    run_id_for,
    signals,
    steps,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.engine import deploys, transitions
from kumiko_workflows.engine.worker import Worker as InProcessWorker
from kumiko_workflows.models import (
    DeployedDefinition,
    Event,
    RunStatus,
    SignalDelivery,
    WorkerHeartbeat,
    WorkflowRun,
    WorkflowRunPending,
)
from kumiko_workflows.operations.rebuild import check
from kumiko_workflows.operations.status import health
from kumiko_workflows.operations.version_table import version_table
from kumiko_workflows.workflow.positions import reached
from kumiko_workflows.workflow.registry import registry
from tests.support import run_manage, trigger, types_of
from tests.support.faults import Worker, wait_for
from tests.testapp import workflows as w

NAME = "t-deploying"


@pytest.fixture(autouse=True)
def _forget_the_processes_code():
    deploys.forget()
    yield
    deploys.forget()


def definition(*body, extra=()):
    """The test workflow: record, wait ("until"), then ``body`` (default: record "second")."""
    return define_workflow(
        name=NAME,
        trigger=on_event("t.deploying"),
        idempotency_key=w.run_key,
        steps=[
            steps.compute("first", w.record("first")),
            steps.wait(w.payload_value("until", "PT1H")),
            *(body or [steps.compute("second", w.record("second"))]),
            *extra,
        ],
        register=False,
    )


def start(**payload):
    event = trigger("t.deploying", **payload)
    return event, run_id_for(NAME, event.payload["run_key"])


def recorded(event):
    rows = Event.objects.filter(aggregate_id=event.aggregate_id, type="t.recorded")
    return [row.payload["step"] for row in rows.order_by("id")]


def deploys_box(client):
    """The run list's "Deploys" box, as text."""
    html = client.get(reverse("admin:kumiko_workflows_workflowrun_changelist")).content.decode()
    if 'id="kw-deploys"' not in html:
        return ""
    return html[html.index('id="kw-deploys"') :].split("</div>")[0].replace("&#x27;", "'")


def versions_row():
    return next(row for row in version_table() if row.workflow_name == NAME)


def check_versions():
    out, err = io.StringIO(), io.StringIO()
    call_command("workflow_versions", "--check", stdout=out, stderr=err)
    return out.getvalue()


def first_deploy():
    """A database no code has been seen on (worker processes of other tests leave theirs)."""
    DeployedDefinition.objects.all().delete()
    deploys.forget()  # what this process registered (as it connected, say) is gone too


def register_old_code(workflow):
    """Deploy ``workflow`` an hour ago: its code (all of it) first seen then."""
    first_deploy()
    with registry.override(workflow):
        assert deploys.register_code(force=True)
    DeployedDefinition.objects.update(first_seen_at=timezone.now() - timedelta(hours=1))


# --- which steps a run has met ------------------------------------------------------


def test_a_run_has_met_the_steps_before_it_the_branches_around_it_and_its_own():
    at = "2.then.1"
    met = ["0", "1", "1.then.0", "1.else.0", "2", "2.then.0", "2.then.1", "2.then.1.do.0"]
    not_met = ["2.then.2", "2.else.0", "3", "3.then.0"]
    assert [p for p in met if not reached(p, at)] == []
    assert [p for p in not_met if reached(p, at)] == []


# --- compatible edits keep runs ---------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("registered", [True, False], ids=["registered", "old-rows-only"])
def test_a_step_appended_after_the_wait_keeps_a_waiting_run(now, future, registered, admin_client):
    old = definition()
    first_deploy()
    if registered:
        register_old_code(old)
    with registry.override(old):
        event, run_id = start(until=future)
    if not registered:
        # Written by an engine from before registrations: only run-started has the steps.
        assert not DeployedDefinition.objects.filter(fingerprint=old.fingerprint).exists()
    new = definition(extra=[steps.wait("PT1H"), steps.compute("appended", w.record("appended"))])

    with registry.override(new):
        row = versions_row()
        assert (row.kept, row.stranded, row.failing) == (1, 0, [])
        assert "1 waiting on an edited definition resume on it" in check_versions()
        assert deploys_box(admin_client) == ""
        moved = resume_due_runs(now=now + timedelta(hours=2))
        # Waiting again, now on the edited definition: nothing left to judge.
        assert WorkflowRun.objects.get(run_id=run_id).definition_fingerprint == new.fingerprint
        assert (versions_row().kept, versions_row().stranded) == (0, 0)
        report = resume_due_runs(now=now + timedelta(hours=4))

    assert (moved.suspended, moved.failed, report.completed) == (1, 0, 1)
    assert recorded(event) == ["first", "second", "appended"]
    assert et.RUN_FAILED not in types_of(run_id)
    resumed = Event.objects.filter(aggregate_id=run_id, type=et.RESUMED).order_by("id")[0]
    assert resumed.payload["from_fingerprint"] == old.fingerprint
    assert resumed.payload["definition_fingerprint"] == new.fingerprint
    run = WorkflowRun.objects.get(run_id=run_id)
    assert (run.status, run.definition_fingerprint) == (RunStatus.COMPLETED, new.fingerprint)
    assert run.version == Event.objects.filter(aggregate_id=run_id).count()
    assert check().differences == []  # the status rows rebuild from the streams as they are


@pytest.mark.django_db
def test_an_edit_to_a_step_the_run_has_run_fails_it_naming_the_change_from_its_side(
    now, future, admin_client
):
    old = definition()
    register_old_code(old)
    with registry.override(old):
        event, run_id = start(until=future)
    edited = define_workflow(
        name=NAME,
        trigger=on_event("t.deploying"),
        idempotency_key=w.run_key,
        steps=[
            steps.compute("first", w.record("first-edited")),
            steps.wait(w.payload_value("until", "PT1H")),
            steps.compute("second", w.record("second")),
        ],
        register=False,
    )

    with registry.override(edited):
        # Said before the deploy: which waiting runs it would fail, and why.
        row = versions_row()
        assert (row.kept, row.stranded) == (0, 1)
        with pytest.raises(CommandError):
            check_versions()
        box = deploys_box(admin_client)
        report = resume_due_runs(now=now + timedelta(hours=2))

    assert row.failing == [
        {
            "step": "1",
            "runs": 1,
            "why": f"version 1 of workflow {NAME!r} changed where the run is (step 1): step 0 "
            "(compute 'first') (before step 1, where the run waits) changed",
        }
    ]
    assert (
        f"1 waiting run of workflow {NAME!r} version 1 at step 1 would fail on this code: "
        "version 1 of workflow" in box
    )
    assert "step 0 (compute 'first') (before step 1, where the run waits) changed" in box
    assert report.failed == 1
    assert recorded(event) == ["first"]
    run = WorkflowRun.objects.get(run_id=run_id)
    assert run.failure_reason == "workflow_definition_changed"
    assert "step 0 (compute 'first') (before step 1, where the run waits) changed" in (
        run.last_error
    )
    assert "declare the edit under a new version=" in run.last_error
    assert "migrate_workflow_runs" in run.last_error


@pytest.mark.django_db
def test_an_edit_to_the_step_it_waits_at_fails_it(now, future):
    old = definition()
    with registry.override(old):
        _, run_id = start(until=future)
    edited = define_workflow(
        name=NAME,
        trigger=on_event("t.deploying"),
        idempotency_key=w.run_key,
        steps=[
            steps.compute("first", w.record("first")),
            steps.wait("PT2H"),
            steps.compute("second", w.record("second")),
        ],
        register=False,
    )
    with registry.override(edited):
        resume_due_runs(now=now + timedelta(hours=2))

    run = WorkflowRun.objects.get(run_id=run_id)
    assert run.status == RunStatus.FAILED
    assert "step 1 (wait) (where the run waits) changed" in run.last_error


@pytest.mark.django_db
def test_a_step_inserted_before_the_wait_fails_it_and_an_edit_of_the_other_arm_does_not(
    now, future
):
    def branching(else_step, before=()):
        return define_workflow(
            name=NAME,
            trigger=on_event("t.deploying"),
            idempotency_key=w.run_key,
            steps=[
                *before,
                steps.compute("first", w.record("first")),
                steps.branch(
                    if_=w.payload_value("then", True),
                    then=[
                        steps.wait(w.payload_value("until", "PT1H")),
                        steps.compute("second", w.record("second")),
                    ],
                    else_=[else_step],
                ),
            ],
            register=False,
        )

    old = branching(steps.compute("other", w.record("other")))
    with registry.override(old):
        kept_event, kept = start(until=future)
        _, failed = start(until=future)
    assert WorkflowRunPending.objects.get(run_id=kept).step == "1.then.0"

    other_arm = branching(steps.compute("other", w.record("other-edited")))
    with registry.override(other_arm):
        assert resume_due_runs(now=now + timedelta(hours=2), limit=1).completed == 1
    inserted = branching(
        steps.compute("other", w.record("other")),
        before=[steps.compute("zeroth", w.record("zeroth"))],
    )
    with registry.override(inserted):
        resume_due_runs(now=now + timedelta(hours=2))

    assert recorded(kept_event) == ["first", "second"]
    run = WorkflowRun.objects.get(run_id=failed)
    assert run.status == RunStatus.FAILED
    assert "step 0 (compute 'zeroth') (before step 1.then.0, where the run waits) changed" in (
        run.last_error
    )


# --- old code leaves new runs -----------------------------------------------------------


@pytest.mark.django_db
def test_old_code_leaves_a_run_of_newer_code_once_and_the_health_check_names_it(past, admin_client):
    old = definition()
    new = definition(extra=[steps.compute("appended", w.record("appended"))])
    register_old_code(old)
    with registry.override(new):
        assert deploys.register_code(force=True)
        event, run_id = start(until=past)

    with registry.override(old):
        worker = InProcessWorker(cron=False)
        first = worker.run_once()
        again = worker.run_once()
    assert (first.report.left, first.report.failed, first.report.resumed) == (1, 0, 0)
    # Its claims skip that definition from then on: no row taken again and again.
    assert (again.report.left, again.report.processed) == (0, 0)
    row = WorkflowRunPending.objects.get(run_id=run_id)
    assert (row.step, row.definition_fingerprint) == ("1", new.fingerprint)
    assert WorkflowRun.objects.get(run_id=run_id).status == RunStatus.WAITING
    beat = WorkerHeartbeat.objects.get()
    assert [entry["fingerprint"] for entry in beat.left_code] == [new.fingerprint]
    verdict = health(None, timezone.now(), max_lag=None, max_heartbeat_age=None)
    assert not verdict["healthy"]
    assert f"worker {beat.name} runs code older than its runs need" in verdict["problems"][0]
    assert "(1 due now); restart it with the new code" in verdict["problems"][0]
    assert f"worker {beat.name} runs code older than its runs need" in deploys_box(admin_client)

    with registry.override(new):
        assert resume_due_runs().completed == 1
    assert recorded(event) == ["first", "second", "appended"]
    assert et.RUN_FAILED not in types_of(run_id)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_processes_the_old_worker_leaves_a_new_run_and_the_new_one_resumes_it(tmp_path, past):
    first_deploy()
    old = Worker(tmp_path, "--loop", "--no-cron", name="old", KUMIKO_TEST_DEPLOY="old")
    new = None
    try:
        beat = wait_for(
            lambda: WorkerHeartbeat.objects.filter(pid=old.pid).first(), "the old worker"
        )
        # This process has the new code, deployed after the old worker started.
        assert deploys.register_code(force=True)
        event, run_id = start(until=past)
        assert WorkflowRunPending.objects.filter(run_id=run_id).exists()

        try:
            left = wait_for(
                lambda: WorkerHeartbeat.objects.filter(pk=beat.pk).exclude(left_code=[]).first(),
                "the old worker to leave the run",
            )
        except AssertionError as exc:
            seen = sorted(
                (str(d.first_seen_at), d.first_seen_by, d.fingerprint[:8], d.workflow_name)
                for d in DeployedDefinition.objects.all()
            )
            raise AssertionError(
                f"{exc}: {types_of(run_id)} {recorded(event)} {old.out()} "
                f"{registry.get(NAME).fingerprint[:8]} {seen}"
            ) from None
        assert left.left_code[0]["fingerprint"] == registry.get(NAME).fingerprint
        assert WorkflowRun.objects.get(run_id=run_id).status == RunStatus.WAITING
        probe = run_manage("workflow_status", "--check", "--max-lag", "off")
        assert probe.returncode == 1
        assert f"worker {beat.name} runs code older than its runs need" in probe.stderr

        new = Worker(tmp_path, "--loop", "--no-cron", name="new")
        wait_for(
            lambda: WorkflowRun.objects.filter(run_id=run_id, status=RunStatus.COMPLETED).exists(),
            "the new worker to complete the run",
        )
    finally:
        for process in (old, new):
            if process is not None:
                process.signal(signal.SIGTERM)
                process.wait()

    assert recorded(event) == ["first", "second", "appended"]
    assert et.RUN_FAILED not in types_of(run_id)
    assert old.log().count("Restart this worker") == 1, old.log()


@pytest.mark.django_db
def test_a_failed_run_reruns_after_an_edit_past_its_step_and_not_after_one_at_it(now, future):
    old = definition(steps.compute("second", w.boom))
    with registry.override(old):
        _, run_id = start(until=future)
        resume_due_runs(now=now + timedelta(hours=2))
    assert WorkflowRun.objects.get(run_id=run_id).status == RunStatus.FAILED
    at_step = definition(steps.compute("second", w.record("fixed")))
    appended = definition(
        steps.compute("second", w.boom), extra=[steps.compute("appended", w.record("appended"))]
    )

    with registry.override(at_step), pytest.raises(RunNotRerunnable) as refused:
        rerun_run(run_id)
    with registry.override(appended):
        assert rerun_run(run_id)
        resume_due_runs(now=now + timedelta(hours=2))

    assert "changed where the run is (step 2)" in str(refused.value)
    assert "step 2 (compute 'second')" in str(refused.value)
    # The rerun resumed on the edited definition (its step 2 unchanged, so it fails again there).
    assert types_of(run_id)[-3:] == [et.RERUN_REQUESTED, et.RESUMED, et.RUN_FAILED]
    resumed = Event.objects.filter(aggregate_id=run_id, type=et.RESUMED).order_by("-id")[0]
    assert resumed.payload["from_fingerprint"] == old.fingerprint
    run = WorkflowRun.objects.get(run_id=run_id)
    assert (run.definition_fingerprint, run.failure_reason) == (appended.fingerprint, "step_failed")
    assert check().differences == []


@pytest.mark.django_db(transaction=True)
def test_old_code_leaves_a_newer_runs_left_over_signal_for_a_worker_with_that_code(past):
    """Its receivers (and the run's sender) are in the newer code: the old one would drop them."""
    old = definition()
    new = definition(extra=[steps.compute("appended", w.record("appended"))])
    heard = []

    def receiver(sender, **kwargs):
        heard.append((sender, kwargs["delivery_id"]))

    register_old_code(old)
    signals.run_completed.connect(receiver, weak=False, dispatch_uid="test-deploys-leftover")
    try:
        with registry.override(new):
            assert deploys.register_code(force=True)
            _, run_id = start(until=past)
            resume_due_runs()
        completion = Event.objects.get(aggregate_id=run_id, type=et.RUN_COMPLETED)
        # As a new worker killed before its receivers ran leaves it.
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        owner = f"{transitions._HOST}:{dead.pid}:0123456789ab"
        SignalDelivery.objects.create(event_id=completion.id, tenant_id="default", owner=owner)
        heard.clear()

        with registry.override(old):
            deploys.forget()
            assert transitions.deliver_leftovers() == 0
        assert heard == [] and SignalDelivery.objects.filter(owner=owner).exists()
        with registry.override(new):
            deploys.forget()
            assert transitions.deliver_leftovers() == 1
            assert heard == [(new, completion.id)]
    finally:
        signals.run_completed.disconnect(dispatch_uid="test-deploys-leftover")
    assert SignalDelivery.objects.count() == 0
