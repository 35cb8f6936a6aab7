"""Rehearsals that write nothing: a future ``--now`` is refused unless ``--dry-run`` or ``--write``.

A pass at a future instant that commits sends what is not due yet and fires
future cron slots (after which the catch-up rule skips the real ones in
between); ``--dry-run`` runs the pass in a transaction rolled back at its
end, so every table, cron schedules included, is as it was.
"""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import connections

from kumiko_workflows import event_types as et
from kumiko_workflows import run_id_for
from kumiko_workflows.engine import deploys
from kumiko_workflows.engine.cron import schedule_overview
from kumiko_workflows.engine.rehearsal import NOT_ROLLED_BACK
from kumiko_workflows.models import DeployedDefinition
from kumiko_workflows.store import db
from kumiko_workflows.workflow import clock
from kumiko_workflows.workflow.cron import next_slot
from kumiko_workflows.workflow.registry import registry
from tests.support import trigger, types_of
from tests.testapp import cron_workflows as cw

pytestmark = pytest.mark.django_db(transaction=True)


def every_table() -> dict[str, list[dict[str, Any]]]:
    """The full contents of every table of every installed app, row by row."""
    return {
        model._meta.db_table: list(model._base_manager.order_by("pk").values())
        for model in apps.get_models()
        if model._meta.managed and not model._meta.proxy
    }


def waiting_run(until: str) -> Any:
    return run_id_for("t-wait", trigger("t.wait", **{"for": until}).payload["run_key"])


def command(name: str, *args: str) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def iso(delta: timedelta) -> str:
    return (clock.now() + delta).isoformat()


def later_slot() -> Any:
    """A slot of the hourly schedule two to three hours from now: a pass then fires it on time."""
    return next_slot(cw.hourly_skip.trigger, clock.now() + timedelta(hours=2))


# --- what is refused ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["resume_due_runs", "fire_schedules"])
def test_a_future_now_that_would_write_is_refused_and_writes_nothing(name):
    waiting_run(iso(timedelta(hours=1)))
    before = every_table()

    with pytest.raises(CommandError) as refused:
        call_command(name, "--now", iso(timedelta(hours=2)))

    message = str(refused.value)
    assert "is later than the current time" in message
    assert "Add --dry-run to see what it would do and write nothing, or --write" in message
    assert every_table() == before


REFUSED = {
    "dry run and write": (["--dry-run", "--write"], "--dry-run writes nothing and --write writes"),
    "write without now": (["--write"], "--write goes with a --now later than the current time"),
    "write with a past now": (
        ["--write", "--now", "2020-01-01T00:00:00+00:00"],
        "--write goes with a --now later than the current time",
    ),
    "dry run with loop": (
        ["--dry-run", "--loop"],
        "--dry-run makes one pass and rolls it back; a --loop worker writes",
    ),
}


@pytest.mark.parametrize("args, message", REFUSED.values(), ids=REFUSED)
def test_rehearsal_flags_that_contradict_are_refused(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("resume_due_runs", *args)


# --- what a dry run does --------------------------------------------------------------


def test_a_dry_run_says_what_it_would_do_and_leaves_every_table_as_it_was():
    due_now = waiting_run(iso(-timedelta(hours=1)))
    due_later = waiting_run(iso(timedelta(hours=1)))
    with registry.override(cw.hourly_skip):
        command("fire_schedules")  # the schedule starts now, for real
        before = every_table()
        overview = schedule_overview()
        slot = later_slot()

        out = command("resume_due_runs", "--now", slot.isoformat(), "--dry-run")

        assert every_table() == before
        assert schedule_overview() == overview
    lines = out.splitlines()
    assert lines[0].startswith("resume_due_runs: dry run at ")
    assert lines[0].endswith("; it would write:")
    written = "\n".join(lines)
    # It did the whole pass before rolling it back: both runs, and the slot due then.
    assert f"run {due_now} (t-wait) tenant=default: {et.RESUMED}" in written
    assert f"run {due_later} (t-wait) tenant=default: {et.RESUMED}" in written
    assert et.RUN_COMPLETED in written
    schedule = f"cron schedule {cw.hourly_skip.name} (slot {slot.isoformat()}) tenant=default"
    assert schedule in written
    assert (
        "resume_due_runs: would have done resumed=2 completed=2 suspended=0 failed=0 errors=0 "
        "fired=1"
    ) in written
    assert lines[-1] == f"resume_due_runs: {NOT_ROLLED_BACK}"
    assert "a step's own calls outside this database" in lines[-1]
    assert types_of(due_now)[-1] == et.WAITING  # still waiting, for the real pass


def test_a_dry_run_moves_no_cron_schedule_so_the_next_real_pass_fires_the_real_slot():
    with registry.override(cw.hourly_skip):
        command("fire_schedules")
        started = schedule_overview()[0]
        first = next_slot(cw.hourly_skip.trigger, started["started_at"])

        # A slot hours on would fire (and, committed, would make the real slots
        # before it "missed", which catch_up="skip" never fires).
        out = command("fire_schedules", "--now", later_slot().isoformat(), "--dry-run")
        assert "would have done started=1" in out

        fired = command("fire_schedules", "--now", first.isoformat(), "--write")

        assert fired == "started 1 cron run\n"
        assert schedule_overview()[0]["last_slot"] == first


def test_a_dry_run_without_now_rehearses_the_pass_due_now():
    due_now = waiting_run(iso(-timedelta(hours=1)))
    before = every_table()

    out = command("resume_due_runs", "--no-cron", "--dry-run")

    assert f"run {due_now} (t-wait)" in out
    assert "would have done resumed=1 completed=1 " in out
    assert every_table() == before


def test_a_past_now_writes_and_resumes_only_what_was_due_by_then():
    """Allowed without a flag: a pass at a past instant resumes less than one now would."""
    three_hours_ago = clock.now() - timedelta(hours=3)
    previous = clock.set_virtual(three_hours_ago)  # the runs started then
    try:
        due_two_hours_ago = waiting_run("PT1H")
        due_ten_minutes_ago = waiting_run("PT2H50M")
    finally:
        clock.set_virtual(previous)

    out = command("resume_due_runs", "--no-cron", "--now", iso(-timedelta(hours=1)))

    assert out.startswith("resume_due_runs: resumed=1 completed=1 ")
    assert types_of(due_two_hours_ago)[-1] == et.RUN_COMPLETED
    assert types_of(due_ten_minutes_ago)[-1] == et.WAITING


def test_a_dry_run_that_opens_the_connection_registers_no_definitions():
    # A rehearsal as its own process would make it: the code never seen on this
    # database, the connection opened by the dry run itself (where the code
    # registers its definitions as it connects).
    waiting_run(iso(-timedelta(hours=1)))
    DeployedDefinition.objects.all().delete()
    deploys.forget()
    before = every_table()
    connections[db.alias()].close()

    command("resume_due_runs", "--dry-run")

    assert every_table() == before
