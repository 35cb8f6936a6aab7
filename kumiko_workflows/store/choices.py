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

import re
from collections.abc import Sequence
from typing import Any

from kumiko_workflows.store.db import atomic, engine
from kumiko_workflows.store.distribution import distributed
from kumiko_workflows.store.statement_cache import statement

#: A name these statements put into SQL text: a quoted or bare identifier,
#: optionally qualified (``"workflow_name"``, ``l0.v1``).
_NAME = re.compile(r'(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_]*)(?:\.[A-Za-z_][A-Za-z0-9_]*)?')


def _ident(text: str) -> str:
    """``text`` if it is an identifier (quoted by the backend, or a CTE's), else ValueError."""
    if not _NAME.fullmatch(text):
        raise ValueError(f"not an SQL identifier: {text!r}")
    return text


def _probe(
    table: str,
    columns: Sequence[str],
    level: int,
    source: str,
    after: bool,
    conditions: Sequence[str],
) -> str:
    """The scalar subquery of level ``level``: the first (or next) value of column ``level``
    under the values of the levels above it, read from CTE ``source``, among the rows
    that meet :func:`_only`'s ``conditions``."""
    column = _ident(columns[level])
    above = "".join(f"{_ident(columns[i])} = {_ident(f'{source}.v{i}')} AND " for i in range(level))
    last = f"{column} > {_ident(f'{source}.v{level}')}" if after else f"{column} IS NOT NULL"
    return (
        f"(SELECT {column} FROM {_ident(table)} WHERE {above}{last}{_only(conditions)} "  # noqa: S608
        f"ORDER BY {column} LIMIT 1)"
    )


def _only(columns: Sequence[str]) -> str:
    """`` AND column = %s`` for each of ``columns`` (quoted): a partial index's condition,
    its values parameters (bound with the values, the plan still matches the index)."""
    return "".join(f" AND {_ident(column)} = %s" for column in columns)


def _loose_scan(
    table: str,
    columns: Sequence[str],
    scoped: bool,
    nullable: bool,
    conditions: Sequence[str] = (),
) -> str:
    """The loose index scan over ``columns`` (an index's leading columns, tenant first),
    among the rows that meet :func:`_only`'s ``conditions``."""
    ctes = []
    for level in range(len(columns)):
        name = _ident(f"l{level}")
        above = _ident(f"l{level - 1}") if level else ""
        keep = "".join(_ident(f"v{i}") + ", " for i in range(level))
        if level == 0 and scoped:
            ctes.append(f"{name}(v0) AS (SELECT %s)")
            continue
        if level == 0:
            first = f"SELECT {_probe(table, columns, 0, '', False, conditions)}"
        else:
            first = (
                f"SELECT {keep}{_probe(table, columns, level, above, False, conditions)} "  # noqa: S608
                f"FROM {above} WHERE {_ident(f'v{level - 1}')} IS NOT NULL"
            )
        step = (
            f"SELECT {keep}{_probe(table, columns, level, name, True, conditions)} "  # noqa: S608
            f"FROM {name} WHERE {_ident(f'v{level}')} IS NOT NULL"
        )
        values = ", ".join(_ident(f"v{i}") for i in range(level + 1))
        ctes.append(f"{name}({values}) AS ({first} UNION ALL {step})")
    last = _ident(f"l{len(columns) - 1}")
    value = _ident(f"v{len(columns) - 1}")
    found = f"SELECT DISTINCT {value} FROM {last} WHERE {value} IS NOT NULL"  # noqa: S608
    if nullable:
        # NULL sorts last on PostgreSQL and first on SQLite, and is never "> v":
        # one probe per parent value for it instead.
        parent = _ident(f"l{len(columns) - 2}")
        same = " AND ".join(
            f"{_ident(columns[i])} = {_ident(f'{parent}.v{i}')}" for i in range(len(columns) - 1)
        )
        found += (
            f" UNION SELECT NULL FROM {parent} WHERE {_ident(f'v{len(columns) - 2}')} "  # noqa: S608
            f"IS NOT NULL AND EXISTS (SELECT 1 FROM {_ident(table)} WHERE {same} "
            f"AND {_ident(columns[-1])} IS NULL{_only(conditions)})"
        )
    # Each CTE and the final select are checked statements of identifiers.
    return "WITH RECURSIVE " + ", ".join(ctes) + " " + found


def distinct_values(
    model: type[Any],
    columns: Sequence[str],
    tenant: str | None = None,
    *,
    nullable: bool = False,
    where: dict[str, Any] | None = None,
) -> list[Any]:
    """The distinct values of the last of ``columns`` among ``model``'s rows (of ``tenant``).

    ``columns`` are the leading columns of one of the table's indexes, the
    tenant's first (``["tenant_id", "workflow_name"]``); ``nullable``: the
    last may be NULL, and None is then among the values if a row has it.
    ``where``: among the rows whose fields have these values only (a
    partial index's condition, ``{"version": 1}``). Sorted, None last.
    """
    conn = engine()
    ops = conn.ops
    table = ops.quote_name(model._meta.db_table)
    quoted = [ops.quote_name(model._meta.get_field(column).column) for column in columns]
    where = where or {}
    conditions = [ops.quote_name(model._meta.get_field(name).column) for name in where]
    if distributed():
        tenant_only = f" AND {_ident(quoted[0])} = %s" if tenant is not None else ""
        sql = (
            f"SELECT DISTINCT {_ident(quoted[-1])} FROM {table} "  # noqa: S608 - identifiers
            f"WHERE TRUE{tenant_only}{_only(conditions)}"
        )
    else:
        key = (model._meta.label, tuple(columns), tenant is not None, nullable, *conditions)
        sql = statement(
            ("distinct_values", *key),
            lambda: _loose_scan(table, quoted, tenant is not None, nullable, conditions),
        )
    with atomic(), conn.cursor() as cursor:
        jit = None
        if conn.vendor == "postgresql":
            # The planner's guess at a recursive query's rows is far above the
            # few probes it makes, enough to compile it (JIT): half a second
            # spent on a query of a few milliseconds. Off for this query alone:
            # a SET LOCAL would last to the end of the caller's transaction.
            cursor.execute("SELECT current_setting('jit'), set_config('jit', 'off', true)")
            jit, _ = cursor.fetchone()
        # The tenant comes first in the text; the condition's values in each probe.
        only = _only(conditions)
        bound = [*where.values()] * (sql.count(only) if only else 0)
        cursor.execute(sql, [*([] if tenant is None else [tenant]), *bound])
        values = [value for (value,) in cursor.fetchall()]
        if jit is not None:
            cursor.execute("SELECT set_config('jit', %s, true)", [jit])
    return sorted(values, key=lambda value: (value is None, value if value is not None else 0))
