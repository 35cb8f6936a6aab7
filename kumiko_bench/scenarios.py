"""The scenarios behind ``manage.py kumiko_bench``: the engine against its floors.

Every measurement starts on an empty, freshly migrated scratch database
(:mod:`kumiko_bench.scratch`) that is dropped at the end, so the database the
settings name is never read or written, and no row is ever deleted from the
append-only event table. Worker processes are this same command started
again with ``--worker`` and the scratch database's name; they register the
bench workflows too.

Baselines run in the same invocation, interleaved with the engine, so that a
noisy machine slows both alike; each ratio is the median of the rounds.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.test.utils import override_settings
from django.utils import timezone

from kumiko_bench.scratch import ScratchDatabase, use_database
from kumiko_workflows import event_types as et
from kumiko_workflows.models import (
    Event,
    RunStatus,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
)
from kumiko_workflows.steps import compute, fan_out, wait, wait_for_event
from kumiko_workflows.workflow.definition import define_workflow, run_id_for
from kumiko_workflows.workflow.triggers import on_call, on_event

logger = logging.getLogger("kumiko_bench")

SOURCE = "kumiko-bench"
DRAIN_WORKFLOW = "kumiko-bench-drain"
WAKE_WORKFLOW = "kumiko-bench-wake"
SLOW_WORKFLOW = "kumiko-bench-slow"
SLOW_ALONE_WORKFLOW = "kumiko-bench-slow-alone"
ONE_STEP_WORKFLOW = "kumiko-bench-one-step"
ONE_STEP_TRIGGER = "kumiko-bench.one-step-requested"
DRAIN_TRIGGER = "kumiko-bench.drain-requested"
WAKE_TRIGGER = "kumiko-bench.wake-started"
SLOW_TRIGGER = "kumiko-bench.slow-requested"
SLOW_ALONE_TRIGGER = "kumiko-bench.slow-alone-requested"
WAKE_EVENT = "kumiko-bench.wake-go"
FAN_WORKFLOW = "kumiko-bench-fan-parent"
FAN_CHILD_WORKFLOW = "kumiko-bench-fan-child"
FAN_TRIGGER = "kumiko-bench.fan-requested"
APPEND_TYPE = "kumiko-bench.appended"
#: Scratch tables (the baselines' copies) are named ``kumiko_bench_<name>``.
PREFIX = "kumiko_bench"

SCENARIOS = (
    "append",
    "start",
    "drain",
    "drain_traced",
    "slow_step",
    "fairness",
    "scan",
    "wake",
    "wake_scale",
    "awaited_append",
    "profile",
    "memory",
    "unanalysed",
    "tasks",
    "fan_out",
    "dashboard",
)
DEFAULT_N = {
    "append": 2000,
    "start": 1000,
    "drain": 2000,
    "drain_traced": 2000,
    "slow_step": 1000,
    "fairness": 20_000,
    "scan": 1_000_000,
    "wake": 50,
    "wake_scale": 100_000,
    "awaited_append": 1000,
    "profile": 2000,
    "unanalysed": 10_000,
    "tasks": 2000,
    "fan_out": 1000,
    "dashboard": 1_000_000,
}
#: Waiting runs (beside the one woken) at which wake_scale times an append.
WAKE_SCALE_SIZES = (10, 1_000, 10_000, 100_000)
#: Scan-path figures stop here: they grow linearly, as they must.
WAKE_SCAN_LIMIT = 10_000
WAKE_SCALE_TRIALS = 30
MEMORY_SIZES = (5_000, 50_000)
#: Timed claims of the scan scenario; it seeds a full batch of due rows for each.
SCAN_CLAIMS = 200
#: Due runs of the small tenant in the fairness scenario.
FAIRNESS_SMALL = 10
#: How long the slow run's step of slow_step sleeps, in seconds (``--slow-seconds``).
SLOW_SECONDS = 5.0


# --- the bench workflows (registered wherever this module is imported) --------


def _first(ctx: Any) -> dict[str, Any]:
    return {"key": ctx.event.payload["key"], "n": 1}


def _second(ctx: Any) -> int:
    # Reads the result of the step before the wait: restored from the pending row.
    return int(ctx.steps["first"]["n"]) + 1


def _wake_at(ctx: Any) -> str:
    return str(ctx.event.payload["wake_at"])


def _wake_match_for(key: str) -> dict[str, Any]:
    return {
        "version": 1,
        "expr": {"kind": "atom", "path": ["key"], "op": {"kind": "eq", "value": key}},
    }


def _wake_match(ctx: Any) -> dict[str, Any]:
    return _wake_match_for(ctx.event.payload["key"])


def _nap(ctx: Any) -> float:
    # The slow step of slow_step: it holds its worker as a long computation or
    # a slow remote call would. The length is the run's, from its trigger.
    seconds = float(ctx.event.payload["seconds"])
    time.sleep(seconds)
    return seconds


def _done(ctx: Any) -> bool:
    return ctx.steps["go"] is not None


def _noop(ctx: Any) -> None:
    return None


def _key(event: Any) -> str:
    return str(event.payload["key"])


def _fan_items(ctx: Any) -> list[int]:
    return list(range(ctx.event.payload["count"]))


def register_bench_workflows() -> None:
    """Register the bench's workflows in this process (again is a no-op).

    Only the bench command and its worker processes call this, so importing
    the module registers nothing.
    """
    define_workflow(
        DRAIN_WORKFLOW,
        on_event(DRAIN_TRIGGER),
        idempotency_key=_key,
        steps=[compute("first", _first), wait(_wake_at), compute("second", _second)],
    )
    define_workflow(
        WAKE_WORKFLOW,
        on_event(WAKE_TRIGGER),
        idempotency_key=_key,
        awaits={"go": WAKE_EVENT},
        steps=[wait_for_event("go", match=_wake_match), compute("done", _done)],
    )
    define_workflow(
        SLOW_WORKFLOW,
        on_event(SLOW_TRIGGER),
        idempotency_key=_key,
        steps=[wait(_wake_at), compute("nap", _nap)],
    )
    # The same, committing alone: claimed on its own, it holds no batch's rows.
    define_workflow(
        SLOW_ALONE_WORKFLOW,
        on_event(SLOW_ALONE_TRIGGER),
        idempotency_key=_key,
        steps=[wait(_wake_at), compute("nap", _nap)],
        commit="per_run",
    )
    # One parent, one child per item (scenario fan_out): each child queued for
    # a worker, as ONE_STEP_WORKFLOW's runs are; the last to finish wakes the parent.
    child = define_workflow(
        FAN_CHILD_WORKFLOW, on_call(), start="worker", steps=[compute("noop", _noop)]
    )
    define_workflow(
        FAN_WORKFLOW,
        on_event(FAN_TRIGGER),
        idempotency_key=_key,
        steps=[fan_out("children", workflow=child, items=_fan_items)],
    )
    # A task's equivalent run (scenario tasks): queued for a worker, one no-op step.
    define_workflow(
        ONE_STEP_WORKFLOW,
        on_event(ONE_STEP_TRIGGER),
        idempotency_key=_key,
        start="worker",
        steps=[compute("noop", _noop)],
    )


# --- results ---------------------------------------------------------------------


@dataclass
class Result:
    scenario: str
    n: int
    seconds: float
    per_sec: float
    ratio: float | None = None
    baseline: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass
class Skipped:
    scenario: str
    reason: str


class Bench:
    """Runs scenarios, each in a fresh scratch database; ``out`` prints one line."""

    def __init__(
        self,
        *,
        n: int | None,
        rounds: int,
        out: Callable[[str], None],
        worker_command: list[str],
        worker_env: dict[str, str],
        slow_seconds: float = SLOW_SECONDS,
        dashboard_data: str | None = None,
    ) -> None:
        self.n = n
        self.dashboard_data = dashboard_data
        self.slow_seconds = slow_seconds
        self.rounds = max(1, rounds)
        self.out = out
        self.worker_command = worker_command
        self.worker_env = worker_env
        self.tenant = f"kumiko-bench-{uuid.uuid4().hex[:10]}"
        self.results: list[Result | Skipped] = []
        self.vendor = connection.vendor
        self.scratch: ScratchDatabase | None = None
        self.workers: list[subprocess.Popen[Any]] = []
        register_bench_workflows()

    # -- helpers ----------------------------------------------------------------

    def size(self, scenario: str) -> int:
        return self.n if self.n is not None else DEFAULT_N[scenario]

    def emit(self, result: Result) -> None:
        self.results.append(result)
        self.out(
            f"RESULT name=kumiko_{result.scenario} n={result.n} seconds={result.seconds:.4f} "
            f"per_sec={result.per_sec:.1f}"
        )
        if result.ratio is not None:
            self.out(f"RATIO name={result.scenario} value={result.ratio:.3f}")

    def skip(self, scenario: str, reason: str) -> None:
        self.results.append(Skipped(scenario, reason))
        self.out(f"SKIPPED name=kumiko_{scenario} reason={reason}")

    def table(self, name: str) -> str:
        return connection.ops.quote_name(f"{PREFIX}_{name}")

    def execute(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(sql, list(params))
            return cursor.fetchall() if cursor.description else []

    def run(self, scenarios: Iterable[str]) -> None:
        """Run ``scenarios`` in a scratch database, dropped at the end whatever happens."""
        with ScratchDatabase() as scratch:
            self.scratch = scratch
            self.out(f"kumiko_bench: scratch database {scratch.name} (dropped at the end)")
            try:
                for scenario in scenarios:
                    getattr(self, f"scenario_{scenario}")()
            finally:
                # A scenario that failed may leave workers running: none may
                # hold a session in the scratch database when it is dropped.
                for proc in self.workers:
                    if proc.poll() is None:
                        proc.kill()
                        proc.communicate(timeout=30)
                self.scratch = None

    # -- scratch data -------------------------------------------------------------

    def fresh_database(self) -> None:
        """Start a measurement on an empty, freshly migrated scratch database."""
        assert self.scratch is not None, "scenarios run inside Bench.run"
        self.workers = [proc for proc in self.workers if proc.poll() is None]
        self.scratch.renew()

    def scratch_like(self, name: str, model: type[Any]) -> str:
        """Create a scratch table with ``model``'s columns, constraints and indexes."""
        scratch = self.table(name)
        source = connection.ops.quote_name(model._meta.db_table)
        if self.vendor == "postgresql":
            self.execute(f"CREATE TABLE {scratch} (LIKE {source} INCLUDING ALL)")
            return scratch
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT sql FROM sqlite_master WHERE tbl_name = %s AND sql IS NOT NULL",
                [model._meta.db_table],
            )
            statements = [row[0] for row in cursor.fetchall()]
        plain = model._meta.db_table
        for statement in statements:
            renamed = statement.replace(f'"{plain}"', scratch).replace(
                " INDEX ", f" INDEX {PREFIX}_"
            )
            self.execute(renamed.replace(f'INDEX {PREFIX}_"', f'INDEX "{PREFIX}_'))
        return scratch

    # -- workers ------------------------------------------------------------------

    def start_workers(self, mode: str, count: int, *extra: str) -> list[subprocess.Popen[Any]]:
        assert self.scratch is not None and self.scratch.exists, "workers need a scratch database"
        procs = []
        for _ in range(count):
            proc = subprocess.Popen(
                [
                    *self.worker_command,
                    "--worker",
                    mode,
                    "--tenant",
                    self.tenant,
                    "--scratch",
                    self.scratch.name,
                    *extra,
                ],
                env=self.worker_env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            self.workers.append(proc)
        for proc in procs:
            line = proc.stdout.readline() if proc.stdout else ""
            if not line.startswith("READY"):
                for other in procs:
                    other.kill()
                raise RuntimeError(f"bench worker did not start: {line!r}")
        return procs

    def go(self, procs: list[subprocess.Popen[Any]]) -> tuple[float, list[dict[str, Any]]]:
        """Release started workers together; how long their work took, and their reports.

        The time is the slowest worker's own, from reading GO to its last
        row (each report's ``seconds``): the processes' start and exit (about
        a tenth of a second here) are no part of the work, and would weigh
        most on the fastest side of a ratio.
        """
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("GO\n")
            proc.stdin.flush()
        reports = []
        for proc in procs:
            assert proc.stdout is not None
            out, _ = proc.communicate(timeout=3600)
            done = [line for line in out.splitlines() if line.startswith("DONE ")]
            if proc.returncode != 0 or not done:
                raise RuntimeError(f"bench worker failed (exit {proc.returncode}): {out[-2000:]}")
            reports.append(json.loads(done[-1][5:]))
        return max(float(report["seconds"]) for report in reports), reports

    # -- seeding --------------------------------------------------------------------

    def seed_due_runs(
        self, count: int, *, traced: bool = False, tenant: str | None = None
    ) -> list[uuid.UUID]:
        """``count`` due runs of the drain workflow (in ``tenant``, default the bench's), each
        with its own trigger event.

        One run is started through ``append_event`` (the real engine); the
        rest are copies of its rows written with ``bulk_create``, so they have
        exactly the shape the projections give, at a fraction of the cost.
        ``traced``: their state links to a start span, as a traced start's does.
        """
        from kumiko_workflows.store.events import append_event

        tenant = tenant or self.tenant

        past = (timezone.now() - timedelta(minutes=5)).isoformat()
        template_key = f"t-{uuid.uuid4().hex}"
        append_event(
            uuid.uuid4(),
            SOURCE,
            DRAIN_TRIGGER,
            {"key": template_key, "wake_at": past},
            tenant_id=tenant,
        )
        template_id = run_id_for(DRAIN_WORKFLOW, template_key, tenant)
        stream = Event.objects.filter(tenant_id=tenant, aggregate_id=template_id)
        started, waiting = list(stream.order_by("version"))
        assert waiting.type == et.WAITING, "the drain workflow must suspend at its wait"
        run = WorkflowRun.objects.get(run_id=template_id)
        pending = WorkflowRunPending.objects.get(run_id=template_id)
        if traced:
            link = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
            pending.state = {**pending.state, "trace": link}
            WorkflowRunPending.objects.filter(pk=pending.pk).update(state=pending.state)
        run_ids = [template_id]
        chunk = 2000
        made = 1
        while made < count:
            size = min(chunk, count - made)
            keys = [f"k-{uuid.uuid4().hex}" for _ in range(size)]
            triggers = Event.objects.bulk_create(
                [
                    Event(
                        tenant_id=tenant,
                        aggregate_id=uuid.uuid4(),
                        aggregate_type=SOURCE,
                        version=1,
                        type=DRAIN_TRIGGER,
                        payload={"key": key, "wake_at": past},
                    )
                    for key in keys
                ]
            )
            events, runs, rows = [], [], []
            for key, trigger in zip(keys, triggers, strict=True):
                run_id = run_id_for(DRAIN_WORKFLOW, key, tenant)
                run_ids.append(run_id)
                for template in (started, waiting):
                    payload = {**template.payload, "trigger_event_id": trigger.id}
                    if template is started:
                        payload["idempotency_key"] = key
                    events.append(
                        Event(
                            tenant_id=tenant,
                            aggregate_id=run_id,
                            aggregate_type=et.RUN_AGGREGATE_TYPE,
                            version=template.version,
                            type=template.type,
                            payload=payload,
                            created_by=template.created_by,
                        )
                    )
                runs.append(
                    _copy(run, run_id=run_id, idempotency_key=key, trigger_event_id=trigger.id)
                )
                rows.append(_copy(pending, id=None, run_id=run_id, trigger_event_id=trigger.id))
            Event.objects.bulk_create(events)
            WorkflowRun.objects.bulk_create(runs)
            WorkflowRunPending.objects.bulk_create(rows)
            made += size
        if self.vendor == "postgresql":
            self.execute("ANALYZE")
        return run_ids

    def verify_completed_once(self, run_ids: list[uuid.UUID]) -> None:
        """Every run resumed exactly once and completed exactly once; nothing left pending."""
        counts = {
            (row["type"]): row["n"]
            for row in Event.objects.filter(
                tenant_id=self.tenant,
                aggregate_type=et.RUN_AGGREGATE_TYPE,
                type__in=[et.RESUMED, et.RUN_COMPLETED, et.RUN_FAILED],
            )
            .values("type")
            .annotate(n=_count())
        }
        per_run = (
            Event.objects.filter(tenant_id=self.tenant, type__in=[et.RESUMED, et.RUN_COMPLETED])
            .values("aggregate_id", "type")
            .annotate(n=_count())
            .filter(n__gt=1)
            .count()
        )
        completed = WorkflowRun.objects.filter(
            tenant_id=self.tenant, run_id__in=run_ids, status=RunStatus.COMPLETED
        ).count()
        left = WorkflowRunPending.objects.filter(tenant_id=self.tenant).count()
        want = len(run_ids)
        problems = []
        if counts.get(et.RESUMED, 0) != want or counts.get(et.RUN_COMPLETED, 0) != want:
            problems.append(f"event counts {counts} for {want} runs")
        if per_run:
            problems.append(f"{per_run} streams resumed or completed more than once")
        if completed != want:
            problems.append(f"{completed} of {want} runs completed")
        if left:
            problems.append(f"{left} pending rows left")
        if problems:
            raise RuntimeError("drain verification failed: " + "; ".join(problems))

    def copy_to_floor(self) -> tuple[str, str]:
        """Scratch copies of the bench tenant's rows as seeded, for an SQL floor.

        Made again on each call (the tables dropped first), also after the
        engine drained the rows: of the run streams only the first two
        events (started, waiting) are copied, and the pending rows come from
        the copy :meth:`keep_seeded_pending` made before the drain.
        """
        events = self.table("floor_events")
        pending = self.table("floor_pending")
        for table in (events, pending):
            self.execute(f"DROP TABLE IF EXISTS {table}")
        self.scratch_like("floor_events", Event)
        self.scratch_like("floor_pending", WorkflowRunPending)
        source_events = connection.ops.quote_name(Event._meta.db_table)
        # Without their ids: the copy's own identity starts at 1 (PostgreSQL's
        # LIKE ... INCLUDING ALL makes a new one), and on a fresh database the
        # copied ids start at 1 too, so the floor's first INSERT would collide.
        columns = ", ".join(
            connection.ops.quote_name(f.column)
            for f in Event._meta.concrete_fields
            if f.column is not None and not f.primary_key
        )
        self.execute(
            f"INSERT INTO {events} ({columns}) "  # noqa: S608
            f"SELECT {columns} FROM {source_events} WHERE tenant_id = %s "
            "AND (aggregate_type <> %s OR version <= 2) ORDER BY id",
            [self.tenant, et.RUN_AGGREGATE_TYPE],
        )
        self.execute(
            f"INSERT INTO {pending} SELECT * FROM {self.table('seeded_pending')}"  # noqa: S608
        )
        if self.vendor == "postgresql":
            self.execute(f"ANALYZE {events}")
            self.execute(f"ANALYZE {pending}")
        return events, pending

    def keep_seeded_pending(self) -> None:
        """Keep a copy of the bench tenant's pending rows as seeded, for the floors' copies."""
        kept = self.table("seeded_pending")
        source = connection.ops.quote_name(WorkflowRunPending._meta.db_table)
        self.execute(f"DROP TABLE IF EXISTS {kept}")
        # Columns only (no indexes: their names would clash with the floor's copy's).
        self.execute(
            f"CREATE TABLE {kept} AS SELECT * FROM {source} WHERE tenant_id = %s",  # noqa: S608
            [self.tenant],
        )

    # -- scenarios ------------------------------------------------------------------

    def scenario_append(self) -> None:
        from kumiko_workflows.store.events import append_event

        n = self.size("append")
        self.fresh_database()
        scratch = self.scratch_like("append", Event)
        columns = (
            "tenant_id, aggregate_id, aggregate_type, version, type, event_version, "
            "payload, metadata, created_by, created_at"
        )
        insert = f"INSERT INTO {scratch} ({columns}) VALUES (%s, %s, %s, 1, %s, 1, %s, %s, '', %s)"  # noqa: S608
        payload = {"order_id": 1, "amount": "12.50", "currency": "EUR", "note": "bench"}
        raw = _raw_connection()
        if self.vendor == "sqlite":
            insert = insert.replace("%s", "?")
        engine_times, raw_times = [], []
        per_round = max(1, n // self.rounds)
        for _ in range(self.rounds):
            started = time.perf_counter()
            for _ in range(per_round):
                append_event(uuid.uuid4(), SOURCE, APPEND_TYPE, payload, tenant_id=self.tenant)
            engine_times.append(time.perf_counter() - started)
            text = json.dumps(payload)
            started = time.perf_counter()
            cursor = raw.cursor()
            for _ in range(per_round):
                aggregate = uuid.uuid4()
                cursor.execute(
                    insert,
                    (
                        self.tenant,
                        aggregate if self.vendor == "postgresql" else aggregate.hex,
                        SOURCE,
                        APPEND_TYPE,
                        text,
                        "{}",
                        connection.ops.adapt_datetimefield_value(timezone.now()),
                    ),
                )
            cursor.close()
            raw_times.append(time.perf_counter() - started)
        self._ratio_result("append", per_round, engine_times, raw_times, "raw INSERT", higher=True)

    def scenario_start(self) -> None:
        from kumiko_workflows.store.events import append_event

        n = self.size("start")
        self.fresh_database()
        future = (timezone.now() + timedelta(days=1)).isoformat()
        started = time.perf_counter()
        for _ in range(n):
            append_event(
                uuid.uuid4(),
                SOURCE,
                DRAIN_TRIGGER,
                {"key": uuid.uuid4().hex, "wake_at": future},
                tenant_id=self.tenant,
            )
        seconds = time.perf_counter() - started
        waiting = WorkflowRun.objects.filter(
            tenant_id=self.tenant, status=RunStatus.WAITING
        ).count()
        if waiting != n:
            raise RuntimeError(f"start: {waiting} of {n} runs are waiting")
        self.emit(Result("start", n, seconds, n / seconds))

    def scenario_drain(self) -> None:
        """Due runs drained by the engine, each mode beside the best hand-written SQL.

        The engine drains at the configured ``BATCH_SIZE`` (runs per commit)
        and at ``BATCH_SIZE=1`` (a commit per run); with PostgreSQL also by
        two workers at the configured size, and by one with ``BATCH_TOGETHER``
        off (each row claimed when its turn comes, each run's last events
        written in a statement of its own).
        In the same round, on copies of the same rows, with as many processes:
        the per-run floor (a run per transaction) beside every mode, and the
        batched floor (``BATCH_SIZE`` runs per transaction, written as sets)
        beside the batched modes.
        Every floor statement is prepared, as the engine's are.
        """
        n = self.size("drain")
        batch = int(_setting("BATCH_SIZE"))
        two = self.vendor == "postgresql"
        if not two:
            self.out(
                "SKIPPED name=kumiko_drain_2 reason=SQLite allows one writer: two workers "
                "need PostgreSQL"
            )
        # name, worker processes, BATCH_SIZE in the workers, note
        modes = [
            ("drain", 1, batch, f"BATCH_SIZE={batch}"),
            ("drain_batch1", 1, 1, "BATCH_SIZE=1, a commit per run"),
            *((("drain_2", 2, batch, f"BATCH_SIZE={batch}"),) if two else ()),
            # Each row claimed when its turn comes, each run's last events written alone.
            *(
                (("drain_row_by_row", 1, batch, f"BATCH_SIZE={batch}, BATCH_TOGETHER off"),)
                if two
                else ()
            ),
        ]
        engine_times: dict[str, list[float]] = {name: [] for name, *_ in modes}
        floor_times: dict[str, list[float]] = {name: [] for name, *_ in modes}
        batched_times: dict[str, list[float]] = {name: [] for name, *_ in modes}
        for _ in range(self.rounds):
            for name, workers, size, _note in modes:
                self.fresh_database()
                run_ids = self.seed_due_runs(n)
                self.keep_seeded_pending()
                mode = "drain_row_by_row" if name == "drain_row_by_row" else "drain"
                procs = self.start_workers(mode, workers, "--batch-size", str(size))
                seconds, reports = self.go(procs)
                if any(report["batch_size"] != size for report in reports):
                    raise RuntimeError(f"{name}: the workers did not drain at BATCH_SIZE={size}")
                self.verify_completed_once(run_ids)
                engine_times[name].append(seconds)
                floors = [("floor", floor_times)] + (
                    [("floor_batch", batched_times)] if size > 1 else []
                )
                for floor, times in floors:
                    # Each floor on fresh copies of the bench tenant's rows as seeded.
                    self.copy_to_floor()
                    procs = self.start_workers(floor, workers, "--batch-size", str(size))
                    seconds, reports = self.go(procs)
                    done = sum(report["processed"] for report in reports)
                    if done != n:
                        raise RuntimeError(f"the SQL {floor} resumed {done} of {n} runs")
                    times[name].append(seconds)
        plural = {1: "process", 2: "processes"}
        for name, workers, size, note in modes:
            label = f"SQL floor, a run per transaction, {workers} {plural[workers]}"
            self._ratio_result(name, n, engine_times[name], floor_times[name], label, note=note)
            if batched_times[name]:
                label = (
                    f"batched SQL floor, {size} runs per transaction, {workers} {plural[workers]}"
                )
                self._ratio_result(
                    f"{name}_vs_batched_floor",
                    n,
                    engine_times[name],
                    batched_times[name],
                    label,
                    note=note,
                )
        if two:

            def two_vs_one(times: dict[str, list[float]]) -> float:
                pairs = zip(times["drain"], times["drain_2"], strict=True)
                return statistics.median(one / two for one, two in pairs)

            scaling = two_vs_one(engine_times)
            self.out(f"RATIO name=drain_2_vs_1 value={scaling:.3f}")
            # What two processes gain on this machine for the same work by hand.
            gains = {"floor": two_vs_one(floor_times), "floor_batch": two_vs_one(batched_times)}
            for floor, ratio in gains.items():
                self.out(f"RATIO name={floor}_2_vs_1 value={ratio:.3f}")
            two_times = engine_times["drain_2"]
            self.results.append(
                Result(
                    "drain_2_vs_1",
                    n,
                    statistics.median(two_times),
                    n / statistics.median(two_times),
                    scaling,
                    "kumiko, 1 worker",
                    note=(
                        f"the per-run floor's 2 / 1: {gains['floor']:.2f}; "
                        f"the batched floor's: {gains['floor_batch']:.2f}"
                    ),
                )
            )

    def scenario_tasks(self) -> None:
        """No-op Django tasks enqueued, then drained by one worker, beside one-step runs.

        The same worker drains the same number of queued one-step runs of a
        plain workflow in the same round: the ratio is what a task costs over
        a run (the framework's TaskResult, its signals, the attempt row).
        """
        from kumiko_workflows.conf import workflow_settings

        n = self.size("tasks")
        enqueue_times: list[float] = []
        task_times: list[float] = []
        run_times: list[float] = []
        with override_settings(TASKS=bench_tasks_setting()):
            from kumiko_bench import bench_tasks

            for _ in range(self.rounds):
                self.fresh_database()
                started = time.perf_counter()
                for _ in range(n):  # each in its own transaction, as a web request's
                    bench_tasks.noop.enqueue()
                enqueue_times.append(time.perf_counter() - started)
                seconds, _reports = self.go(self.start_workers("tasks", 1))
                done = WorkflowRun.objects.filter(
                    tenant_id=workflow_settings.DEFAULT_TENANT,
                    workflow_name="task:default",
                    status=RunStatus.COMPLETED,
                ).count()
                if done != n:
                    raise RuntimeError(f"tasks: {done} of {n} tasks completed")
                task_times.append(seconds)
                self.fresh_database()
                self.seed_one_step_runs(n)
                seconds, _reports = self.go(self.start_workers("drain", 1))
                done = WorkflowRun.objects.filter(
                    tenant_id=self.tenant, status=RunStatus.COMPLETED
                ).count()
                if done != n:
                    raise RuntimeError(f"tasks: {done} of {n} one-step runs completed")
                run_times.append(seconds)
        enqueue = statistics.median(enqueue_times)
        self.emit(Result("tasks_enqueue", n, enqueue, n / enqueue, note="enqueue, autocommit"))
        self._ratio_result(
            "tasks", n, task_times, run_times, "kumiko one-step runs, 1 worker", note="execute"
        )
        self._tasks_beside_tasks_db(n, task_times, enqueue_times)

    def _tasks_beside_tasks_db(
        self, n: int, task_times: list[float], enqueue_times: list[float]
    ) -> None:
        """django-tasks-db's ``db_worker`` on the same no-op tasks, one worker, same rounds.

        Its rounds follow the engine's (the same count, interleaved by the
        caller's loop order: engine rounds first, each database fresh).
        """
        if not apps.is_installed("django_tasks_db"):
            self.out(
                "SKIPPED name=tasks_vs_tasks_db reason=django-tasks-db is not installed "
                "(pip install -e '.[bench]')"
            )
            return
        from django_tasks_db.models import DBTaskResult

        db_enqueue: list[float] = []
        db_execute: list[float] = []
        with override_settings(TASKS=tasks_db_setting()):
            from kumiko_bench import bench_tasks

            for _ in range(self.rounds):
                self.fresh_database()
                started = time.perf_counter()
                for _ in range(n):
                    bench_tasks.noop.enqueue()
                db_enqueue.append(time.perf_counter() - started)
                seconds, _reports = self.go(self.start_workers("tasks_db", 1))
                done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
                if done != n:
                    raise RuntimeError(f"tasks_db: {done} of {n} tasks succeeded")
                db_execute.append(seconds)
        self._ratio_result(
            "tasks_vs_tasks_db",
            n,
            task_times,
            db_execute,
            "django-tasks-db db_worker, 1 worker",
            note="execute",
        )
        self._ratio_result(
            "tasks_enqueue_vs_tasks_db",
            n,
            enqueue_times,
            db_enqueue,
            "django-tasks-db enqueue",
            note="enqueue, autocommit",
        )

    def seed_one_step_runs(self, n: int) -> None:
        """``n`` runs of the one-step workflow, queued for a worker, each by its own trigger."""
        from kumiko_workflows.store.events import append_event

        for _ in range(n):
            append_event(
                uuid.uuid4(),
                SOURCE,
                ONE_STEP_TRIGGER,
                {"key": uuid.uuid4().hex},
                tenant_id=self.tenant,
            )

    def scenario_fan_out(self) -> None:
        """One parent with N children, 2 workers, beside N independent runs drained alike.

        The parent's trigger starts it inline: its fan-out requests N children
        and queues them (one transaction). Two worker processes then run the
        children; the last to finish wakes the parent, which completes. The
        time is from the trigger's append to the parent's completion. The
        baseline: N independent one-step runs queued in one transaction (the
        same queued start each child has) and drained by two workers the same
        way. Ratio: baseline time / fan-out time (1.0: composition costs
        nothing). Also printed: the children's and the baseline's time per
        run, and each round's two parts on each side (``FAN_OUT`` lines): the
        one transaction (the parent's, which requests and queues every
        child; the baseline's, which queues every run) and the two workers'
        drain (for the fan-out: the children, the fan-in, the parent's wake
        and its last resume).
        """
        from kumiko_workflows.store.events import append_event

        if self.vendor != "postgresql":
            self.skip("fan_out", "SQLite allows one writer: two workers need PostgreSQL")
            return
        n = self.size("fan_out")
        fan_times: list[float] = []
        run_times: list[float] = []
        for _ in range(self.rounds):
            self.fresh_database()
            procs = self.start_workers("drain", 2)
            key = uuid.uuid4().hex
            started = time.perf_counter()
            append_event(
                uuid.uuid4(), SOURCE, FAN_TRIGGER, {"key": key, "count": n}, tenant_id=self.tenant
            )
            parent_tx = time.perf_counter() - started
            fan_drain, _ = self.go(procs)
            fan_times.append(time.perf_counter() - started)
            parent = WorkflowRun.objects.get(run_id=run_id_for(FAN_WORKFLOW, key, self.tenant))
            children = WorkflowRun.objects.filter(
                tenant_id=self.tenant, parent_run_id=parent.run_id, status=RunStatus.COMPLETED
            ).count()
            if parent.status != RunStatus.COMPLETED or children != n:
                raise RuntimeError(
                    f"fan_out: parent {parent.status}, {children} of {n} children completed"
                )

            self.fresh_database()
            procs = self.start_workers("drain", 2)
            started = time.perf_counter()
            with transaction.atomic():
                self.seed_one_step_runs(n)
            seed_tx = time.perf_counter() - started
            runs_drain, _ = self.go(procs)
            run_times.append(time.perf_counter() - started)
            self.out(
                f"FAN_OUT n={n} fan_s={fan_times[-1]:.3f} parent_tx_s={parent_tx:.3f} "
                f"children_s={fan_drain:.3f} runs_s={run_times[-1]:.3f} seed_tx_s={seed_tx:.3f} "
                f"runs_drain_s={runs_drain:.3f} load={os.getloadavg()[0]:.2f}"
            )
            done = WorkflowRun.objects.filter(
                tenant_id=self.tenant, status=RunStatus.COMPLETED
            ).count()
            if done != n:
                raise RuntimeError(f"fan_out: {done} of {n} independent runs completed")
        fan, base = statistics.median(fan_times), statistics.median(run_times)
        self._ratio_result(
            "fan_out",
            n,
            fan_times,
            run_times,
            "kumiko independent one-step runs, 2 workers",
            note=(
                f"trigger to parent completion, 2 workers; {1000 * fan / n:.2f} ms per child, "
                f"{1000 * base / n:.2f} ms per independent run"
            ),
        )

    def scenario_drain_traced(self) -> None:
        """The drain with tracing and metrics on beside it off, interleaved in each round.

        On: the worker process installs the OpenTelemetry SDK as a site would
        (global providers, batched span export, metrics exported every 10
        seconds, the due-backlog gauge included) with exporters that count
        and drop; each run's state links to a start span. Off: the API
        without an SDK, the state of a site that configured none.
        """
        try:
            import opentelemetry.sdk  # noqa: F401 - only whether it is installed
        except ImportError:
            self.skip("drain_traced", "needs opentelemetry-sdk (pip install -e '.[test]')")
            return
        n = self.size("drain_traced")
        times: dict[str, list[float]] = {"drain": [], "drain_traced": []}
        cpu: dict[str, list[float]] = {"drain": [], "drain_traced": []}
        spans = []
        for round_ in range(self.rounds):
            modes = ["drain", "drain_traced"]
            for mode in modes if round_ % 2 == 0 else modes[::-1]:
                self.fresh_database()
                run_ids = self.seed_due_runs(n, traced=mode == "drain_traced")
                seconds, (report,) = self.go(self.start_workers(mode, 1))
                self.verify_completed_once(run_ids)
                times[mode].append(seconds)
                cpu[mode].append(report["cpu_seconds"] / n * 1e6)
                if mode == "drain_traced":
                    spans.append(report["spans"])
        # Each run: its resumed segment and its one step after the wait.
        if min(spans) < 2 * n:
            raise RuntimeError(f"drain_traced: {min(spans)} spans exported for {n} runs")
        per_run = statistics.median(spans) / n
        # The worker's own CPU per run, less noisy than the wall clock on a
        # busy machine (the database's time is not in it).
        off, on = statistics.median(cpu["drain"]), statistics.median(cpu["drain_traced"])
        # The floor: the SDK alone, for the same spans and records; the best a
        # traced drain could reach is the drain off with that much more a run.
        sdk = statistics.median(_sdk_floor(n) for _ in range(self.rounds))
        wall = statistics.median(times["drain"]) / n * 1e6
        self.out(
            f"DRAIN_TRACED worker_cpu_us_per_run_off={off:.0f} "
            f"worker_cpu_us_per_run_on={on:.0f} overhead_us_per_run={on - off:.0f} "
            f"sdk_floor_us_per_run={sdk:.0f} best_ratio={wall / (wall + sdk):.2f}"
        )
        self._ratio_result(
            "drain_traced",
            n,
            times["drain_traced"],
            times["drain"],
            "tracing off",
            note=f"BATCH_SIZE={_setting('BATCH_SIZE')}, {per_run:.0f} spans per run exported",
        )

    def scenario_slow_step(self) -> None:
        """Quick due runs beside one whose step sleeps: how long the quick ones wait to start.

        ``N`` quick runs (the drain workflow) and one slow run, due before all
        of them, are drained by two worker processes: ``slow_step`` with the
        slow workflow committing with its batch (its batch's other rows wait
        for its step), ``slow_step_alone`` with it defined
        ``commit="per_run"`` (claimed on its own). A quick run's start lag is
        its ``workflow.step.resumed`` event's ``created_at`` minus the moment
        the workers were released.
        """
        if self.vendor != "postgresql":
            self.skip("slow_step", "SQLite allows one writer: two workers need PostgreSQL")
            return
        for name, workflow, trigger_type in (
            ("slow_step", SLOW_WORKFLOW, SLOW_TRIGGER),
            ("slow_step_alone", SLOW_ALONE_WORKFLOW, SLOW_ALONE_TRIGGER),
        ):
            self._slow_step(name, workflow, trigger_type)

    def _slow_step(self, name: str, workflow: str, trigger_type: str) -> None:
        from kumiko_workflows.store.events import append_event

        n = self.size("slow_step")
        walls: list[float] = []
        p50s: list[float] = []
        p95s: list[float] = []
        maxes: list[float] = []
        for _ in range(self.rounds):
            self.fresh_database()
            # Started first: a wait until a past instant is due when it starts,
            # so the slow run is the oldest due row, the first a worker claims.
            key = f"slow-{uuid.uuid4().hex}"
            append_event(
                uuid.uuid4(),
                SOURCE,
                trigger_type,
                {"key": key, "wake_at": timezone.now().isoformat(), "seconds": self.slow_seconds},
                tenant_id=self.tenant,
            )
            slow = run_id_for(workflow, key, self.tenant)
            quick = self.seed_due_runs(n)
            procs = self.start_workers("drain", 2)
            released = timezone.now()
            seconds, _ = self.go(procs)
            self.verify_completed_once([*quick, slow])
            lags = [
                (resumed_at - released).total_seconds()
                for resumed_at in Event.objects.filter(tenant_id=self.tenant, type=et.RESUMED)
                .exclude(aggregate_id=slow)
                .values_list("created_at", flat=True)
            ]
            walls.append(seconds)
            p50s.append(_pct(lags, 50))
            p95s.append(_pct(lags, 95))
            maxes.append(max(lags))
        p50, p95, most = (statistics.median(values) for values in (p50s, p95s, maxes))
        seconds = statistics.median(walls)
        alone = ", committing alone" if workflow == SLOW_ALONE_WORKFLOW else ""
        self.emit(
            Result(
                name,
                n,
                seconds,
                n / seconds,
                extra={
                    "quick_p50_s": p50,
                    "quick_p95_s": p95,
                    "quick_max_s": most,
                    "slow_seconds": self.slow_seconds,
                },
                note=(
                    f"quick runs start after p50 {p50:.3f} s, p95 {p95:.3f} s, "
                    f"max {most:.3f} s; one step sleeps {self.slow_seconds:g} s{alone}"
                ),
            )
        )
        self.out(
            f"SLOW_STEP name={name} quick_p50_s={p50:.3f} quick_p95_s={p95:.3f} "
            f"quick_max_s={most:.3f} slow_s={self.slow_seconds:g}"
        )

    def scenario_fairness(self) -> None:
        """A small tenant's due runs beside a big tenant's backlog, two ``--loop`` workers.

        Tenant A has ``N`` due runs of the drain workflow, tenant B (whose id
        sorts after A's) ``FAIRNESS_SMALL``. Each round drains A alone and A
        beside B (in alternating order), on fresh databases, the two workers
        released together: B's start lag is
        each ``workflow.step.resumed`` event's ``created_at`` minus the
        release, and A's rate beside B is compared with its rate alone.
        """
        if self.vendor != "postgresql":
            self.skip("fairness", "SQLite allows one writer: two workers need PostgreSQL")
            return
        n = self.size("fairness")
        small = FAIRNESS_SMALL
        other = f"{self.tenant}-z"
        alone: list[float] = []
        beside: list[float] = []
        p50s: list[float] = []
        p95s: list[float] = []
        maxes: list[float] = []
        for round_ in range(self.rounds):
            # Alternating, so neither mode is always the second on a fresh database.
            for with_small in (False, True) if round_ % 2 == 0 else (True, False):
                self.fresh_database()
                big = self.seed_due_runs(n)
                few = self.seed_due_runs(small, tenant=other) if with_small else []
                procs = self.start_workers("fair", 2)
                released = timezone.now()
                seconds = self._until_completed(procs, len(big) + len(few))
                self.verify_completed_once(big)
                (alone, beside)[with_small].append(seconds)
                if with_small:
                    lags = [
                        (resumed_at - released).total_seconds()
                        for resumed_at in Event.objects.filter(
                            tenant_id=other, type=et.RESUMED
                        ).values_list("created_at", flat=True)
                    ]
                    if len(lags) != small:
                        raise RuntimeError(f"fairness: {len(lags)} of {small} small runs resumed")
                    p50s.append(_pct(lags, 50))
                    p95s.append(_pct(lags, 95))
                    maxes.append(max(lags))
        p50, p95, most = (statistics.median(values) for values in (p50s, p95s, maxes))
        # A's rate beside B over its rate alone (B's few runs left out of the count).
        rate = statistics.median(a / b for a, b in zip(alone, beside, strict=True))
        self.emit(
            Result(
                "fairness",
                n,
                statistics.median(beside),
                n / statistics.median(beside),
                rate,
                "the big tenant alone",
                extra={"small_p50_s": p50, "small_p95_s": p95, "small_max_s": most},
                note=(
                    f"{small} runs of another tenant start after p50 {p50:.3f} s, "
                    f"p95 {p95:.3f} s, max {most:.3f} s; 2 --loop workers"
                ),
            )
        )
        self.out(
            f"FAIRNESS small_p50_s={p50:.3f} small_p95_s={p95:.3f} small_max_s={most:.3f} "
            f"big_rate_vs_alone={rate:.3f} big_alone_s={statistics.median(alone):.3f} "
            f"big_beside_s={statistics.median(beside):.3f}"
        )

    def _until_completed(self, procs: list[subprocess.Popen[Any]], count: int) -> float:
        """Release ``--loop`` workers, wait until ``count`` runs completed, stop them: seconds."""
        started = time.perf_counter()
        try:
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("GO\n")
                proc.stdin.flush()
            while WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() < count:
                if any(proc.poll() is not None for proc in procs):
                    raise RuntimeError("fairness: a bench worker exited early")
                if time.perf_counter() - started > 3600:
                    raise RuntimeError("fairness: the runs did not complete within an hour")
                time.sleep(0.05)
            return time.perf_counter() - started
        finally:
            for proc in procs:
                proc.terminate()
                proc.communicate(timeout=60)

    def scenario_scan(self) -> None:
        not_due = self.size("scan")
        size = int(_setting("BATCH_SIZE"))
        due = SCAN_CLAIMS * size
        self.fresh_database()
        table = connection.ops.quote_name(WorkflowRunPending._meta.db_table)
        now = timezone.now()
        columns = (
            "tenant_id, run_id, step, workflow_name, suspension_type, wake_at, claim_at, "
            "retry_attempt, definition_fingerprint, wait_event_type, awaits_key, run_version, "
            "state, suspended_at"
        )
        for count, offset in ((not_due, timedelta(days=30)), (due, -timedelta(days=1))):
            wake_at = now + offset
            if self.vendor == "postgresql":
                self.execute(
                    f"INSERT INTO {table} ({columns}) "  # noqa: S608
                    "SELECT %s, gen_random_uuid(), '1', 'kumiko-bench-scan', 'wait', "
                    "%s + (i * interval '1 millisecond'), %s + (i * interval '1 millisecond'), "
                    "0, 'bench', '', '', 2, '{}', %s FROM generate_series(1, %s) AS i",
                    [self.tenant, wake_at, wake_at, now, count],
                )
            else:
                wake_text = connection.ops.adapt_datetimefield_value(wake_at)
                stamp = connection.ops.adapt_datetimefield_value(now)
                self.execute(
                    "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < %s) "  # noqa: S608
                    f"INSERT INTO {table} ({columns}) "
                    "SELECT %s, lower(hex(randomblob(16))), '1', 'kumiko-bench-scan', 'wait', "
                    "%s, %s, 0, 'bench', '', '', 2, '{}', %s FROM s",
                    [count, self.tenant, wake_text, wake_text, stamp],
                )
        if self.vendor == "postgresql":
            self.execute(f"ANALYZE {table}")
            self._checkpoint()
        # The claim's order (store/db.claim_due): the claim instant, due rows only.
        query = (
            WorkflowRunPending.objects.filter(
                tenant_id=self.tenant, claim_at__lte=now, wake_at__lte=now
            )
            .order_by("claim_at", "id")
            .select_for_update(skip_locked=connection.features.has_select_for_update_skip_locked)
        )
        with transaction.atomic():
            plan = query[:size].explain()
        plan_line = " | ".join(line.strip() for line in plan.splitlines() if line.strip())
        self.out(f"PLAN name=scan {plan_line}")
        uses_index = "kw_pending_claim" in plan
        # Timed: the same order read through the ORM, as a site's query would
        # read it, then the worker's own claim of a batch (its prepared
        # statement on PostgreSQL; a row at a time elsewhere, as the engine
        # claims there), each in a transaction that commits as a worker's
        # batch does (a rollback would make psycopg prepare the claim again),
        # the commit not timed. Each claim takes a batch of due rows for good.
        read = self._time_in_transactions(lambda: list(query[:size]))
        claimed = self._time_in_transactions(lambda: _claim_batch(self.tenant, now, size))
        counts = {len(rows) for rows, _ in read + claimed}
        if counts != {size}:
            raise RuntimeError(f"scan read or claimed {sorted(counts)} due rows, expected {size}")
        times = [seconds for _, seconds in claimed]
        ms = statistics.median(times) * 1000
        orm_ms = statistics.median(seconds for _, seconds in read) * 1000
        self.emit(
            Result(
                "scan",
                not_due,
                statistics.median(times),
                1 / statistics.median(times),
                extra={
                    "ms": ms,
                    "p95_ms": _pct(times, 95) * 1000,
                    "orm_ms": orm_ms,
                    "index": uses_index,
                },
                note=(
                    f"{ms:.3f} ms per claim of {size}, "
                    f"index {'used' if uses_index else 'NOT used'}; {orm_ms:.3f} ms through the ORM"
                ),
            )
        )
        self.out(f"SCAN ms={ms:.3f} orm_ms={orm_ms:.3f} index={'yes' if uses_index else 'no'}")
        if not uses_index and not_due >= 100_000:
            # (On a small table the planner rightly prefers a sequential scan.)
            raise RuntimeError("the due query does not use the kw_pending_claim index")

    def _checkpoint(self) -> None:
        """Write the seed's pages out now (PostgreSQL), so that no checkpoint it set off
        writes them back while the timings run; skipped for a role that may not."""
        try:
            with transaction.atomic():
                self.execute("CHECKPOINT")
        except DatabaseError as exc:
            self.out(f"NOTE name=checkpoint skipped: {exc}".strip())

    @staticmethod
    def _time_in_transactions(take: Callable[[], list[Any]]) -> list[tuple[list[Any], float]]:
        """``take`` SCAN_CLAIMS times, each in a transaction of its own (its commit untimed)."""
        taken = []
        for _ in range(SCAN_CLAIMS):
            with transaction.atomic():
                started = time.perf_counter()
                rows = take()
                taken.append((rows, time.perf_counter() - started))
        return taken

    def scenario_wake(self) -> None:
        from kumiko_workflows.store.events import append_event

        if self.vendor != "postgresql":
            self.skip("wake", "needs PostgreSQL (LISTEN/NOTIFY wakes --loop workers)")
            return
        trials = self.size("wake")
        self.fresh_database()
        procs = self.start_workers("loop", 1)
        latencies = []
        try:
            for _ in range(trials):
                key = uuid.uuid4().hex
                append_event(
                    uuid.uuid4(), SOURCE, WAKE_TRIGGER, {"key": key}, tenant_id=self.tenant
                )
                run_id = run_id_for(WAKE_WORKFLOW, key, self.tenant)
                time.sleep(0.05)  # let the worker go back to sleep
                started = time.perf_counter()
                append_event(uuid.uuid4(), SOURCE, WAKE_EVENT, {"key": key}, tenant_id=self.tenant)
                while not WorkflowRun.objects.filter(
                    run_id=run_id, status=RunStatus.COMPLETED
                ).exists():
                    if time.perf_counter() - started > 30:
                        raise RuntimeError("wake: a woken run did not complete within 30 s")
                    time.sleep(0.0005)
                latencies.append(time.perf_counter() - started)
        finally:
            for proc in procs:
                proc.terminate()
                proc.communicate(timeout=30)
        p50, p95 = _pct(latencies, 50), _pct(latencies, 95)
        self.emit(
            Result(
                "wake",
                trials,
                sum(latencies),
                trials / sum(latencies),
                extra={"p50_ms": p50 * 1000, "p95_ms": p95 * 1000},
                note=f"p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms",
            )
        )
        self.out(f"WAKE p50_ms={p50 * 1000:.1f} p95_ms={p95 * 1000:.1f}")

    def scenario_wake_scale(self) -> None:
        """One awaited ``append_event`` (and its wake-up) as the number of waiting runs grows.

        At each size, N runs of the tenant wait on distinct keys (copies of a
        real run's pending row and wait key); 30 times a real run starts and
        its event is appended in autocommit, so the timing includes the
        decision after commit. The scan-path figure adds N waits whose match
        requires no equality (``n > 10**9``) and times the same append.
        """
        from kumiko_workflows.store.events import append_event

        sizes = [size for size in WAKE_SCALE_SIZES if size <= self.size("wake_scale")]
        first_p50 = None
        for waiting in sizes:
            self.fresh_database()
            self._seed_waiting(waiting, scan=False)
            keyed = self._time_wakes(append_event)
            scan = None
            if waiting <= WAKE_SCAN_LIMIT:
                self._seed_waiting(waiting, scan=True)
                scan = self._time_wakes(append_event)
            p50, p95 = _pct(keyed, 50) * 1000, _pct(keyed, 95) * 1000
            first_p50 = first_p50 or p50
            scan_words = (
                f"scan p50 {_pct(scan, 50) * 1000:.1f} ms, p95 {_pct(scan, 95) * 1000:.1f} ms"
                if scan
                else f"scan not run above {WAKE_SCAN_LIMIT:,} (linear)"
            )
            self.emit(
                Result(
                    f"wake_scale_{waiting}",
                    len(keyed),
                    sum(keyed),
                    len(keyed) / sum(keyed),
                    extra={"p50_ms": p50, "p95_ms": p95, "waiting": waiting},
                    note=f"{waiting:,} waiting: p50 {p50:.1f} ms, p95 {p95:.1f} ms; {scan_words}",
                )
            )
            scan_fields = (
                f" scan_p50_ms={_pct(scan, 50) * 1000:.1f} scan_p95_ms={_pct(scan, 95) * 1000:.1f}"
                if scan
                else ""
            )
            self.out(f"WAKE_SCALE waiting={waiting} p50_ms={p50:.1f} p95_ms={p95:.1f}{scan_fields}")
        if len(sizes) > 1 and first_p50:
            self.out(f"RATIO name=wake_scale_{sizes[-1]}_vs_{sizes[0]} value={p50 / first_p50:.3f}")

    def scenario_awaited_append(self) -> None:
        """What an append of an awaited event type costs over a plain one when no run waits.

        Interleaved in each round: N appends of a type no workflow awaits,
        then N of the wake workflow's awaited type, each in autocommit (a
        transaction of its own, the decision after commit included); then N
        of each in one transaction. No run waits on anything. The ratios
        are costs (awaited time over plain time, lower is better): issue
        26's targets are ≤ 2 alone and ≤ 3 in one transaction.
        """
        from kumiko_workflows.store.events import append_event

        n = self.size("awaited_append")
        self.fresh_database()
        payload = {"key": "nobody-waits", "amount": "12.50"}
        times: dict[str, list[float]] = {
            "plain": [],
            "awaited": [],
            "plain_tx": [],
            "awaited_tx": [],
        }

        def appends(type_: str, count: int) -> None:
            for _ in range(count):
                append_event(uuid.uuid4(), SOURCE, type_, payload, tenant_id=self.tenant)

        # Warm both paths (prepared statements, caches) before timing.
        appends(APPEND_TYPE, 20)
        appends(WAKE_EVENT, 20)
        for _ in range(self.rounds):
            for name, type_ in (("plain", APPEND_TYPE), ("awaited", WAKE_EVENT)):
                started = time.perf_counter()
                appends(type_, n)
                times[name].append(time.perf_counter() - started)
            for name, type_ in (("plain_tx", APPEND_TYPE), ("awaited_tx", WAKE_EVENT)):
                started = time.perf_counter()
                with transaction.atomic():
                    appends(type_, n)
                times[name].append(time.perf_counter() - started)
        for alone, plain in (("awaited", "plain"), ("awaited_tx", "plain_tx")):
            cost = statistics.median(a / p for a, p in zip(times[alone], times[plain], strict=True))
            seconds = statistics.median(times[alone])
            per = {k: statistics.median(v) / n * 1000 for k, v in times.items()}
            name = "awaited_append" if alone == "awaited" else "awaited_append_tx"
            where = "autocommit" if alone == "awaited" else f"{n} in one transaction"
            self.results.append(
                Result(
                    name,
                    n,
                    seconds,
                    n / seconds,
                    cost,
                    "plain append (cost ratio)",
                    extra={"baseline_per_sec": n / statistics.median(times[plain])},
                    note=f"{where}: {per[alone]:.3f} ms vs {per[plain]:.3f} ms, awaited / plain",
                )
            )
            self.out(
                f"AWAITED_APPEND mode={name} awaited_ms={per[alone]:.3f} "
                f"plain_ms={per[plain]:.3f} cost={cost:.2f}"
            )

    def scenario_profile(self) -> None:
        """Where a resumed run's time goes: N due runs drained in this process under cProfile.

        At ``BATCH_SIZE=1`` and at the configured size, each on fresh rows.
        Each function's own time is put in a layer by its module: the
        database (the driver waiting for the server: its round trips and
        the server's work), the driver (psycopg's Python), Django, the
        engine (``kumiko_workflows``) and the rest (the standard library:
        JSON, UUIDs, datetimes). Prints ``PROFILE batch=… us_per_run=…
        database=…% driver=…% django=…% engine=…% other=…%`` and the
        engine's five costliest functions (``KUMIKO_BENCH_PROFILE_DUMP=1``
        also prints the 25 costliest of all; ``=cumulative:telemetry``, say,
        the 25 of the files matching ``telemetry`` by cumulative time). The profiler's own overhead
        inflates the Python layers (by about a third); the shares, not the
        absolute figures, are the point. Before them, without the profiler,
        ``PROFILE_CPU batch=… tracing=… cpu_us_per_run=… wall_us_per_run=…``:
        this process's CPU per run, steadier than the wall clock on a shared
        machine. Last, with the OpenTelemetry SDK installed, the same at the
        configured size with tracing and metrics on (the SDK's providers and
        exporters of ``drain_traced``, given to the engine alone with
        ``telemetry.configure`` for the scenario's length).
        """

        n = self.size("profile")
        batch = int(_setting("BATCH_SIZE"))
        for size in dict.fromkeys((1, batch)):
            self._cpu_per_run(n, size)
        for size in dict.fromkeys((1, batch)):
            self._profiled(n, size, "off")
        if _sdk_installed():
            # The engine's own providers, not the global ones: set once, those would
            # stay for the scenarios after this one.
            flushed = _telemetry_on(globally=False)
            self._cpu_per_run(n, batch, traced=True)
            self._profiled(n, batch, "traced")
            flushed()

    def _profiled(self, n: int, size: int, tracing: str) -> None:
        """One drain of ``n`` fresh due runs at ``size`` under cProfile; its lines printed."""
        import cProfile
        import pstats

        user = getattr(settings, "KUMIKO_WORKFLOWS", None) or {}
        self.fresh_database()
        self.seed_due_runs(n, traced=tracing == "traced")
        with override_settings(KUMIKO_WORKFLOWS={**user, "BATCH_SIZE": size}):
            # Warm: statements prepared, caches filled.
            _drain(self.tenant, limit=max(1, min(20, n // 10)))
            profiler = cProfile.Profile()
            started = time.perf_counter()
            profiler.enable()
            done = _drain(self.tenant)
            profiler.disable()
            seconds = time.perf_counter() - started
        layers, engine = _layers(pstats.Stats(profiler))
        total = sum(layers.values()) or 1.0
        shares = " ".join(f"{name}={layers[name] / total * 100:.0f}%" for name in LAYERS)
        done = max(1, done)
        per_run = seconds / done * 1e6
        label = f"batch={size} tracing={tracing}"
        self.out(f"PROFILE {label} runs={done} us_per_run={per_run:.0f} {shares}")
        dump = os.environ.get("KUMIKO_BENCH_PROFILE_DUMP")
        if dump:
            # "1", or "<sort key>:<regex of the file names>" (say "cumulative:telemetry").
            key, _, where = dump.partition(":") if ":" in dump else ("tottime", "", "")
            pstats.Stats(profiler).sort_stats(key).print_stats(*([where] if where else []), 25)
        for name, own in engine[:5]:
            self.out(f"PROFILE_ENGINE {label} {name} us_per_run={own / done * 1e6:.1f}")
        suffix = "_traced" if tracing == "traced" else ""
        self.results.append(
            Result(
                f"profile_batch{size}{suffix}",
                done,
                seconds,
                done / seconds,
                note=f"under cProfile: {per_run:.0f} us a run; {shares}",
            )
        )

    def _cpu_per_run(self, n: int, size: int, *, traced: bool = False) -> None:
        """Print this process's CPU per run of a drain at ``size``, without the profiler.

        Steadier than the wall clock on a shared machine (the database's time
        is not in it). ``traced``: the SDK is set up (by the caller) and the
        runs link to a start span, as in ``drain_traced``.
        """
        user = getattr(settings, "KUMIKO_WORKFLOWS", None) or {}
        self.fresh_database()
        self.seed_due_runs(n, traced=traced)
        with override_settings(KUMIKO_WORKFLOWS={**user, "BATCH_SIZE": size}):
            _drain(self.tenant, limit=max(1, min(20, n // 10)))
            started, cpu = time.perf_counter(), time.process_time()
            done = max(1, _drain(self.tenant))
            cpu_us = (time.process_time() - cpu) / done * 1e6
            wall_us = (time.perf_counter() - started) / done * 1e6
        mode = "traced" if traced else "off"
        self.out(
            f"PROFILE_CPU batch={size} tracing={mode} runs={done} cpu_us_per_run={cpu_us:.0f} "
            f"wall_us_per_run={wall_us:.0f}"
        )

    def _time_wakes(self, append_event: Callable[..., Any]) -> list[float]:
        timings = []
        for _ in range(WAKE_SCALE_TRIALS):
            key = uuid.uuid4().hex
            append_event(uuid.uuid4(), SOURCE, WAKE_TRIGGER, {"key": key}, tenant_id=self.tenant)
            started = time.perf_counter()
            append_event(uuid.uuid4(), SOURCE, WAKE_EVENT, {"key": key}, tenant_id=self.tenant)
            timings.append(time.perf_counter() - started)
            run_id = run_id_for(WAKE_WORKFLOW, key, self.tenant)
            if WorkflowRunPending.objects.get(run_id=run_id).awaited_event_id is None:
                raise RuntimeError("wake_scale: the appended event did not wake its run")
        return timings

    def scenario_dashboard(self) -> None:
        """The admin dashboard's figures on N runs, 10 × N events (:mod:`kumiko_bench.dashboard`).

        Each page timed on tables never analysed, then after ``VACUUM ANALYZE``
        (PostgreSQL): its first view (which counts the past days not kept yet),
        then the median and p95 of the views after it; the result's seconds
        are the slowest page's median.
        """
        from kumiko_bench import dashboard as board

        runs = self.size("dashboard")
        now, seeded = self._dashboard_data(runs)
        extra: dict[str, Any] = {"seed_seconds": round(seeded, 1), "runs": runs}
        medians: dict[str, float] = {}
        for phase in ("unanalysed", "analysed"):
            if phase == "analysed":
                if self.vendor != "postgresql":
                    break
                self.execute("VACUUM ANALYZE")
            for line in board.plans(now):
                self.out(f"PLAN name=dashboard phase={phase} {line}")
            for page, fn in board.pages(now).items():
                first, median, p95 = board.timed(fn)
                medians[f"{phase}_{page}"] = median
                extra[f"{phase}_{page}_ms"] = round(median, 2)
                extra[f"{phase}_{page}_p95_ms"] = round(p95, 2)
                extra[f"{phase}_{page}_first_ms"] = round(first, 2)
                self.out(
                    f"DASHBOARD phase={phase} page={page} first_ms={first:.1f} "
                    f"median_ms={median:.1f} p95_ms={p95:.1f}"
                )
        worst = max(medians, key=lambda key: medians[key])
        self.emit(
            Result(
                "dashboard",
                runs,
                medians[worst] / 1000,
                1000 / medians[worst],
                extra=extra,
                note=f"slowest page {worst}: {medians[worst]:.1f} ms (median)",
            )
        )

    def _dashboard_data(self, runs: int) -> tuple[Any, float]:
        """The dashboard scenario's data in a fresh scratch database: (its "now", seconds to seed).

        With ``--dashboard-data NAME`` (PostgreSQL), a copy of database NAME
        if it holds data seeded for as many runs, never analysed (0 seconds);
        else seeded, and a copy kept as NAME, before any ``ANALYZE``, for the
        next run (replacing only a copy the bench kept: another database named
        NAME is refused).
        """
        from datetime import datetime

        from kumiko_bench import dashboard as board

        assert self.scratch is not None, "scenarios run inside Bench.run"
        citus = bool(self.scratch.citus_workers)
        kept = self.dashboard_data if self.vendor == "postgresql" and not citus else None
        marker = f"kumiko_bench dashboard runs={runs} now="
        comment = self.scratch.comment_of(kept) if kept else None
        if kept and comment is not None and not comment.startswith("kumiko_bench dashboard "):
            # Only the bench's own copies are replaced: never a database it did not make.
            raise RuntimeError(
                f"--dashboard-data {kept}: database {kept} exists and is not one the bench "
                "kept (its comment does not say so); name another database, or drop it first"
            )
        if kept and comment and comment.startswith(marker):
            self.scratch.renew_from(kept)
            self.out(f"DASHBOARD copied runs={runs} from={kept} ({comment})")
            return datetime.fromisoformat(comment.removeprefix(marker)), 0.0
        self.fresh_database()
        now = timezone.now()
        started = time.perf_counter()
        board.seed(runs, now)
        seeded = time.perf_counter() - started
        self.out(
            f"DASHBOARD seeded runs={runs} events={runs * board.EVENTS_PER_RUN} "
            f"seconds={seeded:.1f}"
        )
        if kept:
            self.scratch.save_as(kept, f"{marker}{now.isoformat()}")
            self.out(f"DASHBOARD kept a copy as {kept} (drop it when done)")
        return now, seeded

    def scenario_unanalysed(self) -> None:
        """An awaited ``append_event`` on tables never analysed, beside the same after ``ANALYZE``.

        N runs wait on distinct keys in a freshly migrated database (bulk
        inserted, as after a load; autovacuum may be off), and the append is
        timed as ``wake_scale`` times it; then ``ANALYZE``, and again. The
        ratio is the unanalysed median over the analysed one (design rule 12:
        about 1).
        """
        from kumiko_workflows.store.events import append_event

        if self.vendor != "postgresql":
            self.skip("unanalysed", "needs PostgreSQL (its planner's statistics)")
            return
        waiting = self.size("unanalysed")
        self.fresh_database()
        self._seed_waiting(waiting, scan=False, analyze=False)
        unanalysed = self._time_wakes(append_event)
        self.execute("ANALYZE")
        analysed = self._time_wakes(append_event)
        before, after = _pct(unanalysed, 50) * 1000, _pct(analysed, 50) * 1000
        self.emit(
            Result(
                "unanalysed",
                len(unanalysed),
                sum(unanalysed),
                len(unanalysed) / sum(unanalysed),
                before / after,
                "unanalysed / analysed",
                extra={"p50_ms": before, "analysed_p50_ms": after, "waiting": waiting},
                note=f"{waiting:,} waiting: p50 {before:.1f} ms, {after:.1f} ms after ANALYZE",
            )
        )
        self.out(f"UNANALYSED waiting={waiting} p50_ms={before:.1f} analysed_p50_ms={after:.1f}")

    def _seed_waiting(self, count: int, *, scan: bool, analyze: bool = True) -> None:
        """``count`` waiting runs of the wake workflow, on distinct keys (or scanned).

        ``analyze``: then ``ANALYZE`` (PostgreSQL), as a server with
        autovacuum on would soon.
        """
        from kumiko_workflows.store.events import append_event

        key = f"t-{uuid.uuid4().hex}"
        append_event(uuid.uuid4(), SOURCE, WAKE_TRIGGER, {"key": key}, tenant_id=self.tenant)
        template = WorkflowRunPending.objects.get(
            run_id=run_id_for(WAKE_WORKFLOW, key, self.tenant)
        )
        never = {
            "version": 1,
            "expr": {"kind": "atom", "path": ["n"], "op": {"kind": "gt", "value": 10**9}},
        }
        made = 0
        while made < count:
            size = min(5000, count - made)
            rows, keys = [], []
            for _ in range(size):
                run_id, value = uuid.uuid4(), f"k-{uuid.uuid4().hex}"
                match = never if scan else _wake_match_for(value)
                rows.append(
                    _copy(template, id=None, run_id=run_id, match_expr=match, match_scan=scan)
                )
                if not scan:
                    keys.append(
                        WorkflowWaitKey(
                            tenant_id=self.tenant,
                            run_id=run_id,
                            event_type=WAKE_EVENT,
                            path='["key"]',
                            value=json.dumps(value),
                        )
                    )
            WorkflowRunPending.objects.bulk_create(rows)
            WorkflowWaitKey.objects.bulk_create(keys)
            made += size
        if analyze and self.vendor == "postgresql":
            self.execute("ANALYZE")

    def scenario_memory(self) -> None:
        sizes = MEMORY_SIZES if self.n is None else (self.n, self.n * 10)
        peaks = []
        for count in sizes:
            self.fresh_database()
            run_ids = self.seed_due_runs(count)
            procs = self.start_workers("drain", 1)
            seconds, reports = self.go(procs)
            self.verify_completed_once(run_ids)
            peaks.append(reports[0]["hwm_kb"] / 1024)
            self.out(f"MEMORY runs={count} peak_rss_mb={peaks[-1]:.1f} seconds={seconds:.1f}")
        growth = peaks[-1] - peaks[0]
        self.emit(
            Result(
                "memory",
                sizes[-1],
                seconds,
                sizes[-1] / seconds,
                extra={"peak_mb": peaks, "growth_mb": growth},
                note=f"peak RSS {peaks[0]:.1f} -> {peaks[-1]:.1f} MB (+{growth:.1f} MB)",
            )
        )
        self.out(f"MEMORY growth_mb={growth:.1f}")

    def _ratio_result(
        self,
        name: str,
        n: int,
        engine: list[float],
        baseline: list[float],
        label: str,
        higher: bool = True,
        note: str = "",
    ) -> None:
        # Ratio of throughputs, paired per round: engine rate / baseline rate.
        ratio = statistics.median(b / e for e, b in zip(engine, baseline, strict=True))
        seconds = statistics.median(engine)
        base = statistics.median(baseline)
        self.emit(
            Result(
                name,
                n,
                seconds,
                n / seconds,
                ratio,
                label,
                extra={"baseline_per_sec": n / base, "rounds": len(engine)},
                note=note,
            )
        )

    # -- report -----------------------------------------------------------------------

    def report_table(self) -> str:
        rows = [("scenario", "n", "seconds", "per sec", "baseline per sec", "ratio", "note")]
        for result in self.results:
            if isinstance(result, Skipped):
                rows.append((result.scenario, "-", "-", "-", "-", "-", f"skipped: {result.reason}"))
                continue
            base = result.extra.get("baseline_per_sec")
            rows.append(
                (
                    result.scenario,
                    str(result.n),
                    f"{result.seconds:.3f}",
                    f"{result.per_sec:,.0f}",
                    f"{base:,.0f} ({result.baseline})" if base else "-",
                    f"{result.ratio:.2f}" if result.ratio is not None else "-",
                    result.note,
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "rounds": self.rounds,
            "results": [result.__dict__ for result in self.results],
        }


# --- worker processes (``kumiko_bench --worker MODE``) --------------------------------


def worker_main(
    mode: str,
    tenant: str,
    scratch: str,
    out: Callable[[str], None],
    batch_size: int | None = None,
) -> None:
    """A worker process of the bench, on the scratch database named ``scratch``."""
    use_database(scratch)
    user = getattr(settings, "KUMIKO_WORKFLOWS", None) or {}
    # Read lazily by the engine (kumiko_workflows.conf): this is the size it drains at.
    batch: dict[str, Any] = {"BATCH_SIZE": batch_size} if batch_size is not None else {}
    if mode == "drain_row_by_row":
        batch["BATCH_TOGETHER"] = False
    tasks = {"TASKS": bench_tasks_setting()} if mode == "tasks" else {}
    if mode == "tasks_db":
        tasks = {"TASKS": tasks_db_setting()}
    with override_settings(KUMIKO_WORKFLOWS={**user, **batch}, **tasks):
        register_bench_workflows()
        if mode == "tasks":
            from kumiko_bench import bench_tasks  # defines the queue's workflow
            from kumiko_workflows.conf import workflow_settings

            del bench_tasks
            tenant = workflow_settings.DEFAULT_TENANT  # where tasks are enqueued
        connection.ensure_connection()
        _work(mode, tenant, out)


def bench_tasks_setting() -> dict[str, Any]:
    return {"default": {"BACKEND": "kumiko_workflows.tasks.WorkflowTaskBackend"}}


def tasks_db_setting() -> dict[str, Any]:
    return {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}


def _work(mode: str, tenant: str, out: Callable[[str], None]) -> None:
    if mode == "fair":
        from django.core.management import call_command

        # Every tenant, released together by GO (the fairness scenario).
        out("READY")
        if sys.stdin.readline().strip() != "GO":
            return
        call_command("resume_due_runs", "--loop", "--no-cron", "--interval", "1", verbosity=0)
        return
    if mode == "tasks_db":
        from django.core.management import call_command
        from django_tasks_db.models import DBTaskResult

        out("READY")
        if sys.stdin.readline().strip() != "GO":
            return
        started = time.perf_counter()
        call_command("db_worker", "--batch", "--no-startup-delay", verbosity=0)
        done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
        out("DONE " + json.dumps({"processed": done, "seconds": time.perf_counter() - started}))
        return
    if mode == "loop":
        from django.core.management import call_command

        out("READY")
        call_command(
            "resume_due_runs",
            "--loop",
            "--no-cron",
            "--tenant",
            tenant,
            "--interval",
            "5",
            verbosity=0,
        )
        return
    # Set up at start, as a site does; the flush at the end is measured.
    exported = _telemetry_on() if mode == "drain_traced" else None
    out("READY")
    if sys.stdin.readline().strip() != "GO":
        return
    started, cpu = time.perf_counter(), time.process_time()
    if mode == "floor":
        processed = _floor(tenant)
    elif mode == "floor_batch":
        processed = _batched_floor(tenant, int(_setting("BATCH_SIZE")))
    else:
        processed = _drain(tenant)
    report: dict[str, Any] = {"processed": processed, "batch_size": int(_setting("BATCH_SIZE"))}
    if exported is not None:
        report.update(exported())
    # CPU time of the whole process: an exporter's threads count too.
    report.update(
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - cpu,
        hwm_kb=_hwm_kb(),
    )
    out("DONE " + json.dumps(report))


def _claim_batch(tenant: str, now: Any, size: int) -> list[Any]:
    """The worker's claim of ``size`` due rows at ``now``, as a batch of it takes them."""
    from kumiko_workflows.store import claims
    from kumiko_workflows.store.db import chains_writes

    if chains_writes():
        return claims.claim_batch(tenant, now, size, set())
    rows = []  # row by row, as the engine claims where writes do not chain
    for _ in range(size):
        found = claims.claim_due(tenant, now, set())
        if found is None:
            break
        rows.append(found)
    return rows


def _drain(tenant: str, limit: int | None = None) -> int:
    from kumiko_workflows.engine.resume import resume_due_runs

    processed = 0
    while True:
        report = resume_due_runs(tenant_id=tenant, limit=limit)
        if report.errors:
            raise RuntimeError(f"resume_due_runs reported errors: {report}")
        if not report.processed:
            return processed
        processed += report.processed
        if limit is not None:
            return processed


def _sdk_providers() -> tuple[Any, Any, Any, Any]:
    """The OpenTelemetry SDK's providers as a site sets them up, exported to nowhere.

    Spans batched to an exporter that counts and drops them, metrics (the
    due-backlog gauge's query included) collected every 10 seconds (a scrape
    interval; the SDK's default is 60) and at the end for another. Returns
    (tracer provider, meter provider, span exporter, metric exporter); the
    exporters' ``count`` says how many they were given.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricExportResult,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Spans(SpanExporter):
        count = 0

        def export(self, spans: Any) -> SpanExportResult:
            self.count += len(spans)
            return SpanExportResult.SUCCESS

    class Metrics(MetricExporter):
        count = 0

        def export(self, metrics_data: Any, timeout_millis: float = 0, **kwargs: Any) -> Any:
            self.count += 1
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 0) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 0, **kwargs: Any) -> None:
            pass

    spans, exports = Spans(), Metrics()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(spans))
    meter_provider = MeterProvider(
        metric_readers=[PeriodicExportingMetricReader(exports, export_interval_millis=10_000)]
    )
    return tracer_provider, meter_provider, spans, exports


def _telemetry_on(*, globally: bool = True) -> Callable[[], dict[str, int]]:
    """Tracing and metrics on in this process, as a site sets them up, exported to nowhere.

    The global providers of :func:`_sdk_providers`. Returns what flushes them
    and says how many spans were exported. Not ``globally``: the same
    providers given to the engine alone (``telemetry.configure``) until the
    flush, which gives it the global ones back.
    """
    from opentelemetry import metrics, trace

    tracer_provider, meter_provider, spans, exports = _sdk_providers()
    if globally:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    else:  # the engine's alone (telemetry.configure), until flushed: the profile's
        from kumiko_workflows import telemetry

        telemetry.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)

    def flushed() -> dict[str, int]:
        if not globally:
            from kumiko_workflows import telemetry

            telemetry.configure()
        tracer_provider.shutdown()
        meter_provider.shutdown()
        return {"spans": spans.count, "metric_exports": exports.count}

    return flushed


def _sdk_floor(n: int) -> float:
    """CPU per run (µs) of the OpenTelemetry SDK alone doing what a traced drain asks of it.

    Per run, as the engine does around a resumed run of one step: the
    segment's span (its attributes, a link to the start span) made current,
    the step's span inside it, each ended with its outcome, the step's
    duration and the resume's lag recorded; per batch, the resumes and
    completions counted; all through the engine's own instruments on the
    providers of ``drain_traced``, flushed at the end (the export thread's
    CPU counts, as in the drain). No engine and no database: the least
    tracing can cost a run, whatever the engine around it.
    """
    from opentelemetry import context, trace

    from kumiko_workflows.telemetry_instruments import (
        ATTEMPT,
        OUTCOME,
        RUN_ID,
        STEP,
        STEP_KIND,
        SUSPENSION,
        TENANT,
        VERSION,
        WORKFLOW,
        Instruments,
    )

    tracer_provider, meter_provider, _, _ = _sdk_providers()
    active = Instruments(tracer_provider, meter_provider)
    start = trace.SpanContext(uuid.uuid4().int, 1, is_remote=True)
    run_ids = [str(uuid.uuid4()) for _ in range(n)]
    batch = int(_setting("BATCH_SIZE"))
    labels = {WORKFLOW: DRAIN_WORKFLOW}

    def traced(run_id: str) -> None:
        segment = active.tracer.start_span(
            f"resume {DRAIN_WORKFLOW}",
            attributes={
                RUN_ID: run_id,
                WORKFLOW: DRAIN_WORKFLOW,
                TENANT: "t",
                STEP: "2",
                SUSPENSION: "wait",
                ATTEMPT: 1,
                VERSION: "1",
            },
            links=[trace.Link(start)],
        )
        outer = context.attach(trace.set_span_in_context(segment))
        step = active.tracer.start_span(
            "finish",
            attributes={
                RUN_ID: run_id,
                WORKFLOW: DRAIN_WORKFLOW,
                VERSION: "1",
                TENANT: "t",
                STEP: "2",
                STEP_KIND: "step",
                ATTEMPT: 0,
            },
        )
        inner = context.attach(trace.set_span_in_context(step))
        context.detach(inner)
        step.set_attribute(OUTCOME, "completed")
        step.end()
        active.step_duration.record(
            0.0001, {WORKFLOW: DRAIN_WORKFLOW, STEP: "2", OUTCOME: "completed"}
        )
        context.detach(outer)
        segment.set_attribute(OUTCOME, "completed")
        segment.end()
        active.resume_lag.record(0.01, labels)

    for run_id in run_ids[: n // 10]:  # warm
        traced(run_id)
    cpu = time.process_time()
    for index, run_id in enumerate(run_ids):
        traced(run_id)
        if index % batch == batch - 1:
            active.resumes.add(batch, labels)
            active.completed.add(batch, labels)
    tracer_provider.shutdown()
    meter_provider.shutdown()
    return (time.process_time() - cpu) / n * 1e6


def _sdk_installed() -> bool:
    try:
        import opentelemetry.sdk  # noqa: F401 - only whether it is installed
    except ImportError:
        return False
    return True


def _floor_tables() -> tuple[str, str]:
    return (
        connection.ops.quote_name(f"{PREFIX}_floor_events"),
        connection.ops.quote_name(f"{PREFIX}_floor_pending"),
    )


#: A prepare threshold no statement reaches: psycopg prepares nothing on a
#: connection whose threshold is None (Django's default), so the floors set
#: this, as the engine's cursor does, and prepare what they ask for.
_NEVER = 2**62


class _FloorCursor:
    """The driver cursor of a floor: on PostgreSQL, server-side binding and every
    statement prepared (psycopg ``prepare=True``), as the engine's hot cursor
    prepares its statements; on SQLite, sqlite3's own statement cache."""

    def __init__(self, raw: Any) -> None:
        self.postgres = connection.vendor == "postgresql"
        self.raw = raw
        if self.postgres:
            import psycopg

            if raw.prepare_threshold is None:
                raw.prepare_threshold = _NEVER
            self.cursor: Any = psycopg.Cursor(raw)
        else:
            self.cursor = raw.cursor()

    def sql(self, text: str) -> str:
        return text if self.postgres else text.replace("%s", "?")

    def execute(self, text: str, params: Iterable[Any] = ()) -> Any:
        if self.postgres:
            return self.cursor.execute(text, tuple(params), prepare=True)
        return self.cursor.execute(text, tuple(params))

    def begin(self) -> None:
        if not self.postgres:
            self.cursor.execute("BEGIN IMMEDIATE")
        elif self.raw.autocommit:
            self.raw.autocommit = False

    def commit(self) -> None:
        if self.postgres:
            self.raw.commit()
        else:
            self.cursor.execute("COMMIT")


def _floor(tenant: str) -> int:
    """The hand-written resume transaction, one run per transaction, on scratch tables.

    Claim one due row (``FOR UPDATE SKIP LOCKED``), load its stream, insert
    resumed, insert completed, delete the row, commit: every statement
    prepared, as the engine prepares its own.
    """
    events, pending = _floor_tables()
    cursor = _FloorCursor(_raw_connection())
    claim = cursor.sql(
        f"SELECT id, run_id, run_version FROM {pending} "  # noqa: S608
        "WHERE tenant_id = %s AND wake_at <= %s ORDER BY wake_at, id LIMIT 1"
        + (" FOR UPDATE SKIP LOCKED" if cursor.postgres else "")
    )
    load = cursor.sql(
        f"SELECT id, version, type, payload FROM {events} "  # noqa: S608
        "WHERE tenant_id = %s AND aggregate_id = %s ORDER BY version"
    )
    insert = cursor.sql(
        f"INSERT INTO {events} (tenant_id, aggregate_id, aggregate_type, version, type, "  # noqa: S608
        "event_version, payload, metadata, created_by, created_at) "
        "VALUES (%s, %s, 'workflow-run', %s, %s, 1, %s, '{}', 'kumiko_workflows', %s)"
    )
    delete = cursor.sql(f"DELETE FROM {pending} WHERE id = %s")  # noqa: S608
    processed = 0
    while True:
        stamp = connection.ops.adapt_datetimefield_value(timezone.now())
        cursor.begin()
        cursor.execute(claim, (tenant, stamp))
        row = cursor.cursor.fetchone()
        if row is None:
            cursor.commit()
            return processed
        pk, run_id, version = row
        cursor.execute(load, (tenant, run_id))
        stream = cursor.cursor.fetchall()
        waiting = json.loads(stream[-1][3]) if isinstance(stream[-1][3], str) else stream[-1][3]
        resumed = {"step": waiting["step"], "retry_attempt": 0, "suspension_type": "wait"}
        completed = {"workflow_name": waiting["workflow_name"], "step_count": 3}
        cursor.execute(
            insert, (tenant, run_id, version + 1, et.RESUMED, json.dumps(resumed), stamp)
        )
        cursor.execute(
            insert, (tenant, run_id, version + 2, et.RUN_COMPLETED, json.dumps(completed), stamp)
        )
        cursor.execute(delete, (pk,))
        cursor.commit()
        processed += 1


def _batched_floor(tenant: str, size: int) -> int:
    """The physical limit of a batched drain: ``size`` runs per transaction, as sets.

    Claim ``size`` due rows in one statement (``FOR UPDATE SKIP LOCKED``),
    insert their resumed and completed events in one, delete the rows in
    one, commit: every statement prepared (PostgreSQL: arrays bound as
    parameters, so one statement serves every batch; SQLite: one statement
    per batch length, from its statement cache).
    """
    events, pending = _floor_tables()
    cursor = _FloorCursor(_raw_connection())
    columns = (
        "tenant_id, aggregate_id, aggregate_type, version, type, event_version, payload, "
        "metadata, created_by, created_at"
    )
    claim = cursor.sql(
        f"SELECT id, run_id, run_version, step, workflow_name FROM {pending} "  # noqa: S608
        "WHERE tenant_id = %s AND wake_at <= %s ORDER BY wake_at, id LIMIT %s"
        + (" FOR UPDATE SKIP LOCKED" if cursor.postgres else "")
    )
    if cursor.postgres:
        insert = (
            f"INSERT INTO {events} ({columns}) "  # noqa: S608
            "SELECT %s, r.aggregate_id, 'workflow-run', r.version, r.type, 1, r.payload, "
            "'{}', 'kumiko_workflows', %s "
            "FROM unnest(%s::uuid[], %s::int[], %s::text[], %s::jsonb[]) "
            "AS r(aggregate_id, version, type, payload)"
        )
        delete = f"DELETE FROM {pending} WHERE id = ANY(%s)"  # noqa: S608
    processed = 0
    while True:
        stamp = connection.ops.adapt_datetimefield_value(timezone.now())
        cursor.begin()
        cursor.execute(claim, (tenant, stamp, size))
        rows = cursor.cursor.fetchall()
        if not rows:
            cursor.commit()
            return processed
        ids, runs, versions, types, payloads = [], [], [], [], []
        for pk, run_id, version, step, workflow_name in rows:
            ids.append(pk)
            resumed = {"step": step, "retry_attempt": 0, "suspension_type": "wait"}
            completed = {"workflow_name": workflow_name, "step_count": 3}
            runs += [run_id, run_id]
            versions += [version + 1, version + 2]
            types += [et.RESUMED, et.RUN_COMPLETED]
            payloads += [json.dumps(resumed), json.dumps(completed)]
        if cursor.postgres:
            cursor.execute(insert, (tenant, stamp, runs, versions, types, payloads))
            cursor.execute(delete, (ids,))
        else:
            values = ", ".join(
                ["(?, ?, 'workflow-run', ?, ?, 1, ?, '{}', 'kumiko_workflows', ?)"] * len(runs)
            )
            params: list[Any] = []
            for run_id, version, type_, payload in zip(
                runs, versions, types, payloads, strict=True
            ):
                params += [tenant, run_id, version, type_, payload, stamp]
            cursor.execute(f"INSERT INTO {events} ({columns}) VALUES {values}", params)  # noqa: S608
            marks = ", ".join(["?"] * len(ids))
            cursor.execute(f"DELETE FROM {pending} WHERE id IN ({marks})", ids)  # noqa: S608
        cursor.commit()
        processed += len(rows)


# --- small helpers ----------------------------------------------------------------

#: The layers of :meth:`Bench.scenario_profile`, in the order it prints them.
LAYERS = ("database", "driver", "django", "engine", "other")
#: psycopg's functions that call libpq to send a statement or wait for its result.
_ROUND_TRIPS = frozenset(
    {"wait", "wait_c", "_send_query_prepared", "_send_prepare", "_exec_command"}
)


def _layers(stats: Any) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Own time per layer of a profile, and the engine's functions by own time."""
    layers = dict.fromkeys(LAYERS, 0.0)
    engine: dict[str, float] = {}
    for (filename, _line, function), row in stats.stats.items():
        own = row[2]
        path = filename.replace("\\", "/")
        if "/psycopg" in path:
            # libpq's sends and the driver's waits for the server (C code, counted
            # in the Python function that calls it): the round trips and the
            # server's work. The rest of psycopg is its Python.
            layer = "database" if function in _ROUND_TRIPS else "driver"
        elif "/django/" in path:
            layer = "django"
        elif "/kumiko_workflows/" in path:
            layer = "engine"
            name = f"{path.rsplit('/kumiko_workflows/', 1)[1]}:{function}"
            engine[name] = engine.get(name, 0.0) + own
        else:
            layer = "other"
        layers[layer] += own
    return layers, sorted(engine.items(), key=lambda item: -item[1])


def _copy(instance: Any, **changes: Any) -> Any:
    values = {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}
    values.update(changes)
    return type(instance)(**values)


def _count() -> Any:
    from django.db.models import Count

    return Count("id")


def _setting(name: str) -> Any:
    from kumiko_workflows.conf import workflow_settings

    return getattr(workflow_settings, name)


def _pct(values: list[float], pct: int) -> float:
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def _hwm_kb() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _raw_connection() -> Any:
    """The driver connection under Django's (psycopg or sqlite3), for the raw baselines."""
    connection.ensure_connection()
    return connection.connection


def worker_environment() -> tuple[list[str], dict[str, str]]:
    """How to start this command again in a child process, with the same settings."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
    # Where the settings module and this app are found (a checkout, not site-packages).
    roots = {
        str(Path(sys.modules[name].__file__ or ".").resolve().parent.parent)
        for name in (settings.SETTINGS_MODULE.split(".")[0], "kumiko_bench")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*sorted(roots), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return [sys.executable, "-m", "django", "kumiko_bench"], env
