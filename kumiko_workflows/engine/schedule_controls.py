"""Pausing, resuming and firing a cron schedule now: events on its schedule stream.

``workflow.schedule.paused`` stops its slots until it is resumed (the slots it
misses meanwhile never fire), ``workflow.schedule.resumed`` starts them
again, and ``workflow.schedule.fired-now`` is the trigger of one run outside
the slots, keyed by the caller's key. Each is appended at the stream's next
version, so it races the scheduler like any other writer.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.engine.cron import (
    _ATTEMPTS,
    Schedule,
    _aware,
    cron_tenants,
)
from kumiko_workflows.engine.run_controls import check_by
from kumiko_workflows.engine.starts import start_run
from kumiko_workflows.exceptions import InvalidArgument, ScheduleError, VersionConflict
from kumiko_workflows.models import WorkflowRun
from kumiko_workflows.store import db
from kumiko_workflows.store.events import joins_callers_transaction
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.cron import (
    CronTrigger,
)
from kumiko_workflows.workflow.definition import run_id_for
from kumiko_workflows.workflow.jsonvalues import text_problem
from kumiko_workflows.workflow.registry import registry

logger = logging.getLogger(__name__)


def _schedule(workflow_name: str, tenant_id: str | None) -> Schedule:
    """The schedule of a registered cron workflow in one of the cron tenants."""
    workflow = registry.get(workflow_name) if isinstance(workflow_name, str) else None
    if workflow is None or not isinstance(workflow.trigger, CronTrigger):
        raise InvalidArgument(f"{workflow_name!r} is not a registered cron workflow")
    tenant = workflow_settings.DEFAULT_TENANT if tenant_id is None else tenant_id
    if tenant not in cron_tenants():
        raise InvalidArgument(
            f"tenant {tenant!r} has no cron schedules (KUMIKO_WORKFLOWS['CRON_TENANTS'])"
        )
    return Schedule.load(workflow, tenant)


def _set_paused(
    workflow_name: str, tenant_id: str | None, paused: bool, by: str, now: datetime | None
) -> bool:
    check_by(by)
    by = by or ""
    moment = _aware(now)
    joins_callers_transaction("pause_schedule" if paused else "resume_schedule")
    for _ in range(_ATTEMPTS):
        schedule = _schedule(workflow_name, tenant_id)
        if schedule.paused == paused:
            return False
        type, at = (
            (et.SCHEDULE_PAUSED, "paused_at") if paused else (et.SCHEDULE_RESUMED, "resumed_at")
        )
        try:
            with db.atomic():
                schedule.append(type, {at: moment.isoformat(), "by": by})
        except VersionConflict:
            continue  # a slot fired meanwhile: look again
        logger.info(
            "workflow=%s tenant=%s cron schedule %s by %s",
            workflow_name,
            schedule.tenant_id,
            "paused" if paused else "resumed",
            by or "-",
        )
        return True
    raise ScheduleError(f"workflow {workflow_name!r}: the schedule kept moving; try again")


def pause_schedule(
    workflow_name: str, tenant_id: str | None = None, *, by: str = "", now: datetime | None = None
) -> bool:
    """Pause a cron workflow's schedule in one tenant: no slot fires until it is resumed.

    Slots that pass while it is paused never fire, whatever its catch-up
    policy. Returns False if it was paused already. ``by`` says who, in the
    event. Raises :class:`InvalidArgument` for a name that is not a
    registered cron workflow, a tenant not among ``CRON_TENANTS`` or a
    ``by`` the event store would refuse (as ``cancel_run`` does).
    """
    return _set_paused(workflow_name, tenant_id, True, by, now)


def resume_schedule(
    workflow_name: str, tenant_id: str | None = None, *, by: str = "", now: datetime | None = None
) -> bool:
    """Resume a paused schedule: slots after ``now`` fire again. False if it was not paused."""
    return _set_paused(workflow_name, tenant_id, False, by, now)


class _AlreadyFired(Exception):
    """The run of a fire-now key exists: take back the event that would fire it again."""


def fire_schedule_now(
    workflow_name: str,
    tenant_id: str | None = None,
    *,
    key: str | None = None,
    by: str = "",
    now: datetime | None = None,
) -> uuid.UUID | None:
    """Start one run of a cron workflow now, outside its slots; return its run id.

    The run's idempotency key is ``"now:" + key`` (default: a new random
    key), so a second call with the same key, a form posted twice, starts
    nothing and returns None. It fires a paused schedule too, and moves
    neither its last slot nor its next. ``ctx.event`` is the
    ``workflow.schedule.fired-now`` event: its ``slot`` is the instant it
    fired, ``by`` who fired it.
    """
    check_by(by)
    by = by or ""
    moment = _aware(now)
    if key is not None and (
        not isinstance(key, str) or not 0 < len(key) <= 100 or text_problem(key, controls=False)
    ):
        raise InvalidArgument(
            f"fire_schedule_now key must be 1-100 characters of text, got {key!r}"
        )
    joins_callers_transaction("fire_schedule_now")
    run_key = f"now:{uuid.uuid4().hex if key is None else key}"
    schedule = _schedule(workflow_name, tenant_id)
    run_id = run_id_for(workflow_name, run_key, schedule.tenant_id)
    for _ in range(_ATTEMPTS):
        if WorkflowRun.objects.filter(tenant_id=schedule.tenant_id, run_id=run_id).exists():
            return None
        try:
            with db.atomic():
                event = schedule.append(
                    et.SCHEDULE_FIRED_NOW,
                    {
                        "slot": moment.isoformat(),
                        "slot_local": moment.astimezone(schedule.trigger.zone).isoformat(),
                        "fired_at": moment.isoformat(),
                        "idempotency_key": run_key,
                        "by": by,
                    },
                )
                if start_run(schedule.workflow, event, now=moment) is None:
                    raise _AlreadyFired
        except _AlreadyFired:
            return None
        except VersionConflict:
            schedule = _schedule(workflow_name, schedule.tenant_id)
            continue
        logger.info(
            "workflow=%s tenant=%s fired now by %s: run=%s",
            workflow_name,
            schedule.tenant_id,
            by or "-",
            run_id,
        )
        return run_id
    raise ScheduleError(f"workflow {workflow_name!r}: the schedule kept moving; try again")
