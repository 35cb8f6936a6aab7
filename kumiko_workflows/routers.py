"""The database router that puts the engine's tables on ``KUMIKO_WORKFLOWS["DATABASE"]``.

Only needed (and checked for, ``kumiko_workflows.E026``) when that alias is
not ``"default"``::

    DATABASE_ROUTERS = ["kumiko_workflows.routers.WorkflowsRouter"]
"""

from __future__ import annotations

from typing import Any

from kumiko_workflows.conf import workflow_settings

APP_LABEL = "kumiko_workflows"


class WorkflowsRouter:
    """Reads, writes and migrations of kumiko_workflows' models go to the engine's alias."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return workflow_settings.DATABASE if model._meta.app_label == APP_LABEL else None

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return workflow_settings.DATABASE if model._meta.app_label == APP_LABEL else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label == APP_LABEL:
            return bool(db == workflow_settings.DATABASE)
        return None
