"""The engine on Citus: tables distributed by tenant over two worker nodes, on a real cluster.

Runs against the coordinator ``../shared/citus/setup.sh`` starts (127.0.0.1:9700,
workers on 9701 and 9702): set ``CITUS_DATABASE_URL`` to it and ``DATABASE_URL``
to the same, and pass ``--reuse-db`` (the test database must keep the citus
extension ``setup.sh`` created in it). ``.ci/run`` does all three; without
``CITUS_DATABASE_URL`` every test here skips, saying so.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from kumiko_workflows import append_event, resume_due_runs, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations.distribute import LOCAL_MODELS, OFF_ENGINE_MODELS, TENANT_MODELS
from kumiko_workflows.store import db, distribution, event_inserts
from tests.support import run_manage, subprocess_env
from tests.support.faults import Worker, wait_for

CITUS_URL = os.environ.get("CITUS_DATABASE_URL", "")

pytestmark = [
    pytest.mark.citus,
    pytest.mark.skipif(
        not CITUS_URL,
        reason="needs a Citus coordinator: run `bash ../shared/citus/setup.sh kumiko_citus "
        "test_kumiko_citus`, then CITUS_DATABASE_URL=postgres://postgres@127.0.0.1:9700/"
        "kumiko_citus with DATABASE_URL set to the same and --reuse-db",
    ),
]

WORKER_PORTS = {9701, 9702}
#: Ids drawn from a worker's own sequence range start at (group id << 48).
WORKER_RANGE = 1 << 48


@pytest.fixture(scope="module", autouse=True)
def distributed(django_db_setup: Any, django_db_blocker: Any) -> None:
    """The test database's workflow tables distributed (8 shards), or a failure saying why."""
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql" or not distribution.has_citus():
            pytest.fail(
                "CITUS_DATABASE_URL is set, but the test database "
                f"({db.database_description()}) is not a Citus coordinator: set DATABASE_URL "
                "to the coordinator and pass --reuse-db"
            )
        call_command("distribute_workflow_tables", "--shard-count", "8", verbosity=0)
        assert distribution.distributed()
        # The database is reused from run to run: start from empty tables.
        call_command("flush", interactive=False, verbosity=0)


def _node_of(tenant: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nodeport FROM citus_shards WHERE table_name = %s::regclass AND shardid = "
            "get_shard_id_for_distribution_column(%s::regclass, %s)",
            [Event._meta.db_table, Event._meta.db_table, tenant],
        )
        return int(cursor.fetchone()[0])


def _tenants(count: int, prefix: str) -> list[str]:
    """``count`` tenants, half on each worker node."""
    by_node: dict[int, list[str]] = defaultdict(list)
    for i in range(1000):
        tenant = f"{prefix}-{i}"
        node = _node_of(tenant)
        if len(by_node[node]) < count // 2:
            by_node[node].append(tenant)
        if sum(map(len, by_node.values())) == count:
            break
    assert set(by_node) == WORKER_PORTS, by_node
    return sorted(t for tenants in by_node.values() for t in tenants)


# --- placement -----------------------------------------------------------------


@pytest.mark.django_db
def test_each_tenant_table_has_shards_on_both_workers_all_colocated_heartbeats_stay():
    tables = [model._meta.db_table for model in TENANT_MODELS]
    for table in tables:
        nodes = {port for _, _, port in distribution.shard_placements(table)}
        assert nodes == WORKER_PORTS, (table, nodes)
    groups = distribution.colocation_ids(tables)
    assert set(groups) == set(tables)
    assert len(set(groups.values())) == 1, groups
    kinds = distribution.citus_tables()
    for model in (*LOCAL_MODELS, *OFF_ENGINE_MODELS):
        assert model._meta.db_table not in kinds, model  # a plain table on the coordinator
    assert not distribution.shard_placements(LOCAL_MODELS[0]._meta.db_table)


@pytest.mark.django_db
def test_every_table_with_a_tenant_is_a_tenant_table():
    from django.apps import apps

    with_tenant = {
        model
        for model in apps.get_app_config("kumiko_workflows").get_models()
        if "tenant_id" in [field.name for field in model._meta.fields]
    }
    # The outbox's table has a tenant but no rows on the engine's database.
    assert with_tenant == set(TENANT_MODELS) | set(OFF_ENGINE_MODELS)


@pytest.mark.django_db(transaction=True)
def test_w140_names_a_tenant_table_left_undistributed_until_the_command_runs():
    from django.core import checks

    table = WorkflowRun._meta.db_table  # no identity column: Citus can take it back
    with connection.cursor() as cursor:
        cursor.execute("SELECT undistribute_table(%s)", [table])
    distribution.forget_distribution()
    try:
        found = [m for m in checks.run_checks(databases=["default"]) if m.id.endswith("W140")]
        assert len(found) == 1 and table in found[0].msg, found
        done = run_manage("distribute_workflow_tables")
        assert done.returncode == 0, done.stderr
        assert f"{table}: distributed" in done.stdout
    finally:
        call_command("distribute_workflow_tables", verbosity=0)
    assert not [m for m in checks.run_checks(databases=["default"]) if m.id.endswith("W140")]
    check = run_manage("distribute_workflow_tables", "--check")
    assert check.returncode == 0, check.stdout + check.stderr


# --- single-shard statements (EXPLAIN) ----------------------------------------


@contextmanager
def _recorded() -> Iterator[list[tuple[str, Any]]]:
    statements: list[tuple[str, Any]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not many:
            statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield statements


def _spread(statements: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """The statements that are not one shard's task, with their plans."""
    wide = []
    for sql, params in statements:
        if re.match(r"\s*(SAVEPOINT|RELEASE|ROLLBACK|SET|EXPLAIN)\b", sql, re.I):
            continue
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        if "Citus" not in plan:
            continue  # a coordinator's own table, a sequence, a function
        tasks = re.findall(r"Task Count: (\d+)", plan)
        if tasks != ["1"] or "Subplan" in plan or "INSERT/SELECT method" in plan:
            wide.append((sql, plan))
    return wide


def _start(tenant: str, user: str, key: str | None = None, **payload: Any) -> uuid.UUID:
    key = key or uuid.uuid4().hex
    append_event(
        uuid.uuid4(),
        "citus-source",
        "t.citus-start",
        {"run_key": key, "user_id": user, "fail_attempts": 0, **payload},
        tenant_id=tenant,
    )
    return run_id_for("t-citus", key, tenant)


@pytest.mark.django_db(transaction=True)
def test_append_wake_up_claim_and_resume_are_each_one_shards_statements(past):
    tenant = _tenants(2, "explain")[0]
    user_stream = uuid.uuid4()
    append_event(user_stream, "citus-user", "t.citus-note", {"n": 0}, tenant_id=tenant)
    run_id = _start(tenant, "u-explain", **{"for": past})

    with _recorded() as appends:  # to an existing stream: next version, and an expected one
        append_event(user_stream, "citus-user", "t.citus-note", {"n": 1}, tenant_id=tenant)
        append_event(
            user_stream,
            "citus-user",
            "t.citus-note",
            {"n": 2},
            tenant_id=tenant,
            expected_version=2,
        )
    with _recorded() as resumes:  # claim, resume, suspend on wait_for_event
        report = resume_due_runs(tenant_id=tenant)
    assert report.resumed == 1 and report.suspended == 1, report
    with _recorded() as wakes:  # the awaited event wakes the run (and its check after commit)
        verified = {"user_id": "u-explain"}
        append_event(user_stream, "citus-user", "t.citus-verified", verified, tenant_id=tenant)
    assert WorkflowRunPending.objects.get(tenant_id=tenant, run_id=run_id).awaited_event_id
    with _recorded() as finishes:
        report = resume_due_runs(tenant_id=tenant)
    assert report.completed == 1, report

    for name, statements in [
        ("append", appends),
        ("resume", resumes),
        ("wake-up", wakes),
        ("claim and finish", finishes),
    ]:
        assert statements, name
        assert _spread(statements) == [], name
    claims = [sql for sql, _ in resumes if "FOR UPDATE SKIP LOCKED" in sql and "DELETE" in sql]
    assert claims, "the claim was not among the statements"


@pytest.mark.django_db(transaction=True)
def test_the_old_claim_without_the_tenant_in_its_delete_would_span_every_shard():
    """The test above can fail: the statement shape the claim had before is wide."""
    table = WorkflowRunPending._meta.db_table
    old = (
        f"WITH c AS (DELETE FROM {table} WHERE id = (SELECT id FROM {table} "  # noqa: S608
        "WHERE tenant_id = %s AND wake_at <= now() ORDER BY wake_at, id LIMIT 1 "
        "FOR UPDATE SKIP LOCKED) RETURNING *) SELECT * FROM c"
    )
    assert len(_spread([(old, ["t"])])) == 1


# --- ids: the append order --------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_event_ids_come_from_the_coordinators_sequence_in_append_order():
    tenants = _tenants(4, "ids")
    streams = {tenant: uuid.uuid4() for tenant in tenants}
    appended = []
    for round in range(3):
        for tenant in tenants:  # across shards on both workers, in turn
            expected = None if round == 0 else round
            event = append_event(
                streams[tenant],
                "citus-ids",
                "t.citus-id",
                {"r": round},
                tenant_id=tenant,
                expected_version=expected,
            )
            appended.append(event.id)
    assert appended == sorted(appended)
    assert max(appended) < WORKER_RANGE
    # The plain shape, run on distributed tables, would draw ids on a worker:
    table = Event._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (tenant_id, aggregate_id, aggregate_type, type, "  # noqa: S608
            "event_version, payload, metadata, created_by, created_at, version) "
            "SELECT %s, %s, 'citus-ids', 't.citus-id', 1, '{}', '{}', '', now(), 4 "
            f"WHERE EXISTS (SELECT 1 FROM {table} WHERE tenant_id = %s AND aggregate_id = %s "
            "AND version = 3) RETURNING id",
            [tenants[0], str(streams[tenants[0]]), tenants[0], str(streams[tenants[0]])],
        )
        assert cursor.fetchone()[0] >= WORKER_RANGE


@pytest.mark.django_db(transaction=True)
def test_an_append_whose_id_was_drawn_before_another_append_committed_keeps_id_order(
    monkeypatch,
):
    """An id is drawn on the coordinator before the insert reads the stream: an append to
    the next version that drew its id, then met a later one committed meanwhile, draws
    again instead of writing the next version under an older id."""
    tenant = _tenants(2, "id-race")[0]
    stream = uuid.uuid4()
    append_event(stream, "id-race", "t.id-race", {"n": 1}, tenant_id=tenant)
    stale = distribution.next_event_id()  # drawn by an append that is slow to insert
    newer = append_event(stream, "id-race", "t.id-race", {"n": 2}, tenant_id=tenant)
    drawn = iter([stale])
    real = event_inserts.next_event_id
    monkeypatch.setattr(event_inserts, "next_event_id", lambda: next(drawn, None) or real())
    late = append_event(stream, "id-race", "t.id-race", {"n": 3}, tenant_id=tenant)
    assert (late.version, newer.version) == (3, 2)
    assert late.id > newer.id > stale
    rows = list(Event.objects.filter(tenant_id=tenant, aggregate_id=stream).order_by("version"))
    assert [row.id for row in rows] == sorted(row.id for row in rows)


@pytest.mark.django_db(transaction=True)
def test_nothing_is_prepared_so_no_generic_plan_is_refused():
    """Citus refuses a generic plan of an append's INSERT ... SELECT ("could not create
    distributed plan"), which PostgreSQL settles on after five runs of a prepared statement
    (sooner on tables never analysed; here at once): nothing is prepared on distributed
    tables, so every shape of append runs again and again."""
    from kumiko_workflows import load_stream

    connection.close()  # a connection of its own, whose hot cursor is made here
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
    stream = uuid.uuid4()
    try:
        for version in range(8):  # the first event, then "after" and "next" in turn
            expected = version if version % 2 else None
            append_event(stream, "generic", "t.generic", {}, "generic", expected)
        for _ in range(8):  # new streams: "next" finds none, then "first"
            append_event(uuid.uuid4(), "generic", "t.generic", {}, tenant_id="generic")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                ["%kumiko_workflows_%"],
            )
            assert cursor.fetchone()[0] == 0
    finally:
        connection.close()
    versions = [event.version for event in load_stream(stream, tenant_id="generic")]
    assert versions == list(range(1, 9))


@pytest.mark.django_db(transaction=True)
def test_a_stream_id_another_tenant_has_is_refused_once_and_nothing_is_left():
    from kumiko_workflows.exceptions import StreamIdentityError

    one, other = _tenants(2, "twin")
    stream = uuid.uuid4()
    append_event(stream, "citus-twin", "t.citus-note", {}, tenant_id=one)
    with pytest.raises(StreamIdentityError, match="another tenant"):
        append_event(stream, "citus-twin", "t.citus-note", {}, tenant_id=other)
    assert list(Event.objects.filter(aggregate_id=stream).values_list("tenant_id", flat=True)) == [
        one
    ]


# --- the workload: 20 tenants, two loop workers, racing appenders, a shard move --

APPENDER = textwrap.dedent(
    """
    import json, sys, uuid
    import django
    django.setup()
    from kumiko_workflows import append_event, VersionConflict

    name, plan = sys.argv[1], json.loads(sys.argv[2])
    for tenant, stream, user, ledger in plan:
        append_event(uuid.UUID(stream), "citus-user", "t.citus-verified", {"user_id": user},
                     tenant_id=tenant)
        for _ in range(20):  # the ledger stream is raced by every appender: next version
            try:
                append_event(uuid.UUID(ledger), "citus-ledger", "t.citus-ledger", {"by": name},
                             tenant_id=tenant)
                break
            except VersionConflict:
                continue
        else:
            raise SystemExit(f"{name}: could not append to {ledger}")
    """
)


def _move_a_shard_group(tenant: str) -> tuple[int, int]:
    """Move the shard group holding ``tenant`` to the other worker; (shard, new port)."""
    source = _node_of(tenant)
    target = (WORKER_PORTS - {source}).pop()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT get_shard_id_for_distribution_column(%s::regclass, %s)",
            [Event._meta.db_table, tenant],
        )
        (shard,) = cursor.fetchone()
        cursor.execute(
            "SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s, "
            "shard_transfer_mode => 'force_logical')",
            [shard, source, target],
        )
    return shard, target


@pytest.mark.django_db(transaction=True)
def test_the_workload_over_twenty_tenants_loses_nothing(tmp_path, past):
    tenants = _tenants(20, "load")
    runs: dict[uuid.UUID, tuple[str, str]] = {}
    plan = []
    for tenant in tenants:
        ledger = str(uuid.uuid4())
        for n in range(3):
            user = f"{tenant}-u{n}"
            # n = 1 fails its first attempt: a retry after 0.2 s.
            run_id = _start(tenant, user, fail_attempts=1 if n == 1 else 0, **{"for": past})
            runs[run_id] = (tenant, user)
            plan.append([tenant, str(uuid.uuid4()), user, ledger])
    assert WorkflowRunPending.objects.count() == len(runs)

    workers = [
        Worker(tmp_path, "--loop", "--interval", "0.2", "--no-cron", name=f"citus-w{i}")
        for i in range(2)
    ]
    appenders = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, f"a{i}", json.dumps(plan[i::2] + plan[::3])],
            env=subprocess_env(),
        )
        for i in range(2)
    ]
    try:
        # One worker dies mid-flight, as a host would.
        wait_for(
            lambda: Event.objects.filter(type=et.RESUMED).count() >= 10,
            "the workers to resume runs",
        )
        workers[0].signal(signal.SIGKILL)
        workers[0].wait()
        # A shard group moves to the other worker while runs go on.
        moved_tenant = tenants[0]
        before = _node_of(moved_tenant)
        _, target = _move_a_shard_group(moved_tenant)
        assert _node_of(moved_tenant) == target != before
        for appender in appenders:
            assert appender.wait(timeout=120) == 0
        wait_for(
            lambda: WorkflowRun.objects.filter(status="completed").count() == len(runs),
            "every run to complete",
            timeout=180,
        )
    finally:
        for worker in workers:
            worker.stop()
        for appender in appenders:
            if appender.poll() is None:
                appender.kill()
                appender.wait()

    for run_id, (tenant, user) in runs.items():
        stream = list(Event.objects.filter(tenant_id=tenant, aggregate_id=run_id).order_by("id"))
        types = Counter(event.type for event in stream)
        assert types[et.RUN_COMPLETED] == 1, (run_id, types)
        assert types[et.RUN_STARTED] == 1
        # The awaited event reached the run, whichever came first.
        after = Event.objects.filter(
            tenant_id=tenant,
            type="t.recorded",
            payload__step="after",
            payload__steps__verified__user_id=user,
        )
        assert after.count() == 1, (run_id, user)
    assert not WorkflowRunPending.objects.exists()
    _assert_streams_whole()
    ledgers = Event.objects.filter(type="t.citus-ledger")
    assert ledgers.count() == len(plan[0::2] + plan[::3]) + len(plan[1::2] + plan[::3])
    check = run_manage("rebuild_workflow_projections", "--check")
    assert check.returncode == 0, check.stdout + check.stderr


def _assert_streams_whole() -> None:
    """No version gap in any stream; ids in version order, all from the coordinator."""
    streams: dict[tuple[str, uuid.UUID], list[tuple[int, int]]] = defaultdict(list)
    for tenant, aggregate, version, pk in Event.objects.values_list(
        "tenant_id", "aggregate_id", "version", "id"
    ):
        streams[(tenant, aggregate)].append((version, pk))
    for key, rows in streams.items():
        rows.sort()
        assert [version for version, _ in rows] == list(range(1, len(rows) + 1)), key
        ids = [pk for _, pk in rows]
        assert ids == sorted(ids), key
        assert max(ids) < WORKER_RANGE, key


# --- the admin's lists ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_admin_lists_filter_choices_and_capped_count_on_distributed_tables(client):
    """The filters' choices are a DISTINCT each shard answers (a recursive scan over every
    tenant would name no shard); the run list opens and counts up to its cap."""
    from django.contrib.auth import get_user_model
    from django.urls import reverse

    from kumiko_workflows.store.choices import distinct_values
    from tests.support import trigger

    tenants = _tenants(2, "admin-lists")
    for tenant in tenants:
        trigger("t.fail", tenant_id=tenant)
    trigger("t.wait", tenant_id=tenants[0], **{"for": "PT1H"})
    assert distinct_values(WorkflowRun, ["tenant_id"]) == tenants
    assert distinct_values(WorkflowRun, ["tenant_id", "workflow_name"]) == ["t-fail", "t-wait"]
    assert distinct_values(WorkflowRun, ["tenant_id", "workflow_name"], tenants[1]) == ["t-fail"]
    user = get_user_model().objects.create_superuser("citus-root", "r@example.com", "pw")
    client.force_login(user)
    page = client.get(reverse("admin:kumiko_workflows_workflowrun_changelist"))
    assert page.status_code == 200
    assert page.context["cl"].result_count == 3
    events = client.get(reverse("admin:kumiko_workflows_event_changelist"))
    assert events.status_code == 200
