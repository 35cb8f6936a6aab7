"""``manage.py demo``: the order workflow's whole lifecycle in a few seconds.

Places a few dozen orders; pays most of them, some late; leaves some unpaid
until their payment window closes; gives some a card the provider declines a
few times (retried with backoff) and a few a card it always declines (the run
fails); has support cancel a few. Runs ``resume_due_runs`` until every run has
finished, with live progress, then prints the runs by final status, one run's
timeline, and how to look at it all in the admin.
"""

from __future__ import annotations

import logging
import time
import uuid
from argparse import ArgumentTypeError
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from kumiko_workflows import append_event, cancel_run, resume_due_runs, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.management.arguments import positive_int
from kumiko_workflows.models import SETTLED_STATUSES, Event, RunStatus, WorkflowRun
from kumiko_workflows.operations.explain import timeline
from kumiko_workflows.operations.progress import Progress

WORKFLOW = "order-fulfilment"
#: The child workflow of the order's per-line fan-out.
LINES = "order-line-reservation"
#: Seconds between worker passes (real ones, or simulated with --fast).
TICK = 0.2
#: Seconds (real or simulated) after which the demo gives up on unfinished runs.
DEADLINE = 45.0


@dataclass(frozen=True)
class Kind:
    """One kind of customer: when they pay (None: never) and how their card behaves."""

    name: str
    pays_at: float | None
    declines: int = 0
    window: str = "PT20S"
    cancelled_at: float | None = None


KINDS = {
    "prompt": Kind("prompt", pays_at=0.6),
    "late": Kind("late", pays_at=3.0),
    "flaky": Kind("flaky", pays_at=1.0, declines=2),
    "unpaid": Kind("unpaid", pays_at=None, window="PT4S"),
    "hopeless": Kind("hopeless", pays_at=1.0, declines=99),
    "support": Kind("support", pays_at=None, window="P3D", cancelled_at=2.4),
}
#: Twelve orders' mix, repeated: most pay, some late, some never.
MIX = [
    "prompt",
    "flaky",
    "prompt",
    "unpaid",
    "late",
    "prompt",
    "flaky",
    "hopeless",
    "prompt",
    "unpaid",
    "late",
    "support",
]


def order_count(text: str) -> int:
    number = positive_int(text)
    if number > 1000:
        raise ArgumentTypeError(f"{text!r}: at most 1000 orders")
    return number


class Clock:
    """Real time, or (``--fast``) a simulated clock that jumps instead of sleeping."""

    def __init__(self, fast: bool) -> None:
        self.fast = fast
        self.start = timezone.now()
        self._start_monotonic = time.monotonic()
        self.elapsed = 0.0

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed)

    def tick(self) -> None:
        if self.fast:
            self.elapsed += TICK
        else:
            time.sleep(TICK)
            self.elapsed = time.monotonic() - self._start_monotonic


@dataclass
class Order:
    number: int
    kind: Kind
    order_id: uuid.UUID
    run_id: uuid.UUID
    tenant: str
    paid: bool = False
    cancelled: bool = False


class Command(BaseCommand):
    help = (
        "Run the example shop: place orders, pay some, let others time out, retry flaky "
        "charges, and resume runs until every one has finished (about ten seconds)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--orders",
            type=order_count,
            default=36,
            help="how many orders to place, 1-1000 (default: %(default)s)",
        )
        parser.add_argument(
            "--fast",
            action="store_true",
            help="simulate the clock instead of waiting (for tests: done in a second)",
        )
        parser.add_argument(
            "--tenant", help="tenant of the orders (default: KUMIKO_WORKFLOWS DEFAULT_TENANT)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if Event._meta.db_table not in connection.introspection.table_names():
            raise CommandError(
                "The database has no kumiko_workflows tables yet: run "
                "`python manage.py migrate` first."
            )
        tenant = options["tenant"] or workflow_settings.DEFAULT_TENANT
        clock = Clock(options["fast"])
        quiet = options["verbosity"] < 2
        # The failures are the point of the demo: keep their log lines out of
        # the way unless asked (-v 2).
        engine_log = logging.getLogger("kumiko_workflows")
        saved_level = engine_log.level
        if quiet:
            engine_log.setLevel(logging.CRITICAL)
        try:
            orders = self._place(options["orders"], tenant)
            self._run(orders, clock)
        finally:
            engine_log.setLevel(saved_level)
        self._summary(orders, clock)

    # --- the story ----------------------------------------------------------------

    def _say(self, text: str) -> None:
        self.stdout.write(text)

    def _place(self, count: int, tenant: str) -> list[Order]:
        self._say(
            self.style.MIGRATE_HEADING(
                f"Placing {count} orders (workflow {WORKFLOW!r}, tenant {tenant!r})"
            )
        )
        orders = []
        for number in range(1, count + 1):
            kind = KINDS[MIX[(number - 1) % len(MIX)]]
            order_id = uuid.uuid4()
            append_event(
                order_id,
                "order",
                "order.placed",
                {
                    "order_id": str(order_id),
                    "number": number,
                    "items": [{"sku": f"SKU-{number % 7 + 1}", "quantity": number % 3 + 1}],
                    "payment_window": kind.window,
                    "declines": kind.declines,
                    "retry_base": "PT1S",
                    "ship_after": "PT2S",
                },
                tenant_id=tenant,
                created_by="demo",
            )
            run_id = run_id_for(WORKFLOW, str(order_id), tenant)
            orders.append(Order(number, kind, order_id, run_id, tenant))
        mix = Counter(order.kind.name for order in orders)
        self._say(
            "  "
            + ", ".join(f"{n} {name}" for name, n in mix.items())
            + "\n  prompt/late: pay after 0.6 s / 3 s; flaky: the card is declined twice; "
            "hopeless: always declined;\n  unpaid: never pay (4 s window); support: "
            "cancelled by support after 2.4 s"
        )
        return orders

    def _run(self, orders: list[Order], clock: Clock) -> None:
        by_run = {order.run_id: order for order in orders}
        self._say(
            self.style.MIGRATE_HEADING("Running the worker")
            + ("  (simulated clock)" if clock.fast else "")
        )
        progress = Progress(len(orders), "runs finished", self.stdout, interval=1.0)
        started = time.monotonic()
        while True:
            self._customers(orders, clock, progress)
            report = resume_due_runs(now=clock.now())
            statuses = self._statuses(by_run)
            finished = sum(n for status, n in statuses.items() if status in SETTLED_STATUSES)
            detail = "  ".join(f"{status} {n}" for status, n in sorted(statuses.items()))
            progress.update(finished, detail)
            if report.errors:
                progress.finish()
                raise CommandError(f"the worker could not resume {report.errors} run(s)")
            if finished == len(orders):
                break
            if clock.elapsed > DEADLINE or time.monotonic() - started > DEADLINE:
                progress.finish()
                raise CommandError(
                    f"{len(orders) - finished} run(s) had not finished after {DEADLINE:.0f} s: "
                    "see `python manage.py workflow_status`"
                )
            clock.tick()
        progress.finish()
        took = "simulated " if clock.fast else ""
        self._say(f"  every run finished after {took}{clock.elapsed:.1f} s")

    def _customers(self, orders: list[Order], clock: Clock, progress: Progress) -> None:
        """What customers and support do by now: payments and cancellations."""
        paying = [
            o
            for o in orders
            if not o.paid and o.kind.pays_at is not None and clock.elapsed >= o.kind.pays_at
        ]
        for order in paying:
            append_event(
                uuid.uuid4(),
                "payment",
                "order.paid",
                {"order_id": str(order.order_id), "amount": 10 + order.number},
                tenant_id=order.tenant,
                created_by="demo",
            )
            order.paid = True
        if paying:
            progress.note(f"  +{clock.elapsed:4.1f} s  {len(paying)} customer(s) paid")
        cancelling = [
            o
            for o in orders
            if not o.cancelled
            and o.kind.cancelled_at is not None
            and clock.elapsed >= o.kind.cancelled_at
        ]
        for order in cancelling:
            # The reservations are released (the fan-out's compensation), then it ends cancelled.
            cancel_run(
                order.run_id, "the customer changed their mind", by="demo-support", compensate=True
            )
            order.cancelled = True
        if cancelling:
            progress.note(
                f"  +{clock.elapsed:4.1f} s  support cancelled {len(cancelling)} order(s)"
            )

    @staticmethod
    def _statuses(by_run: dict[uuid.UUID, Order]) -> dict[str, int]:
        rows = (
            WorkflowRun.objects.filter(run_id__in=list(by_run))
            .order_by()
            .values("status")
            .annotate(n=Count("run_id"))
        )
        return {row["status"]: row["n"] for row in rows}

    # --- the end --------------------------------------------------------------------

    @staticmethod
    def _outcome(run: WorkflowRun, retries: int, shipped: bool, released: bool) -> str:
        undone = ", reservations released" if released else ""
        if run.status == RunStatus.FAILED:
            return f"failed: {run.failure_reason} at step {run.step} ({run.error_class}){undone}"
        if run.status == RunStatus.CANCELLED:
            return f"cancelled by support{undone}"
        if run.status != RunStatus.COMPLETED:
            return run.status
        if not shipped:
            return "not paid in time: order cancelled"
        return "paid, charged and shipped" + (f" (charge retried {retries}x)" if retries else "")

    def _summary(self, orders: list[Order], clock: Clock) -> None:
        order_of = {o.run_id: o for o in orders}
        runs = sorted(
            WorkflowRun.objects.filter(run_id__in=list(order_of)),
            key=lambda run: order_of[run.run_id].number,
        )
        # A stream is (tenant, id): read the demo's streams in its tenant.
        events = Event.objects.filter(tenant_id__in={o.tenant for o in orders})
        retries = Counter(
            events.filter(
                aggregate_id__in=[r.run_id for r in runs], type=et.RETRY_SCHEDULED
            ).values_list("aggregate_id", flat=True)
        )
        shipped = set(
            events.filter(
                type="order.shipped", aggregate_id__in=[o.order_id for o in orders]
            ).values_list("aggregate_id", flat=True)
        )
        released = set(
            events.filter(
                type="order.stock-released", aggregate_id__in=[o.order_id for o in orders]
            ).values_list("aggregate_id", flat=True)
        )
        rows = Counter(
            (
                run.status,
                self._outcome(
                    run,
                    retries[run.run_id],
                    order_of[run.run_id].order_id in shipped,
                    order_of[run.run_id].order_id in released,
                ),
            )
            for run in runs
        )
        self._say(self.style.MIGRATE_HEADING("Runs by final status"))
        self._say(f"  {'status':<10} {'runs':>4}  what happened")
        for (status, outcome), n in sorted(rows.items(), key=lambda item: (item[0][0], -item[1])):
            self._say(f"  {status:<10} {n:>4}  {outcome}")
        self._say(f"  {'total':<10} {len(runs):>4}")
        lines = WorkflowRun.objects.filter(parent_run_id__in=list(order_of))
        self._say(
            self.style.MIGRATE_HEADING("Fan-out and compensation")
            + f"\n  {lines.count()} line reservations ran as child runs "
            f"(workflow {LINES!r}), one per order line, "
            "each order waiting for all of its lines"
            + f"\n  {len(released)} order(s) had their reservations released by the fan-out's "
            "compensation (the charge failed for good, or support cancelled)"
        )

        example = self._example(runs, retries)
        if example is not None:
            order = next(o for o in orders if o.run_id == example.run_id)
            self._say(
                self.style.MIGRATE_HEADING(
                    f"Timeline of order #{order.number} ({order.kind.name}), run {example.run_id}"
                )
            )
            self._print_timeline(example)

        self._say(
            self.style.MIGRATE_HEADING("Look around in the admin")
            + "\n  python manage.py createsuperuser"
            + "\n  python manage.py runserver"
            + "\n  then open http://127.0.0.1:8000/admin/kumiko_workflows/workflowrun/"
            + "\n  (filter by status 'failed' and open one to see why; 'Rerun' runs it again)"
            + "\n  More: python manage.py workflow_status --failed"
            + "\n        python manage.py rebuild_workflow_projections --check"
        )

    @staticmethod
    def _example(runs: list[WorkflowRun], retries: Counter) -> WorkflowRun | None:
        """A run worth reading: completed after its charge was retried, if there is one."""
        retried = [r for r in runs if r.status == RunStatus.COMPLETED and retries[r.run_id]]
        return (retried or runs or [None])[0]

    def _print_timeline(self, run: WorkflowRun) -> None:
        entries = timeline(run)
        start = entries[0].created_at if entries else run.started_at
        for entry in entries:
            offset = (entry.created_at - start).total_seconds()
            step = f"  {entry.step}" if entry.step else ""
            self._say(f"  +{offset:5.1f} s  {entry.type}{step}")
            if entry.summary:
                self._say(f"            {entry.summary}")
