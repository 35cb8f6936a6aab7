"""The operations on one run: cancel, wake now, rerun a failed run, retry.

Each appends an event to the run's stream at its next version (the stream's
uniqueness referees a race with a worker), in the caller's transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from kumiko_workflows import telemetry
from kumiko_workflows.engine import children, compensation, deploys
from kumiko_workflows.engine.wakeups import (
    suspended_on_event,
    wake_by_look_back,
)
from kumiko_workflows.exceptions import (
    InvalidArgument,
    RunNotFound,
    RunNotRerunnable,
    VersionConflict,
)
from kumiko_workflows.models import (
    SETTLED_STATUSES,
    Event,
    RunStatus,
    SuspensionType,
    WorkflowRun,
    WorkflowRunPending,
)
from kumiko_workflows.store import db
from kumiko_workflows.store.event_checks import name_problem
from kumiko_workflows.store.events import joins_callers_transaction
from kumiko_workflows.store.streams import (
    RunStream,
)
from kumiko_workflows.workflow import clock
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.jsonvalues import text_problem


def find_run(run_id: uuid.UUID | str) -> WorkflowRun:
    """The run's status row; :class:`RunNotFound` for an id that is not a run's."""
    try:
        key = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except ValueError:
        raise RunNotFound(f"{run_id!r} is not a run id (a UUID)") from None
    run = WorkflowRun.objects.filter(run_id=key).first()
    if run is None:
        raise RunNotFound(f"no workflow run has id {key}")
    return run


def _append_to_run(
    run_id: uuid.UUID | str,
    eligible: Callable[[WorkflowRun], bool],
    type: str | Callable[[WorkflowRun], str],
    payload: Callable[[WorkflowRun], dict[str, Any]],
    created_by: str | None,
    then: Callable[[WorkflowRun], None] | None = None,
    before: Callable[[WorkflowRun], None] | None = None,
) -> bool:
    """Append ``type`` to an ``eligible`` run's stream; ``then`` follows in its transaction.

    ``before`` runs once the run's pending rows are locked, before the append
    (``type`` and ``payload`` may depend on what it found).
    """
    for _ in range(5):
        run = find_run(run_id)
        if not eligible(run):
            return False
        stream = RunStream.of_run(run)
        try:
            with db.atomic():
                # The lock order of every writer to a run: its pending rows,
                # then its stream. A worker or a wake-up holding them is
                # waited for, never deadlocked with.
                list(
                    WorkflowRunPending.objects.select_for_update().filter(
                        tenant_id=run.tenant_id, run_id=run.run_id
                    )
                )
                if before is not None:
                    before(run)
                kind = type(run) if callable(type) else type
                stream.append(kind, payload(run), created_by=created_by or "")
                if then is not None:
                    then(run)
        except VersionConflict:
            telemetry.conflict("operation")
            continue  # the run moved (a worker resumed it): look again
        return True
    return False


def check_name(value: Any, what: str, column: str, *, blank: bool = False) -> None:
    """Refuse, before any SQL, a value (None aside) the event's ``column`` cannot hold."""
    problem = None if value is None else name_problem(value, column, blank=blank)
    if problem:
        raise InvalidArgument(f"{what} {problem}")


def check_by(by: str | None) -> None:
    check_name(by, "by", "created_by", blank=True)


def cancel_run(
    run_id: uuid.UUID | str, reason: str, by: str | None = None, *, compensate: bool = False
) -> bool:
    """Cancel a run that has not finished; False if it already had.

    Its unfinished child runs (``call_workflow``, ``fan_out``) are cancelled
    with it, at any depth, in the same transaction, each with
    ``workflow.run-cancelled`` in its own stream, except the children of a
    step with ``on_cancel="abandon"``. ``compensate=True``: a run with
    finished compensable steps runs their compensations first (in a
    worker) and then ends cancelled. A run already compensating is not
    cancelled again.

    Raises :class:`RunNotFound` for an unknown id, :class:`InvalidArgument`
    for a reason or ``by`` the event store would refuse.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidArgument("cancel_run() needs a reason (a non-empty string)")
    problem = text_problem(reason)
    if problem:
        raise InvalidArgument(f"reason {problem}")
    check_by(by)
    joins_callers_transaction("cancel_run")
    tree: list[Any] = []
    waits: list[WorkflowRunPending] = []

    def before(run: WorkflowRun) -> None:
        # Every pending row of the run's tree, before anything is appended.
        tree[:] = children.lock_tree(run.tenant_id, [run.run_id])[1:]
        waits[:] = list(
            WorkflowRunPending.objects.filter(tenant_id=run.tenant_id, run_id=run.run_id)
        )

    def state_of(run: WorkflowRun) -> dict[str, Any] | None:
        if not compensate:
            return None
        for row in waits:
            state = row.state if isinstance(row.state, dict) else {}
            if state.get("compensable"):
                return state
        return None

    def kind(run: WorkflowRun) -> str:
        return et.RUN_CANCELLED if state_of(run) is None else et.COMPENSATION_SCHEDULED

    def payload(run: WorkflowRun) -> dict[str, Any]:
        cancel = {"reason": reason[:1000], "by": by or ""}
        state = state_of(run)
        if state is None:
            return {"workflow_name": run.workflow_name, **cancel}
        state = {**state, "compensation": compensation.plan(state["compensable"], None, cancel)}
        return compensation.scheduled(
            step=run.step,
            workflow_name=run.workflow_name,
            workflow_version=run.workflow_version,
            fingerprint=run.definition_fingerprint,
            trigger_event_id=run.trigger_event_id,
            state=state,
            wake_at=clock.now(),
            cancel=cancel,
        )

    def cascade(run: WorkflowRun) -> None:
        children.cancel_tree(
            run.tenant_id, tree, f"its parent run {run.run_id} was cancelled", by or ""
        )

    return _append_to_run(
        run_id,
        lambda run: (
            run.status not in SETTLED_STATUSES and run.suspension_type != SuspensionType.COMPENSATE
        ),
        kind,
        payload,
        by,
        then=cascade,
        before=before,
    )


def wake_run(run_id: uuid.UUID | str, by: str | None = None) -> bool:
    """Make a waiting run due now; False if it is not waiting.

    A run queued behind its key's active run (``singleton="queue"``) is not
    woken (False): its key's gate wakes it when its turn comes.

    Raises :class:`RunNotFound` for an unknown id, :class:`InvalidArgument`
    for a ``by`` the event store would refuse.
    """
    check_by(by)
    joins_callers_transaction("wake_run")
    return _append_to_run(
        run_id,
        lambda run: run.status == RunStatus.WAITING and run.suspension_type != SuspensionType.HELD,
        et.WAKE_REQUESTED,
        lambda run: {"workflow_name": run.workflow_name, "step": run.step, "by": by or ""},
        by,
    )


def rerun_refusal(run: WorkflowRun) -> str | None:
    """Why :func:`rerun_run` would refuse ``run`` as read, or None: what the run page offers."""
    try:
        _rerun_basis(run)
    except RunNotRerunnable as exc:
        return str(exc)
    return None


def _rerun_basis(run: WorkflowRun) -> tuple[Workflow, Event]:
    """The definition a rerun of ``run`` runs on and the failure it starts from.

    Raises :class:`RunNotRerunnable` when the run is not failed, it failed
    before its first step (a failure records where a rerun starts as
    "retry_from"), or its version is no longer declared or was edited at or
    before that step: the rule a resume follows (an edit after it keeps the
    run, which the resume moves onto the edited definition).
    """
    if run.status != RunStatus.FAILED:
        raise RunNotRerunnable(f"run {run.run_id} is {run.status}, not failed")
    if run.parent_run_id is not None:
        raise RunNotRerunnable(
            f"run {run.run_id} is a child run of {run.parent_run_id}: its parent counted its "
            "failure; rerun the parent (a retry around its step starts a fresh child)"
        )
    failed = (
        Event.objects.filter(tenant_id=run.tenant_id, aggregate_id=run.run_id, type=et.RUN_FAILED)
        .order_by("-version")
        .first()
    )
    if failed is not None and "compensated" in failed.payload:
        raise RunNotRerunnable(
            f"run {run.run_id} failed and its finished steps were compensated: it cannot be rerun"
        )
    if failed is None or failed.payload.get("retry_from") is None:
        raise RunNotRerunnable(f"run {run.run_id} failed before its first step could run")
    workflow, problem = deploys.compatible(
        run.workflow_name,
        run.workflow_version,
        run.definition_fingerprint,
        failed.payload["retry_from"],
        deploys.run_prints(run.tenant_id, run.run_id, run.definition_fingerprint),
    )
    if workflow is None:
        raise RunNotRerunnable(f"run {run.run_id} cannot be rerun, its workflow changed: {problem}")
    return workflow, failed


def rerun_run(run_id: uuid.UUID | str, by: str | None = None) -> bool:
    """Run a failed run again from where its failed attempt began.

    The steps of that attempt were rolled back with the failure, so they run
    again. A run that failed resuming a suspension (its version was not
    declared, an event it needs was gone, the resume raised on every pass)
    resumes that suspension as it was instead: a wait keeps its deadline
    (one already passed resumes at once), a ``wait_for_event`` its timeout
    and its match, and an event that arrived meanwhile is looked back for
    as when it suspended. A definition edited only after that step keeps
    the run, as at a resume. Raises :class:`RunNotRerunnable` when the run
    is not failed or its version is gone or was edited at or before that
    step, :class:`InvalidArgument` for a ``by`` the event store would refuse.
    """
    check_by(by)
    joins_callers_transaction("rerun_run")
    run = find_run(run_id)
    workflow, failed = _rerun_basis(run)
    rerun_from = failed.payload["retry_from"]
    version = workflow.version
    # Written by failures at a suspension's resume (absent from older ones).
    suspension = failed.payload.get("suspension")
    kept = {"suspension": suspension} if suspension else {}

    state = dict(failed.payload.get("state") or {})
    if workflow.has_children:
        # A rerun's call_workflow and fan_out steps start fresh children: the
        # rerun is counted among the attempts their ids are derived from.
        attempts = dict(state.get("attempts") or {})
        attempts["rerun"] = int(attempts.get("rerun", 0)) + 1
        state["attempts"] = attempts

    def payload(current: WorkflowRun) -> dict[str, Any]:
        return {
            "step": rerun_from,
            "workflow_name": current.workflow_name,
            "workflow_version": version,
            "definition_fingerprint": current.definition_fingerprint,
            "trigger_event_id": current.trigger_event_id,
            "state": state,
            "by": by or "",
            **kept,
        }

    def look_back(current: WorkflowRun) -> None:
        # A wait for an event, resumed: an event appended while the run was
        # failed ends it, found as when the wait first suspended.
        wake_by_look_back(current.tenant_id, current.run_id)
        suspended_on_event(current.tenant_id, current.run_id)

    waits = bool(suspension) and suspension.get("suspension_type") == SuspensionType.EVENT
    return _append_to_run(
        run.run_id,
        lambda current: current.status == RunStatus.FAILED,
        et.RERUN_REQUESTED,
        payload,
        by,
        then=look_back if waits else None,
    )
