"""Measure ``purge_workflow_runs`` on PostgreSQL beside a site appending events.

Not part of the package, nor of the test suite (it takes minutes and a
database of its own). It:

1. migrates the database ``DATABASE_URL`` names;
2. seeds finished runs in a scratch tenant (``bench-purge-<random>``) with
   set-based SQL, as ``kumiko_bench`` seeds its due runs: per run a domain
   trigger event, four run events (``run-started``, ``step.waiting``,
   ``step.resumed``, ``run-completed``) and a completed ``WorkflowRun`` row
   that finished 60 days ago; then ``VACUUM ANALYZE``;
3. starts a child process that appends a domain event (``append_event``, in
   autocommit, in the same tenant) every ~10 ms and times each append;
4. runs ``manage.py purge_workflow_runs --tenant <scratch> --finished-before
   P30D`` as another child and waits for it with ``wait4`` (its peak RSS);
5. prints the purge's time, its peak RSS, and the appender's longest, p99 and
   median append while the purge ran, beside the same for the 5 s of appends
   before it started; with ``--small N``, first the same for N runs, so the
   two peaks show whether memory grows with the purge's size.

It removes the scratch tenant's domain events and tombstones afterwards
(a purge never deletes domain events) and vacuums.

    createdb -h 127.0.0.1 -U postgres kumiko_h2bench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kumiko_h2bench \\
        .venv/bin/python scripts/purge_bench.py --runs 250000 --small 25000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
# As in production: with DEBUG on, Django keeps every statement (and the
# purge's are long) in memory, which is not what a purge costs.
os.environ.setdefault("DJANGO_DEBUG", "false")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from kumiko_workflows.models import Event, PurgedRun, WorkflowRun  # noqa: E402

WORKFLOW = "bench-purge"
CHUNK = 25_000
BASELINE_SECONDS = 5.0

APPENDER = textwrap.dedent(
    """
    import json, os, sys, time, uuid
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django
    django.setup()
    from kumiko_workflows import append_event

    tenant, folder = sys.argv[1], Path(sys.argv[2])
    stream = uuid.uuid4()
    timings = []
    append_event(stream, "bench-site", "bench.ping", {"n": -1}, tenant_id=tenant)  # connect
    (folder / "appending").touch()
    n = 0
    while not (folder / "stop").exists():
        began = time.monotonic()
        append_event(stream, "bench-site", "bench.ping", {"n": n}, tenant_id=tenant)
        took = time.monotonic() - began
        timings.append([time.time(), took])
        n += 1
        time.sleep(max(0.0, 0.01 - took))
    (folder / "timings.json").write_text(json.dumps(timings))
    """
)


def table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def seed(tenant: str, runs: int) -> None:
    """``runs`` completed runs of ``WORKFLOW`` in ``tenant``, finished 60 days ago."""
    event, run = table(Event), table(WorkflowRun)
    columns = (
        "tenant_id, aggregate_id, aggregate_type, version, type, event_version, payload, "
        "metadata, created_by, created_at"
    )
    sql = f"""
        WITH triggers AS (
            INSERT INTO {event} ({columns})
            SELECT %(tenant)s, gen_random_uuid(), 'bench-source', 1, 'bench.placed', 1,
                   jsonb_build_object('key', 'k-' || n, 'order_id', gen_random_uuid()),
                   '{{}}', '', %(at)s
            FROM generate_series(%(first)s, %(last)s) AS n
            RETURNING id, payload ->> 'key' AS key
        ), started AS MATERIALIZED (
            SELECT id AS trigger_id, key, gen_random_uuid() AS run_id FROM triggers
        ), rows AS (
            INSERT INTO {run} (run_id, tenant_id, workflow_name, idempotency_key, status, step,
                   suspension_type, wake_at, awaited_event_type, retry_attempt, failure_reason,
                   error_class, last_error, definition_fingerprint, trigger_event_id, version,
                   started_at, updated_at, finished_at)
            SELECT run_id, %(tenant)s, %(name)s, key, 'completed', '', '', NULL, '', 0, '', '',
                   '', 'f1', trigger_id, 4, %(at)s, %(done)s, %(done)s
            FROM started
        )
        INSERT INTO {event} ({columns})
        SELECT %(tenant)s, s.run_id, 'workflow-run', v.version, v.type, 1,
               CASE v.version
                 WHEN 1 THEN jsonb_build_object(
                     'workflow_name', %(name)s::text, 'definition_fingerprint', 'f1',
                     'step_fingerprints', '["a1", "b2", "c3"]'::jsonb,
                     'idempotency_key', s.key, 'trigger_event_id', s.trigger_id)
                 WHEN 2 THEN jsonb_build_object(
                     'step', '1', 'wake_at', %(at)s::text, 'workflow_name', %(name)s::text,
                     'definition_fingerprint', 'f1', 'trigger_event_id', s.trigger_id,
                     'state', jsonb_build_object(
                         'results', jsonb_build_object('reserve', jsonb_build_object(
                             'reserved', true, 'sku', 'sku-' || s.key)),
                         'awaited', '{{}}'::jsonb))
                 WHEN 3 THEN jsonb_build_object(
                     'step', '1', 'retry_attempt', 0, 'suspension_type', 'wait')
                 ELSE jsonb_build_object('workflow_name', %(name)s::text, 'step_count', 3)
               END,
               '{{}}', 'kumiko_workflows', %(at)s
        FROM started s
        CROSS JOIN (VALUES (1, 'workflow.run-started'), (2, 'workflow.step.waiting'),
                           (3, 'workflow.step.resumed'), (4, 'workflow.run-completed'))
             AS v(version, type)
    """  # noqa: S608 - table names from _meta
    with connection.cursor() as cursor:
        cursor.execute("SELECT now() - interval '60 days'")
        (finished,) = cursor.fetchone()
        at = done = finished.isoformat()
        for first in range(1, runs + 1, CHUNK):
            last = min(runs, first + CHUNK - 1)
            params = {
                "tenant": tenant,
                "name": WORKFLOW,
                "at": at,
                "done": done,
                "first": first,
                "last": last,
            }
            cursor.execute(sql, params)
            print(f"  seeded {last:,} of {runs:,} runs", flush=True)


def vacuum() -> None:
    with connection.cursor() as cursor:
        for model in (Event, WorkflowRun, PurgedRun):
            cursor.execute(f"VACUUM ANALYZE {table(model)}")  # noqa: S608 - _meta table names


def clean(tenant: str) -> None:
    """Remove what a purge leaves of the scratch tenant: domain events and tombstones."""
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table(Event)} WHERE tenant_id = %s", [tenant])  # noqa: S608
        cursor.execute(f"DELETE FROM {table(PurgedRun)} WHERE tenant_id = %s", [tenant])  # noqa: S608
        cursor.execute(f"DELETE FROM {table(WorkflowRun)} WHERE tenant_id = %s", [tenant])  # noqa: S608


def measure(runs: int, batch: int, archive: str | None) -> dict[str, float]:
    tenant = f"bench-purge-{uuid.uuid4().hex[:8]}"
    print(f"seeding {runs:,} finished runs in tenant {tenant}", flush=True)
    started = time.monotonic()
    seed(tenant, runs)
    print(f"  seeded in {time.monotonic() - started:.1f} s; VACUUM ANALYZE", flush=True)
    vacuum()
    run_events = Event.objects.filter(tenant_id=tenant, aggregate_type="workflow-run").count()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with tempfile.TemporaryDirectory() as folder:
        appender = subprocess.Popen(
            [sys.executable, "-c", APPENDER, tenant, folder, str(REPO)], env=env
        )
        while not (Path(folder) / "appending").exists():
            if appender.poll() is not None:
                raise SystemExit("the appender died")
            time.sleep(0.05)
        # A few seconds of appends alone first: what an append costs here anyway.
        quiet = (time.time(), time.time() + BASELINE_SECONDS)
        time.sleep(BASELINE_SECONDS)
        args = [
            sys.executable,
            str(REPO / "manage.py"),
            "purge_workflow_runs",
            "--tenant",
            tenant,
            "--finished-before",
            "P30D",
            "--batch",
            str(batch),
        ]
        if archive:
            args += ["--archive", archive]
        out_path, err_path = Path(folder) / "purge.out", Path(folder) / "purge.err"
        with out_path.open("w") as out, err_path.open("w") as err:
            began_wall, began = time.time(), time.monotonic()
            purge = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=err)
            _, status, usage = os.wait4(purge.pid, 0)
            purge.returncode = os.waitstatus_to_exitcode(status)
            took = time.monotonic() - began
            ended_wall = time.time()
        (Path(folder) / "stop").touch()
        if appender.wait(timeout=60) != 0:
            raise SystemExit("the appender failed")
        if purge.returncode != 0:
            raise SystemExit(f"the purge failed:\n{err_path.read_text()}")
        print("  " + out_path.read_text().strip(), flush=True)
        timings = json.loads((Path(folder) / "timings.json").read_text())
    during = sorted(took_s for at, took_s in timings if began_wall <= at <= ended_wall)
    alone = sorted(took_s for at, took_s in timings if quiet[0] <= at <= quiet[1])
    left = Event.objects.filter(tenant_id=tenant, aggregate_type="workflow-run").count()
    clean(tenant)
    vacuum()
    if left:
        raise SystemExit(f"{left} run events of the tenant are left")
    return {
        "runs": runs,
        "run_events": run_events,
        "seconds": took,
        "runs_per_s": runs / took,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "appends": len(during),
        "append_max_ms": during[-1] * 1000 if during else 0.0,
        "append_p99_ms": during[int(len(during) * 0.99)] * 1000 if during else 0.0,
        "append_p50_ms": statistics.median(during) * 1000 if during else 0.0,
        "alone_max_ms": alone[-1] * 1000 if alone else 0.0,
        "alone_p99_ms": alone[int(len(alone) * 0.99)] * 1000 if alone else 0.0,
        "alone_p50_ms": statistics.median(alone) * 1000 if alone else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=250_000, help="runs to purge (4 events each)")
    parser.add_argument("--small", type=int, default=0, help="first purge this many, to compare")
    parser.add_argument("--batch", type=int, default=500, help="--batch of the purge")
    parser.add_argument("--archive", help="--archive PATH for the purge (removed afterwards)")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("needs PostgreSQL: set DATABASE_URL")
    call_command("migrate", verbosity=0)
    results = []
    for runs in [n for n in (args.small, args.runs) if n]:
        result = measure(runs, args.batch, args.archive)
        if args.archive:
            result["archive_mb"] = Path(args.archive).stat().st_size / 1e6
            Path(args.archive).unlink()
        results.append(result)
        print(
            "PURGE runs={runs} run_events={run_events} seconds={seconds:.1f} "
            "runs_per_s={runs_per_s:.0f} peak_rss_mb={peak_rss_mb:.1f} appends={appends} "
            "append_max_ms={append_max_ms:.1f} append_p99_ms={append_p99_ms:.1f} "
            "append_p50_ms={append_p50_ms:.1f} (alone: max_ms={alone_max_ms:.1f} "
            "p99_ms={alone_p99_ms:.1f} p50_ms={alone_p50_ms:.1f})".format(**result)
            + (f" archive_mb={result['archive_mb']:.1f}" if args.archive else ""),
            flush=True,
        )
    if len(results) == 2:
        growth = results[1]["peak_rss_mb"] - results[0]["peak_rss_mb"]
        print(f"PURGE peak_rss_growth_mb={growth:.1f}", flush=True)


if __name__ == "__main__":
    main()
