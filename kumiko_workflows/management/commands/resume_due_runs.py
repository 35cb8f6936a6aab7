"""``manage.py resume_due_runs``: one pass for cron, or ``--loop`` as a worker."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, InterfaceError

from kumiko_workflows.engine.worker import PassResult, Worker
from kumiko_workflows.exceptions import WorkerAlreadyRunning
from kumiko_workflows.management import reloading
from kumiko_workflows.management.arguments import (
    aware_instant,
    positive_float,
    positive_int,
    refuse_writing_rehearsal,
    tenant_id,
)
from kumiko_workflows.store import claims
from kumiko_workflows.tasks import names

logger = logging.getLogger(__name__)
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
            type=tenant_id,
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
            "--reload",
            action="store_true",
            help=(
                "With --loop, for development: restart the worker when a Python file changes "
                "(Django's autoreloader, as runserver), after the current run finishes."
            ),
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
            help=(
                "With --loop, exit 0 once N runs were completed, suspended again or failed "
                "(to recycle workers)."
            ),
        )
        parser.add_argument(
            "--now",
            type=aware_instant,
            metavar="ISO",
            help=(
                "One pass as if it were this instant, with a UTC offset "
                "(e.g. 2030-01-01T09:00:00+00:00): resume what is due then and fire the cron "
                "slots due then, for tests and rehearsals. Not with --loop. An instant later "
                "than the current time needs --dry-run or --write."
            ),
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help=(
                "One pass in a transaction rolled back at its end: print what it would resume "
                "and fire, and write nothing (a step's own calls outside the database still "
                "happen). Not with --loop."
            ),
        )
        parser.add_argument(
            "--write",
            action="store_true",
            help=(
                "With a --now later than the current time: write the pass for real (resume "
                "runs early, fire the cron slots due then and move their schedules)."
            ),
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="Q",
            help=(
                "Only the tasks of this Django Tasks queue (repeat for several; "
                "kumiko_workflows.tasks); no other runs. Default: every run."
            ),
        )
        parser.add_argument(
            "--no-cron",
            action="store_false",
            dest="cron",
            help="Do not fire due cron schedules.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        queues = options.get("queues")
        only = None if not queues else [names.workflow_name(queue) for queue in queues]
        with claims.claiming_only(only):
            self._handle(*args, **options)

    def _handle(self, *args: Any, **options: Any) -> None:
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
        if options["loop"] and options["now"] is not None:
            raise CommandError(
                "--now makes one pass at a fixed instant; a --loop worker runs on the clock"
            )
        if options["loop"] and options["dry_run"]:
            raise CommandError("--dry-run makes one pass and rolls it back; a --loop worker writes")
        refuse_writing_rehearsal(options["now"], options["dry_run"], options["write"])
        if options["reload"] and not options["loop"]:
            raise CommandError("--reload restarts a --loop worker when files change: add --loop")
        if options["reload"] and not reloading.in_child():
            raise SystemExit(reloading.supervise())  # the child runs the worker

        def started(line: str) -> None:
            if verbosity >= 1:
                self.stdout.write(f"resume_due_runs: worker started {line}")

        def report(result: PassResult) -> None:
            # A one-shot pass always says what it did; a loop worker only when it
            # did something (or at -v 3), so an idle worker's log stays quiet.
            # A dry run says it after what it would have written.
            shown = not options["loop"] or not result.idle or verbosity >= 3
            shown = shown and not options["dry_run"]
            if verbosity >= 1 and shown:
                self.stdout.write(f"resume_due_runs: {result}")
            if result.report.errors:
                self.stderr.write(
                    f"resume_due_runs: {result.report.errors} run(s) could not be resumed; "
                    "see the log for each"
                )
            if result.cron_errors:
                self.stderr.write("resume_due_runs: cron schedules could not fire; see the log")
            if result.report.relay_errors:
                self.stderr.write(
                    f"resume_due_runs: {result.report.relay_errors} outbox append(s) could not "
                    "be relayed (they stay in the outbox); see the log"
                )

        worker = Worker(
            tenants=options["tenants"],
            limit=options["limit"],
            interval=options["interval"],
            max_runs=options["max_runs"] if options["loop"] else None,
            cron=options["cron"],
            on_pass=report,
            on_start=started,
            loop=options["loop"],
            heartbeat=not options["dry_run"],
        )
        if options["loop"]:
            changed: list[str] = []
            if options["reload"]:

                def restart(path: str) -> None:
                    changed.append(path)
                    logger.warning(
                        "%s changed: finishing the current run, then restarting with the new code",
                        path,
                    )
                    worker.stop()

                reloading.watch(restart)
            try:
                worker.run_forever()
            except WorkerAlreadyRunning as exc:
                raise CommandError(str(exc)) from exc
            if verbosity >= 1:
                self.stdout.write(
                    f"resume_due_runs: stopped after {worker.passes} pass(es): "
                    f"{worker.totals} fired={worker.fired}"
                )
            if changed:
                self.stdout.write(f"resume_due_runs: restarting: {changed[0]} changed")
                raise SystemExit(reloading.RELOAD_EXIT)
            if worker.errors:
                raise CommandError(f"the worker met {worker.errors} error(s); see the log")
            return
        try:
            if options["dry_run"]:
                rehearsal = worker.rehearse(now=options["now"])
                if verbosity >= 1:
                    summary = str(rehearsal.result)
                    for line in rehearsal.report("resume_due_runs", options["now"], summary):
                        self.stdout.write(line)
                result = rehearsal.result
            else:
                result = worker.run_single_pass(now=options["now"])
        except WorkerAlreadyRunning as exc:
            raise CommandError(str(exc)) from exc
        except (DatabaseError, InterfaceError) as exc:
            raise CommandError(f"the database is unavailable: {exc}".strip()) from exc
        if result.errors:
            relays = result.report.relay_errors
            raise CommandError(
                f"{result.report.errors} run(s) could not be resumed and "
                f"{result.cron_errors} cron pass(es) failed"
                + (f" and {relays} outbox relay(s) failed" if relays else "")
                + "; see the log"
            )
