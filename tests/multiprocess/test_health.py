"""``workflow_status --check``: the lag and the workers' heartbeats, for orchestrators.

The heartbeat is written by real worker processes (``resume_due_runs``);
the verdict is read by the command, as a probe would run it.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from kumiko_workflows.engine.heartbeat import Heartbeat
from kumiko_workflows.models import WorkerHeartbeat
from kumiko_workflows.store import db
from kumiko_workflows.testing import virtual_clock
from tests.multiprocess.test_worker import start_worker, stop, wait_for
from tests.support import REPO, run_manage, subprocess_env, trigger
from tests.support.faults import database_url, free_port


def check(*args):
    out = io.StringIO()
    call_command("workflow_status", "--check", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def beat(name="web-1:7", seconds_ago=0.0, tenants=(), hostname="web-1"):
    seen = timezone.now() - timedelta(seconds=seconds_ago)
    return WorkerHeartbeat.objects.create(
        name=name,
        hostname=hostname,
        pid=7,
        tenants=list(tenants),
        loop=True,
        started_at=seen,
        seen_at=seen,
    )


# --- real workers ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_looping_worker_keeps_the_check_healthy_and_takes_its_heartbeat_when_it_stops():
    worker = start_worker("--interval", "0.2")
    try:
        first = wait_for(
            lambda: WorkerHeartbeat.objects.filter(pid=worker.pid).first(), "a heartbeat"
        )
        assert first.loop and first.tenants == [] and first.name.endswith(f":{worker.pid}")
        # It passes every 0.2 s, but writes its row every 5 s at most.
        later = wait_for(
            lambda: WorkerHeartbeat.objects.filter(pk=first.pk, seen_at__gt=first.seen_at).first(),
            "the next heartbeat",
        )
        assert (later.seen_at - first.seen_at).total_seconds() >= 4.9

        healthy = run_manage("workflow_status", "--check", "--max-lag", "60")
        assert healthy.returncode == 0, healthy.stderr
        assert f"worker {first.name} passed" in healthy.stdout
        own = run_manage("workflow_status", "--check", "--host", first.hostname)
        assert own.returncode == 0, own.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        code, _, err = stop(worker)
    assert code == 0, err

    assert not WorkerHeartbeat.objects.exists(), "a worker stopped on purpose takes its row"
    gone = run_manage("workflow_status", "--check")
    assert gone.returncode == 1
    assert "unhealthy: no worker has ever passed (no heartbeat)" in gone.stderr


@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_leaves_a_heartbeat_that_goes_stale():
    worker = start_worker("--interval", "0.2")
    row = wait_for(lambda: WorkerHeartbeat.objects.filter(pid=worker.pid).first(), "a heartbeat")
    worker.kill()
    stop(worker)
    wait_for(lambda: timezone.now() - row.seen_at > timedelta(seconds=1.5), "a second to pass")

    stale = run_manage("workflow_status", "--check", "--max-heartbeat-age", "1")

    assert stale.returncode == 1
    assert "no worker has passed in the last 1 s" in stale.stderr
    assert f"(the latest, {row.name}, " in stale.stderr


@pytest.mark.django_db(transaction=True)
def test_a_one_shot_pass_from_cron_leaves_its_heartbeat():
    result = run_manage("resume_due_runs", "--no-cron")
    assert result.returncode == 0, result.stderr
    row = WorkerHeartbeat.objects.get()
    assert not row.loop
    assert run_manage("workflow_status", "--check", "--max-heartbeat-age", "120").returncode == 0


# --- the verdict ---------------------------------------------------------------------


def late_run():
    """A run due an hour ago that no worker took: started on a clock an hour behind."""
    with virtual_clock(timezone.now() - timedelta(hours=1)):
        trigger("t.wait", **{"for": "PT0S"})


@pytest.mark.django_db
def test_the_check_fails_when_the_oldest_due_run_has_waited_longer_than_max_lag():
    late_run()
    beat()

    with pytest.raises(CommandError) as late:
        check("--max-lag", "60")
    assert "has waited 1 h for a worker: more than 60 s" in str(late.value)
    assert "heartbeat" not in str(late.value), "the worker is fine: only the lag is reported"

    assert check("--max-lag", "7200").startswith(
        "healthy: the oldest due run has waited 1 h; worker web-1:7 passed"
    )


@pytest.mark.django_db
def test_either_limit_can_be_left_unchecked_but_not_both():
    late_run()  # and no worker at all

    with pytest.raises(CommandError, match="leave nothing to check"):
        check("--max-lag", "off", "--max-heartbeat-age", "off")
    with pytest.raises(CommandError, match="no worker has ever passed") as heartbeat_only:
        check("--max-lag", "off")
    assert "has waited" not in str(heartbeat_only.value)
    with pytest.raises(CommandError, match="has waited 1 h") as lag_only:
        check("--max-heartbeat-age", "off")
    assert "no worker" not in str(lag_only.value)
    assert check("--max-lag", "7200", "--max-heartbeat-age", "off").startswith(
        "healthy: the oldest due run has waited 1 h; no worker"
    )


@pytest.mark.django_db
def test_the_check_reads_the_heartbeats_of_the_host_and_tenant_asked_for():
    beat("web-1:7", seconds_ago=1, tenants=["acme"])
    beat("web-2:9", seconds_ago=600, hostname="web-2")

    assert "healthy: nothing is due; worker web-1:7" in check()
    assert "worker web-1:7" in check("--tenant", "acme")
    with pytest.raises(CommandError, match=r"no worker serving tenant globex has passed"):
        check("--tenant", "globex")  # only web-2 serves every tenant, and it is stale
    with pytest.raises(CommandError, match=r"no worker on host web-2 has passed in the last 60 s"):
        check("--host", "web-2")
    with pytest.raises(CommandError, match=r"no worker on host web-3 has ever passed"):
        check("--host", "web-3")


@pytest.mark.django_db
def test_the_check_as_json_and_the_workers_in_the_status():
    late_run()
    beat("web-1:7", seconds_ago=90)

    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("workflow_status", "--check", "--json", stdout=out, stderr=io.StringIO())
    verdict = json.loads(out.getvalue())
    assert verdict["healthy"] is False and len(verdict["problems"]) == 2
    assert verdict["oldest_due"]["lag_seconds"] > 3600
    assert verdict["worker"]["name"] == "web-1:7" and verdict["worker"]["age_seconds"] >= 90

    status = io.StringIO()
    call_command("workflow_status", stdout=status)
    assert "Workers  1 with a heartbeat" in status.getvalue()
    assert "web-1:7  --loop, every tenant; last passed 1 min 30 s ago" in status.getvalue()


@pytest.mark.django_db
def test_a_heartbeat_is_written_at_most_every_few_seconds_and_prunes_day_old_rows(
    django_assert_num_queries,
):
    beat("gone:1", seconds_ago=2 * 86400)
    beat("recent:1", seconds_ago=3600)
    heartbeat = Heartbeat(["acme"], loop=True)

    heartbeat.beat()
    with django_assert_num_queries(0):
        heartbeat.beat()  # within 5 s of the last one: nothing written

    names = set(WorkerHeartbeat.objects.values_list("name", flat=True))
    assert names == {"recent:1", heartbeat.name}
    assert WorkerHeartbeat.objects.get(name=heartbeat.name).tenants == ["acme"]
    heartbeat.stop()
    assert not WorkerHeartbeat.objects.filter(name=heartbeat.name).exists()


# --- one clock: the database's --------------------------------------------------------


def skewed(seconds: float, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``manage.py *args`` in a process whose clock is ``seconds`` off.

    (``tests/support/skewed_clock.py``.)
    """
    return subprocess.run(
        [sys.executable, "-m", "tests.support.skewed_clock", str(seconds), *args],
        cwd=REPO,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("skew", [3600, -300], ids=["an-hour-ahead", "five-minutes-behind"])
def test_a_worker_writes_its_heartbeat_on_the_database_clock_not_its_own(skew):
    passed = skewed(skew, "resume_due_runs", "--no-cron")
    assert passed.returncode == 0, passed.stderr

    row = WorkerHeartbeat.objects.get()
    database_now = db.database_now()
    for instant in (row.seen_at, row.started_at):
        assert abs((database_now - instant).total_seconds()) < 60, (skew, instant, database_now)
    # Live (five minutes behind): fresh. Dead (an hour ahead): as old as it is, not an
    # hour younger -- the check, a process later, sees it past a limit of 50 ms.
    assert run_manage("workflow_status", "--check", "--max-lag", "off").returncode == 0
    dead = run_manage("workflow_status", "--check", "--max-heartbeat-age", "0.05")
    assert dead.returncode == 1, dead.stdout
    assert "no worker has passed in the last 0.05 s" in dead.stderr


@pytest.mark.django_db(transaction=True)
def test_the_check_judges_a_heartbeat_on_the_database_clock_not_its_own():
    fresh = beat("fresh:1", hostname="fresh")
    WorkerHeartbeat.objects.filter(pk=fresh.pk).update(seen_at=db.database_now())
    gone = beat("gone:2", hostname="gone")
    WorkerHeartbeat.objects.filter(pk=gone.pk).update(
        seen_at=db.database_now() - timedelta(minutes=2)
    )

    # A probe an hour ahead finds the fresh worker fresh...
    ahead = skewed(3600, "workflow_status", "--check", "--host", "fresh")
    assert ahead.returncode == 0, ahead.stderr
    assert ahead.stdout.startswith("healthy: nothing is due; worker fresh:1 passed")
    # ...and one an hour behind finds the dead one two minutes old, not in the future.
    behind = skewed(-3600, "workflow_status", "--check", "--json", "--host", "gone")
    assert behind.returncode == 1
    verdict = json.loads(behind.stdout)
    assert verdict["healthy"] is False
    assert 120 <= verdict["worker"]["age_seconds"] < 180, verdict
    assert "(the latest, gone:2, 2 min" in verdict["problems"][0]


def _unreachable(tmp_path) -> dict[str, str]:
    if connection.vendor == "postgresql":
        return {"DATABASE_URL": database_url(free_port())}  # nothing listens there
    missing = str(tmp_path / "no-such-dir" / "db.sqlite3")
    return {"DATABASE_URL": f"sqlite:///{missing}", "KUMIKO_TEST_DB_NAME": missing}


@pytest.mark.parametrize("args", [["--check"], ["--check", "--json"], ["--json"], []], ids=" ".join)
def test_with_the_database_down_the_status_is_one_line_and_exits_1(args, tmp_path):
    result = skewed(0, "workflow_status", *args, **_unreachable(tmp_path))

    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("CommandError: the database is unavailable: "), line
    if "--json" in args:
        answer = json.loads(result.stdout)
        assert answer["error"] == line.removeprefix("CommandError: ")
        assert answer.get("healthy", False) is False and ("healthy" in answer) == (
            "--check" in args
        )
    else:
        assert result.stdout == ""
