"""Inserting one event row and running its projections with it, in one atomic block.

:func:`insert` writes an event :func:`~kumiko_workflows.store.events.append_event`
has checked: at the next (or the expected) stream version in one statement,
retried a few times when the next version is taken, on distributed tables
(Citus) one shard's statement at a time, and sends ``pre_save`` and
``post_save`` so the projections see it in the same block. When no row
comes back, :func:`stream_refusal` and :func:`version_conflict` say why.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Max
from django.db.models.signals import post_save, pre_save

from kumiko_workflows.exceptions import StreamIdentityError, VersionConflict
from kumiko_workflows.models import Event
from kumiko_workflows.store import appends, cursors, waiting_pairs, wake_checks
from kumiko_workflows.store import db as db_statements
from kumiko_workflows.store.dispatch import Projection, others_listen_to_post_save, registry
from kumiko_workflows.store.distribution import (
    chains_inserts,
    distributed,
    next_event_id,
    stream_elsewhere,
)
from kumiko_workflows.store.stream_ids import ENGINE_STREAMS

#: Tries of an append at the next version before it gives up (:class:`VersionConflict`).
NEXT_VERSION_ATTEMPTS = 3


def insert(
    event: Event, expected_version: int | None, json_texts: tuple[str, str], *, savepoint: bool
) -> None:
    """Insert ``event`` and dispatch ``pre_save``/``post_save`` (the projections).

    ``json_texts`` are the event's payload and metadata as stored. The
    insert and the projections share one atomic block, so a projection
    that raises takes the row with it. With ``savepoint=False`` that block
    is the caller's (which must then be unwound when the error propagates,
    as every engine caller does); with no projection for the type there is
    nothing to undo and the insert is one statement, and ``post_save`` is
    only sent if someone besides the projections listens. Only when no row
    comes back does a second query find out why (:func:`stream_refusal`).
    """
    db = db_statements.engine()  # one lookup of the thread's connection, not one per use
    waiting_pairs.before_writing(event.aggregate_id)  # its stream's waiting pair first
    tenant, aggregate_type = event.tenant_id, event.aggregate_type
    values = row_values(db, event, json_texts)
    aggregate = values[1]
    foreign = [aggregate, tenant, aggregate_type]
    if expected_version is None:
        shape, params = "next", [*values, tenant, aggregate, *foreign]
    elif expected_version == 0 and aggregate_type in ENGINE_STREAMS:
        shape, params = "new_engine", [*values, 1]
    elif expected_version == 0:
        shape, params = "new", [*values, 1, *foreign]
    else:
        previous = [tenant, aggregate, expected_version, aggregate_type]
        shape, params = "after", [*values, expected_version + 1, *previous]
    sql = appends.insert_event_sql(shape)
    projected = registry.handles(event.type)
    chained = projected and chains_inserts() and not others_listen_to_post_save()
    checked = registry.checked_alone(event.type) if chained else None
    if checked is not None:
        sql = wake_checks.insert_checked_sql(shape)  # the wake-up's check rides in it
        params = wake_checks.checked_params(params, tenant, event.type)
    attempts = NEXT_VERSION_ATTEMPTS if expected_version is None else 1
    pre_save.send(sender=Event, instance=event, raw=False, using=db.alias, update_fields=None)
    if distributed():
        _insert_sharded(db, event, expected_version, values, savepoint=savepoint)
        return
    # A block with a savepoint of its own (or a transaction) can run again once a
    # pooler's refusal of a prepared statement rolled it back: the connection
    # prepares nothing from then on (store.cursors._PreparingCursor).
    again = projected and (savepoint or not db.in_atomic_block)

    for _ in range(attempts):
        try:
            written = _write(db, event, sql, params, projected, savepoint, checked)
        except DatabaseError as exc:
            if not (again and cursors.lost_prepared_statement(exc)):
                raise
            again = False
            written = _write(db, event, sql, params, projected, savepoint, checked)
        if written:
            return
        refusal = stream_refusal(event, expected_version)
        if refusal is not None:
            raise refusal  # another writer cannot make this go away: no retry
    raise version_conflict(event, expected_version)


def _write(
    db: BaseDatabaseWrapper,
    event: Event,
    sql: str,
    params: list[Any],
    projected: bool,
    savepoint: bool,
    checked: Projection | None = None,
) -> bool:
    """Run the insert (and the projections, in one atomic block); whether a row was written.

    ``checked``: the type's only projection, the wake-up, whose check rides in
    the insert (in autocommit, one statement needing no block); its rest follows."""
    blocked = projected and (checked is None or db.in_atomic_block)
    with db_statements.atomic(savepoint=savepoint) if blocked else nullcontext():
        rows = appends.run_insert(sql, params, db)
        if not rows:
            return False
        saved(db, event, rows[0][:2], projected and checked is None)
        if checked is not None and checked.after_check is not None:
            _id, _version, check, scanned, paths = rows[0]
            checked.after_check(event, (check, list(paths), bool(scanned)))
    return True


def _insert_sharded(
    db: BaseDatabaseWrapper,
    event: Event,
    expected_version: int | None,
    values: list[Any],
    *,
    savepoint: bool,
) -> None:
    """:func:`insert` on distributed tables (Citus): each statement one shard's.

    The id is drawn from the coordinator's sequence first, so ids stay the
    append order (:func:`kumiko_workflows.store.distribution.next_event_id`). An
    append after a version, or to the next one, reads the stream's row in
    the insert itself (:func:`~kumiko_workflows.store.appends.sharded_insert_sql`).
    A stream's first event is a plain insert of version 1, and only once it
    is written is every shard asked whether another tenant's stream has the
    id (in a savepoint, which takes the row back if one has): the one
    question of an append that is not one shard's, asked once per stream.
    ``pre_save`` was sent by the caller.
    """
    tenant, kind = event.tenant_id, event.aggregate_type
    aggregate = values[1]
    projected = registry.handles(event.type)
    engine_start = expected_version == 0 and kind in ENGINE_STREAMS
    attempts = NEXT_VERSION_ATTEMPTS if expected_version is None else 1
    for _ in range(attempts):
        event_id = next_event_id()
        if expected_version:
            sql = appends.sharded_insert_sql("after")
            stream = [tenant, aggregate, kind, expected_version]
            params = [event_id, *values[1:], expected_version + 1, *stream]
            if _write(db, event, sql, params, projected, savepoint):
                return
        else:
            if expected_version is None:
                sql = appends.sharded_insert_sql("next")
                params = [event_id, *values[1:], tenant, aggregate, kind, event_id]
                if _write(db, event, sql, params, projected, savepoint):
                    return
            if _write_first(db, event, [event_id, *values, 1], projected, savepoint, engine_start):
                return
        refusal = stream_refusal(event, expected_version)
        if refusal is not None:
            raise refusal
    raise version_conflict(event, expected_version)


def _write_first(
    db: BaseDatabaseWrapper,
    event: Event,
    params: list[Any],
    projected: bool,
    savepoint: bool,
    engine_start: bool,
) -> bool:
    """Write a stream's first event (distributed); refuse it if another tenant has the stream.

    An engine stream's id is derived from its tenant, so another tenant's
    stream with it is its own, as :func:`stream_refusal` says: not asked.
    """
    checked = not engine_start
    block = db_statements.atomic(savepoint=savepoint or checked)
    with block:
        rows = appends.run_insert(appends.sharded_insert_sql("first"), params, db)
        if not rows:
            return False
        if checked and stream_elsewhere(event.tenant_id, params[2]):
            raise StreamIdentityError(f"stream {event.aggregate_id} belongs to another tenant")
        saved(db, event, rows[0], projected)
    return True


def row_values(db: BaseDatabaseWrapper, event: Event, json_texts: tuple[str, str]) -> list[Any]:
    """The values of ``EVENT_COLUMNS`` for ``event``, as the database takes them."""
    # What UUIDField and DateTimeField would send, without their generic
    # preparation chains: the stream id as text (a native uuid column reads
    # it as well, and psycopg binds a string client-side for a fraction of a
    # UUID's cost; the statement names the stream up to three times), else
    # its hex; the time as this database adapts it.
    uuid_value = event.aggregate_id
    aggregate = str(uuid_value) if db.features.has_native_uuid_field else uuid_value.hex
    # The names are validated strings and the event version an int (as the
    # field's own preparation would make it). The payload and metadata go as
    # the JSON text their size was measured on (the JSON field would encode
    # them again), which a jsonb column takes like any literal.
    return [
        event.tenant_id,
        aggregate,
        event.aggregate_type,
        event.type,
        int(event.event_version),
        *json_texts,
        event.created_by,
        db.ops.adapt_datetimefield_value(event.created_at),
    ]


def saved(db: BaseDatabaseWrapper, event: Event, row: tuple[Any, ...], projected: bool) -> None:
    """Mark ``event`` saved as ``row`` (id, version) and send ``post_save`` (the projections)."""
    event.pk, event.version = row
    event._state.adding = False
    event._state.db = db.alias
    if projected or others_listen_to_post_save():
        post_save.send(
            sender=Event,
            instance=event,
            created=True,
            update_fields=None,
            raw=False,
            using=db.alias,
        )


def stream_refusal(event: Event, expected_version: int | None) -> StreamIdentityError | None:
    """Why the stream refuses ``event``'s tenant or aggregate type, if it does.

    Mirrors :func:`kumiko_workflows.store.appends.insert_event_sql`'s checks. The
    message never names another tenant: the caller may be that tenant's adversary. Within a tenant,
    naming the stream's type helps fix the call.
    """
    firsts = Event.objects.filter(aggregate_id=event.aggregate_id, version=1)
    types = dict(firsts.values_list("tenant_id", "aggregate_type"))
    own = types.pop(event.tenant_id, None)
    if own is not None and own != event.aggregate_type:
        return StreamIdentityError(
            f"stream {event.aggregate_id} is a stream of aggregate type {own!r}, "
            f"not {event.aggregate_type!r}"
        )
    # Another tenant's stream with this id refuses the append, unless this
    # tenant's stream exists and the append names its version, or the engine
    # starts one of its own streams.
    checked = own is None or (
        expected_version in (None, 0) and event.aggregate_type not in ENGINE_STREAMS
    )
    if types and checked:
        return StreamIdentityError(f"stream {event.aggregate_id} belongs to another tenant")
    return None


def version_conflict(event: Event, expected_version: int | None) -> VersionConflict:
    """The :class:`VersionConflict` for an append to a stream that moved."""
    stream = Event.objects.filter(tenant_id=event.tenant_id, aggregate_id=event.aggregate_id)
    current = stream.aggregate(v=Max("version"))["v"]
    if expected_version is None:
        return VersionConflict(
            f"stream {event.aggregate_id} already has version {current}",
            aggregate_id=event.aggregate_id,
            expected_version=(current or 1) - 1,
        )
    if not stream.filter(version=expected_version).exists():
        # Appending past the end would leave a gap in the stream.
        return VersionConflict(
            f"stream {event.aggregate_id} is at version {current or 0}, not at the expected "
            f"version {expected_version}",
            aggregate_id=event.aggregate_id,
            expected_version=expected_version,
        )
    return VersionConflict(
        f"stream {event.aggregate_id} already has version {expected_version + 1}",
        aggregate_id=event.aggregate_id,
        expected_version=expected_version,
    )
