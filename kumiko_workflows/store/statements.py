"""The other raw statements: wait look-ups, projection rows, retention, outboxes, deployments.

Wait look-ups, the projections' row writes, retention (purged runs), the run
signals' outbox, the outbox on the site's databases and its relays' records,
and the deployed definitions.

Each is one the ORM cannot say well (a loose index scan, a chained write, a
delete ``Event`` refuses through the ORM), built once per shape through the
statement cache, with identifiers quoted and values as parameters only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

from django.db import connections

from kumiko_workflows.models import (
    DeployedDefinition,
    Event,
    OutboxEntry,
    PurgedRun,
    RelayedAppend,
    SignalDelivery,
    WorkflowChildGroup,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
)
from kumiko_workflows.store.arrays import array_param
from kumiko_workflows.store.cursors import hot_cursor
from kumiko_workflows.store.db import _now_sql, engine
from kumiko_workflows.store.distribution import distributed
from kumiko_workflows.store.field_values import preparer
from kumiko_workflows.store.statement_cache import _instance_of, statement
from kumiko_workflows.store.wake_checks import wait_paths_cte
from kumiko_workflows.workflow.event_types import CALL_AGGREGATE_TYPE, RUN_AGGREGATE_TYPE


def wait_paths(tenant_id: str, event_type: str) -> list[str]:
    """The distinct payload paths waits of the tenant use for ``event_type``.

    A loose index scan over ``kw_waitkey_lookup``: one index probe per
    distinct path, however many runs wait. Each probe is spelled as the
    ordered ``LIMIT 1`` it is, not ``MIN(path)``: on a table never analysed
    PostgreSQL plans ``MIN`` as an aggregate over every key of the event
    type (design rule 12).
    """
    sql = statement(
        ("wait_paths",),
        lambda: (
            f"WITH RECURSIVE {wait_paths_cte(engine().ops)} "  # noqa: S608 - identifiers
            "SELECT path FROM paths WHERE path IS NOT NULL"
        ),
    )
    params: list[Any] = [tenant_id, event_type, tenant_id, event_type]
    with engine().cursor() as cursor:
        cursor.execute(sql, params)
        return [path for (path,) in cursor.fetchall()]


def keyed_events(
    tenant_id: str,
    event_type: str,
    after_id: int,
    offers: Sequence[Any],
    *,
    until: datetime | None,
    taken: Sequence[int],
    engine_types: Sequence[str],
) -> Iterator[Event]:
    """Domain events of the tenant after ``after_id`` whose payload contains one of ``offers``.

    The keyed look-back (PostgreSQL): the candidates come from the payload's
    GIN index (``kw_event_payload_gin``, whose predicate ``engine_types``
    repeats) alone, in a ``MATERIALIZED`` query of their own, and only then
    are they narrowed to the tenant, the type, the range and the excluded
    ids, and ordered. A planner without statistics (a table never analysed)
    takes any btree condition it is offered beside the containment, as the
    driving index (``kw_event_tenant_type_id``: every event of the type
    since ``after_id``) or ANDed to the GIN's bitmap (every event of the
    tenant), however few events contain the keys (design rule 12). So the
    tenant is checked on the candidates, not in the index: a key value many
    tenants' payloads share costs those candidates too (not a single-shard
    statement on Citus). Yields them in id order.
    """
    conn = engine()
    ops = conn.ops
    sharded = distributed()
    shape = (len(offers), until is not None, len(taken), len(engine_types), sharded)

    def build() -> str:
        table = ops.quote_name(Event._meta.db_table)
        columns = ", ".join(ops.quote_name(str(f.column)) for f in Event._meta.concrete_fields)
        contains = " OR ".join(["payload @> %s::jsonb"] * len(offers))
        excluded = ", ".join(["%s"] * len(engine_types))
        narrowed = "tenant_id = %s AND type = %s AND id > %s"
        if until is not None:
            narrowed += " AND created_at <= %s"
        if taken:
            narrowed += f" AND id NOT IN ({', '.join(['%s'] * len(taken))})"
        # Distributed, the tenant goes inside too: it is what routes the
        # statement to the tenant's shard, whose candidates are then only
        # those of the tenants that shard holds.
        own = " AND tenant_id = %s" if sharded else ""
        return (
            f"WITH candidates AS MATERIALIZED (SELECT {columns} FROM {table} "  # noqa: S608
            f"WHERE ({contains}) AND aggregate_type NOT IN ({excluded}){own}) "
            f"SELECT {columns} FROM candidates WHERE {narrowed} ORDER BY id"
        )

    field = Event._meta.get_field("payload")
    params: list[Any] = [
        *(field.get_db_prep_value(offer, conn) for offer in offers),
        *engine_types,
        *([tenant_id] if sharded else []),
        tenant_id,
        event_type,
        after_id,
        *([until] if until is not None else []),
        *taken,
    ]
    with conn.cursor() as cursor:
        cursor.execute(statement(("keyed_events", shape), build), params)
        while rows := cursor.fetchmany(200):
            for row in rows:
                yield _instance_of(Event, row)


# --- projections, resuming, operations -----------------------------------------


#: A write a projection would make for an event, said ahead (see
#: ``ProjectionRegistry.folds``): (model, values, where) of an ``UPDATE``.
Write = tuple[type[Any], dict[str, Any], dict[str, Any]]


def rows_statement(
    model: type[Any],
    verb: str,
    values: dict[str, Any],
    where: dict[str, Any],
    *,
    only_if: str = "",
) -> tuple[str, list[Any]]:
    """``UPDATE`` (``verb``) ``model``'s rows matching ``where`` to ``values``, or ``DELETE``.

    ``where`` is field = value, ANDed; ``only_if``, a name of the ``WITH``
    query the statement is chained to, makes it apply only if that query
    returned a row. Every value is a parameter prepared by its field.
    """
    conn = engine()

    def build() -> str:
        ops = conn.ops
        table = ops.quote_name(model._meta.db_table)
        condition = " AND ".join(
            f"{ops.quote_name(model._meta.get_field(name).column)} = %s" for name in where
        )
        if only_if:
            condition += f" AND EXISTS (SELECT 1 FROM {ops.quote_name(only_if)})"  # noqa: S608
        if verb == "UPDATE":
            assignments = ", ".join(
                f"{ops.quote_name(model._meta.get_field(name).column)} = %s" for name in values
            )
            return f"UPDATE {table} SET {assignments} WHERE {condition}"  # noqa: S608 - identifiers
        return f"DELETE FROM {table} WHERE {condition}"  # noqa: S608 - identifiers

    sql = statement((model._meta.db_table, verb, tuple(values), tuple(where), only_if), build)
    return sql, row_params(model, values, where)


def row_params(model: type[Any], values: dict[str, Any], where: dict[str, Any]) -> list[Any]:
    """The parameters of a :func:`rows_statement` (the values, then the conditions), each
    prepared by its field."""
    key = (model, tuple(values), tuple(where))
    prepare = _PREPARERS.get(key)
    if prepare is None:
        prepare = _PREPARERS[key] = tuple(
            preparer(model._meta.get_field(name)) for name in (*values, *where)
        )
    conn = engine()
    return [
        prep(value, conn)
        for prep, value in zip(prepare, (*values.values(), *where.values()), strict=True)
    ]


def update_rows(
    model: type[Any], names: tuple[str, ...], keys: tuple[str, ...], rows: list[list[Any]]
) -> None:
    """Set each of ``model``'s rows matching a row's ``keys`` to its ``names`` (PostgreSQL).

    Each of ``rows`` is a :func:`row_params` list (the values of ``names``,
    then of ``keys``). One statement for them all, the columns as arrays,
    unless two rows name the same keys: then in order, a statement each,
    pipelined (one statement would give the table's row either's values).
    """
    with hot_cursor() as cursor:
        if len({tuple(row[len(names) :]) for row in rows}) == len(rows):
            columns = [array_param(column) for column in zip(*rows, strict=True)]
            cursor.execute(_update_set(model, names, keys), columns)
        else:
            sql, _ = rows_statement(model, "UPDATE", dict.fromkeys(names), dict.fromkeys(keys))
            cursor.executemany(sql, rows)


def _update_set(model: type[Any], names: tuple[str, ...], keys: tuple[str, ...]) -> str:
    conn = engine()

    def build() -> str:
        ops, meta, width = conn.ops, model._meta, len(names)
        table = ops.quote_name(meta.db_table)
        # The arrays in the order names, keys; each row's values are v0, v1, …
        named = (*names, *keys)
        arrays = ", ".join(f"%s::{_array_of(meta.get_field(name), conn)}" for name in named)
        aliases = ", ".join(ops.quote_name(f"v{index}") for index in range(len(named)))
        assignments = ", ".join(
            f"{ops.quote_name(meta.get_field(name).column)} = v.{ops.quote_name(f'v{index}')}"
            for index, name in enumerate(names)
        )
        condition = " AND ".join(
            f"t.{ops.quote_name(meta.get_field(name).column)} = "
            f"v.{ops.quote_name(f'v{width + index}')}"
            for index, name in enumerate(keys)
        )
        return (
            f"UPDATE {table} AS t SET {assignments} "  # noqa: S608 - identifiers
            f"FROM unnest({arrays}) AS v({aliases}) WHERE {condition}"
        )

    return statement((model._meta.db_table, "UPDATE_SET", names, keys), build)


def _array_of(field: Any, conn: Any) -> str:
    """The type of an array of ``field``'s column (its model's definition, never input)."""
    return f"{field.db_type(conn)}[]"


#: How each value and condition of a :func:`rows_statement` is prepared, per model and
#: names: its field's, found once (the statement runs once per resumed run).
_PREPARERS: dict[tuple[Any, ...], tuple[Callable[[Any, Any], Any], ...]] = {}


def write_rows(model: type[Any], verb: str, values: dict[str, Any], where: dict[str, Any]) -> None:
    """Run :func:`rows_statement`: on the hottest path (a statement per resume) this
    costs a fraction of the ORM's query building, and a plain DELETE skips the
    deletion collector a table nothing cascades from does not need."""
    sql, params = rows_statement(model, verb, values, where)
    with hot_cursor() as cursor:
        cursor.execute(sql, params)


def lock_projection_tables() -> None:
    """Hold off writers to the projections' tables until the transaction ends (rebuild).

    PostgreSQL locks the tables, in the order the projections write them;
    SQLite takes its one write lock with a write that touches no row.
    """
    conn = engine()
    if conn.vendor == "postgresql":
        tables = ", ".join(
            conn.ops.quote_name(model._meta.db_table)
            for model in (WorkflowRun, WorkflowRunPending, WorkflowWaitKey, WorkflowChildGroup)
        )
        with conn.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {tables} IN EXCLUSIVE MODE")
    else:
        WorkflowRunPending.objects.filter(pk=-1).update(step="")


# --- retention (operations/purge, engine/purged_runs) ----------------------


def is_purged(tenant_id: str, run_id: Any) -> bool:
    """Whether a run with this id was purged in this tenant (asked on every run start)."""

    def build() -> str:
        ops = engine().ops
        return (
            f"SELECT 1 FROM {ops.quote_name(PurgedRun._meta.db_table)} "  # noqa: S608
            f"WHERE {ops.quote_name('tenant_id')} = %s AND {ops.quote_name('run_id')} = %s"
        )

    conn = engine()
    with conn.cursor() as cursor:
        cursor.execute(
            statement(("is_purged",), build),
            [tenant_id, PurgedRun._meta.get_field("run_id").get_db_prep_value(run_id, conn)],
        )
        return cursor.fetchone() is not None


def delete_run_streams(
    tenant_id: str, run_ids: Sequence[Any], aggregate_type: str = RUN_AGGREGATE_TYPE
) -> int:
    """Delete the run streams (``workflow-run`` events) of ``run_ids`` in one tenant.

    The only statement that deletes events: ``Event`` refuses it through the
    ORM, and only the purge of finished runs calls this. Returns the count.
    ``aggregate_type="workflow-call"``: the requests of a purged run's
    children (their triggers), which go with it.
    """
    assert aggregate_type in (RUN_AGGREGATE_TYPE, CALL_AGGREGATE_TYPE), aggregate_type
    conn = engine()
    ops = conn.ops
    table = ops.quote_name(Event._meta.db_table)
    sql = (
        f"DELETE FROM {table} WHERE {ops.quote_name('tenant_id')} = %s "  # noqa: S608
        f"AND {ops.quote_name('aggregate_type')} = %s "
        f"AND {ops.quote_name('aggregate_id')} IN ({', '.join(['%s'] * len(run_ids))})"
    )
    field = Event._meta.get_field("aggregate_id")
    params = [tenant_id, aggregate_type, *(field.get_db_prep_value(r, conn) for r in run_ids)]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


# --- the run signals' outbox (engine/transitions) ----------------------------


def add_signal_delivery(event_id: int, tenant_id: str, owner: str) -> None:
    """Write the delivery row of a run event's signal, in the caller's transaction.

    ``leased_at`` is the column's default: the database's clock.
    """

    def build() -> str:
        ops = engine().ops
        return (
            f"INSERT INTO {ops.quote_name(SignalDelivery._meta.db_table)} "  # noqa: S608
            f"({ops.quote_name('event_id')}, {ops.quote_name('tenant_id')}, "
            f"{ops.quote_name('owner')}) VALUES (%s, %s, %s)"
        )

    with hot_cursor() as cursor:
        cursor.execute(statement(("add_signal_delivery",), build), [event_id, tenant_id, owner])


def delete_signal_delivery(tenant_id: str, event_id: int) -> None:
    """Delete a delivery row once its receivers ran (after the commit, in autocommit).

    On PostgreSQL its commit does not wait for the WAL to reach the disk
    (``synchronous_commit`` off for this one transaction): a delete lost in
    a server crash only delivers the signal again, which the promise (at
    least once) allows, and each delivered signal saves a disk flush.
    """
    conn = engine()
    sharded = distributed()

    def build() -> str:
        sql = (
            f"DELETE FROM {conn.ops.quote_name(SignalDelivery._meta.db_table)} "  # noqa: S608
            f"WHERE {conn.ops.quote_name('tenant_id')} = %s "
            f"AND {conn.ops.quote_name('event_id')} = %s"
        )
        if conn.vendor != "postgresql" or sharded:
            return sql  # (distributed: the WITH query would run apart, on the coordinator)
        relax = "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)) "
        return f"{relax}{sql} AND EXISTS (SELECT 1 FROM relaxed)"  # noqa: S608 - identifiers

    with hot_cursor() as cursor:
        cursor.execute(statement(("delete_signal_delivery", sharded), build), [tenant_id, event_id])


# --- the outbox on the site's databases (store/outbox) -------------------------


def has_outbox_table(using: str) -> bool:
    """Whether the database ``using`` has the outbox table (migrated there)."""
    conn = connections[using]
    with conn.cursor() as cursor:
        return OutboxEntry._meta.db_table in conn.introspection.table_names(cursor)


def take_outbox_lock(using: str) -> None:
    """In a transaction on ``using``: hold what keeps two relays of its outbox apart.

    On a database that locks rows (``FOR UPDATE SKIP LOCKED``) nothing: each
    relay locks the rows it takes. On SQLite, the write lock, taken first
    with a write that touches no row (a transaction that reads first and
    writes later cannot wait for the lock; see
    :func:`kumiko_workflows.store.claims._take_write_lock`): relays of one
    file take turns.
    """
    conn = connections[using]
    if conn.features.has_select_for_update:
        return
    with conn.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {conn.ops.quote_name(OutboxEntry._meta.db_table)} WHERE id = -1"  # noqa: S608
        )


def record_relay(relay_id: Any, source: str) -> bool:
    """Record that the outbox row ``relay_id`` of ``source`` is appended; False if it was.

    In the engine's transaction of the append: one statement, which waits
    for a racing relay's uncommitted record of the same row, if any.
    """
    conn = engine()

    def build() -> str:
        table = conn.ops.quote_name(RelayedAppend._meta.db_table)
        return (
            f"INSERT INTO {table} (relay_id, source, relayed_at) "  # noqa: S608
            f"VALUES (%s, %s, {_now_sql(conn, with_params=True)}) "
            "ON CONFLICT (relay_id) DO NOTHING"
        )

    field = RelayedAppend._meta.get_field("relay_id")
    with conn.cursor() as cursor:
        cursor.execute(
            statement(("record_relay",), build), [field.get_db_prep_value(relay_id, conn), source]
        )
        return bool(cursor.rowcount == 1)


def forget_relays(relay_ids: Sequence[Any]) -> None:
    """Delete the records of relayed outbox rows whose deletion has committed (autocommit).

    On PostgreSQL its commit does not wait for the WAL to reach the disk
    (``synchronous_commit`` off for this one statement's transaction, as
    :func:`delete_signal_delivery` does): a record a server crash brings back
    is harmless (its outbox row is gone) and the next pass's sweep deletes it.
    """
    conn = engine()
    table = conn.ops.quote_name(RelayedAppend._meta.db_table)
    marks = ", ".join(["%s"] * len(relay_ids))
    delete = f"DELETE FROM {table} WHERE relay_id IN ({marks})"  # noqa: S608
    if conn.vendor == "postgresql":
        relax = "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)) "
        sql = f"{relax}{delete} AND EXISTS (SELECT 1 FROM relaxed)"  # noqa: S608 - identifiers
    else:
        sql = delete
    field = RelayedAppend._meta.get_field("relay_id")
    with conn.cursor() as cursor:
        cursor.execute(sql, [field.get_db_prep_value(each, conn) for each in relay_ids])


# --- deployed definitions (engine/deploys) -------------------------------------


def register_definitions(rows: Sequence[tuple[str, str, int, dict[str, str]]], by: str) -> None:
    """Record (fingerprint, workflow, version, step fingerprints) rows not yet known.

    First seen on the database's clock, so instants written by processes on
    different hosts compare (a row already there keeps its instant).
    """
    if not rows:
        return
    conn = engine()
    ops = conn.ops
    meta = DeployedDefinition._meta
    # Columns named as the fields are (no db_column).
    names = ("fingerprint", "workflow_name", "workflow_version", "step_fingerprints")
    columns = ", ".join(ops.quote_name(name) for name in (*names, "first_seen_by", "first_seen_at"))
    now = _now_sql(conn, with_params=True)
    values = ", ".join([f"(%s, %s, %s, %s, %s, {now})"] * len(rows))
    sql = (
        f"INSERT INTO {ops.quote_name(meta.db_table)} ({columns}) "  # noqa: S608 - identifiers
        f"VALUES {values} ON CONFLICT ({ops.quote_name('fingerprint')}) DO NOTHING"
    )
    prints = meta.get_field("step_fingerprints")
    params: list[Any] = []
    for fingerprint, name, version, step_prints in rows:
        params += [fingerprint, name, version, prints.get_db_prep_save(step_prints, conn), by]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
