"""The ordered registry of projections and the ``post_save`` hook feeding it.

Each newly created :class:`~kumiko_workflows.models.Event` is handed to every
projection that handles its type, synchronously, inside the appending
transaction. A projection that raises rolls the append back. Rows written by
``bulk_create`` or raw SQL bypass ``post_save`` and so are never projected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kumiko_workflows.models import Event

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


class ProjectionRegistry:
    def __init__(self) -> None:
        self._projections: list[Projection] = []

    def register(
        self,
        name: str,
        handles: Callable[[str], bool] | set[str] | frozenset[str] | tuple[str, ...],
        apply: Handler,
        *,
        order: int = 100,
        replay: bool = True,
    ) -> Projection:
        """Add a projection; ``handles`` is a set of event types or a predicate."""
        if name in self:
            raise ValueError(f"a projection named {name!r} is already registered")
        predicate = handles if callable(handles) else frozenset(handles).__contains__
        projection = Projection(order, name, predicate, apply, replay)
        self._projections.append(projection)
        self._projections.sort()
        return projection

    def unregister(self, name: str) -> None:
        self._projections = [p for p in self._projections if p.name != name]

    def __contains__(self, name: str) -> bool:
        return any(p.name == name for p in self._projections)

    def handles(self, event_type: str, *, replaying: bool = False) -> bool:
        """Whether any projection (any replayed one, when ``replaying``) handles the type."""
        return any(p.handles(event_type) for p in self._projections if p.replay or not replaying)

    def dispatch(self, event: Event, *, replaying: bool = False) -> None:
        for projection in self._projections:
            if replaying and not projection.replay:
                continue
            if projection.handles(event.type):
                projection.apply(event, replaying)


registry = ProjectionRegistry()


def on_event_saved(sender: Any, instance: Event, created: bool, raw: bool, **kwargs: Any) -> None:
    if not created or raw:
        return
    instance._kw_inserted = True  # type: ignore[attr-defined]
    registry.dispatch(instance)
