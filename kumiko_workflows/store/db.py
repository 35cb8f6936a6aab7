"""The database layer: the engine's connection, every raw statement, and the vendors' differences.

The engine's tables live on the database alias ``KUMIKO_WORKFLOWS["DATABASE"]``
(default ``"default"``): :func:`engine` is its connection and :func:`atomic`
its transactions; the ORM reaches it through
:class:`kumiko_workflows.routers.WorkflowsRouter`. Every statement the ORM
cannot say well is built here, once per shape, in one statement cache
(:func:`statement`), with identifiers quoted and values as parameters only.
Capability flags stand for the databases' differences, so engine code asks
"can writers overlap?" instead of naming a vendor.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from django.core.signals import setting_changed
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.dispatch import receiver

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.event_types import RUN_AGGREGATE_TYPE
from kumiko_workflows.models import (
    DeployedDefinition,
    Event,
    PurgedRun,
    SignalDelivery,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
)

try:
    import psycopg
except ImportError:  # a site on SQLite need not have it
    psycopg = None  # type: ignore[assignment]

logger = logging.getLogger("kumiko_workflows.db")

_alias: str | None = None


def alias() -> str:
    """The database alias the engine's tables live on (``KUMIKO_WORKFLOWS["DATABASE"]``).

    Read once and again whenever the settings change (``setting_changed``,
    as ``override_settings`` sends): every statement asks for it.
    """
    global _alias
    if _alias is None:
        _alias = str(workflow_settings.DATABASE)
    return _alias


#: Bumped when the settings change, so that kept cursors are made again (see
#: :func:`_kept_cursor`).
_settings_generation = 0


@receiver(setting_changed)
def _forget(setting: str, **kwargs: Any) -> None:
    global _alias, _settings_generation
    if setting in ("KUMIKO_WORKFLOWS", "DATABASES"):
        _alias = None
        _settings_generation += 1
        _SQL.clear()


def engine() -> BaseDatabaseWrapper:
    """The engine's connection (this thread's, for :func:`alias`)."""
    return connections[alias()]


def atomic(*, savepoint: bool = True) -> transaction.Atomic:
    """A transaction (or savepoint) on the engine's database."""
    return transaction.atomic(using=alias(), savepoint=savepoint)


def on_commit(func: Callable[[], Any], *, robust: bool = False) -> None:
    """Run ``func`` once the engine's current transaction commits."""
    transaction.on_commit(func, using=alias(), robust=robust)


def _in_transaction(conn: BaseDatabaseWrapper) -> bool:
    """Whether ``conn`` has a transaction open (an atomic block, or autocommit turned off)."""
    return conn.in_atomic_block or (conn.connection is not None and not conn.autocommit)


def foreign_transaction() -> str | None:
    """The alias of another database with a transaction open here, if the engine's has none.

    A write of the engine's made then would commit at once, outside that
    transaction: the caller would have a transaction the engine's writes are
    not part of. Reads only this thread's connection state (no SQL), and
    only connections this thread has opened: another cannot be in a
    transaction.
    """
    if len(connections.settings) == 1:
        return None  # one database: every transaction is the engine's (asked on every append)
    own = engine()
    if _in_transaction(own):
        return None
    for conn in connections.all(initialized_only=True):
        if conn.alias != own.alias and _in_transaction(conn):
            return str(conn.alias)
    return None


def set_rollback(rollback: bool) -> None:
    transaction.set_rollback(rollback, using=alias())


def overlapping_writers() -> bool:
    """Whether two transactions can write at once (PostgreSQL), or one at a time (SQLite).

    With one writer at a time, a transaction sees every committed row and no
    other write can be in flight: a wake-up decided inside it is final.
    """
    return engine().vendor != "sqlite"


def listens() -> bool:
    """Whether a worker can LISTEN for rows that become due (PostgreSQL's NOTIFY)."""
    return engine().vendor == "postgresql"


def database_file() -> str | None:
    """The file the engine's database is, if one file on this host holds it (SQLite).

    None for a server (PostgreSQL) and for an in-memory SQLite database,
    which no other process can open.
    """
    db = engine()
    if db.vendor != "sqlite" or db.is_in_memory_db():  # type: ignore[attr-defined]
        return None
    name = str(db.settings_dict["NAME"])
    if name.startswith("file:"):  # a URI filename (OPTIONS "uri": True)
        name = name.removeprefix("file:").split("?", 1)[0]
    return os.path.abspath(name)


def described() -> str:
    """The engine's database for a worker's start line: alias, vendor, where.

    Never a user or a password: the line goes to logs others read.
    """
    db = engine()
    settings = db.settings_dict
    if db.vendor == "sqlite":
        where = f"file={database_file() or 'memory'}"
    else:
        host = settings.get("HOST") or "local socket"
        port = settings.get("PORT")
        where = f"name={settings.get('NAME')} host={host}{f':{port}' if port else ''}"
    return f"database={alias()} vendor={db.vendor} {where}"


def has_payload_containment() -> bool:
    """Whether ``payload @> {...}`` is served by an index (PostgreSQL's GIN)."""
    return engine().vendor == "postgresql"


def chains_writes() -> bool:
    """Whether one statement can chain writes (a data-modifying ``WITH``: PostgreSQL)."""
    return engine().vendor == "postgresql"


def chains_inserts() -> bool:
    """Whether two appends can ride in one statement (PostgreSQL, not distributed).

    On Citus the second insert of a chain reads the first's row from a
    ``WITH`` query, which names no shard: the chain would go through the
    coordinator. Distributed, each append is a statement of its own shard.
    """
    return chains_writes() and not distributed()


#: Per database alias: the driver connection it was asked on, and whether the
#: engine's tables are distributed there (see :func:`distributed`).
_DISTRIBUTED: dict[str, tuple[Any, bool]] = {}

#: The tables :func:`distributed` asks about: the event table, which the others
#: are co-located with (``distribute_workflow_tables``).
DISTRIBUTION_TABLE = Event._meta.db_table


def distributed() -> bool:
    """Whether the engine's tables are distributed by tenant (Citus), on this connection.

    Then every statement of a hot path names its tenant as a value, for
    the coordinator to route it to one shard, and event ids are drawn from
    the coordinator's sequence before the insert that uses them (see
    :func:`next_event_id`). Asked once per driver connection (two catalog
    reads), so a process connecting after ``distribute_workflow_tables``
    ran sees it; plain PostgreSQL and SQLite answer False.
    """
    conn = engine()
    if conn.vendor != "postgresql":
        return False
    conn.ensure_connection()
    known = _DISTRIBUTED.get(conn.alias)
    if known is not None and known[0] is conn.connection:
        return known[1]
    answer = citus_tables().get(DISTRIBUTION_TABLE) == "distributed"
    _DISTRIBUTED[conn.alias] = (conn.connection, answer)
    return answer


def forget_distribution() -> None:
    """Ask :func:`distributed` again on the next statement (the tables were just distributed)."""
    _DISTRIBUTED.clear()
    _SQL.clear()


def has_citus() -> bool:
    """Whether the engine's database has the citus extension (PostgreSQL only)."""
    conn = engine()
    if conn.vendor != "postgresql":
        return False
    with conn.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
        return cursor.fetchone() is not None


def citus_tables() -> dict[str, str]:
    """Citus's kind of each table it knows (``distributed``, ``reference``, ``local``), by name.

    Empty where Citus is not installed.
    """
    if not has_citus():
        return {}
    with engine().cursor() as cursor:
        cursor.execute(
            "SELECT logicalrelid::regclass::text, CASE WHEN partmethod = 'h' THEN 'distributed' "
            "WHEN repmodel = 't' THEN 'reference' ELSE 'local' END FROM pg_dist_partition"
        )
        return {str(name).strip('"'): str(kind) for name, kind in cursor.fetchall()}


def next_event_id() -> int:
    """A new event id from the event table's sequence (distributed: on the coordinator).

    On Citus, an insert that reads the table it writes (``INSERT ...
    SELECT``) is executed on the worker that holds the shard, and a
    sequence's default would be drawn there, from that worker's own range:
    ids would stop being the append order. So the id is drawn here first,
    from the coordinator's sequence, as a plain PostgreSQL insert draws it.
    """

    def build() -> str:
        return f"SELECT nextval(pg_get_serial_sequence('{DISTRIBUTION_TABLE}', 'id'))"

    with hot_cursor() as cursor:
        cursor.execute(statement(("next_event_id",), build))
        (value,) = cursor.fetchone()
        return int(value)


def wait_paths(tenant_id: str, event_type: str) -> list[str]:
    """The distinct payload paths waits of the tenant use for ``event_type``.

    A loose index scan over ``kw_waitkey_lookup``: one index probe per
    distinct path, however many runs wait. Each probe is spelled as the
    ordered ``LIMIT 1`` it is, not ``MIN(path)``: on a table never analysed
    PostgreSQL plans ``MIN`` as an aggregate over every key of the event
    type (design rule 12).
    """
    table = engine().ops.quote_name(WorkflowWaitKey._meta.db_table)
    sql = f"""
        WITH RECURSIVE paths(path) AS (
            SELECT (
                SELECT k.path FROM {table} k WHERE k.tenant_id = %s AND k.event_type = %s
                ORDER BY k.path LIMIT 1
            )
            UNION ALL
            SELECT (
                SELECT k.path FROM {table} k
                WHERE k.tenant_id = %s AND k.event_type = %s AND k.path > p.path
                ORDER BY k.path LIMIT 1
            )
            FROM paths p WHERE p.path IS NOT NULL
        )
        SELECT path FROM paths WHERE path IS NOT NULL
    """  # noqa: S608 - the table name comes from the model; values are parameters
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


_SQL: dict[tuple[Any, ...], str] = {}


def statement(key: tuple[Any, ...], build: Callable[[], str]) -> str:
    """The statement ``build`` makes for ``key``, built once per key and database."""
    full = (alias(), *key)
    sql = _SQL.get(full)
    if sql is None:
        sql = _SQL[full] = build()
    return sql


def _instance_of(model: type[Any], values: Sequence[Any]) -> Any:
    """An instance of ``model`` from its concrete columns' raw values, as the ORM would load it.

    The converters (JSON text to objects, SQLite's timestamps, ...) are the
    ones a query's compiler would apply, found once per model and vendor
    (only the columns that have any).
    """
    conn = engine()
    key = (conn.vendor, model._meta.label)
    converters = _CONVERTERS.get(key)
    if converters is None:
        converters = []
        for index, field in enumerate(model._meta.concrete_fields):
            col = field.get_col(model._meta.db_table)
            found = conn.ops.get_db_converters(col) + col.get_db_converters(conn)
            if found:
                converters.append((index, col, found))
        _CONVERTERS[key] = converters
    row = list(values)
    for index, col, found in converters:
        for convert in found:
            row[index] = convert(row[index], col, conn)
    return model.from_db(conn.alias, None, row)


_CONVERTERS: dict[tuple[str, str], list[tuple[int, Any, list[Any]]]] = {}


#: The workflows a worker claims runs of (None: every workflow): ``resume_due_runs
#: --queue`` limits a worker to some task queues' workflows (kumiko_workflows.tasks).
claim_only: ContextVar[tuple[str, ...] | None] = ContextVar("kumiko_claim_only", default=None)


@contextmanager
def claiming_only(workflow_names: Sequence[str] | None) -> Iterator[None]:
    """Claim only runs of ``workflow_names`` inside the block (None: every workflow)."""
    token = claim_only.set(None if workflow_names is None else tuple(sorted(workflow_names)))
    try:
        yield
    finally:
        claim_only.reset(token)


def claim_due(
    tenant_id: str, now: datetime, passed_over: set[int], leaving: Collection[str] = ()
) -> tuple[WorkflowRunPending, Event | None] | None:
    """Take the tenant's next due pending row that nobody holds (oldest first), or None.

    The row is deleted as it is taken (a resume ends its suspension) and
    returned with its run's trigger event (None if that event is gone): on
    PostgreSQL one statement, the worker's hottest, locking the row with
    ``FOR UPDATE SKIP LOCKED`` so racing workers never take the same one; on
    SQLite, whose one writer at a time needs no lock, a read and a delete.
    Built once per shape (no ORM compilation per claim). ``passed_over``
    rows (errors in this pass) are not taken again, nor rows of the
    ``leaving`` definitions (newer code than this process's: see
    :mod:`kumiko_workflows.engine.deploys`).
    """
    skip = sorted(passed_over)
    foreign = sorted(leaving)
    only = claim_only.get() or ()
    pending, event = WorkflowRunPending._meta, Event._meta
    width = len(pending.concrete_fields)
    chained = chains_writes()

    def build() -> str:
        ops = engine().ops
        table = ops.quote_name(pending.db_table)
        pending_fields, event_fields = pending.concrete_fields, event.concrete_fields
        row_columns = ", ".join(f"c.{ops.quote_name(str(f.column))}" for f in pending_fields)
        returned = ", ".join(ops.quote_name(str(f.column)) for f in pending_fields)
        event_columns = ", ".join(f"e.{ops.quote_name(str(f.column))}" for f in event_fields)
        alias = "" if chained else "c."
        where = f"{alias}tenant_id = %s AND {alias}wake_at <= %s"
        if skip:
            where += f" AND {alias}id NOT IN ({', '.join(['%s'] * len(skip))})"
        if foreign:
            marks = ", ".join(["%s"] * len(foreign))
            where += f" AND {alias}definition_fingerprint NOT IN ({marks})"
        if only:
            where += f" AND {alias}workflow_name IN ({', '.join(['%s'] * len(only))})"
        if chained:
            # Every table named with the tenant as a value, the DELETE's too:
            # one shard's statement on Citus (its planner routes a statement
            # by the distribution column's values, not by a join's).
            join = (
                f"LEFT JOIN {ops.quote_name(event.db_table)} e "
                "ON e.id = c.trigger_event_id AND e.tenant_id = %s"
            )
            return (
                f"WITH c AS (DELETE FROM {table} WHERE tenant_id = %s AND id = ("  # noqa: S608
                f"SELECT id FROM {table} WHERE {where} ORDER BY wake_at, id LIMIT 1 "
                f"FOR UPDATE SKIP LOCKED) RETURNING {returned}) "
                f"SELECT {row_columns}, {event_columns} FROM c {join}"
            )
        join = (
            f"LEFT JOIN {ops.quote_name(event.db_table)} e "
            "ON e.id = c.trigger_event_id AND e.tenant_id = c.tenant_id"
        )
        return (
            f"SELECT {row_columns}, {event_columns} FROM {table} c {join} "  # noqa: S608
            f"WHERE {where} ORDER BY c.wake_at, c.id LIMIT 1"
        )

    sql = statement(("claim_due", len(skip), len(foreign), len(only)), build)
    params: list[Any] = [tenant_id, now, *skip, *foreign, *only]
    with hot_cursor() as cursor:
        if not chained:
            _take_write_lock(cursor)
        cursor.execute(sql, [tenant_id, *params, tenant_id] if chained else params)
        found = cursor.fetchone()
        if found is not None and not chained:
            delete = statement(
                ("claim_due_delete",),
                lambda: (
                    f"DELETE FROM {engine().ops.quote_name(pending.db_table)} "  # noqa: S608
                    "WHERE id = %s"
                ),
            )
            cursor.execute(delete, [found[0]])
    if found is None:
        return None
    row = _instance_of(WorkflowRunPending, found[:width])
    trigger = None if found[width] is None else _instance_of(Event, found[width:])
    return row, trigger


def _take_write_lock(cursor: CursorWrapper) -> None:
    """Take SQLite's write lock now, with a write that touches no row.

    A transaction that reads first and writes later cannot wait for the lock
    another process's write holds: SQLite fails it at once with "database is
    locked" (waiting could deadlock). Taking the lock first waits instead,
    up to the connection's ``timeout``. (Once it is held, this is a no-op.)
    """
    cursor.execute(
        statement(
            ("write_lock",),
            lambda: (
                f"DELETE FROM {engine().ops.quote_name(WorkflowRunPending._meta.db_table)} "  # noqa: S608
                "WHERE id = -1"
            ),
        )
    )


# --- appending events ---------------------------------------------------------

#: The columns an append writes, in its statements' order (the version goes last).
EVENT_COLUMNS = (
    "tenant_id",
    "aggregate_id",
    "aggregate_type",
    "type",
    "event_version",
    "payload",
    "metadata",
    "created_by",
    "created_at",
)


def insert_event_sql(shape: str) -> str:
    """The append's INSERT for ``shape`` (see :func:`_build_insert`), built once per shape."""
    return statement(("insert_event", shape), lambda: _build_insert(shape))


def insert_pair_sql(folded: tuple[str, ...] = ()) -> str:
    """Two chained appends in one statement (see :func:`_build_pair`).

    ``folded`` are statements chained after them (each built with
    ``after="second"``: they apply only if both events were written).
    """
    return statement(("insert_pair", folded), lambda: _build_pair(folded))


def _build_insert(shape: str) -> str:
    """One INSERT that picks (or checks) the version and never raises on a refusal.

    ``ON CONFLICT DO NOTHING`` makes a taken version "no row returned" instead
    of an error, so no savepoint is needed to keep the caller's transaction
    usable. The stream's identity rides in the same statement, by ``shape``:

    - ``after`` (an expected version): that event exists in this tenant with
      this aggregate type (no gap; and each append checking the one before
      keeps the first event's type);
    - ``next`` (the next version) and ``new`` (expected version 0): no first
      event with this id has another tenant or another aggregate type;
    - ``new_engine`` (an engine stream's first event): none. Run and schedule
      ids are derived from their tenant, so another tenant's stream with such
      an id is its own (there only to block this one); the version decides.

    Each check is one more subquery for the planner, not a round trip; the
    one across tenants uses ``kw_event_stream_head``. ``after``, the shape of
    the engine's own appends, checks no more than the gap check did before.
    """
    table = engine().ops.quote_name(Event._meta.db_table)
    columns = ", ".join(engine().ops.quote_name(c) for c in (*EVENT_COLUMNS, "version"))
    placeholders = ", ".join(["%s"] * len(EVENT_COLUMNS))
    stream = "tenant_id = %s AND aggregate_id = %s"
    version = "%s"
    if shape == "next":
        # Not MAX(version): PostgreSQL plans that as this very index probe,
        # after planning the aggregate first.
        version = (
            f"COALESCE((SELECT version FROM {table} WHERE {stream} "  # noqa: S608
            "ORDER BY version DESC LIMIT 1), 0) + 1"
        )
    if shape == "after":
        condition = (
            f"EXISTS (SELECT 1 FROM {table} WHERE {stream} "  # noqa: S608
            "AND version = %s AND aggregate_type = %s)"
        )
    else:
        condition = (
            f"NOT EXISTS (SELECT 1 FROM {table} WHERE aggregate_id = %s "  # noqa: S608
            "AND version = 1 AND (tenant_id <> %s OR aggregate_type <> %s))"
        )
    insert = f"INSERT INTO {table} ({columns})"  # noqa: S608
    conflict = "ON CONFLICT (tenant_id, aggregate_id, version) DO NOTHING RETURNING id, version"
    if shape == "new_engine":
        return f"{insert} VALUES ({placeholders}, {version}) {conflict}"
    return f"{insert} SELECT {placeholders}, {version} WHERE {condition} {conflict}"


def sharded_insert_sql(shape: str) -> str:
    """The append's INSERT on distributed tables (Citus), one shard's statement, for ``shape``.

    The id is a parameter (:func:`next_event_id`), first of all. Where the
    plain shapes test the stream with a subquery (which Citus can only run
    through the coordinator), these read the stream's row in the ``FROM``
    of the insert, naming the tenant, so Citus pushes the whole statement
    down to the shard:

    - ``after``: the expected version exists in this tenant with this
      aggregate type (no gap, and the stream's type kept);
    - ``next``: after the stream's latest event of this aggregate type (no
      row: the stream is new, has another type, or moved: see the caller);
    - ``first``: version 1, a plain ``VALUES`` insert. That no other
      tenant's stream has the id is asked once it is written, by
      :func:`stream_elsewhere` (a question for every shard, once per stream).
    """
    return statement(("sharded_insert", shape), lambda: _build_sharded_insert(shape))


def _build_sharded_insert(shape: str) -> str:
    ops = engine().ops
    table = ops.quote_name(Event._meta.db_table)
    columns = ", ".join(ops.quote_name(c) for c in ("id", *EVENT_COLUMNS, "version"))
    conflict = "ON CONFLICT (tenant_id, aggregate_id, version) DO NOTHING RETURNING id, version"
    insert = f"INSERT INTO {table} ({columns})"  # noqa: S608 - identifiers
    if shape == "first":
        placeholders = ", ".join(["%s"] * (len(EVENT_COLUMNS) + 2))
        return f"{insert} VALUES ({placeholders}) {conflict}"
    # The tenant comes from the row read (p.tenant_id): that is what lets
    # Citus see the insert and its read on one shard.
    values = ", ".join(["%s"] * (len(EVENT_COLUMNS) - 1))
    stream = "p.tenant_id = %s AND p.aggregate_id = %s AND p.aggregate_type = %s"
    if shape == "after":
        return (
            f"{insert} SELECT %s, p.tenant_id, {values}, %s FROM {table} p "  # noqa: S608
            f"WHERE {stream} AND p.version = %s {conflict}"
        )
    return (
        f"{insert} SELECT %s, p.tenant_id, {values}, p.version + 1 FROM {table} p "  # noqa: S608
        f"WHERE {stream} ORDER BY p.version DESC LIMIT 1 {conflict}"
    )


def stream_elsewhere(tenant_id: str, aggregate_id: Any) -> bool:
    """Whether another tenant has a stream with this id (asked of every shard on Citus)."""

    def build() -> str:
        table = engine().ops.quote_name(Event._meta.db_table)
        return (
            f"SELECT 1 FROM {table} WHERE aggregate_id = %s AND version = 1 "  # noqa: S608
            "AND tenant_id <> %s LIMIT 1"
        )

    with hot_cursor() as cursor:
        cursor.execute(statement(("stream_elsewhere",), build), [aggregate_id, tenant_id])
        return cursor.fetchone() is not None


def _build_pair(folded: tuple[str, ...]) -> str:
    """Two chained inserts (PostgreSQL): the second only if the first was written."""
    table = engine().ops.quote_name(Event._meta.db_table)
    columns = ", ".join(engine().ops.quote_name(c) for c in (*EVENT_COLUMNS, "version"))
    placeholders = ", ".join(["%s"] * (len(EVENT_COLUMNS) + 1))
    conflict = "ON CONFLICT (tenant_id, aggregate_id, version) DO NOTHING RETURNING id, version"
    insert = f"INSERT INTO {table} ({columns})"  # noqa: S608 - identifiers
    previous = (
        f"EXISTS (SELECT 1 FROM {table} WHERE tenant_id = %s AND aggregate_id = %s "  # noqa: S608
        "AND version = %s AND aggregate_type = %s)"
    )
    return (
        f"WITH first AS ({insert} SELECT {placeholders} WHERE {previous} {conflict}), "  # noqa: S608
        f"second AS ({insert} SELECT {placeholders} FROM first {conflict}) "
        + "".join(f", folded_{i} AS ({sql})" for i, sql in enumerate(folded))
        + " SELECT id, version FROM first UNION ALL SELECT id, version FROM second"
    )


def run_insert(
    sql: str, params: list[Any], conn: BaseDatabaseWrapper | None = None
) -> list[tuple[Any, ...]]:
    """Execute an insert on the hot cursor of ``conn`` (the engine's); its (id, version) rows."""
    with hot_cursor(conn) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


@contextmanager
def hot_cursor(db: BaseDatabaseWrapper | None = None) -> Iterator[CursorWrapper]:
    """A cursor for a hot statement on ``db`` (default: the engine's); see :func:`_kept_cursor`."""
    cursor, kept = _kept_cursor(db or engine())
    try:
        yield cursor
    finally:
        if not kept:
            cursor.close()


def _kept_cursor(db: BaseDatabaseWrapper) -> tuple[CursorWrapper, bool]:
    """Django's cursor for the hot statements on ``db``, and whether it is kept open.

    The hot statements are the ones run per append and per resumed run: the
    appends' inserts, the worker's claim and the projections' row writes.
    Opening and closing a cursor per statement cost about a tenth of an
    append. The cursor is wrapped as Django wraps its own (execute wrappers,
    query logging and error translation all apply), kept on the connection
    wrapper while the driver connection, the query logging and the settings
    it was made for stay the same. Where :func:`prepares` says so, and
    queries are not being logged (``DEBUG``, ``assertNumQueries``: the log
    shows each statement with its values, which a prepared one does not
    give), it prepares what it runs again (:class:`_PreparingCursor`).
    Every call still does what ``db.cursor()`` does before it opens one:
    the health check, connecting (which refuses in async code and where
    tests block the database) and the thread check. A connection whose
    ``cursor`` is wrapped on the instance (the debug toolbar, a tracer, a
    test forbidding queries) or that threads share gets Django's plain
    cursor each time, closed after use.
    """
    attributes = vars(db)
    if "cursor" in attributes or db.allow_thread_sharing:
        return db.cursor(), False
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    logged = db.queries_logged
    made_for = (db.connection, logged, _settings_generation)
    kept = attributes.get("_kumiko_kept_cursor")
    if kept is not None and kept[0] == made_for:
        return kept[1], True
    if prepares(db) and not logged:
        cursor = db.make_cursor(_PreparingCursor(db.connection))
    else:
        cursor = db.cursor()
    attributes["_kumiko_kept_cursor"] = (made_for, cursor)
    return cursor, True


def prepares(db: BaseDatabaseWrapper) -> bool:
    """Whether the hot statements are prepared on ``db``'s connection.

    On PostgreSQL through psycopg 3, unless ``PREPARED_STATEMENTS`` is off
    or the database is set up for a transaction-pooling PgBouncer
    (``DISABLE_SERVER_SIDE_CURSORS``, as Django documents for it), which
    could hand a prepared statement's next run to a server connection that
    does not know it.
    """
    return (
        psycopg is not None
        and isinstance(db.connection, psycopg.Connection)
        and bool(workflow_settings.PREPARED_STATEMENTS)
        and not db.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
    )


#: psycopg 3's cursor, where it is installed (a site on SQLite need not have it).
_DriverCursor: Any = object if psycopg is None else psycopg.Cursor


class _PreparingCursor(_DriverCursor):
    """A psycopg cursor that binds on the server and prepares a statement it runs again.

    A statement's first run on a connection is sent as it is; from its
    second on, it is prepared there once (psycopg keeps the names, and
    drops them all after a rollback or DDL) and then only executed, which
    skips the parse and, once PostgreSQL settles on a generic plan after
    five runs, the planning: most of a hot statement's server time. A
    statement run once per connection (a web request's one append on a
    fresh connection) costs no extra round trip.

    psycopg prepares nothing on a connection whose ``prepare_threshold`` is
    None, Django's default (its own cursors bind on the client and never
    prepare): the first of these cursors on such a connection sets it to a
    count no statement reaches, so that still only what these cursors ask
    for is prepared.

    A pooler that does not keep prepared statements with their session
    (PgBouncer before 1.21 in transaction mode) shows itself by refusing
    one: "prepared statement "_pg3_0" already exists" (another client's, on
    the server connection this transaction got) or "... does not exist"
    (ours is on another). The first such refusal on a connection turns
    preparing off on it for good, with one warning per process naming the
    setting; the statement is then sent again unprepared where nothing was
    lost, that is, outside a transaction block. Inside one, the refused
    statement has aborted the transaction, which only a savepoint taken
    before it could have saved, and one before every prepared run would
    cost every site a subtransaction per statement: the error propagates,
    and :func:`lost_prepared_statement` tells it apart, for the engine's
    appends to run again at their own savepoint.
    """

    def __init__(self, connection: Any) -> None:
        if connection.prepare_threshold is None:
            connection.prepare_threshold = _NEVER
        super().__init__(connection)
        self._seen: set[Any] = set()
        self.preparing = True

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, **kwargs: Any
    ) -> Any:
        seen = query in self._seen
        if not seen:
            self._seen.add(query)
        if not self.preparing:
            prepare = False
        elif prepare is None:
            prepare = seen
        if not prepare:
            return super().execute(query, params, prepare=prepare, **kwargs)
        try:
            return super().execute(query, params, prepare=True, **kwargs)
        except _POOLER_REFUSALS as exc:
            self._stop_preparing(exc)
            if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                raise
        return super().execute(query, params, prepare=False, **kwargs)

    def _stop_preparing(self, exc: Exception) -> None:
        global _warned_about_pooler
        self.preparing = False
        if not _warned_about_pooler:
            _warned_about_pooler = True
            logger.warning(
                "the database refused a prepared statement (%s): a pooler in transaction "
                "mode? Nothing more is prepared on this connection; set "
                "KUMIKO_WORKFLOWS['PREPARED_STATEMENTS'] = False (or DATABASES "
                "DISABLE_SERVER_SIDE_CURSORS = True) for such a pooler",
                str(exc).strip(),
            )


#: What a pooler that loses prepared statements makes the server say (see
#: :class:`_PreparingCursor`).
_POOLER_REFUSALS: tuple[type[Exception], ...] = (
    ()
    if psycopg is None
    else (psycopg.errors.DuplicatePreparedStatement, psycopg.errors.InvalidSqlStatementName)
)

#: Whether this process has said once that a pooler refused a prepared statement.
_warned_about_pooler = False


def lost_prepared_statement(exc: BaseException) -> bool:
    """Whether ``exc`` (as Django raised it) is a pooler's refusal of a prepared statement.

    The connection prepares nothing more (:class:`_PreparingCursor`), so
    the work whose transaction (or savepoint) it aborted can run again.
    """
    return isinstance(exc, _POOLER_REFUSALS) or isinstance(exc.__cause__, _POOLER_REFUSALS)


#: A prepare threshold no statement reaches (see :class:`_PreparingCursor`).
_NEVER = 2**62


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
    after: str = "",
) -> tuple[str, list[Any]]:
    """``UPDATE`` (``verb``) ``model``'s rows matching ``where`` to ``values``, or ``DELETE``.

    ``where`` is field = value, ANDed; ``after``, a name of the ``WITH``
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
        if after:
            condition += f" AND EXISTS (SELECT 1 FROM {ops.quote_name(after)})"  # noqa: S608
        if verb == "UPDATE":
            assignments = ", ".join(
                f"{ops.quote_name(model._meta.get_field(name).column)} = %s" for name in values
            )
            return f"UPDATE {table} SET {assignments} WHERE {condition}"  # noqa: S608 - identifiers
        return f"DELETE FROM {table} WHERE {condition}"  # noqa: S608 - identifiers

    sql = statement((model._meta.db_table, verb, tuple(values), tuple(where), after), build)
    params = [
        model._meta.get_field(name).get_db_prep_save(value, conn)
        for name, value in (*values.items(), *where.items())
    ]
    return sql, params


def write_rows(model: type[Any], verb: str, values: dict[str, Any], where: dict[str, Any]) -> None:
    """Run :func:`rows_statement`: on the hottest path (a statement per resume) this
    costs a fraction of the ORM's query building, and a plain DELETE skips the
    deletion collector a table nothing cascades from does not need."""
    sql, params = rows_statement(model, verb, values, where)
    with hot_cursor() as cursor:
        cursor.execute(sql, params)


def notify(channel: str, payload: str) -> None:
    """``NOTIFY channel`` at commit where the database has it (PostgreSQL); else nothing."""
    conn = engine()
    if conn.vendor == "postgresql":
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def listen(channel: str) -> Any:
    """A new autocommit connection (psycopg) LISTENing on ``channel`` (PostgreSQL only)."""
    import psycopg  # only PostgreSQL deployments have it
    from psycopg import sql

    conn = engine()
    conn.ensure_connection()
    params = conn.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    listener = psycopg.connect(**params, autocommit=True)
    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return listener


def lock_projection_tables() -> None:
    """Hold off writers to the projections' tables until the transaction ends (rebuild).

    PostgreSQL locks the tables, in the order the projections write them;
    SQLite takes its one write lock with a write that touches no row.
    """
    conn = engine()
    if conn.vendor == "postgresql":
        tables = ", ".join(
            conn.ops.quote_name(model._meta.db_table)
            for model in (WorkflowRun, WorkflowRunPending, WorkflowWaitKey)
        )
        with conn.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {tables} IN EXCLUSIVE MODE")
    else:
        WorkflowRunPending.objects.filter(pk=-1).update(step="")


def due_tenants(now: datetime) -> list[str]:
    """Tenants that have at least one due row: :func:`due_backlog`, each counted up to 1."""
    return [tenant for tenant, due in due_backlog(now, 1) if due]


def due_backlog(now: datetime, cap: int) -> list[tuple[str, int]]:
    """Due pending rows per tenant that has pending rows, each counted up to ``cap``.

    A loose index scan on ``kw_pending_due`` (tenant_id, wake_at) finds the
    tenants, one index probe each however many rows they have; each tenant's
    count reads only its due range of the index, never its rows due later.
    The worker asks which tenants have due rows (``cap`` 1); the due-backlog
    gauge (:mod:`kumiko_workflows.telemetry`) how many. Distributed (Citus),
    the same scan runs in each shard (:func:`_due_backlog_per_shard`).
    """
    if distributed():
        return _due_backlog_distributed(now, cap)

    def build() -> str:
        table = engine().ops.quote_name(WorkflowRunPending._meta.db_table)
        return _backlog_sql(table, "%s", "%s")

    with engine().cursor() as cursor:
        cursor.execute(statement(("due_backlog",), build), [now, cap])
        return [(tenant, int(count)) for tenant, count in cursor.fetchall()]


def _backlog_sql(table: str, now: str, cap: str) -> str:
    """The backlog's loose index scan over ``table`` (``now``, ``cap``: SQL for the values)."""
    return f"""
            WITH RECURSIVE tenants(tenant_id) AS (
                SELECT MIN(tenant_id) FROM {table}
                UNION ALL
                SELECT (SELECT MIN(p.tenant_id) FROM {table} p WHERE p.tenant_id > t.tenant_id)
                FROM tenants t WHERE t.tenant_id IS NOT NULL
            )
            SELECT t.tenant_id, (
                SELECT COUNT(*) FROM (
                    SELECT 1 FROM {table} d
                    WHERE d.tenant_id = t.tenant_id AND d.wake_at <= {now} LIMIT {cap}
                ) due
            )
            FROM tenants t WHERE t.tenant_id IS NOT NULL
        """  # noqa: S608 - the table name comes from the model; values are parameters


def _due_backlog_grouped(now: datetime, cap: int) -> list[tuple[str, int]]:
    """:func:`due_backlog` as one grouped count (Citus pushes it down to each shard)."""

    def build() -> str:
        table = engine().ops.quote_name(WorkflowRunPending._meta.db_table)
        return (
            "SELECT tenant_id, LEAST(COUNT(*) FILTER (WHERE wake_at <= %s), %s) "  # noqa: S608
            f"FROM {table} GROUP BY tenant_id ORDER BY tenant_id"
        )

    with engine().cursor() as cursor:
        cursor.execute(statement(("due_backlog_grouped",), build), [now, cap])
        return [(tenant, int(count)) for tenant, count in cursor.fetchall()]


def _due_backlog_distributed(now: datetime, cap: int) -> list[tuple[str, int]]:
    """:func:`due_backlog` on distributed tables (Citus): the same scan in every shard.

    Citus refuses a recursive query over a distributed table unless it
    names one shard, so the loose index scan runs in each shard of the
    pending table (``run_command_on_shards``, in parallel, each returning
    its tenants as JSON); a tenant lives in one shard, so nothing is
    counted twice. The instant and the cap are written into the command as
    literals, from a datetime and an int only.

    ``run_command_on_shards`` works on connections of its own, which cannot
    see what the caller's open transaction wrote: inside one, a grouped
    count that Citus pushes down to every shard answers instead (it reads
    each pending row, not only the due range).
    """
    if engine().in_atomic_block:
        return _due_backlog_grouped(now, cap)
    if not isinstance(now, datetime) or isinstance(cap, bool) or not isinstance(cap, int):
        raise TypeError("due_backlog takes a datetime and an int")
    instant = now.astimezone(UTC).isoformat()  # digits, '-', ':', '.', '+', 'T' only
    scan = _backlog_sql("%1$s", f"'{instant}'::timestamptz", str(int(cap)))
    command = (
        "WITH backlog(tenant_id, due) AS ("  # noqa: S608 - a model's table, literals checked
        f"{scan}) SELECT COALESCE(json_agg(json_build_array(tenant_id, due)), '[]') FROM backlog"
    )
    table = WorkflowRunPending._meta.db_table
    rows: list[tuple[str, int]] = []
    with engine().cursor() as cursor:
        cursor.execute(
            "SELECT success, result FROM run_command_on_shards(%s::regclass, %s)", [table, command]
        )
        for success, result in cursor.fetchall():
            if not success:
                raise RuntimeError(f"the due backlog could not be read from a shard: {result}")
            rows.extend((str(tenant), int(due)) for tenant, due in json.loads(result))
    return sorted(rows)


#: The database's clock, as Django's ``Now()`` reads it (the statement's
#: instant on PostgreSQL, not the transaction's; UTC text to the millisecond
#: on SQLite): what heartbeats, signal leases and registered definitions are
#: written with, and what :func:`database_now` reads.
_NOW_SQL = {
    "postgresql": "STATEMENT_TIMESTAMP()",
    "sqlite": "STRFTIME('%Y-%m-%d %H:%M:%f', 'now')",
}


def _now_sql(conn: BaseDatabaseWrapper, *, with_params: bool) -> str:
    """The clock's SQL expression for ``conn`` (``%`` doubled in a statement with parameters)."""
    sql = _NOW_SQL.get(conn.vendor, "CURRENT_TIMESTAMP")
    return sql.replace("%", "%%") if with_params else sql


def database_now() -> datetime:
    """The engine's database's clock now: the one clock of instants other processes wrote.

    Workers write their heartbeats with ``Now()`` (this clock), and their
    age is judged on it too, so no process's own clock, however far it is
    off, makes a dead worker look alive or a live one dead.
    """
    conn = engine()
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT {_now_sql(conn, with_params=False)}")
        (value,) = cursor.fetchone()
    if isinstance(value, str):  # SQLite: UTC as text
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def connection_broken() -> bool:
    """Whether the engine's database connection itself is gone (not just a failed statement)."""
    raw = engine().connection
    return raw is None or bool(getattr(raw, "closed", False))


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


def delete_run_streams(tenant_id: str, run_ids: Sequence[Any]) -> int:
    """Delete the run streams (``workflow-run`` events) of ``run_ids`` in one tenant.

    The only statement that deletes events: ``Event`` refuses it through the
    ORM, and only the purge of finished runs calls this. Returns the count.
    """
    conn = engine()
    ops = conn.ops
    table = ops.quote_name(Event._meta.db_table)
    sql = (
        f"DELETE FROM {table} WHERE {ops.quote_name('tenant_id')} = %s "  # noqa: S608
        f"AND {ops.quote_name('aggregate_type')} = %s "
        f"AND {ops.quote_name('aggregate_id')} IN ({', '.join(['%s'] * len(run_ids))})"
    )
    field = Event._meta.get_field("aggregate_id")
    params = [tenant_id, RUN_AGGREGATE_TYPE, *(field.get_db_prep_value(r, conn) for r in run_ids)]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


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
        cursor.execute(
            statement(("delete_signal_delivery", sharded), build), [tenant_id, event_id]
        )


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


# --- distribution (Citus: operations/distribute) -------------------------------


def table_has_rows(table: str) -> bool:
    """Whether ``table`` (a model's) holds any row."""
    with engine().cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {engine().ops.quote_name(table)} LIMIT 1")  # noqa: S608
        return cursor.fetchone() is not None


def primary_key_columns(table: str) -> list[str]:
    """The columns of ``table``'s primary key constraint, in order."""
    conn = engine()
    with conn.cursor() as cursor:
        found = conn.introspection.get_constraints(cursor, table)
    for info in found.values():
        if info["primary_key"]:
            return list(info["columns"])
    return []


def distribute_table(
    table: str, column: str, *, colocate_with: str, shard_count: int | None, online: bool
) -> None:
    """Distribute ``table`` by ``column`` (Citus), co-located with ``colocate_with``.

    ``online``: ``create_distributed_table_concurrently``, which lets reads
    and writes go on while the rows are copied (it cannot run inside a
    transaction block); else ``create_distributed_table``, which holds
    writes off while it copies (instant on an empty table).
    """
    function = "create_distributed_table_concurrently" if online else "create_distributed_table"
    arguments = "%s::regclass, %s, colocate_with => %s"
    params: list[Any] = [table, column, colocate_with]
    if shard_count is not None:
        arguments += ", shard_count => %s"
        params.append(int(shard_count))
    with engine().cursor() as cursor:
        cursor.execute(f"SELECT {function}({arguments})", params)
    forget_distribution()


def shard_placements(table: str) -> list[tuple[int, str, int]]:
    """(shard id, node name, node port) of each placement of ``table``'s shards."""
    with engine().cursor() as cursor:
        cursor.execute(
            "SELECT shardid, nodename, nodeport FROM citus_shards "
            "WHERE table_name = %s::regclass ORDER BY shardid",
            [table],
        )
        return [(int(shard), str(name), int(port)) for shard, name, port in cursor.fetchall()]


def colocation_ids(tables: Sequence[str]) -> dict[str, int]:
    """Citus's co-location group of each of ``tables`` that it distributes."""
    with engine().cursor() as cursor:
        cursor.execute(
            "SELECT logicalrelid::regclass::text, colocationid FROM pg_dist_partition "
            "WHERE logicalrelid::regclass::text = ANY(%s)",
            [list(tables)],
        )
        return {str(name): int(group) for name, group in cursor.fetchall()}
