"""The engine on a second alias, driven as a site would (run by test_database_alias.py).

Prints one JSON line of what it saw; the test asserts on it.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import uuid

import django

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from kumiko_workflows import append_event, resume_due_runs, run_id_for  # noqa: E402
from kumiko_workflows.models import Event, PurgedRun, WorkflowRun, WorkflowRunPending  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tables(alias: str) -> list[str]:
    with connections[alias].cursor() as cursor:
        return sorted(connections[alias].introspection.table_names(cursor))


def status(run_id: uuid.UUID) -> str:
    return WorkflowRun.objects.get(run_id=run_id).status


seen: dict[str, object] = {}
# The outbox table goes on every migrated alias (it is used where OUTBOX_DATABASES lists it).
OUTBOX = "kumiko_workflows_outbox"
site_tables = tables("default")
seen["default_has_engine_tables"] = any(
    t.startswith("kumiko_workflows") and t != OUTBOX for t in site_tables
)
seen["default_has_outbox"] = OUTBOX in site_tables
seen["workflows_has_engine_tables"] = "kumiko_workflows_event" in tables("workflows")

# A trigger starts a run that waits; the worker resumes it.
past = (timezone.now() - timezone.timedelta(seconds=1)).isoformat()
wait_key = uuid.uuid4().hex
append_event(uuid.uuid4(), "t", "t.wait", {"run_key": wait_key, "for": past})
waiting = run_id_for("t-wait", wait_key)
seen["wait_started"] = status(waiting)
seen["pending_rows"] = WorkflowRunPending.objects.count()
seen["pass"] = str(resume_due_runs())
seen["wait_after_pass"] = status(waiting)

# A loop worker LISTENs; an awaited event wakes a run through NOTIFY.
signup_key = uuid.uuid4().hex
append_event(uuid.uuid4(), "t", "t.signed-up", {"run_key": signup_key, "user_id": "u-alias"})
awaiting = run_id_for("t-event", signup_key)
seen["event_started"] = status(awaiting)
worker = subprocess.Popen(
    [
        sys.executable,
        os.path.join(REPO, "manage.py"),
        "resume_due_runs",
        "--loop",
        "--no-cron",
        "--interval",
        "300",
        "-v",
        "2",
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
)
try:
    deadline = time.monotonic() + 60
    line = ""
    while "listen=on" not in line and time.monotonic() < deadline:
        line = worker.stdout.readline() if worker.stdout else ""
    appended = time.monotonic()
    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u-alias"})
    while status(awaiting) != "completed" and time.monotonic() - appended < 60:
        time.sleep(0.05)
    seen["event_after_notify"] = status(awaiting)
    seen["notify_seconds"] = round(time.monotonic() - appended, 2)
finally:
    worker.terminate()
    worker.wait(30)

# The admin lists and shows runs that live on the other database.
User.objects.create_superuser("alias-admin", "a@example.com", "pw")
client = Client()
client.login(username="alias-admin", password="pw")
pages = {
    "runs": "/admin/kumiko_workflows/workflowrun/",
    "run": f"/admin/kumiko_workflows/workflowrun/{awaiting}/change/",
    "events": "/admin/kumiko_workflows/event/",
    "pending": "/admin/kumiko_workflows/workflowrunpending/",
}
seen["admin"] = {name: client.get(url).status_code for name, url in pages.items()}
seen["run_page_names_run"] = str(awaiting) in client.get(pages["run"]).content.decode()

# Retention: the purge removes the two finished runs from that database too.
purged = io.StringIO()
call_command(
    "purge_workflow_runs", "--finished-before", "PT0S", stdout=purged, stderr=io.StringIO()
)
seen["purged"] = purged.getvalue().split(" events=")[0]
seen["run_events_left"] = Event.objects.filter(aggregate_type="workflow-run").count()
seen["tombstones"] = PurgedRun.objects.count()
print(json.dumps(seen), flush=True)
