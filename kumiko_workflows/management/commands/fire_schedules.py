"""``manage.py fire_schedules``: fire due cron slots once, without resuming runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiko_workflows.engine.cron import fire_due_schedules
from kumiko_workflows.engine.rehearsal import rehearse
from kumiko_workflows.management.arguments import aware_instant, refuse_writing_rehearsal


class Command(BaseCommand):
    help = (
        "Fire every due cron slot once (resume_due_runs does this each pass too). "
        "Prints how many runs were started."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--now",
            type=aware_instant,
            metavar="ISO",
            help=(
                "Fire as if it were this instant (with a UTC offset). Default: the current "
                "time. An instant later than the current time needs --dry-run or --write."
            ),
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Fire in a transaction rolled back at its end: print what would fire.",
        )
        parser.add_argument(
            "--write",
            action="store_true",
            help="With a --now later than the current time: fire its slots for real.",
        )

    def handle(
        self,
        *args: Any,
        now: datetime | None = None,
        dry_run: bool = False,
        write: bool = False,
        **options: Any,
    ) -> None:
        refuse_writing_rehearsal(now, dry_run, write)
        try:
            if dry_run:
                rehearsal = rehearse(lambda: fire_due_schedules(now=now))
                summary = f"started={rehearsal.result}"
                for line in rehearsal.report("fire_schedules", now, summary):
                    self.stdout.write(line)
                return
            started = fire_due_schedules(now=now)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"started {started} cron run{'s' if started != 1 else ''}")
