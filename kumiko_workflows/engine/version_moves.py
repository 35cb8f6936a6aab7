"""Moving suspended runs from one version of a workflow to another, explicitly.

A run resumes on the version it started under. Where the author of a newer
version says a waiting run may continue in it (``define_workflow(...,
version=2, migrates_from={1: {old position: new position}})``),
:func:`migrate_workflow_runs` moves the runs: it appends
``workflow.run-migrated`` to each run's stream, which the projections turn
into the pending and status rows' new step, fingerprint and version. Nothing
moves on its own, and a move that does not fit one of the runs moves none.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from kumiko_workflows.engine.run_controls import check_by, check_name
from kumiko_workflows.exceptions import InvalidArgument, MigrationRefused
from kumiko_workflows.models import WorkflowRunPending
from kumiko_workflows.store import db
from kumiko_workflows.store.streams import RunStream
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import suspensions
from kumiko_workflows.workflow.arguments import int_between
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.registry import registry

logger = logging.getLogger(__name__)


@dataclass
class MigrationReport:
    """What :func:`migrate_workflow_runs` moved (or, with ``dry_run``, would move)."""

    workflow_name: str
    from_version: int
    to_version: int
    #: (old step, new step) -> waiting runs moved between them.
    steps: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Runs queued to start (``start="worker"``), moved to the new version's first step.
    queued: int = 0
    dry_run: bool = False

    @property
    def moved(self) -> int:
        return sum(self.steps.values()) + self.queued


def _version(value: Any, what: str) -> int:
    if not int_between(value, 1):
        raise InvalidArgument(f"{what} must be a version (an integer >= 1), got {value!r}")
    return value


def _mapping(name: str, from_version: int, to_version: int) -> tuple[Workflow, dict[str, str]]:
    target = registry.get(name, to_version)
    if target is None:
        declared = ", ".join(str(w.version) for w in registry.versions(name)) or "none"
        raise MigrationRefused(
            f"version {to_version} of workflow {name!r} is not declared (declared: {declared}); "
            "runs move only to a version the code declares"
        )
    mapping = target.migrates_from.get(from_version)
    if mapping is None:
        raise MigrationRefused(
            f"version {to_version} of workflow {name!r} declares no migrates_from for version "
            f"{from_version}: say where its waiting runs continue, e.g. "
            f'migrates_from={{{from_version}: {{"1": "1"}}}} (old step position: new one)'
        )
    return target, mapping


def _queued(row: WorkflowRunPending) -> bool:
    """A run not started yet (queued, debounced, held): it has run no step, so any version fits."""
    return row.suspension_type in _NOT_STARTED


_NOT_STARTED = frozenset(
    record.suspension_type
    for record in (suspensions.QUEUED, suspensions.DEBOUNCED, suspensions.HELD)
)


def _refusal(
    row: WorkflowRunPending, target: Workflow, from_version: int, mapping: dict[str, str]
) -> str | None:
    """Why the run of ``row`` cannot continue in ``target``, or None."""
    if _queued(row):
        return None
    new = mapping.get(row.step)
    if new is None:
        return (
            f"wait at step {row.step}, which version {target.version}'s "
            f"migrates_from[{from_version}] does not map"
        )
    step = target.step_at(new)
    where = f"wait at step {row.step} ({row.get_suspension_type_display()}), mapped to"
    if step is None:
        return f"{where} step {new}, which version {target.version} has no step at"
    # A rerun starts again at any step; any other suspension resumes in a step of its kind.
    rerun = row.suspension_type == suspensions.RERUN.suspension_type
    if not rerun and row.suspension_type not in step.resumes_from:
        return f"{where} {target.label(new)}, which cannot resume it"
    # (A wait for child runs keeps its group there: the same children, wherever the step moved.)
    if (
        row.awaits_key
        and row.suspension_type == suspensions.EVENT.suspension_type
        and (
            step.result_name() != row.awaits_key
            or target.awaits.get(row.awaits_key) != row.wait_event_type
        )
    ):
        return (
            f"{where} {target.label(new)}, which does not wait for the same awaits key "
            f"{row.awaits_key!r} ({row.wait_event_type!r})"
        )
    return None


def migrate_workflow_runs(
    name: str,
    from_version: int,
    to_version: int,
    *,
    tenant_id: str | None = None,
    by: str | None = None,
    dry_run: bool = False,
) -> MigrationReport:
    """Move the waiting runs of version ``from_version`` of ``name`` to ``to_version``.

    ``to_version`` must be declared with ``migrates_from={from_version:
    {old step position: new step position}}``. Each waiting run (of one
    tenant, or all) gets ``workflow.run-migrated`` in its stream and
    resumes on ``to_version`` at the mapped step, with its wait (deadline,
    awaited event, results so far) unchanged. A run queued to start in a
    worker (``start="worker"``) and not started yet has run no step: it
    moves too, to the first step of ``to_version`` (the mapping is not
    asked), and never refuses the move. All or nothing, in one
    transaction: if any run waits at a step the mapping leaves out, or maps
    to a step that cannot continue its wait, :class:`MigrationRefused`
    names them and no run moves. ``dry_run`` checks and counts only.

    Runs started before runs recorded their version count as
    ``from_version`` when their fingerprint is that version's, which
    needs it declared. A run a worker is resuming at that moment is left
    where it is (run it again to move it).
    """
    _version(from_version, "from_version")
    _version(to_version, "to_version")
    if from_version == to_version:
        raise InvalidArgument(f"from_version and to_version are both {from_version}")
    check_by(by)
    check_name(tenant_id, "tenant_id", "tenant_id")
    target, mapping = _mapping(name, from_version, to_version)
    source = registry.get(name, from_version)
    on_source = Q(workflow_version=from_version)
    if source is not None:
        on_source |= Q(workflow_version__isnull=True, definition_fingerprint=source.fingerprint)
    report = MigrationReport(name, from_version, to_version, dry_run=dry_run)
    with db.atomic():
        # Like every writer to a run: its pending row is locked before its stream.
        # Locked tenant by tenant (a lock names its tenant: one shard's on Citus).
        source_rows = WorkflowRunPending.objects.filter(on_source, workflow_name=name)
        tenants = (
            [tenant_id]
            if tenant_id is not None
            else source_rows.order_by("tenant_id").values_list("tenant_id", flat=True).distinct()
        )
        rows = [
            row
            for tenant in list(tenants)
            for row in source_rows.filter(tenant_id=tenant).select_for_update().order_by("pk")
        ]
        per_run = Counter((row.tenant_id, row.run_id) for row in rows)
        refused: Counter[str] = Counter()
        for row in rows:
            problem = _refusal(row, target, from_version, mapping)
            if per_run[(row.tenant_id, row.run_id)] > 1:
                problem = "has more than one pending row"
            if problem:
                refused[problem] += 1
        if refused:
            reasons = "; ".join(f"{count} run(s) {why}" for why, count in sorted(refused.items()))
            raise MigrationRefused(
                f"runs of workflow {name!r} cannot move from version {from_version} to "
                f"{to_version}: {reasons}. No run was moved."
            )
        for row in rows:
            if _queued(row):
                new = "0"  # it starts on the new version from the beginning
                report.queued += 1
            else:
                new = mapping[row.step]
                report.steps[(row.step, new)] += 1
            if dry_run:
                continue
            stream = RunStream(
                row.run_id,
                row.tenant_id,
                name,
                row.run_version,
                target.fingerprint,
                row.trigger_event_id,
                savepoint=False,  # one error unwinds every move
            )
            stream.append(
                et.RUN_MIGRATED,
                {
                    "workflow_name": name,
                    "from_version": from_version,
                    "workflow_version": to_version,
                    "from_step": row.step,
                    "step": new,
                    "suspension_type": row.suspension_type,
                    "from_fingerprint": row.definition_fingerprint,
                    "definition_fingerprint": target.fingerprint,
                    "step_fingerprints": target.step_fingerprints,
                    "by": by or "",
                },
                created_by=by or "",
            )
    logger.info(
        "workflow=%s from_version=%s to_version=%s tenant=%s moved=%d dry_run=%s",
        name,
        from_version,
        to_version,
        tenant_id or "*",
        report.moved,
        dry_run,
    )
    return report
