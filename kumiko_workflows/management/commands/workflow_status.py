"""``manage.py workflow_status [--tenant T] [--failed] [--json]``.

Counts of runs by workflow and status, the runs in flight per workflow and
version, the pending rows and the oldest due one with its lag (how long it
has waited for a worker), and with ``--failed`` the failed runs with their
reason and step.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count
from django.utils import timezone

from kumiko_workflows.engine.cron import schedule_overview
from kumiko_workflows.management.arguments import positive_int
from kumiko_workflows.models import RunStatus, WorkflowRun, WorkflowRunPending
from kumiko_workflows.operations.explain import humanize, step_label
from kumiko_workflows.operations.versions import VersionRow, version_lines, version_table


def status_report(
    tenant: str | None, now: datetime, failed_limit: int | None = None
) -> dict[str, Any]:
    """Everything the command prints, as JSON-ready data."""
    runs = WorkflowRun.objects.for_tenant(tenant)
    statuses = [choice.value for choice in RunStatus]
    workflows: dict[str, dict[str, int]] = {}
    for row in runs.order_by().values("workflow_name", "status").annotate(n=Count("run_id")):
        counts = workflows.setdefault(row["workflow_name"], dict.fromkeys(statuses, 0))
        counts[row["status"]] = counts.get(row["status"], 0) + row["n"]
    for counts in workflows.values():
        counts["total"] = sum(counts.values())

    pending = WorkflowRunPending.objects.for_tenant(tenant)
    due = pending.due(now)
    oldest = due.order_by("wake_at", "id").first()
    oldest_due = None
    if oldest is not None and oldest.wake_at is not None:
        lag = now - oldest.wake_at
        oldest_due = {
            "run_id": str(oldest.run_id),
            "tenant_id": oldest.tenant_id,
            "workflow_name": oldest.workflow_name,
            "step": oldest.step,
            "suspension_type": oldest.suspension_type,
            "due_since": oldest.wake_at.isoformat(),
            "lag_seconds": round(lag.total_seconds(), 3),
            "lag": humanize(lag),
        }
    report: dict[str, Any] = {
        "now": now.isoformat(),
        "tenant": tenant,
        "workflows": dict(sorted(workflows.items())),
        "in_flight": [row.as_dict() for row in version_table(tenant) if row.in_flight],
        "pending": {"total": pending.count(), "due": due.count(), "oldest_due": oldest_due},
    }
    report["cron"] = cron_schedules(tenant, now)
    if failed_limit is not None:
        rows = runs.failed().order_by("-finished_at", "-updated_at")[:failed_limit]
        report["failed"] = [
            {
                "run_id": str(run.run_id),
                "tenant_id": run.tenant_id,
                "workflow_name": run.workflow_name,
                "idempotency_key": run.idempotency_key,
                "reason": run.failure_reason,
                "step": run.step,
                "workflow_version": run.workflow_version,
                "step_label": step_label(run.workflow_name, run.step, run.workflow_version),
                "error_class": run.error_class,
                "failed_at": run.finished_at.isoformat() if run.finished_at else None,
            }
            for run in rows
        ]
    return report


# --- cron schedules (owned by kumiko_workflows.cron) ----------------------------


def cron_schedules(tenant: str | None, now: datetime) -> list[dict[str, Any]]:
    """Each cron workflow's last fired and next slot, per cron tenant."""

    rows = []
    for row in schedule_overview(now=now):
        if tenant is not None and row["tenant_id"] != tenant:
            continue
        rows.append(
            {
                **row,
                "started_at": row["started_at"].isoformat() if row["started_at"] else None,
                "last_slot": row["last_slot"].isoformat() if row["last_slot"] else None,
                "last_run_id": str(row["last_run_id"]) if row["last_run_id"] else None,
                "next_slot": row["next_slot"].isoformat() if row["next_slot"] else None,
                "paused_at": row["paused_at"].isoformat() if row["paused_at"] else None,
            }
        )
    return rows


def print_cron(command: BaseCommand, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return  # no cron workflows: keep the output as it was
    command.stdout.write(command.style.MIGRATE_HEADING("Cron schedules"))
    for row in rows:
        command.stdout.write(
            f"  {row['workflow_name']}  tenant {row['tenant_id']}  "
            f"{row['expression']!r} {row['timezone']} catch_up={row['catch_up']}\n"
            f"      last slot {row['last_slot'] or '—'}, next slot {row['next_slot'] or '—'}"
            + ("" if row["started_at"] else " (not started: the next scheduler pass starts it)")
        )
        if row["paused"]:
            command.stdout.write(
                command.style.WARNING(
                    f"      paused since {row['paused_at']} by {row['paused_by'] or '—'}: "
                    "no slot fires until it is resumed"
                )
            )
        if row["problem"]:
            command.stdout.write(command.style.ERROR(f"      cannot fire: {row['problem']}"))


# --- the command ---------------------------------------------------------------------


class Command(BaseCommand):
    help = (
        "Show workflow runs by workflow and status, the pending rows and the oldest due one "
        "with its lag; --failed lists failed runs with reason and step."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="only this tenant (default: all tenants)")
        parser.add_argument(
            "--failed", action="store_true", help="also list failed runs, newest first"
        )
        parser.add_argument(
            "--limit",
            type=positive_int,
            default=50,
            metavar="N",
            help="list at most N failed runs (default: %(default)s)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        report = status_report(
            options["tenant"], now, options["limit"] if options["failed"] else None
        )
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
            return
        self._print_counts(report)
        self._print_versions(report)
        self._print_pending(report)
        if "failed" in report:
            self._print_failed(report["failed"])
        print_cron(self, report["cron"])

    def _print_counts(self, report: dict[str, Any]) -> None:
        scope = f"tenant {report['tenant']!r}" if report["tenant"] else "all tenants"
        self.stdout.write(self.style.MIGRATE_HEADING(f"Workflow runs ({scope})"))
        if not report["workflows"]:
            self.stdout.write("  no runs")
            return
        columns = [choice.value for choice in RunStatus] + ["total"]
        width = max(len("workflow"), *(len(name) for name in report["workflows"]))
        self.stdout.write("  " + "workflow".ljust(width) + "".join(f"{c:>11}" for c in columns))
        for name, counts in report["workflows"].items():
            cells = "".join(f"{counts.get(c, 0):>11}" for c in columns)
            self.stdout.write("  " + name.ljust(width) + cells)

    def _print_versions(self, report: dict[str, Any]) -> None:
        if not report["in_flight"]:
            return
        self.stdout.write(self.style.MIGRATE_HEADING("Runs in flight by version"))
        rows = [VersionRow(**row) for row in report["in_flight"]]
        for line in version_lines(rows):
            self.stdout.write("  " + line)
        if any(row.stranded for row in rows):
            self.stdout.write(
                self.style.WARNING(
                    "  runs that would fail at resume: see `manage.py workflow_versions --check`"
                )
            )

    def _print_pending(self, report: dict[str, Any]) -> None:
        pending = report["pending"]
        self.stdout.write(
            self.style.MIGRATE_HEADING("Pending")
            + f"  {pending['total']} suspended step(s), {pending['due']} due now"
        )
        oldest = pending["oldest_due"]
        if oldest is None:
            self.stdout.write("  nothing is due")
            return
        line = (
            f"  oldest due: run {oldest['run_id']} ({oldest['workflow_name']}, tenant "
            f"{oldest['tenant_id']}, step {oldest['step']}, {oldest['suspension_type']}) "
            f"due since {oldest['due_since']}, lag {oldest['lag']}"
        )
        style = self.style.WARNING if oldest["lag_seconds"] > 60 else (lambda text: text)
        self.stdout.write(style(line))

    def _print_failed(self, failed: list[dict[str, Any]]) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"Failed runs ({len(failed)} shown)"))
        if not failed:
            self.stdout.write("  none")
        for run in failed:
            error = f", {run['error_class']}" if run["error_class"] else ""
            self.stdout.write(
                f"  {run['run_id']}  {run['workflow_name']}  tenant {run['tenant_id']}  "
                f"{run['failed_at'] or '—'}\n"
                f"      reason {run['reason'] or '—'} at {run['step_label'] or 'the start'}{error}"
            )
