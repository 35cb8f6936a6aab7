"""What a purge removed (or, dry, would remove), per table: :class:`PurgeReport`.

Filled batch by batch by :mod:`kumiko_workflows.operations.purge` and
:mod:`kumiko_workflows.operations.purge_batch`; its ``refused`` and
``already_purged`` say why runs asked for by id were not removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class PurgeReport:
    """What a purge removed (or, dry, would remove), per table."""

    cutoff: datetime
    dry_run: bool = False
    #: Runs matching the filters when the purge began (the progress total).
    total: int = 0
    runs: int = 0
    events: int = 0
    pending: int = 0
    wait_keys: int = 0
    wake_checks: int = 0
    tombstones: int = 0
    batches: int = 0
    #: Runs left for a later purge: a worker held a leftover pending row of
    #: theirs, or a run not finished was started by one of their events.
    passed_over: int = 0
    #: Runs asked for by id that were not purged, with why.
    refused: list[tuple[str, str]] = field(default_factory=list)
    #: Runs asked for by id that an earlier purge removed.
    already_purged: list[str] = field(default_factory=list)
    #: With run ids asked for: the runs purged, and why others were passed over.
    purged_ids: set[str] = field(default_factory=set, repr=False)
    passed: dict[str, str] = field(default_factory=dict, repr=False)

    def counts(self) -> dict[str, int]:
        return {
            "runs": self.runs,
            "events": self.events,
            "pending": self.pending,
            "wait_keys": self.wait_keys,
            "wake_checks": self.wake_checks,
            "tombstones": self.tombstones,
            "passed_over": self.passed_over,
        }

    def __str__(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.counts().items())
