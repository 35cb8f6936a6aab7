"""The race other engines lose: an awaited event committed while a run suspends.

Two real processes on PostgreSQL: one starts a run that suspends on
``wait_for_event`` and holds its transaction open; the other appends the
awaited event meanwhile. Neither can see the other's uncommitted row, yet the
run must be woken by that event, not by its timeout seven days later. And a
row another transaction holds locked is woken once the lock goes, not skipped.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from django.db import transaction

from kumiko_workflows import append_event, resume_due_runs, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WakeCheck, WorkflowRunPending
from tests.support import subprocess_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CHILD = textwrap.dedent(
    """
    import sys, time, uuid
    from pathlib import Path
    import django
    django.setup()
    from django.db import transaction
    from kumiko_workflows import append_event

    what, folder, key = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    with transaction.atomic():
        if what == "suspend":
            append_event(uuid.uuid4(), "test-source", "t.signed-up",
                         {"run_key": key, "user_id": "u-race", "timeout": "P7D"})
        else:
            append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u-race"})
        (folder / "written").touch()
        deadline = time.monotonic() + 60
        while not (folder / "commit").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    """
)


def _hold_open(what: str, folder: Path, key: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, what, str(folder), key], env=subprocess_env()
    )


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path.name}"
        time.sleep(0.01)


def _finish(child: subprocess.Popen, folder: Path) -> None:
    (folder / "commit").touch()
    assert child.wait(timeout=60) == 0


def _assert_woken_by(run_id, event) -> None:
    row = WorkflowRunPending.objects.get(run_id=run_id)
    assert row.awaited_event_id == event.id
    report = resume_due_runs()
    assert report.completed == 1
    after = Event.objects.get(type="t.recorded", payload__step="after")
    assert after.payload["steps"]["verified"] == {"user_id": "u-race"}


def test_event_committed_while_the_run_suspends(tmp_path: Path):
    key = uuid.uuid4().hex
    suspending = _hold_open("suspend", tmp_path, key)
    _wait_for(tmp_path / "written")  # suspended, not committed

    verified = append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u-race"})
    _finish(suspending, tmp_path)

    _assert_woken_by(run_id_for("t-event", key), verified)


def test_run_suspending_while_the_event_commits(tmp_path: Path):
    # The run's trigger is appended first (ids are the append order: only an
    # event appended after the trigger can end the wait), then the event's
    # transaction begins; the run's transaction commits while it is open.
    key = uuid.uuid4().hex
    with transaction.atomic():
        append_event(
            uuid.uuid4(),
            "test-source",
            "t.signed-up",
            {"run_key": key, "user_id": "u-race", "timeout": "P7D"},
        )
        appending = _hold_open("append", tmp_path, key)
        _wait_for(tmp_path / "written")  # appended, not committed
    _finish(appending, tmp_path)

    verified = Event.objects.get(type="t.verified")
    _assert_woken_by(run_id_for("t-event", key), verified)


LOCK_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import django
    django.setup()
    from django.db import transaction
    from kumiko_workflows.models import WorkflowRunPending

    run_id, folder = sys.argv[1], Path(sys.argv[2])
    with transaction.atomic():
        # What a worker resuming the run holds: its pending row.
        pending = WorkflowRunPending.objects.select_for_update()
        list(pending.filter(tenant_id="default", run_id=run_id))
        (folder / "written").touch()
        deadline = time.monotonic() + 60
        while not (folder / "commit").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        transaction.set_rollback(True)  # the worker's pass failed: the run still waits
    """
)


def test_a_row_locked_by_someone_else_is_woken_once_the_lock_goes(tmp_path: Path):
    key = uuid.uuid4().hex
    append_event(
        uuid.uuid4(), "test-source", "t.signed-up", {"run_key": key, "user_id": "u-locked"}
    )
    run_id = run_id_for("t-event", key)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_CHILD, str(run_id), str(tmp_path)], env=subprocess_env()
    )
    _wait_for(tmp_path / "written")

    verified = append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u-locked"})
    # The row was locked: nothing woke it, and the decision was kept, not dropped.
    assert WorkflowRunPending.objects.get(run_id=run_id).awaited_event_id is None
    assert WakeCheck.objects.filter(event_id=verified.id).exists()

    _finish(holder, tmp_path)
    row = WorkflowRunPending.objects.get(run_id=run_id)
    assert row.awaited_event_id is None
    assert resume_due_runs().completed == 1  # decides the kept check, then resumes
    assert not WakeCheck.objects.exists()
    woken = Event.objects.get(aggregate_id=run_id, type=et.WAKE_REQUESTED)
    assert woken.payload["awaited_event_id"] == verified.id
