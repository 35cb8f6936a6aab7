"""Keyed wake-ups: a waiting run is found by what its match requires.

The pure part (which keys a match requires, which a payload offers) is
tested without a database; the rest through ``append_event`` on real rows.
"""

from __future__ import annotations

import enum
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from kumiko_workflows import append_event, resume_due_runs, run_id_for
from kumiko_workflows import event_types as et
from kumiko_workflows.engine.wakeups import wake_for_event
from kumiko_workflows.models import Event, WakeCheck, WorkflowRunPending, WorkflowWaitKey
from kumiko_workflows.operations.rebuild import check
from kumiko_workflows.workflow.matching import (
    canonical_value,
    offered_keys,
    required_keys,
    validate,
)
from tests.support import trigger, types_of


def atom(path, op, **value):
    return {"kind": "atom", "path": path, "op": {"kind": op, **value}}


def expr(node):
    return validate({"version": 1, "expr": node})


# --- which keys a match requires ------------------------------------------------


def test_an_equality_is_one_key():
    assert required_keys(expr(atom(["user_id"], "eq", value=42))) == {('["user_id"]', "42")}


def test_in_is_one_key_per_value_and_an_empty_in_needs_a_key_no_payload_has():
    keys = required_keys(expr(atom(["a", 0], "in", values=["x", 2.0, None, True])))
    assert keys == {('["a",0]', '"x"'), ('["a",0]', "2"), ('["a",0]', "null"), ('["a",0]', "true")}
    assert required_keys(expr(atom(["a"], "in", values=[]))) == frozenset()


def test_and_takes_the_narrowest_conjunct_and_or_the_union_of_its_branches():
    both = expr(
        {
            "kind": "and",
            "nodes": [
                atom(["kind"], "in", values=["a", "b"]),
                atom(["id"], "eq", value="7"),
                atom(["amount"], "gt", value=10),
            ],
        }
    )
    assert required_keys(both) == {('["id"]', '"7"')}
    either = expr(
        {"kind": "or", "nodes": [atom(["id"], "eq", value=1), atom(["ref"], "eq", value=2)]}
    )
    assert required_keys(either) == {('["id"]', "1"), ('["ref"]', "2")}


@pytest.mark.parametrize(
    "node",
    [
        atom(["amount"], "gt", value=10),
        atom(["id"], "ne", value=1),
        {"kind": "or", "nodes": [atom(["id"], "eq", value=1), atom(["n"], "lt", value=2)]},
        atom(["id"], "eq", value="x" * 300),  # too long to index
    ],
)
def test_matches_that_require_no_indexable_equality_are_scanned(node):
    assert required_keys(expr(node)) is None
    assert required_keys(None) is None


def test_equal_values_share_a_key_and_unequal_ones_do_not():
    assert canonical_value(1) == canonical_value(1.0) == canonical_value(-0.0 + 1)
    assert canonical_value(True) != canonical_value(1)
    assert canonical_value("1") != canonical_value(1)
    assert canonical_value(0.5) != canonical_value(0)
    assert canonical_value([1]) is None


def test_a_payload_offers_the_values_on_the_paths_in_use():
    payload = {"user_id": 42.0, "items": [{"sku": "x"}], "flag": True, "gone": None}
    paths = ['["user_id"]', '["items",0,"sku"]', '["items",-1,"sku"]', '["missing"]', '["gone"]']
    assert offered_keys(payload, paths) == {
        ('["user_id"]', "42"),
        ('["items",0,"sku"]', '"x"'),
        ('["items",-1,"sku"]', '"x"'),
        ('["gone"]', "null"),
    }


# --- waits stored under their keys, and found by them -------------------------------


def _wait(user_id: str, tenant_id: str = "default") -> uuid.UUID:
    event = trigger("t.signed-up", tenant_id=tenant_id, user_id=user_id, timeout="P7D")
    return run_id_for("t-event", event.payload["run_key"], tenant_id)


@pytest.mark.django_db
def test_a_waiting_run_is_stored_under_its_key_and_the_keys_go_when_it_resumes():
    run_id = _wait("u-1")
    key = WorkflowWaitKey.objects.get(run_id=run_id)
    assert (key.event_type, key.path, key.value) == ("t.verified", '["user_id"]', '"u-1"')
    assert not WorkflowRunPending.objects.get(run_id=run_id).match_scan

    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u-1"})
    assert resume_due_runs().completed == 1
    assert not WorkflowWaitKey.objects.filter(run_id=run_id).exists()
    assert types_of(run_id)[-1] == et.RUN_COMPLETED
    assert check().differences == []


def _candidates_and_queries(event) -> tuple[int, int]:
    from kumiko_workflows.engine.wakeups import _candidates

    with CaptureQueriesContext(connection) as queries:
        rows = [row for candidates in _candidates(event) for row in candidates]
    return len(rows), len(queries)


@pytest.mark.django_db
def test_the_rows_fetched_for_a_keyed_wake_up_do_not_grow_with_other_waiting_runs():
    _wait("target")
    event = Event(tenant_id="default", type="t.verified", payload={"user_id": "target"}, id=10**9)
    few = _candidates_and_queries(event)
    for i in range(300):
        _wait(f"other-{i}")
    assert WorkflowRunPending.objects.count() == 301
    assert _candidates_and_queries(event) == few == (1, few[1])


@pytest.mark.django_db
def test_an_event_wakes_only_its_own_run_among_many():
    runs = {f"u-{i}": _wait(f"u-{i}") for i in range(20)}
    event = append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u-7"})
    resume_due_runs()  # decides any wake-up left for after commit (PostgreSQL)
    woken = Event.objects.filter(type=et.WAKE_REQUESTED)
    assert [(e.aggregate_id, e.payload["awaited_event_id"]) for e in woken] == [
        (runs["u-7"], event.id)
    ]


@pytest.mark.django_db
def test_an_event_wakes_every_run_waiting_on_its_key_batch_after_batch(monkeypatch):
    from kumiko_workflows import models

    monkeypatch.setattr(models, "KEYED_BATCH", 2)  # five runs: three batches
    runs = {_wait("same") for _ in range(5)}
    event = append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "same"})
    resume_due_runs()
    woken = Event.objects.filter(type=et.WAKE_REQUESTED)
    assert sorted(str(e.aggregate_id) for e in woken) == sorted(str(r) for r in runs)
    assert {e.payload["awaited_event_id"] for e in woken} == {event.id}


@pytest.mark.django_db
def test_a_scanned_wait_is_still_woken():
    from kumiko_workflows.workflow.registry import registry

    # t-event's match is keyed; give one run a match with no equality by
    # resuming a pending row whose stored match requires none.
    run_id = _wait("u-scan")
    assert registry.get("t-event") is not None
    # An UPDATE of these two columns (Model.save() would set tenant_id too, which
    # distributed tables refuse even at its own value).
    WorkflowRunPending.objects.filter(run_id=run_id).update(
        match_expr={"version": 1, "expr": atom(["score"], "gte", value=5)}, match_scan=True
    )
    WorkflowWaitKey.objects.filter(run_id=run_id).delete()
    event = append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "x", "score": 9})
    assert wake_for_event(event)
    assert WorkflowRunPending.objects.get(run_id=run_id).awaited_event_id == event.id


@pytest.mark.django_db
def test_keys_are_per_tenant():
    acme = _wait("same-user", tenant_id="acme")
    _wait("same-user", tenant_id="globex")
    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "same-user"}, tenant_id="acme")
    resume_due_runs()
    woken = Event.objects.filter(type=et.WAKE_REQUESTED)
    assert [(e.tenant_id, e.aggregate_id) for e in woken] == [("acme", acme)]


# --- the look-back ------------------------------------------------------------------


@pytest.mark.django_db
def test_look_back_finds_the_in_time_event_behind_20000_others_of_its_type():
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    start = trigger("t.signed-up-later", user_id="needle", **{"for": later})
    run_id = run_id_for("t-event-later", start.payload["run_key"])
    Event.objects.bulk_create(
        Event(
            tenant_id="default",
            aggregate_id=uuid.uuid4(),
            aggregate_type="user",
            version=1,
            type="t.verified",
            payload={"user_id": f"hay-{i}"},
        )
        for i in range(20_000)
    )
    needle = append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "needle"})

    report = resume_due_runs(now=timezone.now() + timedelta(hours=2))

    assert report.completed == 1
    assert et.WAITING_FOR_EVENT not in types_of(run_id)
    after = Event.objects.get(type="t.recorded", aggregate_id=start.aggregate_id)
    assert after.payload["steps"]["verified"] == {"user_id": "needle"}
    assert needle.id > start.id


# --- what the review of the first cut found -------------------------------------------


@pytest.mark.django_db
def test_an_int_enum_in_a_payload_offers_the_same_key_as_its_number():
    class Code(enum.IntEnum):
        SEVEN = 7

    class Name(enum.StrEnum):
        ANA = "ana"

    assert canonical_value(Code.SEVEN) == canonical_value(7)
    assert canonical_value(Name.ANA) == canonical_value("ana")
    run_id = _wait("7")
    # The payload value is a str Enum: matches() compares it as the string.
    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": Name("ana")})
    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": _Seven.SEVEN})
    resume_due_runs()
    assert types_of(run_id)[-1] == et.RUN_COMPLETED


class _Seven(enum.StrEnum):
    SEVEN = "7"


def _approval(by):
    return {
        "version": 1,
        "expr": {"kind": "atom", "path": ["by"], "op": {"kind": "eq", "value": by}},
    }


def _first_approval(ctx):
    return _approval("a")


def _second_approval(ctx):
    return _approval("b")


@pytest.mark.django_db
def test_a_second_wait_takes_an_earlier_event_the_first_wait_did_not_take():
    from kumiko_workflows import define_workflow, on_event, steps
    from kumiko_workflows.workflow.registry import registry
    from tests.testapp import workflows as w

    two_approvals = define_workflow(
        name="t-two-approvals",
        trigger=on_event("t.needs-approvals"),
        idempotency_key=w.run_key,
        awaits={"a": "t.approved", "b": "t.approved"},
        steps=[
            steps.wait_for_event("a", match=_first_approval, timeout="P1D"),
            steps.wait_for_event("b", match=_second_approval, timeout="P1D"),
            steps.compute("after", w.record("after")),
        ],
        register=False,
    )
    with registry.override(two_approvals):
        start = trigger("t.needs-approvals")
        run_id = run_id_for("t-two-approvals", start.payload["run_key"])
        by_b = append_event(uuid.uuid4(), "user", "t.approved", {"by": "b"})  # first in time
        by_a = append_event(uuid.uuid4(), "user", "t.approved", {"by": "a"})
        resume_due_runs()
        resume_due_runs()

    assert types_of(run_id)[-1] == et.RUN_COMPLETED
    resumed = [
        e.payload["awaited_event_id"]
        for e in Event.objects.filter(aggregate_id=run_id, type=et.RESUMED)
    ]
    assert resumed == [by_a.id]  # the second wait took by_b at once, by look-back
    after = Event.objects.get(type="t.recorded", aggregate_id=start.aggregate_id)
    assert after.payload["steps"]["b"] == {"by": "b"}
    assert by_b.id < by_a.id


def test_the_engines_own_event_types_cannot_be_awaited():
    from kumiko_workflows import define_workflow, on_event, steps
    from kumiko_workflows.exceptions import WorkflowDefinitionError

    with pytest.raises(WorkflowDefinitionError, match="engine's own event type"):
        define_workflow(
            name="t-awaits-engine",
            trigger=on_event("t.x"),
            awaits={"done": et.RUN_COMPLETED},
            steps=[steps.wait_for_event("done")],
            register=False,
        )


# --- the cost of an awaited append when nobody waits (issue 26) -----------------


def _statements(run):
    seen: list[str] = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        run()
    return [sql for sql in seen if not sql.startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]


@pytest.mark.not_citus(
    reason="it counts an awaited append's statements on the plain path, where the wake-up "
    "check rides in the insert; on distributed tables the check is a statement of its own, "
    "and a stream's first event is several (the id's draw, two inserts, the question to "
    "every shard, a savepoint and its release)"
)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_awaited_appends_nobody_waits_for_are_an_insert_each_and_one_settling_statement():
    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "warm"})

    def five() -> None:
        with transaction.atomic():
            for i in range(5):
                append_event(uuid.uuid4(), "user", "t.verified", {"user_id": f"nobody-{i}"})

    statements = _statements(five)
    # Each insert leaves its wake-up check in the same statement; after the
    # commit one statement settles the five checks together.
    assert len(statements) == 6, statements
    assert all("kumiko_workflows_wakecheck" in sql for sql in statements)
    assert not WakeCheck.objects.exists()
    # Alone, in autocommit: the insert, then the settling statement.
    assert len(_statements(lambda: append_event(uuid.uuid4(), "user", "t.verified", {}))) == 2
    assert not WakeCheck.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_check_whose_type_is_waited_for_after_commit_is_decided_not_settled():
    # A run waits on another key: the event's check cannot be settled as quiet,
    # it is decided in full, and wakes nothing it should not.
    waiting = trigger("t.signed-up", user_id="someone-else", timeout="P7D")
    verified = append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "nobody"})
    assert not WakeCheck.objects.filter(event_id=verified.id).exists()
    run_id = run_id_for("t-event", waiting.payload["run_key"])
    assert et.WAKE_REQUESTED not in types_of(run_id)
    woken = append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "someone-else"})
    assert WorkflowRunPending.objects.get(run_id=run_id).awaited_event_id == woken.id
    assert not WakeCheck.objects.exists()
