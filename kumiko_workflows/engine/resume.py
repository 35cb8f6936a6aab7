"""A pass of ``resume_due_runs``: the due pending rows claimed tenant by tenant, resumed, committed.

``resume_due_runs`` claims due pending rows one at a time (``FOR UPDATE SKIP
LOCKED`` on PostgreSQL, so racing workers never pick the same row; the claim
deletes the row), resumes each (:mod:`kumiko_workflows.engine.resume_row`) and commits a
batch at a time (see :func:`_drain_tenant`). The operations on one run
(cancel, wake, rerun) are :mod:`kumiko_workflows.engine.run_controls`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass, fields
from datetime import datetime

from kumiko_workflows import telemetry
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.engine import children, deploys
from kumiko_workflows.engine.claims_ahead import Ahead
from kumiko_workflows.engine.resume_errors import count_unwound
from kumiko_workflows.engine.resume_row import resume_row
from kumiko_workflows.engine.run_controls import check_name
from kumiko_workflows.engine.wakeups import (
    decide_waiting_checks,
)
from kumiko_workflows.exceptions import (
    CrossDatabaseTransaction,
    InvalidArgument,
)
from kumiko_workflows.models import (
    SuspensionType,
    WorkflowRunPending,
)
from kumiko_workflows.projections import children as fan_in
from kumiko_workflows.store import batch_writes, claims, cursors, db, outbox, waiting_pairs
from kumiko_workflows.store.dispatch import others_listen_to_post_save
from kumiko_workflows.store.dispatch import registry as projections
from kumiko_workflows.store.events import append_event
from kumiko_workflows.workflow import clock
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.arguments import int_between
from kumiko_workflows.workflow.registry import registry

logger = logging.getLogger(__name__)


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
    ``relayed`` counts appends a process left in an outbox, relayed first
    (:mod:`kumiko_workflows.store.outbox`).
    """

    resumed: int = 0
    completed: int = 0
    suspended: int = 0
    failed: int = 0
    errors: int = 0
    left: int = 0
    #: Appends a process left in an outbox (it died after its commit), relayed first.
    relayed: int = 0
    #: Outbox rows whose relay raised (kept; see the log), or 1 when an outbox could not be read.
    relay_errors: int = 0

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
        for quiet in ("left", "relayed", "relay_errors"):  # only when some were
            if not items[quiet]:
                del items[quiet]
        return " ".join(f"{key}={value}" for key, value in items.items())


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
    if limit is not None and not int_between(limit, 1):
        raise InvalidArgument(f"limit must be a positive integer, got {limit!r}")
    check_name(tenant_id, "tenant_id", "tenant_id")
    if tenants is not None:
        if tenant_id is not None:
            raise InvalidArgument("give tenant_id or tenants, not both")
        if isinstance(tenants, str):
            raise InvalidArgument(f"tenants must be a list of tenant ids, got {tenants!r}")
        for each in tenants:
            check_name(each, "tenants", "tenant_id")
    refuse_foreign_transaction()
    # Statements prepared while the tables were a fraction of their size now are
    # planned again (store/cursors.py); during the pass, every BATCH_SECONDS.
    cursors.replan_if_grown()
    report = ResumeReport()
    # Appends committed in a site's transaction whose process died before
    # relaying them, first: the runs they start or wake take part in this pass.
    report.relayed, report.relay_errors = _relay_outboxes(
        [tenant_id] if tenant_id is not None else tenants
    )
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

    stop = should_stop or (lambda: False)
    leaving = deploys.leaving()
    with claims.claiming_only(workflows) if workflows is not None else nullcontext():
        _take_turns(tenant_id, tenants, start, moment, report, limit, stop, leaving)
    return report


def refuse_foreign_transaction() -> None:
    """Refuse (:class:`CrossDatabaseTransaction`) a pass inside a transaction on another alias.

    With none open on the engine's alias: the pass commits its batches there
    as it goes, while the writes its steps make to that other database would
    wait for the caller's transaction, and roll back with it, apart from the
    runs they belong to. (With one open on the engine's too, as a test case's,
    both hold everything the pass does, and commit or roll back with the
    caller.)
    """
    other = db.foreign_transaction()
    if other is not None:
        raise CrossDatabaseTransaction(
            f"resume_due_runs() was called inside a transaction on database {other!r}: the "
            f"pass commits its runs on the engine's database ({db.alias()!r}) as it goes, "
            f"while the steps' writes to {other!r} would wait for your transaction there, "
            f"and roll back with it. Nothing was done. Call it outside any transaction"
        )


def _relay_outboxes(tenants: Sequence[str] | None) -> tuple[int, int]:
    """Relay what processes left in the outboxes: (rows relayed, errors)."""
    try:
        relayed = outbox.relay_leftovers(append_event, tenants=tenants)
    except Exception:
        if db.connection_broken():
            raise
        # An outbox not migrated or unreachable: resuming goes on all the same.
        logger.exception("the outboxes could not be relayed; the next pass tries again")
        return 0, 1
    return relayed.relayed, relayed.failed


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
        due_at = dict.fromkeys(claims.due_tenants(start), start)
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
            for tenant in claims.due_tenants(instant):
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
    if not int_between(weight, 1):
        weight = 1  # reported by the system check; never a stuck tenant
    return max(1, int(workflow_settings.BATCH_SIZE)) * weight


def _commits_per_run(row: WorkflowRunPending) -> bool:
    workflow = registry.of_run(row.workflow_name, row.workflow_version, row.definition_fingerprint)
    # A limited workflow's run commits at once: its slot frees at the commit.
    return workflow is not None and (workflow.commit == "per_run" or workflow.limited)


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
    A failing step fails its run alone (its steps' writes roll back to the
    savepoint taken before their first statement), so no other run's steps
    run again. A transaction commits after ``BATCH_SIZE`` runs, once
    ``BATCH_SECONDS`` have passed (a slow step ends its batch), and around
    each run of a workflow that commits alone (``commit="per_run"``, a
    limit). ``passed_over`` (rows whose resume raised) lasts the whole pass,
    across the tenant's turns.

    With ``BATCH_TOGETHER`` (the default; PostgreSQL, no savepoints), a
    batch claims its rows in one statement at its start, and its runs'
    closing events wait to be written in one at its end
    (:mod:`kumiko_workflows.store.batch_writes`). A slow step then holds the
    batch's rows behind it until it returns; the batch ends there and puts
    back the rows it did not reach, and after a run that took longer than
    ``BATCH_SECONDS`` alone the rest of the turn goes row by row. A run that
    commits alone is never resumed holding the batch's rows: the batch ends
    before it, and the rest of the turn goes row by row. If the batch's
    writes fail, it is rolled back and resumed again a row at a time, where
    an error names its run. Row by row, each row is locked only when its
    turn comes (in the statement ending the run before it), so a slow step
    holds no row it has not reached.

    An error in the engine's own writes for a run (a database error, a
    site's projection raising) is rolled back with its savepoint where code
    besides the engine's reacts to run events (see :func:`needs_savepoints`), and
    otherwise with the batch, as a crash would: then the batch's other runs
    are resumed again, and their steps run again.
    """
    batch_size = max(1, int(workflow_settings.BATCH_SIZE))
    claims = 0
    wanted = together = workflow_settings.BATCH_TOGETHER is True
    while True:
        remaining = None if limit is None else limit - report.processed
        if share is not None:
            remaining = share - claims if remaining is None else min(remaining, share - claims)
        if (remaining is not None and remaining <= 0) or should_stop():
            return False
        size = batch_size if remaining is None else min(batch_size, remaining)
        seconds = float(workflow_settings.BATCH_SECONDS)
        cursors.replan_if_grown(every=seconds)
        batch = ResumeReport()
        drained = False
        try:
            with db.pinned(), telemetry.counting_batch(), db.atomic(), fan_in.batched():
                savepoints = needs_savepoints()
                deadline = time.monotonic() + seconds
                ahead = Ahead(size, deadline, should_stop, savepoints, _commits_per_run)
                writes: batch_writes.BatchWrites | None = None
                with ExitStack() as stack:
                    if ahead.on and size > 1 and together:
                        # The batch's rows claimed in one statement, their closing
                        # events written in one at its end.
                        ahead.claim_batch(tenant, now, passed_over, leaving)
                        writes = stack.enter_context(batch_writes.writing_at_the_end())
                    for _ in range(size):
                        # A row claimed ahead is resumed whatever comes: it is held.
                        if should_stop() and ahead.held is None:
                            break
                        if ahead.alone_next():
                            # A run that commits alone is claimed on its own, holding
                            # no other row: the rest of the turn row by row.
                            wanted = False
                            break
                        started = time.monotonic()
                        done = _claim_and_resume(
                            tenant, now, clock(), passed_over, batch, savepoints, leaving, ahead
                        )
                        if done is None:
                            drained = True
                            break
                        claims += 1
                        ended = time.monotonic()
                        if writes is not None and (done or ended - started > seconds):
                            # A run that commits alone (no batch's rows claimed to
                            # resume one), or one longer than BATCH_SECONDS alone (it
                            # held the batch's rows): the rest of the turn row by row.
                            wanted = False
                        if (done or ended > deadline) and ahead.held is None:
                            break  # commit now
                    ahead.put_back()  # rows the batch claimed and did not reach
                    if writes is not None and writes.flush():
                        # Their projections may have made rows due by now (a gate's
                        # next run, a wait of no time): then look again before leaving.
                        drained = drained and not writes.due_by(now)
                # Children that ended in the batch, counted in their fan-ins at once.
                children.count_batch(children.starter())
        except batch_writes.SetWritesFailed:
            # Not one run's to blame: this batch again, a row at a time.
            logger.warning(
                "a batch's writes failed; its runs are resumed again one by one", exc_info=True
            )
            together = False
            continue
        except _Unwound as unwound:
            if count_unwound(unwound.row, unwound.error):
                report.failed += 1
            else:
                report.errors += 1
            continue
        report.add(batch)
        together = wanted
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
    ahead: Ahead | None = None,
) -> bool | None:
    """Claim the next row due at ``due`` and resume it; count its outcome in ``batch``.

    Returns None when no row is due, else whether to commit right after it
    (its workflow commits per run). With ``savepoint``, the claim and the
    resume share a savepoint that an error rolls back; without, an error
    raises :class:`_Unwound` and the batch is rolled back. With ``ahead``,
    the row may have been claimed by the run before, and the next may be
    claimed by this one's last statement (see :class:`~kumiko_workflows.engine.claims_ahead.Ahead`).
    """
    row: WorkflowRunPending | None = None
    try:
        with db.atomic() if savepoint else nullcontext():
            if ahead is None:
                claimed = claims.claim_due(tenant, due, passed_over, leaving)
            else:
                claimed = ahead.next_row(tenant, due, passed_over, leaving)
            if claimed is None:
                return None
            row, trigger = claimed
            request = (
                None
                if ahead is None
                else ahead.request_after(row, tenant, due, passed_over, leaving)
            )
            token = claims.next_claim.set(request)
            writes: batch_writes.BatchWrites | None = waiting_pairs.batch_writes.get()
            if writes is not None and row.suspension_type != SuspensionType.COMPENSATE:
                # Its segment's closing events may wait for the batch's end (a
                # compensation's go on after its first; a run committing alone
                # writes at once).
                writes.resuming = None if _commits_per_run(row) else row
            try:
                outcome, resumed = resume_row(row, trigger, now)
            finally:
                claims.next_claim.reset(token)
                if writes is not None:
                    writes.resuming = None
            if request is not None and ahead is not None:
                ahead.held = request.found
    except batch_writes.SetWritesFailed:
        raise  # the batch's, not this row's (see _drain_tenant)
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
        if count_unwound(row, exc):
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


def needs_savepoints() -> bool:
    """Whether each run's writes need a savepoint: code besides the engine's reacts to them.

    A site's projection or ``post_save`` receiver for run events runs
    inside the run's writes; if it raises, the savepoint takes that run
    back alone. The engine's own projections raise only when the database
    does, which rolls the batch back like a crash.
    """
    return projections.foreign_handlers(et.run_events()) or others_listen_to_post_save()
