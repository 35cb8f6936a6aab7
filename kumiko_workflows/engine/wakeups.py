"""Waking runs that wait for an event: found by key, never lost to a lock.

A run suspended on ``wait_for_event`` is stored under the equalities its
match requires (:class:`~kumiko_workflows.models.WorkflowWaitKey`). An
awaited event looks up the keys its payload offers and evaluates the full
match only on those candidates (plus the few waits whose match requires no
equality), so its cost does not grow with the number of waiting runs.

Where writers overlap (PostgreSQL), neither side can see the other's rows
before they commit. So each side leaves a :class:`~kumiko_workflows.models.WakeCheck`
in its own transaction: the event ("which waiting runs does it wake?") and
the suspension ("which committed event ends this wait?"). A check is decided
after its commit, by the appending process at once or by any worker pass,
and deleted in the same transaction as the wake-up it caused. Whichever side
commits second sees the other. A candidate row locked by someone else is
never skipped silently: the check stays and is decided again later.

The event is also decided inline, in its own transaction, so the caller
sees its wake-ups at once; where one transaction writes at a time (SQLite)
that decision is final and no check is left.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone

from kumiko_workflows.exceptions import InvalidEvent, InvalidMatchExpression, VersionConflict
from kumiko_workflows.models import (
    Event,
    SuspensionType,
    WakeCheck,
    WorkflowChildGroup,
    WorkflowRunPending,
)
from kumiko_workflows.store import db, statements, wake_checks
from kumiko_workflows.store.distribution import distributed
from kumiko_workflows.store.streams import INVALID_MATCH, Failure, RunStream, fail_run
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import matching
from kumiko_workflows.workflow.arguments import is_int

logger = logging.getLogger(__name__)

#: A check whose decision raised this many times is dropped (and logged):
#: nothing is retried for ever. The wait's own timeout still looks back.
MAX_CHECK_ATTEMPTS = 5

_ENGINE_AGGREGATE_TYPES = (
    et.RUN_AGGREGATE_TYPE,
    et.SCHEDULE_AGGREGATE_TYPE,
    et.GATE_AGGREGATE_TYPE,
    et.CALL_AGGREGATE_TYPE,
)


# --- which event ends which wait ------------------------------------------------


def taken_by_run(awaited: Mapping[str, Any]) -> set[int]:
    """Ids of the events earlier waits of a run already took: none counts twice."""
    return {i for i in (awaited or {}).values() if is_int(i)}


def satisfies(row: WorkflowRunPending, event: Event) -> bool:
    """Whether ``event`` can end the row's wait: in time, new to the run, and matching.

    Only an event appended after the run's trigger counts (ids are the append
    order), whenever it commits; and none an earlier wait of the run took.
    """
    if row.timeout_at is not None and event.created_at > row.timeout_at:
        return False  # too late: the wait timed out first, however late the worker is
    if event.id <= (row.trigger_event_id or 0) or event.id in taken_by_run(row.awaited_refs()):
        return False
    expression = None if row.match_expr is None else matching.validate(row.match_expr)
    return matching.matches(expression, event.payload)


def _containing(path: list[Any], value: Any) -> Any:
    """The JSON a payload contains when ``path`` leads to ``value`` (a list for an index)."""
    for key in reversed(path):
        value = [value] if isinstance(key, int) else {key: value}
    return value


def look_back(
    tenant_id: str,
    event_type: str,
    match: dict[str, Any] | None,
    after_id: int,
    taken: set[int],
    until: datetime | None = None,
) -> Event | None:
    """The earliest matching event of ``event_type`` in the tenant after ``after_id``.

    ``taken`` are the events earlier waits of the run took: skipped.
    ``until`` (a wait's timeout) excludes events appended after it: an event
    that came too late does not count, however late the worker runs. On
    PostgreSQL the equalities the match requires narrow the candidates
    through the payload's GIN index; every candidate is then evaluated in
    full, in id order, with no cap.
    """
    expression = None if match is None else matching.validate(match)
    keys = matching.required_keys(expression)
    if keys is not None and not keys:
        return None  # the match requires one of no values: nothing can match
    candidates: Iterable[Event]
    if keys is not None and db.has_payload_containment():
        candidates = statements.keyed_events(
            tenant_id,
            event_type,
            after_id,
            [_containing(json.loads(path), json.loads(value)) for path, value in sorted(keys)],
            until=until,
            taken=sorted(taken),
            engine_types=_ENGINE_AGGREGATE_TYPES,
        )
    else:
        found = Event.objects.of_type_after(tenant_id, event_type, after_id)
        if until is not None:
            found = found.filter(created_at__lte=until)
        if taken:
            found = found.exclude(id__in=taken)
        candidates = found.only("id", "payload", "created_at").iterator(chunk_size=200)
    for event in candidates:
        if matching.matches(expression, event.payload):
            return event
    return None


def event_ending(row: WorkflowRunPending) -> Event | None:
    """The committed event that ends the pending row's wait, by :func:`look_back`."""
    return look_back(
        row.tenant_id,
        row.wait_event_type,
        row.match_expr,
        row.trigger_event_id or 0,
        taken_by_run(row.awaited_refs()),
        until=row.timeout_at,
    )


def near_miss(row: WorkflowRunPending) -> tuple[Event, list[str]] | None:
    """An arrived event that would end the row's wait but for a value's type ("3" is not 3).

    For the admin's explanation, where a mistyped match otherwise waits
    without a word: one :func:`look_back` with :func:`matching.loosened`,
    run only if the match has an equality whose value has another spelling.
    Returns the event and the values that differ, in words.
    """
    if row.match_expr is None or row.awaited_event_id is not None:
        return None
    try:
        expression = matching.validate(row.match_expr)
        loose = matching.loosened(expression)
        if loose is None:
            return None
        event = look_back(
            row.tenant_id,
            row.wait_event_type,
            loose,
            row.trigger_event_id or 0,
            taken_by_run(row.awaited_refs()),
            until=row.timeout_at,
        )
    except InvalidMatchExpression:
        return None  # a tampered row: the resume fails it with invalid_match
    if event is None or matching.matches(expression, event.payload):
        return None
    return event, matching.type_mismatches(expression, event.payload)


def wake_with(row: WorkflowRunPending, event: Event) -> bool:
    """Append ``workflow.wake-requested`` naming ``event`` as the row's awaited event.

    False if the run moved on meanwhile (resumed, cancelled): its stream
    version decides, as for every write to a run.
    """
    return _wake(row, event.id)


def _wake(row: WorkflowRunPending, event_id: int) -> bool:
    try:
        with db.atomic():
            RunStream.of_pending(row).append(
                et.WAKE_REQUESTED,
                {
                    "workflow_name": row.workflow_name,
                    "step": row.step,
                    "by": "kumiko_workflows",
                    "awaited_event_id": event_id,
                },
            )
    except VersionConflict:
        return False
    except InvalidEvent:
        # A tampered pending row (a version or ids the stream refuses): the
        # run cannot be woken this way; its timeout still resumes it.
        logger.exception("run=%s step=%s could not be woken", row.run_id, row.step)
        return False
    return True


def _fail_invalid_match(row: WorkflowRunPending, exc: Exception) -> None:
    logger.error(
        "run=%s step=%s has a match expression that cannot be evaluated: %s",
        row.run_id,
        row.step,
        exc,
    )
    try:
        with db.atomic():
            fail_run(
                RunStream.of_pending(row),
                Failure(
                    INVALID_MATCH,
                    row.step,
                    f"step {row.step}: its match expression cannot be evaluated",
                    error_class=type(exc).__name__,
                    detail=str(exc),
                ),
                state=row.state,
                retry_from=row.step,
            )
    except Exception:
        logger.exception("run=%s could not be marked failed", row.run_id)


def _candidates(event: Event, paths: list[str] | None = None, *, scanned: bool = True) -> list[Any]:
    """Querysets of the rows ``event`` may wake: stored under a key it offers, or scanned.

    ``paths`` are the payload paths the tenant's waits for the type use,
    when known already (else they are looked up); ``scanned`` False: no
    scanned wait waits for the type, so that query is not made.
    """
    if paths is None:
        paths = statements.wait_paths(event.tenant_id, event.type)
    keys = matching.offered_keys(event.payload, paths)
    found = WorkflowRunPending.objects.candidates(event.tenant_id, event.type, keys)
    return found if scanned else found[1:]  # the first is the scanned waits'


def _lock(rows: Any) -> tuple[list[WorkflowRunPending], bool]:
    """Lock what is free of ``rows``; also whether none was held by someone else.

    Where writers overlap, the rows are counted, then locked skipping those
    another transaction holds: fewer locked than counted means a candidate
    was held, and the decision must be taken again later.
    """
    if not db.overlapping_writers():
        return list(rows), True
    expected = rows.count()
    if not expected:
        return [], True
    locked = list(rows.select_for_update(skip_locked=True))
    return locked, len(locked) >= expected


def wake_for_event(event: Event, paths: list[str] | None = None, *, scanned: bool = True) -> bool:
    """Wake every waiting run ``event`` ends; False if a candidate was locked (decide again).

    ``paths`` and ``scanned``: what :func:`_candidates` takes.
    """
    complete = True
    for rows in _candidates(event, paths, scanned=scanned):
        locked, free = _lock(rows)
        complete = complete and free
        for row in locked:
            try:
                matched = satisfies(row, event)
            except Exception as exc:
                _fail_invalid_match(row, exc)
                continue
            if matched:
                wake_with(row, event)
    return complete


def wake_by_look_back(tenant_id: str, run_id: Any) -> bool:
    """Wake the run's wait if a committed event ends it; False if its row was locked."""
    rows = WorkflowRunPending.objects.filter(
        tenant_id=tenant_id, run_id=run_id, suspension_type=SuspensionType.EVENT
    ).filter(awaited_event_id__isnull=True)
    locked, complete = _lock(rows)
    for row in locked:
        try:
            found = event_ending(row)
        except Exception as exc:
            _fail_invalid_match(row, exc)
            continue
        if found is not None:
            wake_with(row, found)
    return complete


def wake_when_children_done(tenant_id: str, run_id: Any) -> bool:
    """Wake the run's wait for child runs if they have all finished; False if its row was locked.

    The wake names the terminal event of the child that finished last.
    """
    rows = WorkflowRunPending.objects.filter(
        tenant_id=tenant_id, run_id=run_id, suspension_type=SuspensionType.CHILDREN
    ).filter(awaited_event_id__isnull=True)
    locked, complete = _lock(rows)
    for row in locked:
        group = WorkflowChildGroup.objects.filter(
            tenant_id=tenant_id, parent_run_id=run_id, group=row.awaits_key
        ).first()
        if group is not None and group.done and not group.closed and group.last_event_id:
            _wake(row, group.last_event_id)
    return complete


def children_finished(tenant_id: str, run_id: Any) -> None:
    """A run's children have all finished: wake it now, and once more after commit.

    Now, if its wait is committed and free. Where writers overlap, the
    parent may be suspending (or re-suspending after a resume) in a
    transaction this one cannot see: the check decided after commit sees
    it, as the parent's own check sees this child's end.
    """
    if db.overlapping_writers():
        _leave_check(tenant_id, run_id=run_id)
    wake_when_children_done(tenant_id, run_id)


# --- checks, decided after commit ----------------------------------------------


def _leave_check(tenant_id: str, **subject: Any) -> None:
    check = WakeCheck.objects.create(tenant_id=tenant_id, **subject)
    db.on_commit(lambda: decide_checks([(tenant_id, check.pk)]), robust=True)


def project_wakeup(event: Event, replaying: bool) -> None:
    """An awaited event was appended: wake the runs it ends, now and after commit.

    Now, in the appending transaction, so the event and its wake-ups commit
    together and the caller sees them at once, on every database. Where
    writers overlap, once more after commit: a run suspending in a
    concurrent transaction, or a row someone else held, is invisible now.
    There the check is left with one statement that also says what may
    wait for the event (:func:`wake_checks.record_event_check`), and the rest is
    :func:`after_event_check`. (When this is the event type's only
    projection, that statement rides in the event's insert instead.) On
    distributed tables (Citus), whose planner refuses that statement's
    recursive scan, the check is a plain insert of one shard and the wake-up
    scans every wait of the event's type in the tenant.
    """
    if distributed():
        _leave_check(event.tenant_id, event_id=event.id)
    elif db.overlapping_writers():
        after_event_check(
            event,
            wake_checks.record_event_check(event.tenant_id, event.id, event.type, timezone.now()),
        )
        return
    _wake_now(event, None, scanned=True)


def after_event_check(event: Event, found: tuple[int, list[str], bool]) -> None:
    """The awaited event's check is left: wake what waits now; decide it after commit.

    ``found`` is (check id, wait paths, scanned waits) as the statement that
    left the check read them. Nothing waits: nothing more now. The check
    joins the transaction's others, decided together after commit
    (:func:`_decide_event_checks`; in autocommit, at once, after the wake-up).
    """
    check, paths, scanned = found
    if paths or scanned:
        _wake_now(event, paths, scanned=scanned)
    db.gather_on_commit(
        "kumiko_event_checks", (check, event.tenant_id, event.type), _decide_event_checks
    )


def _wake_now(event: Event, paths: list[str] | None, *, scanned: bool) -> None:
    try:
        with db.atomic():
            wake_for_event(event, paths, scanned=scanned)
    except Exception:
        # Never the domain write's failure (invariant 3): on PostgreSQL the
        # check decides again after commit; on SQLite the next pass's timeout
        # look-back is what is left, and the log says so.
        logger.exception("event=%s type=%s: waking its runs failed", event.id, event.type)


def _decide_event_checks(checks: list[tuple[int, str, str]]) -> None:
    """Decide a committed transaction's event checks: the quiet ones in one statement.

    A check whose event type nothing of its tenant waits for now is
    deleted with the others like it (:func:`wake_checks.settle_quiet_checks`); the
    rest are decided one by one (:func:`decide_checks`). Never raises:
    what is not decided here is left for a worker pass.
    """
    try:
        settled = wake_checks.settle_quiet_checks(checks)
    except Exception:
        logger.exception("wake-up checks %s could not be settled", [c for c, *_ in checks])
        settled = set()
    rest = [(tenant, check) for check, tenant, _type in checks if check not in settled]
    if rest:
        decide_checks(rest)


def suspended_on_event(tenant_id: str, run_id: Any) -> None:
    """A run is suspending on ``wait_for_event``: look back again once that commits.

    The look-back inside the suspending transaction cannot see an event
    committed after it began; the event's own check cannot see this run
    until it commits. This check, decided after the commit, closes the gap.
    """
    if db.overlapping_writers():
        _leave_check(tenant_id, run_id=run_id)


def _decide(check: WakeCheck) -> bool:
    if check.event_id is None:
        events = wake_by_look_back(check.tenant_id, check.run_id)
        return wake_when_children_done(check.tenant_id, check.run_id) and events
    event = Event.objects.filter(tenant_id=check.tenant_id, pk=check.event_id).first()
    return True if event is None else wake_for_event(event)


def decide_checks(ids: Iterable[tuple[str, int]]) -> int:
    """Decide the given checks (tenant, id), each in its own transaction; return how many settled.

    Each is found, locked and deleted by its tenant and id: a statement of
    one shard on Citus.

    A check another process holds is skipped (that process decides it); one
    whose candidates were locked stays for a later pass. Never raises: a
    decision that fails is logged and retried later, at most
    ``MAX_CHECK_ATTEMPTS`` times.
    """
    settled = 0
    for tenant_id, pk in ids:
        this = WakeCheck.objects.filter(tenant_id=tenant_id, pk=pk)
        try:
            with db.atomic():
                check = this.select_for_update(skip_locked=True).first()
                if check is None:
                    continue
                if _decide(check):
                    this.delete()
                    settled += 1
        except Exception:
            logger.exception("wake-up check %s could not be decided", pk)
            _count_attempt(this, pk)
    return settled


def _count_attempt(this: Any, pk: int) -> None:
    """Count a failed decision of the check ``this`` (a queryset of it); drop it at the limit."""
    try:
        with db.atomic():
            check = this.select_for_update().first()
            if check is None:
                return
            check.attempts += 1
            if check.attempts < MAX_CHECK_ATTEMPTS:
                this.update(attempts=check.attempts)
                return
            logger.error(
                "tenant=%s event=%s run=%s wake-up check dropped after %d failed attempts; "
                "the wait's timeout still looks back for its event",
                check.tenant_id,
                check.event_id,
                check.run_id,
                check.attempts,
            )
            this.delete()
    except Exception:
        logger.exception("wake-up check %s: could not count the failed attempt", pk)


def decide_waiting_checks(tenant_id: str | None = None, limit: int = 1000) -> int:
    """Decide the checks left behind (a crash after commit, a locked candidate), oldest first."""
    checks = WakeCheck.objects.order_by("id")
    if tenant_id is not None:
        checks = checks.filter(tenant_id=tenant_id)
    return decide_checks(list(checks.values_list("tenant_id", "pk")[:limit]))
