"""Durable, event-sourced workflows for Django.

The public names are importable from here. They are resolved lazily so that
``"kumiko_workflows"`` can sit in ``INSTALLED_APPS`` without this module
importing models before Django's app registry is ready.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("kumiko-workflows")
except PackageNotFoundError:  # pragma: no cover - running from a plain checkout
    __version__ = "0.0.0"

_EXPORTS = {
    "define_workflow": "kumiko_workflows.workflow.definition",
    "on_event": "kumiko_workflows.workflow.triggers",
    "on_cron": "kumiko_workflows.workflow.cron",
    "on_call": "kumiko_workflows.workflow.triggers",
    "run_id_for": "kumiko_workflows.workflow.definition",
    "Limit": "kumiko_workflows.workflow.limits",
    "Rate": "kumiko_workflows.workflow.limits",
    "steps": "kumiko_workflows.steps",
    "match": "kumiko_workflows.match",
    "event_types": "kumiko_workflows.event_types",
    "append_event": "kumiko_workflows.store.events",
    "load_stream": "kumiko_workflows.store.events",
    "stream_id_for": "kumiko_workflows.store.stream_ids",
    "WorkflowError": "kumiko_workflows.exceptions",
    "InvalidEvent": "kumiko_workflows.exceptions",
    "StreamIdentityError": "kumiko_workflows.exceptions",
    "VersionConflict": "kumiko_workflows.exceptions",
    "AppendOnlyError": "kumiko_workflows.exceptions",
    "CrossDatabaseTransaction": "kumiko_workflows.exceptions",
    "OutboxNotMigrated": "kumiko_workflows.exceptions",
    "WorkflowDefinitionError": "kumiko_workflows.exceptions",
    "InvalidDuration": "kumiko_workflows.exceptions",
    "InvalidMatchExpression": "kumiko_workflows.exceptions",
    "RunNotFound": "kumiko_workflows.exceptions",
    "RunNotRerunnable": "kumiko_workflows.exceptions",
    "ScheduleError": "kumiko_workflows.exceptions",
    "InvalidArgument": "kumiko_workflows.exceptions",
    "MigrationRefused": "kumiko_workflows.exceptions",
    "RunContext": "kumiko_workflows.engine.run_context",
    "resume_due_runs": "kumiko_workflows.engine.resume",
    "cancel_run": "kumiko_workflows.engine.run_controls",
    "wake_run": "kumiko_workflows.engine.run_controls",
    "rerun_run": "kumiko_workflows.engine.run_controls",
    "fire_due_schedules": "kumiko_workflows.engine.cron",
    "start_in_worker": "kumiko_workflows.engine.starts",
    "await_run_finished": "kumiko_workflows.aio",
    "aresume_due_runs": "kumiko_workflows.aio",
    "arerun_run": "kumiko_workflows.aio",
    "awake_run": "kumiko_workflows.aio",
    "acancel_run": "kumiko_workflows.aio",
    "aappend_event": "kumiko_workflows.aio",
    "migrate_workflow_runs": "kumiko_workflows.engine.version_moves",
    "pause_schedule": "kumiko_workflows.engine.schedule_controls",
    "resume_schedule": "kumiko_workflows.engine.schedule_controls",
    "fire_schedule_now": "kumiko_workflows.engine.schedule_controls",
}

__all__ = [
    "aappend_event",
    "acancel_run",
    "arerun_run",
    "aresume_due_runs",
    "await_run_finished",
    "awake_run",
    "AppendOnlyError",
    "CrossDatabaseTransaction",
    "InvalidArgument",
    "InvalidDuration",
    "InvalidEvent",
    "InvalidMatchExpression",
    "Limit",
    "MigrationRefused",
    "OutboxNotMigrated",
    "Rate",
    "RunContext",
    "RunNotFound",
    "RunNotRerunnable",
    "ScheduleError",
    "StreamIdentityError",
    "VersionConflict",
    "WorkflowDefinitionError",
    "WorkflowError",
    "__version__",
    "append_event",
    "cancel_run",
    "define_workflow",
    "event_types",
    "fire_due_schedules",
    "fire_schedule_now",
    "load_stream",
    "match",
    "migrate_workflow_runs",
    "on_call",
    "on_cron",
    "on_event",
    "pause_schedule",
    "rerun_run",
    "resume_due_runs",
    "resume_schedule",
    "run_id_for",
    "start_in_worker",
    "steps",
    "stream_id_for",
    "wake_run",
]

if TYPE_CHECKING:  # pragma: no cover
    from kumiko_workflows import event_types, match, steps
    from kumiko_workflows.aio import (
        aappend_event,
        acancel_run,
        arerun_run,
        aresume_due_runs,
        await_run_finished,
        awake_run,
    )
    from kumiko_workflows.engine.cron import fire_due_schedules
    from kumiko_workflows.engine.resume import resume_due_runs
    from kumiko_workflows.engine.run_context import RunContext
    from kumiko_workflows.engine.run_controls import cancel_run, rerun_run, wake_run
    from kumiko_workflows.engine.schedule_controls import (
        fire_schedule_now,
        pause_schedule,
        resume_schedule,
    )
    from kumiko_workflows.engine.starts import start_in_worker
    from kumiko_workflows.engine.version_moves import migrate_workflow_runs
    from kumiko_workflows.exceptions import (
        AppendOnlyError,
        CrossDatabaseTransaction,
        InvalidArgument,
        InvalidDuration,
        InvalidEvent,
        InvalidMatchExpression,
        MigrationRefused,
        OutboxNotMigrated,
        RunNotFound,
        RunNotRerunnable,
        ScheduleError,
        StreamIdentityError,
        VersionConflict,
        WorkflowDefinitionError,
        WorkflowError,
    )
    from kumiko_workflows.store.events import append_event, load_stream
    from kumiko_workflows.store.stream_ids import stream_id_for
    from kumiko_workflows.workflow.cron import on_cron
    from kumiko_workflows.workflow.definition import define_workflow, run_id_for
    from kumiko_workflows.workflow.limits import Limit, Rate
    from kumiko_workflows.workflow.triggers import on_call, on_event


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'kumiko_workflows' has no attribute {name!r}")
    module = import_module(module_name)
    value = module if module_name.endswith("." + name) else getattr(module, name)
    globals()[name] = value
    return value
