"""A worker batch's claims made ahead of its runs.

With ``BATCH_TOGETHER`` (the default) a batch's rows are claimed at once,
in one statement (:meth:`Ahead.claim_batch`), and those it does not reach
are put back; the batch ends before a row that commits alone, so that run
holds none of them. Without it, inside a batch
(:func:`kumiko_workflows.engine.resume._drain_tenant`) the statement that
appends a resumed run's last two events also claims the batch's next due
row (:class:`~kumiko_workflows.store.claims.NextClaim`): one round trip a
run instead of two, and still no row is taken before the run ahead of it
is done, so a slow step holds no row it has not reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from datetime import datetime

from kumiko_workflows.models import Event, WorkflowRunPending
from kumiko_workflows.store import claims
from kumiko_workflows.store.distribution import chains_inserts


class Ahead:
    """A batch's claims made ahead: the next row taken in the statement ending a run's segment.

    Only without savepoints (an error then rolls the whole batch back, the
    row claimed ahead with it), for a slot left in the batch, and while the
    batch is neither past ``BATCH_SECONDS`` nor stopping when that statement
    runs (:class:`~kumiko_workflows.store.claims.NextClaim`); never after a
    run that commits on its own (``commit="per_run"``, a limit), on Citus, or
    in a compensating run (whose first event is written before the rest of
    its undo code runs). A row claimed ahead is held until it is resumed, in
    this batch.
    """

    def __init__(
        self,
        size: int,
        deadline: float,
        should_stop: Callable[[], bool],
        savepoints: bool,
        commits_per_run: Callable[[WorkflowRunPending], bool],
    ) -> None:
        self.left = size
        self.commits_per_run = commits_per_run
        self.deadline = deadline
        self.should_stop = should_stop
        # The claim rides in the chained pair of a run's last two events.
        self.on = not savepoints and chains_inserts()
        self.held: tuple[WorkflowRunPending, Event | None] | None = None
        #: Rows the batch claimed at its start (see :meth:`claim_batch`), in their order.
        self.queue: list[tuple[WorkflowRunPending, Event | None]] = []

    def claim_batch(
        self, tenant: str, due: datetime, passed_over: set[int], leaving: Collection[str]
    ) -> None:
        """Claim the batch's rows at once, in one statement; none is claimed ahead after that."""
        self.queue = claims.claim_batch(tenant, due, self.left, passed_over, leaving)
        self.queue.reverse()  # taken from the end
        self.on = False

    def alone_next(self) -> bool:
        """Whether the next row the batch claimed commits alone: the batch ends before it,
        so that run holds none of the batch's rows (it is claimed again, row by row)."""
        return bool(self.queue) and self.commits_per_run(self.queue[-1][0])

    def put_back(self) -> None:
        """Put the batch's claimed rows it did not reach back as they were: due, for any worker."""
        while self.queue:
            row, _trigger = self.queue.pop()
            row.save(force_insert=True)

    def wanted(self) -> bool:
        return time.monotonic() <= self.deadline and not self.should_stop()

    def next_row(
        self, tenant: str, due: datetime, passed_over: set[int], leaving: Collection[str]
    ) -> tuple[WorkflowRunPending, Event | None] | None:
        """The row claimed ahead, or the next due row claimed now (None: none due)."""
        self.left -= 1
        held, self.held = self.held, None
        if held is None and self.queue:
            held = self.queue.pop()
        return held if held is not None else claims.claim_due(tenant, due, passed_over, leaving)

    def request_after(
        self,
        row: WorkflowRunPending,
        tenant: str,
        due: datetime,
        passed_over: set[int],
        leaving: Collection[str],
    ) -> claims.NextClaim | None:
        """What to ask the statement ending ``row``'s segment to claim (None: nothing)."""
        if not self.on or self.left <= 0 or self.commits_per_run(row):
            return None
        return claims.NextClaim(row.run_id, tenant, due, passed_over, leaving, self.wanted)
