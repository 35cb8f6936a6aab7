"""Rebuilding the run-status and pending tables from the event store.

Both tables are projections: deleting them and replaying the stored events
through the projection registry (``replaying=True``, so projections with side
effects such as starting runs are skipped) must give the same rows. A rebuild
does exactly that in one transaction; a check does the same, compares the
result with what was there, and rolls back.

``WorkflowRun.last_error`` is not derived from events (raw error text never
enters the immutable log): a rebuild carries it over and a check ignores it.
``WorkflowRunPending.resume_errors`` (the worker's count of failed resumes)
is not either: a check ignores it and a rebuild starts it at 0, which gives
a stuck run at most ``MAX_RESUME_ERRORS`` more passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending, WorkflowWaitKey
from kumiko_workflows.store import db, statements
from kumiko_workflows.store.dispatch import registry as projection_registry

#: Events replayed per query; each batch is read in full before it is replayed.
BATCH = 1000

RUN_FIELDS = [f.attname for f in WorkflowRun._meta.concrete_fields if f.attname != "last_error"]
PENDING_FIELDS = [
    f.attname
    for f in WorkflowRunPending._meta.concrete_fields
    if f.attname not in ("id", "resume_errors")
]
KEY_FIELDS = ["tenant_id", "run_id", "event_type", "path", "value"]

Rows = dict[Any, dict[str, Any]]


@dataclass
class Difference:
    """One row that differs between a table and what the events give."""

    table: str  # "run" or "pending"
    key: tuple[Any, ...]
    kind: str  # "missing" (only from the events), "extra" (only in the table), "changed"
    changes: list[tuple[str, Any, Any]] = field(default_factory=list)  # (field, table, events)

    def where(self) -> str:
        if self.table == "run":
            (run_id,) = self.key
            return f"run {run_id}"
        if self.table == "key":
            tenant, run_id, event_type, path, value = self.key
            return f"wait key {event_type} {path} = {value} of run {run_id} (tenant {tenant})"
        tenant, run_id, step = self.key
        return f"pending row of run {run_id} at step {step!r} (tenant {tenant})"

    def __str__(self) -> str:
        if self.kind == "missing":
            return f"{self.where()}: missing from the table (the events give one)"
        if self.kind == "extra":
            return f"{self.where()}: in the table, but the events give no such row"
        changed = "; ".join(
            f"{name}: table has {table!r}, events give {events!r}"
            for name, table, events in self.changes
        )
        return f"{self.where()}: {changed}"


@dataclass
class RebuildResult:
    events: int
    runs: int
    pending: int
    differences: list[Difference]
    applied: bool


def _snapshot() -> tuple[Rows, Rows, Rows]:
    runs = {(row["run_id"],): row for row in WorkflowRun.objects.values(*RUN_FIELDS)}
    pending = {
        (row["tenant_id"], row["run_id"], row["step"]): row
        for row in WorkflowRunPending.objects.values(*PENDING_FIELDS)
    }
    keys = {tuple(row.values()): row for row in WorkflowWaitKey.objects.values(*KEY_FIELDS)}
    return runs, pending, keys


def _compare(table: str, before: Rows, after: Rows) -> list[Difference]:
    differences = []
    for key in sorted(before.keys() | after.keys(), key=lambda k: tuple(map(str, k))):
        old, new = before.get(key), after.get(key)
        if old is None:
            differences.append(Difference(table, key, "missing"))
        elif new is None:
            differences.append(Difference(table, key, "extra"))
        else:
            changes = [(name, old[name], new[name]) for name in old if old[name] != new[name]]
            if changes:
                differences.append(Difference(table, key, "changed", changes))
    return differences


def replayed_types() -> list[str]:
    """Event types in the store that some replayable projection handles."""
    stored = Event.objects.order_by().values_list("type", flat=True).distinct()
    return sorted(t for t in stored if projection_registry.handles(t, replaying=True))


def replay(progress: Callable[[int, int], None] | None = None) -> int:
    """Feed every relevant stored event, in id order, to the projections."""
    query = Event.objects.filter(type__in=replayed_types())
    total = query.count()
    done = 0
    last_id = 0
    if progress:
        progress(0, total)
    while True:
        batch = list(query.filter(id__gt=last_id).order_by("id")[:BATCH])
        if not batch:
            break
        for event in batch:
            projection_registry.dispatch(event, replaying=True)
        done += len(batch)
        last_id = batch[-1].id
        if progress:
            progress(done, total)
    return done


def _restore_errors(errors: Iterable[tuple[Any, str]]) -> None:
    rows = [WorkflowRun(run_id=run_id, last_error=text) for run_id, text in errors]
    WorkflowRun.objects.bulk_update(rows, ["last_error"], batch_size=500)


def rebuild(
    *, apply: bool = True, progress: Callable[[int, int], None] | None = None
) -> RebuildResult:
    """Rebuild both tables from the events in one transaction.

    With ``apply=False`` nothing changes: the rebuilt rows are compared with
    the current ones and the transaction is rolled back. Either way the
    result lists the rows that differed.
    """
    with db.atomic():
        statements.lock_projection_tables()
        before_runs, before_pending, before_keys = _snapshot()
        errors = list(
            WorkflowRun.objects.exclude(last_error="").values_list("run_id", "last_error")
        )
        WorkflowWaitKey.objects.all().delete()
        WorkflowRunPending.objects.all().delete()
        WorkflowRun.objects.all().delete()
        events = replay(progress)
        after_runs, after_pending, after_keys = _snapshot()
        differences = (
            _compare("run", before_runs, after_runs)
            + _compare("pending", before_pending, after_pending)
            + _compare("key", before_keys, after_keys)
        )
        if apply:
            _restore_errors((run_id, text) for run_id, text in errors if (run_id,) in after_runs)
        else:
            db.set_rollback(True)
    return RebuildResult(events, len(after_runs), len(after_pending), differences, apply)


def check(progress: Callable[[int, int], None] | None = None) -> RebuildResult:
    """Compare both tables with what the events give, changing nothing."""
    return rebuild(apply=False, progress=progress)
