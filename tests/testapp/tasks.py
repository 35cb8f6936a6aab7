"""Tasks for tests/integration/test_tasks.py, at module level as the Tasks framework requires."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from django.db import connection

from kumiko_workflows.tasks import compat

task = compat.task


def calls_file() -> Path:
    """Where recording tasks add a line per call (a file: workers are other processes)."""
    return Path(os.environ.get("KUMIKO_TASK_CALLS", "/tmp/kumiko-task-calls"))


def _record(line: str) -> None:
    with calls_file().open("a") as out:
        out.write(line + "\n")


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def noop() -> None:
    return None


@task(queue_name="emails")
def send_email(to: str) -> dict[str, str]:
    _record(f"email {to}")
    return {"sent": to}


@task()
def record(label: str) -> str:
    _record(label)
    return label


@task(takes_context=True)
def with_context(context, label: str) -> dict[str, object]:
    return {"attempt": context.attempt, "id": context.task_result.id, "label": label}


class Flaky(Exception):
    pass


@task(takes_context=True, max_attempts=3, backoff="linear", base_delay=60)
def flaky(context, succeed_on: int) -> int:
    if context.attempt < succeed_on:
        raise Flaky(f"attempt {context.attempt} fails")
    return context.attempt


@task()
def always_fails() -> None:
    raise ValueError("no luck")


@task()
def writes_then_fails(label: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    raise RuntimeError(label)


@task()
async def async_add(a: int, b: int) -> int:
    return a + b


@task()
def dies_once(marker: str) -> str:
    """SIGKILLs its own worker the first time: the worker dies mid-attempt."""
    if not os.path.exists(marker):
        Path(marker).write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    _record(f"survived {marker}")
    return "survived"
