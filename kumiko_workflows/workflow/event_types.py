"""Names of the events a workflow run writes to its own stream.

Each run is one stream of aggregate type ``workflow-run``; these constants are
the ``type`` of its events. Payload keys are snake_case and never copy the
payload of a trigger or awaited event: they reference events by id.

The suspending events' types are their suspension records'
(:mod:`kumiko_workflows.workflow.suspensions`): a record added there is a
run event (:func:`is_run_event`) without being listed here.
"""

from kumiko_workflows.workflow import suspensions as _suspensions

RUN_AGGREGATE_TYPE = "workflow-run"
SCHEDULE_AGGREGATE_TYPE = "workflow-schedule"

RUN_STARTED = "workflow.run-started"
WAITING = _suspensions.WAIT.event_type
WAITING_FOR_EVENT = _suspensions.EVENT.event_type
RETRY_SCHEDULED = _suspensions.RETRY.event_type
RESUMED = "workflow.step.resumed"
RUN_COMPLETED = "workflow.run-completed"
RUN_FAILED = "workflow.run-failed"
RUN_CANCELLED = "workflow.run-cancelled"
#: Someone asked a waiting run to wake now (``wake_run`` or the admin).
WAKE_REQUESTED = "workflow.wake-requested"
#: Someone asked a failed run to run again from where its failed attempt began.
RERUN_REQUESTED = _suspensions.RERUN.event_type
#: A run of a workflow defined with ``start="worker"`` waits for a worker to run its steps.
RUN_QUEUED = _suspensions.QUEUED.event_type
#: Someone moved a suspended run to another version of its workflow
#: (``migrate_workflow_runs``): it resumes there, at the step the new version maps.
RUN_MIGRATED = "workflow.run-migrated"
#: A cron schedule was first seen by a scheduler pass; slots before it never fire.
SCHEDULE_STARTED = "workflow.schedule.started"
#: A cron slot was fired; cron runs use this event as their trigger.
SCHEDULE_SLOT_FIRED = "workflow.schedule.slot-fired"
#: Someone paused a cron schedule: its slots do not fire, then or later.
SCHEDULE_PAUSED = "workflow.schedule.paused"
#: Someone resumed a paused schedule: the slots after this instant fire again.
SCHEDULE_RESUMED = "workflow.schedule.resumed"
#: Someone fired a schedule outside its slots; that run uses this event as its trigger.
SCHEDULE_FIRED_NOW = "workflow.schedule.fired-now"

SCHEDULE_EVENTS = (
    SCHEDULE_STARTED,
    SCHEDULE_SLOT_FIRED,
    SCHEDULE_PAUSED,
    SCHEDULE_RESUMED,
    SCHEDULE_FIRED_NOW,
)
#: The package's suspending events, one per suspension record.
SUSPENSIONS = tuple(record.event_type for record in _suspensions.RECORDS)
TERMINAL = (RUN_COMPLETED, RUN_FAILED, RUN_CANCELLED)
#: The run events that suspend no run.
_OTHER_RUN_EVENTS = (
    RUN_STARTED,
    RESUMED,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_CANCELLED,
    WAKE_REQUESTED,
    RUN_MIGRATED,
)
RUN_EVENTS = (*_OTHER_RUN_EVENTS, *SUSPENSIONS)


def is_run_event(type: str) -> bool:
    """Whether ``type`` is an event of a run's stream.

    One of :data:`RUN_EVENTS`, or the event of a suspension record added
    since (:func:`kumiko_workflows.workflow.suspensions.register`).
    """
    return type in _OTHER_RUN_EVENTS or _suspensions.for_event(type) is not None


def run_events() -> tuple[str, ...]:
    """Every run event type known now: :data:`RUN_EVENTS` and added records' events."""
    return (*_OTHER_RUN_EVENTS, *(record.event_type for record in _suspensions.records()))


def is_suspension(type: str) -> bool:
    """Whether ``type`` suspends a run: the event of a suspension record."""
    return _suspensions.for_event(type) is not None
