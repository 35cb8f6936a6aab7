"""``manage.py workflow_versions [--check] [--tenant T] [--json]``.

Each workflow's versions: declared in the code or not, and how many runs are
in flight on each. ``--check`` (for deploy pipelines) exits 1, naming the
workflow, version and count, when runs are in flight on a version the code
no longer declares, or changed in place at or before the step they wait at
(naming the step and the change): they would fail at resume. Waiting runs an
edit does not touch (steps after them) resume on it and are counted apart.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiko_workflows.management.arguments import tenant_id
from kumiko_workflows.operations.version_table import version_lines, version_table


class Command(BaseCommand):
    help = (
        "Show each workflow's versions: declared in the code or not, runs in flight (running "
        "or waiting) and how many of them would fail at resume. With --check, exit 1 if any "
        "would: runs in flight on a version the code no longer declares, or that wait at or "
        "after a step changed in place."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--check",
            action="store_true",
            help="exit 1 if runs in flight would fail at resume (for deploy pipelines)",
        )
        parser.add_argument(
            "--tenant", type=tenant_id, help="only this tenant's runs (default: all tenants)"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, check: bool, tenant: str | None, **options: Any) -> None:
        rows = version_table(tenant)
        if options["json"]:
            data = {"tenant": tenant, "versions": [row.as_dict() for row in rows]}
            self.stdout.write(json.dumps(data, indent=2))
        else:
            scope = f"tenant {tenant!r}" if tenant else "all tenants"
            self.stdout.write(self.style.MIGRATE_HEADING(f"Workflow versions ({scope})"))
            if not rows:
                self.stdout.write("  no workflows and no runs in flight")
            for line in version_lines(rows) if rows else []:
                self.stdout.write("  " + line)
        problems = [problem for row in rows if (problem := row.problem())]
        if not check:
            return
        for problem in problems:
            self.stderr.write(problem)
        if problems:
            raise CommandError(
                f"{len(problems)} workflow version(s) have runs in flight that would fail at "
                "resume: declare those versions again beside the new ones until their runs "
                "drain, or move the runs with `manage.py migrate_workflow_runs`."
            )
