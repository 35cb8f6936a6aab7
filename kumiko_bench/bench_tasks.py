"""The bench's no-op task (scenario ``tasks``): import it only under the bench's TASKS.

A task is validated by its backend when it is made, so this module is
imported inside ``override_settings(TASKS=bench_tasks_setting())``, by the bench and by its
worker processes alike.
"""

from __future__ import annotations

from kumiko_workflows.tasks import compat


@compat.task()  # type: ignore[untyped-decorator]  # Django's Tasks, untyped here
def noop() -> None:
    return None
