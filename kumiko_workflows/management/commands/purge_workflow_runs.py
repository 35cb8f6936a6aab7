"""``manage.py purge_workflow_runs``: remove runs that finished before a cut-off.

A thin wrapper of :func:`kumiko_workflows.operations.purge.purge_runs`: progress on
stderr, one summary line on stdout, a non-zero exit for bad input, for a
run asked for by id that was refused, and for any error.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiko_workflows.exceptions import InvalidArgument
from kumiko_workflows.management.arguments import positive_int
from kumiko_workflows.operations.cutoff import default_retention, parse_cutoff
from kumiko_workflows.operations.progress import Progress
from kumiko_workflows.operations.purge import DEFAULT_BATCH, MAX_BATCH, PurgeReport, purge_runs


class Command(BaseCommand):
    help = (
        "Remove the workflow runs that completed, failed or were cancelled before a cut-off: "
        "their run streams (the engine's own events; domain events are never touched), status "
        "rows and leftovers, in batches of one short transaction each. A tombstone per run "
        "keeps its idempotency key used."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--finished-before",
            metavar="WHEN",
            help=(
                "An ISO 8601 duration (P30D: runs finished more than 30 days ago) or instant "
                "with a UTC offset (2026-01-31T00:00:00Z; not in the future). Default: "
                "KUMIKO_WORKFLOWS['RETENTION']."
            ),
        )
        parser.add_argument(
            "--batch",
            type=positive_int,
            default=DEFAULT_BATCH,
            metavar="N",
            help=f"Runs per transaction, at most {MAX_BATCH} (default: %(default)s).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be removed; change nothing."
        )
        parser.add_argument("--workflow", metavar="NAME", help="Only runs of this workflow.")
        parser.add_argument("--tenant", metavar="T", help="Only runs of this tenant.")
        parser.add_argument(
            "--run",
            action="append",
            dest="runs",
            metavar="RUN_ID",
            help="Only this run (repeat for several); one not finished is refused (exit 1).",
        )
        parser.add_argument(
            "--archive",
            metavar="PATH",
            help=(
                "First append every removed event to PATH as gzip-compressed JSON lines "
                "(one gzip member per batch, on disk before the batch commits); read it with "
                "`zcat PATH | jq`."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        given = options["finished_before"]
        when = given if given is not None else default_retention()
        if when is None:
            raise CommandError(
                "give --finished-before (e.g. P30D), or set KUMIKO_WORKFLOWS['RETENTION']"
            )
        source = "--finished-before" if given is not None else "KUMIKO_WORKFLOWS['RETENTION']"
        try:
            parse_cutoff(when)
        except InvalidArgument as exc:
            raise CommandError(f"{source} {exc}") from None
        verbosity = options["verbosity"]
        bar: Progress | None = None

        def progress(report: PurgeReport) -> None:
            nonlocal bar
            if verbosity < 1:
                return
            if bar is None:
                bar = Progress(report.total, "Purging finished runs", self.stderr)
            bar.update(report.runs + report.passed_over, f"events={report.events}")

        started = time.monotonic()
        try:
            report = purge_runs(
                when,
                tenant_id=options["tenant"],
                workflow_name=options["workflow"],
                run_ids=options["runs"],
                batch_size=options["batch"],
                dry_run=options["dry_run"],
                archive=options["archive"],
                progress=progress,
            )
        except InvalidArgument as exc:
            raise CommandError(str(exc)) from None
        finally:
            if bar is not None:
                bar.finish()
        elapsed = time.monotonic() - started
        for run_id in report.already_purged:
            self.stdout.write(f"run {run_id}: already purged")
        for run_id, why in report.refused:
            self.stderr.write(f"run {run_id} not purged: {why}")
        cutoff = report.cutoff.isoformat()
        if report.dry_run:
            counts = " ".join(
                f"{name}={value}"
                for name, value in report.counts().items()
                if name != "passed_over"
            )
            self.stdout.write(
                f"dry run, nothing changed; would purge {counts} (finished before {cutoff})"
            )
        else:
            where = f"; archived to {options['archive']}" if options["archive"] else ""
            self.stdout.write(
                f"purged {report} (finished before {cutoff}) in {report.batches} batch(es), "
                f"{elapsed:.1f} s{where}"
            )
        if report.refused:
            raise CommandError(f"{len(report.refused)} run(s) asked for were not purged")
