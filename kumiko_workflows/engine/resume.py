"""Resuming suspended runs, and the operations on a run: cancel, wake, rerun.

``resume_due_runs`` claims due pending rows one at a time (``FOR UPDATE SKIP
LOCKED`` on PostgreSQL, so racing workers never pick the same row; the claim
deletes the row), resumes each and commits a batch at a time (see
:func:`_drain_tenant`). ``workflow.step.resumed`` goes in at the version
after the suspension, with the segment's last event: the stream's unique
(tenant_id, aggregate_id, version) still referees, so each suspension is
resumed at most once.
"""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from collections.abc import Callable, Collection, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from django.db.models import F

from kumiko_workflows import event_types as et
from kumiko_workflows import telemetry
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.engine import deploys
from kumiko_workflows.engine.segment import Cursor, RunContext, fail_opened, run_segment
from kumiko_workflows.engine.wakeups import (
    decide_waiting_checks,
    event_ending,
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
from kumiko_workflows.store.dispatch import others_listen_to_post_save
from kumiko_workflows.store.dispatch import registry as projections
from kumiko_workflows.store.events import joins_callers_transaction, name_problem
from kumiko_workflows.store.streams import (
    AWAITED_EVENT_UNAVAILABLE,
    DEFINITION_CHANGED,
    INVALID_PENDING_ROW,
    RESUME_FAILED_REPEATEDLY,
    TRIGGER_EVENT_UNAVAILABLE,
    Failure,
    RunStream,
    fail_run,
    raised,
)
from kumiko_workflows.workflow import clock, suspensions
from kumiko_workflows.workflow.definition import Workflow, parse_path, registry
from kumiko_workflows.workflow.jsonvalues import text_problem

logger = logging.getLogger("kumiko_workflows.resume")


@dataclass
class ResumeReport:
    """What one ``resume_due_runs`` pass did.

    ``resumed`` counts claims (rows whose ``workflow.step.resumed`` was
    appended); each row then ends ``completed``, ``suspended`` or ``failed``.
    A row failed before its claim (a changed definition) counts only in
    ``failed``. (A row another worker holds is never claimed: nothing is
    skipped.) ``left`` counts rows of newer code than this process's, left
    due for a worker that has it (see :mod:`kumiko_workflows.engine.deploys`).
    ``errors`` counts rows whose resume raised; the pass that fails such a
    run after ``MAX_RESUME_ERRORS`` of them counts it in ``failed``.
    """

    resumed: int = 0
    completed: int = 0
    suspended: int = 0
    failed: int = 0
    errors: int = 0
    left: int = 0

    def add(self, other: ResumeReport) -> None:
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    @property
    def processed(self) -> int:
        return self.completed + self.suspended + self.failed + self.errors

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        # ``left`` only when some were: it happens during a deploy, and says so.
        items = self.as_dict()
        if not items["left"]:
            del items["left"]
        return " ".join(f"{key}={value}" for key, value in items.items())


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
        if event_id is not None and (isinstance(event_id, bool) or not isinstance(event_id, int)):
            return f"awaited[{key!r}] is not an event id"
    return None


def _awaited_ids(row: WorkflowRunPending) -> set[int]:
    """Ids of the awaited events a resume of ``row`` reads (the trigger comes with the claim)."""
    ids = [row.awaited_event_id, *row.awaited_refs().values()]
    return {i for i in ids if isinstance(i, int) and not isinstance(i, bool)}


@telemetry.traced_resume
def resume_row(row: WorkflowRunPending, trigger: Event | None, now: datetime) -> tuple[str, bool]:
    """Resume one pending row, whose trigger event is ``trigger``; return (outcome, claimed).

    The outcome is completed, suspended, failed or left (the run needs
    newer code than this process's: the row is put back as it was, still
    due); ``claimed`` says whether ``workflow.step.resumed`` was appended.

    Must run in the transaction whose claim deleted the row. A failing step
    fails the run (see :func:`run_segment`); any other error, a stream that
    moved under the claim (:class:`VersionConflict`) included, propagates,
    and the caller must roll back the claim and what followed it.
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
    )
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
        cursor = Cursor(path, after=record.after, attempt=record.attempt(row))
    else:  # a rerun of a run that failed after its last step: just complete it
        cursor = Cursor((len(workflow.steps),), after=False)
    # A move onto an edited definition is appended on its own: its status write comes first.
    held = moved_from is None
    return run_segment(workflow, stream, ctx, cursor, opening, hold_opening=held), True


def resume_due_runs(
    tenant_id: str | None = None,
    limit: int | None = None,
    *,
    now: datetime | None = None,
    should_stop: Callable[[], bool] | None = None,
    tenants: Sequence[str] | None = None,
    workflows: Sequence[str] | None = None,
) -> ResumeReport:
    """Resume every due run (of one tenant, of ``tenants``, or of all), fairly across tenants.

    ``workflows`` limits the pass to runs of those workflows (the worker's
    ``--queue``: the task queues' workflows).

    Wake-ups left for later are decided first. Tenants take turns: each
    tenant with due rows resumes up to its turn's share (``BATCH_SIZE``
    runs, times its ``TENANT_WEIGHTS`` weight), oldest due first, before
    the next tenant's turn, round after round until every tenant is drained,
    so a due run waits for at most one turn of each other tenant, however
    large their backlogs. Between rounds, at most every ``BATCH_SECONDS``,
    the pass looks for tenants that came to have due rows meanwhile, which
    join it; a tenant drained in this pass does not rejoin, so a pass ends.
    Rows are claimed one at a time and committed up to ``BATCH_SIZE`` per
    transaction (see :func:`_drain_tenant`). A failing step fails its run; a
    row that raises (an infrastructure error) is logged and counted in
    ``errors`` and does not stop the others. ``now`` defaults to the current
    time; ``should_stop`` is polled between rows. ``tenants`` (not with
    ``tenant_id``) limits the pass to those tenants, taking turns.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidArgument(f"limit must be a positive integer, got {limit!r}")
    check_name(tenant_id, "tenant_id", "tenant_id")
    if tenants is not None:
        if tenant_id is not None:
            raise InvalidArgument("give tenant_id or tenants, not both")
        if isinstance(tenants, str):
            raise InvalidArgument(f"tenants must be a list of tenant ids, got {tenants!r}")
        for each in tenants:
            check_name(each, "tenants", "tenant_id")
    # Wake-ups not yet decided (their process died after commit, or a row
    # was locked) first, so the runs they wake are due in this pass.
    for checked in [tenant_id] if tenants is None else list(tenants):
        decide_waiting_checks(checked)
    # Each tenant's rows due when it joins the pass are picked; each runs at
    # its own moment, so waits and backoffs it starts are not shortened by a
    # long pass.
    fixed = now
    start = fixed or clock.now()

    def moment() -> datetime:
        return fixed or clock.now()

    report = ResumeReport()
    stop = should_stop or (lambda: False)
    leaving = deploys.leaving()
    with db.claiming_only(workflows) if workflows is not None else nullcontext():
        _take_turns(tenant_id, tenants, start, moment, report, limit, stop, leaving)
    return report


def _take_turns(
    tenant_id: str | None,
    tenants: Sequence[str] | None,
    start: datetime,
    moment: Callable[[], datetime],
    report: ResumeReport,
    limit: int | None,
    stop: Callable[[], bool],
    leaving: Collection[str],
) -> None:
    """The pass of :func:`resume_due_runs`: one tenant drained, or the tenants' turns."""
    if tenant_id is not None:
        # One tenant: no turns to take, its batches exactly as before.
        _drain_tenant(tenant_id, start, moment, report, limit, stop, None, set(), leaving)
        return
    # Insertion-ordered: the order of each round's turns.
    due_at: dict[str, datetime] = {}
    passed_over: dict[str, set[int]] = {}
    if tenants is not None:
        due_at = dict.fromkeys(tenants, start)
    else:
        due_at = dict.fromkeys(db.due_tenants(start), start)
    joined = set(due_at)
    looked = time.monotonic()
    while due_at:
        for tenant in list(due_at):
            if stop() or (limit is not None and report.processed >= limit):
                return
            drained = _drain_tenant(
                tenant,
                due_at[tenant],
                moment,
                report,
                limit,
                stop,
                turn_share(tenant),
                passed_over.setdefault(tenant, set()),
                leaving,
            )
            if drained:
                del due_at[tenant]
        # At most every BATCH_SECONDS: the look is one index probe per tenant
        # with pending rows, due or not, and a pass of one big backlog has a
        # round per turn.
        if tenants is None and time.monotonic() - looked >= float(workflow_settings.BATCH_SECONDS):
            looked = time.monotonic()
            instant = moment()
            for tenant in db.due_tenants(instant):
                if tenant not in joined:
                    joined.add(tenant)
                    due_at[tenant] = instant


def turn_share(tenant: str) -> int:
    """Runs one turn of ``tenant`` resumes: ``BATCH_SIZE`` times its weight (default 1).

    The weights are ``KUMIKO_WORKFLOWS['TENANT_WEIGHTS']`` (tenant id to a
    positive integer; system check ``kumiko_workflows.E110``).
    """
    weights = workflow_settings.TENANT_WEIGHTS or {}
    weight = weights.get(tenant, 1) if isinstance(weights, dict) else 1
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
        weight = 1  # reported by the system check; never a stuck tenant
    return max(1, int(workflow_settings.BATCH_SIZE)) * weight


def _commits_per_run(row: WorkflowRunPending) -> bool:
    workflow = registry.of_run(row.workflow_name, row.workflow_version, row.definition_fingerprint)
    return workflow is not None and workflow.commit == "per_run"


class _Unwound(Exception):
    """A run's resume raised with its writes in the batch's transaction: roll the batch back."""

    def __init__(self, row: WorkflowRunPending, error: Exception) -> None:
        super().__init__(str(error))
        self.row = row
        self.error = error


def _drain_tenant(
    tenant: str,
    now: datetime,
    clock: Callable[[], datetime],
    report: ResumeReport,
    limit: int | None,
    should_stop: Callable[[], bool],
    share: int | None,
    passed_over: set[int],
    leaving: Collection[str] = (),
) -> bool:
    """Resume the tenant's due rows (up to ``share`` claims: its turn), a batch per transaction.

    Returns whether the tenant has no row left to claim (its turn may also
    end at ``share``, at ``limit`` or at a stop; None: no share, drain it).
    A row is locked only when its turn comes, so a slow step never holds rows
    it has not reached: other workers take them meanwhile. A failing step
    fails its run alone (its steps' writes roll back to the savepoint taken
    before their first statement), so no other run's steps run again. A
    transaction commits after ``BATCH_SIZE`` runs, once ``BATCH_SECONDS``
    have passed (a slow step ends its batch), and around each run of a
    workflow defined with ``commit="per_run"``. ``passed_over`` (rows whose
    resume raised) lasts the whole pass, across the tenant's turns.

    An error in the engine's own writes for a run (a database error, a
    site's projection raising) is rolled back with its savepoint where code
    besides the engine's reacts to run events (see :func:`guarded`), and
    otherwise with the batch, as a crash would: then the batch's other runs
    are resumed again, and their steps run again.
    """
    batch_size = max(1, int(workflow_settings.BATCH_SIZE))
    claims = 0
    while True:
        remaining = None if limit is None else limit - report.processed
        if share is not None:
            remaining = share - claims if remaining is None else min(remaining, share - claims)
        if (remaining is not None and remaining <= 0) or should_stop():
            return False
        size = batch_size if remaining is None else min(batch_size, remaining)
        batch = ResumeReport()
        drained = False
        try:
            with db.atomic():
                savepoints = guarded()
                deadline = time.monotonic() + float(workflow_settings.BATCH_SECONDS)
                for _ in range(size):
                    if should_stop():
                        break
                    done = _claim_and_resume(
                        tenant, now, clock(), passed_over, batch, savepoints, leaving
                    )
                    if done is None:
                        drained = True
                        break
                    claims += 1
                    if done or time.monotonic() > deadline:
                        break  # commit now
        except _Unwound as unwound:
            if _count_unwound(unwound.row, unwound.error):
                report.failed += 1
            else:
                report.errors += 1
            continue
        report.add(batch)
        if drained:
            return True


def _claim_and_resume(
    tenant: str,
    due: datetime,
    now: datetime,
    passed_over: set[int],
    batch: ResumeReport,
    savepoint: bool,
    leaving: Collection[str] = (),
) -> bool | None:
    """Claim the next row due at ``due`` and resume it; count its outcome in ``batch``.

    Returns None when no row is due, else whether to commit right after it
    (its workflow commits per run). With ``savepoint``, the claim and the
    resume share a savepoint that an error rolls back; without, an error
    raises :class:`_Unwound` and the batch is rolled back.
    """
    row: WorkflowRunPending | None = None
    try:
        with db.atomic() if savepoint else nullcontext():
            claimed = db.claim_due(tenant, due, passed_over, leaving)
            if claimed is None:
                return None
            row, trigger = claimed
            outcome, resumed = resume_row(row, trigger, now)
    except Exception as exc:
        if row is None or db.connection_broken():
            # No row to blame, or every row after this one would fail the
            # same way: end the pass, so the worker backs off and reconnects.
            raise
        logger.exception(
            "run=%s step=%s tenant=%s could not be resumed", row.run_id, row.step, tenant
        )
        passed_over.add(row.pk)
        if not savepoint:
            raise _Unwound(row, exc) from exc
        if _count_unwound(row, exc):
            batch.failed += 1
        else:
            batch.errors += 1
        return False
    batch.resumed += resumed
    setattr(batch, outcome, getattr(batch, outcome) + 1)
    if outcome == "left":
        passed_over.add(row.pk)
        return False
    return _commits_per_run(row)


def guarded() -> bool:
    """Whether each run's writes need a savepoint: code besides the engine's reacts to them.

    A site's projection or ``post_save`` receiver for run events runs
    inside the run's writes; if it raises, the savepoint takes that run
    back alone. The engine's own projections raise only when the database
    does, which rolls the batch back like a crash.
    """
    return projections.foreign_handlers(et.RUN_EVENTS) or others_listen_to_post_save()


def _count_unwound(row: WorkflowRunPending, exc: Exception) -> bool:
    """:func:`_resume_raised` once the claim of ``row`` was rolled back.

    The row is counted only if it is still the same suspension and nobody
    holds it (another worker may have taken it meanwhile).
    """
    with db.atomic():
        held = (
            WorkflowRunPending.objects.select_for_update(skip_locked=True)
            .filter(tenant_id=row.tenant_id, pk=row.pk, run_version=row.run_version)
            .exists()
        )
        return held and _resume_raised(row, exc)


def max_resume_errors() -> int:
    """Passes in a row whose resume raises before the run is failed (at least 1)."""
    return max(1, int(workflow_settings.MAX_RESUME_ERRORS))


def _resume_raised(row: WorkflowRunPending, exc: Exception) -> bool:
    """Count a pass whose resume of ``row`` raised; fail the run at the limit.

    Returns whether the run was failed (``resume_failed_repeatedly``, after
    ``MAX_RESUME_ERRORS`` passes in a row): nothing is retried for ever. The
    count is on the pending row, which this transaction holds, and commits
    with the batch; the row's savepoint has rolled the resume itself back.
    """
    try:
        with db.atomic():
            WorkflowRunPending.objects.filter(tenant_id=row.tenant_id, pk=row.pk).update(
                resume_errors=F("resume_errors") + 1
            )
        row.resume_errors += 1
        if row.resume_errors < max_resume_errors():
            return False
        failure = raised(
            RESUME_FAILED_REPEATEDLY,
            row.step,
            f"resuming the run raised on {row.resume_errors} passes in a row:",
            exc,
        )
        with db.atomic():
            fail_run(
                RunStream.of_pending(row),
                failure,
                state=row.state,
                retry_from=row.step,
                suspension=suspensions.standing(row),
            )
    except Exception:
        if db.connection_broken():
            raise
        # Not even this could be written: the next pass tries again.
        logger.exception("run=%s: its failed resume could not be counted or failed", row.run_id)
        return False
    return True


# --- operations on one run -----------------------------------------------------


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
    type: str,
    payload: Callable[[WorkflowRun], dict[str, Any]],
    created_by: str | None,
    then: Callable[[WorkflowRun], None] | None = None,
) -> bool:
    """Append ``type`` to an ``eligible`` run's stream; ``then`` follows in its transaction."""
    for _ in range(5):
        run = find_run(run_id)
        if not eligible(run):
            return False
        stream = RunStream(
            run.run_id,
            run.tenant_id,
            run.workflow_name,
            run.version,
            run.definition_fingerprint,
            run.trigger_event_id,
        )
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
                stream.append(type, payload(run), created_by=created_by or "")
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


def cancel_run(run_id: uuid.UUID | str, reason: str, by: str | None = None) -> bool:
    """Cancel a run that has not finished; False if it already had.

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
    return _append_to_run(
        run_id,
        lambda run: run.status not in SETTLED_STATUSES,
        et.RUN_CANCELLED,
        lambda run: {"workflow_name": run.workflow_name, "reason": reason[:1000], "by": by or ""},
        by,
    )


def wake_run(run_id: uuid.UUID | str, by: str | None = None) -> bool:
    """Make a waiting run due now; False if it is not waiting.

    Raises :class:`RunNotFound` for an unknown id, :class:`InvalidArgument`
    for a ``by`` the event store would refuse.
    """
    check_by(by)
    joins_callers_transaction("wake_run")
    return _append_to_run(
        run_id,
        lambda run: run.status == RunStatus.WAITING,
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
    failed = (
        Event.objects.filter(tenant_id=run.tenant_id, aggregate_id=run.run_id, type=et.RUN_FAILED)
        .order_by("-version")
        .first()
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

    def payload(current: WorkflowRun) -> dict[str, Any]:
        return {
            "step": rerun_from,
            "workflow_name": current.workflow_name,
            "workflow_version": version,
            "definition_fingerprint": current.definition_fingerprint,
            "trigger_event_id": current.trigger_event_id,
            "state": failed.payload.get("state") or {},
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


def retry_run(run_id: uuid.UUID | str, by: str | None = None) -> bool:
    """Deprecated: the old name of :func:`rerun_run`, which it calls."""
    warnings.warn(
        "kumiko_workflows.retry_run is deprecated; use rerun_run",
        DeprecationWarning,
        stacklevel=2,
    )
    return rerun_run(run_id, by=by)
