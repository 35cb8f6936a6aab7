"""Streams' identity: the engine's reserved streams, and the stream id of a model instance."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db.models import Model

from kumiko_workflows.exceptions import (
    InvalidEvent,
)
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.arguments import clipped_repr, is_int

#: The engine's streams, with which event types each takes (and their name
#: in errors): any other event there would move the stream's version under a
#: suspended run, or a schedule's, and strand it.
ENGINE_STREAMS: dict[str, tuple[Callable[[str], bool], str]] = {
    et.RUN_AGGREGATE_TYPE: (et.is_run_event, "workflow run events"),
    et.SCHEDULE_AGGREGATE_TYPE: (
        frozenset(et.SCHEDULE_EVENTS).__contains__,
        "cron schedule events",
    ),
    et.GATE_AGGREGATE_TYPE: (frozenset(et.GATE_EVENTS).__contains__, "workflow gate events"),
    et.CALL_AGGREGATE_TYPE: (frozenset(et.CALL_EVENTS).__contains__, "child run requests"),
}
_engine_writing: ContextVar[bool] = ContextVar("kumiko_workflows_engine_writing", default=False)


@contextmanager
def engine_stream() -> Iterator[None]:
    """Let the engine append to its reserved streams (runs, cron schedules)."""
    token = _engine_writing.set(True)
    try:
        yield
    finally:
        _engine_writing.reset(token)


#: The namespace of model instances' stream ids. Fixed for ever: the stream
#: id of a row must never change, and anyone may compute it elsewhere.
MODEL_STREAM_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://kumiko-workflows/model-instance")


def stream_id_for(instance: Model) -> uuid.UUID:
    """The stream id of a model instance: the same for the same row, always.

    ``uuid5(MODEL_STREAM_NAMESPACE, "<app_label>.<model_name>:<pk>")`` with
    the concrete model's lower-case label (a proxy shares its model's
    streams) and the primary key as its field reads it back (``42``, a
    UUID's canonical text). ``append_event`` and ``load_stream`` take the
    instance itself and use this. Raises :class:`InvalidEvent` for anything
    but a model instance with a primary key (an unsaved one has none).
    """
    if not isinstance(instance, Model):
        raise InvalidEvent(f"stream_id_for takes a model instance, got {clipped_repr(instance)}")
    meta = (instance._meta.concrete_model or type(instance))._meta
    pk = instance.pk
    # A composite key's parts are joined as they are; a single key is read
    # back through its field, so "42" and 42 name one stream.
    parts = pk if isinstance(pk, tuple) else (None if pk is None else meta.pk.to_python(pk),)
    if None in parts:
        raise InvalidEvent(f"a {meta.label} without a primary key names no stream: save it first")
    return uuid.uuid5(MODEL_STREAM_NAMESPACE, f"{meta.label_lower}:" + "\x1f".join(map(str, parts)))


def _as_uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    elif isinstance(value, Model):
        return stream_id_for(value)
    elif is_int(value):
        raise InvalidEvent(
            f"aggregate_id must be a UUID or a saved model instance, got {clipped_repr(value)}: "
            "an integer is not a stream id; pass the model instance itself (its stream id "
            "is kumiko_workflows.stream_id_for(instance)), or a UUID of your own"
        )
    raise InvalidEvent(
        f"aggregate_id must be a UUID or a saved model instance, got {clipped_repr(value)}"
    )
