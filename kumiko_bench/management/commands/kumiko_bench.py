"""``manage.py kumiko_bench``: the engine's throughput and latency beside its floors.

Scenarios live in :mod:`kumiko_bench.scenarios`. Each prints
``RESULT name=kumiko_<scenario> n=<N> seconds=<S> per_sec=<R>`` and, where it
has a baseline measured in the same run, ``RATIO name=<scenario> value=<x>``;
a table for people follows. Everything happens in a scratch database the
command creates and drops (:mod:`kumiko_bench.scratch`). ``--worker`` is
internal: the command starts itself again as its worker processes.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from kumiko_workflows.management.arguments import positive_float, positive_int


class Command(BaseCommand):
    help = (
        "Benchmark the event store and the resume loop against hand-written SQL, in a scratch "
        "database created beside the configured one and dropped afterwards. Use PostgreSQL "
        "for real figures."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        from kumiko_bench.scenarios import DEFAULT_N, SCENARIOS, SLOW_SECONDS

        parser.add_argument(
            "--scenario",
            action="append",
            choices=SCENARIOS,
            dest="scenarios",
            metavar="NAME",
            help=f"Run only this scenario (repeat for several): {', '.join(SCENARIOS)}. "
            "Default: all.",
        )
        parser.add_argument(
            "--n",
            type=positive_int,
            metavar="N",
            help="Size of every scenario (memory drains N then 10*N runs; slow_step has N "
            f"quick runs beside its slow one). Default per scenario: {DEFAULT_N}, memory 5000 "
            "then 50000.",
        )
        parser.add_argument(
            "--slow-seconds",
            type=positive_float,
            default=SLOW_SECONDS,
            metavar="S",
            help="How long the slow run's step sleeps in slow_step (default: %(default)s).",
        )
        parser.add_argument(
            "--rounds",
            type=positive_int,
            default=3,
            metavar="R",
            help="Rounds of engine and baseline, interleaved; ratios are medians "
            "(default: %(default)s).",
        )
        parser.add_argument(
            "--dashboard-data",
            metavar="NAME",
            help="PostgreSQL: the dashboard scenario copies its data from database NAME when "
            "NAME holds data of the same size (skipping the seed), else seeds and keeps a copy "
            "as NAME, never analysed, for the next run (an existing NAME the bench did not keep "
            "is refused). NAME is not dropped: drop it when done.",
        )
        parser.add_argument("--json", metavar="PATH", help="Also write the results as JSON.")
        parser.add_argument("--worker", help="internal: run as a worker process")
        parser.add_argument("--tenant", help="internal: the bench tenant of a worker")
        parser.add_argument("--scratch", help="internal: the scratch database of a worker")
        parser.add_argument(
            "--batch-size", type=positive_int, help="internal: BATCH_SIZE of a drain worker"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["worker"]:
            if not options["scratch"]:
                raise CommandError("--worker needs --scratch: workers run in the scratch database")
            from kumiko_bench.scenarios import worker_main

            def out(line: str) -> None:
                self.stdout.write(line)
                self.stdout.flush()

            worker_main(
                options["worker"],
                options["tenant"],
                options["scratch"],
                out,
                batch_size=options["batch_size"],
            )
            return

        if settings.DEBUG:
            raise CommandError(
                "kumiko_bench measures what production runs: use settings with DEBUG = False, "
                "such as --settings kumiko_bench.settings (with DEBUG on, Django keeps every "
                "query in memory)"
            )
        from kumiko_bench.scenarios import SCENARIOS, Bench, worker_environment

        command, env = worker_environment()
        bench = Bench(
            n=options["n"],
            rounds=options["rounds"],
            out=self.stdout.write,
            worker_command=command,
            worker_env=env,
            slow_seconds=options["slow_seconds"],
            dashboard_data=options["dashboard_data"],
        )
        scenarios = options["scenarios"] or list(SCENARIOS)
        self.stdout.write(
            f"kumiko_bench: {connection.vendor} {connection.settings_dict['NAME']} "
            f"tenant={bench.tenant} scenarios={','.join(scenarios)} rounds={bench.rounds}"
        )
        try:
            bench.run(scenarios)
        except Exception as exc:
            raise CommandError(f"kumiko_bench failed: {exc}") from exc
        finally:
            self.stdout.write("")
            self.stdout.write(bench.report_table())
            if options["json"]:
                with open(options["json"], "w") as handle:
                    json.dump(bench.as_json(), handle, indent=2, default=str)
