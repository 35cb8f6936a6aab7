"""``manage.py migrate_workflow_runs NAME --from 1 --to 2 [--tenant T] [--dry-run]``.

Moves the waiting runs of one version of a workflow to another, as the newer
version's ``migrates_from`` maps their steps: each gets
``workflow.run-migrated`` in its stream. All or nothing: a run the mapping
does not fit refuses the whole move, and nothing changes.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiko_workflows.engine.version_moves import migrate_workflow_runs
from kumiko_workflows.exceptions import InvalidArgument, MigrationRefused
from kumiko_workflows.management.arguments import positive_int


class Command(BaseCommand):
    help = (
        "Move the waiting runs of a workflow from one version to another, at the steps the "
        "newer version's migrates_from maps (recorded in each run's stream). All or nothing: "
        "if one run does not fit, none moves."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the workflow's name")
        parser.add_argument(
            "--from",
            dest="from_version",
            type=positive_int,
            required=True,
            metavar="N",
            help="the version the runs wait on",
        )
        parser.add_argument(
            "--to",
            dest="to_version",
            type=positive_int,
            required=True,
            metavar="N",
            help="the version to move them to (it declares migrates_from={N: {...}})",
        )
        parser.add_argument("--tenant", help="only this tenant's runs (default: all tenants)")
        parser.add_argument(
            "--dry-run", action="store_true", help="check and count the runs; move none"
        )
        parser.add_argument(
            "--by", default="", help="who moves them, recorded in each event (default: empty)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = migrate_workflow_runs(
                options["name"],
                options["from_version"],
                options["to_version"],
                tenant_id=options["tenant"],
                by=options["by"] or None,
                dry_run=options["dry_run"],
            )
        except (MigrationRefused, InvalidArgument) as exc:
            raise CommandError(str(exc)) from exc
        verb = "would move" if report.dry_run else "moved"
        for (old, new), count in sorted(report.steps.items()):
            self.stdout.write(f"  step {old} -> step {new}: {count} run(s)")
        if report.queued:
            self.stdout.write(
                f"  queued to start -> step 0 of version {report.to_version}: "
                f"{report.queued} run(s)"
            )
        self.stdout.write(
            self.style.SUCCESS(
                f"{report.workflow_name}: {verb} {report.moved} waiting run(s) from version "
                f"{report.from_version} to version {report.to_version}."
            )
        )
