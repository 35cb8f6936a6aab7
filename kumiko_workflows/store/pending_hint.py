"""The hint that a run stream's next events find no pending rows (a DELETE not to send).

Set by :class:`~kumiko_workflows.store.streams.RunStream` around its appends, read by
:mod:`kumiko_workflows.projections.pending`, and kept with a batch's waiting pairs
(:mod:`kumiko_workflows.store.batch_writes`) for their projections at the batch's end.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

#: (run id, first version, last version) of events about to be appended
#: whose stream has no pending rows (nor wait keys) for sure: the run's
#: pending row was deleted by the claim, or the stream's previous event was
#: appended by the same ``RunStream`` in the same transaction and left none
#: (a start, a resume or an end). Lets the pending projection skip a DELETE
#: that would find nothing.
pending_cleared: ContextVar[tuple[Any, int, int] | None] = ContextVar(
    "kumiko_pending_cleared", default=None
)


def is_cleared(run_id: Any, version: int) -> bool:
    """Whether the event of ``run_id`` at ``version`` is known to find no pending rows."""
    hint = pending_cleared.get()
    return hint is not None and hint[0] == run_id and hint[1] <= version <= hint[2]
