"""The ordered registry of projections and the ``post_save`` hook feeding it.

Each newly created :class:`~kumiko_workflows.models.Event` is handed to every
projection that handles its type, synchronously, inside the appending
transaction. A projection that raises rolls the append back. Rows written by
``bulk_create`` or raw SQL bypass ``post_save`` and so are never projected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models.signals import post_save

from kumiko_workflows.models import Event
from kumiko_workflows.workflow.registry import registry as workflows

Handler = Callable[[Event, bool], None]


@dataclass(order=True)
class Projection:
    order: int
    name: str = field(compare=False)
    handles: Callable[[str], bool] = field(compare=False)
    apply: Handler = field(compare=False)
    #: Whether ``rebuild_workflow_projections`` replays it. Projections with
    #: side effects (starting runs) must say False.
    replay: bool = field(default=True, compare=False)
    #: One of the engine's own (which raise only when the database does).
    builtin: bool = field(default=False, compare=False)
    #: The write ``apply`` would make for an event, said ahead so the store
    #: can chain it to the event's insert (one statement): (model, values,
    #: where) of an ``UPDATE``, or None to be applied as usual.
    fold: Callable[[Event], Any] | None = field(default=None, compare=False)
    #: For the wake-up reaction: its first statement (leaving the event's
    #: wake-up check, see ``store.db.insert_checked_sql``) rides in the
    #: event's insert when it is the only projection of the type, and this
    #: does the rest, given (check id, wait paths, scanned waits) instead of
    #: ``apply``.
    after_check: Callable[[Event, tuple[int, list[str], bool]], None] | None = field(
        default=None, compare=False
    )


#: Event types whose projections are remembered before the memo is emptied.
_TYPES_LIMIT = 4096


class ProjectionRegistry:
    def __init__(self) -> None:
        self._projections: list[Projection] = []
        # Per event type, the projections that may handle it, in order: the
        # engine's own only if they do (their predicates depend on the type and
        # the workflow definitions alone, so the answer is kept until those
        # change), a site's always, asked again at each event (its predicate is
        # its own business). Every event of a resume asks four times.
        self._by_type: dict[str, tuple[Projection, ...]] = {}
        self._generation = -1

    def _for(self, event_type: str) -> tuple[Projection, ...]:
        """The projections that handle ``event_type``, but for a site's: ask those again."""
        if self._generation != workflows.generation:
            self._by_type = {}
            self._generation = workflows.generation
        found = self._by_type.get(event_type)
        if found is None:
            if len(self._by_type) >= _TYPES_LIMIT:
                self._by_type = {}
            found = self._by_type[event_type] = tuple(
                p for p in self._projections if not p.builtin or p.handles(event_type)
            )
        return found

    @staticmethod
    def _handling(projection: Projection, event_type: str) -> bool:
        return projection.builtin or projection.handles(event_type)

    def register(
        self,
        name: str,
        handles: Callable[[str], bool] | set[str] | frozenset[str] | tuple[str, ...],
        apply: Handler,
        *,
        order: int = 100,
        replay: bool = True,
        builtin: bool = False,
        fold: Callable[[Event], Any] | None = None,
        after_check: Callable[[Event, tuple[int, list[str], bool]], None] | None = None,
    ) -> Projection:
        """Add a projection; ``handles`` is a set of event types or a predicate."""
        if name in self:
            raise ValueError(f"a projection named {name!r} is already registered")
        predicate = handles if callable(handles) else frozenset(handles).__contains__
        projection = Projection(order, name, predicate, apply, replay, builtin, fold, after_check)
        self._projections.append(projection)
        self._projections.sort()
        self._by_type = {}
        return projection

    def unregister(self, name: str) -> None:
        self._projections = [p for p in self._projections if p.name != name]
        self._by_type = {}

    def __contains__(self, name: str) -> bool:
        return any(p.name == name for p in self._projections)

    def handles(self, event_type: str, *, replaying: bool = False) -> bool:
        """Whether any projection (any replayed one, when ``replaying``) handles the type."""
        for projection in self._for(event_type):  # asked on every append: a plain loop
            if (projection.replay or not replaying) and self._handling(projection, event_type):
                return True
        return False

    def checked_alone(self, event_type: str) -> Projection | None:
        """The projection with ``after_check`` if it is the only one that handles the type."""
        found = None
        for projection in self._for(event_type):
            if self._handling(projection, event_type):
                if found is not None or projection.after_check is None:
                    return None
                found = projection
        return found

    def foreign_handlers(self, event_types: Iterable[str]) -> bool:
        """Whether a projection other than the engine's own handles any of ``event_types``."""
        return any(
            not projection.builtin and any(projection.handles(t) for t in event_types)
            for projection in self._projections
        )

    def folds(self, event: Event) -> list[tuple[str, Any]]:
        """(projection name, write) of each projection that says its write for ``event`` ahead.

        The caller chains those writes to the event's insert and marks the
        event (:func:`mark_applied`) so :meth:`dispatch` does not apply them again.
        """
        found = []
        for projection in self._for(event.type):
            if projection.fold is not None and self._handling(projection, event.type):
                write = projection.fold(event)
                if write is not None:
                    found.append((projection.name, write))
        return found

    def dispatch(self, event: Event, *, replaying: bool = False) -> None:
        done = () if replaying else getattr(event, "_kumiko_folded", ())
        type = event.type
        for projection in self._for(type):
            if replaying and not projection.replay:
                continue
            if self._handling(projection, type) and projection.name not in done:
                projection.apply(event, replaying)


registry = ProjectionRegistry()


def mark_applied(event: Event, names: Iterable[str]) -> None:
    """Mark ``event``'s projections ``names`` as applied already (their writes were chained)."""
    event._kumiko_folded = frozenset(names)  # type: ignore[attr-defined]


def on_event_saved(sender: Any, instance: Event, created: bool, raw: bool, **kwargs: Any) -> None:
    if not created or raw:
        return
    registry.dispatch(instance)


def others_listen_to_post_save() -> bool:
    """Whether a receiver besides :func:`on_event_saved` gets ``post_save`` for events.

    A site's own receivers (for ``Event``, or for every model) must see
    every new event; when there are none and no projection handles an
    event's type, ``append_event`` need not send the signal at all.
    ``has_listeners`` would count ``on_event_saved`` too: this asks the
    signal for its live receivers (cached per sender by Django), the same
    list ``send`` would call.
    """
    sync_receivers, async_receivers = post_save._live_receivers(Event)
    return bool(async_receivers) or any(r is not on_event_saved for r in sync_receivers)
