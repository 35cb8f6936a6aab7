"""A worker batch's closing pairs, written as sets at the batch's end.

Inside a batch of claimed rows (:func:`kumiko_workflows.engine.resume._drain_tenant`
on PostgreSQL), the two events that end a resumed run's segment (the
resume's opening event and the run's suspension or end) are not written at
once: :func:`~kumiko_workflows.store.event_pairs.append_engine_pair` leaves
them in the batch's :class:`BatchWrites`, and :meth:`BatchWrites.flush`
writes every run's in one ``INSERT`` (each row checked against its stream's
expected version, as the run's own statement would), then the run status
rows the projections say ahead (one ``UPDATE`` per shape, the rows as
arrays), then sends each event's ``post_save``, so the projections run as
they would have at the append, in the batch's transaction. A run whose
events are refused (its stream moved), a statement refused or a projection
raising fails the whole flush (:class:`SetWritesFailed`): the caller rolls
the batch back and resumes its rows again one at a time, where an error
names its run.

Only the pair that ends the claimed run's segment waits (a suspension or a
terminal event second), and any other write to a stream with a waiting
pair writes the batch's pairs first, so no event is ever written after a
later one of its stream.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kumiko_workflows.models import Event, WorkflowRunPending
from kumiko_workflows.store import appends, event_inserts, statements, waiting_pairs
from kumiko_workflows.store import db as db_statements
from kumiko_workflows.store.arrays import array_param
from kumiko_workflows.store.dispatch import mark_applied, registry
from kumiko_workflows.store.pending_hint import pending_cleared
from kumiko_workflows.workflow import event_types as et


class SetWritesFailed(Exception):
    """A batch's waiting pairs could not be written, or a projection of theirs raised.

    Not one run's to blame: the caller rolls the batch back and resumes its
    rows again one at a time, each writing its own (where an error names its run).
    """


@dataclass
class Pair:
    one: Event
    one_texts: tuple[str, str]
    two: Event
    two_texts: tuple[str, str]
    expected_version: int
    folds: list[tuple[str, Any]]
    #: The run's pending-rows hint at the append (see RunStream.append), for its projections.
    hint: Any


@dataclass
class BatchWrites:
    """The closing pairs a batch's runs left to write at its end."""

    #: The claimed row being resumed, whose closing pair may wait (None: none may).
    resuming: WorkflowRunPending | None = None
    pairs: dict[uuid.UUID, Pair] = field(default_factory=dict)
    #: The earliest instant a pending row written in the batch is due from (None: none).
    due_from: datetime | None = None

    def takes(self, aggregate_id: uuid.UUID, closing_type: str) -> bool:
        """Whether this pair ends the resumed run's segment, so it may wait for the batch's end."""
        row = self.resuming
        if row is None or row.run_id != aggregate_id:
            return False
        return closing_type in et.TERMINAL or et.is_suspension(closing_type)

    def add(self, pair: Pair) -> None:
        self.resuming = None  # one pair a run: nothing of its stream follows it
        self.pairs[pair.one.aggregate_id] = pair

    def due_by(self, now: datetime) -> bool:
        """Whether a pending row written in the batch is due by ``now``."""
        return self.due_from is not None and self.due_from <= now

    def flush(self) -> int:
        """Write the waiting pairs, then their projections; how many (:class:`SetWritesFailed`)."""
        if not self.pairs:
            return 0
        pairs, self.pairs = list(self.pairs.values()), {}
        try:
            self._write(pairs)
        except Exception as exc:
            if db_statements.connection_broken():
                raise
            raise SetWritesFailed(f"{len(pairs)} runs' last events: {exc}") from exc
        return len(pairs)

    def _write(self, pairs: list[Pair]) -> None:
        db = db_statements.engine()
        events: list[tuple[Any, ...]] = []  # appends.batch_pairs_sql's columns, a row an event
        streams: list[str] = []  # each pair's stream id as the statement names it
        for pair in pairs:
            after = pair.expected_version
            one = event_inserts.row_values(db, pair.one, pair.one_texts)
            events.append((*one, after + 1, after))
            two = event_inserts.row_values(db, pair.two, pair.two_texts)
            events.append((*two, after + 2, after))
            streams.append(one[1])
        columns = list(zip(*events, strict=True))
        # The payloads and the metadata (JSON texts) go as one JSON array each,
        # the other columns as arrays' texts.
        documents = [f"[{','.join(texts)}]" for texts in columns[5:7]]
        params: list[Any] = [
            *map(array_param, columns[:5]),
            *documents,
            *map(array_param, columns[7:]),
        ]
        written = {
            (aggregate, version): pk
            for pk, aggregate, version in appends.run_insert(appends.batch_pairs_sql(), params, db)
        }
        for pair, stream in zip(pairs, streams, strict=True):
            after = pair.expected_version
            if (stream, after + 1) not in written or (stream, after + 2) not in written:
                raise event_inserts.version_conflict(pair.one, after)
        updates: dict[tuple[Any, ...], list[list[Any]]] = {}
        for pair in pairs:
            for _, (model, values, where) in pair.folds:
                shape = (model, tuple(values), tuple(where))
                updates.setdefault(shape, []).append(statements.row_params(model, values, where))
        for (model, names, keys), rows in updates.items():
            statements.update_rows(model, names, keys, rows)
        for pair, stream in zip(pairs, streams, strict=True):
            after = pair.expected_version
            token = pending_cleared.set(pair.hint)
            try:
                event_inserts.saved(
                    db, pair.one, (written[stream, after + 1], after + 1), _projected(pair.one)
                )
                mark_applied(pair.two, [name for name, _ in pair.folds])
                event_inserts.saved(
                    db, pair.two, (written[stream, after + 2], after + 2), _projected(pair.two)
                )
            finally:
                pending_cleared.reset(token)


def _projected(event: Event) -> bool:
    return registry.handles(event.type)


@contextmanager
def writing_at_the_end() -> Iterator[BatchWrites]:
    """Around a worker batch: closing pairs wait in the batch's :class:`BatchWrites`."""
    writes = BatchWrites()
    token = waiting_pairs.batch_writes.set(writes)
    try:
        yield writes
    finally:
        waiting_pairs.batch_writes.reset(token)
