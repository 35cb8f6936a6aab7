"""The admin's run page is one snapshot: heading, explanation and buttons tell one state.

The page reads the run once per request: a run that moves on while the page
is built (a worker completes it, someone cancels it) is shown as it was
read, never "(completed)" above "Due for 0 s" with Wake and Cancel offered;
and "Rerun: not possible" never stands beside a Rerun button.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from kumiko_workflows import cancel_run, define_workflow, on_event, resume_due_runs, steps, wake_run
from kumiko_workflows.models import WorkflowRun
from kumiko_workflows.workflow.registry import registry
from tests.integration.test_admin import change_url, root, start  # noqa: F401 (root: a fixture)
from tests.testapp import workflows as w

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("root")]

TABLE = WorkflowRun._meta.db_table
BUTTONS = ("wake_now", "rerun_failed", "cancel_runs")


def shown(page: str, run: WorkflowRun) -> dict:
    """What the page says: the statuses beside the run's id, the box, its headline, the buttons."""
    title = re.search(r'id="kw-why">\s*<h2>(.*?)</h2>', page)
    headline = re.search(r'<p class="kw-headline">(.*?)</p>', page, re.S)
    rerun = re.search(r"Rerun</th><td>(.*?)</td>", page)
    return {
        "statuses": set(re.findall(rf"{run.run_id} \((\w+)\)", page)),
        "title": title.group(1) if title else None,
        "headline": headline.group(1) if headline else None,
        "buttons": {name for name in BUTTONS if f'id="kw-{name}"' in page},
        "rerun": rerun.group(1) if rerun else None,
    }


def assert_consistent(seen: dict) -> None:
    """The rules every run page keeps, whatever the state."""
    (status,) = seen["statuses"]  # one state in the heading
    title = {"waiting": "Why is this run waiting?", "failed": "Why did this run fail?"}
    assert seen["title"] == title.get(status, "Where is this run?")
    if status != "waiting":
        assert not seen["headline"].startswith(("Due", "Waiting"))
        assert "wake_now" not in seen["buttons"]
    if seen["headline"].startswith("Due"):
        assert "wake_now" not in seen["buttons"]  # the next pass resumes it anyway
    if status in ("completed", "failed", "cancelled"):
        assert "cancel_runs" not in seen["buttons"]
    rerun_offered = "rerun_failed" in seen["buttons"]
    assert rerun_offered == (seen["rerun"] or "").startswith("possible")


def waiting(future):
    return start("t.wait", **{"for": future})


def due(future):
    run = start("t.wait", **{"for": future})
    wake_run(run.run_id, by="test")  # due now: "Due for 0 s"
    return run


def completed(future):
    run = start("t.wait", **{"for": "PT0S"})
    resume_due_runs(now=timezone.now() + timedelta(seconds=1))
    return run


def failed(future):
    return start("t.fail")


def cancelled(future):
    run = start("t.wait", **{"for": future})
    cancel_run(run.run_id, reason="not needed", by="test")
    return run


CHANGED_FAIL = define_workflow(
    name="t-fail",
    trigger=on_event("t.fail"),
    idempotency_key=w.run_key,
    steps=[steps.compute("boom", w.record("renamed"))],
    register=False,
)

STATES = {
    "waiting": (waiting, False, "waiting", "Waiting (wait) until", {"wake_now", "cancel_runs"}),
    "due": (due, False, "waiting", "Due for", {"cancel_runs"}),
    "completed": (completed, False, "completed", "Completed: every step ran.", set()),
    "failed, rerunnable": (failed, False, "failed", "Failed.", {"rerun_failed"}),
    "failed, definition changed": (failed, True, "failed", "Failed.", set()),
    "cancelled": (cancelled, False, "cancelled", "Cancelled: it will not run again.", set()),
}


@pytest.mark.parametrize("make, changed, status, headline, buttons", STATES.values(), ids=STATES)
def test_each_state_reads_the_run_once_and_tells_one_story(
    client, make, changed, status, headline, buttons
):
    run = make((timezone.now() + timedelta(hours=1)).isoformat())
    with registry.override(CHANGED_FAIL) if changed else registry.override():
        with CaptureQueriesContext(connection) as queries:
            page = client.get(change_url(run)).content.decode()

    reads = [q["sql"] for q in queries.captured_queries if f'FROM "{TABLE}"' in q["sql"]]
    assert len(reads) == 1, reads
    seen = shown(page, run)
    assert seen["statuses"] == {status}
    assert seen["headline"].startswith(headline)
    assert seen["buttons"] == buttons
    assert_consistent(seen)


def test_a_run_that_moves_on_between_the_reads_is_shown_as_read(client):
    """A real write (a cancel) right after the page's first read of the run: no mixed page."""
    run = start("t.wait", **{"for": (timezone.now() + timedelta(hours=1)).isoformat()})
    state = {"read": False, "written": False}

    def cancel_after_the_first_read(execute, sql, params, many, context):
        if state["read"] and not state["written"]:
            state["written"] = True
            cancel_run(run.run_id, reason="moved between the reads", by="test")
        if f'FROM "{TABLE}"' in sql:
            state["read"] = True
        return execute(sql, params, many, context)

    with connection.execute_wrapper(cancel_after_the_first_read):
        page = client.get(change_url(run)).content.decode()

    assert state["written"]
    assert WorkflowRun.objects.get(pk=run.pk).status == "cancelled"
    seen = shown(page, run)
    assert seen["statuses"] == {"waiting"}  # as read, in the heading too
    assert seen["headline"].startswith("It moved on while this page was read")
    assert seen["buttons"] == set()  # reload first
    assert_consistent(seen)
