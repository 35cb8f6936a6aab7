"""What is atomic with what when the engine's tables are on a database of their own.

Run by ``tests/multiprocess/test_database_alias.py`` in subprocesses on
``tests.settings_alias``: the engine on ``workflows``, the site's tables
(here ``auth.Group``, the domain write) on ``default``. The trigger is
``t.wait`` (workflow ``t-wait``): its run starts inline, its first step
appends a side event, then it waits; ``run_started`` and ``run_suspended``
are listened to.

``python -m tests.support.alias_atomic cases``  prints one JSON line: what each case left.
``python -m tests.support.alias_atomic crash KEY``  appends in transactions on both
    aliases (the engine's outermost) and dies the instant they commit.
``python -m tests.support.alias_atomic read KEY``  prints one JSON line: what KEY's case left.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

import django

django.setup()

from django.contrib.auth.models import Group  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from kumiko_workflows import (  # noqa: E402
    CrossDatabaseTransaction,
    append_event,
    cancel_run,
    fire_schedule_now,
    rerun_run,
    run_id_for,
    signals,
    wake_run,
)
from kumiko_workflows.models import Event, WorkflowRun  # noqa: E402

ENGINE = "workflows"
heard: list[tuple[str, str]] = []


def _listen(name: str) -> None:
    def receiver(sender: Any, run_id: uuid.UUID, **kwargs: Any) -> None:
        heard.append((name, str(run_id)))

    getattr(signals, name).connect(receiver, weak=False)


_listen("run_started")
_listen("run_suspended")


class Rollback(Exception):
    pass


def _stream(key: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"alias-atomic:{key}")


def trigger(key: str) -> None:
    append_event(_stream(key), "t", "t.wait", {"run_key": key, "for": "PT1H"})


def heard_for(key: str) -> list[str]:
    run = str(run_id_for("t-wait", key))
    return [name for name, run_id in heard if run_id == run]


def left(key: str) -> dict[str, Any]:
    """What a case left behind: its domain write, its events, its run, the signals heard."""
    run = WorkflowRun.objects.filter(run_id=run_id_for("t-wait", key)).first()
    return {
        "group": Group.objects.filter(name=key).exists(),
        # The trigger and the first step's side event.
        "events": sorted(
            Event.objects.filter(aggregate_id=_stream(key)).values_list("type", flat=True)
        ),
        "run": run.status if run else None,
        "signals": heard_for(key),
    }


def case(key: str, body: Callable[[], Any]) -> dict[str, Any]:
    outcome: dict[str, Any] = {}
    try:
        outcome.update(body() or {})
    except Rollback:
        outcome["rolled_back"] = True
    except CrossDatabaseTransaction as exc:
        outcome["refused"] = str(exc)
    return {**outcome, **left(key)}


def refused_in_the_site_transaction(key: str) -> dict[str, Any]:
    # The case: a domain write and its trigger in the site's block
    # (none open on the engine's alias), which then rolls back.
    seen: dict[str, Any] = {}
    try:
        with CaptureQueriesContext(connections[ENGINE]) as engine_queries:
            with transaction.atomic():
                Group.objects.create(name=key)
                try:
                    trigger(key)
                finally:  # counted at the error, before the block unwinds
                    seen["engine_statements"] = len(engine_queries.captured_queries)
                raise Rollback
    except CrossDatabaseTransaction as exc:
        seen["refused"] = str(exc)
    return seen


def refused_and_caught(key: str) -> dict[str, Any]:
    # The refusal leaves the caller's transaction usable.
    caught = None
    with transaction.atomic():
        try:
            trigger(key)
        except CrossDatabaseTransaction as exc:
            caught = type(exc).__name__
        Group.objects.create(name=key)
    return {"caught": caught, "engine_in_transaction": connections[ENGINE].in_atomic_block}


def both(key: str, *, fail: bool) -> dict[str, Any]:
    with transaction.atomic(using=ENGINE):
        with transaction.atomic():
            Group.objects.create(name=key)
            trigger(key)
            inside = heard_for(key)
            if fail:
                raise Rollback
    return {"heard_inside": inside}


def engine_only(key: str, *, fail: bool) -> dict[str, Any]:
    with transaction.atomic(using=ENGINE):
        trigger(key)
        inside = heard_for(key)
        if fail:
            raise Rollback
    return {"heard_inside": inside}


def autocommit(key: str) -> dict[str, Any]:
    trigger(key)
    return {}


def other_operations(key: str) -> dict[str, Any]:
    engine_only(key, fail=False)
    run = run_id_for("t-wait", key)
    refused = {}
    calls = {
        "cancel_run": lambda: cancel_run(run, "not wanted"),
        "wake_run": lambda: wake_run(run),
        "rerun_run": lambda: rerun_run(run),
        "fire_schedule_now": lambda: fire_schedule_now("t-no-such-cron"),
    }
    for name, call in calls.items():
        with transaction.atomic():
            try:
                call()
            except CrossDatabaseTransaction as exc:
                refused[name] = str(exc)
            except Exception as exc:  # not refused: it went ahead and failed otherwise
                refused[name] = f"not refused: {type(exc).__name__}"
    return {"refused_operations": refused}


def admin_in_a_request_transaction(key: str) -> dict[str, Any]:
    # ATOMIC_REQUESTS on the site's database: the admin's actions still act.
    from django.contrib.auth.models import User
    from django.test import Client

    from kumiko_workflows import event_types

    engine_only(key, fail=False)
    run = run_id_for("t-wait", key)
    User.objects.create_superuser(f"admin-{key}", "a@example.com", "pw")
    client = Client()
    client.login(username=f"admin-{key}", password="pw")
    connections.settings["default"]["ATOMIC_REQUESTS"] = True
    try:
        response = client.post(
            "/admin/kumiko_workflows/workflowrun/",
            {"action": "wake_now", "_selected_action": [str(run)]},
        )
    finally:
        connections.settings["default"]["ATOMIC_REQUESTS"] = False
    woken = Event.objects.filter(aggregate_id=run, type=event_types.WAKE_REQUESTED).exists()
    return {"admin_status": response.status_code, "woken": woken}


def cases() -> dict[str, Any]:
    token = uuid.uuid4().hex[:8]
    return {
        "refused": case(
            f"refused-{token}", lambda: refused_in_the_site_transaction(f"refused-{token}")
        ),
        "refused_caught": case(f"caught-{token}", lambda: refused_and_caught(f"caught-{token}")),
        "both_rollback": case(f"both-rb-{token}", lambda: both(f"both-rb-{token}", fail=True)),
        "both_commit": case(f"both-ok-{token}", lambda: both(f"both-ok-{token}", fail=False)),
        "engine_rollback": case(
            f"eng-rb-{token}", lambda: engine_only(f"eng-rb-{token}", fail=True)
        ),
        "engine_commit": case(
            f"eng-ok-{token}", lambda: engine_only(f"eng-ok-{token}", fail=False)
        ),
        "autocommit": case(f"auto-{token}", lambda: autocommit(f"auto-{token}")),
        "operations": case(f"ops-{token}", lambda: other_operations(f"ops-{token}")),
        "admin": case(f"admin-{token}", lambda: admin_in_a_request_transaction(f"admin-{token}")),
    }


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "cases":
        print(json.dumps(cases()), flush=True)
    elif mode == "crash":
        key = sys.argv[2]
        with transaction.atomic(using=ENGINE):
            with transaction.atomic():
                Group.objects.create(name=key)
                trigger(key)
        os._exit(17)  # dead the instant both committed: no cleanup, no signal sent
    elif mode == "read":
        print(json.dumps(left(sys.argv[2])), flush=True)
