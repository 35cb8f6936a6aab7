"""``kumiko_workflows.testing``: the virtual clock, its fixture, its assertions.

Every test here moves hours or days of virtual time in well under the
ten seconds of real time each is allowed.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.test import TestCase

from kumiko_workflows import append_event, define_workflow, on_cron, steps
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.testing import VirtualClockError, virtual_clock
from kumiko_workflows.workflow import clock
from kumiko_workflows.workflow.registry import registry
from tests.integration.test_runs import workflow
from tests.testapp.cron_workflows import hourly_berlin, nightly_berlin

pytestmark = pytest.mark.django_db

START = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def no_real_waiting():
    began = time.monotonic()
    yield
    assert time.monotonic() - began < 10, "a virtual-time test took real time"


def when(ctx):
    """The instant the step ran at, as the run saw it."""
    return ctx.now.isoformat()


TWO_HOURS = workflow(
    "v-two-hours",
    [
        steps.compute("start", when),
        steps.wait("PT1H"),
        steps.compute("one", when),
        steps.wait("PT1H"),
        steps.compute("two", when),
    ],
)
THREE_HOURS = workflow(
    "v-three-hours",
    [steps.wait("PT3H"), steps.compute("three", when)],
)


def _start(workflows, type, **payload):
    key = uuid.uuid4().hex
    workflows.append_event(uuid.uuid4(), "test-source", type, {"run_key": key, **payload})
    return key


def test_the_fixture_runs_every_due_run_at_its_own_instant_in_order(workflows):
    begin = workflows.now
    with registry.override(TWO_HOURS, THREE_HOURS):
        two = workflows.run_id("v-two-hours", _start(workflows, "v.two-hours"))
        three = workflows.run_id("v-three-hours", _start(workflows, "v.three-hours"))
        progress = workflows.advance("P1D")

    assert workflows.now == begin + timedelta(days=1)
    assert progress.instants == [begin + HOUR, begin + 2 * HOUR, begin + 3 * HOUR]
    assert (progress.resumed, progress.completed, progress.suspended) == (3, 2, 1)
    workflows.assert_status(two, "completed")
    workflows.assert_step_results(
        two,
        {
            "start": begin.isoformat(),
            "one": (begin + HOUR).isoformat(),
            "two": (begin + 2 * HOUR).isoformat(),
        },
        exact=True,
    )
    workflows.assert_step_results(three, {"three": (begin + 3 * HOUR).isoformat()})
    workflows.assert_event_types(three, [et.RUN_STARTED, et.WAITING, et.RESUMED, et.RUN_COMPLETED])
    # Every event of the runs is on the virtual time line.
    stamps = [event.created_at for event in workflows.events(two)]
    assert stamps == [begin, begin, begin + HOUR, begin + HOUR, begin + 2 * HOUR, begin + 2 * HOUR]


def test_a_wait_is_due_exactly_when_its_time_comes_not_before():
    with virtual_clock(START) as workflows, registry.override(THREE_HOURS):
        run = workflows.run_id("v-three-hours", _start(workflows, "v.three-hours"))
        # The timer was computed from the virtual start, not from the real now.
        assert WorkflowRunPending.objects.get(run_id=run).wake_at == START + 3 * HOUR
        workflows.advance("PT2H59M59S")
        workflows.assert_status(run, "waiting")
        progress = workflows.advance("PT1S")
    assert progress.instants == [START + 3 * HOUR]
    workflows_run = WorkflowRun.objects.get(run_id=run)
    assert (workflows_run.status, workflows_run.finished_at) == ("completed", START + 3 * HOUR)


def test_plain_append_event_and_the_status_rows_are_on_virtual_time_too():
    with virtual_clock(START):
        event = append_event(
            uuid.uuid4(), "test-source", "t.wait", {"run_key": "plain", "for": "PT1H"}
        )
        assert clock.now() == START
    run = WorkflowRun.objects.get(idempotency_key="plain")
    assert event.created_at == START
    assert (run.started_at, run.wake_at) == (START, START + HOUR)
    assert not clock.is_virtual(), "the clock is real again after the block"


def test_an_awaited_event_appended_in_virtual_time_ends_the_wait(workflows):
    key = _start(workflows, "t.signed-up", user_id=7, timeout="P7D")
    run = workflows.run_id("t-event", key)
    workflows.advance("P2D")
    workflows.assert_status(run, "waiting")

    paid = workflows.append_event(uuid.uuid4(), "test-source", "t.verified", {"user_id": 7})
    progress = workflows.run_until_idle()

    assert progress.completed == 1
    workflows.assert_status(run, "completed")
    workflows.assert_step_results(run, {"verified": {"user_id": 7}})
    assert paid.created_at == workflows.now


def test_run_until_idle_goes_through_a_retry_backoff_and_stops_at_a_wait_without_a_timeout(
    workflows,
):
    begin = workflows.now
    retried = workflows.run_id("t-retry", _start(workflows, "t.retry", fail_attempts=2))
    untimed = workflow("v-untimed", [steps.wait_for_event("x")], awaits={"x": "v.x"})
    with registry.override(untimed):
        waiting = workflows.run_id("v-untimed", _start(workflows, "v.untimed"))
        progress = workflows.run_until_idle()

    # linear backoff, base 10 s: attempt 2 after 10 s, attempt 3 after 20 s more.
    assert progress.instants == [begin + timedelta(seconds=10), begin + timedelta(seconds=30)]
    workflows.assert_status(retried, "completed")
    passed = Event.objects.get(type="t.gate-passed")
    assert (passed.payload["attempt"], passed.created_at) == (3, begin + timedelta(seconds=30))
    workflows.assert_status(waiting, "waiting")
    assert workflows.now == begin + timedelta(seconds=30), "no time passes after the last wake"


def test_run_until_idle_gives_up_on_runs_that_never_stop_waiting():
    endless = define_workflow(
        name="v-endless",
        trigger=on_cron("0 * * * *"),
        steps=[steps.wait("PT2H")],
        register=False,
    )
    with virtual_clock(START) as workflows, registry.override(endless):
        workflows.advance("PT1H")  # the schedule starts, its first run fires and waits
        with pytest.raises(VirtualClockError, match="after 30 instants"):
            workflows.run_until_idle(max_steps=30)
        assert WorkflowRun.objects.filter(workflow_name="v-endless").count() >= 10


def test_a_cron_workflow_over_the_spring_dst_change_fires_each_night_once():
    """30 2 * * * in Berlin: on 31 March 2030 02:30 does not exist and fires at 03:00 CEST."""
    begin = datetime(2030, 3, 29, 12, 0, tzinfo=UTC)
    with virtual_clock(begin) as workflows, registry.override(nightly_berlin):
        progress = workflows.advance("P3D")
    runs = WorkflowRun.objects.filter(workflow_name="t-cron-nightly-berlin")
    fired = sorted(
        Event.objects.filter(type=et.SCHEDULE_SLOT_FIRED).values_list(
            "payload__slot_local", flat=True
        )
    )
    assert fired == [
        "2030-03-30T02:30:00+01:00",
        "2030-03-31T03:00:00+02:00",
        "2030-04-01T02:30:00+02:00",
    ]
    assert progress.fired == 3
    assert sorted(run.status for run in runs) == ["completed"] * 3
    # Each run waited its hour on the virtual time line: fired, then resumed an hour later.
    assert progress.instants == [
        datetime(2030, 3, 30, 1, 30, tzinfo=UTC),
        datetime(2030, 3, 30, 2, 30, tzinfo=UTC),
        datetime(2030, 3, 31, 1, 0, tzinfo=UTC),
        datetime(2030, 3, 31, 2, 0, tzinfo=UTC),
        datetime(2030, 4, 1, 0, 30, tzinfo=UTC),
        datetime(2030, 4, 1, 1, 30, tzinfo=UTC),
    ]
    for run in runs:
        after = workflows_result(run.run_id)
        assert after["seen"] == ["slot"]


def workflows_result(run_id):
    completed = Event.objects.get(aggregate_id=run_id, type=et.RUN_COMPLETED)
    return completed.payload["state"]["results"]["after"]


def test_an_hourly_cron_workflow_fires_24_times_on_the_25_hour_autumn_day():
    # From just before local midnight on 27 October 2030 (CEST) to just before the next (CET).
    begin = datetime(2030, 10, 26, 21, 59, 59, tzinfo=UTC)
    with virtual_clock(begin) as workflows, registry.override(hourly_berlin):
        progress = workflows.advance(timedelta(hours=25))
        assert workflows.now == datetime(2030, 10, 27, 22, 59, 59, tzinfo=UTC)
    local = list(
        Event.objects.filter(type=et.SCHEDULE_SLOT_FIRED)
        .order_by("id")
        .values_list("payload__slot_local", flat=True)
    )
    assert progress.fired == len(local) == 24
    assert local[0] == "2030-10-27T00:00:00+02:00" and local[-1] == "2030-10-27T23:00:00+01:00"
    assert [slot for slot in local if "T02:" in slot] == ["2030-10-27T02:00:00+02:00"]
    assert WorkflowRun.objects.filter(status="completed").count() == 24


def test_the_clock_never_goes_back_and_takes_only_aware_instants():
    with virtual_clock(START) as workflows:
        with pytest.raises(ValueError, match="never goes back"):
            workflows.advance_to(START - HOUR)
        with pytest.raises(ValueError, match="aware"):
            workflows.advance_to(datetime(2030, 1, 2))
        with pytest.raises(ValueError):
            workflows.advance("-PT1H")
        with pytest.raises(ValueError, match="aware"):
            virtual_clock(datetime(2030, 1, 1))
        inner = virtual_clock(START + HOUR)
        with inner:
            assert clock.now() == START + HOUR
        assert clock.now() == START, "a nested clock restores the outer one"
    with pytest.raises(RuntimeError, match="not running"):
        _ = workflows.now


def test_the_assertions_fail_saying_what_the_run_is():
    with virtual_clock(START) as workflows, registry.override(THREE_HOURS):
        run = workflows.run_id("v-three-hours", _start(workflows, "v.three-hours"))
        with pytest.raises(AssertionError) as status:
            workflows.assert_status(run, "completed")
        with pytest.raises(AssertionError) as events:
            workflows.assert_event_types(run, [et.RUN_STARTED])
        with pytest.raises(AssertionError) as results:
            workflows.assert_step_results(run, {"three": "soon"})
        with pytest.raises(AssertionError, match="no workflow run has id"):
            workflows.assert_status(uuid.uuid4(), "waiting")
    assert "expected status 'completed'" in str(status.value)
    assert "is waiting at step '0'" in str(status.value)
    assert "wakes at 2030-01-01T12:00:00+00:00" in str(status.value)
    assert "workflow.step.waiting" in str(events.value)
    assert "'three': '<missing>'" in str(results.value)


def test_a_failed_run_shows_its_error_and_keeps_the_results_it_started_from(workflows):
    run = workflows.run_id("t-fail", _start(workflows, "t.fail"))
    with pytest.raises(AssertionError) as failed:
        workflows.assert_status(run, "completed")
    assert "failed: step_failed RuntimeError" in str(failed.value)
    assert "hunter2" in str(failed.value), "the raw error (last_error) helps the test's author"
    assert workflows.step_results(run) == {}


class VirtualClockInATestCase(TestCase):
    """The context manager in a ``TestCase``: ``enterContext`` in ``setUp``."""

    def setUp(self):
        self.workflows = self.enterContext(virtual_clock(START))

    def test_a_wait_of_a_week_passes_in_a_test_case(self):
        key = _start(self.workflows, "t.wait", **{"for": "P7D"})
        run = self.workflows.run_id("t-wait", key)
        self.workflows.advance("P7D")
        self.workflows.assert_status(run, "completed")
        self.assertEqual(self.workflows.now, START + timedelta(days=7))
