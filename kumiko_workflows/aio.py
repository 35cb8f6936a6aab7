"""The public operations for async code (async views, ASGI consumers).

Each wraps its synchronous twin with :func:`asgiref.sync.sync_to_async`
(thread-sensitive, as Django runs the ORM from async code), so calling it
never raises ``SynchronousOnlyOperation``; each takes the same arguments
and raises the same errors as its twin.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid

from asgiref.sync import sync_to_async

from kumiko_workflows.engine.resume import resume_due_runs
from kumiko_workflows.engine.run_controls import cancel_run, find_run, rerun_run, wake_run
from kumiko_workflows.exceptions import InvalidArgument
from kumiko_workflows.models import SETTLED_STATUSES, WorkflowRun
from kumiko_workflows.store.events import append_event

aappend_event = sync_to_async(append_event, thread_sensitive=True)
acancel_run = sync_to_async(cancel_run, thread_sensitive=True)
awake_run = sync_to_async(wake_run, thread_sensitive=True)
arerun_run = sync_to_async(rerun_run, thread_sensitive=True)
aresume_due_runs = sync_to_async(resume_due_runs, thread_sensitive=True)


def _seconds(name: str, value: object) -> float:
    """``value`` as a positive, finite number of seconds, else :class:`InvalidArgument`."""
    shown = repr(value)
    if not isinstance(value, bool) and isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond any float: 10**400
            seconds, shown = math.inf, f"an integer of {int(value).bit_length()} bits"
        if 0 < seconds < math.inf:  # NaN fails both
            return seconds
    raise InvalidArgument(f"{name} must be a positive number of seconds (finite), got {shown}")


async def await_run_finished(
    run_id: uuid.UUID | str, *, timeout: float = 30.0, interval: float = 0.2
) -> WorkflowRun:
    """The run's status row once it has completed, failed or been cancelled.

    Polls every ``interval`` seconds, yielding to the event loop between
    reads; raises :class:`TimeoutError` after ``timeout`` seconds (the run
    goes on), :class:`RunNotFound` for an unknown id.
    """
    timeout, interval = _seconds("timeout", timeout), _seconds("interval", interval)
    read = sync_to_async(find_run, thread_sensitive=True)
    deadline = time.monotonic() + timeout
    while True:
        run = await read(run_id)
        if run.status in SETTLED_STATUSES:
            return run
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"run {run.run_id} is still {run.status} after {timeout} s")
        await asyncio.sleep(min(interval, left))


__all__ = [
    "aappend_event",
    "acancel_run",
    "arerun_run",
    "aresume_due_runs",
    "await_run_finished",
    "awake_run",
]
