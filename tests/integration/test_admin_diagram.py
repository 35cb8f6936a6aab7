"""The workflow as a diagram and a run's path through it, read from real runs' events."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from kumiko_workflows import resume_due_runs, run_id_for, steps
from kumiko_workflows.models import WorkflowRun
from kumiko_workflows.operations import diagram
from kumiko_workflows.workflow.definition import registry
from tests.support import run_events, trigger

pytestmark = pytest.mark.django_db

NAMES = {"t.wait": "t-wait", "t.fail": "t-fail", "t.retry": "t-retry", "t.branch": "t-branch"}


def start(type_, **payload):
    event = trigger(type_, **payload)
    return WorkflowRun.objects.get(run_id=run_id_for(NAMES[type_], event.payload["run_key"]))


def picture(run, now=None):
    run.refresh_from_db()
    workflow = registry.get(run.workflow_name, run.workflow_version)
    nodes, path = diagram.run_nodes(workflow, run, run_events(run.run_id), now or timezone.now())
    return {node.path: node for top in nodes for node in top.walk()}, nodes, path


def test_a_definition_is_a_tree_of_shapes_with_its_arms():
    nodes = diagram.workflow_nodes(registry.get("t-branch"))
    assert [(n.path, n.kind, n.title) for n in nodes] == [
        ("0", "compute", "first"),
        ("1", "branch", "branch"),
        ("2", "compute", "last"),
    ]
    branch = nodes[1]
    assert branch.layout == "alternatives"
    assert [arm.label for arm in branch.arms] == [
        "if go_then(ctx) is true",
        "otherwise",
    ]
    assert [n.path for n in branch.arms[0].nodes] == ["1.then.0", "1.then.1", "1.then.2"]
    assert branch.arms[0].nodes[1].detail == "for or until for(ctx)"
    retry = diagram.workflow_nodes(registry.get("t-retry"))[0]
    assert retry.layout == "body"
    assert retry.detail == "up to 3 attempts, linear backoff from PT10S; gives up on FatalError"


def test_a_waiting_run_shows_its_place_and_the_steps_before_and_after():
    run = start("t.branch", go_then=True, **{"for": "PT1H"})
    by_path, _, path = picture(run)
    assert by_path["0"].state == "done"
    assert by_path["1"].state == "current" and by_path["1"].here
    assert by_path["1.then.0"].state == "done"
    assert by_path["1.then.1"].state == "current"
    assert by_path["1.then.1"].duration.endswith("so far")
    assert by_path["1.then.2"].state == "pending"
    assert by_path["1.else.0"].state == "skipped"
    assert by_path["2"].state == "pending"
    assert by_path["0"].duration.startswith("ran in a segment of ")
    assert set(path.results) == {"first", "then_before"}


def test_a_completed_run_through_the_else_arm_marks_the_then_arm_not_taken():
    run = start("t.branch", go_then=False)
    by_path, _, _ = picture(run)
    assert run.status == "completed"
    assert by_path["1.else.0"].state == "done"
    assert {by_path[p].state for p in ("1.then.0", "1.then.1", "1.then.2")} == {"skipped"}
    assert by_path["2"].state == "done"


def test_a_failed_run_marks_the_failed_step_and_what_was_never_run():
    run = start("t.fail")
    by_path, _, _ = picture(run)
    assert by_path["0"].state == "failed" and by_path["0"].here


def test_a_retried_run_counts_its_attempts_and_says_how_it_ended():
    run = start("t.retry", fail_attempts=1)
    by_path, _, _ = picture(run)
    assert by_path["0"].state == "current"
    assert by_path["0"].outcome == "attempt 1 of 3 failed; attempt 2 next"
    resume_due_runs(now=timezone.now() + timedelta(minutes=5))
    by_path, _, path = picture(run)
    assert run.status == "completed"
    assert by_path["0"].state == "done"
    assert by_path["0"].outcome == "succeeded on attempt 2 of 3"
    assert by_path["0"].duration
    rows = diagram.result_rows(registry.get("t-retry"), path)
    assert [row.name for row in rows] == ["gate", "after"]
    assert rows[0].value.text == "2" and rows[0].step == "step 0.do.0 (compute 'gate')"
    after = dict(rows[1].value.pairs)
    assert after["step"].text == "after"


def test_a_wait_that_ended_says_how_long_it_took():
    run = start("t.wait", **{"for": "PT0S"})
    resume_due_runs(now=timezone.now() + timedelta(seconds=1))
    by_path, _, _ = picture(run)
    assert run.status == "completed"
    assert by_path["1"].state == "done" and by_path["1"].duration


def test_a_kind_without_a_shape_is_drawn_from_its_label_or_its_own_diagram():
    class Plain(steps.Compute):
        kind = "plain_kind"

    class Described(steps.Compute):
        kind = "described_kind"

        def diagram(self):
            return {"glyph": "⚑", "title": "described", "detail": "its own words"}

    plain = diagram.shape_of(Plain("x", len))
    assert plain.title(Plain("x", len)) == "compute 'x'" and plain.layout == "sequence"
    described = diagram.shape_of(Described("y", len))
    assert described.glyph == "⚑" and described.detail(Described("y", len)) == "its own words"


def test_readable_values_are_nested_pairs_and_items_never_raw_json_on_top():
    value = diagram.readable({"b": [1, 2], "a": {"deep": {"deeper": 1}}, "c": None})
    assert value.kind == "pairs"
    pairs = dict(value.pairs)
    assert [key for key, _ in value.pairs] == ["a", "b", "c"]
    assert pairs["b"].kind == "items" and [i.text for i in pairs["b"].items] == ["1", "2"]
    assert pairs["a"].pairs[0][1].kind == "json"
    assert pairs["c"].kind == "empty"
    many = diagram.readable(list(range(30)))
    assert len(many.items) == diagram.READABLE_ITEMS and many.more == 18
