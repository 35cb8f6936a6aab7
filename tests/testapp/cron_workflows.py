"""Cron workflows the cron tests drive, defined but not registered.

They are built with ``register=False`` and swapped in with
``registry.override(...)`` by the tests (and by the child processes of the
race test), so that no other test's scheduler pass ever fires them.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

from kumiko_workflows import define_workflow, on_cron, steps


def slot_of(ctx):
    """The slot instant the run was fired for (the trigger event's payload)."""
    return ctx.event.payload["slot"]


def after_wait(ctx):
    return {"slot": ctx.event.payload["slot"], "seen": sorted(ctx.steps)}


def hold_if_asked(ctx):
    """In the race test's children: signal, then hold the transaction until released."""
    folder = os.environ.get("KUMIKO_CRON_SYNC_DIR")
    if not folder:
        return None
    (Path(folder) / f"running-{os.getpid()}").touch()
    deadline = time.monotonic() + 60
    while not (Path(folder) / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


def _hourly(catch_up):
    return define_workflow(
        name=f"t-cron-hourly-{catch_up}",
        trigger=on_cron("0 * * * *", catch_up=catch_up),
        steps=[steps.compute("slot", slot_of)],
        register=False,
    )


hourly_skip = _hourly("skip")
hourly_latest = _hourly("latest")
hourly_all = _hourly("all")

#: Local-time schedule with a wait: suspends and resumes like any other run.
nightly_berlin = define_workflow(
    name="t-cron-nightly-berlin",
    trigger=on_cron("30 2 * * *", timezone="Europe/Berlin"),
    steps=[
        steps.compute("slot", slot_of),
        steps.wait("PT1H"),
        steps.compute("after", after_wait),
    ],
    register=False,
)

hourly_berlin = define_workflow(
    name="t-cron-hourly-berlin",
    trigger=on_cron("0 * * * *", timezone="Europe/Berlin", catch_up="skip"),
    steps=[steps.compute("slot", slot_of)],
    register=False,
)

every_five_minutes = define_workflow(
    name="t-cron-raced",
    trigger=on_cron("*/5 * * * *"),
    steps=[steps.compute("held", hold_if_asked), steps.compute("slot", slot_of)],
    register=False,
)

ALL = (hourly_skip, hourly_latest, hourly_all, nightly_berlin, hourly_berlin, every_five_minutes)


def two_tenants():
    return ["acme", "globex"]


def fire_in_child(now_iso: str) -> None:
    """Entry point of the race test's child processes (``manage.py shell -c``)."""
    from kumiko_workflows import fire_due_schedules
    from kumiko_workflows.workflow.registry import registry

    with registry.override(every_five_minutes):
        started = fire_due_schedules(now=datetime.fromisoformat(now_iso))
    print(f"started={started}", flush=True)
