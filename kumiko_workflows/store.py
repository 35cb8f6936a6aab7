"""Appending to and reading from the event store.

``append_event`` validates its input, inserts one row at the next (or the
expected) stream version inside a savepoint, and lets the projections see it
synchronously through ``post_save``; if the version is taken it raises
:class:`VersionConflict` and the caller's transaction stays usable.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import InvalidEvent, VersionConflict
from kumiko_workflows.jsonvalues import NotJSON, json_size, to_json
from kumiko_workflows.models import Event

_NEXT_VERSION_ATTEMPTS = 3


def _as_uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise InvalidEvent(f"aggregate_id must be a UUID, got {value!r}")


def _name(value: Any, what: str, max_length: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidEvent(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > max_length:
        raise InvalidEvent(f"{what} is longer than {max_length} characters")
    return value


def _json_object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidEvent(f"{what} must be a JSON object (a dict), got {type(value).__name__}")
    try:
        clean = to_json(value, what)
    except NotJSON as exc:
        raise InvalidEvent(str(exc)) from None
    limit = workflow_settings.MAX_PAYLOAD_BYTES
    size = json_size(clean)
    if size > limit:
        raise InvalidEvent(
            f"{what} is {size} bytes of JSON, over the limit of {limit} bytes "
            "(KUMIKO_WORKFLOWS['MAX_PAYLOAD_BYTES'])"
        )
    return clean


def append_event(
    aggregate_id: uuid.UUID | str,
    aggregate_type: str,
    type: str,
    payload: Mapping[str, Any] | None,
    *,
    tenant_id: str | None = None,
    expected_version: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    created_by: str | None = None,
    event_version: int = 1,
    created_at: datetime | None = None,
) -> Event:
    """Append one event to a stream and project it; return the saved row.

    The event gets ``expected_version + 1``, or the stream's next version when
    ``expected_version`` is None. Raises :class:`VersionConflict` if that
    version is already taken and :class:`InvalidEvent` for bad input; in both
    cases nothing is written. Projections run synchronously in the same
    transaction; if one raises, the append is rolled back and the error
    propagates. ``bulk_create`` and raw SQL bypass the projections.
    """
    aggregate = _as_uuid(aggregate_id)
    aggregate_type = _name(aggregate_type, "aggregate_type", 100)
    type = _name(type, "type", 200)
    tenant = _name(
        workflow_settings.DEFAULT_TENANT if tenant_id is None else tenant_id, "tenant_id", 100
    )
    clean_payload = _json_object(payload, "payload")
    clean_metadata = _json_object(metadata, "metadata")
    if created_by is not None and not isinstance(created_by, str):
        raise InvalidEvent(f"created_by must be a string, got {created_by!r}")
    if expected_version is not None and (
        isinstance(expected_version, bool)
        or not isinstance(expected_version, int)
        or expected_version < 0
    ):
        raise InvalidEvent(f"expected_version must be an integer >= 0, got {expected_version!r}")
    if isinstance(event_version, bool) or not isinstance(event_version, int) or event_version < 1:
        raise InvalidEvent(f"event_version must be an integer >= 1, got {event_version!r}")
    if created_at is not None and not isinstance(created_at, datetime):
        raise InvalidEvent(f"created_at must be an aware datetime, got {created_at!r}")
    if created_at is not None and (created_at.tzinfo is None or created_at.utcoffset() is None):
        raise InvalidEvent(f"created_at is a naive datetime ({created_at.isoformat()})")
    if (
        expected_version
        and not Event.objects.filter(aggregate_id=aggregate, version=expected_version).exists()
    ):
        # Without this, appending past the end would leave a gap in the stream.
        current = Event.objects.filter(aggregate_id=aggregate).aggregate(v=Max("version"))["v"]
        raise VersionConflict(
            f"stream {aggregate} is at version {current or 0}, not at the expected "
            f"version {expected_version}",
            aggregate_id=aggregate,
            expected_version=expected_version,
        )

    attempts = 1 if expected_version is not None else _NEXT_VERSION_ATTEMPTS
    for attempt in range(1, attempts + 1):
        if expected_version is None:
            current = Event.objects.filter(aggregate_id=aggregate).aggregate(v=Max("version"))["v"]
            version = (current or 0) + 1
        else:
            version = expected_version + 1
        event = Event(
            tenant_id=tenant,
            aggregate_id=aggregate,
            aggregate_type=aggregate_type,
            version=version,
            type=type,
            event_version=event_version,
            payload=clean_payload,
            metadata=clean_metadata,
            created_by=created_by or "",
        )
        if created_at is not None:
            event.created_at = created_at
        try:
            with transaction.atomic():
                event.save()
        except IntegrityError:
            # Projections mark the row once it is inserted: an IntegrityError
            # raised after that is theirs, not a version conflict.
            if getattr(event, "_kw_inserted", False):
                raise
            if attempt == attempts:
                raise VersionConflict(
                    f"stream {aggregate} already has version {version}",
                    aggregate_id=aggregate,
                    expected_version=version - 1,
                ) from None
            continue
        return event
    raise AssertionError("unreachable")  # pragma: no cover


def load_stream(aggregate_id: uuid.UUID | str) -> list[Event]:
    """All events of one stream, in version order."""
    return list(Event.objects.filter(aggregate_id=_as_uuid(aggregate_id)).order_by("version"))
