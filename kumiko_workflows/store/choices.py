"""The distinct values of a column, read as a loose index scan: the admin's filter choices.

Django's list filters read ``SELECT DISTINCT column`` over the whole table,
which on a store of a million runs or ten million events is a scan of all
of it on every page. Here the values are read from an index that leads
with the tenant and then the column (``kw_run_workflow_version``,
``kw_event_tenant_type_id``, ...): a recursive ``WITH`` query steps from
one value to the next, one ordered ``LIMIT 1`` probe of the index each
(not ``MIN``, which PostgreSQL plans as an aggregate over the rows on a
table never analysed). So the cost is the number of distinct (tenant,
value) pairs, whatever the number of rows.

On Citus the tables are distributed by tenant, and a recursive query over
every tenant names no shard: there the plain ``DISTINCT`` runs, which the
coordinator pushes down to each shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kumiko_workflows.store.db import atomic, engine
from kumiko_workflows.store.distribution import distributed
from kumiko_workflows.store.statement_cache import statement


def _probe(table: str, columns: Sequence[str], level: int, source: str, after: bool) -> str:
    """The scalar subquery of level ``level``: the first (or next) value of column ``level``
    under the values of the levels above it, read from CTE ``source``."""
    column = columns[level]
    where = [f"{columns[i]} = {source}.v{i}" for i in range(level)]
    where.append(f"{column} > {source}.v{level}" if after else f"{column} IS NOT NULL")
    return (
        f"(SELECT {column} FROM {table} WHERE {' AND '.join(where)} "  # noqa: S608 - identifiers
        f"ORDER BY {column} LIMIT 1)"
    )


def _loose_scan(
    table: str, columns: Sequence[str], scoped: bool, nullable: bool, newest: str = ""
) -> str:
    """The loose index scan over ``columns`` (an index's leading columns, tenant first).

    ``newest``: instead of the last column's values, column ``newest`` of
    the newest row (by ``id``, the index's next column) of each distinct tuple.
    """
    ctes = []
    for level in range(len(columns)):
        name, above = f"l{level}", f"l{level - 1}"
        kept = ", ".join(f"v{i}" for i in range(level))
        keep = f"{kept}, " if kept else ""
        if level == 0 and scoped:
            ctes.append(f"{name}(v0) AS (SELECT %s)")
            continue
        if level == 0:
            first = f"SELECT {_probe(table, columns, 0, '', False)}"
        else:
            first = (
                f"SELECT {keep}{_probe(table, columns, level, above, False)} "  # noqa: S608
                f"FROM {above} WHERE v{level - 1} IS NOT NULL"
            )
        step = (
            f"SELECT {keep}{_probe(table, columns, level, name, True)} "  # noqa: S608
            f"FROM {name} WHERE v{level} IS NOT NULL"
        )
        values = ", ".join(f"v{i}" for i in range(level + 1))
        ctes.append(f"{name}({values}) AS ({first} UNION ALL {step})")
    last = len(columns) - 1
    found = f"SELECT DISTINCT v{last} FROM l{last} WHERE v{last} IS NOT NULL"  # noqa: S608
    if newest:
        same = " AND ".join(f"{columns[i]} = l{last}.v{i}" for i in range(last + 1))
        found = (
            f"SELECT DISTINCT (SELECT {newest} FROM {table} WHERE {same} "  # noqa: S608
            f"ORDER BY id DESC LIMIT 1) FROM l{last} WHERE v{last} IS NOT NULL"
        )
    if nullable:
        # NULL sorts last on PostgreSQL and first on SQLite, and is never "> v":
        # one probe per parent value for it instead.
        parent = f"l{last - 1}"
        same = " AND ".join(f"{columns[i]} = {parent}.v{i}" for i in range(last))
        found += (
            f" UNION SELECT NULL FROM {parent} WHERE v{last - 1} IS NOT NULL AND EXISTS "  # noqa: S608
            f"(SELECT 1 FROM {table} WHERE {same} AND {columns[last]} IS NULL)"
        )
    return f"WITH RECURSIVE {', '.join(ctes)} {found}"


def distinct_values(
    model: type[Any],
    columns: Sequence[str],
    tenant: str | None = None,
    *,
    nullable: bool = False,
    newest: str = "",
) -> list[Any]:
    """The distinct values of the last of ``columns`` among ``model``'s rows (of ``tenant``).

    ``columns`` are the leading columns of one of the table's indexes, the
    tenant's first (``["tenant_id", "workflow_name"]``); ``nullable``: the
    last may be NULL, and None is then among the values if a row has it.
    ``newest``: the values of that column instead, on the newest row (by
    ``id``, which must follow ``columns`` in the index) of each distinct
    tuple of ``columns``. Sorted, None last.
    """
    conn = engine()
    ops = conn.ops
    table = ops.quote_name(model._meta.db_table)
    quoted = [ops.quote_name(model._meta.get_field(column).column) for column in columns]
    wanted = ops.quote_name(model._meta.get_field(newest).column) if newest else ""
    if distributed():
        where = f" WHERE {quoted[0]} = %s" if tenant is not None else ""
        shown = wanted or quoted[-1]
        sql = f"SELECT DISTINCT {shown} FROM {table}{where}"  # noqa: S608 - identifiers
    else:
        key = (model._meta.label, tuple(columns), tenant is not None, nullable, newest)
        sql = statement(
            ("distinct_values", *key),
            lambda: _loose_scan(table, quoted, tenant is not None, nullable, wanted),
        )
    with atomic(), conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            # The planner's guess at a recursive query's rows is far above the
            # few probes it makes, enough to compile it (JIT): half a second
            # spent on a query of a few milliseconds.
            cursor.execute("SET LOCAL jit = off")
        cursor.execute(sql, [] if tenant is None else [tenant])
        values = [value for (value,) in cursor.fetchall()]
    return sorted(values, key=lambda value: (value is None, value if value is not None else 0))
