"""The fan-in projection: ``WorkflowChildGroup``, one row per step that started child runs.

A pure function of the events, like the run status: the first child's
request (``workflow.call-requested`` at index 0, whose metadata describes the
group) creates the row; each child's ``run-started`` counts it started and
its terminal event (which names its parent) counts it finished; the
parent's cancel (or its compensation asked for by a cancel) closes it. Each
child touches its own group's row only, by key: a finishing child costs the
same with ten children or ten thousand. Starting the next child and waking
the parent are reactions (:mod:`kumiko_workflows.engine.children`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils.dateparse import parse_datetime

from kumiko_workflows.models import Event, WorkflowChildGroup
from kumiko_workflows.workflow import event_types as et

#: The event types this projection reads.
HANDLED = frozenset({et.CALL_REQUESTED, et.RUN_STARTED, *et.TERMINAL, et.COMPENSATION_SCHEDULED})


#: Children's ends a worker's batch has seen, by group: counted once, at its end.
_batch: ContextVar[dict[tuple[str, str, str], list[tuple[int, bool]]] | None] = ContextVar(
    "kumiko_fan_in_batch", default=None
)


@contextmanager
def batched() -> Iterator[None]:
    """Count the children that end in the block per group, once, when :func:`take` is called.

    A worker's batch resumes many children of one fan-out in one
    transaction: counting each at once would hold the group's row from the
    first child to the batch's commit, and a second worker's batch would
    wait for it. Counted together at the batch's end (in the same
    transaction, :func:`kumiko_workflows.engine.children.count_batch`), the
    row is held only from then to the commit.
    """
    token = _batch.set({})
    try:
        yield
    finally:
        _batch.reset(token)


def batching() -> bool:
    return _batch.get() is not None


#: The group (tenant, parent run, group) whose children start in the block, all counted started.
_counted: ContextVar[tuple[str, str, str] | None] = ContextVar(
    "kumiko_fan_in_counted", default=None
)


@contextmanager
def starts_counted(tenant_id: str, parent_run_id: Any, group: str) -> Iterator[None]:
    """The group's children start in the block, and its row counts them all started already.

    A group without a window is created with ``started = total``: the
    ``run-started`` of each of its children then changes nothing, and is
    not sent to the database (one statement fewer per child). Replayed, the
    statement runs and matches no row, the same outcome.
    """
    token = _counted.set((tenant_id, str(parent_run_id), group))
    try:
        yield
    finally:
        _counted.reset(token)


def take() -> dict[tuple[str, str, str], list[tuple[int, bool]]]:
    """The ends seen so far in the batch (forgotten here), by (tenant, parent run, group)."""
    seen = _batch.get()
    if not seen:
        return {}
    taken = dict(seen)
    seen.clear()
    return taken


def take_group(tenant_id: str, parent_run_id: Any, group: str) -> list[tuple[int, bool]]:
    """The ends of one group seen so far in the batch (forgotten here)."""
    seen = _batch.get()
    if not seen:
        return []
    return seen.pop((tenant_id, str(parent_run_id), group), [])


def count_ends(tenant_id: str, parent: dict[str, Any], ends: list[tuple[int, bool]]) -> None:
    """Count children's ends ((event id, failed), in event order) in their group's row."""
    failures = sum(1 for _, failed in ends if failed)
    changes: dict[str, Any] = {
        "finished": F("finished") + len(ends),
        "last_event_id": Greatest(Coalesce(F("last_event_id"), Value(0)), Value(ends[-1][0])),
    }
    if failures:
        changes["failed"] = F("failed") + failures
    rows = group_of(tenant_id, parent)
    rows.update(**changes)
    if failures:
        # Under on_child_failure="fail", a failure stops the fan-out.
        rows.filter(on_child_failure="fail", stopped=False).update(stopped=True)


def parent_of(event: Event) -> dict[str, Any] | None:
    """The parent a child run's event names ({"run_id", "group", ...}), or None."""
    parent = event.payload.get("parent") if isinstance(event.payload, dict) else None
    return parent if isinstance(parent, dict) and parent.get("run_id") else None


def group_of(tenant_id: str, parent: dict[str, Any]) -> Any:
    """The queryset of one group's row."""
    return WorkflowChildGroup.objects.filter(
        tenant_id=tenant_id, parent_run_id=parent["run_id"], group=parent["group"]
    )


def project_children(event: Event, replaying: bool) -> None:
    kind = event.type
    if kind == et.CALL_REQUESTED:
        meta = event.metadata or {}
        if meta.get("index") != 0:
            return
        WorkflowChildGroup.objects.bulk_create(
            [
                WorkflowChildGroup(
                    tenant_id=event.tenant_id,
                    parent_run_id=meta["parent_run_id"],
                    group=meta["group"],
                    step=meta["step"],
                    workflow_name=meta["workflow"],
                    total=meta["total"],
                    # Without a window every child starts with the step: counted
                    # at once, not one UPDATE of this row per start.
                    started=meta["total"] if meta.get("max_concurrency") is None else 0,
                    max_concurrency=meta.get("max_concurrency"),
                    on_child_failure=meta.get("on_child_failure", "fail"),
                    on_cancel=meta.get("on_cancel", "cancel"),
                    timeout_at=parse_datetime(meta["timeout_at"])
                    if meta.get("timeout_at")
                    else None,
                )
            ],
            ignore_conflicts=True,  # projected twice (at least once): one row
        )
        return
    if event.aggregate_type != et.RUN_AGGREGATE_TYPE:
        return
    if kind in (et.RUN_CANCELLED, et.COMPENSATION_SCHEDULED):
        if kind == et.COMPENSATION_SCHEDULED and not event.payload.get("cancel"):
            return
        # A cancelled parent starts no further child and is not woken.
        WorkflowChildGroup.objects.filter(
            tenant_id=event.tenant_id, parent_run_id=event.aggregate_id, closed=False
        ).update(closed=True)
    parent = parent_of(event)
    if parent is None:
        return
    if kind == et.RUN_STARTED:
        if _counted.get() == (event.tenant_id, str(parent["run_id"]), str(parent["group"])):
            return
        windowed = group_of(event.tenant_id, parent).filter(max_concurrency__isnull=False)
        windowed.update(started=F("started") + 1)
    elif kind in et.TERMINAL:
        failed = kind != et.RUN_COMPLETED
        seen = None if replaying else _batch.get()
        if seen is not None:
            key = (event.tenant_id, str(parent["run_id"]), str(parent["group"]))
            seen.setdefault(key, []).append((event.id, failed))
            return
        count_ends(event.tenant_id, parent, [(event.id, failed)])
