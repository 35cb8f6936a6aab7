"""The run events' types, at their public import path: ``from kumiko_workflows import event_types``.

They live in :mod:`kumiko_workflows.workflow.event_types`; this module
re-exports every one of them.
"""

from __future__ import annotations

from kumiko_workflows.workflow.event_types import *  # noqa: F403 - the same names, all of them
