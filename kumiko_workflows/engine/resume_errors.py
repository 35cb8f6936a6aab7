"""A resume that raised, counted on its pending row: the run failed after ``MAX_RESUME_ERRORS``.

Used by :mod:`kumiko_workflows.engine.resume` once the raising row's
savepoint (or its batch) was rolled back.
"""

from __future__ import annotations

import logging

from django.db.models import F

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.models import WorkflowRunPending
from kumiko_workflows.store import db
from kumiko_workflows.store.streams import (
    RESUME_FAILED_REPEATEDLY,
    RunStream,
    fail_run,
    failure_from_exception,
)
from kumiko_workflows.workflow import suspensions

logger = logging.getLogger(__name__)


def count_unwound(row: WorkflowRunPending, exc: Exception) -> bool:
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
        failure = failure_from_exception(
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
