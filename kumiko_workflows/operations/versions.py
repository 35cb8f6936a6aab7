"""Which versions of each workflow the code declares, and the runs in flight on each.

The table behind ``manage.py workflow_versions`` (and the versions part of
``workflow_status``): a deploy that stops declaring a version its runs are
still waiting on would fail them at resume, so a pipeline can ask first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.db.models import Count

from kumiko_workflows.models import SETTLED_STATUSES, WorkflowRun
from kumiko_workflows.workflow.definition import registry


@dataclass
class VersionRow:
    """One version of one workflow: declared or not, and its runs in flight.

    ``version`` is None for runs started before runs recorded their version
    whose fingerprint matches no declared version. ``stranded`` counts the
    runs in flight that would fail at resume (``workflow_definition_changed``):
    their version is not declared, or was changed in place since they started.
    """

    workflow_name: str
    version: int | None
    declared: bool
    in_flight: int = 0
    stranded: int = 0
    #: New runs start on it (the highest declared version).
    current: bool = False

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
        return (
            f"{which}: {self.stranded} run(s) in flight would fail at resume "
            f"(workflow_definition_changed): {why}"
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
            row.stranded += group["n"]
    return sorted(table.values(), key=_sort_key)


def version_lines(rows: list[VersionRow]) -> list[str]:
    """The table as text lines: workflow, version, declared, runs in flight, would fail."""
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
    return lines
