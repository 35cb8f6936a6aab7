"""Composition: child runs (call_workflow), fan-out / fan-in, the cancel cascade, compensation.

Through the public API on SQLite and PostgreSQL; the workflows are in
tests/testapp/compose_workflows.py. Limits are read from the run streams.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from kumiko_workflows import (
    WorkflowDefinitionError,
    cancel_run,
    define_workflow,
    on_call,
    on_event,
    rerun_run,
    resume_due_runs,
    run_id_for,
    steps,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.exceptions import RunNotRerunnable
from kumiko_workflows.models import Event, WorkflowChildGroup, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations import rebuild
from tests.support import run_events, trigger, types_of
from tests.testapp import compose_workflows as cw


def drain(limit: int = 500) -> int:
    """Resume due runs until none is left; return how many passes did something."""
    passes = 0
    for _ in range(limit):
        if not resume_due_runs().processed:
            return passes
        passes += 1
    raise AssertionError("runs still due after many passes")


def status(run_id) -> str:
    return WorkflowRun.objects.get(run_id=run_id).status


def children_of(run_id) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent_run_id=run_id).order_by("started_at", "run_id"))


def results(run_id) -> dict:
    return run_events(run_id)[-1].payload["state"]["results"]


def assert_rebuilds() -> None:
    found = rebuild.check()
    assert found.differences == [], found.differences


# --- call_workflow ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_childs_result_reaches_its_parent(past):
    event = trigger("t.call", n=21, wait_until=past)
    parent = run_id_for("t-parent-call", event.payload["run_key"])
    assert types_of(parent) == [et.RUN_STARTED, et.WAITING_FOR_CHILDREN]
    [child] = children_of(parent)
    # The child's trigger is the parent's request, its payload the input.
    request = Event.objects.get(id=child.trigger_event_id)
    assert (request.type, request.payload) == (et.CALL_REQUESTED, {"n": 21, "wait_until": past})
    assert request.metadata["parent_run_id"] == str(parent)
    assert run_events(child.run_id)[0].payload["parent"]["run_id"] == str(parent)
    assert child.run_id == run_id_for("t-child-double", f"{parent}/0/0")

    drain()
    assert status(child.run_id) == "completed"
    assert status(parent) == "completed"
    assert results(parent) == {"child": {"doubled": 42}, "after": {"got": {"doubled": 42}}}
    # Woken once, through the event path: the child's terminal event, by id.
    wake = [e for e in run_events(parent) if e.type == et.WAKE_REQUESTED]
    assert len(wake) == 1
    ended = Event.objects.get(id=wake[0].payload["awaited_event_id"])
    assert (ended.aggregate_id, ended.type) == (child.run_id, et.RUN_COMPLETED)
    assert_rebuilds()


@pytest.mark.django_db
def test_a_child_that_finishes_inline_needs_no_suspension():
    event = trigger("t.call", n=2)
    parent = run_id_for("t-parent-call", event.payload["run_key"])
    assert types_of(parent) == [et.RUN_STARTED, et.RUN_COMPLETED]
    assert results(parent)["child"] == {"doubled": 4}


@pytest.mark.django_db
def test_a_childs_failure_fails_the_parents_step(past):
    event = trigger("t.call", n=1, fail=True, wait_until=past)
    parent = run_id_for("t-parent-call", event.payload["run_key"])
    drain()
    [child] = children_of(parent)
    assert status(child.run_id) == "failed"
    run = WorkflowRun.objects.get(run_id=parent)
    assert (run.status, run.failure_reason, run.step) == ("failed", "child_failed", "0")
    # A child is rerun by its parent, never alone (its failure was counted).
    with pytest.raises(RunNotRerunnable, match="child run"):
        rerun_run(child.run_id)


@pytest.mark.django_db
def test_collect_gives_the_parent_a_failure_to_branch_on():
    event = trigger("t.call-collect", n=1)
    parent = run_id_for("t-parent-call-collect", event.payload["run_key"])
    assert status(parent) == "completed"
    got = results(parent)
    assert got["child"]["ok"] is False and got["child"]["reason"] == "step_failed"
    assert got["handled"] == {"handled": "step_failed"}


@pytest.mark.django_db
def test_a_retry_around_a_call_starts_a_fresh_child(past):
    event = trigger("t.call-retry", n=5, wait_until=past)
    parent = run_id_for("t-parent-retry", event.payload["run_key"])
    assert types_of(parent) == [et.RUN_STARTED, et.WAITING_FOR_CHILDREN]
    drain()
    backoff = WorkflowRunPending.objects.get(run_id=parent)
    assert backoff.suspension_type == "retry"
    resume_due_runs(now=backoff.wake_at)
    drain()
    first, second = children_of(parent)
    assert (first.status, second.status) == ("failed", "completed")
    assert first.run_id != second.run_id
    assert (first.parent_group, second.parent_group) == ("0.do.0@0:1", "0.do.0@0:2")
    assert status(parent) == "completed"
    assert results(parent) == {"child": {"doubled": 10}}
    kinds = types_of(parent)
    assert kinds.count(et.RETRY_SCHEDULED) == 1 and kinds.count(et.WAITING_FOR_CHILDREN) == 2
    assert_rebuilds()


@pytest.mark.django_db
def test_a_resumed_segment_starts_no_second_child(past):
    """A parent woken before its child finished waits again, with the same child."""
    from kumiko_workflows import wake_run

    event = trigger("t.call", n=3, wait_until="2999-01-01T00:00:00Z")
    parent = run_id_for("t-parent-call", event.payload["run_key"])
    assert wake_run(parent)
    drain()
    assert [c.status for c in children_of(parent)] == ["waiting"]
    assert types_of(parent)[-1] == et.WAITING_FOR_CHILDREN
    assert WorkflowChildGroup.objects.get(parent_run_id=parent).started == 1


# --- fan_out ---------------------------------------------------------------------------


def most_active(children: list) -> int:
    """The most children running at once, read from their streams' order."""
    events = Event.objects.filter(
        aggregate_type=et.RUN_AGGREGATE_TYPE,
        aggregate_id__in=[c.run_id for c in children],
        type__in=[et.RUN_STARTED, *et.TERMINAL],
    ).order_by("id")
    active = most = 0
    for event in events:
        active += 1 if event.type == et.RUN_STARTED else -1
        most = max(most, active)
    return most


@pytest.mark.django_db
def test_a_fan_out_of_200_runs_at_most_10_at_once_and_keeps_item_order(past):
    event = trigger("t.fan", count=200, wait_until=past)
    parent = run_id_for("t-parent-fan", event.payload["run_key"])
    assert len(children_of(parent)) == 10  # the window, started with the parent's step
    drain()
    children = children_of(parent)
    assert len(children) == 200 and {c.status for c in children} == {"completed"}
    assert most_active(children) == 10
    assert status(parent) == "completed"
    assert results(parent)["lines"] == [{"doubled": 2 * n} for n in range(200)]
    # Woken once, by the last child, not re-run per child.
    assert types_of(parent).count(et.RESUMED) == 1
    group = WorkflowChildGroup.objects.get(parent_run_id=parent)
    assert (group.total, group.started, group.finished, group.failed) == (200, 200, 200, 0)
    assert_rebuilds()


@pytest.mark.django_db
def test_a_failing_child_stops_a_fan_out_and_fails_the_step(past):
    event = trigger("t.fan", count=30, wait_until=past, fail=[3])
    parent = run_id_for("t-parent-fan", event.payload["run_key"])
    drain()
    run = WorkflowRun.objects.get(run_id=parent)
    assert (run.status, run.failure_reason) == ("failed", "child_failed")
    group = WorkflowChildGroup.objects.get(parent_run_id=parent)
    assert group.stopped and group.started < 30  # no child started after the failure
    assert group.finished == group.started


@pytest.mark.django_db
def test_collect_returns_failures_beside_results(past):
    event = trigger("t.fan-collect", count=6, wait_until=past, fail=[1, 4])
    parent = run_id_for("t-parent-fan-collect", event.payload["run_key"])
    drain()
    assert status(parent) == "completed"
    lines = results(parent)["lines"]
    assert [line["ok"] for line in lines] == [True, False, True, True, False, True]
    assert [line["result"] for line in lines if line["ok"]] == [
        {"doubled": 0},
        {"doubled": 4},
        {"doubled": 6},
        {"doubled": 10},
    ]
    assert {line["reason"] for line in lines if not line["ok"]} == {"step_failed"}
    assert_rebuilds()


@pytest.mark.django_db
def test_an_empty_fan_out_gives_an_empty_list():
    event = trigger("t.fan-collect", count=0)
    parent = run_id_for("t-parent-fan-collect", event.payload["run_key"])
    assert status(parent) == "completed" and results(parent)["lines"] == []


def statements_of(count: int) -> list[str]:
    """The statements of the transaction that starts a fan-out of ``count`` queued children."""
    with CaptureQueriesContext(connection) as queries:
        trigger("t.fan-queued", count=count)
    return [query["sql"] for query in queries.captured_queries]


@pytest.mark.django_db
def test_queuing_a_fan_outs_children_costs_the_same_per_child_and_one_notify():
    small, large = statements_of(10), statements_of(40)
    # Per child: its request, run-started, run-queued, its run's row written
    # and updated, its pending row, and the savepoint around its start (two).
    assert (len(large) - len(small)) / 30 <= 8
    # The fan-in row is written with the group, not once per child started.
    group_table = WorkflowChildGroup._meta.db_table
    assert sum(group_table in sql for sql in large) == sum(group_table in sql for sql in small)
    # One NOTIFY wakes the workers for every queued child (PostgreSQL).
    notifies = sum("pg_notify" in sql for sql in large)
    assert notifies == (1 if connection.vendor == "postgresql" else 0)
    drain()
    parents = WorkflowRun.objects.filter(workflow_name="t-parent-fan-queued")
    assert {p.status for p in parents} == {"completed"}
    [parent] = [p for p in parents if len(children_of(p.run_id)) == 40]
    assert results(parent.run_id)["lines"] == [{"doubled": 2 * n} for n in range(40)]
    assert types_of(parent.run_id).count(et.RESUMED) == 1
    assert_rebuilds()


# --- the cancel cascade ----------------------------------------------------------------


def tree(root) -> list[WorkflowRun]:
    found, level = [], [root]
    while level:
        level = [c.run_id for parent in level for c in children_of(parent)]
        found.extend(WorkflowRun.objects.filter(run_id__in=level))
    return found


@pytest.mark.django_db
def test_cancelling_a_parent_cancels_its_children_and_grandchildren():
    event = trigger("t.grand")
    root = run_id_for("t-grand-root", event.payload["run_key"])
    below = tree(root)
    assert len(below) == 3 and {r.status for r in below} == {"waiting"}
    assert cancel_run(root, "the customer left", by="ops")
    assert status(root) == "cancelled"
    for run in tree(root):
        assert run.status == "cancelled"
        cancelled = run_events(run.run_id)[-1]
        assert cancelled.type == et.RUN_CANCELLED and "was cancelled" in cancelled.payload["reason"]
    assert not WorkflowRunPending.objects.filter(run_id__in=[r.run_id for r in below]).exists()
    # The same transaction: the cancels are consecutive events.
    ids = sorted(
        run_events(r.run_id)[-1].id for r in [*below, WorkflowRun.objects.get(run_id=root)]
    )
    assert ids[-1] - ids[0] == len(ids) - 1
    assert drain() == 0  # nothing woken, nothing started
    assert_rebuilds()


@pytest.mark.django_db
def test_on_cancel_abandon_keeps_the_children_running():
    event = trigger("t.grand-abandon")
    root = run_id_for("t-grand-root-abandon", event.payload["run_key"])
    assert cancel_run(root, "stop")
    assert status(root) == "cancelled"
    assert {r.status for r in tree(root)} == {"waiting"}


@pytest.mark.django_db
def test_a_cancelled_fan_out_starts_no_further_child(past):
    event = trigger("t.fan", count=40, wait_until=past)
    parent = run_id_for("t-parent-fan", event.payload["run_key"])
    assert cancel_run(parent, "enough")
    drain()
    children = children_of(parent)
    assert len(children) == 10 and {c.status for c in children} == {"cancelled"}
    assert WorkflowChildGroup.objects.get(parent_run_id=parent).closed


# --- compensation ----------------------------------------------------------------------


def undone(run_id) -> list[str]:
    return [
        e.payload["step"]
        for e in Event.objects.filter(type="t.undone").order_by("id")
        if e.payload["run"] == str(run_id)
    ]


@pytest.mark.django_db
def test_compensations_run_in_reverse_order_once(past):
    event = trigger("t.saga", wait_until=past)
    run = run_id_for("t-saga", event.payload["run_key"])
    drain()
    assert undone(run) == ["c", "b", "a"]
    kinds = types_of(run)
    assert kinds.count(et.COMPENSATION_SCHEDULED) == 1 and kinds.count(et.STEP_COMPENSATED) == 3
    failed = run_events(run)[-1]
    assert failed.type == et.RUN_FAILED
    assert failed.payload["reason"] == "step_failed"
    assert failed.payload["compensated"] == ["3", "2", "0"]
    # The finished steps kept their writes for the compensations to undo.
    done = Event.objects.filter(type="t.done").order_by("id")
    assert [e.payload["step"] for e in done if e.payload["run"] == str(run)] == ["a", "b", "c"]
    with pytest.raises(RunNotRerunnable, match="compensated"):
        rerun_run(run)
    assert_rebuilds()


@pytest.mark.django_db
def test_a_compensation_that_keeps_failing_ends_with_its_own_reason(past):
    event = trigger("t.saga", wait_until=past, undo_fails="b")
    run = run_id_for("t-saga", event.payload["run_key"])
    drain()  # the retry backoff of the compensation: wake it when due
    for row in WorkflowRunPending.objects.filter(run_id=run):
        resume_due_runs(now=row.wake_at)
    drain()
    failed = run_events(run)[-1]
    assert failed.type == et.RUN_FAILED
    assert failed.payload["reason"] == "compensation_failed"
    assert failed.payload["compensated"] == ["3"]
    assert failed.payload["not_compensated"] == ["2", "0"]
    assert failed.payload["original_reason"] == "step_failed"
    assert undone(run) == ["c"]
    assert types_of(run).count(et.COMPENSATION_SCHEDULED) == 2  # tried twice (compensate_times)


@pytest.mark.django_db
def test_cancel_with_compensate_undoes_the_finished_steps():
    event = trigger("t.saga", wait_until="2999-01-01T00:00:00Z")
    run = run_id_for("t-saga", event.payload["run_key"])
    assert status(run) == "waiting"
    assert cancel_run(run, "changed my mind", by="ops", compensate=True)
    assert not cancel_run(run, "twice")  # compensating: not cancelled again
    drain()
    assert undone(run) == ["a"]
    last = run_events(run)[-1]
    assert last.type == et.RUN_CANCELLED
    assert (last.payload["reason"], last.payload["compensated"]) == ("changed my mind", ["0"])
    assert status(run) == "cancelled"


# --- definitions --------------------------------------------------------------------------


def _noop(ctx):
    return None


def test_new_kinds_have_fingerprints_and_checks():
    def build(*body, **kwargs):
        return define_workflow(
            name="t-compose-def",
            trigger=on_event("t.x"),
            steps=list(body),
            register=False,
            **kwargs,
        )

    one = build(steps.fan_out("f", workflow="t-child-double", items=[1], max_concurrency=2))
    two = build(steps.fan_out("f", workflow="t-child-double", items=[1], max_concurrency=3))
    assert one.fingerprint != two.fingerprint
    # A child's wait may stand in a retry body; a timed wait still may not.
    build(steps.retry(times=2, do=[steps.call_workflow("c", workflow="t-child-double")]))
    with pytest.raises(WorkflowDefinitionError, match="E003"):
        build(steps.retry(times=2, do=[steps.wait("PT1S")]))
    with pytest.raises(WorkflowDefinitionError, match="E130"):
        build(steps.compute("a", _noop), returns="nope")
    with pytest.raises(WorkflowDefinitionError, match="on_child_failure"):
        steps.fan_out("f", workflow="w", items=[1], on_child_failure="ignore")
    with pytest.raises(WorkflowDefinitionError, match="max_concurrency"):
        steps.fan_out("f", workflow="w", items=[1], max_concurrency=0)
    with pytest.raises(WorkflowDefinitionError, match="compensate"):
        steps.compute("a", _noop, compensate="undo")
    # A compute without compensate keeps the fingerprint it always had.
    plain = build(steps.compute("a", _noop))
    assert "compensate" not in plain.steps[0].describe()
    assert define_workflow(
        name="t-compose-child", trigger=on_call(), steps=[steps.compute("a", _noop)], register=False
    ).trigger.describe() == {"kind": "call"}


@pytest.mark.django_db
def test_a_call_of_an_unknown_workflow_fails_the_step_clearly():
    missing = define_workflow(
        name="t-compose-missing",
        trigger=on_event("t.compose-missing"),
        idempotency_key=cw.run_key,
        steps=[steps.call_workflow("c", workflow="t-no-such-workflow")],
        register=False,
    )
    from kumiko_workflows.workflow.definition import registry

    with registry.override(missing):
        event = trigger("t.compose-missing")
    run = WorkflowRun.objects.get(run_id=run_id_for("t-compose-missing", event.payload["run_key"]))
    assert (run.status, run.failure_reason) == ("failed", "invalid_step_argument")
    assert "no workflow named 't-no-such-workflow'" in run.last_error


# --- repeat ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_repeat_with_a_wait_inside_resumes_at_the_right_pass():
    from kumiko_workflows.testing import VirtualClock

    with VirtualClock() as clock:
        event = trigger("t.remind", user="ada")
        run = run_id_for("t-reminders", event.payload["run_key"])
        assert WorkflowRunPending.objects.get(run_id=run).step == "0.do.1"
        clock.advance("P3D")  # pass 1 times out: pass 2 reminds again and waits
        state = WorkflowRunPending.objects.get(run_id=run).state
        assert state["attempts"] == {"0": 2}
        assert state["results"]["remind#1"] == {"pass": 1}
        assert state["results"]["reminders"] == 1
        trigger("t.verified", user="ada")  # ends pass 2's wait
        clock.run_until_idle()
    assert status(run) == "completed"
    got = results(run)
    assert got["outcome"] == {"passes": 2, "verified": True}
    assert (got["remind#1"], got["remind#2"]) == ({"pass": 1}, {"pass": 2})
    awaited = run_events(run)[-1].payload["state"]["awaited"]
    assert awaited["verified#1"] is None and awaited["verified#2"] == awaited["verified"]


@pytest.mark.django_db
def test_a_repeat_stops_after_max_times():
    from kumiko_workflows.testing import VirtualClock

    with VirtualClock() as clock:
        event = trigger("t.remind", user="bob")
        run = run_id_for("t-reminders", event.payload["run_key"])
        clock.run_until_idle()
    assert status(run) == "completed"
    got = results(run)
    assert got["outcome"] == {"passes": 3, "verified": False}
    assert [got[f"remind#{n}"]["pass"] for n in (1, 2, 3)] == [1, 2, 3]
    assert types_of(run).count(et.WAITING_FOR_EVENT) == 3


# --- the admin's run page: parent and children, a fan-out's progress ------------------


@pytest.mark.django_db
def test_the_run_page_links_parent_and_children_and_shows_the_progress(
    client, django_user_model, past
):
    from django.urls import reverse

    client.force_login(django_user_model.objects.create_superuser("root", "r@example.com", "pw"))
    event = trigger("t.fan-collect", count=12, wait_until=past, fail=[5])
    parent = run_id_for("t-parent-fan-collect", event.payload["run_key"])
    # Eight children finish (one of them failing), four still wait.
    first_eight = [
        c
        for c in children_of(parent)
        if Event.objects.get(id=c.trigger_event_id).payload["index"] < 8
    ]
    for child in first_eight:
        from kumiko_workflows.engine.resume import resume_row
        from kumiko_workflows.store import db

        with db.atomic():
            locked = WorkflowRunPending.objects.select_for_update()
            row = locked.get(tenant_id=child.tenant_id, run_id=child.run_id)
            row.delete()
            resume_row(row, Event.objects.get(id=row.trigger_event_id), row.wake_at)

    page = client.get(reverse("admin:kumiko_workflows_workflowrun_change", args=[parent]))
    text = page.content.decode()
    assert "8 of 12 children finished, 1 failed" in text
    child = children_of(parent)[0]
    assert f'title="{child.run_id}"' in text
    assert f"?parent_run_id={parent}" in text
    listed = client.get(
        reverse("admin:kumiko_workflows_workflowrun_changelist") + f"?parent_run_id={parent}"
    )
    assert listed.status_code == 200 and str(child.run_id) in listed.content.decode()

    page = client.get(reverse("admin:kumiko_workflows_workflowrun_change", args=[child.run_id]))
    assert "Parent run" in page.content.decode() and str(parent) in page.content.decode()


@pytest.mark.django_db
def test_a_rerun_of_a_parent_starts_fresh_children(past):
    event = trigger("t.call", n=1, fail=True, wait_until=past)
    parent = run_id_for("t-parent-call", event.payload["run_key"])
    drain()
    assert status(parent) == "failed"
    assert rerun_run(parent)
    drain()
    first, second = children_of(parent)
    assert first.run_id != second.run_id
    assert second.parent_group == "0@rerun:1"
    assert status(parent) == "failed" and second.status == "failed"  # it fails the same way


@pytest.mark.django_db
def test_a_call_that_times_out_fails_the_step_and_cancels_the_child():
    from kumiko_workflows.testing import VirtualClock

    with VirtualClock() as clock:
        event = trigger("t.call-timeout")
        parent = run_id_for("t-parent-timeout", event.payload["run_key"])
        [child] = children_of(parent)
        clock.advance("PT1H")
    run = WorkflowRun.objects.get(run_id=parent)
    assert (run.status, run.failure_reason) == ("failed", "child_timeout")
    child.refresh_from_db()
    assert child.status == "cancelled"
    assert "timed out" in run_events(child.run_id)[-1].payload["reason"]


@pytest.mark.django_db
def test_a_purged_parent_takes_its_childrens_requests_and_fan_in_and_a_child_waits_for_it(past):
    from datetime import timedelta

    from django.utils import timezone

    from kumiko_workflows.operations.purge import purge_runs

    event = trigger("t.fan-collect", count=3, wait_until=past)
    parent = run_id_for("t-parent-fan-collect", event.payload["run_key"])
    drain()
    children = [c.run_id for c in children_of(parent)]
    later = timezone.now() + timedelta(days=1)
    # A child alone is kept while its parent stays.
    report = purge_runs("P0D", now=later, run_ids=children[:1])
    assert report.runs == 0 and WorkflowRun.objects.filter(run_id=children[0]).exists()
    purge_runs("P0D", now=later, run_ids=[parent, *children])
    assert not WorkflowRun.objects.filter(run_id__in=[parent, *children]).exists()
    assert not WorkflowChildGroup.objects.filter(parent_run_id=parent).exists()
    assert not Event.objects.filter(
        aggregate_type=et.CALL_AGGREGATE_TYPE, metadata__parent_run_id=str(parent)
    ).exists()
    assert_rebuilds()


def _noted(ctx):
    return "noted"


@pytest.mark.django_db
def test_a_parent_moved_to_another_version_waits_for_the_same_child(past):
    from kumiko_workflows.engine.version_moves import migrate_workflow_runs
    from kumiko_workflows.workflow.registry import registry

    def version(number, before=(), **kwargs):
        return define_workflow(
            name="t-compose-moving",
            trigger=on_event("t.compose-moving"),
            idempotency_key=cw.run_key,
            version=number,
            steps=[
                *before,
                steps.call_workflow("child", workflow=cw.child_double, input=cw.call_input),
            ],
            register=False,
            **kwargs,
        )

    one = version(1)
    two = version(2, [steps.compute("note", _noted)], migrates_from={1: {"0": "1"}})
    with registry.override(one):
        event = trigger("t.compose-moving", n=6, wait_until=past)
    parent = run_id_for("t-compose-moving", event.payload["run_key"])
    with registry.override(one, two):
        migrate_workflow_runs("t-compose-moving", 1, 2)
        drain()
    [child] = children_of(parent)  # no second child was started at step 1
    assert status(parent) == "completed"
    assert results(parent)["child"] == {"doubled": 12}
