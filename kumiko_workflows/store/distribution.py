"""Citus: whether the engine's tables are distributed, and the statements that distribute them.

Engine code asks :func:`distributed` (once per database connection), as it
asks the other capability flags of :mod:`~kumiko_workflows.store.db`; on
distributed tables every hot statement names its tenant as a value, for
the coordinator to route it to one shard. The rest are the catalog reads
and calls of ``distribute_workflow_tables``
(:mod:`kumiko_workflows.operations.distribute`) and of its tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kumiko_workflows.models import Event
from kumiko_workflows.store import statement_cache
from kumiko_workflows.store.db import chains_writes, engine
from kumiko_workflows.store.statement_cache import statement


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
    statement_cache._SQL.clear()
    # The hot statements' cursor (store.cursors) was made for tables not
    # distributed, and would go on preparing: the next statement makes another.
    vars(engine()).pop("_kumiko_kept_cursor", None)


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
    Through Django's cursor: nothing is prepared on distributed tables
    (:func:`kumiko_workflows.store.cursors.prepares`).
    """

    def build() -> str:
        table = engine().ops.quote_name(Event._meta.db_table)
        return f"SELECT nextval(pg_get_serial_sequence('{table}', 'id'))"  # noqa: S608

    with engine().cursor() as cursor:
        cursor.execute(statement(("next_event_id",), build))
        (value,) = cursor.fetchone()
        return int(value)


def stream_elsewhere(tenant_id: str, aggregate_id: Any) -> bool:
    """Whether another tenant has a stream with this id (asked of every shard on Citus)."""

    def build() -> str:
        table = engine().ops.quote_name(Event._meta.db_table)
        return (
            f"SELECT 1 FROM {table} WHERE aggregate_id = %s AND version = 1 "  # noqa: S608
            "AND tenant_id <> %s LIMIT 1"
        )

    with engine().cursor() as cursor:
        cursor.execute(statement(("stream_elsewhere",), build), [aggregate_id, tenant_id])
        return cursor.fetchone() is not None


# --- distributing (operations/distribute) --------------------------------------


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
