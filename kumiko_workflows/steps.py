"""The step vocabulary's public import path: ``from kumiko_workflows import steps``.

The steps live in :mod:`kumiko_workflows.workflow.steps` (the built-in kinds)
and :mod:`kumiko_workflows.workflow.step_kind` (the base class and the helpers
a step kind written outside the package uses); this module re-exports them.
"""

from __future__ import annotations

from kumiko_workflows.workflow.step_kind import (
    Execution,
    Path,
    Problem,
    Step,
    Suspend,
    callable_name,
    describe_value,
    is_static,
    iter_steps,
    path_text,
)
from kumiko_workflows.workflow.steps import (
    BACKOFFS,
    Branch,
    Compute,
    Retry,
    Wait,
    WaitForEvent,
    branch,
    compute,
    retry,
    wait,
    wait_for_event,
)

__all__ = [
    "BACKOFFS",
    "Branch",
    "Compute",
    "Execution",
    "Path",
    "Problem",
    "Retry",
    "Step",
    "Suspend",
    "Wait",
    "WaitForEvent",
    "branch",
    "callable_name",
    "compute",
    "describe_value",
    "is_static",
    "iter_steps",
    "path_text",
    "retry",
    "wait",
    "wait_for_event",
]
