"""``manage.py distribute_workflow_tables [--shard-count N] [--offline] [--check]``.

Distributes the engine's tenant tables by ``tenant_id`` on a Citus
coordinator, co-located with the event table; the tenant-less tables stay
on the coordinator (:mod:`kumiko_workflows.operations.distribute`). Refuses,
exit 1, anywhere else.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiko_workflows.management.arguments import positive_int
from kumiko_workflows.operations.distribute import (
    NotDistributable,
    TableLayout,
    citus_problem,
    distribute,
    layout,
)


class Command(BaseCommand):
    help = (
        "Distribute the workflow tables over the Citus worker nodes by tenant_id, co-located "
        "with the event table (tables that hold rows online, while reads and writes go on); "
        "worker heartbeats and deployed definitions stay on the coordinator. Idempotent. "
        "Refuses on a database that is not a Citus coordinator."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--shard-count",
            type=positive_int,
            default=None,
            metavar="N",
            help="shards of the tables' co-location group (default: Citus's citus.shard_count)",
        )
        parser.add_argument(
            "--offline",
            action="store_true",
            help="copy rows with create_distributed_table, holding writes off while it copies "
            "(default: online, create_distributed_table_concurrently, for tables with rows)",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="change nothing: print each table's kind; exit 1 if a tenant table is not "
            "distributed",
        )

    def handle(
        self, *args: Any, shard_count: int | None, offline: bool, check: bool, **options: Any
    ) -> None:
        if check:
            problem = citus_problem()
            if problem is not None:
                raise CommandError(f"cannot check the distribution: {problem}")
            rows = layout()
            for row in rows:
                self._line(row, f"{row.current}, wanted {row.wanted}")
            missing = [row.table for row in rows if not row.done]
            if missing:
                raise CommandError(
                    f"{len(missing)} table(s) not laid out for Citus: {', '.join(missing)}; "
                    "run `manage.py distribute_workflow_tables`"
                )
            return
        try:
            distribute(
                shard_count=shard_count,
                online=False if offline else None,
                progress=lambda row: self._line(row, row.action),
            )
        except NotDistributable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            "Done. Processes connected before this keep their plain-PostgreSQL statements "
            "until they reconnect: restart web processes and workers."
        )

    def _line(self, row: TableLayout, what: str) -> None:
        self.stdout.write(f"{row.table}: {what}")
