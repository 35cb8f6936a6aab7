"""Hot queries keep their plans on tables never analysed (PostgreSQL, design rule 12).

The server here runs with autovacuum off, and a site's tables right after a
bulk load have no statistics either. The awaited append's wake-up lookup,
the worker's claim and the look-back must then cost what they cost after
``ANALYZE``. Each test works in a freshly migrated database of its own
(the bench's scratch database), where no table was ever analysed, with
10,000 runs waiting (and 800, where the old wake-up join went quadratic),
bulk-inserted as copies of one real run's rows.

No timing is asserted: the work is counted as the tuples the statements
read from the engine's tables and indexes in the measuring transaction
(``pg_stat_get_xact_tuples_returned`` / ``_fetched``), which is exact and
the same on every machine. A plan that goes wrong on missing statistics
reads every waiting row (or, as the wake-up lookup did, every key once per
waiting row); a good one reads a handful whatever the size.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from kumiko_bench.scratch import ScratchDatabase
from kumiko_workflows import append_event, run_id_for
from kumiko_workflows.engine import wakeups
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending, WorkflowWaitKey
from kumiko_workflows.store import claims

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TENANT = "unanalysed"
#: Below this many rows a table never analysed is estimated at a few rows.
SMALL = 1_000
#: The template run's user: replaced by ``user-<i>`` in its copies.
TEMPLATE_USER = "template-user"


def _table(model: type[Any]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _copy_rows(
    model: type[Any], count: int, where: str, replaced: dict[str, str], params: list[Any]
) -> None:
    """Insert, for each i in 1..count, a copy of ``model``'s rows matching ``where``.

    ``replaced`` maps a column to the SQL expression of its copy (``t`` is the
    template row, ``g.i`` the copy's number); the id is left to the sequence.
    """
    columns = [f.column for f in model._meta.concrete_fields if f.column != "id"]
    values = ", ".join(replaced.get(c, f"t.{c}") for c in columns)
    table = _table(model)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608 - names from _meta
            f"SELECT {values} FROM {table} t, generate_series(1, %s) g(i) WHERE {where}",
            [count, *params],
        )


def seed_waiting_runs(count: int) -> int:
    """``count`` runs of ``t-event`` waiting for ``user-<i>``, and as many unrelated events.

    One run is started through ``append_event`` (the real engine); its run
    stream, status row, pending row and wait key are copied with another
    run id and user. ``count`` ``t.verified`` events of other users follow, so
    a look-back from the runs' triggers has that many events of its type to
    pass over. Returns the id of the runs' trigger event.
    """
    trigger = append_event(
        uuid.uuid4(),
        "test-source",
        "t.signed-up",
        {"run_key": "template", "user_id": TEMPLATE_USER, "timeout": "P7D"},
        tenant_id=TENANT,
    )
    run_id = run_id_for("t-event", "template", TENANT)
    copy_id = "md5(t.run_id::text || g.i)::uuid"
    user = f"replace(t.{{}}::text, '{TEMPLATE_USER}', 'user-' || g.i)::jsonb"
    _copy_rows(
        Event,
        count,
        "t.tenant_id = %s AND t.aggregate_id = %s",
        {
            "aggregate_id": "md5(t.aggregate_id::text || g.i)::uuid",
            "payload": user.format("payload"),
        },
        [TENANT, run_id],
    )
    _copy_rows(
        WorkflowRun,
        count,
        "t.run_id = %s",
        {"run_id": copy_id, "idempotency_key": "t.idempotency_key || g.i"},
        [run_id],
    )
    _copy_rows(
        WorkflowRunPending,
        count,
        "t.run_id = %s",
        {"run_id": copy_id, "match_expr": user.format("match_expr")},
        [run_id],
    )
    _copy_rows(
        WorkflowWaitKey,
        count,
        "t.run_id = %s",
        {"run_id": copy_id, "value": "'\"user-' || g.i || '\"'"},
        [run_id],
    )
    verified = append_event(
        uuid.uuid4(), "user", "t.verified", {"user_id": "nobody-0"}, tenant_id=TENANT
    )
    _copy_rows(
        Event,
        count,
        "t.id = %s",
        {
            "aggregate_id": "md5(t.aggregate_id::text || g.i)::uuid",
            "payload": "jsonb_build_object('user_id', 'nobody-' || g.i)",
        },
        [verified.id],
    )
    assert WorkflowRunPending.objects.filter(tenant_id=TENANT).count() == count + 1
    return trigger.id


def engine_relations() -> list[int]:
    """The oids of the engine's tables and of their indexes."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.oid FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE %s "
            "UNION ALL SELECT i.indexrelid FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
            "WHERE c.relname LIKE %s",
            ["kumiko_workflows_%", "kumiko_workflows_%"],
        )
        return [oid for (oid,) in cursor.fetchall()]


def tuples_read(oids: list[int]) -> int:
    """Tuples this transaction has read so far from ``oids`` (scans and index fetches)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(SUM(pg_stat_get_xact_tuples_returned(o) "
            "+ pg_stat_get_xact_tuples_fetched(o)), 0) FROM unnest(%s::oid[]) o",
            [oids],
        )
        return int(cursor.fetchone()[0])


def work(action: Callable[[], Any]) -> int:
    """The tuples ``action`` reads from the engine's relations, in a transaction of its own.

    The transaction commits: a rollback would drop the connection's
    prepared statements, and the plans measured must include the prepared
    ones.
    """
    oids = engine_relations()
    with transaction.atomic():
        before = tuples_read(oids)
        action()
        return tuples_read(oids) - before


def never_analysed() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM pg_stat_user_tables WHERE relname LIKE %s "
            "AND (analyze_count > 0 OR autoanalyze_count > 0 OR last_analyze IS NOT NULL)",
            ["kumiko_workflows_%"],
        )
        analysed = cursor.fetchone()[0]
        cursor.execute(
            "SELECT COUNT(*) FROM pg_stats WHERE tablename LIKE %s", ["kumiko_workflows_%"]
        )
        return analysed == 0 and cursor.fetchone()[0] == 0


@pytest.fixture
def fresh_database() -> Iterator[None]:
    """A freshly migrated database no table of which was ever analysed (dropped after)."""
    with ScratchDatabase() as scratch:
        scratch.renew()
        yield


def _awaited_appends(appended: list[Event]) -> Callable[[], None]:
    """An awaited append that wakes a run (another run each time), kept in ``appended``."""
    users = iter(range(1, 100))

    def append() -> None:
        user = f"user-{next(users)}"
        appended.append(
            append_event(uuid.uuid4(), "user", "t.verified", {"user_id": user}, tenant_id=TENANT)
        )

    return append


def _look_back(after_id: int) -> Callable[[], None]:
    """The look-back of a run waiting since ``after_id`` for an event that never came."""
    match = {
        "version": 1,
        "expr": {"kind": "atom", "path": ["user_id"], "op": {"kind": "eq", "value": "user-never"}},
    }

    def look() -> None:
        assert wakeups.look_back(TENANT, "t.verified", match, after_id, {after_id}) is None

    return look


def _claim() -> None:
    """The worker's claim when nothing is due (the waits time out in 7 days; woken rows
    are due from their wake-up on)."""
    earlier = timezone.now() - timedelta(hours=1)
    assert claims.claim_due(TENANT, earlier, {1, 2}) is None
    assert claims.claim_due(TENANT, earlier, set()) is None


def _measure(actions: dict[str, Callable[[], None]]) -> dict[str, int]:
    return {name: work(action) for name, action in actions.items()}


@pytest.mark.parametrize("waiting", [800, 10_000])
def test_hot_queries_read_no_more_on_tables_never_analysed(fresh_database, waiting):
    trigger_id = seed_waiting_runs(waiting)
    assert never_analysed()
    appended: list[Event] = []
    actions = {
        "awaited append": _awaited_appends(appended),
        "look-back": _look_back(trigger_id),
        "claim": _claim,
    }
    # Each statement runs a few times first: the hot ones are prepared from
    # their second run on a connection, and PostgreSQL may settle on a
    # generic plan after five; then once with generic plans forced.
    for _ in range(6):
        _measure(actions)
    unanalysed = _measure(actions)
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
    generic = _measure(actions)
    with connection.cursor() as cursor:
        cursor.execute("RESET plan_cache_mode")
    assert never_analysed()

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    analysed = _measure(actions)
    print(
        f"\n{waiting} waiting: tuples read unanalysed {unanalysed}, generic plans {generic}, "
        f"after ANALYZE {analysed}"
    )
    for event in appended:
        woken = WorkflowRunPending.objects.filter(tenant_id=TENANT, awaited_event_id=event.id)
        assert woken.count() == 1, event.payload
    for name in actions:
        # A floor of 10 tuples: a plan reading 3 instead of 1 is not the point.
        allowed = 2 * max(analysed[name], 10)
        if waiting < SMALL:
            # Estimated at a few rows each, the tables make indexes tie: a lookup
            # may read the tenant's rows of a table once (twice with the heap),
            # for each of the append's dozen statements; never once per waiting run.
            allowed = max(allowed, 12 * 2 * waiting)
        assert unanalysed[name] <= allowed, (name, unanalysed, analysed)
        assert generic[name] <= allowed, (name, generic, analysed)


#: The workflow of the re-planning test (a step, a wait, a step) and its trigger's type.
_DUE, _DUE_TRIGGER = "unanalysed-due", "unanalysed.due"


def _seed_due_runs(count: int, template: str | None) -> str:
    """``count`` due runs of :data:`_DUE`: copies of the run ``template`` (started first
    through ``append_event`` when None, waiting until tomorrow: never due itself), due an
    hour ago. Returns the template run's key."""
    if template is None:
        template = uuid.uuid4().hex
        tomorrow = (timezone.now() + timedelta(days=1)).isoformat()
        append_event(
            uuid.uuid4(),
            "test-source",
            _DUE_TRIGGER,
            {"key": template, "at": tomorrow},
            tenant_id=TENANT,
        )
    run_id = run_id_for(_DUE, template, TENANT)
    # Each call's copies have run ids of their own.
    salt = f"'{uuid.uuid4().hex}' || "
    copy_id = f"md5({salt}t.run_id::text || g.i)::uuid"
    _copy_rows(
        Event,
        count,
        "t.tenant_id = %s AND t.aggregate_id = %s",
        {"aggregate_id": f"md5({salt}t.aggregate_id::text || g.i)::uuid"},
        [TENANT, run_id],
    )
    _copy_rows(
        WorkflowRun,
        count,
        "t.run_id = %s",
        {"run_id": copy_id, "idempotency_key": f"{salt}t.idempotency_key || g.i"},
        [run_id],
    )
    earlier = "t.{} - interval '25 hours'"
    _copy_rows(
        WorkflowRunPending,
        count,
        "t.run_id = %s",
        {
            "run_id": copy_id,
            "wake_at": earlier.format("wake_at"),
            "claim_at": earlier.format("claim_at"),
        },
        [run_id],
    )
    return template


@pytest.mark.parametrize("together", [True, False], ids=["together", "row_by_row"])
def test_statements_prepared_on_small_tables_are_planned_again_once_they_have_grown(
    fresh_database, settings, together
):
    """Statements a worker prepared, and PostgreSQL settled on generic plans for, while the
    tables held a few runs are planned again once the tables have grown (here to 10,000
    runs, bulk-loaded, never analysed): a batch then reads no more than it does on a
    connection that prepared them at that size. A kept plan (a scan, or a tenant's index
    read to its end) reads the tables' every row at every batch."""
    from kumiko_workflows import define_workflow, on_event, resume_due_runs, steps
    from kumiko_workflows.workflow.registry import registry

    size, small_batches = 5, 8
    settings.KUMIKO_WORKFLOWS = {
        **settings.KUMIKO_WORKFLOWS,
        "BATCH_TOGETHER": together,
        "BATCH_SIZE": size,
    }
    flow = define_workflow(
        name=_DUE,
        trigger=on_event(_DUE_TRIGGER),
        idempotency_key=lambda event: event.payload["key"],
        steps=[
            steps.compute("first", lambda ctx: {"n": 1}),
            steps.wait(lambda ctx: ctx.event.payload["at"]),
            steps.compute("second", lambda ctx: ctx.steps["first"]["n"] + 1),
        ],
        register=False,
    )

    def batches(count: int) -> list[int]:
        return [work(lambda: resume_due_runs(tenant_id=TENANT, limit=size)) for _ in range(count)]

    with registry.override(flow):
        template = _seed_due_runs(small_batches * size, None)
        # On the small tables: prepared from their second run on, generic after five.
        batches(small_batches)
        assert WorkflowRunPending.objects.filter(tenant_id=TENANT).count() == 1  # the template
        _seed_due_runs(10_000, template)
        grown = batches(3)
        connection.close()  # a new connection prepares its statements at this size
        fresh = batches(3)
        assert never_analysed()
    completed = WorkflowRun.objects.filter(tenant_id=TENANT, status="completed").count()
    assert completed == (small_batches + 6) * size, completed
    print(f"\ntuples read a batch of {size} at 10,000 runs: {grown}; new connection: {fresh}")
    # Kept from the small tables, the plans read tens of thousands of tuples more a batch.
    assert max(grown) <= max(fresh) + 100, (grown, fresh)
