"""The worker batch whose runs' closing pairs wait for its end, and the rule that keeps order.

The batch's writes are :class:`kumiko_workflows.store.batch_writes.BatchWrites`;
this module holds only what every append asks: whether a pair of its stream
waits, to be written first (so no event is written after a later one of its
stream), and what the pending projection tells it: from when a row it wrote is due.
"""

from __future__ import annotations

from collections.abc import Container
from contextvars import ContextVar
from typing import Any, Protocol


class Waiting(Protocol):
    """What an append needs of a batch's waiting pairs."""

    @property
    def pairs(self) -> Container[Any]: ...

    def flush(self) -> None: ...

    due_from: Any


#: The batch whose closing pairs wait for its end (None: every pair is written at once).
batch_writes: ContextVar[Any] = ContextVar("kumiko_batch_writes", default=None)


def before_writing(aggregate_id: Any) -> None:
    """Before a write to stream ``aggregate_id``: the batch's waiting pairs, if one is of it."""
    writes: Waiting | None = batch_writes.get()
    if writes is not None and aggregate_id in writes.pairs:
        writes.flush()


def due_from(when: Any) -> None:
    """A pending row written is due from ``when``: the batch writing looks again if that is
    within its pass, before leaving the tenant."""
    writes: Waiting | None = batch_writes.get()
    if writes is not None and (writes.due_from is None or when < writes.due_from):
        writes.due_from = when
