"""A durable backend for Django's Tasks framework, on the engine's store and worker.

``TASKS = {"default": {"BACKEND": "kumiko_workflows.tasks.WorkflowTaskBackend"}}``:
each task is a run of a one-step workflow (see README "Background tasks").
Works with ``django.tasks`` (Django 6) and the ``django-tasks`` backport
(Django 5.2, the ``tasks`` extra), chosen at run time.
"""

from kumiko_workflows.tasks.backend import WorkflowTask, WorkflowTaskBackend
from kumiko_workflows.tasks.runner import periodic

__all__ = ["WorkflowTask", "WorkflowTaskBackend", "periodic"]
