"""The database router that puts the engine's tables on ``KUMIKO_WORKFLOWS["DATABASE"]``.

Only needed (and checked for, ``kumiko_workflows.E026``) when that alias is
not ``"default"``::

    DATABASE_ROUTERS = ["kumiko_workflows.routers.WorkflowsRouter"]

The one exception is the outbox (:class:`~kumiko_workflows.models.OutboxEntry`):
it lives on the site's databases, and ``migrate --database ALIAS`` creates it
on any alias, so that listing one in ``KUMIKO_WORKFLOWS["OUTBOX_DATABASES"]``
later needs no migration surgery. The engine names the alias of every query
of it; no read or write of it is routed.
"""

from __future__ import annotations

from typing import Any

from kumiko_workflows.conf import workflow_settings

APP_LABEL = "kumiko_workflows"
#: The model that lives on the site's aliases, not on the engine's.
OUTBOX_MODEL = "outboxentry"


class WorkflowsRouter:
    """Reads, writes and migrations of kumiko_workflows' models go to the engine's alias."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return _engine_alias(model)

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return _engine_alias(model)

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        # The outbox on any alias; the rest (and operations tied to no model) on the engine's.
        if app_label == APP_LABEL:
            return model_name == OUTBOX_MODEL or bool(db == workflow_settings.DATABASE)
        return None


def _engine_alias(model: type[Any]) -> str | None:
    meta = model._meta
    if meta.app_label != APP_LABEL or meta.model_name == OUTBOX_MODEL:
        return None
    return str(workflow_settings.DATABASE)
