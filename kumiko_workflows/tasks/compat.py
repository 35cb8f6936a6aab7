"""Django's Tasks framework, from Django 6 (``django.tasks``) or the ``django-tasks`` backport.

Chosen at run time, so one backend serves Django 5.2 (with
``pip install kumiko-workflows[tasks]``) and Django 6.x (nothing to add).
The two spell the invalid-task exception differently (``InvalidTask`` in
Django 6, ``InvalidTaskError`` in the backport); this module names it
``InvalidTask`` for both.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def _framework() -> tuple[str, Any, Any, Any, Any, Any]:
    for package in ("django.tasks", "django_tasks"):
        try:
            root = import_module(package)
        except ImportError:
            continue
        return (
            package,
            root,
            import_module(f"{package}.base"),
            import_module(f"{package}.backends.base"),
            import_module(f"{package}.exceptions"),
            import_module(f"{package}.signals"),
        )
    raise ImproperlyConfigured(
        "kumiko_workflows.tasks needs Django's Tasks framework: Django 6 has it; on "
        "Django 5.2 install the backport with pip install 'kumiko-workflows[tasks]'"
    )


PACKAGE, _root, _base, _backends, _exceptions, _signals = _framework()
if PACKAGE == "django_tasks":
    # Django 6 registers the backends' system checks on import; the backport
    # only in its app's ready(): register them without "django_tasks" installed.
    import_module("django_tasks.checks")

task_backends: Any = _root.task_backends
DEFAULT_TASK_QUEUE_NAME: str = _base.DEFAULT_TASK_QUEUE_NAME
DEFAULT_TASK_PRIORITY: int = _base.DEFAULT_TASK_PRIORITY
TASK_MIN_PRIORITY: int = _base.TASK_MIN_PRIORITY
TASK_MAX_PRIORITY: int = _base.TASK_MAX_PRIORITY
task: Any = _base.task
BaseTaskBackend: Any = _backends.BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
InvalidTask: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished
normalize_json: Any = (
    import_module("django.utils.json").normalize_json
    if PACKAGE == "django.tasks"
    else import_module("django_tasks.utils").normalize_json
)
