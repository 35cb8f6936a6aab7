"""Spreading the engine's tables over Citus worker nodes, by tenant.

Every tenant table is hash-distributed by ``tenant_id`` and co-located with
the event table, so all of one tenant's rows live in one shard group on one
worker and every hot statement (append, wake-up, claim, resume) names that
one shard. The tables without a tenant (worker heartbeats, deployed
definitions, relayed appends) and the outbox (which lives on the site's
other databases) stay plain tables on the coordinator, where every client
connects. :func:`distribute` is ``manage.py distribute_workflow_tables``;
:func:`undistributed` is what system check ``W140`` reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import models

from kumiko_workflows.exceptions import InvalidArgument
from kumiko_workflows.models import (
    DeployedDefinition,
    Event,
    LimitSlot,
    OutboxEntry,
    PurgedRun,
    RateSlot,
    RelayedAppend,
    RunDay,
    SignalDelivery,
    TaskAttempt,
    WakeCheck,
    WorkerHeartbeat,
    WorkflowChildGroup,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
)
from kumiko_workflows.store import db, distribution

#: The column every tenant table is distributed by.
DISTRIBUTION_COLUMN = "tenant_id"

#: The tenant tables, the event table first: the others are co-located with it.
TENANT_MODELS: tuple[type[models.Model], ...] = (
    Event,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
    WakeCheck,
    PurgedRun,
    SignalDelivery,
    TaskAttempt,
    LimitSlot,
    RateSlot,
    WorkflowChildGroup,
    RunDay,
)

#: Tables without a tenant: plain tables on the coordinator, never distributed.
LOCAL_MODELS: tuple[type[models.Model], ...] = (WorkerHeartbeat, DeployedDefinition, RelayedAppend)

#: Tables with a tenant that stay plain tables on the coordinator all the same:
#: the outbox lives on the site's other aliases (``OUTBOX_DATABASES``, never the
#: engine's own), so its table on the engine's database holds no rows; its
#: ``relay_id`` is unique on its own, which a distributed table cannot be.
OFF_ENGINE_MODELS: tuple[type[models.Model], ...] = (OutboxEntry,)


class NotDistributable(InvalidArgument):
    """The engine's database cannot take distributed tables."""


@dataclass
class TableLayout:
    """One table: what it should be on Citus, what it is, and what was done."""

    table: str
    wanted: str  # "distributed" or "local"
    current: str  # "distributed", "reference", "local" (Citus's own) or "plain"
    action: str = ""

    @property
    def done(self) -> bool:
        if self.wanted == "local":
            return self.current in ("plain", "local")
        return self.current == "distributed"


def layout() -> list[TableLayout]:
    """Each engine table's wanted and current kind (Citus must be installed)."""
    kinds = distribution.citus_tables()
    rows = [
        TableLayout(m._meta.db_table, "distributed", kinds.get(m._meta.db_table, "plain"))
        for m in TENANT_MODELS
    ]
    rows += [
        TableLayout(m._meta.db_table, "local", kinds.get(m._meta.db_table, "plain"))
        for m in LOCAL_MODELS
    ]
    return rows


def citus_problem() -> str | None:
    """Why the engine's database cannot take distributed tables, or None."""
    conn = db.engine()
    if conn.vendor != "postgresql":
        return f"the engine's database ({db.database_description()}) is not PostgreSQL"
    if not distribution.has_citus():
        return (
            f"the engine's database ({db.database_description()}) has no citus extension: "
            "connect to a Citus coordinator, with the extension installed in this database"
        )
    return None


def undistributed() -> list[str]:
    """Tenant tables a Citus database does not distribute yet (empty elsewhere)."""
    if citus_problem() is not None:
        return []
    return [row.table for row in layout() if row.wanted == "distributed" and not row.done]


def distribute(
    *,
    shard_count: int | None = None,
    online: bool | None = None,
    progress: Callable[[TableLayout], None] | None = None,
) -> list[TableLayout]:
    """Distribute the tenant tables by tenant, co-located with the event table (idempotent).

    A table that holds rows is distributed online
    (``create_distributed_table_concurrently``: reads and writes go on
    while its rows move) unless ``online`` is False; an empty one at once.
    ``shard_count`` (default: Citus's ``citus.shard_count``) applies to the
    event table's group, which the others join. Must run outside a
    transaction. Raises :class:`NotDistributable` on a database that is not
    a Citus coordinator, or whose keys lack the tenant (not migrated).
    """
    problem = citus_problem()
    if problem is not None:
        raise NotDistributable(f"cannot distribute the workflow tables: {problem}")
    if shard_count is not None and (isinstance(shard_count, bool) or shard_count < 1):
        raise InvalidArgument(f"shard_count must be a positive integer, got {shard_count!r}")
    if db.engine().in_atomic_block:
        raise NotDistributable("distribute the workflow tables outside a transaction")
    for model in TENANT_MODELS:
        table = model._meta.db_table
        if DISTRIBUTION_COLUMN not in distribution.primary_key_columns(table):
            raise NotDistributable(
                f"the primary key of {table} lacks {DISTRIBUTION_COLUMN}: run "
                "`manage.py migrate kumiko_workflows` first"
            )
    anchor = Event._meta.db_table
    rows = layout()
    for row in rows:
        if row.wanted == "local":
            row.action = "kept on the coordinator" if row.done else f"left as {row.current}"
        elif row.current == "distributed":
            row.action = "already distributed"
        elif row.current != "plain":
            raise NotDistributable(
                f"{row.table} is a Citus {row.current} table: undistribute it "
                "(undistribute_table) and run this again"
            )
        else:
            moving = distribution.table_has_rows(row.table) if online is None else online
            distribution.distribute_table(
                row.table,
                DISTRIBUTION_COLUMN,
                colocate_with="default" if row.table == anchor else anchor,
                shard_count=shard_count if row.table == anchor else None,
                online=moving,
            )
            row.current = "distributed"
            row.action = "distributed online" if moving else "distributed"
        if progress is not None:
            progress(row)
    distribution.forget_distribution()
    return rows
