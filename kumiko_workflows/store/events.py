"""Appending to and reading from the event store.

``append_event`` validates its input, inserts one row at the next (or the
expected) stream version in one statement, and lets the projections see it
synchronously through ``post_save`` in the same atomic block; if the version
is taken it raises :class:`VersionConflict`, if the stream belongs to another
tenant or aggregate type :class:`StreamIdentityError`, and either way the
caller's transaction stays usable.

A stream is ``(tenant_id, aggregate_id)``: its first event fixes its tenant
and aggregate type, versions are unique per tenant (the key leads with
``tenant_id``, so the table shards by tenant), and every read of a stream
names its tenant (:mod:`kumiko_workflows.store.stream_ids`). The checks of
an append's arguments are :mod:`kumiko_workflows.store.event_checks`.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from contextlib import nullcontext
from datetime import datetime
from typing import Any, cast

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Max, Model, Subquery
from django.db.models.signals import post_save, pre_save

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import (
    CrossDatabaseTransaction,
    InvalidEvent,
    StreamIdentityError,
    VersionConflict,
)
from kumiko_workflows.models import Event
from kumiko_workflows.store import appends, cursors, outbox, statements, wake_checks
from kumiko_workflows.store import db as db_statements
from kumiko_workflows.store.appends import EVENT_COLUMNS
from kumiko_workflows.store.dispatch import (
    Projection,
    mark_applied,
    others_listen_to_post_save,
    registry,
)
from kumiko_workflows.store.distribution import (
    chains_inserts,
    distributed,
    next_event_id,
    stream_elsewhere,
)
from kumiko_workflows.store.event_checks import (
    _column_max,
    _counter,
    _json_object,
    _name,
)
from kumiko_workflows.store.stream_ids import (
    ENGINE_STREAMS,
    _as_uuid,
    _engine_writing,
)
from kumiko_workflows.workflow import clock
from kumiko_workflows.workflow.arguments import clipped_repr

_NEXT_VERSION_ATTEMPTS = 3


def joins_callers_transaction(operation: str) -> None:
    """Refuse (:class:`CrossDatabaseTransaction`) to write outside the caller's transaction.

    Called first by each operation a site calls to write to the engine's
    tables (``operation`` names it in the error), before any SQL: if the
    caller is in a transaction on another database alias and the engine's
    alias has none, the engine's writes would commit at once, outside it,
    even when it rolls back. Nothing is written, and the caller's
    transaction stays usable.
    """
    other = db_statements.foreign_transaction()
    if other is None:
        return
    own = db_statements.alias()
    way = outbox.refusal_hint(other) if operation == "append_event" else ""  # appends only
    raise CrossDatabaseTransaction(
        f"{operation}() was called inside a transaction on database {other!r}, but the "
        f"engine's tables are on {own!r} (KUMIKO_WORKFLOWS['DATABASE']), where no transaction "
        f"is open: its writes (events, the runs they start, their signals) would commit at "
        f"once, even if the transaction on {other!r} rolls back. Nothing was written. {way}"
        f"Open transaction.atomic(using={own!r}) around your transaction on {other!r} (the "
        f"engine's writes then commit or roll back with it, just after yours), or make the "
        f"call once {other!r} has committed"
    )


def append_event(
    aggregate_id: uuid.UUID | str | Model,
    aggregate_type: str,
    type: str,
    payload: Mapping[str, Any] | None,
    tenant_id: str | None = None,
    expected_version: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    created_by: str | None = None,
    *,
    event_version: int = 1,
    created_at: datetime | None = None,
    savepoint: bool = True,
) -> Event:
    """Append one event to a stream and project it; return the saved row.

    ``aggregate_id`` is a UUID (or its text), or a saved model instance,
    whose stream id is :func:`~kumiko_workflows.store.stream_ids.stream_id_for`. The event gets
    ``expected_version + 1``, or the stream's next version when
    ``expected_version`` is None. Raises :class:`VersionConflict` if that
    version is already taken and :class:`InvalidEvent` for bad input; in both
    cases nothing is written. The stream's first event fixes its tenant and
    aggregate type: an append with another of either raises
    :class:`StreamIdentityError` (an :class:`InvalidEvent`). Projections run
    synchronously in the same transaction; if one raises, the append is
    rolled back and the error propagates. ``bulk_create`` and raw SQL bypass
    the projections and these checks.

    ``savepoint=False`` is for callers that run inside an atomic block they
    unwind on any error (the engine's own run streams): it saves the
    savepoint round trips, and a failing projection then dooms that block.

    Inside a transaction on an alias of ``KUMIKO_WORKFLOWS["OUTBOX_DATABASES"]``
    the event goes to its outbox instead, relayed after the commit, and is
    returned unsaved (:mod:`kumiko_workflows.store.outbox`). Inside one on
    another database than the engine's, not listed, with none open on the
    engine's, it raises :class:`CrossDatabaseTransaction` and writes nothing:
    the append would not be part of the caller's transaction.
    """
    event, texts = _prepared(
        aggregate_id,
        aggregate_type,
        type,
        payload,
        tenant_id,
        expected_version,
        metadata,
        created_by,
        event_version,
        created_at,
    )
    # The engine's own streams (cancel_run...): where the operation's check lets them be.
    into = None if event.aggregate_type in ENGINE_STREAMS else outbox.alias_for_append()
    if into is not None:
        outbox.refuse_expected_version(into, expected_version)
        refusal = _refusal(event, None)  # the stream's tenant and type, read now
        if refusal is not None:
            raise refusal
        event.relay_id = outbox.enqueue(into, event, append_event)
        return event
    joins_callers_transaction("append_event")
    # The engine's right to write its streams covers this append only, not the
    # appends of the projections it sets off: a workflow triggered by a run
    # event runs its (user) steps there.
    token = _engine_writing.set(False)
    try:
        _insert(event, expected_version, texts, savepoint=savepoint)
    finally:
        _engine_writing.reset(token)
    return event


def _prepared(
    aggregate_id: Any,
    aggregate_type: Any,
    type: Any,
    payload: Any,
    tenant_id: Any,
    expected_version: Any,
    metadata: Any,
    created_by: Any,
    event_version: Any,
    created_at: Any,
) -> tuple[Event, tuple[str, str]]:
    """The unsaved Event ``append_event`` would insert, and its payload and metadata as stored.

    Every check on the caller's input happens here, before any SQL.
    """
    aggregate = _as_uuid(aggregate_id)
    aggregate_type = _name(aggregate_type, "aggregate_type")
    engine = ENGINE_STREAMS.get(aggregate_type)
    if engine is not None and not _engine_writing.get():
        raise InvalidEvent(
            f"aggregate type {aggregate_type!r} is reserved: only the engine writes those "
            "streams (use cancel_run, wake_run or rerun_run to act on a run)"
        )
    type = _name(type, "type")
    if engine is not None and not engine[0](type):
        raise InvalidEvent(
            f"a stream of aggregate type {aggregate_type!r} takes only {engine[1]}, not {type!r}"
        )
    tenant = _name(
        workflow_settings.DEFAULT_TENANT if tenant_id is None else tenant_id, "tenant_id"
    )
    created_by = "" if created_by is None else _name(created_by, "created_by", blank=True)
    clean_payload, payload_text = _json_object(payload, "payload")
    clean_metadata, metadata_text = _json_object(metadata, "metadata")
    if expected_version is not None:
        # The event takes expected_version + 1, which must fit the column too.
        _counter(expected_version, "expected_version", 0, _column_max("version") - 1)
    _counter(event_version, "event_version", 1, _column_max("event_version"))
    _created_at_field()  # checks the order Event is built in below
    if created_at is None:
        created_at = clock.now()  # the engine's clock: a test's virtual time, if it set one
    elif not isinstance(created_at, datetime):
        raise InvalidEvent(f"created_at must be an aware datetime, got {clipped_repr(created_at)}")
    elif created_at.tzinfo is None or created_at.utcoffset() is None:
        raise InvalidEvent(f"created_at is a naive datetime ({created_at.isoformat()})")
    # The next version is only known once inserted.
    version: Any = None if expected_version is None else expected_version + 1
    # Positional, in field order (_FIELDS): the keyword form looks up every
    # field by name and calls each default.
    event = Event(
        None,
        tenant,
        aggregate,
        aggregate_type,
        version,
        type,
        event_version,
        clean_payload,
        clean_metadata,
        created_by,
        created_at,
    )
    return event, (payload_text, metadata_text)


#: Event's fields in the order ``Event(*values)`` takes them: the columns
#: above with the id first and the version after the aggregate type.
_FIELDS = ("id", *EVENT_COLUMNS[:3], "version", *EVENT_COLUMNS[3:])


@functools.cache
def _created_at_field() -> Field[Any, Any]:
    """Event's ``created_at``, once Event's fields are found in the order of ``_FIELDS``."""
    order = tuple(field.attname for field in Event._meta.concrete_fields)
    if order != _FIELDS:  # a changed model: append_event builds Events by position
        raise AssertionError(f"Event's fields are {order}, append_event expects {_FIELDS}")
    return cast("Field[Any, Any]", Event._meta.get_field("created_at"))


def _insert(
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
    comes back does a second query find out why (:func:`_refusal`).
    """
    db = db_statements.engine()  # one lookup of the thread's connection, not one per use
    tenant, aggregate_type = event.tenant_id, event.aggregate_type
    values = _row_values(db, event, json_texts)
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
    attempts = _NEXT_VERSION_ATTEMPTS if expected_version is None else 1
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
        refusal = _refusal(event, expected_version)
        if refusal is not None:
            raise refusal  # another writer cannot make this go away: no retry
    raise _version_conflict(event, expected_version)


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
        _saved(db, event, rows[0][:2], projected and checked is None)
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
    """:func:`_insert` on distributed tables (Citus): each statement one shard's.

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
    attempts = _NEXT_VERSION_ATTEMPTS if expected_version is None else 1
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
                params = [event_id, *values[1:], tenant, aggregate, kind]
                if _write(db, event, sql, params, projected, savepoint):
                    return
            if _write_first(db, event, [event_id, *values, 1], projected, savepoint, engine_start):
                return
        refusal = _refusal(event, expected_version)
        if refusal is not None:
            raise refusal
    raise _version_conflict(event, expected_version)


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
    stream with it is its own, as :func:`_refusal` says: not asked.
    """
    checked = not engine_start
    block = db_statements.atomic(savepoint=savepoint or checked)
    with block:
        rows = appends.run_insert(appends.sharded_insert_sql("first"), params, db)
        if not rows:
            return False
        if checked and stream_elsewhere(event.tenant_id, params[2]):
            raise StreamIdentityError(f"stream {event.aggregate_id} belongs to another tenant")
        _saved(db, event, rows[0], projected)
    return True


def _row_values(db: BaseDatabaseWrapper, event: Event, json_texts: tuple[str, str]) -> list[Any]:
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


def _saved(db: BaseDatabaseWrapper, event: Event, row: tuple[Any, ...], projected: bool) -> None:
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
        event, texts = _prepared(
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
            _insert(one, expected_version, one_texts, savepoint=False)
            _insert(two, expected_version + 1, two_texts, savepoint=False)
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
    """Insert ``one`` and ``two`` in one statement and send their signals, as :func:`_insert`."""
    one_values, two_values = _row_values(db, one, one_texts), _row_values(db, two, two_texts)
    previous = [one_values[0], one_values[1], expected_version, one.aggregate_type]
    params = [*one_values, expected_version + 1, *previous, *two_values, expected_version + 2]
    for event in (one, two):
        pre_save.send(sender=Event, instance=event, raw=False, using=db.alias, update_fields=None)
    # Writes the projections say ahead for the last event (the run's status)
    # ride in the same statement, applied only if both events were written.
    # (The event's version is known: expected + 2.)
    two.version = expected_version + 2
    folds = registry.folds(two)
    chained = []
    for _, (model, values, where) in folds:
        sql, folded_params = statements.rows_statement(
            model, "UPDATE", values, where, only_if="second"
        )
        chained.append(sql)
        params.extend(folded_params)
    sql = appends.insert_pair_sql(tuple(chained))
    inserted = appends.run_insert(sql, params, db)
    rows = {version: (pk, version) for pk, version in inserted}
    if expected_version + 1 not in rows:
        raise _refusal(one, expected_version) or _version_conflict(one, expected_version)
    _saved(db, one, rows[expected_version + 1], registry.handles(one.type))
    if expected_version + 2 not in rows:
        raise _version_conflict(two, expected_version + 1)
    mark_applied(two, [name for name, _ in folds])
    _saved(db, two, rows[expected_version + 2], registry.handles(two.type))


def _refusal(event: Event, expected_version: int | None) -> StreamIdentityError | None:
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


def _version_conflict(event: Event, expected_version: int | None) -> VersionConflict:
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


def load_stream(aggregate_id: uuid.UUID | str | Model, tenant_id: str | None = None) -> list[Event]:
    """All events of one stream (a UUID, its text, or a saved model instance), in version order.

    A stream lives in one tenant. ``tenant_id`` names it; None means the
    tenant of the stream's first event. Events another tenant wrote with the
    same id (only a race of two first appends can leave such a twin) are
    never mixed in.
    """
    events = Event.objects.filter(aggregate_id=_as_uuid(aggregate_id))
    if tenant_id is None:
        head = events.filter(version=1).order_by("id").values("tenant_id")[:1]
        events = events.filter(tenant_id=Subquery(head))
    else:
        events = events.filter(tenant_id=_name(tenant_id, "tenant_id"))
    return list(events.order_by("version"))
