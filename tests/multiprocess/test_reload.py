"""``resume_due_runs --loop --reload`` as a real process: edit a workflows module, it restarts.

The workflows module lives in a temporary app (a folder put on PYTHONPATH,
with settings that install it), so the test can edit it. Its one step
writes a line per execution to a log, and can hold until the test releases
it: the edit lands while a run is in the middle of its step, which must
finish on the old code and commit before the worker restarts; the next run
is then resumed by the new code. Each run executes once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from kumiko_workflows import event_types as et
from kumiko_workflows import run_id_for
from tests.support import REPO, subprocess_env, types_of
from tests.support.faults import DEADLINE, Worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

WORKFLOWS = """
import os
import time
from pathlib import Path

from kumiko_workflows import define_workflow, on_event, steps

CODE = "{code}"
PROBE = Path(os.environ["KUMIKO_PROBE_DIR"])


def run_key(event):
    return event.payload["run_key"]


def work(ctx):
    key = ctx.event.payload["run_key"]
    with (PROBE / "ran.log").open("a") as log:
        log.write(f"{{key}} {{CODE}} {{os.getpid()}}\\n")
    if ctx.event.payload.get("hold"):
        (PROBE / "holding").touch()
        deadline = time.monotonic() + 120
        while not (PROBE / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # waits for the test process, not for time
    return CODE


probe = define_workflow(
    name="t-reload-probe",
    trigger=on_event("t.reload-probe"),
    idempotency_key=run_key,
    start="worker",
    steps=[steps.compute("work", work)],
)
"""

APPEND = """
import django, sys, uuid
django.setup()
from kumiko_workflows import append_event
append_event(uuid.uuid4(), "test-source", "t.reload-probe",
             {"run_key": sys.argv[1], "hold": sys.argv[2] == "hold"})
"""


@pytest.fixture
def probe_app(tmp_path: Path) -> Path:
    """A temporary app ``reloadprobe`` with a workflows module at ``v1``, and settings for it."""
    app = tmp_path / "reloadprobe"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "workflows.py").write_text(WORKFLOWS.format(code="v1"))
    (tmp_path / "reload_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n\n"
        'INSTALLED_APPS = [*INSTALLED_APPS, "reloadprobe"]  # noqa: F405\n'
    )
    (tmp_path / "probe").mkdir()
    return tmp_path


def probe_env(folder: Path) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "reload_settings",
        "PYTHONPATH": os.pathsep.join([str(folder), str(REPO)]),
        "KUMIKO_PROBE_DIR": str(folder / "probe"),
    }


def start_probe_run(folder: Path, hold: bool) -> tuple[uuid.UUID, str]:
    """Append the trigger in a process that has the probe workflow; return the run's id, key."""
    key = uuid.uuid4().hex
    result = subprocess.run(
        [sys.executable, "-c", APPEND, key, "hold" if hold else "go"],
        cwd=REPO,
        env=subprocess_env(**probe_env(folder)),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert result.returncode == 0, result.stderr
    return run_id_for("t-reload-probe", key), key


def executions(folder: Path) -> list[list[str]]:
    log = folder / "probe" / "ran.log"
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def completed(run_id: uuid.UUID) -> bool:
    return et.RUN_COMPLETED in types_of(run_id)


def test_a_reloading_worker_finishes_its_run_then_resumes_with_the_new_code(probe_app: Path):
    probe = probe_app / "probe"
    worker = Worker(
        probe_app, "--loop", "--reload", "--no-cron", "--interval", "0.5", **probe_env(probe_app)
    )
    try:
        wait_for(lambda: "worker started" in worker.out(), "the worker to start")
        held, held_key = start_probe_run(probe_app, hold=True)
        wait_for((probe / "holding").exists, "the held run's step to start")

        module = probe_app / "reloadprobe" / "workflows.py"
        module.write_text(WORKFLOWS.format(code="v2"))
        bump = time.time()

        def noticed() -> bool:
            # The reloader compares modification times: step them on until it sees one.
            nonlocal bump
            bump += 1
            os.utime(module, (bump, bump))
            return "changed: finishing the current run" in worker.log()

        wait_for(noticed, "the worker to notice the edit", every=0.2)
        assert "restarting" not in worker.out()  # the held run is not finished yet
        assert not completed(held)
        (probe / "release").touch()

        wait_for(lambda: worker.out().count("worker started") == 2, "the worker to restart")
        assert completed(held)  # committed by the old code, before the restart
        fresh, fresh_key = start_probe_run(probe_app, hold=False)
        wait_for(lambda: completed(fresh), "the new code to resume the next run")
    finally:
        worker.signal(signal.SIGTERM)  # to the parent, which passes it on
        code = worker.wait()

    assert code == 0, worker.log()
    assert "SIGTERM received: finishing the current run" in worker.log()  # passed on to the child
    runs = executions(probe_app)
    assert [key for key, _, _ in runs] == [held_key, fresh_key]  # each step ran once
    (held_code, held_pid), (fresh_code, fresh_pid) = [(c, pid) for _, c, pid in runs]
    assert (held_code, fresh_code) == ("v1", "v2")
    assert held_pid != fresh_pid  # a new process, with the new code
    for run_id in (held, fresh):  # and each run completed once
        assert types_of(run_id).count(et.RUN_COMPLETED) == 1
    out = worker.out()
    assert f"resume_due_runs: restarting: {module} changed" in out
    assert out.count("worker started") == 2


def test_reload_without_loop_is_refused():
    with pytest.raises(CommandError, match="--reload restarts a --loop worker when files change"):
        call_command("resume_due_runs", "--reload")
