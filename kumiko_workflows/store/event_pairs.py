"""Two events appended to one of the engine's run streams in one statement.

:func:`append_engine_pair` is what two :func:`~kumiko_workflows.store.events.append_event`
calls would do, in one round trip where the database chains inserts
(PostgreSQL), with the writes the projections say ahead for the second
event riding in the same statement.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.signals import pre_save

from kumiko_workflows.models import Event
from kumiko_workflows.store import appends, batch_writes, claims, statements, waiting_pairs
from kumiko_workflows.store import db as db_statements
from kumiko_workflows.store.dispatch import mark_applied, registry
from kumiko_workflows.store.distribution import chains_inserts
from kumiko_workflows.store.event_inserts import (
    insert,
    row_values,
    saved,
    stream_refusal,
    version_conflict,
)
from kumiko_workflows.store.events import prepared_event
from kumiko_workflows.store.pending_hint import pending_cleared
from kumiko_workflows.store.stream_ids import _engine_writing


def append_engine_pair(
    aggregate_id: uuid.UUID,
    aggregate_type: str,
    first: tuple[str, Mapping[str, Any]],
    second: tuple[str, Mapping[str, Any]],
    *,
    tenant_id: str,
    expected_version: int,
    created_by: str,
) -> tuple[Event, Event]:
    """Append two events to one of the engine's streams after ``expected_version``.

    One statement where the database can chain inserts (PostgreSQL), and the
    projections of each in order, as two :func:`append_event` calls would
    do. Raises :class:`VersionConflict` when the first version is taken; if
    only the second is, the first stays written and the caller, which runs
    in an atomic block it unwinds on errors, must roll it back.
    """
    db = db_statements.engine()
    prepared = []  # both checked (the stream's types included) before any SQL
    for offset, (type, payload) in enumerate((first, second)):
        event, texts = prepared_event(
            aggregate_id,
            aggregate_type,
            type,
            payload,
            tenant_id,
            expected_version + offset,
            None,
            created_by,
            1,
            None,
        )
        prepared.append((event, texts))
    (one, one_texts), (two, two_texts) = prepared
    token = _engine_writing.set(False)  # the projections' appends are not the engine's
    try:
        if chains_inserts():
            _insert_pair(db, one, one_texts, two, two_texts, expected_version)
        else:
            insert(one, expected_version, one_texts, savepoint=False)
            insert(two, expected_version + 1, two_texts, savepoint=False)
    finally:
        _engine_writing.reset(token)
    return one, two


def _insert_pair(
    db: BaseDatabaseWrapper,
    one: Event,
    one_texts: tuple[str, str],
    two: Event,
    two_texts: tuple[str, str],
    expected_version: int,
) -> None:
    """Insert ``one`` and ``two`` in one statement and send their signals, as :func:`insert`."""
    waiting_pairs.before_writing(one.aggregate_id)
    writes: batch_writes.BatchWrites | None = waiting_pairs.batch_writes.get()
    if writes is not None and not writes.takes(one.aggregate_id, two.type):
        writes = None  # not the end of the run's segment: written now
    if writes is None:
        one_values, two_values = row_values(db, one, one_texts), row_values(db, two, two_texts)
        previous = [one_values[0], one_values[1], expected_version, one.aggregate_type]
        params = [*one_values, expected_version + 1, *previous, *two_values, expected_version + 2]
    for event in (one, two):
        pre_save.send(sender=Event, instance=event, raw=False, using=db.alias, update_fields=None)
    # Writes the projections say ahead for the last event (the run's status)
    # ride in the same statement, applied only if both events were written.
    # (The event's version is known: expected + 2.)
    two.version = expected_version + 2
    folds = registry.folds(two)
    if writes is not None:
        # The run's segment ends here: written with the batch's others at its
        # end, whose statement takes the rows' values then.
        one.version = expected_version + 1
        hint = pending_cleared.get()
        writes.add(batch_writes.Pair(one, one_texts, two, two_texts, expected_version, folds, hint))
        return
    chained = []
    for _, (model, values, where) in folds:
        sql, folded_params = statements.rows_statement(
            model, "UPDATE", values, where, only_if="second"
        )
        chained.append(sql)
        params.extend(folded_params)
    request = claims.next_claim.get()
    claim = None
    if (
        request is not None
        and not request.asked
        and request.run_id == one.aggregate_id
        and request.tenant_id == one.tenant_id
        and request.wanted()
    ):
        # The worker's next claim rides in the statement that ends this run's segment.
        request.asked = True
        delete, claimed, delete_params, claimed_params = request.parts()
        claim = (delete, claimed)
        params.extend(delete_params)
        params.extend(claimed_params)
    sql = appends.insert_pair_sql(tuple(chained), claim)
    inserted = appends.run_insert(sql, params, db)
    if claim is not None:
        assert request is not None
        taken = [row[3:] for row in inserted if row[0] == 1]
        if taken:
            request.found = claims.claimed_row(request.tenant_id, taken[0])
        inserted = [row[1:3] for row in inserted if row[0] == 0]
    rows = {version: (pk, version) for pk, version in inserted}
    if expected_version + 1 not in rows:
        raise stream_refusal(one, expected_version) or version_conflict(one, expected_version)
    saved(db, one, rows[expected_version + 1], registry.handles(one.type))
    if expected_version + 2 not in rows:
        raise version_conflict(two, expected_version + 1)
    mark_applied(two, [name for name, _ in folds])
    saved(db, two, rows[expected_version + 2], registry.handles(two.type))
