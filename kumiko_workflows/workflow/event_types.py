"""Names of the events a workflow run writes to its own stream.

Each run is one stream of aggregate type ``workflow-run``; these constants are
the ``type`` of its events. Payload keys are snake_case and never copy the
payload of a trigger or awaited event: they reference events by id.
"""

RUN_AGGREGATE_TYPE = "workflow-run"
SCHEDULE_AGGREGATE_TYPE = "workflow-schedule"

RUN_STARTED = "workflow.run-started"
WAITING = "workflow.step.waiting"
WAITING_FOR_EVENT = "workflow.step.waiting-for-event"
RETRY_SCHEDULED = "workflow.retry.scheduled"
RESUMED = "workflow.step.resumed"
RUN_COMPLETED = "workflow.run-completed"
RUN_FAILED = "workflow.run-failed"
RUN_CANCELLED = "workflow.run-cancelled"
#: Someone asked a waiting run to wake now (``wake_run`` or the admin).
WAKE_REQUESTED = "workflow.wake-requested"
#: Someone asked a failed run to run again from where its failed attempt began.
RERUN_REQUESTED = "workflow.rerun-requested"
#: A run of a workflow defined with ``start="worker"`` waits for a worker to run its steps.
RUN_QUEUED = "workflow.run-queued"
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
SUSPENSIONS = (WAITING, WAITING_FOR_EVENT, RETRY_SCHEDULED, RERUN_REQUESTED, RUN_QUEUED)
TERMINAL = (RUN_COMPLETED, RUN_FAILED, RUN_CANCELLED)
RUN_EVENTS = (
    RUN_STARTED,
    WAITING,
    WAITING_FOR_EVENT,
    RETRY_SCHEDULED,
    RESUMED,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_CANCELLED,
    WAKE_REQUESTED,
    RERUN_REQUESTED,
    RUN_QUEUED,
    RUN_MIGRATED,
)
