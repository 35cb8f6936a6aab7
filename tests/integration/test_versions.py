"""Versions of a workflow side by side, ``workflow_versions`` and explicit moves of runs.

Each test deploys "code" with ``registry.override(...)``: the versions it
names are exactly the ones declared (``override(v2)`` alone is a deploy
that removed v1). Real rows on SQLite and PostgreSQL, instants passed in.
"""

from __future__ import annotations

import io
import json
import uuid
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command

from kumiko_workflows import (
    MigrationRefused,
    RunNotRerunnable,
    append_event,
    define_workflow,
    migrate_workflow_runs,
    on_event,
    rerun_run,
    resume_due_runs,
    run_id_for,
    steps,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.exceptions import WorkflowDefinitionError
from kumiko_workflows.models import (
    Event,
    RunStatus,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
)
from kumiko_workflows.operations.explain import timeline
from kumiko_workflows.operations.rebuild import check
from kumiko_workflows.operations.status import status_report
from kumiko_workflows.operations.version_table import version_table
from kumiko_workflows.store.stream_ids import engine_stream
from kumiko_workflows.workflow.definition import MAX_VERSION
from kumiko_workflows.workflow.registry import registry
from tests.support import run_events, trigger, types_of
from tests.testapp import workflows as w

pytestmark = pytest.mark.django_db

NAME = "t-versioned"


def version_1(**changes):
    """The first version: record, wait, record, wait again."""
    return define_workflow(
        name=NAME,
        trigger=on_event("t.versioned"),
        idempotency_key=w.run_key,
        steps=changes.pop(
            "steps",
            [
                steps.compute("before", w.record("before")),
                steps.wait(w.payload_value("for", "PT1H")),
                steps.compute("after", w.record("after")),
                steps.wait(w.payload_value("then", "PT1M")),
            ],
        ),
        register=False,
        **changes,
    )


def version_2(migrates_from=None):
    """The second version: a step added between the waits (positions 3 and 4 move)."""
    return define_workflow(
        name=NAME,
        trigger=on_event("t.versioned"),
        idempotency_key=w.run_key,
        version=2,
        migrates_from=migrates_from,
        steps=[
            steps.compute("before", w.record("before")),
            steps.wait(w.payload_value("for", "PT1H")),
            steps.compute("check", w.record("check")),
            steps.compute("after", w.record("after")),
            steps.wait(w.payload_value("then", "PT1M")),
        ],
        register=False,
    )


def start(tenant_id="default", **payload):
    event = trigger("t.versioned", tenant_id=tenant_id, **payload)
    return event, run_id_for(NAME, event.payload["run_key"], tenant_id)


def recorded(event):
    """The steps a run recorded, in order: which version's code ran."""
    rows = Event.objects.filter(aggregate_id=event.aggregate_id, type="t.recorded")
    return [row.payload["step"] for row in rows.order_by("id")]


def run_of(run_id):
    return WorkflowRun.objects.get(run_id=run_id)


def command(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def versions():
    """This module's rows of the version table (the test app declares other workflows)."""
    return [row for row in version_table() if row.workflow_name == NAME]


def line_of(out, version):
    """The cells of this module's workflow's line for ``version`` in a printed table."""
    return next(
        line.split() for line in out.splitlines() if line.split()[:2] == [NAME, str(version)]
    )


def tables():
    """Everything a move may change: the events, the run rows, the pending rows, the keys."""
    return (
        Event.objects.count(),
        list(WorkflowRun.objects.order_by("run_id").values()),
        list(WorkflowRunPending.objects.order_by("id").values()),
        list(WorkflowWaitKey.objects.order_by("id").values()),
    )


def drain(now, *hours):
    for hour in hours:
        resume_due_runs(now=now + timedelta(hours=hour))


# --- side by side ---------------------------------------------------------------------


def test_a_v1_run_resumes_on_v1_after_v2_is_declared_and_new_triggers_start_v2(now, future):
    with registry.override(version_1()):
        old_event, old = start(**{"for": future})
    assert run_of(old).workflow_version == 1

    with registry.override(version_1(), version_2()):
        new_event, new = start(**{"for": future})
        assert run_events(new)[0].payload["workflow_version"] == 2
        assert WorkflowRunPending.objects.get(run_id=new).workflow_version == 2
        rows = {(r.version, r.declared, r.in_flight, r.current) for r in versions()}
        assert rows == {(1, True, 1, False), (2, True, 1, True)}
        drain(now, 2, 3)

    assert recorded(old_event) == ["before", "after"]  # v1's steps, though v2 was declared
    assert recorded(new_event) == ["before", "check", "after"]
    assert (run_of(old).status, run_of(old).workflow_version) == ("completed", 1)
    assert (run_of(new).status, run_of(new).workflow_version) == ("completed", 2)
    assert check().differences == []


def test_a_run_of_a_removed_version_fails_loudly_and_workflow_versions_check_warned(now, future):
    with registry.override(version_1()):
        _, old = start(**{"for": future})
    with registry.override(version_2()):  # the deploy that removed v1
        out, _ = command("workflow_versions")
        err = io.StringIO()
        with pytest.raises(CommandError, match=r"1 workflow version\(s\) have runs in flight"):
            call_command("workflow_versions", "--check", stdout=io.StringIO(), stderr=err)
        drain(now, 2)
        failed = run_of(old)
        with pytest.raises(RunNotRerunnable, match="version 1 of workflow 't-versioned'"):
            rerun_run(old)  # a rerun keeps the run's version
        assert command("workflow_versions", "--check")[1] == ""  # nothing left in flight

    assert line_of(out, 1) == [NAME, "1", "no", "1", "1"]
    assert line_of(out, 2) == [NAME, "2", "yes", "0", "0", "(new", "runs", "start", "here)"]
    assert err.getvalue().strip() == (
        "workflow 't-versioned' version 1: 1 run(s) in flight would fail at resume "
        "(workflow_definition_changed): the code no longer declares version 1"
    )
    assert failed.status == "failed"
    assert failed.failure_reason == "workflow_definition_changed"
    assert "version 1 of workflow 't-versioned' is no longer declared (declared: 2)" in (
        failed.last_error
    )
    assert run_events(old)[-1].payload["step"] == "1"
    assert check().differences == []


def test_a_version_changed_in_place_fails_naming_the_step_and_check_says_so(now, future):
    with registry.override(version_1()):
        _, old = start(**{"for": future})
    # An edit to a step the waiting run has run (an edit after it would keep it: test_deploys).
    changed = version_1(
        steps=[
            steps.compute("before", w.record("renamed")),
            steps.wait(w.payload_value("for", "PT1H")),
            steps.compute("after", w.record("after")),
            steps.wait(w.payload_value("then", "PT1M")),
        ]
    )
    with registry.override(changed, version_2()):
        err = io.StringIO()
        with pytest.raises(CommandError):
            call_command("workflow_versions", "--check", stdout=io.StringIO(), stderr=err)
        drain(now, 2)

    assert "version 1 was changed in place since they started" in err.getvalue()
    last_error = run_of(old).last_error
    assert "version 1 of workflow 't-versioned' changed where the run is (step 1)" in last_error
    assert "step 0 (compute 'before') (before step 1, where the run waits) changed" in last_error


def test_workflow_status_and_the_json_show_runs_in_flight_per_version(now, future):
    with registry.override(version_1()):
        start(**{"for": future})
    with registry.override(version_1(), version_2()):
        start(**{"for": future})
        start(**{"for": future}, tenant_id="acme")
        out, _ = command("workflow_status")
        scoped = status_report("acme", now)
        data = json.loads(command("workflow_versions", "--json")[0])

    assert "Runs in flight by version" in out
    assert line_of(out, 1) == [NAME, "1", "yes", "1", "0"]
    assert line_of(out, 2) == [NAME, "2", "yes", "2", "0", "(new", "runs", "start", "here)"]
    assert [(r["version"], r["in_flight"]) for r in scoped["in_flight"]] == [(2, 1)]
    assert [row for row in data["versions"] if row["workflow_name"] == NAME][0] == {
        "workflow_name": NAME,
        "version": 1,
        "declared": True,
        "in_flight": 1,
        "stranded": 0,
        "current": False,
        "kept": 0,
        "failing": [],
    }


def test_a_run_started_before_versions_were_recorded_resumes_on_its_fingerprints_version(
    now, future
):
    with registry.override(version_1()):
        _, model = start(**{"for": future})
        # The stream an older engine wrote: the same events, no version in them.
        legacy = uuid.uuid4()
        with engine_stream():
            for old in run_events(model):
                payload = {k: v for k, v in old.payload.items() if k != "workflow_version"}
                append_event(legacy, et.RUN_AGGREGATE_TYPE, old.type, payload, "default")
    assert run_of(legacy).workflow_version is None
    assert WorkflowRunPending.objects.get(run_id=legacy).workflow_version is None

    def table():
        return {(r.version, r.declared, r.in_flight, r.stranded) for r in versions()}

    with registry.override(version_2()):
        # No declared version has its fingerprint: shown as "?" and counted as stranded.
        unresolved = table()
    with registry.override(version_1(), version_2()):
        resolved = table()
        drain(now, 2)
    with registry.override(version_2()):
        recorded_now = table()

    assert unresolved == {(1, False, 1, 1), (2, True, 0, 0), (None, False, 1, 1)}
    assert resolved == {(1, True, 2, 0), (2, True, 0, 0)}  # under the version of its fingerprint
    assert types_of(legacy)[-2:] == [et.RESUMED, et.WAITING]  # resumed on v1
    # Its next suspension recorded the version: the rows have it from then on.
    assert run_of(legacy).workflow_version == 1
    assert WorkflowRunPending.objects.get(run_id=legacy).workflow_version == 1
    assert recorded_now == {(1, False, 2, 2), (2, True, 0, 0)}
    assert check().differences == []


def paying(version):
    """Waits up to three days for its payment, then records whether it came."""
    return define_workflow(
        name="t-versioned-pay",
        trigger=on_event("t.versioned-pay"),
        idempotency_key=w.run_key,
        awaits={"paid": "t.versioned-paid"},
        version=version,
        steps=[
            steps.wait_for_event("paid", match=w.user_match, timeout="P3D"),
            steps.compute("after", w.record("after")),
        ],
        register=False,
    )


def test_declaring_v1_again_and_rerunning_resumes_its_wait_with_its_deadline(now):
    """The documented recovery: a wait already over resumes at once, not a second hour."""
    with registry.override(version_1()):
        event, run_id = start()  # waits PT1H at step 1
    wait = WorkflowRunPending.objects.get(run_id=run_id)
    with registry.override(version_2()):  # the deploy that removed v1 too early
        drain(now, 2)
    assert run_of(run_id).failure_reason == "workflow_definition_changed"

    with registry.override(version_1(), version_2()):  # v1 declared again
        assert rerun_run(run_id, by="ops")
        row = WorkflowRunPending.objects.get(run_id=run_id)
        assert (row.suspension_type, row.step, row.wake_at) == ("wait", "1", wait.wake_at)
        assert run_of(run_id).wake_at == wait.wake_at
        said = [entry.summary for entry in timeline(run_of(run_id))][-1]
        assert said.startswith("resumes its wait as it was, until ")
        drain(now, 2)  # the same instant: the hour is over

    assert recorded(event) == ["before", "after"]
    assert types_of(run_id)[-3:] == [et.RERUN_REQUESTED, et.RESUMED, et.WAITING]
    assert WorkflowRunPending.objects.get(run_id=run_id).step == "3"  # the second wait
    assert check().differences == []


def test_declaring_v1_again_edited_after_the_wait_reruns_the_wait_as_it_was_on_the_edit(now):
    """The rerun's kept suspension and an edit the run survives: both hold, nothing restarts."""
    with registry.override(version_1()):
        event, run_id = start()  # waits PT1H at step 1
    wait = WorkflowRunPending.objects.get(run_id=run_id)
    with registry.override(version_2()):
        drain(now, 2)
    assert run_of(run_id).failure_reason == "workflow_definition_changed"
    appended = [steps.compute("appended", w.record("appended"))]
    edited = version_1(steps=[*version_1().steps, *appended])

    with registry.override(edited, version_2()):  # v1 declared again, a step appended
        assert rerun_run(run_id, by="ops")
        row = WorkflowRunPending.objects.get(run_id=run_id)
        assert (row.suspension_type, row.step, row.wake_at) == ("wait", "1", wait.wake_at)
        drain(now, 2, 3)  # the hour was over: resumed at once, then the second wait

    assert recorded(event) == ["before", "after", "appended"]
    assert run_of(run_id).status == RunStatus.COMPLETED
    assert run_of(run_id).definition_fingerprint == edited.fingerprint
    assert check().differences == []


def test_declaring_v1_again_and_rerunning_keeps_a_timed_out_payment_window(now):
    """A 3-day wait_for_event that timed out resumes timed out: the window stays 3 days."""
    with registry.override(paying(1)):
        event = trigger("t.versioned-pay", user_id="u1")
        run_id = run_id_for("t-versioned-pay", event.payload["run_key"])
    wait = WorkflowRunPending.objects.get(run_id=run_id)
    past_deadline = now + timedelta(days=3, hours=1)
    with registry.override(paying(2)):
        resume_due_runs(now=past_deadline)
    assert run_of(run_id).failure_reason == "workflow_definition_changed"

    with registry.override(paying(1), paying(2)):
        assert rerun_run(run_id)
        row = WorkflowRunPending.objects.get(run_id=run_id)
        assert (row.timeout_at, row.match_expr) == (wait.timeout_at, wait.match_expr)
        assert WorkflowWaitKey.objects.filter(run_id=run_id).exists()  # still addressable
        resume_due_runs(now=past_deadline)

    assert run_of(run_id).status == "completed"
    after = Event.objects.get(aggregate_id=event.aggregate_id, type="t.recorded")
    assert after.payload["steps"] == {"paid": None}  # timed out, as it had
    assert check().differences == []


@pytest.mark.parametrize("version", [2**31, 2**63, 10**100, -1, 2.0, "2", None])
def test_a_version_the_columns_cannot_hold_is_refused_at_definition(version):
    with pytest.raises(WorkflowDefinitionError) as refused:
        version_1(version=version)

    assert str(refused.value) == (
        f"workflow {NAME!r}: version must be an integer from 1 to 2147483647, got {version!r}"
    )


def test_the_highest_version_starts_resumes_and_finishes_its_runs_on_this_database(now, future):
    with registry.override(version_1(version=MAX_VERSION)):
        event, run_id = start(**{"for": future})
        assert run_of(run_id).workflow_version == MAX_VERSION
        drain(now, 2, 3)

    assert (run_of(run_id).status, recorded(event)) == ("completed", ["before", "after"])
    assert check().differences == []


# --- explicit moves -------------------------------------------------------------------


def test_an_explicit_migration_moves_a_waiting_run_and_it_completes_on_v2(now, future):
    with registry.override(version_1()):
        event, old = start(**{"for": future})
    v2 = version_2(migrates_from={1: {"1": "1", "3": "4"}})
    with registry.override(v2):  # v1 removed: the moved run no longer needs it
        out, _ = command("migrate_workflow_runs", NAME, "--from", "1", "--to", "2", "--by", "ops")
        assert command("workflow_versions", "--check")[1] == ""
        drain(now, 2, 3)

    assert "step 1 -> step 1: 1 run(s)" in out
    assert "moved 1 waiting run(s) from version 1 to version 2" in out
    moved = next(e for e in run_events(old) if e.type == et.RUN_MIGRATED)
    assert {k: moved.payload[k] for k in ("from_version", "workflow_version", "from_step")} == {
        "from_version": 1,
        "workflow_version": 2,
        "from_step": "1",
    }
    assert moved.payload["definition_fingerprint"] == v2.fingerprint
    assert moved.payload["by"] == "ops" and moved.created_by == "ops"
    assert types_of(old) == [
        et.RUN_STARTED,
        et.WAITING,
        et.RUN_MIGRATED,
        et.RESUMED,
        et.WAITING,
        et.RESUMED,
        et.RUN_COMPLETED,
    ]
    assert recorded(event) == ["before", "check", "after"]  # v2's steps after the move
    run = run_of(old)
    assert (run.status, run.workflow_version, run.definition_fingerprint) == (
        "completed",
        2,
        v2.fingerprint,
    )
    assert check().differences == []


def test_a_moved_run_updates_its_pending_row_and_status_row_in_the_projections(now, future):
    with registry.override(version_1()):
        _, waiting = start(**{"for": future})
        _, further = start(**{"for": (now - timedelta(hours=1)).isoformat(), "then": "PT5H"})
        drain(now, 0.1)  # `further` goes on to wait at step 3
    before = WorkflowRunPending.objects.get(run_id=further)
    v2 = version_2(migrates_from={1: {"1": "1", "3": "4"}})
    with registry.override(version_1(), v2):
        report = migrate_workflow_runs(NAME, 1, 2)

    assert dict(report.steps) == {("1", "1"): 1, ("3", "4"): 1}
    row = WorkflowRunPending.objects.get(run_id=further)
    assert (row.step, row.workflow_version, row.definition_fingerprint) == ("4", 2, v2.fingerprint)
    assert (row.wake_at, row.state) == (before.wake_at, before.state)  # the same wait
    assert row.run_version == before.run_version + 1
    run = run_of(further)
    assert (run.step, run.workflow_version, run.status) == ("4", 2, "waiting")
    assert run_of(waiting).workflow_version == 2
    assert check().differences == []


def test_a_moved_event_wait_keeps_its_keys_and_its_event_wakes_it_on_v2(now):
    def event_version(version, steps_, migrates_from=None):
        return define_workflow(
            name="t-versioned-event",
            trigger=on_event("t.versioned-event"),
            idempotency_key=w.run_key,
            awaits={"verified": "t.verified"},
            version=version,
            migrates_from=migrates_from,
            steps=steps_,
            register=False,
        )

    wait = steps.wait_for_event("verified", match=w.user_match)
    v1 = event_version(1, [wait, steps.compute("after", w.record("after"))])
    v2 = event_version(
        2,
        [steps.compute("note", w.record("note")), wait, steps.compute("after", w.record("after"))],
        migrates_from={1: {"0": "1"}},
    )
    other_key = define_workflow(
        name="t-versioned-event",
        trigger=on_event("t.versioned-event"),
        idempotency_key=w.run_key,
        awaits={"approved": "t.verified"},
        version=2,
        migrates_from={1: {"0": "0"}},
        steps=[steps.wait_for_event("approved", match=w.user_match)],
        register=False,
    )
    with registry.override(v1):
        event = trigger("t.versioned-event", user_id="u-7")
        run_id = run_id_for("t-versioned-event", event.payload["run_key"])
    keys = list(WorkflowWaitKey.objects.filter(run_id=run_id).values("path", "value"))
    with registry.override(other_key), pytest.raises(MigrationRefused) as refused:
        migrate_workflow_runs("t-versioned-event", 1, 2)
    assert "which does not wait for the same awaits key 'verified'" in str(refused.value)
    with registry.override(v2):
        assert migrate_workflow_runs("t-versioned-event", 1, 2).moved == 1
        assert list(WorkflowWaitKey.objects.filter(run_id=run_id).values("path", "value")) == keys
        append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u-7"})
        drain(now, 0.1)

    assert run_of(run_id).status == "completed"
    assert recorded(event) == ["after"]  # "note" stands before the wait: it never runs
    assert check().differences == []


def test_a_moved_retry_backoff_goes_on_with_its_attempt_on_v2(now):
    def retrying(version, before=(), migrates_from=None):
        return define_workflow(
            name="t-versioned-retry",
            trigger=on_event("t.versioned-retry"),
            idempotency_key=w.run_key,
            version=version,
            migrates_from=migrates_from,
            steps=[
                *before,
                steps.retry(times=3, backoff="linear", do=[steps.compute("gate", w.gate)]),
            ],
            register=False,
        )

    with registry.override(retrying(1)):
        event = trigger("t.versioned-retry", fail_attempts=1)
        run_id = run_id_for("t-versioned-retry", event.payload["run_key"])
    assert WorkflowRunPending.objects.get(run_id=run_id).retry_attempt == 1
    v2 = retrying(2, [steps.compute("note", w.record("note"))], migrates_from={1: {"0": "1"}})
    with registry.override(v2):
        assert dict(migrate_workflow_runs("t-versioned-retry", 1, 2).steps) == {("0", "1"): 1}
        resume_due_runs(now=now + timedelta(seconds=11))

    passed = Event.objects.get(aggregate_id=event.aggregate_id, type="t.gate-passed")
    assert passed.payload == {"attempt": 2}  # the second attempt, in v2's retry
    assert recorded(event) == []  # v2's first step stands before the retry
    assert run_of(run_id).status == "completed"
    assert check().differences == []


@pytest.mark.parametrize(
    ("declared", "args", "refusal"),
    [
        pytest.param(
            lambda: [version_2(migrates_from={1: {"1": "1"}})],
            (1, 2),
            "1 run(s) wait at step 3, which version 2's migrates_from[1] does not map. "
            "No run was moved.",
            id="a step the mapping leaves out",
        ),
        pytest.param(
            lambda: [version_2(migrates_from={1: {"1": "1", "3": "3"}})],
            (1, 2),
            "1 run(s) wait at step 3 (wait), mapped to step 3 (compute 'after'), which "
            "cannot resume it",
            id="a step that cannot resume the wait",
        ),
        pytest.param(
            lambda: [version_2()],
            (1, 2),
            "version 2 of workflow 't-versioned' declares no migrates_from for version 1",
            id="no mapping",
        ),
        pytest.param(
            lambda: [version_1()],
            (1, 2),
            "version 2 of workflow 't-versioned' is not declared (declared: 1)",
            id="an undeclared target",
        ),
    ],
)
def test_a_refused_migration_changes_nothing(now, future, declared, args, refusal):
    with registry.override(version_1()):
        start(**{"for": future})  # waits at step 1: movable by every mapping above
        start(**{"for": (now - timedelta(hours=1)).isoformat(), "then": "PT5H"})
        drain(now, 0.1)  # waits at step 3
    before = tables()

    with registry.override(*declared()):
        with pytest.raises(MigrationRefused) as refused:
            migrate_workflow_runs(NAME, *args)
        with pytest.raises(CommandError, match="No run was moved|not declared|no migrates_from"):
            command("migrate_workflow_runs", NAME, "--from", "1", "--to", "2")

    assert refusal in str(refused.value)
    assert tables() == before
    assert check().differences == []


def test_a_run_queued_to_start_moves_to_the_first_step_and_blocks_no_other(now):
    with registry.override(version_1(start="worker")):
        waiting = [start()[1] for _ in range(3)]
        drain(now, 0.1)  # they start in the worker and wait at step 1
        queued_event, queued = start()  # queued, not started yet
    assert {WorkflowRunPending.objects.get(run_id=r).step for r in waiting} == {"1"}
    assert WorkflowRunPending.objects.get(run_id=queued).suspension_type == "queued"

    # The mapping does not name step 0 (nor could a wait step resume a queued start).
    with registry.override(version_2(migrates_from={1: {"1": "1"}})):
        report = migrate_workflow_runs(NAME, 1, 2, dry_run=True)
        out, _ = command("migrate_workflow_runs", NAME, "--from", "1", "--to", "2")
        drain(now, 2, 3, 4)

    assert (report.moved, report.queued, dict(report.steps)) == (4, 1, {("1", "1"): 3})
    assert "  step 1 -> step 1: 3 run(s)" in out
    assert "  queued to start -> step 0 of version 2: 1 run(s)" in out
    assert "moved 4 waiting run(s) from version 1 to version 2" in out
    # It started on version 2 from its first step: v2's added step ran.
    assert recorded(queued_event) == ["before", "check", "after"]
    for run_id in (*waiting, queued):
        assert (run_of(run_id).status, run_of(run_id).workflow_version) == ("completed", 2)
    assert check().differences == []


def test_a_dry_run_counts_and_moves_nothing(future):
    with registry.override(version_1()):
        start(**{"for": future})
    before = tables()
    with registry.override(version_2(migrates_from={1: {"1": "1"}})):
        out, _ = command("migrate_workflow_runs", NAME, "--from", "1", "--to", "2", "--dry-run")

    assert "would move 1 waiting run(s) from version 1 to version 2" in out
    assert tables() == before


def test_a_migration_of_one_tenant_leaves_the_others(future):
    with registry.override(version_1()):
        _, here = start(**{"for": future}, tenant_id="acme")
        _, there = start(**{"for": future})
    with registry.override(version_2(migrates_from={1: {"1": "1"}})):
        assert migrate_workflow_runs(NAME, 1, 2, tenant_id="acme", by="ops").moved == 1

    assert (run_of(here).workflow_version, run_of(there).workflow_version) == (2, 1)
