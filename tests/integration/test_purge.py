"""Retention: ``purge_workflow_runs`` / ``purge_runs`` remove finished runs, and only those.

Runs finish when the test makes them finish; the cut-off is chosen around
their real ``finished_at`` (an instant between two runs, or ``now=`` moved
forward), never by waiting for time to pass.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
import zlib
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone

from kumiko_workflows import (
    append_event,
    cancel_run,
    define_workflow,
    fire_due_schedules,
    on_event,
    rerun_run,
    resume_due_runs,
    run_id_for,
    steps,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.checks import check_settings
from kumiko_workflows.engine.cron import schedule_id
from kumiko_workflows.engine.starts import start_run
from kumiko_workflows.exceptions import AppendOnlyError, InvalidArgument, RunNotFound
from kumiko_workflows.models import (
    Event,
    PurgedRun,
    WakeCheck,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
)
from kumiko_workflows.operations.archive import Archive, ArchiveError, read_archive
from kumiko_workflows.operations.purge import purge_runs
from kumiko_workflows.operations.rebuild import check as rebuild_check
from kumiko_workflows.workflow.registry import registry
from tests.support import REPO, subprocess_env, trigger, waits_for_a_lock
from tests.support.faults import Worker, wait_for
from tests.testapp import cron_workflows as cw

pytestmark = pytest.mark.django_db


def start(type_: str, name: str, tenant: str = "default", **payload) -> uuid.UUID:
    event = trigger(type_, tenant_id=tenant, **payload)
    return run_id_for(name, event.payload["run_key"], tenant)


def counts() -> dict[str, int]:
    """Rows per table (and events per kind): what a purge may change."""
    events = Event.objects.all()
    return {
        "run_events": events.filter(aggregate_type=et.RUN_AGGREGATE_TYPE).count(),
        "schedule_events": events.filter(aggregate_type=et.SCHEDULE_AGGREGATE_TYPE).count(),
        "domain_events": events.exclude(
            aggregate_type__in=[et.RUN_AGGREGATE_TYPE, et.SCHEDULE_AGGREGATE_TYPE]
        ).count(),
        "runs": WorkflowRun.objects.count(),
        "pending": WorkflowRunPending.objects.count(),
        "wait_keys": WorkflowWaitKey.objects.count(),
        "wake_checks": WakeCheck.objects.count(),
        "tombstones": PurgedRun.objects.count(),
    }


def stream_rows(run_id) -> int:
    return Event.objects.filter(aggregate_id=run_id).count()


def gone(run_id) -> bool:
    """Nothing of the run is left but its tombstone."""
    return (
        stream_rows(run_id) == 0
        and not WorkflowRun.objects.filter(run_id=run_id).exists()
        and not WorkflowRunPending.objects.filter(run_id=run_id).exists()
        and not WorkflowWaitKey.objects.filter(run_id=run_id).exists()
        and not WakeCheck.objects.filter(run_id=run_id).exists()
        and PurgedRun.objects.filter(run_id=run_id).exists()
    )


def command(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("purge_workflow_runs", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def world(past, future):
    """Runs in every state in two tenants, some finished with leftovers beside them."""
    runs = {
        "completed": start("t.branch", "t-branch", go_then=False),
        "failed": start("t.fail", "t-fail"),
        "cancelled": start("t.wait", "t-wait", **{"for": future}),
        "resumed": start("t.wait", "t-wait", **{"for": past}),
        "waiting": start("t.wait", "t-wait", **{"for": future}),
        "awaiting": start("t.signed-up", "t-event", user_id="u1"),
        "retrying": start("t.retry", "t-retry", fail_attempts=1),
        "acme_completed": start("t.branch", "t-branch", tenant="acme", go_then=False),
        "acme_waiting": start("t.wait", "t-wait", tenant="acme", **{"for": future}),
    }
    cancel_run(runs["cancelled"], "test", by="tests")
    assert resume_due_runs(tenant_id="default").completed == 1  # "resumed"
    # Leftovers a crash or a hand edit can leave beside a finished run.
    finished = runs["completed"]
    WorkflowRunPending.objects.create(
        tenant_id="default",
        run_id=finished,
        step="9",
        workflow_name="t-branch",
        suspension_type="wait",
        wake_at=timezone.now() + timedelta(days=1),
        definition_fingerprint="x",
        run_version=1,
        suspended_at=timezone.now(),
    )
    WorkflowWaitKey.objects.create(
        tenant_id="default", run_id=finished, event_type="t.x", path='["a"]', value="1"
    )
    WakeCheck.objects.create(tenant_id="default", run_id=finished)
    statuses = dict(WorkflowRun.objects.values_list("run_id", "status"))
    assert [statuses[runs[name]] for name in runs] == [
        "completed",
        "failed",
        "cancelled",
        "completed",
        "waiting",
        "waiting",
        "waiting",
        "completed",
        "waiting",
    ]
    return runs


FINISHED = ["completed", "failed", "cancelled", "resumed", "acme_completed"]
NOT_FINISHED = ["waiting", "awaiting", "retrying", "acme_waiting"]


# --- what goes and what stays -----------------------------------------------------


def test_purge_removes_exactly_the_finished_runs_and_their_leftovers(world):
    before = counts()
    finished_events = Event.objects.filter(aggregate_id__in=[world[n] for n in FINISHED]).count()
    waiting_streams = {n: stream_rows(world[n]) for n in NOT_FINISHED}

    report = purge_runs("PT0S")

    after = counts()
    assert all(gone(world[name]) for name in FINISHED)
    assert {n: stream_rows(world[n]) for n in NOT_FINISHED} == waiting_streams
    assert set(WorkflowRun.objects.values_list("run_id", flat=True)) == {
        world[n] for n in NOT_FINISHED
    }
    assert after == {
        **before,
        "run_events": before["run_events"] - finished_events,
        "runs": before["runs"] - len(FINISHED),
        "pending": before["pending"] - 1,  # the leftover; the waiting runs keep theirs
        "wait_keys": before["wait_keys"] - 1,
        "wake_checks": before["wake_checks"] - 1,
        "tombstones": len(FINISHED),
    }
    assert after["domain_events"] == before["domain_events"]  # trigger events and the rest
    assert (report.runs, report.events, report.tombstones) == (5, finished_events, 5)
    assert (report.pending, report.wait_keys, report.wake_checks) == (1, 1, 1)
    assert report.batches == 2 and report.passed_over == 0  # one per tenant
    assert rebuild_check().differences == []


def test_the_cut_off_is_counted_back_from_now_and_strictly_before(world):
    finished = WorkflowRun.objects.get(run_id=world["failed"]).finished_at

    assert purge_runs("P30D", now=timezone.now() + timedelta(days=29)).runs == 0
    assert purge_runs(finished).runs == 1  # an instant: only "completed" finished before it
    assert gone(world["completed"]) and not gone(world["failed"])
    assert purge_runs("P30D", now=timezone.now() + timedelta(days=31)).runs == 4
    assert all(gone(world[name]) for name in FINISHED)


def test_filters_by_tenant_and_workflow_leave_everything_else(world):
    report = purge_runs("PT0S", tenant_id="acme")

    assert report.runs == 1 and gone(world["acme_completed"])
    assert not any(gone(world[name]) for name in ["completed", "failed", "cancelled", "resumed"])

    report = purge_runs("PT0S", workflow_name="t-wait")

    assert report.runs == 2 and gone(world["cancelled"]) and gone(world["resumed"])
    assert not gone(world["completed"]) and not gone(world["failed"])


def test_dry_run_counts_what_the_purge_then_removes_and_changes_nothing(world):
    before = counts()

    dry = purge_runs("PT0S", dry_run=True)

    assert counts() == before
    real = purge_runs("PT0S")
    assert dry.counts() == real.counts()
    assert dry.runs == 5


def test_a_second_purge_finds_nothing_and_the_projections_still_match(world):
    purge_runs("PT0S", batch_size=1)
    after = counts()

    again = purge_runs("PT0S", batch_size=1)

    assert again.runs == again.events == again.tombstones == 0
    assert counts() == after
    out = io.StringIO()
    call_command("rebuild_workflow_projections", "--check", stdout=out)
    assert "No differences" in out.getvalue()


def test_events_stay_append_only_for_everyone_else(world):
    purge_runs("PT0S")
    waiting = Event.objects.filter(aggregate_id=world["waiting"])

    with pytest.raises(AppendOnlyError):
        waiting.delete()
    with pytest.raises(AppendOnlyError):
        waiting.first().delete()
    assert waiting.count() == 2


def test_only_the_purge_deletes_events():
    """The one statement that deletes events is called from the purge (its batches) alone."""
    package = Path(__file__).resolve().parent.parent.parent / "kumiko_workflows"
    callers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "delete_run_streams(" in path.read_text()
    )
    assert callers == ["operations/purge_batch.py", "store/statements.py"]
    assert "def delete_run_streams(" in (package / "store" / "statements.py").read_text()


# --- runs asked for by id -----------------------------------------------------------


def test_a_run_not_finished_is_never_touched_even_asked_for_by_id(world):
    asked = [world["waiting"], world["awaiting"], world["failed"], uuid.uuid4()]
    before = {name: stream_rows(world[name]) for name in NOT_FINISHED}

    report = purge_runs("PT0S", run_ids=asked)

    assert report.runs == 1 and gone(world["failed"])
    assert {name: stream_rows(world[name]) for name in NOT_FINISHED} == before
    assert dict(report.refused) == {
        str(world["waiting"]): "it is waiting, not finished",
        str(world["awaiting"]): "it is waiting, not finished",
        str(asked[3]): "no workflow run has this id",
    }
    again = purge_runs("PT0S", run_ids=[world["failed"]])
    assert again.already_purged == [str(world["failed"])] and again.refused == []


def test_the_command_refuses_a_run_not_finished_with_a_non_zero_exit(world):
    with pytest.raises(CommandError, match=r"1 run\(s\) asked for were not purged"):
        command("--finished-before", "PT0S", "--run", str(world["waiting"]))
    assert not gone(world["waiting"])
    with pytest.raises(CommandError):
        command("--finished-before", "PT0S", "--tenant", "acme", "--run", str(world["completed"]))
    assert not gone(world["completed"])

    out, err = command("--finished-before", "PT0S", "--run", str(world["completed"]))
    assert "purged runs=1 events=2 pending=1 wait_keys=1 wake_checks=1 tombstones=1" in out
    assert gone(world["completed"])


# --- the command ----------------------------------------------------------------------


def test_the_command_prints_progress_and_a_summary(world):
    out, err = command("--finished-before", "PT0S", "--batch", "2")

    assert "Purging finished runs: 5/5 (100%)" in err
    assert out.startswith("purged runs=5 events=")
    assert "in 3 batch(es)" in out  # 2 + 2 in default, 1 in acme


def test_the_command_dry_run_says_so(world):
    before = counts()

    out, _ = command("--finished-before", "PT0S", "--dry-run")

    assert out.startswith("dry run, nothing changed; would purge runs=5 events=")
    assert counts() == before


def test_retention_setting_is_the_default_cut_off(world, settings):
    with pytest.raises(CommandError, match="give --finished-before"):
        command()
    settings.KUMIKO_WORKFLOWS = {"RETENTION": "P30D"}
    out, _ = command()
    assert out.startswith("purged runs=0")
    settings.KUMIKO_WORKFLOWS = {"RETENTION": timedelta(0)}
    out, _ = command()
    assert out.startswith("purged runs=5")


BAD_INPUT = {
    "negative duration": (
        ["--finished-before=-P30D"],  # (argparse takes "-P30D" alone for an option)
        "--finished-before '-P30D' is a negative duration",
    ),
    "garbage": (
        ["--finished-before", "last tuesday"],
        "--finished-before 'last tuesday' is neither an ISO 8601 duration",
    ),
    "years": (["--finished-before", "P1Y"], "uses years or months, which have no fixed length"),
    "future instant": (
        ["--finished-before", "2999-01-01T00:00:00+00:00"],
        "--finished-before 2999-01-01T00:00:00+00:00 is in the future; to purge every run "
        "finished until now, give PT0S",
    ),
    "naive instant": (["--finished-before", "2020-01-01T00:00:00"], "has no UTC offset"),
    "instant before the year 1 in UTC": (
        ["--finished-before", "0001-01-01T00:00:00+14:00"],
        "--finished-before 0001-01-01T00:00:00+14:00 is out of range: it falls outside the "
        "years 1-9999 in UTC",
    ),
    "batch too big": (["--finished-before", "P1D", "--batch", "10001"], "from 1 to 10000"),
    "batch zero": (["--finished-before", "P1D", "--batch", "0"], "must be at least 1"),
    "run id": (["--finished-before", "P1D", "--run", "nope"], "'nope' is not a run id"),
    "tenant": (["--finished-before", "P1D", "--tenant", "t" * 101], "longer than 100"),
}


@pytest.mark.parametrize("args, message", BAD_INPUT.values(), ids=BAD_INPUT)
def test_bad_input_is_a_command_error_naming_the_problem(world, args, message):
    before = counts()

    with pytest.raises(CommandError) as raised:
        command(*args)

    assert message in str(raised.value)
    assert counts() == before


def test_bad_retention_settings_fail_the_system_check(settings):
    for value, problem in [
        ("-P1D", "is a negative duration"),
        ("2026-01-01T00:00:00Z", "must be an ISO 8601 duration"),
        ("soon", "must be an ISO 8601 duration"),
        (30, "must be an ISO 8601 duration such as 'P30D' or a timedelta"),
        (timedelta(days=-1), "is a negative duration"),
    ]:
        settings.KUMIKO_WORKFLOWS = {"RETENTION": value}
        errors = check_settings()
        assert [e.id for e in errors] == ["kumiko_workflows.E027"], value
        assert problem in errors[0].msg
    settings.KUMIKO_WORKFLOWS = {"REUSE_PURGED_KEYS": "yes"}
    assert [e.id for e in check_settings()] == ["kumiko_workflows.E028"]
    settings.KUMIKO_WORKFLOWS = {"RETENTION": "P30D", "REUSE_PURGED_KEYS": True}
    assert check_settings() == []
    settings.KUMIKO_WORKFLOWS = {"RETENTION": timedelta(days=7)}
    assert check_settings() == []


def test_bad_arguments_to_the_api_raise_before_any_sql(django_assert_num_queries):
    with django_assert_num_queries(0):
        for kwargs in [
            {"finished_before": "P1D", "batch_size": 0},
            {"finished_before": "P1D", "batch_size": True},
            {"finished_before": "P1D", "tenant_id": "a\x00b"},
            {"finished_before": "P1D", "workflow_name": ""},
            {"finished_before": timezone.now().replace(tzinfo=None)},
            {"finished_before": 30},
        ]:
            with pytest.raises(InvalidArgument):
                purge_runs(**kwargs)


# --- the archive -------------------------------------------------------------------------


def gzip_members(path: Path) -> int:
    """How many gzip members the file holds, each decompressed on its own."""
    data, members = path.read_bytes(), 0
    while data:
        member = zlib.decompressobj(wbits=31)
        member.decompress(data)
        assert member.eof, "a torn member"
        data, members = member.unused_data, members + 1
    return members


def _copies(run_ids) -> list[dict]:
    """The events of these streams as the archive should hold them."""
    rows = Event.objects.filter(aggregate_id__in=run_ids).order_by("id")
    return [
        {
            "id": e.id,
            "tenant_id": e.tenant_id,
            "aggregate_type": e.aggregate_type,
            "aggregate_id": str(e.aggregate_id),
            "version": e.version,
            "type": e.type,
            "event_version": e.event_version,
            "payload": e.payload,
            "metadata": e.metadata,
            "created_by": e.created_by,
            "created_at": e.created_at.isoformat(),
        }
        for e in rows
    ]


def test_the_archive_holds_every_removed_event_one_member_per_batch(world, tmp_path):
    expected = _copies([world[name] for name in FINISHED])
    path = tmp_path / "purged.jsonl.gz"

    report = purge_runs("PT0S", batch_size=2, archive=path)

    archived = list(read_archive(path))
    assert sorted(archived, key=lambda e: e["id"]) == expected
    assert path.stat().st_mode & 0o777 == 0o600  # step results: the owner's only
    assert len(archived) == report.events
    assert gzip_members(path) == report.batches == 3  # one per batch: 2 + 2, 1
    # Append-safe: a second purge adds its members after the first one's.
    world_later = start("t.fail", "t-fail")
    more = _copies([world_later])
    purge_runs("PT0S", archive=path)
    assert sorted(read_archive(path), key=lambda e: e["id"]) == sorted(
        expected + more, key=lambda e: e["id"]
    )


@pytest.mark.skipif(shutil.which("zcat") is None, reason="needs zcat")
def test_the_archive_reads_with_zcat(world, tmp_path):
    path = tmp_path / "purged.jsonl.gz"
    purge_runs("PT0S", batch_size=1, archive=path)

    text = subprocess.run(["zcat", str(path)], capture_output=True, check=True, text=True).stdout

    lines = [json.loads(line) for line in text.splitlines()]
    assert {line["aggregate_id"] for line in lines} == {str(world[name]) for name in FINISHED}
    assert all(line["aggregate_type"] == "workflow-run" for line in lines)


def test_a_dry_run_writes_no_archive(world, tmp_path):
    path = tmp_path / "purged.jsonl.gz"
    purge_runs("PT0S", dry_run=True, archive=path)
    assert not path.exists()


def test_an_archive_ending_in_a_torn_member_is_refused_before_anything_changes(world, tmp_path):
    path = tmp_path / "purged.jsonl.gz"
    whole = gzip.compress(b'{"id": 1}\n')
    path.write_bytes(whole + gzip.compress(b'{"id": 2}\n')[:15])
    path.chmod(0o600)  # (a wider file is refused for that first)
    before = counts()

    with pytest.raises(ArchiveError, match=f"truncate -s {len(whole)} "):
        purge_runs("PT0S", archive=path)

    assert counts() == before
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ArchiveError, match="is not a gzip file"):
        purge_runs("PT0S", archive=path)
    with pytest.raises(ArchiveError, match="cannot open the archive"):
        purge_runs("PT0S", archive=tmp_path / "no-such-folder" / "a.gz")
    assert counts() == before


def test_an_archive_another_purge_is_writing_is_refused(world, tmp_path):
    path = tmp_path / "purged.jsonl.gz"
    held = Archive(path)
    try:
        with pytest.raises(ArchiveError, match="in use by another purge"):
            purge_runs("PT0S", archive=path)
    finally:
        held.close()
    assert purge_runs("PT0S", archive=path).runs == 5


# --- idempotency survives a purge ---------------------------------------------------


def test_a_trigger_with_a_purged_runs_key_does_not_start_it_again(world, settings):
    failed = WorkflowRun.objects.get(run_id=world["failed"])
    purge_runs("PT0S")
    domain_before = counts()["domain_events"]

    again = append_event(uuid.uuid4(), "test-source", "t.fail", {"run_key": failed.idempotency_key})

    assert again.pk is not None  # the site's write committed
    assert counts()["domain_events"] == domain_before + 1
    assert stream_rows(world["failed"]) == 0  # no run started with the used key
    assert not WorkflowRun.objects.filter(run_id=world["failed"]).exists()
    # A new key starts a new run as always.
    assert WorkflowRun.objects.filter(run_id=start("t.fail", "t-fail")).exists()

    settings.KUMIKO_WORKFLOWS = {"REUSE_PURGED_KEYS": True}
    append_event(uuid.uuid4(), "test-source", "t.fail", {"run_key": failed.idempotency_key})
    reused = WorkflowRun.objects.get(run_id=world["failed"])
    assert reused.started_at > failed.started_at and reused.trigger_event_id != again.id


def test_a_purged_key_is_not_queued_again_either(world):
    from kumiko_workflows import start_in_worker

    failed = WorkflowRun.objects.get(run_id=world["failed"])
    purge_runs("PT0S")

    with start_in_worker():
        append_event(uuid.uuid4(), "test-source", "t.fail", {"run_key": failed.idempotency_key})

    assert stream_rows(world["failed"]) == 0
    assert not WorkflowRunPending.objects.filter(run_id=world["failed"]).exists()


def test_the_guard_costs_workers_no_savepoint_per_run():
    from kumiko_workflows.engine.resume import needs_savepoints

    # It is one of the engine's own projections: it never raises inside a resume.
    assert not needs_savepoints()


def test_rerun_of_a_purged_run_finds_no_run(world):
    purge_runs("PT0S", run_ids=[world["failed"]])

    with pytest.raises(RunNotFound):
        rerun_run(world["failed"], by="tests")
    assert stream_rows(world["failed"]) == 0


def _noop(ctx):
    return None


def _keyless():
    return define_workflow(
        name="t-purge-keyless",
        trigger=on_event("t.purge-keyless"),
        idempotency_key=None,
        steps=[steps.compute("n", _noop)],
        register=False,
    )


def test_a_workflow_without_idempotency_keys_leaves_no_tombstones():
    with registry.override(_keyless()):
        for _ in range(3):
            append_event(uuid.uuid4(), "test-source", "t.purge-keyless", {})
        report = purge_runs("PT0S")
        assert (report.runs, report.tombstones) == (3, 0)
        assert not PurgedRun.objects.exists()
        append_event(uuid.uuid4(), "test-source", "t.purge-keyless", {})
        assert WorkflowRun.objects.filter(workflow_name="t-purge-keyless").count() == 1


def _keyed_then_keyless(version):
    """Version 1 keys its runs by the payload's run_key; version 2 gives each a random key."""
    return define_workflow(
        name="t-purge-keyless",
        trigger=on_event("t.purge-keyless"),
        idempotency_key=_run_key if version == 1 else None,
        version=version,
        steps=[steps.compute("n", _noop)],
        register=False,
    )


def _run_key(event):
    return event.payload["run_key"]


def test_a_purged_runs_tombstone_follows_its_own_version_not_the_newest():
    with registry.override(_keyed_then_keyless(1)):
        keyed = start("t.purge-keyless", "t-purge-keyless", run_key="k1")
    with registry.override(_keyed_then_keyless(1), _keyed_then_keyless(2)):
        assert purge_runs("PT0S").tombstones == 1  # v1 keyed it, though v2 starts keyless runs
        # A v2 run's key is random: no tombstone needed.
        append_event(uuid.uuid4(), "test-source", "t.purge-keyless", {})
        assert purge_runs("PT0S").tombstones == 0
    with registry.override(_keyed_then_keyless(1)):  # a rollback: v1 starts runs again
        append_event(uuid.uuid4(), "test-source", "t.purge-keyless", {"run_key": "k1"})

    assert gone(keyed)  # the purged run was not started again with its used key


def test_cron_runs_are_purged_without_refiring_their_slots():
    first = "2030-01-01T06:00:00+00:00"
    with registry.override(cw.hourly_all):
        fire_due_schedules(now=datetime.fromisoformat("2030-01-01T05:02:00+00:00"))
        assert fire_due_schedules(now=datetime.fromisoformat(first)) == 1
        run_id = run_id_for(cw.hourly_all.name, first, "default")
        schedule = Event.objects.filter(aggregate_id=schedule_id(cw.hourly_all.name, "default"))
        schedule_before = list(schedule.values_list("id", flat=True))

        assert purge_runs("PT0S").runs == 1

        assert gone(run_id)
        assert list(schedule.values_list("id", flat=True)) == schedule_before  # kept
        later = datetime.fromisoformat("2030-01-01T06:30:00+00:00")
        assert fire_due_schedules(now=later) == 0  # the purged slot does not fire again
        # Even started again by hand, the slot's run is not: its key is used.
        slot_event = schedule.get(type=et.SCHEDULE_SLOT_FIRED)
        assert start_run(cw.hourly_all, slot_event, now=later) is None
        assert stream_rows(run_id) == 0
        # The next slot fires as usual.
        assert fire_due_schedules(now=datetime.fromisoformat("2030-01-01T07:00:10+00:00")) == 1


def _completed_branch_run(event):
    return event.payload["workflow_name"] == "t-branch"


def _its_run(event):
    return str(event.aggregate_id)


def _follow_up():
    """A workflow started by another run's ``workflow.run-completed``."""
    return define_workflow(
        name="t-purge-follow-up",
        trigger=on_event(et.RUN_COMPLETED, filter=_completed_branch_run),
        idempotency_key=_its_run,
        steps=[steps.wait("PT1H"), steps.compute("n", _noop)],
        register=False,
    )


def test_a_run_whose_event_started_a_run_still_waiting_is_kept_until_that_one_finishes():
    with registry.override(_follow_up()):
        first = start("t.branch", "t-branch", go_then=False)
        follower = run_id_for("t-purge-follow-up", str(first))
        assert WorkflowRun.objects.get(run_id=follower).status == "waiting"

        report = purge_runs("PT0S", run_ids=[first])

        assert report.runs == 0 and report.passed_over == 1
        assert dict(report.refused) == {
            str(first): f"run {follower}, not finished, was started by its event"
        }
        assert stream_rows(first) == 2
        resume_due_runs(now=timezone.now() + timedelta(hours=2))
        assert WorkflowRun.objects.get(run_id=follower).status == "completed"
        assert purge_runs("PT0S").runs == 2 and gone(first) and gone(follower)


def _follow_up_v2():
    """Version 2 of the follow-up, started by a domain event: no run event triggers it."""
    return define_workflow(
        name="t-purge-follow-up",
        trigger=on_event("t.follow-up"),
        idempotency_key=_its_run,
        version=2,
        steps=[steps.compute("n", _noop)],
        register=False,
    )


def test_the_trigger_of_an_older_versions_run_in_flight_is_kept():
    with registry.override(_follow_up()):
        first = start("t.branch", "t-branch", go_then=False)
        follower = run_id_for("t-purge-follow-up", str(first))
    kept = {str(first): f"run {follower}, not finished, was started by its event"}

    # v2 beside v1 (the newest no longer triggered by run events), and with
    # neither declared: the waiting v1 run still needs its trigger.
    for declared in ([_follow_up(), _follow_up_v2()], []):
        with registry.override(*declared) if declared else registry.without("t-purge-follow-up"):
            report = purge_runs("PT0S", run_ids=[first])
        assert (report.runs, report.passed_over, dict(report.refused)) == (0, 1, kept)
        assert stream_rows(first) == 2

    with registry.override(_follow_up(), _follow_up_v2()):
        resume_due_runs(now=timezone.now() + timedelta(hours=2))
    run = WorkflowRun.objects.get(run_id=follower)
    assert (run.workflow_version, run.status, run.failure_reason) == (1, "completed", "")
    assert purge_runs("PT0S").runs == 2 and gone(first) and gone(follower)


# --- PostgreSQL: a purge beside real processes ---------------------------------------

APPENDER = textwrap.dedent(
    """
    import json, sys, time, uuid
    from pathlib import Path
    import django
    django.setup()
    from kumiko_workflows import append_event

    folder, past = Path(sys.argv[1]), sys.argv[2]
    timings, late, n = [], 0, 0
    (folder / "appending").touch()
    while not (folder / "stop").exists():
        n += 1
        began = time.time()
        if n % 2:  # a run the worker drains at once
            payload = {"run_key": f"late-{n}", "for": past}
            append_event(uuid.uuid4(), "test-source", "t.wait", payload)
            late += 1
        else:
            append_event(uuid.uuid4(), "noise", "t.noise", {"n": n})
        timings.append([began, time.time()])
        time.sleep(0.01)  # the pace of a busy site, not a synchronisation
    (folder / "appended.json").write_text(json.dumps({"timings": timings, "late": late}))
    """
)


def _purge_process(*args: str, name: str = "kw-purge") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / "manage.py"), "purge_workflow_runs", *args],
        cwd=REPO,
        env=subprocess_env(PGAPPNAME=name),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_purge_beside_a_draining_worker_and_an_appending_site(tmp_path, past, future):
    finished = [start("t.branch", "t-branch", go_then=False) for _ in range(600)]
    due = [start("t.wait", "t-wait", **{"for": past}) for _ in range(150)]
    later = [start("t.wait", "t-wait", **{"for": future}) for _ in range(20)]
    cut = timezone.now()
    domain_before = set(
        Event.objects.exclude(aggregate_type=et.RUN_AGGREGATE_TYPE).values_list("id", flat=True)
    )
    later_streams = Event.objects.filter(aggregate_id__in=later).count()

    worker = Worker(tmp_path, "--loop", "--no-cron", "--interval", "0.5", name="kw-worker")
    appender = subprocess.Popen(
        [sys.executable, "-c", APPENDER, str(tmp_path), past], env=subprocess_env()
    )
    try:
        wait_for(lambda: (tmp_path / "appending").exists(), "the appender to start")
        purge = _purge_process("--finished-before", cut.isoformat(), "--batch", "20")
        assert purge.stderr is not None and purge.stdout is not None
        with purge.stderr, purge.stdout:
            progress = [(time.time(), line) for line in purge.stderr]  # until it exits
            out = purge.stdout.read()
        assert purge.wait(timeout=120) == 0, progress
        (tmp_path / "stop").touch()
        assert appender.wait(timeout=120) == 0
        appended = json.loads((tmp_path / "appended.json").read_text())
        drained = 150 + appended["late"]
        wait_for(
            lambda: (
                WorkflowRun.objects.filter(workflow_name="t-wait", status="completed").count()
                == drained
            ),
            "the worker to drain the 150 due runs and the appender's",
        )
    finally:
        if appender.poll() is None:
            appender.kill()
        assert worker.stop() == 0, worker.log()

    # The purge removed exactly the runs finished before its cut-off.
    assert out.startswith("purged runs=600 events=1200 "), out
    assert "tombstones=600" in out
    assert not WorkflowRun.objects.filter(run_id__in=finished).exists()
    assert not Event.objects.filter(aggregate_id__in=finished).exists()
    assert PurgedRun.objects.filter(run_id__in=finished).count() == 600
    # The worker drained every due run exactly once, meanwhile.
    completions = Event.objects.filter(
        aggregate_type=et.RUN_AGGREGATE_TYPE, type=et.RUN_COMPLETED
    ).exclude(aggregate_id__in=finished)
    assert completions.count() == completions.values("aggregate_id").distinct().count() == drained
    assert set(due) <= set(completions.values_list("aggregate_id", flat=True))
    # Runs still waiting, and every domain event, are untouched.
    assert Event.objects.filter(aggregate_id__in=later).count() == later_streams
    assert WorkflowRunPending.objects.filter(run_id__in=later).count() == 20
    domain_after = set(
        Event.objects.exclude(aggregate_type=et.RUN_AGGREGATE_TYPE).values_list("id", flat=True)
    )
    assert domain_before <= domain_after
    noise = len(appended["timings"]) - appended["late"]
    assert Event.objects.filter(type="t.noise").count() == noise
    # Appends and resumes went on while the purge ran: none waited for all of it.
    lines = [stamp for stamp, line in progress if line.startswith("Purging finished runs")]
    assert lines, progress
    window = (lines[0], progress[-1][0])
    timings = appended["timings"]
    assert any(window[0] <= ended <= window[1] for _, ended in timings), (window, timings[-1])
    assert rebuild_check().differences == []


RERUN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import django
    django.setup()
    from django.db import transaction
    from kumiko_workflows import rerun_run
    from kumiko_workflows.exceptions import RunNotFound

    run_id, hold = sys.argv[1], sys.argv[2:]
    try:
        with transaction.atomic():
            print("rerun" if rerun_run(run_id, by="tests") else "not rerun", flush=True)
            if hold:  # keep the rerun's transaction open until the test says
                folder = Path(hold[0])
                (folder / "rerun").touch()
                while not (folder / "commit").exists():
                    __import__("time").sleep(0.01)
    except RunNotFound as exc:
        print("RunNotFound:", exc, flush=True)
    """
)


def _rerun_process(run_id, *hold: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", RERUN, str(run_id), *hold],
        env=subprocess_env(PGAPPNAME="kw-rerun"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_rerun_racing_a_purge_finds_the_run_gone_and_leaves_nothing_behind():
    failed = start("t.fail", "t-fail")
    with transaction.atomic():
        # Hold the purge in the middle of its batch: it has locked the run's
        # status row, and waits here to delete the run's first event.
        held = Event.objects.select_for_update()
        list(held.filter(tenant_id="default", aggregate_id=failed, version=1))
        purge = _purge_process("--finished-before", "PT0S", "--run", str(failed))
        wait_for(lambda: waits_for_a_lock("kw-purge"), "the purge to reach the held event")
        # Meanwhile support reruns the run: its stream still looks whole.
        rerun = _rerun_process(failed)
        wait_for(lambda: waits_for_a_lock("kw-rerun"), "the rerun to wait for the purge's batch")
    out, err = purge.communicate(timeout=120)
    assert purge.returncode == 0, err
    rerun_out, rerun_err = rerun.communicate(timeout=120)

    assert out.startswith("purged runs=1 events=2 "), out
    assert rerun_out.startswith("RunNotFound: no workflow run has id"), (rerun_out, rerun_err)
    assert gone(failed)  # no rerun-requested event, no pending row left in a purged stream


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_run_being_rerun_is_passed_over_not_waited_for(tmp_path):
    failed = start("t.fail", "t-fail")
    rerun = _rerun_process(failed, str(tmp_path))
    try:
        wait_for(lambda: (tmp_path / "rerun").exists(), "the rerun to append")

        report = purge_runs("PT0S", run_ids=[failed])  # does not wait for the rerun

        assert report.runs == 0
        assert report.refused == [(str(failed), "another transaction was changing it; try again")]
    finally:
        (tmp_path / "commit").touch()
        out, err = rerun.communicate(timeout=120)
    assert out.startswith("rerun"), (out, err)
    assert WorkflowRun.objects.get(run_id=failed).status == "waiting"
    assert purge_runs("PT0S", run_ids=[failed]).refused == [
        (str(failed), "it is waiting, not finished")
    ]
    assert stream_rows(failed) == 3


TRIGGER = textwrap.dedent(
    """
    import sys, uuid
    import django
    django.setup()
    from kumiko_workflows import append_event

    event = append_event(uuid.uuid4(), "test-source", "t.fail", {"run_key": sys.argv[1]})
    print("appended", event.id, flush=True)
    """
)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_trigger_racing_a_purge_does_not_start_the_purged_run_again():
    failed = start("t.fail", "t-fail")
    key = WorkflowRun.objects.get(run_id=failed).idempotency_key
    with transaction.atomic():
        # Hold the purge after it deleted the run's events, before its
        # tombstone: this transaction has the same tombstone, uncommitted.
        PurgedRun.objects.create(
            tenant_id="default", run_id=failed, workflow_name="t-fail", purged_at=timezone.now()
        )
        purge = _purge_process("--finished-before", "PT0S")
        wait_for(lambda: waits_for_a_lock("kw-purge"), "the purge to reach its tombstone")
        # The same key again: the run's first event is deleted, not yet committed.
        child = subprocess.Popen(
            [sys.executable, "-c", TRIGGER, key],
            env=subprocess_env(PGAPPNAME="kw-trigger"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: waits_for_a_lock("kw-trigger"), "the trigger's run to wait for the purge")
        transaction.set_rollback(True)  # let the purge write its own tombstone
    out, err = purge.communicate(timeout=120)
    assert purge.returncode == 0, err
    appended, child_err = child.communicate(timeout=120)

    assert out.startswith("purged runs=1 "), out
    assert appended.startswith("appended"), child_err
    assert Event.objects.filter(type="t.fail").count() == 2  # the site's write committed
    assert gone(failed)  # and the purged run did not start again
