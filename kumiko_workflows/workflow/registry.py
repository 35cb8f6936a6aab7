"""The process-wide registry of workflow definitions, by name and version."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kumiko_workflows.exceptions import (
    RegistryNotReady,
    WorkflowDefinitionError,
)

if TYPE_CHECKING:
    from kumiko_workflows.workflow.definition import Workflow

from kumiko_workflows.workflow.triggers import EventTrigger


class WorkflowRegistry:
    """The process-wide set of workflow definitions, filled by autodiscovery.

    A name may be declared at several versions at once: new runs start on the
    highest, and a run resumes on the version it started under (or was moved
    to), so a deploy that adds a version strands no run of an older one.
    """

    def __init__(self) -> None:
        self._workflows: dict[str, dict[int, Workflow]] = {}
        self._by_trigger: dict[str, list[Workflow]] | None = None
        self._awaited: frozenset[str] | None = None
        self._holding: frozenset[str] | None = None
        #: Bumped on every change of the definitions: what others derived from them
        #: (the projections' matches per event type) is stale once it moves.
        self.generation = 0
        #: Whether Django's app registry was found ready (it stays so once it is).
        self._apps_ready = False

    def _changed(self) -> None:
        self.generation += 1
        self._by_trigger = None
        self._awaited = None
        self._holding = None

    def holds_slots_to_the_end(self, name: str) -> bool:
        """Whether a declared version of ``name`` limits it with ``holds="active"``."""
        if self._holding is None:
            self._holding = frozenset(
                each
                for each, versions in self._workflows.items()
                if any(
                    w.concurrency is not None and w.concurrency.holds == "active"
                    for w in versions.values()
                )
            )
        return name in self._holding

    def _copy(self) -> dict[str, dict[int, Workflow]]:
        return {name: dict(versions) for name, versions in self._workflows.items()}

    def register(self, workflow: Workflow) -> Workflow:
        versions = self._workflows.setdefault(workflow.name, {})
        existing = versions.get(workflow.version)
        if existing is not None:
            if existing.fingerprint == workflow.fingerprint:
                return existing  # the same module imported again
            raise WorkflowDefinitionError(
                f"a workflow named {workflow.name!r} is already defined at version "
                f"{workflow.version}; a name and version define one workflow (declare a "
                "changed definition under another version=, beside the old one)"
            )
        versions[workflow.version] = workflow
        self._changed()
        return workflow

    def _check_ready(self) -> None:
        if self._apps_ready:
            return  # ready once, ready for good: not asked again on every look-up
        from django.apps import apps

        if not apps.ready:
            raise RegistryNotReady()
        self._apps_ready = True

    def get(self, name: str, version: int | None = None) -> Workflow | None:
        """The definition of ``name`` at ``version``; None: the highest (new runs start on it)."""
        self._check_ready()
        versions = self._workflows.get(name)
        if not versions:
            return None
        return versions[max(versions)] if version is None else versions.get(version)

    def versions(self, name: str) -> list[Workflow]:
        """Every declared version of ``name``, lowest first."""
        self._check_ready()
        return [w for _, w in sorted(self._workflows.get(name, {}).items())]

    def of_run(self, name: str, version: int | None, fingerprint: str) -> Workflow | None:
        """The definition a run resumes on, or None if the code no longer declares it.

        ``version`` is the one the run's stream records. A run started before
        versions were recorded (None) resumes on the declared version whose
        fingerprint is the run's: the fingerprint covers the version.
        """
        if version is not None:
            return self.get(name, version)
        return next((w for w in self.versions(name) if w.fingerprint == fingerprint), None)

    def all(self) -> list[Workflow]:
        """The highest version of each workflow, by name: the ones new runs start on."""
        self._check_ready()
        return [versions[max(versions)] for _, versions in sorted(self._workflows.items())]

    def every_version(self) -> list[Workflow]:
        """Every declared definition, by name and version."""
        self._check_ready()
        return [w for name in sorted(self._workflows) for w in self.versions(name)]

    def triggered_by(self, event_type: str) -> list[Workflow]:
        """The workflows an event of ``event_type`` starts, each at its highest version."""
        if self._by_trigger is None:
            index: dict[str, list[Workflow]] = {}
            for versions in self._workflows.values():
                workflow = versions[max(versions)]
                if isinstance(workflow.trigger, EventTrigger):
                    index.setdefault(workflow.trigger.event_type, []).append(workflow)
            self._by_trigger = index
        return self._by_trigger.get(event_type, [])

    def is_awaited(self, event_type: str) -> bool:
        """Whether a run of any declared version may wait for ``event_type``."""
        if self._awaited is None:
            self._awaited = frozenset(
                t
                for versions in self._workflows.values()
                for workflow in versions.values()
                for t in workflow.awaits.values()
            )
        return event_type in self._awaited

    def is_trigger(self, event_type: str) -> bool:
        return bool(self.triggered_by(event_type))

    @contextmanager
    def override(self, *workflows: Workflow) -> Iterator[None]:
        """Swap in definitions for the duration of a block (tests, deploy drills).

        Each name given is declared at exactly the versions given for it
        (``override(v2)`` alone is a deploy that removed v1). Build them with
        ``define_workflow(..., register=False)``.
        """
        saved = self._copy()
        try:
            given: dict[str, dict[int, Workflow]] = {}
            for workflow in workflows:
                given.setdefault(workflow.name, {})[workflow.version] = workflow
            self._workflows.update(given)
            self._changed()
            yield
        finally:
            self._workflows = saved
            self._changed()

    @contextmanager
    def without(self, *names: str) -> Iterator[None]:
        """Hide definitions, every version, for the duration of a block (an undeployed workflow)."""
        saved = self._copy()
        try:
            for name in names:
                self._workflows.pop(name, None)
            self._changed()
            yield
        finally:
            self._workflows = saved
            self._changed()


registry = WorkflowRegistry()
