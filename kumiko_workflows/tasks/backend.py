"""``WorkflowTaskBackend``: Django's Tasks framework on the event store and the resume worker.

Configured in ``TASKS``; every task is a run of its queue's one-step
workflow (:mod:`kumiko_workflows.tasks.runner`). The enqueue is an append
in the caller's transaction: a rollback takes the task with it, a commit
runs it once (at least once across a crash, as every run).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.core import checks

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import InvalidDuration
from kumiko_workflows.store.events import append_event
from kumiko_workflows.tasks import compat, names, runner
from kumiko_workflows.workflow.arguments import int_between
from kumiko_workflows.workflow.durations import as_delay
from kumiko_workflows.workflow.steps import BACKOFFS

#: ``OPTIONS`` the backend reads, with their defaults (None: the engine's own).
OPTION_DEFAULTS: dict[str, Any] = {
    "MAX_ATTEMPTS": 1,
    "BACKOFF": "exponential",
    "BASE_DELAY": None,
    "MAX_DELAY": None,
}
#: Queue names become workflow names (``task:<queue>``, at most 200 characters).
MAX_QUEUE_NAME = 200 - len(names.WORKFLOW_PREFIX)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowTask(compat.Task):  # type: ignore[misc]
    """A task with the engine's retries: ``@task(max_attempts=5, backoff="linear")``.

    None takes the backend's ``OPTIONS`` (``MAX_ATTEMPTS``, ``BACKOFF``,
    ``BASE_DELAY``, ``MAX_DELAY``). ``max_attempts`` counts all attempts, the
    first included; a failed attempt with attempts left waits ``base_delay
    × attempt`` (``linear``) or ``× 2^(attempt-1)`` (``exponential``), capped
    by ``max_delay``.
    """

    max_attempts: int | None = None
    backoff: str | None = None
    base_delay: Any = None
    max_delay: Any = None


def _delay_seconds(value: Any) -> float | None:
    return None if value is None else as_delay(value).total_seconds()


class WorkflowTaskBackend(compat.BaseTaskBackend):  # type: ignore[misc]
    """Runs tasks as workflow runs: durable, transactional, retried, recovered."""

    task_class = WorkflowTask
    #: Read by the app's ready(): this backend's queues need their workflows.
    runs_as_workflows = True
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    # A task's priority (-100..100) is its run's: a bounded head start on the
    # due time among due work (docs/howto/priorities.md).
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        if apps.ready:
            runner.ensure_queue_workflows(sorted(self.queues))

    def _option(self, name: str) -> Any:
        return self.options.get(name, OPTION_DEFAULTS[name])

    def retry_options(self, task: Any) -> dict[str, Any]:
        """The task's retry settings, its own over the backend's ``OPTIONS``; JSON values."""
        own = {
            key: getattr(task, key, None)
            for key in ("max_attempts", "backoff", "base_delay", "max_delay")
        }
        merged = {
            key: self._option(key.upper()) if value is None else value for key, value in own.items()
        }
        attempts = merged["max_attempts"]
        if not int_between(attempts, 1):
            raise compat.InvalidTask(f"max_attempts must be an integer >= 1, got {attempts!r}")
        if merged["backoff"] not in BACKOFFS:
            raise compat.InvalidTask(
                f"backoff must be 'linear' or 'exponential', got {merged['backoff']!r}"
            )
        try:
            merged["base_delay"] = _delay_seconds(merged["base_delay"])
            merged["max_delay"] = _delay_seconds(merged["max_delay"])
        except InvalidDuration as exc:
            raise compat.InvalidTask(f"invalid retry delay: {exc}") from None
        return merged

    def validate_task(self, task: Any) -> None:
        # The framework checks the range; a bool (an int to Python) is no priority.
        if isinstance(task.priority, bool) or not isinstance(task.priority, int):
            raise compat.InvalidTask(
                f"priority must be a whole number between {compat.TASK_MIN_PRIORITY} "
                f"and {compat.TASK_MAX_PRIORITY}."
            )
        super().validate_task(task)
        if len(task.queue_name) > MAX_QUEUE_NAME:
            raise compat.InvalidTask(f"queue name longer than {MAX_QUEUE_NAME} characters")
        self.retry_options(task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        runner.ensure_queue_workflows([task.queue_name])
        tenant_id = workflow_settings.DEFAULT_TENANT
        task_id = uuid.uuid4()
        run_id = runner.run_id_of(task.queue_name, task_id, tenant_id)
        result = runner.build_result(
            task,
            str(run_id),
            compat.TaskResultStatus.READY,
            None,  # type: ignore[arg-type]  # set from the event below
            {"args": args, "kwargs": kwargs, "backend": self.alias},
            [],
        )
        payload = {
            "task": task.module_path,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "priority": task.priority,
            "run_after": task.run_after.isoformat() if task.run_after else None,
            "args": result.args,
            "kwargs": result.kwargs,
            **self.retry_options(task),
        }
        event = append_event(
            task_id,
            names.TASK_AGGREGATE_TYPE,
            names.event_type(task.queue_name),
            payload,
            tenant_id=tenant_id,
            expected_version=0,
        )
        object.__setattr__(result, "enqueued_at", event.created_at)
        compat.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        result = runner.load_result(result_id)
        if result.backend != self.alias:
            raise compat.TaskResultDoesNotExist(
                f"task result {result_id!r} belongs to the backend {result.backend!r}"
            )
        return result

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        yield from super().check(**kwargs)
        where = f"TASKS[{self.alias!r}]"
        if not apps.is_installed("kumiko_workflows"):
            yield checks.Error(
                f"{where} uses WorkflowTaskBackend but kumiko_workflows is not installed",
                hint="Add 'kumiko_workflows' to INSTALLED_APPS.",
                id="kumiko_workflows.E100",
            )
        unknown = sorted(set(self.options) - set(OPTION_DEFAULTS))
        if unknown:
            yield checks.Error(
                f"{where}: unknown OPTIONS {', '.join(map(repr, unknown))}",
                hint=f"WorkflowTaskBackend reads {', '.join(OPTION_DEFAULTS)}.",
                id="kumiko_workflows.E101",
            )
        try:
            self.retry_options(None)
        except compat.InvalidTask as exc:
            yield checks.Error(f"{where}: OPTIONS: {exc}", id="kumiko_workflows.E102")
        for queue in sorted(self.queues):
            if not isinstance(queue, str) or not queue or len(queue) > MAX_QUEUE_NAME:
                yield checks.Error(
                    f"{where}: queue name {queue!r} must be 1-{MAX_QUEUE_NAME} characters",
                    id="kumiko_workflows.E103",
                )
