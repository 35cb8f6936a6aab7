"""The statements that append events: one INSERT per stream shape, two appends chained in one."""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from kumiko_workflows.models import (
    Event,
    WorkflowRunPending,
)
from kumiko_workflows.store.cursors import hot_cursor
from kumiko_workflows.store.db import engine
from kumiko_workflows.store.statement_cache import statement

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


def insert_pair_sql(folded: tuple[str, ...] = (), claim: tuple[str, str] | None = None) -> str:
    """Two chained appends in one statement (see :func:`_build_pair`).

    ``folded`` are statements chained after them (each built with
    ``only_if="second"``: they apply only if both events were written).
    ``claim``, a worker's claim of its batch's next row (the ``DELETE`` and
    the select list of :class:`~kumiko_workflows.store.claims.NextClaim`),
    rides in it too; each row returned then leads with 0 (an event: id,
    version) or 1 (the claimed row's columns after two NULLs).
    """
    return statement(("insert_pair", folded, claim), lambda: _build_pair(folded, claim))


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
    - ``next``: after the stream's latest event of this aggregate type whose
      id is below the one drawn (no row: the stream is new, has another
      type, or moved: see the caller). The id is drawn before the statement
      reads the stream, so an append committed in between may hold the
      latest version with a higher id: then the version after the one read
      is taken, nothing is written, and the caller draws again, so ids stay
      in version order;
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
        f"WHERE {stream} AND p.id < %s ORDER BY p.version DESC LIMIT 1 {conflict}"
    )


def _build_pair(folded: tuple[str, ...], claim: tuple[str, str] | None = None) -> str:
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
    chain = (
        f"WITH first AS ({insert} SELECT {placeholders} WHERE {previous} {conflict}), "  # noqa: S608
        f"second AS ({insert} SELECT {placeholders} FROM first {conflict}) "
        + "".join(f", folded_{i} AS ({sql})" for i, sql in enumerate(folded))
    )
    if claim is None:
        return chain + " SELECT id, version FROM first UNION ALL SELECT id, version FROM second"  # noqa: S608
    delete, claimed = claim
    width = len(WorkflowRunPending._meta.concrete_fields) + len(Event._meta.concrete_fields)
    nulls = ", ".join(["NULL"] * width)
    # The claim's branch first: its typed columns type the events' NULLs.
    # chain, delete and claimed are statements built of identifiers and
    # placeholders (here and in store.claims), joined as they are.
    events = (
        f" UNION ALL SELECT 0, id, version, {nulls} FROM first"  # noqa: S608 - identifiers
        f" UNION ALL SELECT 0, id, version, {nulls} FROM second"
    )
    return chain + ", c AS (" + delete + ") SELECT 1, NULL, NULL, " + claimed + events


def batch_pairs_sql() -> str:
    """The insert of a worker batch's closing pairs (:mod:`kumiko_workflows.store.batch_writes`).

    One statement for every run's two events, the columns as arrays: each
    row written only after its stream's expected version (of the same
    aggregate type), as a run's own append checks (an index probe a row,
    whatever the table's size or statistics), and a version taken left
    out; returns (id, aggregate_id as text, version) of each row written. The rows
    are inserted in the arrays' order (``ORDER BY`` their ordinal, whatever
    the plan of the check): so the ids follow the versions within a stream,
    and the batch's runs in the order they were claimed. The payloads and
    the metadata each go as one JSON array's text (the documents joined),
    not as a text array: the driver would escape every quote of every
    document on the client.
    """

    def build() -> str:
        ops = engine().ops
        table = ops.quote_name(Event._meta.db_table)
        columns = ", ".join(ops.quote_name(c) for c in (*EVENT_COLUMNS, "version"))
        documents = (
            "ARRAY(SELECT d.j FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS d(j, n) "
            "ORDER BY d.n)"
        )
        return (
            f"INSERT INTO {table} ({columns}) "  # noqa: S608 - identifiers
            "SELECT x.c0, x.c1, x.c2, x.c3, x.c4, x.c5, x.c6, x.c7, x.c8, x.c9 "
            # EVENT_COLUMNS as arrays, the version, and the stream's before the pair.
            "FROM unnest(%s::text[], %s::uuid[], %s::text[], %s::text[], %s::int[], "
            f"{documents}, {documents}, "
            "%s::text[], %s::timestamptz[], %s::int[], %s::int[]) "
            "WITH ORDINALITY AS x(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, n) "
            # The check is a probe of the stream's version per row (LATERAL … LIMIT 1
            # is never turned into a join): an EXISTS lets the planner hash the
            # whole event table, which it picks while the table is small and a
            # prepared statement keeps as the table grows.
            f"CROSS JOIN LATERAL (SELECT 1 FROM {table} p WHERE p.tenant_id = x.c0 "
            "AND p.aggregate_id = x.c1 AND p.version = x.c10 AND p.aggregate_type = x.c2 "
            "LIMIT 1) AS prior "
            "ORDER BY x.n "
            "ON CONFLICT (tenant_id, aggregate_id, version) DO NOTHING "
            # The stream as text, as row_values names it.
            "RETURNING id, aggregate_id::text, version"
        )

    return statement(("batch_pairs",), build)


def run_insert(
    sql: str, params: list[Any], conn: BaseDatabaseWrapper | None = None
) -> list[tuple[Any, ...]]:
    """Execute an insert on the hot cursor of ``conn`` (the engine's); its (id, version) rows."""
    with hot_cursor(conn) as cursor:
        cursor.execute(sql, params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows
