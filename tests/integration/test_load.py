"""Load held: 100,000 pending rows, 20,000 due, four worker processes (PostgreSQL).

Appending 100k runs through ``append_event`` would take CI too long, so the
events and the projected rows are generated with set-based SQL that writes
exactly what the runner and the projections write for the ``t-faults-load``
workflow. ``test_generated_rows_are_what_the_engine_writes`` proves that: the
generated events match a real run's event for event, and replaying the
projections over the generated events gives the generated rows again.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from kumiko_workflows import append_event, load_stream, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.store.dispatch import registry as projections
from kumiko_workflows.workflow import durations
from kumiko_workflows.workflow.registry import registry
from tests.support.faults import Worker, wait_for

pytestmark = pytest.mark.postgres

WORKFLOW = "t-faults-load"
TRIGGER = "t.faults-load"
TENANT = "load"
TOTAL = 100_000
DUE = 20_000
WORKERS = 4


def _table(model: Any) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def generate_waiting_runs(
    keys: list[str], for_: str, created_at: datetime, tenant: str = TENANT
) -> list[uuid.UUID]:
    """Write, for each key, what triggering ``t-faults-load`` with ``for_`` would (in ``tenant``).

    That is the trigger event, ``workflow.run-started``, ``workflow.step.waiting``,
    the ``WorkflowRun`` row and the pending row. Returns the run ids.
    """
    workflow = registry.get(WORKFLOW)
    wake_at = durations.wake_time(for_, created_at)
    runs = [run_id_for(WORKFLOW, key, tenant) for key in keys]
    sources = [uuid.uuid4() for _ in keys]
    event, run, pending = _table(Event), _table(WorkflowRun), _table(WorkflowRunPending)
    columns = (
        "tenant_id, aggregate_id, aggregate_type, version, type, event_version, payload, "
        "metadata, created_by, created_at"
    )
    common = {
        "tenant": tenant,
        "name": WORKFLOW,
        "fingerprint": workflow.fingerprint,
        "workflow_version": workflow.version,
        "prints": json.dumps(workflow.step_fingerprints),
        "for": for_,
        "wake": wake_at.isoformat(),
        "wake_at": wake_at,
        "created": created_at,
        "sources": sources,
        "runs": runs,
        "keys": keys,
    }
    statements = [
        # The domain event that triggers each run.
        f"""INSERT INTO {event} ({columns})
        SELECT %(tenant)s, u.source, 'test-source', 1, '{TRIGGER}', 1,
               jsonb_build_object('for', %(for)s::text, 'run_key', u.key), '{{}}', '',
               %(created)s
        FROM unnest(%(sources)s::uuid[], %(keys)s::text[]) AS u(source, key)""",  # noqa: S608 - table names from _meta
        # workflow.run-started, referencing the trigger event by id.
        f"""INSERT INTO {event} ({columns})
        SELECT %(tenant)s, u.run, '{et.RUN_AGGREGATE_TYPE}', 1, '{et.RUN_STARTED}', 1,
               jsonb_build_object(
                   'workflow_name', %(name)s::text,
                   'workflow_version', %(workflow_version)s::int,
                   'definition_fingerprint', %(fingerprint)s::text,
                   'step_fingerprints', %(prints)s::jsonb,
                   'idempotency_key', u.key,
                   'trigger_event_id', t.id),
               '{{}}', 'kumiko_workflows', %(created)s
        FROM unnest(%(sources)s::uuid[], %(runs)s::uuid[], %(keys)s::text[])
             AS u(source, run, key)
        JOIN {event} t
          ON t.tenant_id = %(tenant)s AND t.aggregate_id = u.source AND t.version = 1""",  # noqa: S608 - table names from _meta
        # workflow.step.waiting at step 0 with no results yet.
        f"""INSERT INTO {event} ({columns})
        SELECT %(tenant)s, s.aggregate_id, s.aggregate_type, 2, '{et.WAITING}', 1,
               jsonb_build_object(
                   'step', '0',
                   'wake_at', %(wake)s::text,
                   'workflow_name', %(name)s::text,
                   'workflow_version', %(workflow_version)s::int,
                   'definition_fingerprint', %(fingerprint)s::text,
                   'trigger_event_id', s.payload -> 'trigger_event_id',
                   'state', '{{"results": {{}}, "awaited": {{}}}}'::jsonb),
               '{{}}', 'kumiko_workflows', %(created)s
        FROM {event} s
        WHERE s.tenant_id = %(tenant)s AND s.aggregate_id = ANY(%(runs)s::uuid[])
          AND s.version = 1""",  # noqa: S608 - table names from _meta
        # The run-status projection of those two events.
        f"""INSERT INTO {run} (run_id, tenant_id, workflow_name, workflow_version,
               idempotency_key, search_key, status, step,
               suspension_type, wake_at, awaited_event_type, retry_attempt, failure_reason,
               error_class, last_error, definition_fingerprint, trigger_event_id, version,
               started_at, updated_at, finished_at)
        SELECT s.aggregate_id, s.tenant_id, %(name)s, %(workflow_version)s,
               left(s.payload ->> 'idempotency_key', 500),
               left(s.payload ->> 'idempotency_key', 200),
               'waiting', '0', 'wait', %(wake_at)s, '', 0, '', '', '', %(fingerprint)s,
               (s.payload ->> 'trigger_event_id')::bigint, 2, s.created_at, %(created)s, NULL
        FROM {event} s
        WHERE s.tenant_id = %(tenant)s AND s.aggregate_id = ANY(%(runs)s::uuid[])
          AND s.version = 1""",  # noqa: S608 - table names from _meta
        # The pending projection of the waiting event.
        f"""INSERT INTO {pending} (tenant_id, run_id, step, workflow_name, workflow_version,
               suspension_type,
               wake_at, timeout_at, retry_attempt, definition_fingerprint, wait_event_type,
               awaits_key, match_expr, awaited_event_id, match_scan, trigger_event_id,
               run_version, state, suspended_at, due_since, claim_at)
        SELECT w.tenant_id, w.aggregate_id, '0', %(name)s, %(workflow_version)s, 'wait',
               %(wake_at)s, NULL, 0,
               %(fingerprint)s, '', '', NULL, NULL, false,
               (w.payload ->> 'trigger_event_id')::bigint,
               2, w.payload -> 'state', w.created_at, NULL, %(wake_at)s
        FROM {event} w
        WHERE w.tenant_id = %(tenant)s AND w.aggregate_id = ANY(%(runs)s::uuid[])
          AND w.version = 2""",  # noqa: S608 - table names from _meta
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql, common)
    return runs


# --- the generator agrees with the engine -------------------------------------------


def _event_shape(event: Event) -> dict[str, Any]:
    """An event with its ids and keys blanked out, to compare two runs."""
    payload = dict(event.payload)
    for key in ("trigger_event_id", "idempotency_key", "run_key"):
        if key in payload:
            payload[key] = "*"

    return {
        "tenant_id": event.tenant_id,
        "aggregate_type": event.aggregate_type,
        "version": event.version,
        "type": event.type,
        "event_version": event.event_version,
        "metadata": event.metadata,
        "created_by": event.created_by,
        "payload": payload,
    }


def _rows(run_id: uuid.UUID) -> tuple[dict[str, Any], dict[str, Any]]:
    run = WorkflowRun.objects.filter(run_id=run_id).values().get()
    pending = WorkflowRunPending.objects.filter(run_id=run_id).values().get()
    pending.pop("id")
    return run, pending


@pytest.mark.django_db
def test_generated_rows_are_what_the_engine_writes():
    for_ = (timezone.now() + timedelta(days=1)).isoformat()
    trigger = append_event(
        uuid.uuid4(),
        "test-source",
        TRIGGER,
        {"for": for_, "run_key": "by-engine"},
        tenant_id=TENANT,
    )
    real = load_stream(run_id_for(WORKFLOW, "by-engine", TENANT))
    created = real[-1].created_at
    (generated_id,) = generate_waiting_runs(["by-sql"], for_, created)
    generated = load_stream(generated_id)
    generated_trigger = Event.objects.get(type=TRIGGER, payload__run_key="by-sql")

    # Event for event, the generated stream is the engine's with other ids.
    as_engine = [_event_shape(e) for e in [generated_trigger, *generated]]
    assert as_engine == [_event_shape(e) for e in [trigger, *real]]
    assert generated[0].payload["trigger_event_id"] == generated_trigger.id
    assert generated[1].payload["trigger_event_id"] == generated_trigger.id

    # Replaying the projections over the generated events gives the generated rows.
    before = _rows(generated_id)
    with transaction.atomic():
        WorkflowRun.objects.filter(run_id=generated_id).delete()
        WorkflowRunPending.objects.filter(run_id=generated_id).delete()
        for event in generated:
            projections.dispatch(event, replaying=True)
        assert _rows(generated_id) == before
        transaction.set_rollback(True)

    # And the generated rows are the real run's rows but for ids and instants.
    real_run, real_pending = _rows(real[0].aggregate_id)
    gen_run, gen_pending = before
    differ = {"run_id", "idempotency_key", "search_key", "trigger_event_id"}
    differ |= {"started_at", "updated_at"}
    differ_pending = {"run_id", "trigger_event_id", "suspended_at"}
    assert {k: v for k, v in gen_run.items() if k not in differ} == {
        k: v for k, v in real_run.items() if k not in differ
    }
    assert {k: v for k, v in gen_pending.items() if k not in differ_pending} == {
        k: v for k, v in real_pending.items() if k not in differ_pending
    }

    # Resumed, a generated run ends exactly like a real one.
    from kumiko_workflows import resume_due_runs

    later = timezone.now() + timedelta(days=2)
    assert resume_due_runs(tenant_id=TENANT, now=later).completed == 2
    assert [e.type for e in load_stream(generated_id)] == [
        e.type for e in load_stream(real[0].aggregate_id)
    ]


# --- 100k pending, 20k due, four workers ----------------------------------------------


def _scalar(sql: str, params: list[Any] | None = None) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_four_workers_resume_20k_of_100k_pending_exactly_once_in_flat_memory(tmp_path):
    now = timezone.now()
    created = now - timedelta(hours=2)
    started = time.monotonic()
    due = generate_waiting_runs(
        [f"due-{i}" for i in range(DUE)], (created - timedelta(hours=1)).isoformat(), created
    )
    later = generate_waiting_runs(
        [f"later-{i}" for i in range(TOTAL - DUE)], (now + timedelta(days=1)).isoformat(), created
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    generated_in = time.monotonic() - started
    pending = _table(WorkflowRunPending)
    assert WorkflowRunPending.objects.filter(tenant_id=TENANT).count() == TOTAL
    assert WorkflowRunPending.objects.filter(tenant_id=TENANT, wake_at__lte=now).count() == DUE
    fingerprint_sql = (
        f"SELECT md5(string_agg(p::text, ',' ORDER BY p.id)) FROM {pending} p "  # noqa: S608
        "WHERE p.tenant_id = %s AND p.wake_at > %s"
    )
    untouched = _scalar(fingerprint_sql, [TENANT, now])

    started = time.monotonic()
    workers = [
        Worker(tmp_path, "--no-cron", "--tenant", TENANT, name=f"kumiko-load-{i}")
        for i in range(WORKERS)
    ]
    samples: dict[str, list[tuple[int, int]]] = {w.name: [] for w in workers}
    done_sql = f"SELECT count(*) FROM {pending} WHERE tenant_id = %s AND wake_at <= %s"  # noqa: S608

    def drained() -> bool:
        left = _scalar(done_sql, [TENANT, now])
        for worker in workers:
            rss = worker.rss_kib()
            if rss is not None:
                samples[worker.name].append((DUE - left, rss))
        return all(not w.alive() for w in workers)

    try:
        wait_for(drained, "four workers to drain 20,000 due runs", timeout=600, every=0.5)
    finally:
        codes = [w.stop() for w in workers]
    drained_in = time.monotonic() - started
    print(f"\ngenerated {TOTAL} runs in {generated_in:.1f}s; drained {DUE} in {drained_in:.1f}s")
    assert codes == [0] * WORKERS, [w.log()[-2000:] for w in workers]

    # Exactly once: every due run resumed and completed once, by one of the workers.
    reports = [re.search(r"resumed=(\d+) completed=(\d+)", w.out()) for w in workers]
    assert all(reports), [w.out() for w in workers]
    resumed = [int(r.group(1)) for r in reports if r]
    assert sum(resumed) == DUE and sum(1 for n in resumed if n) >= 2, resumed
    resumed_events = Event.objects.filter(tenant_id=TENANT, type=et.RESUMED)
    assert resumed_events.count() == DUE
    assert resumed_events.values("aggregate_id").distinct().count() == DUE
    assert set(resumed_events.values_list("aggregate_id", flat=True)) == set(due)
    assert Event.objects.filter(tenant_id=TENANT, type=et.RUN_COMPLETED).count() == DUE
    statuses = dict(
        WorkflowRun.objects.filter(tenant_id=TENANT)
        .values_list("status")
        .annotate(n=Count("run_id"))
    )
    assert statuses == {"completed": DUE, "waiting": TOTAL - DUE}

    # The rest untouched, byte for byte.
    assert WorkflowRunPending.objects.filter(tenant_id=TENANT).count() == TOTAL - DUE
    assert set(
        WorkflowRunPending.objects.filter(tenant_id=TENANT).values_list("run_id", flat=True)
    ) == set(later)
    assert _scalar(fingerprint_sql, [TENANT, now]) == untouched

    # Flat memory: after warming up (the first fifth of the drain), no worker grows
    # by more than a few MiB however many more runs it resumes.
    for name, points in samples.items():
        warm = [rss for progress, rss in points if progress >= DUE // 5]
        assert len(warm) >= 3, (name, points)
        growth = max(warm) - warm[0]
        print(f"{name}: rss {warm[0]} -> max {max(warm)} KiB over {len(warm)} samples")
        assert growth < 8 * 1024, (name, points)
