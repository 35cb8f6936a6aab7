"""Every problem of a workflow definition, each with its system check id and hint.

``define_workflow`` raises on the first error; the system checks report them
all, so a problem has one message and one check id (``kumiko_workflows.E0xx``)
wherever it is reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kumiko_workflows.workflow.step_kind import callable_name, iter_steps, path_text

if TYPE_CHECKING:
    from kumiko_workflows.workflow.definition import Workflow

from kumiko_workflows.workflow.cron import CronTrigger, cron_problem
from kumiko_workflows.workflow.positions import parse_path
from kumiko_workflows.workflow.triggers import EventTrigger


@dataclass(frozen=True)
class Problem:
    id: str
    message: str
    hint: str = ""


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
    for path, step in iter_steps(workflow.steps):
        for arg, value in step.callables():
            yield f"step {path_text(path)} ({step.label()}) {arg}", value
