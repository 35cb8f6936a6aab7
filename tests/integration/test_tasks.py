"""Django's Tasks framework on this app (``kumiko_workflows.tasks``), through its public API.

In the framework's own style (``TestCase`` with ``override_settings(TASKS=...)``),
on Django 5.2 with the ``django-tasks`` backport and on Django 6.x (CI's
second run). A worker pass is ``resume_due_runs`` with an instant, never a
sleep; the crash cases kill real processes (PostgreSQL).
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import transaction
from django.test import TestCase, override_settings
from django.utils import timezone

from kumiko_workflows import event_types as et
from kumiko_workflows import resume_due_runs
from kumiko_workflows.models import Event, TaskAttempt, WorkflowRun
from kumiko_workflows.tasks import WorkflowTaskBackend, compat, periodic
from kumiko_workflows.workflow.registry import registry
from tests.support import run_manage, run_python
from tests.testapp import tasks

BACKEND = "kumiko_workflows.tasks.WorkflowTaskBackend"
Status = compat.TaskResultStatus


def tasks_setting(**options) -> dict:
    return {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "emails"], "OPTIONS": options}}


def drain(now=None):
    """One worker pass at ``now`` (default: the current time)."""
    return resume_due_runs(now=now or timezone.now())


@override_settings(TASKS=tasks_setting())
class EnqueueAndResultTests(TestCase):
    def test_enqueue_returns_a_ready_result_that_a_worker_pass_runs(self):
        result = tasks.add.enqueue(1, b=2)
        self.assertEqual(result.status, Status.READY)
        self.assertIsNotNone(result.enqueued_at)
        self.assertEqual((result.args, result.kwargs), ([1], {"b": 2}))
        self.assertEqual(result.backend, "default")
        self.assertEqual(tasks.add.get_result(result.id).status, Status.READY)
        with self.assertRaisesMessage(ValueError, "Task has not finished yet"):
            _ = result.return_value

        report = drain()

        self.assertEqual(report.completed, 1)
        result.refresh()
        self.assertEqual(result.status, Status.SUCCESSFUL)
        self.assertEqual(result.return_value, 3)
        self.assertEqual(result.attempts, 1)
        self.assertEqual(len(result.worker_ids), 1)
        self.assertEqual(result.errors, [])
        self.assertLessEqual(result.enqueued_at, result.started_at)
        self.assertEqual(result.started_at, result.last_attempted_at)
        self.assertLessEqual(result.started_at, result.finished_at)
        self.assertTrue(result.is_finished)

    def test_the_task_is_a_run_of_its_queues_workflow(self):
        result = tasks.send_email.enqueue("a@example.com")
        drain()
        run = WorkflowRun.objects.get(run_id=result.id)
        self.assertEqual(run.workflow_name, "task:emails")
        self.assertEqual(run.status, "completed")
        self.assertEqual(run.search_key, "tests.testapp.tasks.send_email")

    async def test_aenqueue_and_aget_result(self):
        result = await tasks.add.aenqueue(2, 3)
        self.assertEqual(result.status, Status.READY)
        fetched = await tasks.add.aget_result(result.id)
        self.assertEqual(fetched.id, result.id)
        self.assertEqual(fetched.args, [2, 3])

    def test_an_async_task_runs_in_the_worker(self):
        result = tasks.async_add.enqueue(4, 5)
        drain()
        self.assertEqual(tasks.async_add.get_result(result.id).return_value, 9)

    def test_an_unknown_result_id_does_not_exist(self):
        for result_id in (str(uuid.uuid4()), "not-a-uuid"):
            with self.assertRaises(compat.TaskResultDoesNotExist):
                tasks.add.get_result(result_id)

    def test_a_runs_id_that_is_no_task_does_not_exist(self):
        from tests.support import trigger

        event = trigger("test.nothing")
        with self.assertRaises(compat.TaskResultDoesNotExist):
            tasks.add.get_result(str(event.aggregate_id))

    def test_takes_context_gets_the_task_context(self):
        result = tasks.with_context.enqueue("ctx")
        drain()
        value = tasks.with_context.get_result(result.id).return_value
        self.assertEqual(value, {"attempt": 1, "id": result.id, "label": "ctx"})

    def test_run_after_is_a_durable_wait(self):
        at = timezone.now() + timedelta(hours=1)
        result = tasks.add.using(run_after=at).enqueue(1, 1)
        drain()
        waiting = tasks.add.get_result(result.id)
        self.assertEqual(waiting.status, Status.READY)
        self.assertEqual(waiting.task.run_after, at)
        self.assertEqual(waiting.attempts, 0)
        drain(at)
        self.assertEqual(tasks.add.get_result(result.id).status, Status.SUCCESSFUL)

    def test_an_unknown_queue_is_refused(self):
        with self.assertRaisesMessage(compat.InvalidTask, "Queue 'nope' is not valid"):
            tasks.add.using(queue_name="nope")

    def test_tasks_are_claimed_by_priority_and_bad_priorities_refused(self):
        self.assertTrue(WorkflowTaskBackend.supports_priority)
        low = tasks.add.using(priority=-100).enqueue(1, 0)
        plain = tasks.add.enqueue(2, 0)
        high = tasks.add.using(priority=100).enqueue(3, 0)
        mid = tasks.add.using(priority=40).enqueue(4, 0)
        self.assertEqual(tasks.add.get_result(mid.id).task.priority, 40)
        run = WorkflowRun.objects.get(run_id=mid.id)
        self.assertEqual(run.priority, 40)
        self.assertEqual(Event.objects.get(id=run.trigger_event_id).payload["priority"], 40)
        drain()
        order = list(
            Event.objects.filter(type=et.RESUMED)
            .order_by("id")
            .values_list("aggregate_id", flat=True)
        )
        self.assertEqual([str(run_id) for run_id in order], [high.id, mid.id, plain.id, low.id])
        for priority in (101, -101, True, 1.5):
            with self.assertRaises(compat.InvalidTask):
                tasks.add.using(priority=priority)

    def test_arguments_json_cannot_hold_are_refused_before_any_write(self):
        with self.assertRaises(TypeError):
            tasks.add.enqueue(object(), 1)
        self.assertFalse(WorkflowRun.objects.filter(workflow_name__startswith="task:").exists())


@override_settings(TASKS=tasks_setting())
class TransactionalEnqueueTests(TestCase):
    def setUp(self):
        self.calls = self.enterContext(_calls_file())

    def test_a_rolled_back_enqueue_never_runs(self):
        with self.assertRaises(ZeroDivisionError), transaction.atomic():
            result = tasks.record.enqueue("rolled back")
            raise ZeroDivisionError("the caller's transaction rolls back")
        drain()
        drain(timezone.now() + timedelta(days=1))
        self.assertEqual(self.calls.lines(), [])
        with self.assertRaises(compat.TaskResultDoesNotExist):
            tasks.record.get_result(result.id)

    def test_a_committed_enqueue_runs_once(self):
        with transaction.atomic():
            result = tasks.record.enqueue("committed")
        drain()
        drain(timezone.now() + timedelta(days=1))
        self.assertEqual(self.calls.lines(), ["committed"])
        self.assertEqual(tasks.record.get_result(result.id).status, Status.SUCCESSFUL)


@override_settings(TASKS=tasks_setting())
class FailureAndRetryTests(TestCase):
    def test_a_failed_attempt_keeps_its_class_path_and_traceback_out_of_every_event(self):
        result = tasks.always_fails.enqueue()
        drain()
        result.refresh()
        self.assertEqual(result.status, Status.FAILED)
        self.assertEqual(len(result.errors), 1)
        error = result.errors[0]
        self.assertEqual(error.exception_class_path, "builtins.ValueError")
        self.assertIs(error.exception_class, ValueError)
        self.assertIn("ValueError: no luck", error.traceback)
        self.assertEqual(result.attempts, 1)
        self.assertIsNotNone(result.finished_at)
        with self.assertRaisesMessage(ValueError, "Task failed"):
            _ = result.return_value
        events = json.dumps([e.payload for e in Event.objects.all()], default=str)
        self.assertNotIn("no luck", events)
        self.assertIn("no luck", WorkflowRun.objects.get(run_id=result.id).last_error)

    def test_a_failed_attempts_writes_roll_back_but_its_error_is_kept(self):
        result = tasks.writes_then_fails.enqueue("boom")
        drain()
        result.refresh()
        self.assertEqual(result.status, Status.FAILED)
        self.assertEqual(result.errors[0].exception_class_path, "builtins.RuntimeError")

    def test_retries_with_backoff_count_attempts_and_keep_one_error_each(self):
        result = tasks.flaky.enqueue(3)  # max_attempts=3, linear, base 60 s
        start = timezone.now()
        drain(start)
        result.refresh()
        self.assertEqual(result.status, Status.READY)
        self.assertEqual(result.attempts, 1)
        paths = [e.exception_class_path for e in result.errors]
        self.assertEqual(paths, ["tests.testapp.tasks.Flaky"])
        # refresh() updates the result's fields, not its task: get_result has the run_after.
        waiting = tasks.flaky.get_result(result.id)
        self.assertEqual(waiting.task.run_after, start + timedelta(seconds=60))

        drain(start + timedelta(seconds=59))  # not due yet
        self.assertEqual(tasks.flaky.get_result(result.id).attempts, 1)
        drain(start + timedelta(seconds=60))
        second = tasks.flaky.get_result(result.id)
        self.assertEqual((second.status, second.attempts), (Status.READY, 2))
        self.assertEqual(second.task.run_after, start + timedelta(seconds=60 + 120))
        self.assertIn("attempt 2 fails", second.errors[1].traceback)

        drain(start + timedelta(seconds=180))
        done = tasks.flaky.get_result(result.id)
        self.assertEqual(done.status, Status.SUCCESSFUL)
        self.assertEqual(done.return_value, 3)  # TaskContext.attempt on the third attempt
        self.assertEqual((done.attempts, len(done.errors), len(done.worker_ids)), (3, 2, 3))
        self.assertLess(done.started_at, done.last_attempted_at)

    def test_retries_exhausted_fail_with_every_attempts_error(self):
        result = tasks.flaky.enqueue(10)
        start = timezone.now()
        for seconds in (0, 60, 180):
            drain(start + timedelta(seconds=seconds))
        result.refresh()
        self.assertEqual(result.status, Status.FAILED)
        self.assertEqual(len(result.errors), 3)
        self.assertEqual(TaskAttempt.objects.filter(run_id=result.id).count(), 3)

    @override_settings(TASKS=tasks_setting(MAX_ATTEMPTS=2, BACKOFF="exponential", BASE_DELAY=5))
    def test_backend_options_are_the_defaults_of_a_task_without_its_own(self):
        result = tasks.always_fails.enqueue()
        start = timezone.now()
        drain(start)
        waiting = tasks.always_fails.get_result(result.id)
        self.assertEqual(waiting.status, Status.READY)
        self.assertEqual(waiting.task.run_after, start + timedelta(seconds=5))
        drain(start + timedelta(seconds=5))
        failed = tasks.always_fails.get_result(result.id)
        self.assertEqual((failed.status, failed.attempts), (Status.FAILED, 2))

    def test_bad_retry_options_on_a_task_are_refused(self):
        with self.assertRaisesMessage(compat.InvalidTask, "max_attempts must be an integer >= 1"):
            tasks.task(max_attempts=0)(tasks.add.func)
        with self.assertRaisesMessage(compat.InvalidTask, "backoff must be"):
            tasks.task(backoff="sometimes")(tasks.add.func)


@override_settings(TASKS=tasks_setting())
class QueueTests(TestCase):
    def test_a_worker_limited_to_a_queue_takes_only_that_queues_tasks(self):
        email = tasks.send_email.enqueue("b@example.com")
        other = tasks.add.enqueue(1, 1)
        report = resume_due_runs(now=timezone.now(), workflows=["task:emails"])
        self.assertEqual(report.completed, 1)
        self.assertEqual(tasks.send_email.get_result(email.id).status, Status.SUCCESSFUL)
        self.assertEqual(tasks.add.get_result(other.id).status, Status.READY)
        drain()
        self.assertEqual(tasks.add.get_result(other.id).status, Status.SUCCESSFUL)

    def test_the_worker_commands_queue_option(self):
        email = tasks.send_email.enqueue("c@example.com")
        other = tasks.add.enqueue(2, 2)
        out = io.StringIO()
        call_command("resume_due_runs", "--queue", "default", "--no-cron", stdout=out)
        self.assertIn("completed=1", out.getvalue())
        self.assertEqual(tasks.add.get_result(other.id).status, Status.SUCCESSFUL)
        self.assertEqual(tasks.send_email.get_result(email.id).status, Status.READY)


@override_settings(TASKS=tasks_setting())
class SignalTests(TestCase):
    def test_enqueued_started_finished_are_sent_as_the_frameworks_backends_send_them(self):
        seen = []

        def receiver(signal_name):
            def receive(sender, task_result, **kwargs):
                seen.append((signal_name, sender, task_result.status, task_result.attempts))

            return receive

        receivers = {
            "enqueued": receiver("enqueued"),
            "started": receiver("started"),
            "finished": receiver("finished"),
        }
        compat.task_enqueued.connect(receivers["enqueued"])
        compat.task_started.connect(receivers["started"])
        compat.task_finished.connect(receivers["finished"])
        try:
            tasks.add.enqueue(1, 2)
            drain()
        finally:
            compat.task_enqueued.disconnect(receivers["enqueued"])
            compat.task_started.disconnect(receivers["started"])
            compat.task_finished.disconnect(receivers["finished"])
        self.assertEqual(
            seen,
            [
                ("enqueued", WorkflowTaskBackend, Status.READY, 0),
                ("started", WorkflowTaskBackend, Status.RUNNING, 1),
                ("finished", WorkflowTaskBackend, Status.SUCCESSFUL, 1),
            ],
        )

    def test_task_finished_of_a_failure_is_sent_inside_the_except(self):
        tasks.always_fails.enqueue()
        logger = "django.tasks" if compat.PACKAGE == "django.tasks" else "django_tasks"
        with self.assertLogs(logger, "ERROR") as logs:
            drain()
        self.assertIsNotNone(logs.records[-1].exc_info)
        self.assertIs(logs.records[-1].exc_info[0], ValueError)


@override_settings(TASKS=tasks_setting())
class PeriodicTaskTests(TestCase):
    def setUp(self):
        self.calls = self.enterContext(_calls_file())

    def test_a_periodic_task_is_enqueued_once_per_cron_slot(self):
        from kumiko_workflows import fire_due_schedules

        schedule = periodic(tasks.record, "0 9 * * *", args=["nine"], register=False)
        self.assertEqual(schedule.name, "periodic:tests.testapp.tasks.record")
        first = timezone.now().replace(hour=8, minute=0, second=0, microsecond=0)
        with registry.override(schedule):
            fire_due_schedules(now=first)  # the schedule starts; nothing is due
            slot = first + timedelta(hours=1)
            self.assertEqual(fire_due_schedules(now=slot), 1)
            self.assertEqual(fire_due_schedules(now=slot), 0)  # a slot fires once
            drain(max(slot, timezone.now()))  # the task is queued when the slot's run enqueues it
        self.assertEqual(self.calls.lines(), ["nine"])

    def test_periodic_refuses_what_is_no_task(self):
        with self.assertRaises(compat.InvalidTask):
            periodic(tasks.add.func, "0 9 * * *", register=False)


class CheckTests(TestCase):
    def messages(self, **options):
        with override_settings(TASKS=tasks_setting(**options)):
            return list(compat.task_backends["default"].check())

    def test_a_good_configuration_has_no_messages(self):
        self.assertEqual(self.messages(MAX_ATTEMPTS=3, BACKOFF="linear"), [])

    def test_unknown_and_bad_options_are_reported(self):
        ids = [m.id for m in self.messages(MAX_ATTEMPT=3, BACKOFF="never")]
        self.assertEqual(ids, ["kumiko_workflows.E101", "kumiko_workflows.E102"])
        self.assertTrue(all(m.level == checks.ERROR for m in self.messages(BOGUS=1)))

    def test_manage_py_check_runs_the_backends_checks(self):
        with override_settings(TASKS=tasks_setting(BOGUS=1)):
            ids = [m.id for m in checks.run_checks()]
        self.assertIn("kumiko_workflows.E101", ids)

    def test_the_app_not_installed_is_reported(self):
        with override_settings(INSTALLED_APPS=["django.contrib.contenttypes"]):
            ids = [m.id for m in self.messages()]
        self.assertIn("kumiko_workflows.E100", ids)


class _Calls:
    def __init__(self, path):
        self.path = path

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []


class _calls_file:
    """Point the recording tasks at a fresh file (inherited by worker subprocesses)."""

    def __enter__(self):
        path = tasks.calls_file().with_name(f"kumiko-task-calls-{uuid.uuid4().hex}")
        self.saved = os.environ.get("KUMIKO_TASK_CALLS")
        os.environ["KUMIKO_TASK_CALLS"] = str(path)
        return _Calls(path)

    def __exit__(self, *exc):
        if self.saved is None:
            os.environ.pop("KUMIKO_TASK_CALLS", None)
        else:
            os.environ["KUMIKO_TASK_CALLS"] = self.saved


# --- real processes killed (PostgreSQL: the engine's multi-process database) ---------

ENQUEUE_AND_DIE = """
import os, signal, sys
import django
django.setup()
from django.db import transaction
from tests.testapp import tasks
with transaction.atomic():
    result = tasks.record.enqueue(sys.argv[2])
    print(result.id, flush=True)
    if sys.argv[1] == "before-commit":
        os.kill(os.getpid(), signal.SIGKILL)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_process_killed_right_after_its_commit_has_its_task_run_once(tmp_path):
    with _calls_file() as calls:
        committed = run_python(ENQUEUE_AND_DIE, "after-commit", "committed")
        lost = run_python(ENQUEUE_AND_DIE, "before-commit", "lost")
        assert committed.returncode == lost.returncode == -9
        drain()
        drain(timezone.now() + timedelta(days=1))
        assert calls.lines() == ["committed"]
    assert tasks.record.get_result(committed.stdout.strip()).status == Status.SUCCESSFUL
    with pytest.raises(compat.TaskResultDoesNotExist):
        tasks.record.get_result(lost.stdout.strip())


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_task_whose_worker_died_is_run_again_not_left_running(tmp_path):
    marker = tmp_path / "died"
    with _calls_file() as calls:
        result = tasks.dies_once.enqueue(str(marker))
        killed = run_manage("resume_due_runs", "--no-cron")
        assert killed.returncode == -9 and marker.exists()
        after_crash = tasks.dies_once.get_result(result.id)
        assert after_crash.status == Status.READY  # the attempt rolled back with its worker
        assert after_crash.attempts == 0
        survived = run_manage("resume_due_runs", "--no-cron", "--queue", "default")
        assert survived.returncode == 0, survived.stderr
        assert calls.lines() == [f"survived {marker}"]
    done = tasks.dies_once.get_result(result.id)
    assert (done.status, done.return_value, done.attempts) == (Status.SUCCESSFUL, "survived", 1)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_2000_tasks_four_workers_one_sigkilled_each_task_finishes_exactly_once(tmp_path):
    from kumiko_workflows import event_types as et
    from tests.support.faults import Worker, wait_for

    n = 2000
    with transaction.atomic():
        # Every priority of the scale, so the race runs through the priority order too.
        ids = [tasks.add.using(priority=i % 201 - 100).enqueue(i, 1000).id for i in range(n)]
    workers = [
        Worker(tmp_path, "--loop", "--no-cron", "--interval", "1", name=f"kumiko-task-w{i}")
        for i in range(4)
    ]
    try:

        def completed() -> int:
            return WorkflowRun.objects.filter(run_id__in=ids, status="completed").count()

        wait_for(lambda: completed() >= n // 4, "a quarter of the tasks to complete")
        workers[0].signal(9)  # mid-batch: its uncommitted tasks roll back
        assert workers[0].wait() == -9
        wait_for(lambda: completed() == n, "every task to complete", timeout=300)
    finally:
        for worker in workers[1:]:
            worker.stop()
        workers[0].signal(9)
    # Counted in the database: one final event and one committed resume per task.
    for kind in (et.TERMINAL, [et.RESUMED]):
        per_task = Counter(
            Event.objects.filter(aggregate_id__in=ids, type__in=kind).values_list(
                "aggregate_id", flat=True
            )
        )
        assert len(per_task) == n and set(per_task.values()) == {1}, kind
    results = {str(run_id): None for run_id in ids}
    for run_id, state in Event.objects.filter(
        aggregate_id__in=ids, type=et.RUN_COMPLETED
    ).values_list("aggregate_id", "payload__state"):
        results[str(run_id)] = state["results"]["task_once"]["return_value"]
    assert [results[task_id] for task_id in ids] == [i + 1000 for i in range(n)]
    assert not TaskAttempt.objects.filter(run_id__in=ids).exists()
