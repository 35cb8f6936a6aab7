"""System checks for settings and workflow definitions (``kumiko_workflows.E0xx``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core import checks

from kumiko_workflows.conf import DEFAULTS, import_callable, workflow_settings
from kumiko_workflows.operations.cutoff import retention_problem
from kumiko_workflows.store.event_checks import name_problem
from kumiko_workflows.workflow.arguments import int_between
from kumiko_workflows.workflow.registry import registry
from kumiko_workflows.workflow.validation import validate


@checks.register("kumiko_workflows")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django.conf import settings

    errors: list[checks.CheckMessage] = []
    raw = getattr(settings, "KUMIKO_WORKFLOWS", {})
    if not isinstance(raw, dict):
        return [
            checks.Error(
                "KUMIKO_WORKFLOWS must be a dict.",
                hint='For example KUMIKO_WORKFLOWS = {"DEFAULT_TENANT": "default"}.',
                id="kumiko_workflows.E020",
            )
        ]
    for key in sorted(set(raw) - set(DEFAULTS)):
        errors.append(
            checks.Error(
                f"KUMIKO_WORKFLOWS has an unknown setting {key!r}.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id="kumiko_workflows.E021",
            )
        )
    positive = (
        "MAX_PAYLOAD_BYTES",
        "RETRY_BASE_DELAY",
        "WORKER_INTERVAL",
        "BATCH_SIZE",
        "BATCH_SECONDS",
        "MAX_RESUME_ERRORS",
        "CRON_CATCH_UP_LIMIT",
        "CRON_GRACE",
        "SIGNAL_REDELIVERY_SECONDS",
    )
    for key in positive:
        value = getattr(workflow_settings, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            errors.append(
                checks.Error(
                    f"KUMIKO_WORKFLOWS[{key!r}] must be a positive number, got {value!r}.",
                    hint=f"The default is {DEFAULTS[key]!r}.",
                    id="kumiko_workflows.E022",
                )
            )

    # The event store's own rule for a tenant id, so a default it would refuse
    # is reported here rather than by every append.
    problem = name_problem(workflow_settings.DEFAULT_TENANT, "tenant_id")
    if problem:
        errors.append(
            checks.Error(
                f"KUMIKO_WORKFLOWS['DEFAULT_TENANT'] {problem}.",
                hint=f"The default is {DEFAULTS['DEFAULT_TENANT']!r}.",
                id="kumiko_workflows.E023",
            )
        )
    problem = retention_problem(workflow_settings.RETENTION)
    if problem:
        errors.append(
            checks.Error(
                f"KUMIKO_WORKFLOWS['RETENTION'] {problem}.",
                hint="How long finished runs are kept, e.g. 'P30D' (or a timedelta); None keeps "
                "them until purge_workflow_runs is given --finished-before.",
                id="kumiko_workflows.E027",
            )
        )
    if not isinstance(workflow_settings.REUSE_PURGED_KEYS, bool):
        errors.append(
            checks.Error(
                "KUMIKO_WORKFLOWS['REUSE_PURGED_KEYS'] must be True or False, "
                f"got {workflow_settings.REUSE_PURGED_KEYS!r}.",
                hint="False (the default) keeps a purged run's idempotency key used.",
                id="kumiko_workflows.E028",
            )
        )
    if not isinstance(workflow_settings.PREPARED_STATEMENTS, bool):
        errors.append(
            checks.Error(
                "KUMIKO_WORKFLOWS['PREPARED_STATEMENTS'] must be True or False, "
                f"got {workflow_settings.PREPARED_STATEMENTS!r}.",
                hint="True (the default) prepares the engine's hot statements on PostgreSQL; "
                "False behind a pooler that cannot keep prepared statements.",
                id="kumiko_workflows.E029",
            )
        )
    errors.extend(_weight_problems(workflow_settings.TENANT_WEIGHTS))
    for key in ("CRON_TENANTS", "ADMIN_TENANT"):
        try:
            import_callable(getattr(workflow_settings, key), key)
        except Exception as exc:
            errors.append(
                checks.Error(
                    str(exc),
                    hint="Give a callable or a dotted path to one.",
                    id="kumiko_workflows.E024",
                )
            )
    errors.extend(_database_problems(settings))
    return errors


def _weight_problems(weights: Any) -> list[checks.CheckMessage]:
    """``TENANT_WEIGHTS``: a dict of tenant ids to positive integers (``E110``)."""
    hint = 'Tenant id to a positive integer, e.g. {"big-customer": 4}; a tenant not named weighs 1.'
    if not isinstance(weights, dict):
        return [
            checks.Error(
                f"KUMIKO_WORKFLOWS['TENANT_WEIGHTS'] must be a dict, got {weights!r}.",
                hint=hint,
                id="kumiko_workflows.E110",
            )
        ]
    return [
        checks.Error(
            f"KUMIKO_WORKFLOWS['TENANT_WEIGHTS'][{tenant!r}] must be a positive integer, "
            f"got {weight!r}.",
            hint=hint,
            id="kumiko_workflows.E110",
        )
        for tenant, weight in weights.items()
        if not int_between(weight, 1)
    ]


ROUTER = "kumiko_workflows.routers.WorkflowsRouter"


def _database_problems(settings: Any) -> list[checks.CheckMessage]:
    alias = workflow_settings.DATABASE
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return [
            checks.Error(
                f"KUMIKO_WORKFLOWS['DATABASE'] is {alias!r}, which is not a key of DATABASES.",
                hint=f"Name one of: {', '.join(sorted(settings.DATABASES))}.",
                id="kumiko_workflows.E025",
            )
        ]
    routers = [
        r if isinstance(r, str) else type(r).__module__ + "." + type(r).__qualname__
        for r in getattr(settings, "DATABASE_ROUTERS", [])
    ]
    if alias != "default" and ROUTER not in routers:
        return [
            checks.Error(
                f"KUMIKO_WORKFLOWS['DATABASE'] is {alias!r}, but the engine's models are not "
                "routed there.",
                hint=f'Add "{ROUTER}" to DATABASE_ROUTERS.',
                id="kumiko_workflows.E026",
            )
        ]
    return []


@checks.register("kumiko_workflows")
def check_workflows(
    app_configs: Any = None, workflows: Iterable[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Run definition validation over every declared version of every workflow."""

    errors: list[checks.CheckMessage] = []
    for workflow in registry.every_version() if workflows is None else workflows:
        for problem in validate(workflow):
            level = checks.Warning if ".W" in problem.id else checks.Error
            errors.append(
                level(problem.message, hint=problem.hint or None, obj=workflow, id=problem.id)
            )
        errors.extend(_migration_sources(workflow))
    return errors


def _migration_sources(workflow: Any) -> list[checks.CheckMessage]:
    """``migrates_from`` positions the older version, where still declared, does not have."""
    errors: list[checks.CheckMessage] = []
    for old, positions in sorted(workflow.migrates_from.items()):
        source = registry.get(workflow.name, old)
        for position in sorted(positions):
            if source is not None and source.step_at(position) is None:
                errors.append(
                    checks.Error(
                        f"workflow {workflow.name!r} version {workflow.version}: "
                        f"migrates_from[{old}] maps step {position}, which version {old} has "
                        "no step at",
                        hint="Map the positions where runs of the old version wait (a run's "
                        "step, as the admin shows it).",
                        obj=workflow,
                        id="kumiko_workflows.E014",
                    )
                )
    return errors
