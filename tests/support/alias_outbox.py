"""The outbox on the site's database, driven as a site would.

Run by ``tests/multiprocess/test_outbox.py``.

Runs in subprocesses on ``tests.settings_outbox``: the engine on
``workflows``, the site's tables and its outbox on ``default``. The trigger
is ``t.wait`` (workflow ``t-wait``), as in ``tests/support/alias_atomic.py``, whose
helpers this uses.

``python -m tests.support.alias_outbox cases``          one JSON line: what each case left.
``python -m tests.support.alias_outbox die-after-commit KEY``  commits a site write and its
    trigger and is SIGKILLed by its own first after-commit callback, before the relay.
``python -m tests.support.alias_outbox die-in-relay KEY``  the same, killed instead right after
    the relay's commit on the engine's database, before the outbox row is deleted.
``python -m tests.support.alias_outbox leave STREAMS ROWS``  leaves STREAMS x ROWS plain
    appends in the outbox (killed after the commit) and prints their stream ids.
``python -m tests.support.alias_outbox race GO BATCH``  connects, prints ``ready``, waits for the
    file GO, then relays BATCH rows a round; prints how many it relayed.
``python -m tests.support.alias_outbox read KEY``       one JSON line: what KEY's case left.
``python -m tests.support.alias_outbox streams ID...``  one JSON line: each stream's ``seq`` values
    in version order.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from typing import Any

import django

django.setup()

from django.contrib.auth.models import Group  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.db.models.signals import post_save  # noqa: E402

from kumiko_workflows import (  # noqa: E402
    CrossDatabaseTransaction,
    InvalidEvent,
    OutboxNotMigrated,
    StreamIdentityError,
    append_event,
    cancel_run,
    resume_due_runs,
    run_id_for,
)
from kumiko_workflows.models import Event, OutboxEntry, RelayedAppend  # noqa: E402
from kumiko_workflows.store import outbox  # noqa: E402
from tests.support import alias_atomic  # noqa: E402 (listens to run_started and run_suspended)

ENGINE = alias_atomic.ENGINE
Rollback = alias_atomic.Rollback
_stream = alias_atomic._stream
trigger = alias_atomic.trigger


def left(key: str) -> dict[str, Any]:
    """What a case left: as ``alias_atomic.left``, and its rows in the outbox and the records."""
    return {
        **alias_atomic.left(key),
        "outbox": OutboxEntry.objects.using("default").filter(aggregate_id=_stream(key)).count(),
        "records": RelayedAppend.objects.count(),
    }


def case(key: str, body: Any) -> dict[str, Any]:
    outcome: dict[str, Any] = {"key": key}
    try:
        outcome.update(body(key) or {})
    except Rollback:
        outcome["rolled_back"] = True
    except (CrossDatabaseTransaction, InvalidEvent) as exc:
        outcome["refused"] = f"{type(exc).__name__}: {exc}"
    return {**outcome, **left(key)}


def site_only(key: str, *, fail: bool) -> dict[str, Any]:
    with transaction.atomic():
        Group.objects.create(name=key)
        returned = append_event(_stream(key), "t", "t.wait", {"run_key": key, "for": "PT1H"})
        inside = {
            "returned": [returned.pk, returned.version, returned.relay_id is not None],
            "outbox_inside": OutboxEntry.objects.filter(aggregate_id=_stream(key)).count(),
            "heard_inside": alias_atomic.heard_for(key),
            "events_inside": Event.objects.filter(aggregate_id=_stream(key)).count(),
        }
        if fail:
            raise Rollback
    return inside


def both(key: str, *, fail: bool, engine_outermost: bool) -> dict[str, Any]:
    outer, inner = (ENGINE, "default") if engine_outermost else ("default", ENGINE)
    with transaction.atomic(using=outer):
        with transaction.atomic(using=inner):
            Group.objects.create(name=key)
            trigger(key)
            inside = alias_atomic.heard_for(key)
        after_inner = Event.objects.filter(aggregate_id=_stream(key)).count()
        if fail:
            raise Rollback
    return {"heard_inside": inside, "events_after_inner": after_inner}


def expected_version(key: str) -> dict[str, Any]:
    # Refused, and the caller's transaction goes on: its write commits.
    seen: dict[str, Any] = {}
    with transaction.atomic():
        try:
            append_event(_stream(key), "t", "t.note", {}, expected_version=0)
        except CrossDatabaseTransaction as exc:
            seen["expected_version"] = str(exc)
        Group.objects.create(name=key)
    return seen


def bad_input(key: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with transaction.atomic():
        try:
            append_event(_stream(key), "t", "t.wait", {"at": object()})
        except InvalidEvent as exc:
            seen["payload"] = str(exc)
        try:
            append_event(_stream(key), "t", "t.wait", {}, tenant_id="a\x00b")
        except InvalidEvent as exc:
            seen["tenant"] = str(exc)
        Group.objects.create(name=key)
    # A stream of another aggregate type, on the engine's database: refused at the call.
    append_event(_stream(f"{key}-typed"), "other", "o.first", {})
    with transaction.atomic():
        try:
            append_event(_stream(f"{key}-typed"), "t", "t.wait", {"run_key": key})
        except StreamIdentityError as exc:
            seen["identity"] = str(exc)
    return seen


def in_order(key: str) -> dict[str, Any]:
    # Several appends to one stream in one transaction reach it in their order.
    with transaction.atomic():
        for seq in range(5):
            append_event(_stream(key), "t", "t.note", {"seq": seq})
    return {"seqs": seqs(_stream(key))}


def direct(key: str) -> dict[str, Any]:
    # No transaction, or one on the engine's alias only: appended at once, as before.
    with transaction.atomic(using=ENGINE):
        inside = append_event(_stream(key), "t", "t.note", {"seq": 0})
    auto = append_event(_stream(key), "t", "t.note", {"seq": 1})
    return {"direct": [inside.version, auto.version, inside.relay_id, auto.relay_id]}


def refusals(key: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with transaction.atomic():
        try:
            resume_due_runs()
        except CrossDatabaseTransaction as exc:
            seen["resume_due_runs"] = str(exc)
        try:
            cancel_run(run_id_for("t-wait", key), "no")
        except CrossDatabaseTransaction as exc:
            seen["cancel_run"] = str(exc)
    # Inside transactions on both (a test case's), the pass goes on, held by both.
    with transaction.atomic(using=ENGINE), transaction.atomic():
        seen["pass_in_both"] = str(resume_due_runs())
    return seen


def cases() -> dict[str, Any]:
    token = uuid.uuid4().hex[:8]
    bodies = {
        "site_rollback": lambda key: site_only(key, fail=True),
        "site_commit": lambda key: site_only(key, fail=False),
        "both_rollback": lambda key: both(key, fail=True, engine_outermost=True),
        "both_commit": lambda key: both(key, fail=False, engine_outermost=True),
        "both_site_outer_rollback": lambda key: both(key, fail=True, engine_outermost=False),
        "both_site_outer_commit": lambda key: both(key, fail=False, engine_outermost=False),
        "expected_version": expected_version,
        "bad_input": bad_input,
        "in_order": in_order,
        "direct": direct,
        "refusals": refusals,
    }
    return {name: case(f"{name}-{token}", body) for name, body in bodies.items()}


def seqs(stream: uuid.UUID) -> list[Any]:
    events = Event.objects.filter(aggregate_id=stream).order_by("version")
    return [event.payload.get("seq") for event in events]


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def die_after_commit(key: str) -> None:
    with transaction.atomic():
        # Registered first: it runs first after the commit, before the relay's callback.
        transaction.on_commit(_die)
        Group.objects.create(name=key)
        trigger(key)
    raise AssertionError("not killed")


def die_in_relay(key: str) -> None:
    def kill_after_the_engines_commit(sender: Any, instance: Event, **kwargs: Any) -> None:
        if outbox.relaying() and instance.aggregate_id == _stream(key):
            transaction.on_commit(_die, using=ENGINE)

    post_save.connect(kill_after_the_engines_commit, sender=Event, weak=False)
    with transaction.atomic():
        Group.objects.create(name=key)
        trigger(key)
    raise AssertionError("not killed")


def leave(streams: int, rows: int) -> None:
    ids = [uuid.uuid4() for _ in range(streams)]
    print(json.dumps([str(each) for each in ids]), flush=True)
    with transaction.atomic():
        transaction.on_commit(_die)
        for seq in range(rows):
            for stream in ids:
                append_event(stream, "t", "t.note", {"seq": seq})
    raise AssertionError("not killed")


def leave_one_too_big() -> None:
    """Leave two rows of a stream (the first over 1,000 bytes) and one of another; print the ids."""
    big, other = uuid.uuid4(), uuid.uuid4()
    print(json.dumps([str(big), str(other)]), flush=True)
    with transaction.atomic():
        transaction.on_commit(_die)
        append_event(big, "t", "t.note", {"seq": 0, "pad": "x" * 2000})
        append_event(big, "t", "t.note", {"seq": 1})
        append_event(other, "t", "t.note", {"seq": 0})
    raise AssertionError("not killed")


def admin_outbox() -> dict[str, Any]:
    """What the admin's run list says of the outbox (a superuser's view)."""
    from django.contrib.auth.models import User
    from django.test import Client

    name = f"admin-{uuid.uuid4().hex[:8]}"
    User.objects.create_superuser(name, "a@example.com", "pw")
    client = Client()
    client.login(username=name, password="pw")
    response = client.get("/admin/kumiko_workflows/workflowrun/")
    page = response.content.decode()
    shown = page.split('id="kw-outbox"', 1)[1].split("</div>", 1)[0] if "kw-outbox" in page else ""
    return {"status": response.status_code, "outbox": shown}


def requeue() -> None:
    """What the docs tell an operator to do once the cause is fixed: try held rows again."""
    OutboxEntry.objects.using("default").filter(attempts__gt=0).update(attempts=0)


def race(go: str, batch: int) -> None:
    # Smaller rounds than the default, so that racers meet again and again.
    outbox.RELAY_BATCH = batch
    connections["default"].ensure_connection()
    connections[ENGINE].ensure_connection()
    # Ready: the test touches GO once every racer is, so none starts alone.
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    report = outbox.relay_leftovers(append_event)
    print(json.dumps({"relayed": report.relayed, "repeated": report.repeated}), flush=True)


def without_table(key: str) -> dict[str, Any]:
    """Drop the site's outbox table; an append in a site transaction is then refused clearly."""
    with connections["default"].schema_editor() as editor:
        editor.delete_model(OutboxEntry)
    seen: dict[str, Any] = {}
    with transaction.atomic():
        try:
            trigger(key)
        except OutboxNotMigrated as exc:
            seen["refused"] = str(exc)
        Group.objects.create(name=key)  # the transaction is still usable
    seen["group"] = Group.objects.filter(name=key).exists()
    return seen


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "cases":
        print(json.dumps(cases()), flush=True)
    elif mode == "die-after-commit":
        die_after_commit(args[0])
    elif mode == "die-in-relay":
        die_in_relay(args[0])
    elif mode == "leave":
        leave(int(args[0]), int(args[1]))
    elif mode == "leave-one-too-big":
        leave_one_too_big()
    elif mode == "admin-outbox":
        print(json.dumps(admin_outbox()), flush=True)
    elif mode == "requeue":
        requeue()
    elif mode == "race":
        race(args[0], int(args[1]))
    elif mode == "without-table":
        print(json.dumps(without_table(args[0])), flush=True)
    elif mode == "read":
        print(json.dumps(left(args[0])), flush=True)
    elif mode == "streams":
        print(json.dumps({each: seqs(uuid.UUID(each)) for each in args}), flush=True)
