"""Resuming one claimed pending row: its state checked, its awaited events read, its segment run.

``workflow.step.resumed`` goes in at the version after the suspension, with
the segment's last event: the stream's unique (tenant_id, aggregate_id,
version) still referees, so each suspension is resumed at most once. The
pass that claims the rows is :mod:`kumiko_workflows.engine.resume`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kumiko_workflows import telemetry
from kumiko_workflows.engine import compensation, deploys, gates, limits
from kumiko_workflows.engine.executor import Cursor
from kumiko_workflows.engine.run_context import RunContext
from kumiko_workflows.engine.segment import fail_opened, run_segment
from kumiko_workflows.engine.wakeups import (
    event_ending,
)
from kumiko_workflows.models import (
    Event,
    SuspensionType,
    WorkflowRunPending,
)
from kumiko_workflows.store import claims
from kumiko_workflows.store.streams import (
    AWAITED_EVENT_UNAVAILABLE,
    DEFINITION_CHANGED,
    INVALID_PENDING_ROW,
    LIMIT_KEY_FAILED,
    TRIGGER_EVENT_UNAVAILABLE,
    Failure,
    RunStream,
    fail_run,
)
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import suspensions
from kumiko_workflows.workflow.arguments import is_int
from kumiko_workflows.workflow.positions import parse_path
from kumiko_workflows.workflow.registry import registry


def _state_problem(state: Any) -> str | None:
    """What is wrong with a pending row's state snapshot, or None."""
    if state is None:
        return None
    if not isinstance(state, dict):
        return f"expected an object, got {type(state).__name__}"
    for key in ("results", "awaited"):
        if not isinstance(state.get(key) or {}, dict):
            return f"{key!r} is not an object"
    for key, event_id in (state.get("awaited") or {}).items():
        if event_id is not None and not is_int(event_id):
            return f"awaited[{key!r}] is not an event id"
    return None


def _awaited_ids(row: WorkflowRunPending) -> set[int]:
    """Ids of the awaited events a resume of ``row`` reads (the trigger comes with the claim)."""
    ids = [row.awaited_event_id, *row.awaited_refs().values()]
    return {i for i in ids if is_int(i)}


@telemetry.traced_resume
def resume_row(row: WorkflowRunPending, trigger: Event | None, now: datetime) -> tuple[str, bool]:
    """Resume one pending row, whose trigger event is ``trigger``; return (outcome, claimed).

    The outcome is completed, suspended, failed or left (the run needs
    newer code than this process's: the row is put back as it was, still
    due); ``claimed`` says whether ``workflow.step.resumed`` was appended.

    Must run in the transaction whose claim deleted the row. A failing step
    fails the run (see :func:`run_segment`); any other error, a stream that
    moved under the claim
    (:class:`~kumiko_workflows.exceptions.VersionConflict`) included,
    propagates, and the caller must roll back the claim and what followed it.
    """
    stream = RunStream.of_pending(row, deleted=True)
    stream.savepoint = False  # the caller rolls back on errors
    workflow = registry.of_run(row.workflow_name, row.workflow_version, row.definition_fingerprint)
    moved_from: str | None = None
    if workflow is None or workflow.fingerprint != row.definition_fingerprint:
        verdict = deploys.judge(row)
        if verdict.leave:
            # Put back as claimed: due as before, for a worker with the run's code.
            row.save(force_insert=True)
            return "left", False
        if verdict.workflow is None:
            changed = verdict.problem or "its definition changed"
            fail_run(
                stream,
                Failure(DEFINITION_CHANGED, row.step, changed, detail=changed),
                state=row.state,
                retry_from=row.step,
                suspension=suspensions.standing(row),
            )
            return "failed", False
        # An edit the run survives: it goes on, and is recorded, on the new definition.
        workflow, moved_from = verdict.workflow, row.definition_fingerprint
        stream.fingerprint = workflow.fingerprint

    step = workflow.step_at(row.step)
    record = suspensions.for_type(row.suspension_type)
    try:
        path = parse_path(row.step)
        valid = record is not None and (
            (step is not None and row.suspension_type in step.resumes_from)
            # A rerun or a queued start runs from any step, or (at no step)
            # completes a run that failed after its last one.
            or (not record.by_step and (step is not None or not path))
        )
    except ValueError:
        valid = False
    message: str | None = None
    if not valid:
        message = (
            f"pending row names step {row.step!r} with suspension {row.suspension_type!r}, "
            "which this workflow does not have"
        )
    elif (problem := _state_problem(row.state)) is not None:
        message = f"pending row has a malformed state: {problem}"
    if message is not None:
        fail_run(stream, Failure(INVALID_PENDING_ROW, row.step, message, detail=message))
        return "failed", False

    # The first event after the suspension, appended with the segment's last.
    resumed: dict[str, Any] = {
        "step": row.step,
        "retry_attempt": row.retry_attempt,
        "suspension_type": row.suspension_type,
        "awaited_event_id": row.awaited_event_id,
    }
    if moved_from is not None:
        resumed["from_fingerprint"] = moved_from
        resumed["definition_fingerprint"] = workflow.fingerprint
        resumed["workflow_version"] = workflow.version
    opening = (et.RESUMED, resumed)
    state = row.state or {}
    awaited: dict[str, int | None] = dict(row.awaited_refs())
    wanted = _awaited_ids(row)
    events = Event.objects.filter(tenant_id=row.tenant_id).in_bulk(wanted) if wanted else {}

    unavailable: Failure | None = None
    awaited_gone = False
    if trigger is None:
        unavailable = Failure(
            TRIGGER_EVENT_UNAVAILABLE,
            row.step,
            f"the trigger event #{row.trigger_event_id} is gone",
        )
    elif missing := [i for i in wanted if i not in events]:
        unavailable = Failure(
            AWAITED_EVENT_UNAVAILABLE, row.step, f"the awaited event #{min(missing)} is gone"
        )
        awaited_gone = row.awaited_event_id in missing
    if unavailable is not None:
        fail_opened(
            stream,
            opening,
            unavailable,
            state=state,
            retry_from=row.step,
            suspension=suspensions.standing(row, awaited_gone=awaited_gone),
        )
        return "failed", True
    assert trigger is not None
    admission = limits.ADMITTED
    if workflow.limited:
        try:
            admission = limits.admit(workflow, row, stream, trigger, now)
        except limits.UnusableKey as exc:
            fail_opened(
                stream,
                opening,
                Failure(LIMIT_KEY_FAILED, row.step, str(exc), detail=repr(exc.__cause__ or exc)),
                state=state,
                retry_from=row.step,
                suspension=suspensions.standing(row),
            )
            return "failed", True
        if not admission.admitted:
            # Queued for a slot, or waits for its rate (an "executing" slot
            # it took frees with this transaction: offered on).
            limits.after_segment(row.tenant_id, workflow.name, admission)
            return "suspended", False

    steps = dict(state.get("results") or {})
    for key, event_id in awaited.items():
        steps[key] = events[event_id].payload if event_id is not None else None
    ctx = RunContext(
        run_id=row.run_id,
        workflow_name=row.workflow_name,
        tenant_id=row.tenant_id,
        event=trigger,
        steps=steps,
        awaited=awaited,
        now=now,
        parent=state.get("parent") if isinstance(state.get("parent"), dict) else None,
        attempts=state.get("attempts") if isinstance(state.get("attempts"), dict) else None,
        compensable=(
            state.get("compensable") if isinstance(state.get("compensable"), list) else None
        ),
    )
    if row.suspension_type == SuspensionType.CHILDREN:
        # The children it waits for, whatever its step is called now (a run
        # moved to another version waits at another position, for the same).
        ctx.resumed_group = (row.step, row.awaits_key)
    if row.suspension_type == SuspensionType.COMPENSATE:
        # Its first event is written before the rest of its undo code runs:
        # the batch's next row is claimed after this run, not ahead with it.
        token = claims.next_claim.set(None)
        try:
            return compensation.compensate(workflow, stream, ctx, state, opening, now), True
        finally:
            claims.next_claim.reset(token)
    if row.suspension_type == SuspensionType.EVENT:
        awaited_event = events.get(row.awaited_event_id) if row.awaited_event_id else None
        if awaited_event is None:
            # Timed out: an event committed while the run was suspending may
            # have missed the row, so look once more before giving up on it.
            awaited_event = event_ending(row)
        ctx.steps[row.awaits_key] = awaited_event.payload if awaited_event else None
        ctx.awaited[row.awaits_key] = awaited_event.id if awaited_event else None

    assert record is not None  # checked above
    if path:
        cursor = Cursor(path, after_step=record.resumes_after_step, attempt=record.attempt(row))
    else:  # a rerun of a run that failed after its last step: just complete it
        cursor = Cursor((len(workflow.steps),), after_step=False)
    if row.suspension_type == SuspensionType.DEBOUNCED:
        gates.release_debounced(row)  # the burst ends with this claim
    # A move onto an edited definition is appended on its own: its status write comes first.
    held = moved_from is None
    outcome = run_segment(workflow, stream, ctx, cursor, opening, hold_opening=held)
    limits.after_segment(row.tenant_id, workflow.name, admission)
    return outcome, True
