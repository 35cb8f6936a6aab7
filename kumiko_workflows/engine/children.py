"""Child runs: starting them, the fan-in that wakes their parent once, the cancel cascade.

A ``call_workflow`` or ``fan_out`` step appends one request per child
(``workflow.call-requested``, in a stream of its own: the child's trigger,
its payload the child's input) and starts the children, each with a run id
derived from the parent's run, the step's position and the attempts of the
retries around it: a segment done again starts no second child, an attempt
of a retry starts fresh ones. Their group (:class:`WorkflowChildGroup`, a
projection) counts them started and finished. At most ``max_concurrency``
run at once: a finishing child starts the next, in its own transaction.

The child that brings the group to done wakes the parent the way an
awaited event does (:mod:`kumiko_workflows.engine.wakeups`): a
``workflow.wake-requested`` naming the child's terminal event, and, where
writers overlap, a wake-up check decided after commit on both sides (the
parent suspending, the last child finishing), so a parent resumed while its
last child finishes is never stranded.

Cancelling a run cancels its unfinished children, at any depth, in the
cancel's transaction (:func:`lock_tree`, :func:`cancel_tree`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from kumiko_workflows.engine import wakeups
from kumiko_workflows.exceptions import InvalidEvent
from kumiko_workflows.models import (
    SETTLED_STATUSES,
    Event,
    WorkflowChildGroup,
    WorkflowRun,
    WorkflowRunPending,
)
from kumiko_workflows.projections import children as fan_in
from kumiko_workflows.projections.children import group_of, parent_of
from kumiko_workflows.store import db
from kumiko_workflows.store.events import append_event
from kumiko_workflows.store.stream_ids import engine_stream
from kumiko_workflows.store.streams import (
    CHILD_FAILED,
    CHILD_TIMEOUT,
    INVALID_STEP_RESULT,
    STEP_FAILED,
    Failure,
    RunStream,
    failure_from_exception,
)
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.definition import Workflow, run_id_for
from kumiko_workflows.workflow.jsonvalues import NotJSON, to_json
from kumiko_workflows.workflow.registry import registry
from kumiko_workflows.workflow.step_kind import ChildSpec, Suspend, path_text

logger = logging.getLogger("kumiko_workflows.children")

_CALL_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://kumiko-workflows/workflow-call")
#: Ids read per statement (well inside every database's parameter limit).
BATCH = 500

Start = Callable[..., Any]
_starter: list[Start] = []


def set_starter(start: Start) -> None:
    """How a child run is started (:func:`kumiko_workflows.engine.starts.start_run`).

    Given by that module when it is imported (it imports the segments,
    which start children: this breaks the cycle).
    """
    _starter[:] = [start]


def starter() -> Start:
    assert _starter, "kumiko_workflows.engine.starts sets the starter when it is imported"
    return _starter[0]


def group_name(ctx: Any, path: tuple[Any, ...]) -> str:
    """The step's position, with the attempt of each retry around it: a fresh group per attempt."""
    attempts = ",".join(f"{where}:{n}" for where, n in sorted(ctx.attempts.items()))
    position = path_text(path)
    return f"{position}@{attempts}" if attempts else position


def child_key(parent_run_id: Any, group: str, index: int) -> str:
    """A child's idempotency key: its run id is ``run_id_for(workflow, key, tenant)``."""
    return f"{parent_run_id}/{group}/{index}"


def call_id(tenant_id: str, key: str) -> uuid.UUID:
    """The stream of a child's request (its trigger event)."""
    return uuid.uuid5(_CALL_NAMESPACE, f"{tenant_id}\x1f{key}")


def child_run_id(group: WorkflowChildGroup, index: int) -> uuid.UUID:
    key = child_key(group.parent_run_id, group.group, index)
    return run_id_for(group.workflow_name, key, group.tenant_id)


# --- the step's side ---------------------------------------------------------------


def run_children(
    executor: Any, path: tuple[Any, ...], spec: ChildSpec, start: Start
) -> list[dict[str, Any]]:
    """:meth:`Execution.children`: start the step's children once, then wait for them all."""
    ctx = executor.ctx
    group = group_name(ctx, path)
    if ctx.resumed_group is not None and ctx.resumed_group[0] == path_text(path):
        group = ctx.resumed_group[1]  # the group its suspension named
    row = _group(ctx.tenant_id, ctx.run_id, group)
    if row is None:
        if registry.get(spec.workflow) is None:
            raise executor.invalid(path, f"no workflow named {spec.workflow!r} is defined")
        inputs = spec.inputs()
        if not inputs:
            return []
        requests = _request(executor, path, group, spec, inputs)
        # Children that finish inline are counted together (one UPDATE of the
        # group's row, not one per child), at once: the step may go on.
        own_batch = not fan_in.batching()
        with fan_in.batched() if own_batch else nullcontext():
            if spec.max_concurrency is None:
                # All at once: no window to read between the starts, which the
                # group's row counted at its creation; one NOTIFY for them all.
                workflow = registry.get(spec.workflow)
                with fan_in.starts_counted(ctx.tenant_id, ctx.run_id, group), db.notifying_once():
                    for index, request in enumerate(requests):
                        key = child_key(ctx.run_id, group, index)
                        parent = {"run_id": str(ctx.run_id), "group": group, "index": index}
                        start(workflow, request, key=key, parent=parent)
            else:
                fill(ctx.tenant_id, ctx.run_id, group, start)
            _count_own(ctx.tenant_id, ctx.run_id, group)
            if own_batch:
                count_batch(start)  # other groups' ends (grandchildren), as a batch's
        row = _group(ctx.tenant_id, ctx.run_id, group)
        assert row is not None, "the first request creates the group"
    if row.done:
        return outcomes(row)
    if row.timeout_at is not None and executor.now >= row.timeout_at:
        # Given up on: the step fails (its writes roll back), and the run's
        # failure cancels the unfinished children (on_parent_failed).
        outcome = {
            "run_id": str(row.parent_run_id),
            "status": "timed_out",
            "reason": CHILD_TIMEOUT,
        }
        raise executor.child_failed(path, outcome, None)
    executor.suspending_on_event()  # the wake-up check after commit (PostgreSQL)
    raise Suspend(
        et.WAITING_FOR_CHILDREN,
        {
            "step": path_text(path),
            "group": group,
            "workflow": row.workflow_name,
            "total": row.total,
            "timeout_at": row.timeout_at.isoformat() if row.timeout_at else None,
        },
    )


def _group(tenant_id: str, parent_run_id: Any, group: str) -> WorkflowChildGroup | None:
    return WorkflowChildGroup.objects.filter(
        tenant_id=tenant_id, parent_run_id=parent_run_id, group=group
    ).first()


def _request(
    executor: Any, path: tuple[Any, ...], group: str, spec: ChildSpec, inputs: list[Any]
) -> list[Event]:
    """Append each child's request: its trigger, whose payload is its input."""
    requests = []
    ctx = executor.ctx
    created_by = f"workflow:{ctx.workflow_name}"[: Event._meta.get_field("created_by").max_length]
    for index, payload in enumerate(inputs):
        meta: dict[str, Any] = {"parent_run_id": str(ctx.run_id), "group": group, "index": index}
        if index == 0:  # the group, as its projection creates it
            meta.update(
                step=path_text(path),
                workflow=spec.workflow,
                total=len(inputs),
                max_concurrency=spec.max_concurrency,
                on_child_failure=spec.on_child_failure,
                on_cancel=spec.on_cancel,
                timeout_at=spec.timeout,
            )
        try:
            clean = to_json(payload, f"child {index}'s input")
            with engine_stream():
                request = append_event(
                    call_id(ctx.tenant_id, child_key(ctx.run_id, group, index)),
                    et.CALL_AGGREGATE_TYPE,
                    et.CALL_REQUESTED,
                    clean,
                    tenant_id=ctx.tenant_id,
                    expected_version=0,
                    metadata=meta,
                    created_by=created_by,
                    savepoint=False,
                )
        except (NotJSON, InvalidEvent) as exc:
            raise executor.invalid(path, f"child {index}'s input: {exc}") from None
        requests.append(request)
    return requests


def _count_own(tenant_id: str, parent_run_id: Any, group: str) -> None:
    """Count now the group's children that ended inline in this batch (no other batch's)."""
    ends = fan_in.take_group(tenant_id, parent_run_id, group)
    if ends:
        fan_in.count_ends(tenant_id, {"run_id": parent_run_id, "group": group}, sorted(ends))


def fill(tenant_id: str, parent_run_id: Any, group: str, start: Start) -> None:
    """Start the group's next children, in item order, while its window has room."""
    while True:
        _count_own(tenant_id, parent_run_id, group)
        row = group_of(tenant_id, {"run_id": parent_run_id, "group": group})
        row = row.select_for_update().first()
        if row is None or row.closed or row.stopped or row.started >= row.total:
            return
        if row.max_concurrency is not None and row.started - row.finished >= row.max_concurrency:
            return
        if not _start_child(row, row.started, start):
            return


def _start_child(row: WorkflowChildGroup, index: int, start: Start) -> bool:
    key = child_key(row.parent_run_id, row.group, index)
    trigger = Event.objects.filter(
        tenant_id=row.tenant_id, aggregate_id=call_id(row.tenant_id, key), version=1
    ).first()
    workflow = registry.get(row.workflow_name)
    if trigger is None or workflow is None:
        logger.error(
            "run=%s group=%s: child %d cannot start (%s)",
            row.parent_run_id,
            row.group,
            index,
            "its request is gone" if trigger is None else f"no workflow {row.workflow_name!r}",
        )
        return False
    parent = {"run_id": str(row.parent_run_id), "group": row.group, "index": index}
    return start(workflow, trigger, key=key, parent=parent) is not None


def outcomes(row: WorkflowChildGroup) -> list[dict[str, Any]]:
    """Each child's outcome, in item order, from its terminal event (read once, by id)."""
    ids = [child_run_id(row, i) for i in range(row.total)]
    ended: dict[uuid.UUID, Event] = {}
    for first in range(0, len(ids), BATCH):
        batch = ids[first : first + BATCH]
        for event in Event.objects.filter(
            tenant_id=row.tenant_id, aggregate_id__in=batch, type__in=et.TERMINAL
        ).only("aggregate_id", "type", "payload"):
            ended[event.aggregate_id] = event
    found = []
    for run_id in ids:
        ending = ended.get(run_id)
        if ending is None:
            found.append({"run_id": str(run_id), "status": "not_started"})
        elif ending.type == et.RUN_COMPLETED:
            result = ending.payload.get("result")
            found.append({"run_id": str(run_id), "status": "completed", "result": result})
        else:
            found.append(
                {
                    "run_id": str(run_id),
                    "status": "failed" if ending.type == et.RUN_FAILED else "cancelled",
                    "reason": ending.payload.get("reason") or "",
                    "step": ending.payload.get("step") or "",
                    "error_class": ending.payload.get("error_class") or "",
                }
            )
    return found


def child_failure(label: str, step: str, outcome: dict[str, Any], index: int | None) -> Failure:
    """The failure of the step at ``step`` whose child (``index`` of a fan-out) did not complete."""
    which = "its child run" if index is None else f"child run {index}"
    status = outcome["status"]
    why = f" ({outcome['reason']})" if outcome.get("reason") else ""
    return Failure(
        str(outcome.get("reason")) if status == "timed_out" else CHILD_FAILED,
        step,
        f"{label}: {which} {status}{why}",
        error_class=outcome.get("error_class") or "",
        detail=f"{label}: {which} {outcome['run_id']} {status}{why}",
    )


def result_of(workflow: Workflow, ctx: Any) -> Any:
    """What a run returns to its parent: ``returns`` (a result name or a callable), else
    the result of its last top-level step (None if that stores none)."""
    returns = workflow.returns
    if callable(returns):
        try:
            value = returns(ctx)
        except Exception as exc:
            message = "its returns callable raised"
            raise failure_from_exception(STEP_FAILED, "", message, exc) from exc
        try:
            return to_json(value, "returns")
        except NotJSON as exc:
            raise Failure(
                INVALID_STEP_RESULT, "", "its returns value is not JSON", detail=str(exc)
            ) from None
    name = returns if isinstance(returns, str) else workflow.steps[-1].result_name()
    return None if name is None else ctx.steps.get(name)


# --- the child's side: a reaction to its terminal event ------------------------------


def on_child_finished(event: Event, replaying: bool, start: Start) -> None:
    """A child run ended: start the next child of its group, or wake its parent (once).

    In a worker's batch, once for its group at the batch's end instead
    (:func:`count_batch`). A run that failed because its children timed out
    cancels those still unfinished, in its failure's transaction.
    """
    if replaying or event.aggregate_type != et.RUN_AGGREGATE_TYPE:
        return
    if event.type == et.RUN_FAILED and event.payload.get("reason") == CHILD_TIMEOUT:
        ids = [r.run_id for r in _unfinished(event.tenant_id, [event.aggregate_id])]
        if ids:
            tree = lock_tree(event.tenant_id, ids)
            cancel_tree(event.tenant_id, tree, "its parent's step timed out", "")
    if fan_in.batching():
        return
    parent = parent_of(event)
    if parent is None:
        return
    _next(event.tenant_id, parent, start)


def count_batch(start: Start) -> None:
    """At a worker's batch's end, in its transaction: count the children that ended in it.

    Per group, once: its row is updated, the next children start, and the
    parent is woken if they have all finished. An end whose event is gone
    (its run's savepoint was rolled back) is not counted.
    """
    while seen := fan_in.take():
        for (tenant_id, parent_run_id, group), ends in seen.items():
            present = set(
                Event.objects.filter(
                    tenant_id=tenant_id, id__in=[event_id for event_id, _ in ends]
                ).values_list("id", flat=True)
            )
            kept = sorted(end for end in ends if end[0] in present)
            if not kept:
                continue
            parent = {"run_id": parent_run_id, "group": group}
            fan_in.count_ends(tenant_id, parent, kept)
            _next(tenant_id, parent, start)


def _next(tenant_id: str, parent: dict[str, Any], start: Start) -> None:
    row = group_of(tenant_id, parent).select_for_update().first()
    if row is None or row.closed:
        return
    if row.max_concurrency is not None and not row.stopped and row.started < row.total:
        fill(tenant_id, row.parent_run_id, row.group, start)
        row = group_of(tenant_id, parent).first()
        assert row is not None
    if row.done:
        wakeups.children_finished(tenant_id, row.parent_run_id)


# --- the cancel cascade ---------------------------------------------------------------


def _unfinished(tenant_id: str, parents: list[Any], group: str | None = None) -> list[WorkflowRun]:
    """The unfinished children of ``parents`` (of one group), but those their parent abandons."""
    found: list[WorkflowRun] = []
    for first in range(0, len(parents), BATCH):
        batch = parents[first : first + BATCH]
        abandoned = set(
            WorkflowChildGroup.objects.filter(
                tenant_id=tenant_id, parent_run_id__in=batch, on_cancel="abandon"
            ).values_list("parent_run_id", "group")
        )
        runs = WorkflowRun.objects.filter(tenant_id=tenant_id, parent_run_id__in=batch).exclude(
            status__in=SETTLED_STATUSES
        )
        if group is not None:
            runs = runs.filter(parent_group=group)
        found.extend(
            r for r in runs.order_by("run_id") if (r.parent_run_id, r.parent_group) not in abandoned
        )
    return found


def descendants(tenant_id: str, roots: list[Any]) -> list[Any]:
    """The unfinished runs below ``roots`` (roots excluded), parents before their children."""
    found: list[Any] = []
    seen = set(roots)
    level = list(roots)
    while level:
        level = [r.run_id for r in _unfinished(tenant_id, level) if r.run_id not in seen]
        seen.update(level)
        found.extend(level)
    return found


def lock_tree(tenant_id: str, runs: list[Any], *, below: bool = True) -> list[Any]:
    """Lock the pending rows of ``runs`` and (``below``) of their unfinished descendants.

    Before anything is appended, so no child finishing meanwhile holds what
    the cancel waits for: the lock order of every writer to a run (its
    pending rows, then its stream). Read again until the tree stops growing
    (a child finishing while it was read may have started the next).
    Returns the runs, parents first.
    """
    tree = list(runs) + (descendants(tenant_id, list(runs)) if below else [])
    while True:
        for first in range(0, len(tree), BATCH):
            list(
                WorkflowRunPending.objects.select_for_update()
                .filter(tenant_id=tenant_id, run_id__in=tree[first : first + BATCH])
                .order_by("pk")
                .values_list("pk", flat=True)
            )
        if not below:
            return tree
        again = list(runs) + descendants(tenant_id, list(runs))
        if set(again) <= set(tree):
            return again
        tree = again


def cancel_tree(tenant_id: str, runs: list[Any], reason: str, by: str) -> int:
    """Append ``workflow.run-cancelled`` to each unfinished run of ``runs``, in order."""
    cancelled = 0
    for run_id in runs:
        run = WorkflowRun.objects.filter(tenant_id=tenant_id, run_id=run_id).first()
        if run is None or run.status in SETTLED_STATUSES:
            continue
        stream = RunStream.of_run(run)
        stream.append(
            et.RUN_CANCELLED,
            {"workflow_name": run.workflow_name, "reason": reason[:1000], "by": by},
            created_by=by,
        )
        cancelled += 1
    return cancelled
