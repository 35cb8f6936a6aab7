"""How a task queue maps to the engine: its workflow's name and its trigger event type.

Free of the Tasks framework, so the worker command (``--queue``) uses it
without Django 6 or the backport installed.
"""

from __future__ import annotations

#: The aggregate type of the enqueue events' streams (one stream per task).
TASK_AGGREGATE_TYPE = "kumiko-task"
WORKFLOW_PREFIX = "task:"
EVENT_PREFIX = "kumiko.task-enqueued."


def workflow_name(queue_name: str) -> str:
    """The workflow whose runs are the queue's tasks: ``task:<queue>``."""
    return WORKFLOW_PREFIX + queue_name


def event_type(queue_name: str) -> str:
    """The event an enqueue on the queue appends: ``kumiko.task-enqueued.<queue>``."""
    return EVENT_PREFIX + queue_name
