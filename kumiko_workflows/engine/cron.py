"""Firing cron-triggered workflows: one run per slot, however many schedulers run.

Each (tenant, cron workflow) has a *schedule stream* (aggregate type
``workflow-schedule``, a uuid5 id). The first pass that sees a schedule
appends ``workflow.schedule.started``; every fired slot appends
``workflow.schedule.slot-fired`` at the stream's next version and, in the same
transaction, starts the run through the ordinary trigger path with that event
as ``ctx.event``. Two schedulers firing one slot append the same version: one
wins, the other gets :class:`VersionConflict` and starts nothing.

Someone may pause a schedule (``workflow.schedule.paused``: no slot fires
until it is resumed, and the slots it missed never do), resume it
(``workflow.schedule.resumed``), or fire it now, outside its slots
(``workflow.schedule.fired-now``, the trigger of one run keyed by the
caller's key). Each is an event on the schedule stream at its next version,
so it races the scheduler like any other writer
(:mod:`kumiko_workflows.engine.schedule_controls`).

Slots are wall-clock times in the schedule's time zone; their arithmetic
(the time line, gaps and folds) is :mod:`kumiko_workflows.workflow.cron`'s.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, InterfaceError, OperationalError

from kumiko_workflows import telemetry
from kumiko_workflows.conf import import_callable, workflow_settings
from kumiko_workflows.engine.starts import start_run
from kumiko_workflows.exceptions import ScheduleError, VersionConflict
from kumiko_workflows.models import Event
from kumiko_workflows.store import db
from kumiko_workflows.store.event_checks import name_problem
from kumiko_workflows.store.events import append_event
from kumiko_workflows.store.stream_ids import engine_stream
from kumiko_workflows.workflow import clock
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.cron import (
    CronTrigger,
    _wall,
    _walls_before,
    cron_problem,
    next_slot,
    slots_between,
)
from kumiko_workflows.workflow.definition import Workflow, run_id_for
from kumiko_workflows.workflow.registry import registry

logger = logging.getLogger(__name__)

_SCHEDULE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://kumiko-workflows/workflow-schedule")
_CREATED_BY = "kumiko_workflows.cron"
#: The events that say what a schedule is doing (a fire-now changes none of it).
_STATE_EVENTS = (
    et.SCHEDULE_STARTED,
    et.SCHEDULE_SLOT_FIRED,
    et.SCHEDULE_PAUSED,
    et.SCHEDULE_RESUMED,
)
#: How often a pause, resume or fire-now loads the schedule again after
#: losing a race to another writer of its stream (a scheduler firing a slot).
_ATTEMPTS = 3


# --- now ----------------------------------------------------------------------


def _aware(now: datetime | None) -> datetime:
    if now is None:
        return clock.now()
    if not isinstance(now, datetime):
        raise TypeError(f"now must be an aware datetime, got {now!r}")
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be an aware datetime, got the naive {now.isoformat()}")
    return now.astimezone(UTC)


# --- schedules ------------------------------------------------------------------


def schedule_id(workflow_name: str, tenant_id: str) -> uuid.UUID:
    """The id of the schedule stream of one cron workflow in one tenant (uuid5)."""
    return uuid.uuid5(_SCHEDULE_NAMESPACE, f"{tenant_id}\x1f{workflow_name}")


def cron_tenants() -> list[str]:
    """The tenants cron workflows fire for (``KUMIKO_WORKFLOWS['CRON_TENANTS']``)."""
    source = import_callable(workflow_settings.CRON_TENANTS, "CRON_TENANTS")
    if source is None:
        return [workflow_settings.DEFAULT_TENANT]
    tenants = source()
    if isinstance(tenants, str) or not hasattr(tenants, "__iter__"):
        raise ImproperlyConfigured(
            f"KUMIKO_WORKFLOWS['CRON_TENANTS'] must return a list of tenant ids, got {tenants!r}"
        )

    result: list[str] = []
    for tenant in tenants:
        problem = name_problem(tenant, "tenant_id")
        if problem:
            raise ImproperlyConfigured(
                "KUMIKO_WORKFLOWS['CRON_TENANTS'] returned an invalid tenant id "
                f"{tenant!r}: the tenant id {problem}"
            )
        if tenant not in result:
            result.append(tenant)
    return result


def cron_workflows() -> list[Workflow]:
    return [w for w in registry.all() if isinstance(w.trigger, CronTrigger)]


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


@dataclass
class Schedule:
    """What a schedule stream says: its version, the last slot (or start), whether paused."""

    workflow: Workflow
    tenant_id: str
    version: int = 0
    started_at: datetime | None = None
    last_slot: datetime | None = None
    last_run_id: uuid.UUID | None = None
    paused: bool = False
    paused_at: datetime | None = None
    paused_by: str = ""
    resumed_at: datetime | None = None

    @property
    def stream_id(self) -> uuid.UUID:
        return schedule_id(self.workflow.name, self.tenant_id)

    @property
    def trigger(self) -> CronTrigger:
        trigger = self.workflow.trigger
        assert isinstance(trigger, CronTrigger)
        return trigger

    @property
    def baseline(self) -> datetime | None:
        """Slots at or before this instant are never fired."""
        marks = [mark for mark in (self.last_slot, self.started_at, self.resumed_at) if mark]
        return max(marks) if marks else None

    @classmethod
    def load(cls, workflow: Workflow, tenant_id: str) -> Schedule:
        """Read the stream from its end: the latest event, and the latest that says its state.

        Slots fire far more often than anything else happens to a schedule,
        so each backward read stops after an event or two.
        """
        schedule = cls(workflow, tenant_id)
        events = Event.objects.filter(
            tenant_id=tenant_id, aggregate_id=schedule.stream_id
        ).order_by("-version")
        latest = events.first()
        if latest is None:
            return schedule
        schedule.version = latest.version
        state = latest if latest.type in _STATE_EVENTS else None
        if state is None:
            state = events.filter(type__in=_STATE_EVENTS).first()
        if state is None:  # only fired now, never started
            return schedule
        if state.type == et.SCHEDULE_STARTED:
            schedule.started_at = _instant(state.payload["started_at"])
            return schedule
        if state.type == et.SCHEDULE_PAUSED:
            schedule.paused = True
            schedule.paused_at = _instant(state.payload["paused_at"])
            schedule.paused_by = state.payload.get("by") or ""
        elif state.type == et.SCHEDULE_RESUMED:
            schedule.resumed_at = _instant(state.payload["resumed_at"])
        fired = state if state.type == et.SCHEDULE_SLOT_FIRED else None
        if fired is None:
            fired = events.filter(type=et.SCHEDULE_SLOT_FIRED).first()
        if fired is not None:
            schedule.last_slot = _instant(fired.payload["slot"])
            schedule.last_run_id = run_id_for(workflow.name, fired.payload["slot"], tenant_id)
        started = events.filter(type=et.SCHEDULE_STARTED).order_by("version").first()
        schedule.started_at = _instant(started.payload["started_at"]) if started else None
        return schedule

    def append(self, type: str, payload: dict[str, Any]) -> Event:
        event = _append(self, type, payload)
        self.version = event.version
        return event


def _append(schedule: Schedule, type: str, payload: dict[str, Any]) -> Event:

    trigger = schedule.trigger
    with engine_stream():
        return append_event(
            schedule.stream_id,
            et.SCHEDULE_AGGREGATE_TYPE,
            type,
            {
                "workflow_name": schedule.workflow.name,
                "expression": trigger.expression,
                "timezone": trigger.timezone,
                "catch_up": trigger.catch_up,
                **payload,
            },
            tenant_id=schedule.tenant_id,
            expected_version=schedule.version,
            created_by=_CREATED_BY,
        )


def due_slots(schedule: Schedule, now: datetime) -> list[datetime]:
    """The slots a pass at ``now`` fires, oldest first, after the catch-up policy.

    A slot at most ``CRON_GRACE`` seconds old is on time and always fires. An
    older one was missed (no scheduler ran then): ``skip`` fires none,
    ``latest`` the most recent one, ``all`` each of them, at most
    ``CRON_CATCH_UP_LIMIT`` (the most recent; older ones are dropped).
    """
    baseline = schedule.baseline
    if baseline is None or baseline >= now:
        return []
    trigger = schedule.trigger
    cut = now - timedelta(seconds=float(workflow_settings.CRON_GRACE))
    keep = {"skip": 0, "latest": 1, "all": int(workflow_settings.CRON_CATCH_UP_LIMIT)}
    wanted = keep[trigger.catch_up]
    start_wall = None
    if cut > baseline:
        # Only the last `wanted` missed slots can fire: start there, so a long
        # outage of a frequent schedule costs no more than the slots kept.
        start_wall = _walls_before(trigger, _wall(cut, trigger), wanted + 1)
    missed: list[datetime] = []
    on_time: list[datetime] = []
    dropped = start_wall is not None and start_wall > _wall(baseline, trigger)
    for slot in slots_between(trigger, baseline, now, start_wall=start_wall):
        if slot >= cut:
            on_time.append(slot)
            continue
        missed.append(slot)
        if len(missed) > wanted:
            missed.pop(0)
            dropped = True
    if dropped:
        # Expected for skip and latest; for all it means the cap was reached.
        logger.log(
            logging.WARNING if trigger.catch_up == "all" else logging.INFO,
            "workflow=%s tenant=%s catch_up=%s: slots missed since %s are not fired, "
            "but for the latest %d",
            schedule.workflow.name,
            schedule.tenant_id,
            trigger.catch_up,
            baseline.isoformat(),
            len(missed),
        )
    return missed + on_time


def fire_schedule(schedule: Schedule, now: datetime) -> int:
    """Start or fire one schedule; return how many runs it started."""

    if schedule.paused:
        # A scheduler that loaded it before the pause appends at a version the
        # pause took: VersionConflict below, and nothing fires either.
        logger.debug(
            "workflow=%s tenant=%s paused: no slot fires",
            schedule.workflow.name,
            schedule.tenant_id,
        )
        return 0
    if schedule.baseline is None:
        try:
            with db.atomic():
                schedule.append(et.SCHEDULE_STARTED, {"started_at": now.isoformat()})
        except VersionConflict:
            pass  # another scheduler started it first: fine, it has the same start
        else:
            logger.info(
                "workflow=%s tenant=%s cron schedule started at %s",
                schedule.workflow.name,
                schedule.tenant_id,
                now.isoformat(),
            )
        return 0
    started = 0
    zone = schedule.trigger.zone
    for slot in due_slots(schedule, now):
        slot_iso = slot.isoformat()
        with db.atomic():
            try:
                event = schedule.append(
                    et.SCHEDULE_SLOT_FIRED,
                    {
                        "slot": slot_iso,
                        "slot_local": slot.astimezone(zone).isoformat(),
                        "fired_at": now.isoformat(),
                    },
                )
            except VersionConflict:
                # Another scheduler fired this slot (and will fire the rest).
                telemetry.conflict("cron")
                logger.debug(
                    "workflow=%s tenant=%s slot=%s fired by another scheduler",
                    schedule.workflow.name,
                    schedule.tenant_id,
                    slot_iso,
                )
                return started
            run_id = start_run(schedule.workflow, event, now=now)
            telemetry.slot_fired(schedule.workflow.name)
        if run_id is not None:
            started += 1
            schedule.last_slot = slot
            logger.info(
                "workflow=%s tenant=%s slot=%s run=%s started",
                schedule.workflow.name,
                schedule.tenant_id,
                slot_iso,
                run_id,
            )
    return started


def schedule_problem(workflow: Workflow, now: datetime) -> str | None:
    """Why a cron workflow's trigger cannot fire once per slot, or None.

    ``on_cron`` refuses such a trigger, but one built without it (by hand, or
    by a definition older than the check) still reaches the scheduler.
    """
    trigger = workflow.trigger
    assert isinstance(trigger, CronTrigger)
    return cron_problem(trigger.expression, trigger.timezone, trigger.catch_up, now=now)


def fire_due_schedules(now: datetime | None = None) -> int:
    """Fire every due slot of every cron workflow, for each cron tenant.

    ``now`` (an aware datetime) defaults to the current time. Returns how
    many runs were started. The first pass that sees a schedule only records
    its start: slots before it never fire. A schedule whose trigger cannot
    fire once per slot (:func:`schedule_problem`) is not fired at all; it is
    logged and, after the others fired, reported in the :class:`ScheduleError`.
    """
    moment = _aware(now)
    workflows = cron_workflows()
    if not workflows:
        return 0
    # Checked before firing: a random field would fire at a new time each
    # pass, and an expression that never fires would raise on each one.
    problems = {workflow.name: schedule_problem(workflow, moment) for workflow in workflows}
    started = 0
    failures: list[Exception] = []
    for tenant in cron_tenants():
        for workflow in workflows:
            problem = problems[workflow.name]
            if problem:
                logger.error(
                    "workflow=%s tenant=%s schedule not fired: %s", workflow.name, tenant, problem
                )
                failures.append(ScheduleError(f"workflow {workflow.name!r}: {problem}"))
                continue
            try:
                started += fire_schedule(Schedule.load(workflow, tenant), moment)
            except (InterfaceError, OperationalError):
                raise  # the database is gone: no other schedule can fire either
            except Exception as exc:
                # One broken schedule must not keep the others from firing.
                logger.exception(
                    "workflow=%s tenant=%s schedule could not fire", workflow.name, tenant
                )
                failures.append(exc)
    if failures:
        raise ScheduleError(
            f"{len(failures)} cron schedule(s) could not fire (see the log); "
            f"{started} run(s) started"
        ) from failures[0]
    return started


def schedule_overview(now: datetime | None = None) -> list[dict[str, Any]]:
    """Per cron workflow and tenant: its expression, last fired slot and next slot.

    ``next_slot`` is the first slot after ``now`` (and after the last fired
    one), None while ``paused`` (since ``paused_at``, by ``paused_by``);
    ``started_at`` is None until a scheduler pass has seen the schedule.
    ``problem`` says why a schedule cannot fire (``next_slot`` is then None):
    one broken schedule is shown, never raised, so the others still are.
    """
    moment = _aware(now)
    workflows = cron_workflows()
    problems = {workflow.name: schedule_problem(workflow, moment) for workflow in workflows}
    return [
        _overview_row(workflow, tenant, moment, problems[workflow.name])
        for tenant in cron_tenants()
        for workflow in workflows
    ]


def _overview_row(
    workflow: Workflow, tenant: str, moment: datetime, problem: str | None
) -> dict[str, Any]:
    trigger = workflow.trigger
    assert isinstance(trigger, CronTrigger)
    row: dict[str, Any] = {
        "workflow_name": workflow.name,
        "tenant_id": tenant,
        "expression": trigger.expression,
        "timezone": trigger.timezone,
        "catch_up": trigger.catch_up,
        "started_at": None,
        "last_slot": None,
        "last_run_id": None,
        "next_slot": None,
        "problem": problem,
        "paused": False,
        "paused_at": None,
        "paused_by": "",
    }
    try:
        schedule = Schedule.load(workflow, tenant)
        row["started_at"] = schedule.started_at
        row["last_slot"] = schedule.last_slot
        row["last_run_id"] = schedule.last_run_id
        row["paused"] = schedule.paused
        row["paused_at"] = schedule.paused_at
        row["paused_by"] = schedule.paused_by
        if problem is None and not schedule.paused:
            row["next_slot"] = next_slot(trigger, max(moment, schedule.baseline or moment))
    except DatabaseError:
        raise  # the transaction may be unusable: no other row can be read either
    except Exception as exc:
        # A tampered schedule stream, or croniter failing on what it accepted.
        logger.exception("workflow=%s tenant=%s schedule cannot be shown", workflow.name, tenant)
        row["problem"] = f"{type(exc).__name__}: {exc}"
    return row
