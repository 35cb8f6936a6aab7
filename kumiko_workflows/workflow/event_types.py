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
#: One stream per (tenant, workflow, key) of a debounced or singleton workflow:
#: which run of the key is open (debouncing, or active) and which wait behind it.
GATE_AGGREGATE_TYPE = "workflow-gate"
#: The stream of one child run's start request: its trigger (``call_workflow``, ``fan_out``).
CALL_AGGREGATE_TYPE = "workflow-call"

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
#: A step started child runs (``call_workflow``, ``fan_out``) and waits until they finish.
WAITING_FOR_CHILDREN = _suspensions.CHILDREN.event_type
#: A run failed (or was cancelled with ``compensate=True``) after steps with a
#: compensation finished: the compensations run next, in reverse order.
COMPENSATION_SCHEDULED = _suspensions.COMPENSATE.event_type
#: One finished step's compensation ran (at most once per step).
STEP_COMPENSATED = "workflow.step.compensated"
#: The trigger of a child run: the parent's request, its payload the child's input.
CALL_REQUESTED = "workflow.call-requested"
#: A run of a workflow with a concurrency limit took a slot of its key
#: (``holds="active"``: it holds it until ``workflow.slot-released``; else
#: for the segment this event opens).
SLOT_TAKEN = "workflow.slot-taken"
#: An active holder's run ended (or stopped holding): its slot is free.
SLOT_RELEASED = "workflow.slot-released"
#: A run found every slot of its key taken: it waits, queued, for one.
SLOT_WAITING = _suspensions.SLOT.event_type
#: A slot freed and this run is the oldest queued for its key: it is due now.
SLOT_OFFERED = "workflow.slot-offered"
#: A run of a rate-limited workflow took one of its key's starts of the period.
RATE_TAKEN = "workflow.rate-taken"
#: A run found its rate limit's budget spent: it waits until a start is allowed.
RATE_WAITING = _suspensions.RATE.event_type
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

#: A trigger event of a debounced workflow (``on_event(debounce=...)``) opened
#: a burst, or made the burst's run start later, with this event: the run
#: waits to start at step 0 with the burst's last event as its trigger.
RUN_DEBOUNCED = _suspensions.DEBOUNCED.event_type
#: A run of a ``singleton="queue"`` workflow waits until the run of its key
#: before it ends (then the gate wakes it).
RUN_HELD = _suspensions.HELD.event_type

#: The gate's events; each payload holds the gate's whole state after it
#: (``active``: the open run or None, ``queue``: runs waiting behind it).
GATE_OPENED = "workflow.gate.opened"
GATE_QUEUED = "workflow.gate.queued"
GATE_SKIPPED = "workflow.gate.skipped"
GATE_RELEASED = "workflow.gate.released"
GATE_EVENTS = (GATE_OPENED, GATE_QUEUED, GATE_SKIPPED, GATE_RELEASED)

SCHEDULE_EVENTS = (
    SCHEDULE_STARTED,
    SCHEDULE_SLOT_FIRED,
    SCHEDULE_PAUSED,
    SCHEDULE_RESUMED,
    SCHEDULE_FIRED_NOW,
)
CALL_EVENTS = (CALL_REQUESTED,)
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
    STEP_COMPENSATED,
    SLOT_TAKEN,
    SLOT_RELEASED,
    SLOT_OFFERED,
    RATE_TAKEN,
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
