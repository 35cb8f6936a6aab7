"""The dashboard's figures from real runs: per hour and day, kept days, tenants, backlog."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from kumiko_workflows import resume_due_runs
from kumiko_workflows.models import RunDay, WorkerHeartbeat, WorkflowRun
from kumiko_workflows.operations import charts
from kumiko_workflows.operations.dashboard import (
    dashboard,
    day_starts,
    failure_reasons_present,
    hour_starts,
)
from tests.support import trigger

pytestmark = pytest.mark.django_db


def by_name(board):
    return {figures.name: figures for figures in board.workflows}


def test_runs_count_in_the_hour_and_the_day_they_started_and_finished():
    trigger("t.wait", **{"for": "PT1H"})
    trigger("t.wait", **{"for": "PT0S"})
    trigger("t.fail")
    trigger("t.fail")
    resume_due_runs(now=timezone.now() + timedelta(seconds=1))
    board = dashboard(None, timezone.now())
    hourly, daily = board.overall.hourly, board.overall.daily
    assert len(hourly.starts) == 24 and len(daily.starts) == 30
    assert hourly.counts["started"][-1] == 4 and daily.counts["started"][-1] == 4
    assert hourly.total("completed") == 1 and hourly.total("failed") == 2
    assert board.overall.rate_24h == pytest.approx(2 / 3)
    assert board.overall.reasons == {"step_failed": 2}
    named = by_name(board)
    assert named["t-fail"].hourly.total("failed") == 2
    assert named["t-wait"].hourly.total("started") == 2
    assert named["t-wait"].hourly.total("failed") == 0


def test_a_finished_day_is_counted_once_and_kept():
    trigger("t.fail")
    later = timezone.now() + timedelta(days=2)
    first = dashboard(None, later)
    assert first.overall.daily.counts["failed"][-3] == 1
    assert first.overall.hourly.total("started") == 0  # two days later: not in the last 24 h
    # Each day over for an hour has its marker: 29, or 28 in the hour after midnight.
    settled = [d for d in day_starts(later) if d + timedelta(days=1, hours=1) <= later]
    assert RunDay.objects.filter(workflow_name="", tenant_id="").count() == len(settled)
    trigger("t.fail")  # after the day was kept: the kept day says what it counted
    assert dashboard(None, later).overall.daily.counts["failed"][-3] == 1
    RunDay.objects.all().delete()  # a cache: emptied, the next view counts again
    assert dashboard(None, later).overall.daily.counts["failed"][-3] == 2
    assert dashboard(None, later).overall.reasons == {"step_failed": 2}


def test_a_tenant_sees_only_its_own_runs_live_and_kept():
    trigger("t.fail", tenant_id="acme")
    trigger("t.fail", tenant_id="other")
    trigger("t.fail", tenant_id="other")
    assert dashboard("acme", timezone.now()).overall.hourly.total("failed") == 1
    later = timezone.now() + timedelta(days=2)
    assert dashboard("other", later).overall.daily.total("failed") == 2
    assert dashboard("acme", later).overall.daily.total("failed") == 1
    assert dashboard(None, later).overall.daily.total("failed") == 3


def test_one_workflow_s_figures_and_its_backlog():
    trigger("t.wait", **{"for": "PT1M"})
    trigger("t.fail")
    now = timezone.now() + timedelta(minutes=10)
    board = dashboard(None, now, "t-wait")
    assert [f.name for f in board.workflows] == ["t-wait"]
    assert board.overall.hourly.total("started") == 1
    assert board.due == 1 and board.oldest_due is not None
    assert board.oldest_due["lag"].startswith("9 min")


def test_the_due_backlog_and_the_oldest_due_run_s_lag_across_tenants():
    trigger("t.wait", tenant_id="a", **{"for": "PT1M"})
    trigger("t.wait", tenant_id="b", **{"for": "PT5M"})
    trigger("t.wait", tenant_id="b", **{"for": "PT1H"})
    now = timezone.now() + timedelta(minutes=10)
    board = dashboard(None, now)
    assert (board.due, board.due_capped) == (2, False)
    assert board.oldest_due["tenant_id"] == "a"
    assert dashboard("b", now).due == 1
    assert by_name(board)["t-wait"].due == 2


def test_the_failure_reason_filter_knows_only_the_reasons_present():
    assert failure_reasons_present() == []
    trigger("t.fail", tenant_id="acme")
    assert failure_reasons_present() == ["step_failed"]
    assert failure_reasons_present(WorkflowRun.objects.filter(tenant_id="elsewhere")) == []


def test_workers_and_their_heartbeats():
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        name="h:1", hostname="h", pid=1, tenants=[], loop=True, started_at=now, seen_at=now
    )
    WorkerHeartbeat.objects.create(
        name="h:2",
        hostname="h",
        pid=2,
        tenants=["acme"],
        loop=False,
        started_at=now,
        seen_at=now - timedelta(hours=1),
    )
    board = dashboard(None, now)
    assert [w["name"] for w in board.workers] == ["h:1", "h:2"]
    assert board.workers[1]["age_seconds"] > 3000
    assert [w["name"] for w in dashboard("other", now).workers] == ["h:1"]


def test_buckets_are_whole_hours_and_local_midnights(settings):
    settings.TIME_ZONE = "Asia/Kolkata"  # +05:30: local hours are not UTC hours
    now = timezone.now()
    with timezone.override("Asia/Kolkata"):
        hours, days = hour_starts(now), day_starts(now)
        assert all(timezone.localtime(h).minute == 0 for h in hours)
        assert all(timezone.localtime(d).hour == 0 for d in days)
        assert hours[-1] <= now < hours[-1] + timedelta(hours=1)
        assert len({d.date() for d in days}) == 30


def test_the_chart_geometry_stays_inside_its_box():
    trigger("t.fail")
    series = dashboard(None, timezone.now()).overall.hourly
    chart = charts.bar_chart(series, lambda start: f"{start:%H}", what="runs")
    assert chart.bars and all(
        chart.left <= bar.x and bar.x + bar.width <= chart.width and bar.y >= 0
        for bar in chart.bars
    )
    assert {bar.kind for bar in chart.bars} == {"started", "failed"}
    assert chart.summary == "runs: 1 started, 0 completed, 1 failed, 0 cancelled"
    assert [charts.nice_ceiling(n) for n in (0, 1, 3, 7, 11, 180)] == [1, 1, 5, 10, 20, 200]
    assert WorkflowRun.objects.count() == 1
