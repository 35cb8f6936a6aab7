"""``manage.py resume_due_runs``: one pass for cron, or ``--loop`` as a worker."""

from __future__ import annotations

import logging
from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, InterfaceError

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.worker import PassResult, Worker

_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise ArgumentTypeError(f"{text!r}: must be greater than 0")
    return value


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
                "KUMIKO_WORKFLOWS['WORKER_INTERVAL'] (%(default)s = from settings)."
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
        package_logger.setLevel(_LEVELS.get(options["verbosity"], logging.DEBUG))
        if not package_logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(self.stderr._out)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
            )
            package_logger.addHandler(handler)

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

        worker = Worker(
            tenants=options["tenants"],
            limit=options["limit"],
            interval=options["interval"] or workflow_settings.WORKER_INTERVAL,
            max_runs=options["max_runs"] if options["loop"] else None,
            cron=options["cron"],
            on_pass=report,
        )
        if options["loop"]:
            worker.run_forever()
            if verbosity >= 1:
                self.stdout.write(f"resume_due_runs: stopped after {worker.processed} run(s)")
            return
        try:
            result = worker.run_once()
        except (DatabaseError, InterfaceError) as exc:
            raise CommandError(f"the database is unavailable: {exc}".strip()) from exc
        if result.report.errors:
            raise CommandError(f"{result.report.errors} run(s) hit an error and were not resumed")
