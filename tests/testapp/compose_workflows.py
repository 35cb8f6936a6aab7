"""Workflows of tests/integration/test_composition.py.

Child runs, fan-out, cancel cascade, compensation.

Imported by tests/testapp/workflows.py, so worker subprocesses know them too.
Children read their input from their trigger's payload (``ctx.event.payload``:
the call's input, or ``{"item": ..., "index": ...}`` for a fan-out's child).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kumiko_workflows import define_workflow, match, on_call, on_event, steps


def run_key(event):
    return event.payload["run_key"]


class ChildError(Exception):
    pass


def child_input(ctx):
    payload = ctx.event.payload
    return payload["item"] if "item" in payload else payload


def child_wait(ctx):
    return child_input(ctx).get("wait_until") or "PT0S"


def child_waits(ctx):
    return bool(child_input(ctx).get("wait_until"))


def double(ctx):
    given = child_input(ctx)
    if given.get("fail"):
        raise ChildError("asked to fail")
    return {"doubled": given["n"] * 2}


child_double = define_workflow(
    name="t-child-double",
    trigger=on_call(),
    steps=[
        steps.branch(if_=child_waits, then=[steps.wait(child_wait)]),
        steps.compute("doubled", double),
    ],
)


def call_input(ctx):
    payload = ctx.event.payload
    return {k: payload[k] for k in ("n", "fail", "wait_until") if k in payload}


def after_call(ctx):
    return {"got": ctx.steps["child"]}


parent_call = define_workflow(
    name="t-parent-call",
    trigger=on_event("t.call"),
    idempotency_key=run_key,
    steps=[
        steps.call_workflow("child", workflow=child_double, input=call_input),
        steps.compute("after", after_call),
    ],
)


def collected_input(ctx):
    return {"n": ctx.event.payload["n"], "fail": True}


def child_failed(ctx):
    return not ctx.steps["child"]["ok"]


def handle_failure(ctx):
    return {"handled": ctx.steps["child"]["reason"]}


parent_call_collect = define_workflow(
    name="t-parent-call-collect",
    trigger=on_event("t.call-collect"),
    idempotency_key=run_key,
    steps=[
        steps.call_workflow(
            "child", workflow="t-child-double", input=collected_input, on_child_failure="collect"
        ),
        steps.branch(if_=child_failed, then=[steps.compute("handled", handle_failure)]),
    ],
)


def retry_input(ctx):
    payload = ctx.event.payload
    # The first attempt's child fails; the retry's fresh child succeeds.
    return {"n": payload["n"], "fail": ctx.retry_attempt == 1, "wait_until": payload["wait_until"]}


parent_retry = define_workflow(
    name="t-parent-retry",
    trigger=on_event("t.call-retry"),
    idempotency_key=run_key,
    steps=[
        steps.retry(
            times=3,
            backoff="linear",
            base_delay="PT1S",
            do=[steps.call_workflow("child", workflow=child_double, input=retry_input)],
        )
    ],
)


def fan_items(ctx):
    payload = ctx.event.payload
    return [
        {"n": n, "wait_until": payload.get("wait_until"), "fail": n in payload.get("fail", [])}
        for n in range(payload["count"])
    ]


parent_fan = define_workflow(
    name="t-parent-fan",
    trigger=on_event("t.fan"),
    idempotency_key=run_key,
    steps=[steps.fan_out("lines", workflow=child_double, items=fan_items, max_concurrency=10)],
)

parent_fan_collect = define_workflow(
    name="t-parent-fan-collect",
    trigger=on_event("t.fan-collect"),
    idempotency_key=run_key,
    steps=[
        steps.fan_out("lines", workflow=child_double, items=fan_items, on_child_failure="collect")
    ],
)

# Queued children (start="worker"), all at once: the bench's fan_out in small.
child_queued = define_workflow(
    name="t-child-queued",
    trigger=on_call(),
    start="worker",
    steps=[steps.compute("doubled", double)],
)

parent_fan_queued = define_workflow(
    name="t-parent-fan-queued",
    trigger=on_event("t.fan-queued"),
    idempotency_key=run_key,
    steps=[steps.fan_out("lines", workflow=child_queued, items=fan_items)],
)


# --- the cancel cascade: root -> middle -> leaf, the leaf waits long ------------------


def leaf(ctx):
    return 1


grand_leaf = define_workflow(
    name="t-grand-leaf",
    trigger=on_call(),
    steps=[steps.wait("P30D"), steps.compute("leaf", leaf)],
)
grand_middle = define_workflow(
    name="t-grand-middle",
    trigger=on_call(),
    steps=[
        steps.fan_out("leaves", workflow=grand_leaf, items=[1, 2]),
    ],
)
grand_root = define_workflow(
    name="t-grand-root",
    trigger=on_event("t.grand"),
    idempotency_key=run_key,
    steps=[steps.call_workflow("middle", workflow=grand_middle)],
)
grand_root_abandon = define_workflow(
    name="t-grand-root-abandon",
    trigger=on_event("t.grand-abandon"),
    idempotency_key=run_key,
    steps=[steps.call_workflow("middle", workflow=grand_middle, on_cancel="abandon")],
)


# --- compensation -------------------------------------------------------------------


def _record(ctx, what: str, step: str) -> None:
    ctx.append_event(
        ctx.event.aggregate_id,
        ctx.event.aggregate_type,
        what,
        {"step": step, "run": str(ctx.run_id)},
    )


def _block(ctx, step: str) -> None:
    """Hold the step (a test SIGKILLs the worker meanwhile) when the trigger asks."""
    sync = ctx.event.payload.get("sync_dir")
    if not sync or ctx.event.payload.get("block") != step:
        return
    Path(sync, f"running-{step}").touch()
    deadline = time.monotonic() + 120
    while not Path(sync, "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def do_a(ctx):
    _record(ctx, "t.done", "a")
    return "a"


def do_b(ctx):
    _record(ctx, "t.done", "b")
    return "b"


def do_c(ctx):
    _record(ctx, "t.done", "c")
    return "c"


def undo_a(ctx):
    _record(ctx, "t.undone", "a")


def undo_b(ctx):
    _block(ctx, "undo-b")
    if ctx.event.payload.get("undo_fails") == "b":
        raise ChildError("b cannot be undone")
    _record(ctx, "t.undone", "b")


def undo_c(ctx):
    _record(ctx, "t.undone", "c")


def pay(ctx):
    if ctx.event.payload.get("pay_fails", True):
        raise ChildError("card declined")
    return "paid"


def saga_wait(ctx):
    return ctx.event.payload.get("wait_until") or "PT0S"


saga = define_workflow(
    name="t-saga",
    trigger=on_event("t.saga"),
    idempotency_key=run_key,
    commit="per_run",
    steps=[
        steps.compute("a", do_a, compensate=undo_a),
        steps.wait(saga_wait),
        steps.compute("b", do_b, compensate=undo_b, compensate_times=2),
        steps.compute("c", do_c, compensate=undo_c),
        steps.wait(saga_wait),
        steps.compute("pay", pay),
    ],
)


# --- the two-process race: a blocking projection in the worker that resumes the parent --


def _hold_suspension(event, replaying):
    sync = os.environ.get("KUMIKO_TEST_HOLD_CHILDREN_WAIT")
    if replaying or not sync:
        return
    Path(sync, "parent-suspending").touch()
    deadline = time.monotonic() + 120
    while not Path(sync, "parent-release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


if os.environ.get("KUMIKO_TEST_HOLD_CHILDREN_WAIT"):
    from kumiko_workflows import event_types as et
    from kumiko_workflows.store.dispatch import registry as _projections

    if "tests.hold_children_wait" not in _projections:
        _projections.register(
            "tests.hold_children_wait",
            {et.WAITING_FOR_CHILDREN},
            _hold_suspension,
            order=60,
            replay=False,
        )


# --- repeat: remind until verified, at most 3 times ----------------------------------


def remind(ctx):
    return {"pass": ctx.steps.get("reminders", 0) + 1}


def verified(ctx):
    return ctx.steps["verified"] is not None


def outcome(ctx):
    return {"passes": ctx.steps["reminders"], "verified": verified(ctx)}


reminders = define_workflow(
    name="t-reminders",
    trigger=on_event("t.remind"),
    idempotency_key=run_key,
    awaits={"verified": "t.verified"},
    steps=[
        steps.repeat(
            "reminders",
            do=[
                steps.compute("remind", remind),
                steps.wait_for_event(
                    "verified", match=match.eq("user", match.from_trigger("user")), timeout="P3D"
                ),
            ],
            until=verified,
            max_times=3,
        ),
        steps.compute("outcome", outcome),
    ],
)


parent_timeout = define_workflow(
    name="t-parent-timeout",
    trigger=on_event("t.call-timeout"),
    idempotency_key=run_key,
    steps=[steps.call_workflow("child", workflow=grand_leaf, timeout="PT1H")],
)
