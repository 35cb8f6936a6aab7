"""A durable backend for Django's Tasks framework, on the engine's store and worker.

``TASKS = {"default": {"BACKEND": "kumiko_workflows.tasks.WorkflowTaskBackend"}}``:
each task is a run of a one-step workflow (see README "Background tasks").
Works with ``django.tasks`` (Django 6) and the ``django-tasks`` backport
(Django 5.2, the ``tasks`` extra), chosen at run time. The names resolve
lazily, so :mod:`kumiko_workflows.tasks.names` imports without the framework.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "WorkflowTask": "kumiko_workflows.tasks.backend",
    "WorkflowTaskBackend": "kumiko_workflows.tasks.backend",
    "periodic": "kumiko_workflows.tasks.runner",
}

__all__ = ["WorkflowTask", "WorkflowTaskBackend", "periodic"]

if TYPE_CHECKING:  # pragma: no cover
    from kumiko_workflows.tasks.backend import WorkflowTask, WorkflowTaskBackend
    from kumiko_workflows.tasks.runner import periodic


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'kumiko_workflows.tasks' has no attribute {name!r}")
    value = getattr(import_module(module_name), name)
    globals()[name] = value
    return value
