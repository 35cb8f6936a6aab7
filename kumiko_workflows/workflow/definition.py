"""Workflow definitions: what a workflow is (:class:`Workflow`), :func:`define_workflow`, run ids.

``define_workflow`` validates a definition (:mod:`~kumiko_workflows.workflow.validation`),
computes its fingerprint (:mod:`~kumiko_workflows.workflow.fingerprints`) and
registers it process-wide (:mod:`~kumiko_workflows.workflow.registry`). The
triggers are :mod:`~kumiko_workflows.workflow.triggers` and
:mod:`~kumiko_workflows.workflow.cron`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import (
    InvalidArgument,
    WorkflowDefinitionError,
)
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow import priorities
from kumiko_workflows.workflow.arguments import int_between
from kumiko_workflows.workflow.cron import CronTrigger
from kumiko_workflows.workflow.fingerprints import _hash
from kumiko_workflows.workflow.limits import Limit, Rate
from kumiko_workflows.workflow.positions import _path_sort_key, parse_path, reach_text, reached
from kumiko_workflows.workflow.registry import registry
from kumiko_workflows.workflow.step_kind import (
    Step,
    _step_list,
    describe_value,
    iter_steps,
    path_text,
)
from kumiko_workflows.workflow.triggers import CallTrigger, EventTrigger
from kumiko_workflows.workflow.validation import validate

_RUN_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://kumiko-workflows/workflow-run")


#: How a worker commits the resumes of a workflow's runs: with others in a
#: batch (fast), or each on its own (a killed worker repeats no other run).
COMMIT_MODES = ("batch", "per_run")
#: The highest ``version=``: the runs' ``workflow_version`` columns are
#: PostgreSQL integers (on every database, so a definition that works on
#: SQLite works on PostgreSQL). A higher one would fail every start.
MAX_VERSION = 2**31 - 1
#: Where a triggered run's first steps run: in the appending transaction, or
#: in a worker right after it commits.
START_MODES = ("inline", "worker")
#: What a ``singleton=`` workflow does with a trigger while a run of its key is active.
SINGLETON_MODES = ("skip", "queue")


class Workflow:
    """A validated, registered workflow definition. Build with :func:`define_workflow`."""

    def __init__(
        self,
        name: str,
        trigger: EventTrigger | CronTrigger | CallTrigger,
        steps: Sequence[Step],
        idempotency_key: str | Callable[[Any], Any] | None = None,
        awaits: Mapping[str, str] | None = None,
        version: int = 1,
        commit: str = "batch",
        start: str = "inline",
        migrates_from: Mapping[int, Mapping[str, str]] | None = None,
        search_key: Callable[[Any], Any] | None = None,
        returns: str | Callable[[Any], Any] | None = None,
        concurrency: Limit | None = None,
        rate: Rate | None = None,
        priority: priorities.Priority = None,
        singleton: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise WorkflowDefinitionError(
                f"a workflow needs a name (1-200 characters), got {name!r}"
            )
        if not isinstance(trigger, EventTrigger | CronTrigger | CallTrigger):
            raise WorkflowDefinitionError(
                f"workflow {name!r}: trigger must be on_event(...), on_cron(...) or on_call(), "
                f"got {trigger!r}"
            )
        if returns is not None and not (
            (isinstance(returns, str) and returns.strip()) or callable(returns)
        ):
            raise WorkflowDefinitionError(
                f"workflow {name!r}: returns must be a step's result name, a callable(ctx) "
                f"or None, got {returns!r}"
            )
        #: What a run returns to a parent that called it: a result name, a
        #: callable(ctx), or None: the result of its last top-level step.
        self.returns = returns
        if idempotency_key is not None and not (
            isinstance(idempotency_key, str) or callable(idempotency_key)
        ):
            raise WorkflowDefinitionError(
                f"workflow {name!r}: idempotency_key must be a string, a callable or None"
            )
        if search_key is not None and not callable(search_key):
            raise WorkflowDefinitionError(
                f"workflow {name!r}: search_key must be a callable (event -> str) or None, "
                f"got {search_key!r}"
            )
        if commit not in COMMIT_MODES:
            raise WorkflowDefinitionError(
                f"workflow {name!r}: commit must be one of {', '.join(COMMIT_MODES)}, "
                f"got {commit!r}"
            )
        #: "per_run": a worker commits right after each resume of this
        #: workflow's runs, so a killed worker never repeats a finished one.
        self.commit = commit
        if start not in START_MODES:
            raise WorkflowDefinitionError(
                f"workflow {name!r}: start must be one of {', '.join(START_MODES)}, got {start!r}"
            )
        #: "worker": a trigger queues the run; a worker runs its steps.
        self.start = start
        wrong = priorities.definition_problem(priority)
        if wrong:
            raise WorkflowDefinitionError(
                f"[kumiko_workflows.E115] workflow {name!r}: priority: {wrong}"
            )
        #: The runs' priority (a number, or a callable of the trigger event); a
        #: trigger's own wins. Not in the fingerprint: it changes no step.
        self.priority = priority
        if singleton is not None and singleton not in SINGLETON_MODES:
            raise WorkflowDefinitionError(
                f"[kumiko_workflows.E118] workflow {name!r}: singleton must be one of "
                f"{', '.join(map(repr, SINGLETON_MODES))} or None, got {singleton!r}"
            )
        if singleton is not None and not isinstance(trigger, EventTrigger):
            raise WorkflowDefinitionError(
                f"[kumiko_workflows.E118] workflow {name!r}: singleton= needs an on_event "
                "trigger (a cron workflow's runs are keyed by their slot)"
            )
        if singleton is not None and getattr(trigger, "debounce", None) is not None:
            raise WorkflowDefinitionError(
                f"[kumiko_workflows.E119] workflow {name!r}: a debounced trigger opens one run "
                "per key at a time already; give debounce= or singleton=, not both"
            )
        #: "skip" or "queue": a trigger while a run of its key is active is
        #: skipped, or its run waits until that run ends (engine/gates).
        #: Like ``debounce``, not in the fingerprint: it decides starts only.
        self.singleton = singleton
        awaits = dict(awaits or {})
        for key, event_type in awaits.items():
            if not isinstance(key, str) or not isinstance(event_type, str) or not event_type:
                raise WorkflowDefinitionError(
                    f"workflow {name!r}: awaits maps keys to event types (strings), "
                    f"got {key!r}: {event_type!r}"
                )
            if (
                et.is_run_event(event_type)
                or event_type in et.SCHEDULE_EVENTS
                or event_type in et.CALL_EVENTS
            ):
                # Engine events live in engine streams, which the look-back
                # (and the payload index it uses) leaves out.
                raise WorkflowDefinitionError(
                    f"workflow {name!r}: awaits[{key!r}] is the engine's own event type "
                    f"{event_type!r}; await a domain event instead"
                )
        if not int_between(version, 1, MAX_VERSION):
            raise WorkflowDefinitionError(
                f"workflow {name!r}: version must be an integer from 1 to {MAX_VERSION}, "
                f"got {version!r}"
            )
        self.name = name
        self.trigger = trigger
        self.steps = _step_list(steps, f"workflow {name!r}: steps")
        self.idempotency_key = idempotency_key
        #: ``event -> str``: what the admin's search finds a run by. Not in the
        #: fingerprint: it changes no step, so changing it strands no run.
        self.search_key = search_key
        #: Flow control (:mod:`kumiko_workflows.workflow.limits`): checked by
        #: :func:`validate` (E111-E114). Not in the fingerprint: a cap decides
        #: when steps run, not what they do, so changing one strands no run.
        self.concurrency = concurrency
        self.rate = rate
        self.awaits = awaits
        self.version = version
        #: Explicit moves of suspended runs of older versions to this one:
        #: {old version: {old step position: position in this version}}.
        #: Applied only by ``migrate_workflow_runs``; not part of the
        #: fingerprint, so adding it to a version that has runs strands none.
        self.migrates_from = _migration_maps(name, version, migrates_from)
        self._steps_by_path = {path_text(p): s for p, s in iter_steps(self.steps)}
        #: Whether a step has a compensation (each of its steps then keeps its
        #: writes when a later one fails, for the compensations to undo).
        self.compensates = any(
            getattr(step, "compensate", None) is not None for step in self._steps_by_path.values()
        )
        #: Whether a step starts child runs (call_workflow, fan_out).
        self.has_children = any(
            "children" in step.resumes_from for step in self._steps_by_path.values()
        )
        self.step_fingerprints = self._step_fingerprints()
        self.fingerprint = _hash(self.step_fingerprints)

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r} v{self.version} {self.fingerprint[:12]}>"

    @property
    def limited(self) -> bool:
        """Whether a worker must admit each segment (a concurrency or rate limit).

        Such a workflow's runs start in a worker (as ``start="worker"``), so
        every segment, the first included, is admitted where slots are taken.
        """
        return self.concurrency is not None or self.rate is not None

    def _step_fingerprints(self) -> dict[str, str]:
        header = {
            "name": self.name,
            "version": self.version,
            "trigger": self.trigger.describe(),
            "awaits": self.awaits,
            "idempotency_key": describe_value(self.idempotency_key),
        }
        if self.returns is not None:  # absent otherwise: existing fingerprints stay
            header["returns"] = describe_value(self.returns)
        prints = {"workflow": _hash(header)[:16]}
        for path, step in iter_steps(self.steps):
            own = step.describe()
            own["arms"] = {arm: len(children) for arm, children in step.arms().items()}
            prints[path_text(path)] = _hash(own)[:16]
        return prints

    def step_at(self, path: str) -> Step | None:
        return self._steps_by_path.get(path)

    def label(self, path: str) -> str:
        step = self.step_at(path)
        return f"step {path} ({step.label()})" if step else f"step {path or '(start)'}"

    def changes_since(self, old_prints: Mapping[str, str] | None) -> str:
        """Describe how this definition differs from ``old_prints`` (step fingerprints)."""
        if not old_prints:
            return "its definition changed"
        return "; ".join(self._changes(old_prints, None)) or "its definition changed"

    def changes_for_run(self, old_prints: Mapping[str, str], position: str) -> list[str]:
        """What changed, from ``old_prints`` (a run's definition), that a run at ``position`` met.

        A run at a step position has run, or may have run, every step before
        it (earlier steps with all they hold, and the branches it is inside),
        and waits at that step (with its body: a retry runs it again). An
        edit anywhere else (steps after it, the other arm of the branch it
        is in) leaves it free to resume on this definition; an empty list
        says so. ``old_prints`` is the run's ``step_fingerprints``.
        """
        return self._changes(old_prints, position)

    def _changes(self, old_prints: Mapping[str, str], position: str | None) -> list[str]:
        """Each difference from ``old_prints``; with ``position``, only those a run there met."""
        changes = []
        if old_prints.get("workflow") != self.step_fingerprints["workflow"]:
            changes.append("the workflow's trigger, version, awaits or idempotency key changed")
        for path in sorted(set(old_prints) | set(self.step_fingerprints), key=_path_sort_key):
            if path == "workflow" or (position is not None and not reached(path, position)):
                continue
            old, new = old_prints.get(path), self.step_fingerprints.get(path)
            if old == new:
                continue
            where = "" if position is None else " " + reach_text(path, position)
            if old is None:
                changes.append(f"{self.label(path)} was added{where}")
            elif new is None:
                changes.append(f"step {path}{where} was removed")
            else:
                changes.append(f"{self.label(path)}{where} changed")
        return changes

    def next_position(self, path: str) -> str:
        """The position that runs after the step at ``path`` ('' past the last step)."""
        parts = parse_path(path)
        while parts:
            parent_steps = self.steps
            for i in range(0, len(parts) - 1, 2):
                parent_steps = parent_steps[parts[i]].arms()[parts[i + 1]]
            index = parts[-1]
            if index + 1 < len(parent_steps):
                return path_text((*parts[:-1], index + 1))
            parts = parts[:-2]
        return ""


def _migration_maps(
    name: str, version: int, migrates_from: Mapping[int, Mapping[str, str]] | None
) -> dict[int, dict[str, str]]:
    """``migrates_from`` checked for shape; where its positions lead is :func:`validate`'s."""
    where = f"workflow {name!r} version {version}: migrates_from"
    if migrates_from is None:
        return {}
    if not isinstance(migrates_from, Mapping):
        raise WorkflowDefinitionError(
            f"{where} must map older versions to {{old step position: new step position}}, "
            f"got {migrates_from!r}"
        )
    maps: dict[int, dict[str, str]] = {}
    for old, positions in migrates_from.items():
        if not int_between(old, 1, version - 1):
            raise WorkflowDefinitionError(
                f"{where} names version {old!r}; give older versions of this workflow "
                f"(integers from 1 to {version - 1})"
            )
        if not isinstance(positions, Mapping) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in positions.items()
        ):
            raise WorkflowDefinitionError(
                f"{where}[{old}] must map step positions to step positions (strings such as "
                f'"1" or "2.else.0"), got {positions!r}'
            )
        maps[old] = dict(positions)
    return maps


def define_workflow(
    name: str,
    trigger: EventTrigger | CronTrigger | CallTrigger,
    steps: Sequence[Step],
    idempotency_key: str | Callable[[Any], Any] | None = None,
    awaits: Mapping[str, str] | None = None,
    version: int = 1,
    *,
    commit: str = "batch",
    start: str = "inline",
    migrates_from: Mapping[int, Mapping[str, str]] | None = None,
    search_key: Callable[[Any], Any] | None = None,
    returns: str | Callable[[Any], Any] | None = None,
    concurrency: Limit | None = None,
    rate: Rate | None = None,
    priority: priorities.Priority = None,
    singleton: str | None = None,
    register: bool = True,
) -> Workflow:
    """Define a workflow and register it under ``name`` and ``version``.

    Several versions of one name may be declared at once: new runs start on
    the highest, a run resumes on its own. Raises
    :class:`WorkflowDefinitionError` naming the first problem (with its
    system check id). ``commit="per_run"`` makes workers commit right after each
    resume of this workflow's runs (for steps with side effects outside the
    database); the default shares a commit with other runs.
    ``start="worker"`` queues each new run for a worker instead of running
    its first steps in the transaction that appended the trigger (see
    :func:`kumiko_workflows.start_in_worker` for one call).
    ``migrates_from={1: {"1": "2"}}`` says where a run of version 1 waiting
    at step 1 may continue in this version, for ``migrate_workflow_runs``
    (nothing moves until that runs). ``search_key`` (``event -> str``, at
    most 200 characters) is what the admin's search finds a run by, e.g. an
    order number; without it, the idempotency key. ``returns`` is what a
    run gives a parent that called it (``steps.call_workflow``): a step's
    result name, ``callable(ctx)``, or None for the result of its last
    top-level step.
    ``concurrency=Limit(max=2, key=fn, holds="active")`` caps the runs that
    hold a slot at once per key, and ``rate=Rate(max=10, per=60, key=fn)``
    the segment starts per period (see :mod:`kumiko_workflows.workflow.limits`);
    a workflow with either starts its runs in a worker. ``priority`` (-100 to
    100, or a callable of the trigger event) orders its runs among due
    work with a bounded head start (docs/howto/priorities.md).
    ``singleton="skip"`` or ``"queue"``: while a run of a key (the
    ``idempotency_key``; None: the workflow's one key) is active, a new
    trigger of the key is skipped, or its run waits until the active one
    ends. Pass ``register=False``
    to build a definition without registering it (for
    :meth:`kumiko_workflows.workflow.registry.WorkflowRegistry.override`).
    """
    workflow = Workflow(
        name,
        trigger,
        steps,
        idempotency_key,
        awaits,
        version,
        commit,
        start,
        migrates_from,
        search_key=search_key,
        returns=returns,
        concurrency=concurrency,
        rate=rate,
        priority=priority,
        singleton=singleton,
    )
    problems = [problem for problem in validate(workflow) if ".E" in problem.id]
    if problems:
        first = problems[0]
        hint = f" HINT: {first.hint}" if first.hint else ""
        raise WorkflowDefinitionError(f"[{first.id}] {first.message}.{hint}")
    return registry.register(workflow) if register else workflow


def run_id_for(workflow_name: str, idempotency_key: Any, tenant_id: str | None = None) -> uuid.UUID:
    """The run id for a workflow, idempotency key and tenant (uuid5; stable forever)."""

    if tenant_id is None:
        tenant_id = workflow_settings.DEFAULT_TENANT
    if isinstance(idempotency_key, bool) or not isinstance(idempotency_key, str | int | uuid.UUID):
        raise InvalidArgument(
            f"idempotency key must be a string (or int/UUID), got {idempotency_key!r}"
        )
    return uuid.uuid5(_RUN_NAMESPACE, f"{tenant_id}\x1f{workflow_name}\x1f{idempotency_key}")
