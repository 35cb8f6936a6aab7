"""Batches commit several runs at once, but never run a finished step twice without a crash.

A failing step's writes roll back to a savepoint taken before its first
statement, so the run is recorded failed alone; a slow step holds no row it
has not reached when rows are claimed one at a time (``BATCH_TOGETHER``
off), and a run that commits alone holds none either way;
``commit="per_run"`` gives a workflow a commit of its own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest

from kumiko_workflows import define_workflow, on_event, resume_due_runs, run_id_for, steps
from kumiko_workflows import event_types as et
from kumiko_workflows.exceptions import WorkflowDefinitionError
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.workflow.registry import registry
from tests.support import subprocess_env, trigger, types_of
from tests.testapp import workflows as w

LINES: Path | None = None
_SECOND = timedelta(seconds=1)


def write_a_line(ctx):
    """A side effect outside the database: one line per execution of the step."""
    number = ctx.event.payload["number"]
    assert LINES is not None
    with LINES.open("a") as file:
        file.write(f"{number}\n")
    if number == 10:
        raise RuntimeError("run 10 fails")
    return number


def _line_workflow(commit: str = "batch"):
    return define_workflow(
        name="t-lines",
        trigger=on_event("t.lines"),
        idempotency_key=w.run_key,
        steps=[steps.wait("PT0S"), steps.compute("line", write_a_line)],
        commit=commit,
        register=False,
    )


@pytest.mark.parametrize("batch_size", [1, 7, 50])
@pytest.mark.django_db
def test_a_failing_run_in_a_batch_does_not_run_the_others_steps_again(
    tmp_path, settings, batch_size
):
    global LINES
    LINES = tmp_path / "lines.txt"
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_SIZE": batch_size}
    with registry.override(_line_workflow()):
        events = [trigger("t.lines", number=n) for n in range(1, 21)]
        report = resume_due_runs(now=events[-1].created_at + _SECOND)

    assert (report.resumed, report.completed, report.failed) == (20, 19, 1)
    # Every run's step ran once: 20 lines, the failing run's included, no repeats.
    assert sorted(map(int, LINES.read_text().split())) == list(range(1, 21))
    assert WorkflowRun.objects.filter(status="completed").count() == 19


@pytest.mark.django_db
def test_commit_per_run_is_a_workflow_option_and_a_bad_one_is_refused(tmp_path):
    global LINES
    LINES = tmp_path / "lines.txt"
    with registry.override(_line_workflow("per_run")):
        events = [trigger("t.lines", number=n) for n in (1, 2, 3)]
        report = resume_due_runs(now=events[-1].created_at + _SECOND)
    assert (report.resumed, report.completed) == (3, 3)
    with pytest.raises(WorkflowDefinitionError, match="commit must be one of batch, per_run"):
        _line_workflow("sometimes")


@pytest.mark.django_db
def test_steps_that_never_query_cost_no_savepoint(tmp_path):
    """The savepoint that protects a step's writes is taken only before its first statement."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    global LINES
    LINES = tmp_path / "lines.txt"
    with registry.override(_line_workflow()):
        events = [trigger("t.lines", number=n) for n in (1, 2, 3)]
        with CaptureQueriesContext(connection) as queries:
            report = resume_due_runs(now=events[-1].created_at + _SECOND)
    assert (report.resumed, report.completed) == (3, 3)
    savepoints = [q["sql"] for q in queries if q["sql"].startswith("SAVEPOINT")]
    # One: the batch's own atomic block, a savepoint only because the test's
    # transaction is around it. None per run.
    assert len(savepoints) == 1, savepoints


def _fail_run_status_update_of(run_id):
    """An execute wrapper: the database refuses the status UPDATE of one run (a fault), alone
    or among a batch's (one statement for many rows, its columns as arrays, bound as lists or
    as an array's text)."""
    from django.db import OperationalError

    names = {str(run_id), run_id.hex}

    def names_it(param):
        if isinstance(param, str):
            return any(name in param for name in names)
        values = param if isinstance(param, list) else [param]
        return bool(names & {str(value) for value in values})

    def wrapper(execute, sql, params, many, context):
        rows = params if many else [params]
        if 'UPDATE "kumiko_workflows_workflowrun"' in sql and any(
            names_it(param) for row in rows for param in row
        ):
            raise OperationalError("injected: the database refused the statement")
        return execute(sql, params, many, context)

    return wrapper


@pytest.mark.django_db
def test_an_error_in_the_engines_own_writes_rolls_back_that_run_and_counts_it(tmp_path, settings):
    """With no site code reacting to run events, a run's writes have no savepoint of their
    own: an error in them rolls back the transaction, the run is counted as an error with its
    stream untouched, and at a commit per run no other run's step runs twice."""
    from django.db import connection

    global LINES
    LINES = tmp_path / "lines.txt"
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_SIZE": 1}
    with registry.override(_line_workflow()):
        events = [trigger("t.lines", number=n) for n in (1, 2, 3)]
        broken = run_id_for("t-lines", events[1].payload["run_key"])
        with connection.execute_wrapper(_fail_run_status_update_of(broken)):
            report = resume_due_runs(now=events[-1].created_at + _SECOND)

    assert (report.completed, report.errors, report.failed) == (2, 1, 0), report
    assert types_of(broken) == [et.RUN_STARTED, et.WAITING]
    pending = WorkflowRunPending.objects.get(run_id=broken)
    assert pending.resume_errors == 1
    # Runs 1 and 3 wrote once each; the broken run's step ran in its rolled-back attempt.
    assert sorted(map(int, LINES.read_text().split())) == [1, 2, 3]
    with registry.override(_line_workflow()):
        again = resume_due_runs(now=events[-1].created_at + 2 * _SECOND)
    assert (again.completed, again.errors) == (1, 0)
    assert types_of(broken)[-1] == et.RUN_COMPLETED


HOLDER = textwrap.dedent(
    """
    import django
    django.setup()
    from kumiko_workflows import resume_due_runs
    from kumiko_workflows.workflow.registry import registry
    from tests.testapp.workflows import blocking_alone
    with registry.override(blocking_alone):
        print(resume_due_runs(), flush=True)
    """
)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("together", "slow_type"),
    [(False, "t.blocking"), (True, "t.blocking-alone")],
    ids=["row_by_row", "together_committing_alone"],
)
def test_a_slow_step_holds_no_row_it_has_not_reached(tmp_path, past, together, slow_type):
    """Row by row, each row is claimed when its turn comes; with the batch claimed together, a
    run that commits alone is claimed on its own. Either way the slow run, due first, holds
    none of the twenty quick runs behind it."""
    with registry.override(w.blocking_alone):  # in the worker too (HOLDER)
        slow = trigger(slow_type, sync_dir=str(tmp_path), **{"for": past})
        quick = [trigger("t.wait", **{"for": past}) for _ in range(20)]
        worker = subprocess.Popen(
            [sys.executable, "-c", HOLDER],
            env=subprocess_env(KUMIKO_TEST_BATCH_TOGETHER="1" if together else "0"),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            running = tmp_path / f"running-{slow.payload['run_key']}"
            deadline = time.monotonic() + 60
            while not running.exists():  # the step says it runs (a file), not a timer
                assert time.monotonic() < deadline, "the slow step never started"
                assert worker.poll() is None, "the worker exited early"
                time.sleep(0.01)

            # While the slow step runs, another worker takes every quick run.
            report = resume_due_runs()
        finally:
            (tmp_path / "release").touch()
            worker.communicate(timeout=60)

    assert (report.resumed, report.completed) == (20, 20)
    for event in quick:
        run_id = run_id_for("t-wait", event.payload["run_key"])
        assert types_of(run_id)[-1] == et.RUN_COMPLETED
    slow_run = run_id_for(slow_type.replace(".", "-"), slow.payload["run_key"])
    assert types_of(slow_run)[-1] == et.RUN_COMPLETED
    assert Event.objects.filter(aggregate_id=slow_run, type=et.RESUMED).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_row_claimed_by_the_run_before_it_is_resumed_even_when_the_pass_stops(past, settings):
    """On PostgreSQL, row by row, a run's last statement also claims the batch's next row.
    Asked to stop once that row is held, the pass still resumes it: no row is taken and
    dropped."""
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_TOGETHER": False}
    events = [trigger("t.wait", **{"for": past}) for _ in range(5)]
    runs = [run_id_for("t-wait", event.payload["run_key"]) for event in events]

    def should_stop():
        # Once a run has completed: after the first run's last statement (which
        # claimed the next row while none had), before the second run.
        return WorkflowRun.objects.filter(run_id__in=runs, status="completed").exists()

    report = resume_due_runs(should_stop=should_stop)

    assert (report.resumed, report.completed) == (2, 2)
    assert [types_of(run)[-1] for run in runs].count(et.RUN_COMPLETED) == 2
    assert WorkflowRunPending.objects.filter(run_id__in=runs).count() == 3
    again = resume_due_runs()
    assert (again.resumed, again.completed) == (3, 3)


SEEN_PENDING: list[bool] = []


def _fails(ctx):
    raise RuntimeError("the last step fails")


def _undo_second(ctx):
    pass


def _undo_first(ctx):
    # The run's second compensation: its first was written already.
    SEEN_PENDING.append(
        WorkflowRunPending.objects.filter(run_id=ctx.event.payload["next"]).exists()
    )


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_compensating_run_claims_no_row_before_its_last_undo_has_run(now, settings):
    """On PostgreSQL, row by row, a run's last statement may claim the batch's next row; a
    compensation's first event is written before its other undo code runs, so
    that row is claimed after the run, not with that event (it is not held
    while the undo code runs)."""
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_TOGETHER": False}
    saga = define_workflow(
        name="t-undo-in-batch",
        trigger=on_event("t.undo-in-batch"),
        idempotency_key=w.run_key,
        steps=[
            steps.compute("first", lambda ctx: 1, compensate=_undo_first),
            steps.compute("second", lambda ctx: 2, compensate=_undo_second),
            steps.compute("fails", _fails),
        ],
        register=False,
    )
    SEEN_PENDING.clear()
    with registry.override(saga):
        # Due after the compensation, so claimed behind it in the same batch.
        quick = trigger("t.wait", **{"for": (now + _SECOND).isoformat()})
        next_run = run_id_for("t-wait", quick.payload["run_key"])
        failing = trigger("t.undo-in-batch", next=str(next_run))
        run = run_id_for("t-undo-in-batch", failing.payload["run_key"])
        assert types_of(run)[-1] == et.COMPENSATION_SCHEDULED
        report = resume_due_runs(now=now + 3 * _SECOND)
    assert SEEN_PENDING == [True]
    assert (report.resumed, report.completed, report.failed) == (2, 1, 1)
    assert types_of(next_run)[-1] == et.RUN_COMPLETED
