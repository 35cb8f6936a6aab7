"""A Django task as a run: the one-step workflow per queue, its attempts, its result.

Enqueueing appends ``kumiko.task-enqueued.<queue>`` (a domain event of
aggregate type ``kumiko-task``, in the caller's transaction); it triggers the
queue's workflow ``task:<queue>``, defined with ``start="worker"``, so the
run is queued in that same transaction and a worker runs it after the
commit. Its steps: a wait until ``run_after`` when there is one, then the
task inside the engine's ``steps.retry``, whose attempts, backoff and give-up
are the engine's. So a task is a run like any other: in the admin,
``workflow_status``, metrics, the run signals and retention.

Each failed attempt leaves a :class:`~kumiko_workflows.models.TaskAttempt` row
(worker id, times, the error's class path and traceback): mutable, never an
event, written after the engine rolled back the attempt's writes
(``streams.error_recorders``), in the same transaction. The successful
attempt (worker id, start, return value) is the step's result, kept in the
run's ``workflow.run-completed`` event: a task costs no row more than a run.
"""

from __future__ import annotations

import functools
import os
import socket
import traceback
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.apps import apps
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.engine.run_context import RunContext
from kumiko_workflows.models import Event, RunStatus, TaskAttempt, WorkflowRun
from kumiko_workflows.store import streams
from kumiko_workflows.tasks import compat
from kumiko_workflows.tasks.names import (
    TASK_AGGREGATE_TYPE,
    WORKFLOW_PREFIX,
    event_type,
    workflow_name,
)
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import steps
from kumiko_workflows.workflow.cron import on_cron
from kumiko_workflows.workflow.definition import Workflow, define_workflow, run_id_for
from kumiko_workflows.workflow.registry import registry
from kumiko_workflows.workflow.triggers import on_event

#: The step result that holds the successful attempt: of a task retried, of one run once.
RESULT_KEY = "task"
ONCE_KEY = "task_once"

#: Who runs an attempt: this process, as ``host:pid`` (one ``worker_ids`` entry per attempt).
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


def _task_key(event: Event) -> str:
    return str(event.aggregate_id)


def _task_priority(event: Event) -> int:
    # Django's scale (-100..100, 0 the default) is the engine's own.
    return int(event.payload.get("priority") or 0)


def _task_path(event: Event) -> str:
    return str(event.payload["task"])[:200]


def _deferred(ctx: RunContext) -> bool:
    return ctx.event.payload.get("run_after") is not None


def _run_after(ctx: RunContext) -> str:
    return str(ctx.event.payload["run_after"])


def _max_attempts(ctx: RunContext) -> int:
    return int(ctx.event.payload["max_attempts"])


def _retried(ctx: RunContext) -> bool:
    return _max_attempts(ctx) > 1


def _backoff(ctx: RunContext) -> str:
    return str(ctx.event.payload["backoff"])


def _base_delay(ctx: RunContext) -> Any:
    value = ctx.event.payload.get("base_delay")
    return workflow_settings.RETRY_BASE_DELAY if value is None else value


def _max_delay(ctx: RunContext) -> Any:
    return ctx.event.payload.get("max_delay")


def ensure_queue_workflows(queues: Sequence[str]) -> None:
    """Define the workflow of each queue not defined yet (at start, and for a new backend)."""
    for queue in queues:
        # At start (the app's ready()) the registry cannot be asked yet; defining
        # it again is a no-op (the same fingerprint).
        if not apps.ready or registry.get(workflow_name(queue)) is None:
            define_workflow(
                name=workflow_name(queue),
                trigger=on_event(event_type(queue)),
                idempotency_key=_task_key,
                search_key=_task_path,
                priority=_task_priority,
                start="worker",
                steps=[
                    steps.branch(if_=_deferred, then=[steps.wait(_run_after)]),
                    steps.branch(
                        if_=_retried,
                        then=[
                            steps.retry(
                                times=_max_attempts,
                                backoff=_backoff,
                                base_delay=_base_delay,
                                max_delay=_max_delay,
                                do=[steps.compute(RESULT_KEY, execute)],
                            )
                        ],
                        # One attempt needs no retry, nor its savepoint per attempt.
                        else_=[steps.compute(ONCE_KEY, execute)],
                    ),
                ],
            )


def run_id_of(queue_name: str, task_id: uuid.UUID, tenant_id: str) -> uuid.UUID:
    return run_id_for(workflow_name(queue_name), str(task_id), tenant_id)


# --- building TaskResults ----------------------------------------------------


def task_of(payload: dict[str, Any]) -> Any:
    """The task an enqueue event names, with the options it was enqueued with."""
    return _task(
        payload["task"],
        payload["priority"],
        payload["queue_name"],
        payload["backend"],
        payload.get("run_after"),
    )


@functools.lru_cache(maxsize=1024)
def _task(path: str, priority: int, queue_name: str, backend: str, run_after: str | None) -> Any:
    # Cached: a worker runs many tasks of few kinds (a Task is immutable).
    found = import_string(path)
    if not isinstance(found, compat.Task):
        raise ImportError(f"{path} is not a task")
    changes: dict[str, Any] = {"priority": priority, "queue_name": queue_name, "backend": backend}
    if run_after:
        changes["run_after"] = parse_datetime(run_after)
    return found.using(**changes)


def _errors(attempts: Sequence[TaskAttempt]) -> list[Any]:
    return [
        compat.TaskError(exception_class_path=a.exception_class_path, traceback=a.traceback)
        for a in attempts
        if a.exception_class_path
    ]


def build_result(
    task: Any,
    result_id: str,
    status: Any,
    enqueued_at: datetime,
    payload: dict[str, Any],
    attempts: Sequence[TaskAttempt],
    finished_at: datetime | None = None,
) -> Any:
    return compat.TaskResult(
        task=task,
        id=result_id,
        status=status,
        enqueued_at=enqueued_at,
        started_at=attempts[0].started_at if attempts else None,
        last_attempted_at=attempts[-1].started_at if attempts else None,
        finished_at=finished_at,
        args=payload["args"],
        kwargs=payload["kwargs"],
        backend=payload["backend"],
        errors=_errors(attempts),
        worker_ids=[a.worker_id for a in attempts],
    )


def load_result(result_id: str) -> Any:
    """The TaskResult of the run ``result_id``; ``TaskResultDoesNotExist`` if there is none."""
    try:
        run_id = uuid.UUID(str(result_id))
    except ValueError:
        raise compat.TaskResultDoesNotExist(f"no task result {result_id!r}") from None
    run = WorkflowRun.objects.filter(
        run_id=run_id, workflow_name__startswith=WORKFLOW_PREFIX
    ).first()
    trigger = (
        Event.objects.filter(id=run.trigger_event_id, aggregate_type=TASK_AGGREGATE_TYPE).first()
        if run is not None and run.trigger_event_id is not None
        else None
    )
    if run is None or trigger is None:
        raise compat.TaskResultDoesNotExist(f"no task result {result_id!r}")
    payload = trigger.payload
    try:
        task = task_of(payload)
    except (ImportError, AttributeError) as exc:
        raise compat.TaskResultDoesNotExist(
            f"task result {result_id!r}: its task {payload['task']!r} cannot be imported ({exc})"
        ) from None
    attempts = list(TaskAttempt.objects.filter(run_id=run_id).order_by("attempt", "id"))
    succeeded: dict[str, Any] = {}
    if run.status == RunStatus.COMPLETED:
        completed = Event.objects.filter(
            aggregate_id=run_id, type=et.RUN_COMPLETED, tenant_id=run.tenant_id
        ).first()
        state = (completed.payload.get("state") or {}) if completed is not None else {}
        results = state.get("results") or {}
        succeeded = results.get(RESULT_KEY) or results.get(ONCE_KEY) or {}
        if succeeded.get("worker_id"):
            attempts.append(
                TaskAttempt(
                    worker_id=succeeded["worker_id"],
                    started_at=datetime.fromisoformat(succeeded["started_at"]),
                )
            )
    statuses = compat.TaskResultStatus
    status = statuses.READY
    finished_at = None
    if run.status == RunStatus.COMPLETED:
        status, finished_at = statuses.SUCCESSFUL, run.finished_at
    elif run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        status, finished_at = statuses.FAILED, run.finished_at
    elif run.suspension_type == "retry" and run.wake_at is not None:
        task = task.using(run_after=run.wake_at)  # a retry waiting: READY, later
    result = build_result(task, str(run_id), status, trigger.created_at, payload, attempts)
    object.__setattr__(result, "finished_at", finished_at)
    if status == statuses.FAILED and not (attempts and attempts[-1].exception_class_path):
        # Failed by the engine, not by an attempt (cancelled, changed, resume errors).
        result.errors.append(
            compat.TaskError(
                exception_class_path="kumiko_workflows.exceptions.WorkflowError",
                traceback=run.last_error or f"the run was {run.status} ({run.failure_reason})",
            )
        )
    if status == statuses.SUCCESSFUL:
        object.__setattr__(result, "_return_value", succeeded.get("return_value"))
    return result


# --- running an attempt ------------------------------------------------------


#: Failed attempts waiting for the engine to roll back their writes, by run id.
_failed: dict[uuid.UUID, TaskAttempt] = {}


def _record_failed_attempt(run_id: uuid.UUID) -> None:
    row = _failed.pop(run_id, None)
    if row is not None:
        row.save(force_insert=True)


streams.error_recorders.append(_record_failed_attempt)


def execute(ctx: RunContext) -> Any:
    """Run one attempt of the task, sending the framework's signals as its own backends do."""
    payload = ctx.event.payload
    _failed.pop(ctx.run_id, None)
    task = task_of(payload)
    backend = compat.task_backends[payload["backend"]]
    sender = type(backend)
    # Attempts before this one left rows (failed ones do); the first attempt of
    # a run has none to read, unless the run was rerun (then its attempt in
    # flight counts from 1 again; get_result counts them all).
    previous = (
        list(
            TaskAttempt.objects.filter(tenant_id=ctx.tenant_id, run_id=ctx.run_id).order_by(
                "attempt", "id"
            )
        )
        if ctx.retry_attempt > 1
        else []
    )
    attempt = TaskAttempt(
        tenant_id=ctx.tenant_id,
        run_id=ctx.run_id,
        attempt=len(previous) + 1,
        worker_id=WORKER_ID,
        started_at=timezone.now(),
    )
    statuses = compat.TaskResultStatus
    result = build_result(
        task, str(ctx.run_id), statuses.RUNNING, ctx.event.created_at, payload, [*previous, attempt]
    )
    compat.task_started.send(sender=sender, task_result=result)
    try:
        if task.takes_context:
            value = task.call(compat.TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        value = compat.normalize_json(value)
    except Exception as exc:
        attempt.finished_at = timezone.now()
        attempt.exception_class_path = f"{type(exc).__module__}.{type(exc).__qualname__}"
        attempt.traceback = "".join(traceback.format_exception(exc))
        final = ctx.retry_attempt >= int(payload["max_attempts"])
        result.errors.append(
            compat.TaskError(
                exception_class_path=attempt.exception_class_path, traceback=attempt.traceback
            )
        )
        object.__setattr__(result, "status", statuses.FAILED if final else statuses.READY)
        if final:
            object.__setattr__(result, "finished_at", attempt.finished_at)
        _failed[ctx.run_id] = attempt
        compat.task_finished.send(sender=sender, task_result=result)
        raise
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "status", statuses.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    compat.task_finished.send(sender=sender, task_result=result)
    # The successful attempt is kept in the run's completed event (no error
    # text in it), so a task costs no row more than a run.
    return {
        "return_value": value,
        "worker_id": WORKER_ID,
        "started_at": attempt.started_at.isoformat(),
    }


# --- periodic tasks ----------------------------------------------------------


#: What each periodic task's workflow enqueues, by workflow name: (task, args, kwargs).
_periodic: dict[str, tuple[Any, list[Any], dict[str, Any]]] = {}


def _enqueue_periodic(ctx: RunContext) -> dict[str, str]:
    task, args, kwargs = _periodic[ctx.workflow_name]
    return {"task_result_id": task.enqueue(*args, **kwargs).id}


def periodic(
    task: Any,
    cron: str,
    *,
    timezone: str = "UTC",
    catch_up: str = "latest",
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    register: bool = True,
) -> Workflow:
    """Enqueue ``task(*args, **kwargs)`` at each slot of ``cron``: a cron workflow that enqueues.

    The engine's cron triggers fire it (time zone, catch-up, pause, the
    admin's schedules); each slot's run enqueues the task in its own
    transaction, so a slot enqueues it once. ``name`` defaults to
    ``"periodic:" + the task's module path``; ``register=False`` builds it
    without registering it (for ``registry.override`` in tests).
    """
    if not isinstance(task, compat.Task):
        raise compat.InvalidTask(f"periodic() takes a task (made with @task), got {task!r}")
    name = name or f"periodic:{task.module_path}"
    _periodic[name] = (task, list(args), dict(kwargs or {}))
    return define_workflow(
        name=name,
        trigger=on_cron(cron, timezone=timezone, catch_up=catch_up),
        steps=[steps.compute("enqueue", _enqueue_periodic)],
        register=register,
    )
