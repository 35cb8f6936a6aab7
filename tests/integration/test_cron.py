"""Cron-triggered workflows: one run per slot, catch-up, time zones, many schedulers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command

from kumiko_workflows import (
    define_workflow,
    fire_due_schedules,
    fire_schedule_now,
    on_cron,
    pause_schedule,
    resume_due_runs,
    resume_schedule,
    run_id_for,
    steps,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.checks import check_workflows
from kumiko_workflows.engine.cron import schedule_id, schedule_overview
from kumiko_workflows.exceptions import InvalidArgument, ScheduleError, WorkflowDefinitionError
from kumiko_workflows.models import Event, WorkflowRun
from kumiko_workflows.workflow.cron import CronTrigger
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.registry import registry
from tests.support import REPO, run_events, subprocess_env, types_of, waits_for_a_lock
from tests.testapp import cron_workflows as cw


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def slot_events(workflow, tenant: str = "default") -> list[Event]:
    return list(
        Event.objects.filter(
            aggregate_id=schedule_id(workflow.name, tenant), type=et.SCHEDULE_SLOT_FIRED
        ).order_by("version")
    )


def fired_slots(workflow, tenant: str = "default") -> list[str]:
    return [event.payload["slot"] for event in slot_events(workflow, tenant)]


def runs_of(workflow) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(workflow_name=workflow.name).order_by("started_at"))


def run_scheduler(workflow, started: str, first: str, last: str) -> int:
    """Start ``workflow``'s schedule, then pass every ten minutes from first to last."""
    total, moment = 0, at(first)
    with registry.override(workflow):
        fire_due_schedules(now=at(started))
        while moment <= at(last):
            total += fire_due_schedules(now=moment)
            moment += timedelta(minutes=10)
    return total


# --- definition time --------------------------------------------------------------


@pytest.mark.parametrize(
    "args, problem",
    [
        (("61 * * * *",), "is not valid"),
        (("* * * *",), "has 4 fields"),
        (("* * * * * * *",), "has 7 fields"),
        (("",), "non-empty string"),
        (("0 9 * * 1-5", "Mars/Olympus_Mons"), "not a known IANA time zone"),
        (("0 9 * * 1-5", "UTC", "sometimes"), "catch_up must be one of skip, latest, all"),
        # Valid to croniter, but no date matches: 30 February, 31 April, a fifth
        # Monday in January that is also the 1st.
        (("0 0 30 2 *",), "'0 0 30 2 \\*' never fires within the next 5 years"),
        (("0 0 31 4 *",), "never fires within the next 5 years"),
        (("0 0 1 1 1#5",), "never fires within the next 5 years"),
        (("*/10 * 30 2 * *",), "never fires within the next 5 years"),
        # Random fields draw a new time each time croniter reads them.
        (("R R * * *",), "has the random field 'R'"),
        (("*/5 R(0-5) * * *",), "has the random field 'R\\(0-5\\)'"),
        (("0 0 * * * r",), "has the random field 'r'"),
        # Hashed fields need a hash id on_cron does not take.
        (("H H * * *",), "has the hashed field 'H'"),
        (("H/15 * * * *",), "has the hashed field 'H/15'"),
    ],
)
def test_invalid_cron_triggers_are_refused_at_definition_time(args, problem):
    with pytest.raises(WorkflowDefinitionError, match=problem) as caught:
        on_cron(*args)
    assert "kumiko_workflows.E008" in str(caught.value)


def test_six_fields_with_seconds_are_accepted():
    assert on_cron("*/30 * * * * *").expression == "*/30 * * * * *"


@pytest.mark.parametrize(
    "expression",
    ["0 0 29 2 *", "0 0 L 2 *", "0 0 * * 1#5", "0 0 31 * *", "0 0 29 2 1", "0 12 * mar-apr thu"],
)
def test_rare_but_real_dates_are_accepted(expression):
    """Leap days, last days, fifth weekdays: they fire, if not every month."""
    assert on_cron(expression).expression == expression


NEVER_FIRES = CronTrigger("0 0 30 2 *")
RANDOM = CronTrigger("R R * * *")


@pytest.mark.parametrize(
    "trigger, problem",
    [
        (NEVER_FIRES, "'0 0 30 2 *' never fires within the next 5 years"),
        (RANDOM, "'R R * * *' has the random field 'R': croniter draws a new value"),
        (CronTrigger("H 3 * * *"), "'H 3 * * *' has the hashed field 'H'"),
    ],
)
def test_the_system_check_reports_a_cron_trigger_that_cannot_fire_once_per_slot(trigger, problem):
    """A trigger built without on_cron (as a definition older than this check was)."""
    workflow = Workflow("t-cron-stale", trigger, [steps.compute("x", cw.slot_of)])
    with pytest.raises(WorkflowDefinitionError, match=r"\[kumiko_workflows.E008\]"):
        define_workflow("t-cron-stale", trigger, [steps.compute("x", cw.slot_of)], register=False)

    (error,) = check_workflows(workflows=[workflow])
    assert error.id == "kumiko_workflows.E008"
    assert problem in error.msg
    assert "dates which exist" in error.hint and "no R or H" in error.hint


def test_an_invalid_cron_trigger_fails_define_workflow_and_the_system_check():
    bad = CronTrigger("0 25 * * *", "Europe/Berlin", "latest")
    with pytest.raises(WorkflowDefinitionError, match=r"\[kumiko_workflows.E008\].*'0 25"):
        define_workflow("t-cron-bad", bad, [steps.compute("x", cw.slot_of)], register=False)

    workflow = Workflow("t-cron-bad", bad, [steps.compute("x", cw.slot_of)])
    errors = check_workflows(workflows=[workflow])
    assert [error.id for error in errors] == ["kumiko_workflows.E008"]
    assert "'0 25 * * *' is not valid" in errors[0].msg


# --- firing -----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_first_pass_only_starts_the_schedule_and_the_next_slot_fires_once():
    with registry.override(cw.hourly_all):
        assert fire_due_schedules(now=at("2030-01-01T05:02:00+00:00")) == 0
        stream = list(Event.objects.filter(aggregate_id=schedule_id(cw.hourly_all.name, "default")))
        assert [event.type for event in stream] == [et.SCHEDULE_STARTED]
        assert stream[0].aggregate_type == et.SCHEDULE_AGGREGATE_TYPE
        # Slots before the first pass (00:00-05:00) never fire, even with catch_up="all".
        assert fire_due_schedules(now=at("2030-01-01T05:59:00+00:00")) == 0
        assert fire_due_schedules(now=at("2030-01-01T06:00:30+00:00")) == 1
        assert fire_due_schedules(now=at("2030-01-01T06:01:00+00:00")) == 0

    assert fired_slots(cw.hourly_all) == ["2030-01-01T06:00:00+00:00"]
    run_id = run_id_for(cw.hourly_all.name, "2030-01-01T06:00:00+00:00", "default")
    run = WorkflowRun.objects.get(run_id=run_id)
    slot_event = slot_events(cw.hourly_all)[0]
    assert (run.status, run.trigger_event_id) == ("completed", slot_event.id)
    assert run_events(run_id)[0].payload["trigger_event_id"] == slot_event.id


@pytest.mark.django_db
def test_with_two_versions_declared_only_the_highest_fires_and_on_one_schedule():
    v2 = define_workflow(
        name=cw.hourly_all.name,
        trigger=on_cron("30 * * * *", catch_up="all"),
        version=2,
        steps=[steps.compute("slot", cw.slot_of)],
        register=False,
    )
    with registry.override(cw.hourly_all):
        fire_due_schedules(now=at("2030-01-01T05:02:00+00:00"))
        assert fire_due_schedules(now=at("2030-01-01T06:00:30+00:00")) == 1
    with registry.override(cw.hourly_all, v2):
        assert [
            row["expression"]
            for row in schedule_overview(now=at("2030-01-01T06:01:00Z"))
            if row["workflow_name"] == v2.name
        ] == ["30 * * * *"]
        assert fire_due_schedules(now=at("2030-01-01T07:00:30+00:00")) == 1  # 06:30 only

    # The schedule stream is the workflow's, whatever its version: no slot fires twice.
    assert fired_slots(cw.hourly_all) == ["2030-01-01T06:00:00+00:00", "2030-01-01T06:30:00+00:00"]
    assert [run.workflow_version for run in runs_of(cw.hourly_all)] == [1, 2]


@pytest.mark.django_db
def test_fire_due_schedules_refuses_a_naive_now():
    with pytest.raises(ValueError, match="aware datetime.*naive 2030-01-01T05:00:00"):
        fire_due_schedules(now=datetime(2030, 1, 1, 5))


@pytest.mark.django_db
def test_without_cron_workflows_a_pass_writes_nothing():
    with registry.without(*[w.name for w in registry.all()]):
        assert fire_due_schedules(now=at("2030-01-01T05:00:00+00:00")) == 0
    assert not Event.objects.filter(aggregate_type=et.SCHEDULE_AGGREGATE_TYPE).exists()


def _stale(name: str, trigger: CronTrigger) -> Workflow:
    """A cron workflow that skipped definition-time validation (defined before an upgrade)."""
    return Workflow(name, trigger, [steps.compute("slot", cw.slot_of)])


@pytest.mark.django_db
@pytest.mark.parametrize("trigger", [NEVER_FIRES, RANDOM], ids=["never fires", "random"])
def test_a_schedule_that_cannot_fire_is_loud_and_never_stops_the_others(trigger, caplog):
    stale = _stale("t-cron-stale", trigger)
    with registry.override(cw.hourly_skip, stale):
        with pytest.raises(ScheduleError, match=r"1 cron schedule\(s\) could not fire"):
            fire_due_schedules(now=at(START))
        # A random schedule would see a new slot at every pass: none may fire.
        for minute in range(0, 180, 4):
            moment = at("2030-01-01T01:00:00+00:00") + timedelta(minutes=minute)
            with pytest.raises(ScheduleError, match=r"; (0|1) run\(s\) started"):
                fire_due_schedules(now=moment)

    assert fired_slots(cw.hourly_skip) == [
        "2030-01-01T01:00:00+00:00",
        "2030-01-01T02:00:00+00:00",
        "2030-01-01T03:00:00+00:00",
    ]
    assert not Event.objects.filter(aggregate_id=schedule_id(stale.name, "default")).exists()
    assert not runs_of(stale)
    problems = [r.getMessage() for r in caplog.records if "t-cron-stale" in r.getMessage()]
    assert problems and f"{trigger.expression!r}" in problems[0]
    assert "not fired" in problems[0]


@pytest.mark.django_db
def test_schedule_overview_shows_a_schedule_that_cannot_fire_instead_of_raising():
    with registry.override(cw.hourly_latest, _stale("t-cron-never", NEVER_FIRES)):
        rows = {r["workflow_name"]: r for r in schedule_overview(now=at(START))}

    never = rows["t-cron-never"]
    assert never["next_slot"] is None
    assert "'0 0 30 2 *' never fires within the next 5 years" in never["problem"]
    good = rows[cw.hourly_latest.name]
    assert (good["problem"], good["next_slot"]) == (None, at("2030-01-01T01:00:00+00:00"))


@pytest.mark.django_db
def test_workflow_status_shows_a_schedule_that_cannot_fire():
    import json

    out = StringIO()
    with registry.override(_stale("t-cron-never", NEVER_FIRES)):
        call_command("workflow_status", stdout=out)
        call_command("workflow_status", "--json", stdout=out)

    text, data = out.getvalue().split("\n{", 1)
    assert "t-cron-never" in text
    assert "cannot fire: cron expression '0 0 30 2 *' never fires within the next 5" in text
    (row,) = json.loads("{" + data)["cron"]
    assert row["next_slot"] is None
    assert "never fires within the next 5 years" in row["problem"]


# --- catch-up after a gap ------------------------------------------------------------

START = "2030-01-01T00:10:00+00:00"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "workflow, late_by, expected",
    [
        # 01:00-04:00 were missed; 05:00 is 2 minutes old, within CRON_GRACE: on time.
        (cw.hourly_skip, "05:02", ["05"]),
        (cw.hourly_latest, "05:02", ["04", "05"]),
        (cw.hourly_all, "05:02", ["01", "02", "03", "04", "05"]),
        # 05:00 is 20 minutes old: every slot since 01:00 was missed.
        (cw.hourly_skip, "05:20", []),
        (cw.hourly_latest, "05:20", ["05"]),
        (cw.hourly_all, "05:20", ["01", "02", "03", "04", "05"]),
    ],
)
def test_each_catch_up_policy_after_a_gap_of_several_slots(workflow, late_by, expected):
    with registry.override(workflow):
        fire_due_schedules(now=at(START))
        started = fire_due_schedules(now=at(f"2030-01-01T{late_by}:00+00:00"))
        again = fire_due_schedules(now=at(f"2030-01-01T{late_by}:30+00:00"))

    slots = [f"2030-01-01T{hour}:00:00+00:00" for hour in expected]
    assert (started, again) == (len(expected), 0)
    assert fired_slots(workflow) == slots
    assert sorted(run.run_id for run in runs_of(workflow)) == sorted(
        run_id_for(workflow.name, slot, "default") for slot in slots
    )
    for run in runs_of(workflow):
        assert run.status == "completed"


@pytest.mark.django_db
def test_skip_fires_the_next_on_time_slot_after_skipping_missed_ones():
    with registry.override(cw.hourly_skip):
        fire_due_schedules(now=at(START))
        assert fire_due_schedules(now=at("2030-01-01T05:20:00+00:00")) == 0
        assert fire_due_schedules(now=at("2030-01-01T06:00:00+00:00")) == 1
    assert fired_slots(cw.hourly_skip) == ["2030-01-01T06:00:00+00:00"]


@pytest.mark.django_db
def test_catch_up_all_is_capped_by_the_limit_keeping_the_most_recent_slots(settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "CRON_CATCH_UP_LIMIT": 3}
    with registry.override(cw.hourly_all):
        fire_due_schedules(now=at(START))
        started = fire_due_schedules(now=at("2030-01-02T00:02:00+00:00"))

    # 01:00-23:00 were missed: the 3 most recent fire, then the on-time midnight slot.
    assert started == 4
    assert fired_slots(cw.hourly_all) == [
        "2030-01-01T21:00:00+00:00",
        "2030-01-01T22:00:00+00:00",
        "2030-01-01T23:00:00+00:00",
        "2030-01-02T00:00:00+00:00",
    ]


@pytest.mark.django_db
def test_the_grace_period_is_a_setting(settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "CRON_GRACE": 3600}
    with registry.override(cw.hourly_skip):
        fire_due_schedules(now=at(START))
        fire_due_schedules(now=at("2030-01-01T05:20:00+00:00"))
    # With an hour of grace, 05:00 (20 minutes old) was still on time.
    assert fired_slots(cw.hourly_skip) == ["2030-01-01T05:00:00+00:00"]


# --- time zones ---------------------------------------------------------------------


# Berlin, 2025-03-30: clocks jump from 02:00 CET to 03:00 CEST at 01:00 UTC, so
# 02:00-02:59 does not exist. 2025-10-26: they go back from 03:00 CEST to 02:00
# CET at 01:00 UTC, so 02:00-02:59 happens twice. Passes run every ten minutes.
DST_CASES = {
    "spring-skipped-02:30-fires-once-at-03:00-CEST": (
        cw.nightly_berlin,
        ("2025-03-29T12:00+00:00", "2025-03-29T22:00+00:00", "2025-03-30T23:50+00:00"),
        ["2025-03-30T01:00:00+00:00"],
    ),
    "spring-hourly-02:00-and-03:00-are-one-instant": (
        cw.hourly_berlin,
        ("2025-03-29T22:30+00:00", "2025-03-29T22:40+00:00", "2025-03-30T03:00+00:00"),
        ["2025-03-29T23:00:00+00:00", "2025-03-30T00:00:00+00:00"]
        + ["2025-03-30T01:00:00+00:00", "2025-03-30T02:00:00+00:00", "2025-03-30T03:00:00+00:00"],
    ),
    "autumn-repeated-02:30-fires-once-at-the-first": (
        cw.nightly_berlin,
        ("2025-10-25T12:00+00:00", "2025-10-25T22:00+00:00", "2025-10-27T02:00+00:00"),
        ["2025-10-26T00:30:00+00:00", "2025-10-27T01:30:00+00:00"],  # 02:30 CEST, 02:30 CET
    ),
    "autumn-hourly-repeated-02:00-fires-once": (
        cw.hourly_berlin,
        ("2025-10-25T21:30+00:00", "2025-10-25T21:40+00:00", "2025-10-26T03:00+00:00"),
        # 00:00, 01:00, 02:00 CEST, then 03:00 and 04:00 CET: not 02:00 CET (01:00 UTC).
        ["2025-10-25T22:00:00+00:00", "2025-10-25T23:00:00+00:00", "2025-10-26T00:00:00+00:00"]
        + ["2025-10-26T02:00:00+00:00", "2025-10-26T03:00:00+00:00"],
    ),
    "autumn-started-at-the-second-02:10-fires-the-second-02:30": (
        cw.nightly_berlin,
        ("2025-10-26T01:10+00:00", "2025-10-26T01:20+00:00", "2025-10-26T03:00+00:00"),
        ["2025-10-26T01:30:00+00:00"],  # the first 02:30 was before the schedule started
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize("workflow, moments, expected", DST_CASES.values(), ids=DST_CASES)
def test_europe_berlin_across_both_dst_changes(workflow, moments, expected):
    started = run_scheduler(workflow, *moments)

    assert fired_slots(workflow) == expected
    assert started == len(runs_of(workflow)) == len(expected)


@pytest.mark.django_db
def test_a_slot_event_records_the_local_time_it_fired_for():
    run_scheduler(cw.nightly_berlin, *DST_CASES[next(iter(DST_CASES))][1])

    payload = slot_events(cw.nightly_berlin)[0].payload
    assert payload["slot_local"] == "2025-03-30T03:00:00+02:00"
    assert payload["fired_at"] == "2025-03-30T01:00:00+00:00"
    assert (payload["expression"], payload["timezone"]) == ("30 2 * * *", "Europe/Berlin")


def test_croniter_alone_fires_the_repeated_two_thirty_twice():
    """Why cron.py places slots itself: croniter's own zone handling double-fires."""
    from zoneinfo import ZoneInfo

    from croniter import croniter

    cron = croniter("30 2 * * *", datetime(2025, 10, 26, tzinfo=ZoneInfo("Europe/Berlin")))
    first, second = cron.get_next(datetime), cron.get_next(datetime)
    assert first.astimezone(UTC) == at("2025-10-26T00:30:00+00:00")
    assert second.astimezone(UTC) == at("2025-10-26T01:30:00+00:00")


# --- a cron run is a run like any other ---------------------------------------------------


@pytest.mark.django_db
def test_a_cron_started_run_suspends_and_resumes_like_any_other():
    fired_at = at("2030-06-01T00:31:00+00:00")  # 02:31 CEST
    slot = "2030-06-01T00:30:00+00:00"
    run_id = run_id_for(cw.nightly_berlin.name, slot, "default")
    with registry.override(cw.nightly_berlin):
        fire_due_schedules(now=at("2030-05-31T12:00:00+00:00"))
        assert fire_due_schedules(now=fired_at) == 1
        assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]
        assert WorkflowRun.objects.get(run_id=run_id).status == "waiting"

        assert resume_due_runs(now=fired_at + timedelta(minutes=59)).resumed == 0
        report = resume_due_runs(now=fired_at + timedelta(minutes=61))

    assert (report.resumed, report.completed) == (1, 1)
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_COMPLETED]
    waiting = run_events(run_id)[1].payload
    assert waiting["state"]["results"] == {"slot": slot}
    assert waiting["wake_at"] == "2030-06-01T01:31:00+00:00"
    run = WorkflowRun.objects.get(run_id=run_id)
    assert (run.status, run.idempotency_key) == ("completed", slot)
    assert resume_due_runs(now=fired_at + timedelta(days=1)).processed == 0  # resumed once


@pytest.mark.django_db
def test_the_step_after_the_wait_reads_the_slot_from_ctx_event():
    seen = []

    def remember(ctx):
        seen.append((ctx.event.type, ctx.event.payload["slot"], dict(ctx.steps)))
        return None

    workflow = define_workflow(
        "t-cron-remember",
        on_cron("0 12 * * *"),
        [steps.compute("slot", cw.slot_of), steps.wait("PT1H"), steps.compute("r", remember)],
        register=False,
    )
    with registry.override(workflow):
        fire_due_schedules(now=at("2030-01-01T00:00:00+00:00"))
        fire_due_schedules(now=at("2030-01-01T12:00:00+00:00"))
        resume_due_runs(now=at("2030-01-01T13:00:00+00:00"))

    slot = "2030-01-01T12:00:00+00:00"
    assert seen == [(et.SCHEDULE_SLOT_FIRED, slot, {"slot": slot})]


# --- tenants ------------------------------------------------------------------------


@pytest.mark.django_db
def test_cron_workflows_fire_for_each_configured_tenant(settings):
    settings.KUMIKO_WORKFLOWS = {
        **settings.KUMIKO_WORKFLOWS,
        "CRON_TENANTS": "tests.testapp.cron_workflows.two_tenants",
    }
    with registry.override(cw.hourly_all):
        fire_due_schedules(now=at(START))
        assert fire_due_schedules(now=at("2030-01-01T01:00:00+00:00")) == 2

    slot = "2030-01-01T01:00:00+00:00"
    for tenant in ("acme", "globex"):
        assert fired_slots(cw.hourly_all, tenant) == [slot]
        run = WorkflowRun.objects.get(run_id=run_id_for(cw.hourly_all.name, slot, tenant))
        assert run.tenant_id == tenant
        assert Event.objects.get(id=run.trigger_event_id).tenant_id == tenant
    assert not Event.objects.filter(tenant_id="default", aggregate_type=et.SCHEDULE_AGGREGATE_TYPE)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "tenants, problem",
    [
        (lambda: "acme", "must return a list of tenant ids, got 'acme'"),
        (lambda: ["acme", ""], "invalid tenant id ''"),
        (lambda: [None], "invalid tenant id None"),
        (lambda: ["t" * 101], "the tenant id is longer than 100 characters"),
        (lambda: ["acme\nglobex"], "the tenant id contains a control character"),
        ("tests.testapp.cron_workflows.nowhere", "cannot be imported"),
    ],
)
def test_a_bad_cron_tenants_setting_is_a_clear_error(settings, tenants, problem):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "CRON_TENANTS": tenants}
    with registry.override(cw.hourly_all), pytest.raises(ImproperlyConfigured, match=problem):
        fire_due_schedules(now=at(START))


# --- overview and command -----------------------------------------------------------------


@pytest.mark.django_db
def test_schedule_overview_shows_the_last_and_next_slot():
    with registry.override(cw.hourly_latest, cw.nightly_berlin):
        before = {r["workflow_name"]: r for r in schedule_overview(now=at(START))}
        fire_due_schedules(now=at(START))
        fire_due_schedules(now=at("2030-01-01T03:00:00+00:00"))
        after = {
            r["workflow_name"]: r for r in schedule_overview(now=at("2030-01-01T03:10:00+00:00"))
        }

    hourly = after[cw.hourly_latest.name]
    assert before[cw.hourly_latest.name]["started_at"] is None
    assert before[cw.hourly_latest.name]["last_slot"] is None
    assert hourly["tenant_id"] == "default"
    assert hourly["started_at"] == at(START)
    assert hourly["last_slot"] == at("2030-01-01T03:00:00+00:00")
    assert hourly["last_run_id"] == run_id_for(
        cw.hourly_latest.name, hourly["last_slot"].isoformat()
    )
    assert hourly["next_slot"] == at("2030-01-01T04:00:00+00:00")
    nightly = after[cw.nightly_berlin.name]
    assert (nightly["expression"], nightly["timezone"]) == ("30 2 * * *", "Europe/Berlin")
    # 02:30 CET (01:30 UTC) was missed by the 03:00 pass; catch_up="latest" fired it.
    assert nightly["last_slot"] == at("2030-01-01T01:30:00+00:00")
    assert nightly["next_slot"] == at("2030-01-02T01:30:00+00:00")  # 02:30 CET


@pytest.mark.django_db
def test_fire_schedules_command_fires_as_of_now_and_refuses_a_naive_instant():
    out = StringIO()
    with registry.override(cw.hourly_latest):
        call_command("fire_schedules", "--now", START, "--write", stdout=out)
        call_command("fire_schedules", "--now", "2030-01-01T01:00:00+00:00", "--write", stdout=out)
        with pytest.raises(CommandError, match="has no UTC offset"):
            call_command("fire_schedules", "--now", "2030-01-01T02:00:00")
    assert out.getvalue().splitlines() == ["started 0 cron runs", "started 1 cron run"]


# --- many schedulers --------------------------------------------------------------------


def _wait_for(condition, what: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_scheduler_processes_firing_one_slot_start_one_run(tmp_path):
    due = "2030-01-01T00:05:30+00:00"
    with registry.override(cw.every_five_minutes):
        fire_due_schedules(now=at("2030-01-01T00:01:00+00:00"))  # committed: the schedule started

    code = f"from tests.testapp.cron_workflows import fire_in_child; fire_in_child({due!r})"
    children = [
        subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "shell", "-c", code],
            cwd=REPO,
            env=subprocess_env(KUMIKO_CRON_SYNC_DIR=str(tmp_path)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        # One child fired the slot and holds its transaction open inside the run;
        # the other has tried to append the same schedule version and waits on it.
        _wait_for(lambda: any(tmp_path.glob("running-*")), "a child to start the run")
        _wait_for(waits_for_a_lock, "the other child to block on the slot")
    finally:
        (tmp_path / "release").touch()
        outputs = [child.communicate(timeout=120) for child in children]

    assert [child.returncode for child in children] == [0, 0], outputs
    assert sorted(out.splitlines()[-1] for out, _ in outputs) == ["started=0", "started=1"]
    assert len(list(tmp_path.glob("running-*"))) == 1
    assert fired_slots(cw.every_five_minutes) == ["2030-01-01T00:05:00+00:00"]
    runs = runs_of(cw.every_five_minutes)
    assert [run.run_id for run in runs] == [
        run_id_for(cw.every_five_minutes.name, "2030-01-01T00:05:00+00:00", "default")
    ]
    assert runs[0].status == "completed"


# --- pause, resume, fire now ------------------------------------------------------------


def schedule_types(workflow, tenant: str = "default") -> list[str]:
    stream = Event.objects.filter(aggregate_id=schedule_id(workflow.name, tenant))
    return [event.type for event in stream.order_by("version")]


@pytest.mark.django_db
def test_a_paused_schedule_fires_no_slot_and_never_the_ones_it_missed():
    """Paused at 01:30 with catch_up="all": 02:00-04:00 never fire, 05:00 (after resume) does."""
    with registry.override(cw.hourly_all):
        fire_due_schedules(now=at(START))
        assert fire_due_schedules(now=at("2030-01-01T01:00:30+00:00")) == 1
        assert pause_schedule(cw.hourly_all.name, by="ops", now=at("2030-01-01T01:30:00+00:00"))
        assert not pause_schedule(cw.hourly_all.name, now=at("2030-01-01T01:31:00+00:00"))
        for moment in ("02:00:30", "03:00:30", "04:00:30"):
            assert fire_due_schedules(now=at(f"2030-01-01T{moment}+00:00")) == 0
        paused = {r["workflow_name"]: r for r in schedule_overview(now=at(START))}
        assert resume_schedule(cw.hourly_all.name, by="ops", now=at("2030-01-01T04:10:00+00:00"))
        assert not resume_schedule(cw.hourly_all.name, now=at("2030-01-01T04:11:00+00:00"))
        assert fire_due_schedules(now=at("2030-01-01T04:20:00+00:00")) == 0
        assert fire_due_schedules(now=at("2030-01-01T05:00:30+00:00")) == 1

    assert fired_slots(cw.hourly_all) == ["2030-01-01T01:00:00+00:00", "2030-01-01T05:00:00+00:00"]
    assert schedule_types(cw.hourly_all) == [
        et.SCHEDULE_STARTED,
        et.SCHEDULE_SLOT_FIRED,
        et.SCHEDULE_PAUSED,
        et.SCHEDULE_RESUMED,
        et.SCHEDULE_SLOT_FIRED,
    ]
    row = paused[cw.hourly_all.name]
    assert row["paused"] and row["next_slot"] is None
    assert (row["paused_at"], row["paused_by"]) == (at("2030-01-01T01:30:00+00:00"), "ops")
    assert row["last_slot"] == at("2030-01-01T01:00:00+00:00")


@pytest.mark.django_db
def test_a_scheduler_that_loaded_the_schedule_before_the_pause_fires_nothing():
    """The pause takes the stream version the scheduler would fire the slot at."""
    from kumiko_workflows.engine.cron import Schedule, fire_schedule

    with registry.override(cw.hourly_all):
        fire_due_schedules(now=at(START))
        loaded = Schedule.load(cw.hourly_all, "default")
        pause_schedule(cw.hourly_all.name, now=at("2030-01-01T00:59:00+00:00"))
        assert fire_schedule(loaded, at("2030-01-01T01:00:30+00:00")) == 0

    assert fired_slots(cw.hourly_all) == []
    assert runs_of(cw.hourly_all) == []


@pytest.mark.django_db
def test_a_schedule_paused_before_its_first_pass_starts_when_resumed():
    with registry.override(cw.hourly_all):
        pause_schedule(cw.hourly_all.name, now=at(START))
        assert fire_due_schedules(now=at("2030-01-01T01:00:30+00:00")) == 0
        resume_schedule(cw.hourly_all.name, now=at("2030-01-01T01:10:00+00:00"))
        assert fire_due_schedules(now=at("2030-01-01T02:00:30+00:00")) == 1

    assert schedule_types(cw.hourly_all) == [
        et.SCHEDULE_PAUSED,
        et.SCHEDULE_RESUMED,
        et.SCHEDULE_SLOT_FIRED,
    ]
    assert fired_slots(cw.hourly_all) == ["2030-01-01T02:00:00+00:00"]


@pytest.mark.django_db
def test_fire_now_starts_one_run_per_key_and_moves_no_slot():
    now = at("2030-01-01T01:20:00+00:00")
    with registry.override(cw.nightly_berlin):
        fire_due_schedules(now=at(START))
        pause_schedule(cw.nightly_berlin.name, now=at(START))
        before = schedule_overview(now=now)
        run_id = fire_schedule_now(cw.nightly_berlin.name, key="press-1", by="ops", now=now)
        again = fire_schedule_now(cw.nightly_berlin.name, key="press-1", by="ops", now=now)
        other = fire_schedule_now(cw.nightly_berlin.name, now=now)
        after = schedule_overview(now=now)

    assert run_id == run_id_for(cw.nightly_berlin.name, "now:press-1", "default")
    assert again is None  # the same key: the same run, nothing fired again
    assert other not in (None, run_id)
    fired = Event.objects.filter(type=et.SCHEDULE_FIRED_NOW).order_by("id")
    assert fired.count() == 2
    first = fired[0]
    assert first.aggregate_id == schedule_id(cw.nightly_berlin.name, "default")
    assert first.payload["by"] == "ops" and first.payload["idempotency_key"] == "now:press-1"
    assert first.payload["slot"] == now.isoformat()
    assert first.payload["slot_local"] == "2030-01-01T02:20:00+01:00"
    run = WorkflowRun.objects.get(run_id=run_id)
    # It ran its first step inline (it reads the slot from ctx.event) and waits an hour.
    assert (run.status, run.trigger_event_id) == ("waiting", first.id)
    assert run.search_key == "now:press-1"
    assert run_events(run_id)[0].payload["trigger_event_id"] == first.id
    # A manual fire is not a slot: the schedule stays paused, its last slot unchanged.
    for key in ("paused", "last_slot", "next_slot", "started_at"):
        assert after[0][key] == before[0][key], key
    assert after[0]["paused"]


@pytest.mark.django_db
def test_pause_resume_and_fire_now_refuse_what_is_not_a_cron_schedule(settings):
    with registry.override(cw.hourly_all):
        with pytest.raises(InvalidArgument, match="'t-wait' is not a registered cron workflow"):
            pause_schedule("t-wait")
        with pytest.raises(InvalidArgument, match="not a registered cron workflow"):
            fire_schedule_now("no-such-workflow")
        with pytest.raises(InvalidArgument, match="tenant 'acme' has no cron schedules"):
            resume_schedule(cw.hourly_all.name, "acme")
        with pytest.raises(InvalidArgument, match="1-100 characters"):
            fire_schedule_now(cw.hourly_all.name, key="")
        with pytest.raises(InvalidArgument, match="1-100 characters"):
            fire_schedule_now(cw.hourly_all.name, key="line\nbreak")
    assert not Event.objects.filter(aggregate_type=et.SCHEDULE_AGGREGATE_TYPE).exists()


@pytest.mark.django_db
def test_workflow_status_shows_a_paused_schedule():
    out = StringIO()
    with registry.override(cw.hourly_latest):
        fire_due_schedules(now=at(START))
        pause_schedule(cw.hourly_latest.name, by="admin:root")
        call_command("workflow_status", stdout=out)
        json_out = StringIO()
        call_command("workflow_status", "--json", stdout=json_out)

    assert "paused since " in out.getvalue() and "by admin:root" in out.getvalue()
    (row,) = json.loads(json_out.getvalue())["cron"]
    assert row["paused"] is True and row["paused_at"] and row["next_slot"] is None
