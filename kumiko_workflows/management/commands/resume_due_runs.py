"""``manage.py resume_due_runs``: one pass for cron, or ``--loop`` as a worker."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, InterfaceError

from kumiko_workflows.engine.worker import PassResult, Worker
from kumiko_workflows.management.arguments import positive_float, positive_int

_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}


class Command(BaseCommand):
    help = (
        "Resume every due workflow run (and fire due cron slots). One pass by default, "
        "for cron; --loop runs as a worker until SIGTERM/SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--tenant",
            action="append",
            dest="tenants",
            metavar="T",
            help="Only this tenant (repeat for several). Default: every tenant with due runs.",
        )
        parser.add_argument(
            "--limit",
            type=positive_int,
            metavar="N",
            help="Resume at most N runs per pass. Default: no limit.",
        )
        parser.add_argument(
            "--loop",
            action="store_true",
            help="Keep running: sleep until the next run is due (or NOTIFY on PostgreSQL).",
        )
        parser.add_argument(
            "--interval",
            type=positive_float,
            metavar="S",
            help=(
                "With --loop, the longest sleep between passes in seconds. Default: "
                "KUMIKO_WORKFLOWS['WORKER_INTERVAL'] (5 unless set)."
            ),
        )
        parser.add_argument(
            "--max-runs",
            type=positive_int,
            metavar="N",
            help="With --loop, exit 0 after processing N runs (to recycle workers).",
        )
        parser.add_argument(
            "--no-cron",
            action="store_false",
            dest="cron",
            help="Do not fire due cron schedules.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        package_logger = logging.getLogger("kumiko_workflows")
        previous_level = package_logger.level
        package_logger.setLevel(_LEVELS.get(options["verbosity"], logging.DEBUG))
        handler = None
        if not package_logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
            )
            package_logger.addHandler(handler)
        try:
            self._run(options)
        finally:
            package_logger.setLevel(previous_level)
            if handler is not None:
                package_logger.removeHandler(handler)

    def _run(self, options: dict[str, Any]) -> None:
        verbosity = options["verbosity"]

        def report(result: PassResult) -> None:
            busy = result.report.processed or result.fired
            if verbosity >= 2 or (verbosity >= 1 and (busy or not options["loop"])):
                self.stdout.write(f"resume_due_runs: {result}")
            if result.report.errors:
                self.stderr.write(
                    f"resume_due_runs: {result.report.errors} run(s) could not be resumed; "
                    "see the log for each"
                )
            if result.cron_errors:
                self.stderr.write("resume_due_runs: cron schedules could not fire; see the log")

        worker = Worker(
            tenants=options["tenants"],
            limit=options["limit"],
            interval=options["interval"],
            max_runs=options["max_runs"] if options["loop"] else None,
            cron=options["cron"],
            on_pass=report,
            loop=options["loop"],
        )
        if options["loop"]:
            worker.run_forever()
            if verbosity >= 1:
                self.stdout.write(f"resume_due_runs: stopped after {worker.processed} run(s)")
            if worker.errors:
                raise CommandError(f"the worker met {worker.errors} error(s); see the log")
            return
        try:
            result = worker.run_once()
        except (DatabaseError, InterfaceError) as exc:
            raise CommandError(f"the database is unavailable: {exc}".strip()) from exc
        if result.errors:
            raise CommandError(
                f"{result.report.errors} run(s) could not be resumed and "
                f"{result.cron_errors} cron pass(es) failed; see the log"
            )
