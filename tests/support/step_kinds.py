"""A step kind that exists only in the tests: the seam for new kinds, proven from outside.

``nap_until(hour)`` suspends the run until the next time the UTC clock shows
``hour`` o'clock. It is one class: its validation, its fingerprint, how it
runs and which suspension record it writes (the timed wait's). Nothing in
the package names it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kumiko_workflows import event_types as et
from kumiko_workflows.steps import (
    Execution,
    Path,
    Problem,
    Step,
    Suspend,
    describe_value,
    is_static,
    path_text,
)


def _hour_problem(hour: Any) -> str | None:
    if isinstance(hour, bool) or not isinstance(hour, int) or not 0 <= hour <= 23:
        return f"hour must be an integer from 0 to 23, got {hour!r}"
    return None


@dataclass(frozen=True, eq=False)
class NapUntil(Step):
    hour: Any
    kind = "nap_until"
    suspends = True
    resumes_from = ("wait",)  # the timed wait's suspension record
    callable_args = ("hour",)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "hour": describe_value(self.hour)}

    def problems(self, awaits: Mapping[str, str], path: Path) -> Iterator[Problem]:
        problem = _hour_problem(self.hour) if is_static(self.hour) else None
        if problem:
            yield "E901", f"step {path_text(path)} ({self.label()}): {problem}", "Use 0-23."

    def run(self, execution: Execution, path: Path) -> None:
        hour = execution.arg(path, "hour", self.hour)
        problem = _hour_problem(hour)
        if problem:
            raise execution.invalid(path, problem)
        wake_at = execution.now.replace(hour=hour, minute=0, second=0, microsecond=0)
        if wake_at <= execution.now:
            wake_at += timedelta(days=1)
        raise Suspend(et.WAITING, {"step": path_text(path), "wake_at": wake_at.isoformat()})


def nap_until(hour: Any) -> NapUntil:
    return NapUntil(hour)
