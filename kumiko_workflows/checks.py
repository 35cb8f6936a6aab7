"""System checks for settings and workflow definitions (``kumiko_workflows.E0xx``)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.core import checks
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.operations import CreateModel

from kumiko_workflows.conf import DEFAULTS, import_callable, workflow_settings
from kumiko_workflows.models import OutboxEntry
from kumiko_workflows.operations.cutoff import retention_problem
from kumiko_workflows.operations.distribute import undistributed
from kumiko_workflows.store.event_checks import name_problem
from kumiko_workflows.store.outbox import aliases
from kumiko_workflows.store.statements import has_outbox_table
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
    switches = (
        (
            "REUSE_PURGED_KEYS",
            "E028",
            "False (the default) keeps a purged run's idempotency key used.",
        ),
        (
            "PREPARED_STATEMENTS",
            "E029",
            "True (the default) prepares the engine's hot statements on PostgreSQL; "
            "False behind a pooler that cannot keep prepared statements.",
        ),
        (
            "BATCH_TOGETHER",
            "E030",
            "True (the default) claims a batch's rows together and writes their runs' last "
            "events together; False claims each row when its turn comes.",
        ),
    )
    for key, number, hint in switches:
        value = getattr(workflow_settings, key)
        if not isinstance(value, bool):
            errors.append(
                checks.Error(
                    f"KUMIKO_WORKFLOWS[{key!r}] must be True or False, got {value!r}.",
                    hint=hint,
                    id=f"kumiko_workflows.{number}",
                )
            )
    errors.extend(_weight_problems(workflow_settings.TENANT_WEIGHTS))
    head_start = workflow_settings.PRIORITY_HEAD_START
    if isinstance(head_start, timedelta):
        head_start = head_start.total_seconds()
    if isinstance(head_start, bool) or not isinstance(head_start, int | float) or head_start < 0:
        errors.append(
            checks.Error(
                "KUMIKO_WORKFLOWS['PRIORITY_HEAD_START'] must be a number of seconds >= 0 "
                f"(or a timedelta), got {workflow_settings.PRIORITY_HEAD_START!r}.",
                hint="The head start of priority 100; 0 turns priorities off. The default is "
                f"{DEFAULTS['PRIORITY_HEAD_START']!r}.",
                id="kumiko_workflows.E116",
            )
        )
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
    errors.extend(_outbox_problems(settings))
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


def _outbox_problems(settings: Any) -> list[checks.CheckMessage]:
    """``OUTBOX_DATABASES``: a list of the site's aliases, not the engine's (``E055``, ``E056``)."""
    value = workflow_settings.OUTBOX_DATABASES
    hint = (
        'A list of DATABASES aliases of the site\'s own databases, e.g. ["default"]; each '
        "gets its outbox table from manage.py migrate --database ALIAS."
    )
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, list | tuple):
        return [
            checks.Error(
                f"KUMIKO_WORKFLOWS['OUTBOX_DATABASES'] must be a list of database aliases, "
                f"got {value!r}.",
                hint=hint,
                id="kumiko_workflows.E055",
            )
        ]
    errors: list[checks.CheckMessage] = []
    for alias in value:
        if not isinstance(alias, str) or alias not in settings.DATABASES:
            errors.append(
                checks.Error(
                    f"KUMIKO_WORKFLOWS['OUTBOX_DATABASES'] names {alias!r}, which is not a key "
                    "of DATABASES.",
                    hint=f"Name one of: {', '.join(sorted(settings.DATABASES))}.",
                    id="kumiko_workflows.E055",
                )
            )
        elif alias == workflow_settings.DATABASE:
            errors.append(
                checks.Error(
                    f"KUMIKO_WORKFLOWS['OUTBOX_DATABASES'] names {alias!r}, the engine's own "
                    "database (KUMIKO_WORKFLOWS['DATABASE']): an append in a transaction there "
                    "is part of it already, and that outbox would never be used.",
                    hint="List only the aliases of the site's other databases.",
                    id="kumiko_workflows.E056",
                )
            )
    return errors


@checks.register("kumiko_workflows", checks.Tags.database)
def check_outbox_tables(
    app_configs: Any = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The outbox table on each listed alias among ``databases`` that is migrated (``E057``).

    An alias whose kumiko_workflows migrations are not all applied is left
    to ``migrate`` (which runs this check first, and must not be stopped by
    it); one where they are, without the table (a router of the site's kept
    it off, or ``migrate --fake``), would fail every append made in its
    transactions.
    """
    errors: list[checks.CheckMessage] = []
    table = OutboxEntry._meta.db_table
    for alias in aliases():
        if alias not in (databases or ()) or alias not in connections.settings:
            continue
        if has_outbox_table(alias):
            continue
        executor = MigrationExecutor(connections[alias])
        targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP]
        if executor.migration_plan(targets):
            continue  # migrations to apply: migrate creates the table
        before = _before_outbox(executor)
        errors.append(
            checks.Error(
                f"KUMIKO_WORKFLOWS['OUTBOX_DATABASES'] names {alias!r}, where kumiko_workflows' "
                f"migrations are applied but its outbox table {table!r} is missing: every "
                f"append inside a transaction on {alias!r} would fail.",
                hint=f"Let your DATABASE_ROUTERS allow migrating kumiko_workflows' OutboxEntry "
                f"on {alias!r} (kumiko_workflows.routers.WorkflowsRouter does), then run "
                f"manage.py migrate {APP} {before} --fake --database {alias} and manage.py "
                f"migrate {APP} --database {alias}.",
                id="kumiko_workflows.E057",
            )
        )
    return errors


APP = "kumiko_workflows"


def _before_outbox(executor: Any) -> str:
    """The name of the migration before the one that creates the outbox table."""
    for (app, _), migration in executor.loader.disk_migrations.items():
        creates = any(
            isinstance(op, CreateModel) and op.name == "OutboxEntry" for op in migration.operations
        )
        if app == APP and creates:
            return str(next(name for each, name in migration.dependencies if each == APP))
    return "zero"


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


@checks.register("kumiko_workflows", checks.Tags.database)
def check_distribution(
    app_configs: Any = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W140: the engine's database is a Citus coordinator whose tenant tables are not distributed.

    A database check (``manage.py check --database default``, and
    ``migrate``'s): it reads the catalog.
    """
    alias = workflow_settings.DATABASE
    if not databases or alias not in databases:
        return []
    from django.db import DatabaseError

    try:
        missing = undistributed()
    except DatabaseError:
        return []  # an unreachable database is not this check's to report
    if not missing:
        return []
    return [
        checks.Warning(
            f"The database {alias!r} has Citus, but {len(missing)} workflow table(s) are not "
            f"distributed: {', '.join(missing)}.",
            hint="Run `manage.py distribute_workflow_tables` (after migrate): until then every "
            "row lives on the coordinator, and hot statements are not routed to one shard.",
            id="kumiko_workflows.W140",
        )
    ]
