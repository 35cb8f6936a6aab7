"""``manage.py rebuild_workflow_projections [--check]``.

Rebuilds the pending and run-status tables from the event store in one
transaction; ``--check`` compares them with the events instead, prints every
difference and exits 1 if there is any.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiko_workflows.operations.progress import Progress
from kumiko_workflows.operations.rebuild import RebuildResult, rebuild


class Command(BaseCommand):
    help = (
        "Rebuild the WorkflowRun and WorkflowRunPending tables from the event store, in "
        "one transaction (writers to them wait). With --check, change nothing: compare the "
        "tables with the events, print the differences and exit 1 if there are any."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--check",
            action="store_true",
            help="compare only; exit 1 if a row differs from what the events give",
        )
        parser.add_argument(
            "--show",
            type=int,
            default=100,
            metavar="N",
            help="print at most N differences (default: %(default)s)",
        )

    def handle(self, *args: Any, check: bool, show: int, verbosity: int, **options: Any) -> None:
        bar: Progress | None = None

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if verbosity < 1:
                return
            if bar is None:
                bar = Progress(total, "Replaying events", self.stderr)
            bar.update(done)

        result = rebuild(apply=not check, progress=progress)
        if bar is not None:
            bar.finish()
        self._report(result, show)
        if check and result.differences:
            raise CommandError(
                f"{len(result.differences)} row(s) differ from the event store; "
                "run `manage.py rebuild_workflow_projections` to rebuild them."
            )

    def _report(self, result: RebuildResult, show: int) -> None:
        for difference in result.differences[: max(0, show)]:
            self.stdout.write(str(difference))
        hidden = len(result.differences) - max(0, show)
        if hidden > 0:
            self.stdout.write(f"... and {hidden} more")
        tables = f"{result.runs} run(s) and {result.pending} pending row(s)"
        if not result.applied:
            if not result.differences:
                self.stdout.write(
                    self.style.SUCCESS(
                        f"No differences: {tables} match the {result.events} replayed event(s)."
                    )
                )
            return
        changed = (
            f"{len(result.differences)} row(s) differed from before"
            if result.differences
            else "no row differed from before"
        )
        self.stdout.write(
            self.style.SUCCESS(f"Rebuilt {tables} from {result.events} event(s); {changed}.")
        )
