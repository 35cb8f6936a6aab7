"""Which versions of each workflow the code declares, and the runs in flight on each.

The table behind ``manage.py workflow_versions`` (and the versions part of
``workflow_status``): a deploy that stops declaring a version its runs are
still waiting on, or edits a step they have run or wait at, would fail them
at resume, so a pipeline can ask first. And the workers whose code is older
than runs they met (:func:`stale_workers`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count

from kumiko_workflows.engine import deploys
from kumiko_workflows.models import (
    SETTLED_STATUSES,
    WorkerHeartbeat,
    WorkflowRun,
    WorkflowRunPending,
)
from kumiko_workflows.workflow.registry import registry


@dataclass
class VersionRow:
    """One version of one workflow: declared or not, and its runs in flight.

    ``version`` is None for runs started before runs recorded their version
    whose fingerprint matches no declared version. ``stranded`` counts the
    runs in flight that would fail at resume (``workflow_definition_changed``):
    their version is not declared, or was changed in place at or before the
    step they wait at; ``failing`` says at which steps and why. ``kept``
    counts the waiting runs of a version changed in place that resume on
    it all the same: nothing they have run or wait at changed.
    """

    workflow_name: str
    version: int | None
    declared: bool
    in_flight: int = 0
    stranded: int = 0
    #: New runs start on it (the highest declared version).
    current: bool = False
    kept: int = 0
    #: Waiting runs that would fail, by step: {"step", "runs", "why"}.
    failing: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problem(self) -> str | None:
        """What ``workflow_versions --check`` reports about this row, or None."""
        if not self.stranded:
            return None
        which = (
            f"workflow {self.workflow_name!r} version {self.version}"
            if self.version is not None
            else f"workflow {self.workflow_name!r} (version not recorded)"
        )
        if not self.declared:
            why = (
                f"the code no longer declares version {self.version}"
                if self.version is not None
                else "no declared version has their definition"
            )
        else:
            why = f"version {self.version} was changed in place since they started"
        steps = "".join(
            f"; {group['runs']} waiting at step {group['step']}: {group['why']}"
            for group in self.failing
        )
        return (
            f"{which}: {self.stranded} run(s) in flight would fail at resume "
            f"(workflow_definition_changed): {why}{steps}"
        )


def _sort_key(row: VersionRow) -> tuple[str, int, int]:
    return (row.workflow_name, row.version is None, row.version or 0)


def version_table(tenant_id: str | None = None) -> list[VersionRow]:
    """Every declared version and every version with runs in flight (running or waiting)."""
    table: dict[tuple[str, int | None], VersionRow] = {}
    for workflow in registry.every_version():
        current = registry.get(workflow.name) is workflow
        table[(workflow.name, workflow.version)] = VersionRow(
            workflow.name, workflow.version, declared=True, current=current
        )
    in_flight = (
        WorkflowRun.objects.for_tenant(tenant_id)
        .exclude(status__in=SETTLED_STATUSES)
        .order_by()
        .values("workflow_name", "workflow_version", "definition_fingerprint")
        .annotate(n=Count("run_id"))
    )
    for group in in_flight:
        name, fingerprint = group["workflow_name"], group["definition_fingerprint"]
        resumes_on = registry.of_run(name, group["workflow_version"], fingerprint)
        version = group["workflow_version"]
        if version is None and resumes_on is not None:
            version = resumes_on.version
        row = table.get((name, version))
        if row is None:
            row = table[(name, version)] = VersionRow(name, version, declared=False)
        row.in_flight += group["n"]
        if resumes_on is None or resumes_on.fingerprint != fingerprint:
            _judge_waiting(row, tenant_id, group["workflow_version"], fingerprint, group["n"])
    return sorted(table.values(), key=_sort_key)


def failing_versions(tenant_id: str | None = None) -> list[VersionRow]:
    """The rows of :func:`version_table` with waiting runs that would fail, ``failing`` filled.

    Read from the pending rows alone (a waiting run's definition is on its
    pending row), grouped by definition, never from the runs in flight:
    the run list's warning asks on every view, and counting every run in
    flight on a large store costs more than the page. ``in_flight`` and
    ``stranded`` are left at 0 (see :func:`version_table` for them).
    """
    waiting = (
        WorkflowRunPending.objects.for_tenant(tenant_id)
        .order_by()
        .values_list("workflow_name", "workflow_version", "definition_fingerprint")
        .distinct()
    )
    rows: list[VersionRow] = []
    for name, version, fingerprint in waiting:
        resumes_on = registry.of_run(name, version, fingerprint)
        if resumes_on is not None and resumes_on.fingerprint == fingerprint:
            continue
        shown = resumes_on.version if version is None and resumes_on is not None else version
        row = VersionRow(name, shown, declared=registry.get(name, shown) is not None)
        _judge_waiting(row, tenant_id, version, fingerprint, 0)
        row.stranded = sum(group["runs"] for group in row.failing)
        if row.failing:
            rows.append(row)
    return sorted(rows, key=_sort_key)


def _judge_waiting(
    row: VersionRow, tenant_id: str | None, version: int | None, fingerprint: str, runs: int
) -> None:
    """Count which of ``runs`` on a definition the code lacks would resume, by where they wait.

    As a worker with this code would decide (:mod:`kumiko_workflows.engine.deploys`);
    a run in flight that waits nowhere (being resumed now) counts as failing.
    """
    if version is not None and registry.get(row.workflow_name, version) is None:
        row.stranded += runs  # the version is gone: its row says so, whatever the step
        return
    on_definition = WorkflowRunPending.objects.for_tenant(tenant_id).filter(
        workflow_name=row.workflow_name,
        workflow_version=version,
        definition_fingerprint=fingerprint,
    )
    waiting = on_definition.order_by().values("step").annotate(n=Count("id"))
    counted = 0
    for group in sorted(waiting, key=lambda group: group["step"]):
        step, count = group["step"], group["n"]
        counted += count
        sample = on_definition.filter(step=step).first()
        assert sample is not None  # just counted
        prints = deploys.run_prints(sample.tenant_id, sample.run_id, fingerprint)
        workflow, why = deploys.compatible(
            row.workflow_name, version, fingerprint, step, prints, advice=False
        )
        if workflow is not None:
            row.kept += count
        else:
            row.stranded += count
            row.failing.append({"step": step, "runs": count, "why": why})
    row.stranded += max(0, runs - counted)


def version_lines(rows: list[VersionRow]) -> list[str]:
    """The table as text lines: workflow, version, declared, runs in flight, would fail.

    Under a row, a line for each step where waiting runs would fail, and why.
    """
    cells = [
        (
            row.workflow_name,
            "?" if row.version is None else str(row.version),
            "yes" if row.declared else "no",
            str(row.in_flight),
            str(row.stranded),
        )
        for row in rows
    ]
    width = max([len("workflow"), *(len(cell[0]) for cell in cells)])
    line = f"{{:<{width}}}  {{:>7}}  {{:<8}}  {{:>9}}  {{:>10}}"
    lines = [line.format("workflow", "version", "declared", "in flight", "would fail")]
    for row, cell in zip(rows, cells, strict=True):
        lines.append(line.format(*cell) + ("  (new runs start here)" if row.current else ""))
        for group in row.failing:
            lines.append(f"    {group['runs']} waiting at step {group['step']}: {group['why']}")
        if row.kept:
            lines.append(
                f"    {row.kept} waiting on an edited definition resume on it: nothing they "
                "have run or wait at changed"
            )
    return lines


def stale_workers(
    tenant_id: str | None, now: datetime, names: Collection[str] | None = None
) -> list[str]:
    """A line for each worker (of ``names``, or any) whose code is older than runs it left.

    Such a worker leaves those runs due for a worker that has their code
    (:mod:`kumiko_workflows.engine.deploys`); it should be restarted.
    """
    lines = []
    for beat in WorkerHeartbeat.objects.order_by("name"):
        if not beat.left_code or (names is not None and beat.name not in names):
            continue
        code = ", ".join(
            f"workflow {entry['workflow_name']!r} version {entry['workflow_version']} "
            f"(definition {entry['fingerprint'][:12]}, first seen {entry['first_seen_at']} by "
            f"{entry['first_seen_by']})"
            for entry in beat.left_code
        )
        due = deploys.left_due(beat.left_code, tenant_id, now)
        lines.append(
            f"worker {beat.name} runs code older than its runs need: it left runs of {code} "
            f"for a worker that has that code ({due} due now); restart it with the new code"
        )
    return lines
