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
an append's arguments are :mod:`kumiko_workflows.store.event_checks`; the
insert and its projections :mod:`kumiko_workflows.store.event_inserts`; two
engine events in one statement :mod:`kumiko_workflows.store.event_pairs`.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

from django.db.models import Field, Model, Subquery

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import CrossDatabaseTransaction, InvalidEvent
from kumiko_workflows.models import Event
from kumiko_workflows.store import db as db_statements
from kumiko_workflows.store import event_inserts, outbox
from kumiko_workflows.store.appends import EVENT_COLUMNS
from kumiko_workflows.store.event_checks import (
    _column_max,
    _counter,
    _json_object,
    _name,
)
from kumiko_workflows.store.statement_cache import new_instance
from kumiko_workflows.store.stream_ids import (
    ENGINE_STREAMS,
    _as_uuid,
    _engine_writing,
)
from kumiko_workflows.workflow import clock
from kumiko_workflows.workflow.arguments import clipped_repr


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
    event, texts = prepared_event(
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
        refusal = event_inserts.stream_refusal(
            event, None
        )  # the stream's tenant and type, read now
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
        event_inserts.insert(event, expected_version, texts, savepoint=savepoint)
    finally:
        _engine_writing.reset(token)
    return event


def prepared_event(
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
    # field by name and calls each default (new_instance: Event(*values)'s).
    event = new_instance(
        Event,
        (
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
        ),
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
