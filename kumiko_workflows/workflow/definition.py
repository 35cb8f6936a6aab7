"""Workflow definitions: triggers, validation, fingerprints and the registry.

``define_workflow`` validates a definition, computes its fingerprint and
registers it process-wide. The same validation feeds the system checks, so a
problem has one message and one check id (``kumiko_workflows.E0xx``) wherever
it is reported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
import zoneinfo
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kumiko_workflows import event_types as et
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import (
    InvalidArgument,
    RegistryNotReady,
    WorkflowDefinitionError,
)
from kumiko_workflows.steps import (
    Step,
    _step_list,
    callable_name,
    describe_value,
    iter_steps,
    path_text,
)

logger = logging.getLogger("kumiko_workflows.definition")

CATCH_UP_POLICIES = ("skip", "latest", "all")
#: A cron expression must fire within this many years of its definition.
CRON_HORIZON_YEARS = 5
#: croniter's random (R) and hashed (H) fields, as croniter itself matches them.
_HASHED_FIELD = re.compile(r"([hr])(\(\d+-\d+\))?(/\d+)?", re.IGNORECASE | re.ASCII)
_RUN_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://kumiko-workflows/workflow-run")


# --- triggers -------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class EventTrigger:
    event_type: str
    filter: Callable[[Any], Any] | None = None
    kind = "event"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "event",
            "type": self.event_type,
            "filter": callable_name(self.filter) if self.filter else None,
        }


@dataclass(frozen=True, eq=False)
class CronTrigger:
    expression: str
    timezone: str = "UTC"
    catch_up: str = "latest"
    kind = "cron"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "cron",
            "expression": self.expression,
            "timezone": self.timezone,
            "catch_up": self.catch_up,
        }

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)


@dataclass(frozen=True, eq=False)
class CallTrigger:
    """Runs started only by a parent's ``call_workflow`` or ``fan_out`` step."""

    kind = "call"

    def describe(self) -> dict[str, Any]:
        return {"kind": "call"}


def on_call() -> CallTrigger:
    """A workflow started only as a child run (``steps.call_workflow``, ``steps.fan_out``).

    Any workflow may be called; one with this trigger is never started by an
    event or a schedule. Its run's trigger is the parent's request, whose
    payload is the child's input.
    """
    return CallTrigger()


def on_event(event_type: str, filter: Callable[[Any], Any] | None = None) -> EventTrigger:
    """Start a run whenever an event of ``event_type`` is appended (and ``filter(event)``)."""
    if not isinstance(event_type, str) or not event_type.strip():
        raise WorkflowDefinitionError(f"on_event() needs an event type, got {event_type!r}")
    if filter is not None and not callable(filter):
        raise WorkflowDefinitionError(f"on_event(filter=...) must be callable, got {filter!r}")
    return EventTrigger(event_type, filter)


def cron_problem(
    expression: Any, timezone: Any, catch_up: Any, *, now: datetime | None = None
) -> str | None:
    """Why a cron trigger's arguments are invalid, or None.

    Besides syntax: every slot must be a fixed time (no random or hashed
    field), and the expression must fire within :data:`CRON_HORIZON_YEARS`
    after ``now`` (default: the current time).
    """
    from croniter import CroniterBadDateError, croniter

    if not isinstance(expression, str) or not expression.strip():
        return f"cron expression must be a non-empty string, got {expression!r}"
    fields = expression.split()
    if len(fields) not in (5, 6):
        return (
            f"cron expression {expression!r} has {len(fields)} fields; give 5 "
            "(minute hour day month weekday) or 6 (with seconds last)"
        )
    for field in fields:
        hashed = _HASHED_FIELD.fullmatch(field)
        if hashed and hashed.group(1).lower() == "r":
            # croniter accepts R, then draws a new value each time it reads the
            # expression: each pass would see another slot (a daily R R * * *
            # polled every minute fired 55 runs a day).
            return (
                f"cron expression {expression!r} has the random field {field!r}: croniter "
                "draws a new value each time it reads it, so each scheduler pass would see "
                "another slot and fire again; write the time out"
            )
        if hashed:
            return (
                f"cron expression {expression!r} has the hashed field {field!r}, which "
                "croniter resolves only with a hash id that on_cron does not take; write "
                "the time out"
            )
    try:
        if not croniter.is_valid(expression):
            return f"cron expression {expression!r} is not valid"
    except Exception as exc:  # croniter raises assorted errors on odd input
        return f"cron expression {expression!r} is not valid: {exc}"
    if not isinstance(timezone, str):
        return f"cron timezone must be an IANA name like 'Europe/Berlin', got {timezone!r}"
    try:
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f"cron timezone {timezone!r} is not a known IANA time zone"
    if catch_up not in CATCH_UP_POLICIES:
        return f"cron catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, got {catch_up!r}"
    start = (now or datetime.now(UTC)).astimezone(zoneinfo.ZoneInfo(timezone))
    try:
        croniter(
            expression, start.replace(tzinfo=None), max_years_between_matches=CRON_HORIZON_YEARS
        ).get_next(datetime)
    except CroniterBadDateError:
        # Valid to croniter, yet no date matches (30 February): every pass and
        # every look at the next slot would raise.
        return (
            f"cron expression {expression!r} never fires within the next "
            f"{CRON_HORIZON_YEARS} years: no date matches its day, month and weekday fields"
        )
    return None


def on_cron(expression: str, timezone: str = "UTC", catch_up: str = "latest") -> CronTrigger:
    """Start a run at each slot of a cron expression, in ``timezone``.

    ``catch_up`` says what a pass does with slots missed while no scheduler
    ran: ``skip`` fires none, ``latest`` fires the most recent once, ``all``
    fires each (at most ``KUMIKO_WORKFLOWS['CRON_CATCH_UP_LIMIT']`` a pass).
    """
    problem = cron_problem(expression, timezone, catch_up)
    if problem:
        raise WorkflowDefinitionError(f"[kumiko_workflows.E008] {problem}")
    return CronTrigger(expression, timezone, catch_up)


# --- validation -----------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    id: str
    message: str
    hint: str = ""


def parse_path(text: str) -> tuple[Any, ...]:
    """``"2.then.0"`` -> ``(2, "then", 0)``; raises ValueError on malformed text."""
    if not text:
        return ()
    parts: list[Any] = []
    for i, part in enumerate(text.split(".")):
        if i % 2 == 0:
            if not part.isdigit():
                raise ValueError(f"step position {text!r} is malformed")
            parts.append(int(part))
        else:
            if not part.isidentifier():  # an arm's name; the workflow knows which exist
                raise ValueError(f"step position {text!r} is malformed")
            parts.append(part)
    return tuple(parts)


def validate(workflow: Workflow) -> list[Problem]:
    """Every problem of a definition, as (check id, message, hint)."""
    problems: list[Problem] = []
    # Name the version once there may be several.
    name = repr(workflow.name) + (f" version {workflow.version}" if workflow.version > 1 else "")

    def add(check: str, message: str, hint: str = "") -> None:
        problems.append(Problem(f"kumiko_workflows.{check}", f"workflow {name}: {message}", hint))

    if not workflow.steps:
        add("E013", "has no steps", "Give define_workflow(steps=[...]) at least one step.")
    if isinstance(workflow.trigger, CronTrigger):
        problem = cron_problem(
            workflow.trigger.expression, workflow.trigger.timezone, workflow.trigger.catch_up
        )
        if problem:
            add(
                "E008",
                problem,
                "Use a 5-field cron expression of fixed times (no R or H fields) that names "
                "dates which exist, and an IANA time zone.",
            )
        if workflow.idempotency_key is not None:
            add(
                "E009",
                "a cron workflow's runs are keyed by their slot instant, so idempotency_key "
                "would be ignored",
                "Remove idempotency_key from this on_cron workflow.",
            )
    for where, fn in _callables(workflow):
        qualname = callable_name(fn)
        if "<lambda>" in qualname or "<locals>" in qualname:
            add(
                "W001",
                f"{where} is {qualname}; the fingerprint knows callables by name only, so "
                "a change to its body would not be noticed by runs already in flight",
                "Use a module-level function (or bump version= whenever you change it).",
            )
    seen: dict[str, str] = {}
    for path, step in iter_steps(workflow.steps):
        where = f"step {path_text(path)} ({step.label()})"
        result_name = step.result_name()
        if result_name is not None:
            if result_name in seen:
                add(
                    "E007",
                    f"{where} stores its result as ctx.steps[{result_name!r}], which "
                    f"{seen[result_name]} already uses",
                    "Give every compute step and awaits key a distinct name.",
                )
            seen[result_name] = where
        for check, message, hint in step.problems(workflow.awaits, path):
            add(check, message, hint)
    if isinstance(workflow.returns, str) and workflow.returns not in seen:
        add(
            "E130",
            f"returns={workflow.returns!r} names no step's result "
            f"(results: {', '.join(sorted(seen)) or 'none'})",
            "Name a compute step or awaits key of this workflow, or give a callable(ctx).",
        )
    for old, positions in sorted(workflow.migrates_from.items()):
        for source, target in sorted(positions.items()):
            try:
                parse_path(source)
            except ValueError:
                add(
                    "E014",
                    f"migrates_from[{old}] maps {source!r}, which is not a step position",
                    'Step positions are like "1" or "2.else.0" (see a run\'s step).',
                )
            if workflow.step_at(target) is None:
                add(
                    "E014",
                    f"migrates_from[{old}] maps step {source} to {target!r}, which this version "
                    "has no step at",
                    "Map each step a run of the old version may wait at to the position of "
                    "the same step in this version.",
                )
    return problems


def _callables(workflow: Workflow) -> Iterator[tuple[str, Any]]:
    """Every callable a definition holds, with where it stands."""
    trigger = workflow.trigger
    if isinstance(trigger, EventTrigger) and trigger.filter is not None:
        yield "the trigger filter", trigger.filter
    if callable(workflow.idempotency_key):
        yield "idempotency_key", workflow.idempotency_key
    if callable(workflow.returns):
        yield "returns", workflow.returns
    for path, step in iter_steps(workflow.steps):
        for arg, value in step.callables():
            yield f"step {path_text(path)} ({step.label()}) {arg}", value


# --- definitions ----------------------------------------------------------


def _unhashable(value: Any) -> dict[str, str]:
    # A static argument JSON cannot hold (validation reports it if it matters)
    # is fingerprinted by its type: stable across processes, unlike repr().
    return {"unserialisable": callable_name(type(value))}


def _hash(value: Any) -> str:
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=_unhashable
    )
    return hashlib.sha256(text.encode()).hexdigest()


ENGINE_EVENT_TYPES = frozenset({*et.RUN_EVENTS, *et.SCHEDULE_EVENTS, *et.CALL_EVENTS})

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
        awaits = dict(awaits or {})
        for key, event_type in awaits.items():
            if not isinstance(key, str) or not isinstance(event_type, str) or not event_type:
                raise WorkflowDefinitionError(
                    f"workflow {name!r}: awaits maps keys to event types (strings), "
                    f"got {key!r}: {event_type!r}"
                )
            if event_type in ENGINE_EVENT_TYPES:
                # Engine events live in engine streams, which the look-back
                # (and the payload index it uses) leaves out.
                raise WorkflowDefinitionError(
                    f"workflow {name!r}: awaits[{key!r}] is the engine's own event type "
                    f"{event_type!r}; await a domain event instead"
                )
        if (
            isinstance(version, bool)
            or not isinstance(version, int)
            or not 1 <= version <= MAX_VERSION
        ):
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
        parts = []
        if old_prints.get("workflow") != self.step_fingerprints["workflow"]:
            parts.append("the workflow's trigger, version, awaits or idempotency key changed")
        for path in sorted(set(old_prints) | set(self.step_fingerprints), key=_path_sort_key):
            if path == "workflow":
                continue
            old, new = old_prints.get(path), self.step_fingerprints.get(path)
            if old == new:
                continue
            if old is None:
                parts.append(f"{self.label(path)} was added")
            elif new is None:
                parts.append(f"step {path} was removed")
            else:
                parts.append(f"{self.label(path)} changed")
        return "; ".join(parts) or "its definition changed"

    def changes_for_run(self, old_prints: Mapping[str, str], position: str) -> list[str]:
        """What changed, from ``old_prints`` (a run's definition), that a run at ``position`` met.

        A run at a step position has run, or may have run, every step before
        it (earlier steps with all they hold, and the branches it is inside),
        and waits at that step (with its body: a retry runs it again). An
        edit anywhere else (steps after it, the other arm of the branch it
        is in) leaves it free to resume on this definition; an empty list
        says so. ``old_prints`` is the run's ``step_fingerprints``.
        """
        changes = []
        if old_prints.get("workflow") != self.step_fingerprints["workflow"]:
            changes.append("the workflow's trigger, version, awaits or idempotency key changed")
        for path in sorted(set(old_prints) | set(self.step_fingerprints), key=_path_sort_key):
            if path == "workflow" or not reached(path, position):
                continue
            old, new = old_prints.get(path), self.step_fingerprints.get(path)
            if old == new:
                continue
            where = reach_text(path, position)
            if old is None:
                changes.append(f"{self.label(path)} was added {where}")
            elif new is None:
                changes.append(f"step {path} {where} was removed")
            else:
                changes.append(f"{self.label(path)} {where} changed")
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
        if isinstance(old, bool) or not isinstance(old, int) or not 1 <= old < version:
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


def reached(path: str, position: str) -> bool:
    """Whether a run at step ``position`` has run (or waits at) the step at ``path``.

    True for the steps before it in its own list and in each list around it
    (with every step nested in them: which arm of an earlier branch ran is
    not recorded), for the steps it is nested in, and for the step itself
    with what it holds. False for the steps after it and for the other arm
    of a branch it is inside.
    """
    try:
        step, here = parse_path(path), parse_path(position)
    except ValueError:
        return True  # not a position: count it as met, the safe side
    for depth, (mine, theirs) in enumerate(zip(step, here, strict=False)):
        if mine != theirs:
            # Two indexes in one list: an earlier step was run. Two arm names:
            # the other arm of a branch the run is inside.
            return depth % 2 == 0 and mine < theirs
    return True  # one holds the other, or both are the same step


def reach_text(path: str, position: str) -> str:
    """How the step at ``path`` stands to a run at ``position``, for messages."""
    if path == position:
        return "(where the run waits)"
    if position.startswith(path + "."):
        return f"(which holds step {position}, where the run waits)"
    if path.startswith(position + "."):
        return f"(inside step {position}, where the run waits)"
    return f"(before step {position}, where the run waits)"


def _path_sort_key(path: str) -> tuple[Any, ...]:
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in _safe_parse(path))


def _safe_parse(path: str) -> tuple[Any, ...]:
    try:
        return parse_path(path)
    except ValueError:
        return (10**9, path)


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

    def _changed(self) -> None:
        self._by_trigger = None
        self._awaited = None

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

    @staticmethod
    def _check_ready() -> None:
        from django.apps import apps

        if not apps.ready:
            raise RegistryNotReady()

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
    top-level step. Pass ``register=False``
    to build a definition without registering it (for
    :meth:`WorkflowRegistry.override`).
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
