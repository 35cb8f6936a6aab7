"""``manage.py workflow_status [--tenant T] [--failed] [--json] [--check ...]``.

Counts of runs by workflow and status, the runs in flight per workflow and
version, the pending rows and the oldest due one with its lag (how long it
has waited for a worker), the due backlog per tenant, the workers and when
each last passed, and with ``--failed`` the failed runs with their reason
and step. ``--check`` is a health check for orchestrators: it reads only
the oldest due row and the workers' heartbeats, and exits 1 when the lag is
over ``--max-lag``, no worker has passed within ``--max-heartbeat-age``, or
a worker's code is older than runs it met (it left them for a worker with
newer code: restart it).
A heartbeat's age is read on the database's clock, the one it was written
with, never on this process's. With the database unreachable, every form
prints one line (``--json``: an object saying so) and exits 1. The report
itself is :mod:`kumiko_workflows.operations.status`; this is its shell.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, InterfaceError

from kumiko_workflows.management.arguments import positive_int, seconds_or_off
from kumiko_workflows.models import RunStatus
from kumiko_workflows.operations.status import (
    health,
    status_report,
)
from kumiko_workflows.operations.version_table import (
    VersionRow,
    stale_workers,
    version_lines,
)
from kumiko_workflows.operations.words import humanize
from kumiko_workflows.workflow import clock


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
        "with its lag, and the workers; --failed lists failed runs with reason and step; "
        "--check is a health check (exit 1 when the lag or the workers' heartbeats are too old)."
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
        check = parser.add_argument_group(
            "health check", "for orchestrators: print the verdict, exit 1 when unhealthy"
        )
        check.add_argument(
            "--check",
            action="store_true",
            help="check only the lag and the workers' heartbeats; exit 1 on a problem",
        )
        check.add_argument(
            "--max-lag",
            type=seconds_or_off,
            default=60.0,
            metavar="S",
            help="the oldest due run may wait at most S seconds for a worker "
            "(default: %(default)g; off: not checked)",
        )
        check.add_argument(
            "--max-heartbeat-age",
            type=seconds_or_off,
            default=60.0,
            metavar="S",
            help="some worker must have begun a pass within S seconds (default: %(default)g; "
            "off: not checked); workers write a heartbeat every 5 s at most, as a pass begins",
        )
        check.add_argument(
            "--host",
            metavar="H",
            help="only heartbeats of workers on host H (a pod's own, for a liveness probe)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._handle(options)
        except (DatabaseError, InterfaceError) as exc:
            # One line for a probe's log, not a traceback; exit 1 (unhealthy).
            error = " ".join(f"the database is unavailable: {exc}".split())
            if options["json"]:
                answer: dict[str, Any] = {"error": error}
                if options["check"]:
                    answer = {"healthy": False, "problems": [error], **answer}
                self.stdout.write(json.dumps(answer, indent=2))
            raise CommandError(error) from exc

    def _handle(self, options: dict[str, Any]) -> None:
        now = clock.now()
        if options["check"]:
            self._check(now, options)
            return
        report = status_report(
            options["tenant"], now, options["limit"] if options["failed"] else None
        )
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
            return
        self._print_counts(report)
        self._print_versions(report)
        self._print_pending(report)
        self._print_flow_control(report["flow_control"])
        self._print_workers(report["workers"])
        if "failed" in report:
            self._print_failed(report["failed"])
        print_cron(self, report["cron"])
        self._print_outbox(report["outbox"])

    def _print_outbox(self, backlogs: dict[str, dict[str, Any]]) -> None:
        if not backlogs:
            return  # no outbox configured
        self.stdout.write(self.style.MIGRATE_HEADING("Outbox") + "  appends not yet relayed")
        for alias, backlog in backlogs.items():
            if "error" in backlog:
                error = f"  {alias}: cannot be read: {backlog['error']}"
                self.stdout.write(self.style.ERROR(error))
                continue
            age = backlog["oldest_seconds"]
            oldest = "" if age is None else f", the oldest {humanize(timedelta(seconds=age))} old"
            line = f"  {alias}: {backlog['waiting']} waiting{oldest}"
            if backlog["held"]:
                line += f"; {backlog['held']} held after failing: {backlog['last_error']}"
            self.stdout.write(self.style.WARNING(line) if backlog["held"] else line)

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
        gated = pending["gated"]
        if any(gated.values()):
            self.stdout.write(
                f"  debounced starts waiting for their burst to end: {gated['debounced']}; "
                f"runs queued behind their key's active run (singleton): {gated['held']}"
            )
        oldest = pending["oldest_due"]
        if oldest is None:
            self.stdout.write("  nothing is due")
            return
        backlog = pending["due_by_tenant"]
        shown = ", ".join(f"{tenant} {count:,}" for tenant, count in list(backlog.items())[:10])
        more = f" and {len(backlog) - 10} more" if len(backlog) > 10 else ""
        self.stdout.write(f"  due by tenant (tenants take turns): {shown}{more}")
        line = (
            f"  oldest due: run {oldest['run_id']} ({oldest['workflow_name']}, tenant "
            f"{oldest['tenant_id']}, step {oldest['step']}, {oldest['suspension_type']}) "
            f"due since {oldest['due_since']}, lag {oldest['lag']}"
        )
        style = self.style.WARNING if oldest["lag_seconds"] > 60 else (lambda text: text)
        self.stdout.write(style(line))

    def _check(self, now: datetime, options: dict[str, Any]) -> None:
        if options["max_lag"] is None and options["max_heartbeat_age"] is None:
            raise CommandError("--max-lag off and --max-heartbeat-age off leave nothing to check")
        verdict = health(
            options["tenant"],
            now,
            max_lag=options["max_lag"],
            max_heartbeat_age=options["max_heartbeat_age"],
            host=options["host"],
        )
        if options["json"]:
            self.stdout.write(json.dumps(verdict, indent=2))
        elif verdict["healthy"]:
            due, worker = verdict["oldest_due"], verdict["worker"]
            lag = f"the oldest due run has waited {due['lag']}" if due else "nothing is due"
            seen = f"worker {worker['name']} passed {worker['age']} ago" if worker else "no worker"
            self.stdout.write(f"healthy: {lag}; {seen}")
        if not verdict["healthy"]:
            raise CommandError("unhealthy: " + "; ".join(verdict["problems"]))

    def _print_flow_control(self, flow: dict[str, list[dict[str, Any]]]) -> None:
        if not flow["queued"] and not flow["rate"]:
            return  # nothing waits for a limit: no section
        self.stdout.write(self.style.MIGRATE_HEADING("Flow control"))
        for row in flow["queued"]:
            key = f" key {row['key']!r}" if row["key"] else ""
            self.stdout.write(
                f"  {row['workflow_name']}{key} (tenant {row['tenant_id']}): "
                f"{row['queued']} queued, {row['why']}"
            )
        for row in flow["rate"]:
            self.stdout.write(
                f"  {row['workflow_name']} (tenant {row['tenant_id']}): "
                f"{row['waiting']} waiting, {row['why']}"
            )

    def _print_workers(self, rows: list[dict[str, Any]]) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING("Workers") + f"  {len(rows)} with a heartbeat")
        for row in rows:
            scope = ", ".join(row["tenants"]) if row["tenants"] else "every tenant"
            kind = "--loop" if row["loop"] else "one pass"
            line = f"  {row['name']}  {kind}, {scope}; last passed {row['age']} ago"
            self.stdout.write(line)
        for line in stale_workers(None, clock.now(), {row["name"] for row in rows}):
            self.stdout.write(self.style.WARNING("  " + line))

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
