"""Workflows the test suite drives through the public API.

They live in an installed app so that worker subprocesses discover them too.
Arguments come from the trigger payload, so tests choose instants in the past
or the future instead of waiting for time to pass.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kumiko_workflows import Limit, Rate, define_workflow, on_event, steps


def run_key(event):
    return event.payload["run_key"]


class FlakyError(Exception):
    pass


class FatalError(Exception):
    pass


def gate(ctx):
    if ctx.retry_attempt <= ctx.event.payload.get("fail_attempts", 1):
        raise FlakyError("secret-detail: card 4242 declined")
    ctx.append_event(
        ctx.event.aggregate_id,
        ctx.event.aggregate_type,
        "t.gate-passed",
        {"attempt": ctx.retry_attempt},
    )
    return ctx.retry_attempt


def fatal_gate(ctx):
    raise FatalError("do not retry")


def record(name):
    def fn(ctx):
        ctx.append_event(
            ctx.event.aggregate_id,
            ctx.event.aggregate_type,
            "t.recorded",
            {"step": name, "steps": dict(ctx.steps)},
        )
        return {"step": name, "seen": sorted(ctx.steps)}

    fn.__qualname__ = f"record.{name}"
    return fn


def boom(ctx):
    ctx.append_event(ctx.event.aggregate_id, ctx.event.aggregate_type, "t.written-before-boom", {})
    raise RuntimeError("secret-detail: database password is hunter2")


def user_match(ctx):
    return {
        "version": 1,
        "expr": {
            "kind": "atom",
            "path": ["user_id"],
            "op": {"kind": "eq", "value": ctx.event.payload["user_id"]},
        },
    }


def payload_value(key, default=None):
    def fn(ctx):
        return ctx.event.payload.get(key, default)

    fn.__qualname__ = f"payload_value.{key}"
    return fn


def block_until_released(ctx):
    """Signal that the step runs, then hold until the test releases it (a file)."""
    folder = Path(ctx.event.payload["sync_dir"])
    (folder / f"running-{ctx.event.payload['run_key']}").touch()
    release = folder / "release"
    deadline = time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


wait_then_done = define_workflow(
    name="t-wait",
    trigger=on_event("t.wait"),
    idempotency_key=run_key,
    steps=[
        steps.compute("before", record("before")),
        steps.wait(payload_value("for", "PT1H")),
        steps.compute("after", record("after")),
    ],
)

retry_gate = define_workflow(
    name="t-retry",
    trigger=on_event("t.retry"),
    idempotency_key=run_key,
    steps=[
        steps.retry(
            times=3,
            backoff="linear",
            base_delay="PT10S",
            give_up_on=[FatalError],
            do=[steps.compute("gate", gate)],
        ),
        steps.compute("after", record("after")),
    ],
)

give_up = define_workflow(
    name="t-give-up",
    trigger=on_event("t.give-up"),
    idempotency_key=run_key,
    steps=[
        steps.retry(
            times=5,
            backoff="exponential",
            give_up_on=FatalError,
            do=[steps.compute("fatal", fatal_gate)],
        )
    ],
)

await_verification = define_workflow(
    name="t-event",
    trigger=on_event("t.signed-up"),
    idempotency_key=run_key,
    awaits={"verified": "t.verified"},
    steps=[
        steps.wait_for_event("verified", match=user_match, timeout=payload_value("timeout", "P7D")),
        steps.compute("after", record("after")),
    ],
)

await_after_a_wait = define_workflow(
    name="t-event-later",
    trigger=on_event("t.signed-up-later"),
    idempotency_key=run_key,
    awaits={"verified": "t.verified"},
    steps=[
        steps.wait(payload_value("for", "PT0S")),
        steps.wait_for_event("verified", match=user_match, timeout="P7D"),
        steps.compute("after", record("after")),
    ],
)

failing = define_workflow(
    name="t-fail",
    trigger=on_event("t.fail"),
    idempotency_key=run_key,
    steps=[steps.compute("boom", boom)],
)

branching = define_workflow(
    name="t-branch",
    trigger=on_event("t.branch"),
    idempotency_key=run_key,
    steps=[
        steps.compute("first", record("first")),
        steps.branch(
            if_=payload_value("go_then", True),
            then=[
                steps.compute("then_before", record("then_before")),
                steps.wait(payload_value("for", "PT1H")),
                steps.compute("then_after", record("then_after")),
            ],
            else_=[steps.compute("else_only", record("else_only"))],
        ),
        steps.compute("last", record("last")),
    ],
)


def _blocking(name: str, commit: str = "batch", register: bool = True):
    return define_workflow(
        name=name,
        trigger=on_event(name.replace("-", ".", 1)),
        idempotency_key=run_key,
        steps=[
            steps.wait(payload_value("for", "PT0S")),
            steps.compute("held", block_until_released),
        ],
        commit=commit,
        register=register,
    )


blocking = _blocking("t-blocking")
#: The same slow step in a workflow that commits alone (registered by the test using it).
blocking_alone = _blocking("t-blocking-alone", "per_run", register=False)


# --- tests/multiprocess/test_faults.py, test_load.py, test_bad_input.py, test_security.py ---


def write_then_block(ctx):
    """A database side effect, then hold: a worker killed here must roll it back."""
    ctx.append_event(
        ctx.event.aggregate_id,
        ctx.event.aggregate_type,
        "t.faults-side-effect",
        {"run_key": ctx.event.payload["run_key"]},
    )
    return block_until_released(ctx)


def done(ctx):
    return "done"


def junk_result(ctx):
    """A result that is not JSON, chosen by the trigger payload."""
    from datetime import datetime

    return {
        "set": {1, 2},
        "nan": float("nan"),
        "naive": datetime(2026, 1, 31, 9, 0),
        "bytes": b"raw",
        "object": object(),
        "huge int": 10**5000,
    }[ctx.event.payload["junk"]]


faults_side_effect = define_workflow(
    name="t-faults-side-effect",
    trigger=on_event("t.faults-side-effect-start"),
    idempotency_key=run_key,
    steps=[
        steps.wait(payload_value("for", "PT0S")),
        steps.compute("held", write_then_block),
    ],
)

faults_load = define_workflow(
    name="t-faults-load",
    trigger=on_event("t.faults-load"),
    idempotency_key=run_key,
    steps=[steps.wait(payload_value("for", "PT1H")), steps.compute("done", done)],
)

faults_args = define_workflow(
    name="t-faults-args",
    trigger=on_event("t.faults-args"),
    idempotency_key=run_key,
    awaits={"thing": "t.faults-thing"},
    steps=[
        steps.wait(payload_value("for", "PT0S")),
        steps.wait_for_event(
            "thing", match=payload_value("match"), timeout=payload_value("timeout")
        ),
        steps.compute("after", record("after")),
    ],
)

faults_result = define_workflow(
    name="t-faults-result",
    trigger=on_event("t.faults-result"),
    idempotency_key=run_key,
    steps=[steps.compute("junk", junk_result), steps.compute("after", record("after"))],
)


def big_result(ctx):
    return "x" * ctx.event.payload["size"]


faults_big_result = define_workflow(
    name="t-faults-big-result",
    trigger=on_event("t.faults-big-result"),
    idempotency_key=run_key,
    steps=[
        steps.wait(payload_value("for", "PT0S")),
        steps.compute("big", big_result),
        steps.wait("PT1H"),
        steps.compute("after", record("after")),
    ],
)

#: Completes at once: its final results go into ``workflow.run-completed``, if they fit.
fine_result = define_workflow(
    name="t-fine-result",
    trigger=on_event("t.fine-result"),
    idempotency_key=run_key,
    steps=[steps.compute("big", big_result)],
)


def append_as_told(ctx):
    """Append a domain event with one bad argument, chosen by the trigger payload.

    The bad values cannot travel in the payload itself (a NUL would be refused
    there), so the payload names them.
    """
    arguments = {
        "aggregate_type": ctx.event.aggregate_type,
        "type": "t.appended",
        "payload": {},
    }
    bad = ctx.event.payload["bad"]
    if bad == "long created_by":
        arguments["created_by"] = "c" * 300
    elif bad == "NUL type":
        arguments["type"] = "t.app\x00ended"
    elif bad == "newline aggregate_type":
        arguments["aggregate_type"] = "te\nst"
    elif bad == "huge payload":
        arguments["payload"] = {"n": 10**5000}
    ctx.append_event(ctx.event.aggregate_id, **arguments)
    return bad


step_appends = define_workflow(
    name="t-step-appends",
    trigger=on_event("t.step-appends"),
    idempotency_key=run_key,
    steps=[steps.compute("append", append_as_told)],
)


def huge_number(ctx):
    """A result with more digits than Python turns into text (so json.dumps refuses it)."""
    return {"n": 10**5000}


#: The huge result at start (``wait_first`` false) or after a resume (true);
#: either way the run suspends after it, so the result must be stored.
faults_huge_result = define_workflow(
    name="t-faults-huge-result",
    trigger=on_event("t.faults-huge-result"),
    idempotency_key=run_key,
    steps=[
        steps.branch(if_=payload_value("wait_first", False), then=[steps.wait("PT0S")], else_=[]),
        steps.compute("huge", huge_number),
        steps.wait("PT1H"),
    ],
)

faults_huge_retry = define_workflow(
    name="t-faults-huge-retry",
    trigger=on_event("t.faults-huge-retry"),
    idempotency_key=run_key,
    steps=[
        steps.retry(
            times=2, backoff="linear", base_delay="PT10S", do=[steps.compute("huge", huge_number)]
        ),
        steps.wait("PT1H"),
    ],
)


def note_process(ctx):
    """Record which process ran the step (a worker, for a queued start)."""
    ctx.append_event(ctx.event.aggregate_id, "test-source", "t.ran-in", {"pid": os.getpid()})
    return os.getpid()


started_in_worker = define_workflow(
    name="t-start-in-worker",
    trigger=on_event("t.start-in-worker"),
    idempotency_key=run_key,
    start="worker",
    steps=[steps.compute("process", note_process)],
)


# A deploy in progress (tests/integration/test_deploys.py): a process started with
# KUMIKO_TEST_DEPLOY=old runs the code from before a step was appended.
DEPLOYED_CODE = os.environ.get("KUMIKO_TEST_DEPLOY", "new")

deploying = define_workflow(
    name="t-deploying",
    trigger=on_event("t.deploying"),
    idempotency_key=run_key,
    steps=[
        steps.compute("first", record("first")),
        steps.wait(payload_value("until", "PT1H")),
        steps.compute("second", record("second")),
        *([steps.compute("appended", record("appended"))] if DEPLOYED_CODE == "new" else []),
    ],
)


# --- tests/integration/test_limits.py: concurrency and rate limits ------------------------


def limit_key(event):
    return event.payload["key"]


def hold_a_little(ctx):
    """Run for the payload's ``hold`` seconds: segments of one key overlap unless limited.

    With ``block_dir``, the first segment writes its process id to a file
    there and holds until the test creates ``release`` (to be killed mid-run).
    """
    folder = ctx.event.payload.get("block_dir")
    if folder and "first" not in ctx.steps:
        (Path(folder) / f"running-{os.getpid()}").write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not (Path(folder) / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(float(ctx.event.payload.get("hold", 0)))
    return ctx.retry_attempt


def _limited(holds: str):
    return define_workflow(
        name=f"t-limit-{holds}",
        trigger=on_event(f"t.limit-{holds}"),
        idempotency_key=run_key,
        concurrency=Limit(max=2, key=limit_key, holds=holds),
        steps=[
            steps.compute("first", hold_a_little),
            steps.wait(payload_value("for", "PT0S")),
            steps.compute("second", hold_a_little),
        ],
    )


limit_active = _limited("active")
limit_executing = _limited("executing")

rate_limited = define_workflow(
    name="t-rate",
    trigger=on_event("t.rate"),
    idempotency_key=run_key,
    rate=Rate(max=3, per=1, key=limit_key),
    steps=[
        steps.compute("first", hold_a_little),
        steps.wait(payload_value("for", "PT0S")),
        steps.compute("second", hold_a_little),
    ],
)


#: The Citus workload (tests/multiprocess/test_citus.py): a retry that fails once, a wait,
#: then an awaited event of the run's user, each in the run's own tenant.
citus_workload = define_workflow(
    name="t-citus",
    trigger=on_event("t.citus-start"),
    idempotency_key=run_key,
    awaits={"verified": "t.citus-verified"},
    steps=[
        steps.retry(
            times=3, backoff="linear", base_delay="PT0.2S", do=[steps.compute("gate", gate)]
        ),
        steps.wait(payload_value("for", "PT0S")),
        steps.wait_for_event("verified", match=user_match, timeout="P1D"),
        steps.compute("after", record("after")),
    ],
)

# Child runs, fan-out and compensation (tests/integration/test_composition.py).
from tests.testapp import compose_workflows  # noqa: E402, F401
