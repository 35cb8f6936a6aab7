"""Plain-words explanations of a workflow run, for the admin and the commands.

What a run waits for and since when, why it failed, and its event timeline,
read from its run-status row, its pending row and its event stream. Times
are told in the current time zone, with the zone named; words, not
markup, so the admin and the commands can show them alike.

The run's event timeline is :mod:`kumiko_workflows.operations.timeline`
(its :func:`timeline` and :func:`describe_event` are named here too); the
small texts both are written with, :mod:`kumiko_workflows.operations.words`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kumiko_workflows.engine import wakeups
from kumiko_workflows.engine.resume_errors import max_resume_errors
from kumiko_workflows.engine.run_controls import rerun_refusal
from kumiko_workflows.models import (
    Event,
    RunStatus,
    SuspensionType,
    WorkflowRun,
    WorkflowRunPending,
)
from kumiko_workflows.operations.timeline import describe_event, timeline
from kumiko_workflows.operations.words import (
    describe_match,
    humanize,
    key_text,
    plural,
    step_label,
    when,
)
from kumiko_workflows.store import slots
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import suspensions
from kumiko_workflows.workflow.registry import registry

__all__ = [
    "Explanation",
    "attempt_text",
    "describe_event",
    "explain",
    "pending_row",
    "queue_reason",
    "rate_reason",
    "timeline",
]


@dataclass
class Explanation:
    """Why a run is where it is: a headline, facts as (label, text), raw error text."""

    headline: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    error_text: str = ""
    due: bool = False
    late_by: timedelta | None = None
    #: What the error text is the error of: "Last error (attempt 1 of 3)".
    error_heading: str = "Last error"
    #: A failed run that :func:`~kumiko_workflows.engine.run_controls.rerun_run` would take.
    rerunnable: bool = False
    #: The run changed after it was read: what this says is of the run as read.
    moved: bool = False


def pending_row(run: WorkflowRun) -> WorkflowRunPending | None:
    return (
        WorkflowRunPending.objects.filter(tenant_id=run.tenant_id, run_id=run.run_id)
        .order_by("-run_version")
        .first()
    )


def _latest(run: WorkflowRun, type: str) -> Event | None:
    stream = Event.objects.filter(tenant_id=run.tenant_id, aggregate_id=run.run_id)
    return stream.filter(type=type).order_by("-version").first()


def _when(value: datetime | None) -> str:
    return when(value)


def attempt_text(run: WorkflowRun) -> str:
    """Where a run's retry is, counted as its error text counts: "attempt 1 of 3 failed; …"."""
    attempt = run.retry_attempt
    if not attempt:
        return "—"
    if run.status == RunStatus.WAITING:
        scheduled = _latest(run, et.RETRY_SCHEDULED)
        most = scheduled.payload.get("max_attempts") if scheduled else None
        return f"attempt {attempt} of {most or '?'} failed; attempt {attempt + 1} is next"
    failed = _latest(run, et.RUN_FAILED)
    most = failed.payload.get("max_attempts") if failed else None
    # A failure recorded before failures named their attempt: the column
    # still holds the last attempt a retry scheduled, which says nothing here.
    return f"attempt {attempt} of {most} failed" if most else "—"


def _error_heading(attempt: int, max_attempts: Any) -> str:
    if not attempt:
        return "Last error"
    return f"Last error (attempt {attempt} of {max_attempts or '?'})"


def explain(run: WorkflowRun, now: datetime) -> Explanation:
    if run.status == RunStatus.WAITING:
        explanation = _explain_waiting(run, now)
        if run.retry_attempt:  # a retry waits: its last error is the failed attempt's
            explanation.error_text = run.last_error
            scheduled = _latest(run, et.RETRY_SCHEDULED)
            most = scheduled.payload.get("max_attempts") if scheduled else None
            explanation.error_heading = _error_heading(run.retry_attempt, most)
        return explanation
    if run.status == RunStatus.FAILED:
        return _explain_failed(run)
    if run.status == RunStatus.CANCELLED:
        cancelled = _latest(run, et.RUN_CANCELLED)
        payload = cancelled.payload if cancelled else {}
        facts = [("Cancelled at", _when(run.finished_at))]
        facts.append(("Reason", payload.get("reason") or "—"))
        facts.append(("By", payload.get("by") or "—"))
        return Explanation("Cancelled: it will not run again.", facts)
    if run.status == RunStatus.COMPLETED:
        took = humanize(run.finished_at - run.started_at) if run.finished_at else "—"
        return Explanation(
            "Completed: every step ran.",
            [("Finished at", _when(run.finished_at)), ("Took", took)],
        )
    return Explanation(
        "Running: a worker is executing its steps right now, or was interrupted in the "
        "middle of them (its transaction then rolled back and the run is as it was).",
        [("Since", _when(run.updated_at)), ("Step", _step(run, run.step))],
    )


def _step(run: WorkflowRun, step: str) -> str:
    return step_label(run.workflow_name, step, run.workflow_version)


def _version(run: WorkflowRun) -> str:
    return "" if run.workflow_version is None else f"version {run.workflow_version} "


def _explain_failed(run: WorkflowRun) -> Explanation:
    facts = [
        ("Reason", run.failure_reason or "—"),
        ("Failed step", _step(run, run.step) or "(before the first step)"),
        ("Error class", run.error_class or "—"),
        ("Failed at", _when(run.finished_at)),
    ]
    failed = _latest(run, et.RUN_FAILED)
    most = failed.payload.get("max_attempts") if failed else None
    if run.retry_attempt and most:
        facts.append(("Attempt", f"{run.retry_attempt} of {most}: the retry gave up"))
    refusal = rerun_refusal(run)
    facts.append(
        (
            "Rerun",
            f"not possible: {refusal}"
            if refusal
            else "possible: it re-enters the step where the failed attempt began",
        )
    )
    return Explanation(
        "Failed.",
        facts,
        error_text=run.last_error,
        error_heading=_error_heading(run.retry_attempt if most else 0, most),
        rerunnable=refusal is None,
    )


@dataclass
class _Teller:
    """How the suspension records' facts are told here (:class:`suspension_record.Teller`)."""

    run: WorkflowRun

    def when(self, instant: datetime | None) -> str:
        return _when(instant)

    def match(self, expression: Any) -> str:
        return describe_match(expression)

    def latest(self, event_type: str) -> dict[str, Any] | None:
        event = _latest(self.run, event_type)
        return event.payload if event is not None else None


def _near_miss(row: WorkflowRunPending) -> list[tuple[str, str]]:
    found = wakeups.near_miss(row)
    if found is None:
        return []
    event, mismatches = found
    detail = "; ".join(mismatches) or "a value differs in type only"
    return [
        (
            "Near miss",
            f"event #{event.id} would end this wait but for the type of a value: {detail}. "
            'Equality is by type ("3" never equals 3): match on the type the events carry.',
        )
    ]


def _moved(run: WorkflowRun) -> bool:
    """Whether the run's stream has events after the version its row was read at."""
    stream = Event.objects.filter(tenant_id=run.tenant_id, aggregate_id=run.run_id)
    return stream.filter(version__gt=run.version).exists()


# --- flow control (concurrency and rate limits) ---------------------------------


def queue_reason(tenant_id: str, workflow_name: str, key: str) -> str:
    """Why runs of ``key`` queue: the slots taken, as the limit counts them."""
    workflow = registry.get(workflow_name)
    limit = workflow.concurrency if workflow is not None else None
    if limit is None:
        return f"queued for a slot{key_text(key)} (the workflow declares no limit now)"
    if limit.holds == "executing":
        return (
            f"queued behind {limit.max} running segment(s){key_text(key)} "
            f"(concurrency limit {limit.max}, held while a segment runs)"
        )
    held = slots.limit_holders(tenant_id, workflow_name, key)
    return (
        f"queued behind {held} active run(s){key_text(key)} "
        f"(concurrency limit {limit.max}, held from start to end)"
    )


def rate_reason(wake_at: datetime | None, now: datetime) -> str:
    """Why a run waits for its rate limit: when the next start is allowed."""
    if wake_at is None:
        return "rate limit: waiting for a start of the period"
    if wake_at <= now:
        return "rate limit: a start is allowed now (due)"
    return f"rate limit: next slot in {humanize(wake_at - now)}"


def _suspended_facts(
    run: WorkflowRun, row: WorkflowRunPending, suspension_type: str, kind: str
) -> list[tuple[str, str]]:
    """Where and since when the run is suspended, and its suspension record's facts."""
    facts = [("Suspended", f"{kind} at {_step(run, row.step)}"), ("Since", _when(row.suspended_at))]
    record = suspensions.for_type(suspension_type)
    if record is not None:
        facts.extend(record.facts(row, _Teller(run)))
    return facts


def _explain_limited(run: WorkflowRun, row: WorkflowRunPending, now: datetime) -> Explanation:
    """A run queued for a concurrency slot, or held back by its rate limit."""
    facts = _suspended_facts(run, row, run.suspension_type, run.get_suspension_type_display())
    if run.suspension_type == SuspensionType.LIMITED:
        if row.wake_at is not None:
            facts.append(("Due", f"yes: a slot was offered to it at {_when(row.wake_at)}"))
            return Explanation(
                "A concurrency slot freed for it: the next resume_due_runs pass starts it.",
                facts,
                due=row.wake_at <= now,
            )
        why = queue_reason(run.tenant_id, run.workflow_name, row.limit_key)
        facts.append(("Due", "no: when a slot of its key frees (oldest queued first)"))
        return Explanation(why[:1].upper() + why[1:] + ".", facts)
    why = rate_reason(row.wake_at, now)
    due = row.wake_at is not None and row.wake_at <= now
    facts.append(("Due", "yes" if due else f"no, at {_when(row.wake_at)}"))
    return Explanation(why[:1].upper() + why[1:] + ".", facts, due=due)


def _explain_waiting(run: WorkflowRun, now: datetime) -> Explanation:
    row = pending_row(run)
    if (row is None or row.run_version != run.version) and _moved(run):
        # Read after the run row: a worker or an operation moved the run between the reads.
        return Explanation(
            "It moved on while this page was read (its stream has newer events): reload the "
            "page to see where it is now.",
            moved=True,
        )
    if row is None:
        return Explanation(
            "Waiting, but it has no pending row, so no worker will resume it. "
            "Run manage.py rebuild_workflow_projections --check to compare the tables "
            "with the event store."
        )
    if run.suspension_type in (SuspensionType.LIMITED, SuspensionType.RATE):
        return _explain_limited(run, row, now)
    kind = row.get_suspension_type_display()
    facts = _suspended_facts(run, row, row.suspension_type, kind)
    if row.priority:
        claimed = f"{row.priority}: taken among due runs as if due at {_when(row.claim_at)}"
        facts.append(("Priority", claimed))
    if row.suspension_type == SuspensionType.EVENT:
        facts.extend(_near_miss(row))
    workflow = registry.of_run(row.workflow_name, row.workflow_version, row.definition_fingerprint)
    if workflow is None or workflow.fingerprint != row.definition_fingerprint:
        facts.append(
            (
                "Definition",
                f"workflow {run.workflow_name!r} {_version(run)}is no longer declared as it "
                "started: the run fails (workflow_definition_changed) when it resumes, unless "
                "that version is declared again or the run is moved (see "
                "`manage.py workflow_versions`)",
            )
        )
    if row.resume_errors:
        facts.append(
            (
                "Failed resumes",
                f"{plural(row.resume_errors, 'pass', 'passes')} in a row raised resuming it "
                f"(the worker's log has why); the run fails after {max_resume_errors()}",
            )
        )

    due = row.wake_at is not None and row.wake_at <= now
    late_by = now - row.wake_at if due and row.wake_at else None
    if due and late_by is not None:
        facts.append(("Due", f"yes, for {humanize(late_by)} (since {_when(row.wake_at)})"))
        headline = (
            f"Due for {humanize(late_by)}: the next resume_due_runs pass resumes it. "
            "If it stays due, check that a worker (or the cron job) is running."
        )
    elif row.wake_at is not None:
        facts.append(("Due", f"no, in {humanize(row.wake_at - now)}"))
        headline = f"Waiting ({kind}) until {_when(row.wake_at)}."
    else:
        facts.append(("Due", "no: not until the awaited event arrives"))
        headline = f"Waiting for a {row.wait_event_type!r} event, with no deadline."
    return Explanation(headline, facts, due=due, late_by=late_by)
