"""What a step's callables receive as ``ctx``: the run, its trigger and its results so far.

A :class:`RunContext` is made for each segment (an inline start, a resume)
from the run's trigger event and its latest state, and gives a step its
run's id, tenant and trigger, the results of the steps before it, the
attempt inside a retry body, and an ``append_event`` in the run's
transaction and tenant; :meth:`RunContext.snapshot` is the state a
suspension keeps.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kumiko_workflows import telemetry
from kumiko_workflows.models import Event
from kumiko_workflows.store.events import append_event


class RunContext:
    """What a step's callables receive as ``ctx``.

    ``event`` is the trigger Event, ``steps`` the results so far (by compute
    name and awaits key), ``retry_attempt`` the attempt inside a retry body
    (1 on the first), ``now`` the time the current segment started.
    """

    def __init__(
        self,
        *,
        run_id: uuid.UUID,
        workflow_name: str,
        tenant_id: str,
        event: Event,
        steps: dict[str, Any] | None = None,
        awaited: dict[str, int | None] | None = None,
        now: datetime | None,
        parent: dict[str, Any] | None = None,
        attempts: dict[str, int] | None = None,
        compensable: list[str] | None = None,
    ) -> None:
        self.run_id = run_id
        self.workflow_name = workflow_name
        self.tenant_id = tenant_id
        self.event = event
        self.steps: dict[str, Any] = steps if steps is not None else {}
        self.awaited: dict[str, int | None] = awaited if awaited is not None else {}
        self.retry_attempt = 1
        self.now = now
        #: A child run's parent: {"run_id", "group", "index"} (None for other runs).
        self.parent = parent
        #: The attempt of each retry whose body the run is inside, by its position.
        self.attempts: dict[str, int] = dict(attempts or {})
        #: Positions of the finished steps with a compensation, in order; and the
        #: (step, group) of the child runs a resumed run waits for.
        self.compensable: list[str] = list(compensable or [])
        self.resumed_group: tuple[str, str] | None = None

    def __repr__(self) -> str:
        return f"<RunContext {self.workflow_name} {self.run_id}>"

    def append_event(
        self,
        aggregate_id: uuid.UUID | str,
        aggregate_type: str,
        type: str,
        payload: Mapping[str, Any] | None,
        **kwargs: Any,
    ) -> Event:
        """Append a domain event in the run's transaction (and the run's tenant)."""
        kwargs.setdefault("tenant_id", self.tenant_id)
        # A workflow name may be as long as created_by itself: cut to the column.
        limit = Event._meta.get_field("created_by").max_length
        kwargs.setdefault("created_by", f"workflow:{self.workflow_name}"[:limit])
        return append_event(aggregate_id, aggregate_type, type, payload, **kwargs)

    def snapshot(self) -> dict[str, Any]:
        """Step results for a suspension event: awaited events by reference only."""
        results = {k: v for k, v in self.steps.items() if k not in self.awaited}
        state: dict[str, Any] = {"results": results, "awaited": dict(self.awaited)}
        # Only when there is something to keep: older snapshots read the same.
        if self.parent is not None:
            state["parent"] = self.parent
        if self.attempts:
            state["attempts"] = dict(self.attempts)
        if self.compensable:
            state["compensable"] = list(self.compensable)
        return telemetry.carry(state)
