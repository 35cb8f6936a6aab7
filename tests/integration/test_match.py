"""The match builder: the JSON it writes, what it refuses, and the checks on waits.

Every operator is shown three ways: the builder's output equals the
hand-written JSON, both give the same wake-up keys, and both end (or leave)
the same real runs on the same real events, by wake-up and by look-back.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.core import checks as django_checks

from kumiko_workflows import append_event, define_workflow, match, on_event, run_id_for, steps
from kumiko_workflows import event_types as et
from kumiko_workflows.checks import check_workflows
from kumiko_workflows.exceptions import InvalidMatchExpression
from kumiko_workflows.models import WorkflowRun, WorkflowRunPending, WorkflowWaitKey
from kumiko_workflows.workflow.matching import matches, required_keys, validate
from kumiko_workflows.workflow.registry import registry
from tests.support import run_events, trigger


def atom(path, op, **value):
    return {"kind": "atom", "path": path, "op": {"kind": op, **value}}


def stored(node):
    return validate({"version": 1, "expr": node})


def trigger_order(ctx):
    return ctx.event.payload["order_id"]


def json_for_trigger_order(ctx):  # today's form of "this run's order": a callable of ctx
    return stored(atom(["order_id"], "eq", value=ctx.event.payload["order_id"]))


def json_for_user(ctx):
    return stored(atom(["user_id"], "eq", value=ctx.event.payload["user_id"]))


def user_of(ctx):
    return ctx.event.payload["user_id"]


#: name: (builder, the hand-written JSON or a callable giving it, [(payload, matches?)]).
#: The trigger's payload is {"order_id": "o-1", "user_id": 7}.
CASES = {
    "eq": (
        match.eq("user_id", 3),
        stored(atom(["user_id"], "eq", value=3)),
        [({"user_id": 3}, True), ({"user_id": "3"}, False), ({"user_id": 3.0}, True)],
    ),
    "ne": (
        match.ne("status", "void"),
        stored(atom(["status"], "ne", value="void")),
        [({"status": "paid"}, True), ({"status": "void"}, False), ({}, False)],
    ),
    "gt": (
        match.gt("amount", 10),
        stored(atom(["amount"], "gt", value=10)),
        [({"amount": 11}, True), ({"amount": 10}, False), ({"amount": "11"}, False)],
    ),
    "gte": (
        match.gte("amount", 10),
        stored(atom(["amount"], "gte", value=10)),
        [({"amount": 10}, True), ({"amount": 9.5}, False)],
    ),
    "lt": (
        match.lt("name", "m"),
        stored(atom(["name"], "lt", value="m")),
        [({"name": "alice"}, True), ({"name": "zoe"}, False), ({"name": 1}, False)],
    ),
    "lte": (
        match.lte("amount", 10),
        stored(atom(["amount"], "lte", value=10)),
        [({"amount": 10.0}, True), ({"amount": 11}, False)],
    ),
    "in": (
        match.in_("kind", ["a", 2]),
        stored(atom(["kind"], "in", values=["a", 2])),
        [({"kind": "a"}, True), ({"kind": 2.0}, True), ({"kind": "2"}, False)],
    ),
    "and": (
        match.eq("a", 1) & match.gt("b", 5),
        stored({"kind": "and", "nodes": [atom(["a"], "eq", value=1), atom(["b"], "gt", value=5)]}),
        [({"a": 1, "b": 6}, True), ({"a": 1, "b": 5}, False), ({"a": 2, "b": 6}, False)],
    ),
    "or": (
        match.eq("a", 1) | match.eq("b", 2),
        stored({"kind": "or", "nodes": [atom(["a"], "eq", value=1), atom(["b"], "eq", value=2)]}),
        [({"a": 1}, True), ({"b": 2}, True), ({"a": 2, "b": 1}, False)],
    ),
    "and of or": (
        match.eq("a", 1) & (match.eq("b", 2) | match.lt("c", 0)),
        stored(
            {
                "kind": "and",
                "nodes": [
                    atom(["a"], "eq", value=1),
                    {
                        "kind": "or",
                        "nodes": [atom(["b"], "eq", value=2), atom(["c"], "lt", value=0)],
                    },
                ],
            }
        ),
        [({"a": 1, "c": -1}, True), ({"a": 1, "b": 3}, False), ({"b": 2}, False)],
    ),
    "nested path": (
        match.eq("customer.id", 7),
        stored(atom(["customer", "id"], "eq", value=7)),
        [({"customer": {"id": 7}}, True), ({"customer.id": 7}, False), ({"customer": 7}, False)],
    ),
    "tuple path with a list index": (
        match.eq(("items", 0, "sku"), "x"),
        stored(atom(["items", 0, "sku"], "eq", value="x")),
        [({"items": [{"sku": "x"}]}, True), ({"items": {"0": {"sku": "x"}}}, False)],
    ),
    "from_trigger": (
        match.eq("order_id", match.from_trigger("order_id")),
        json_for_trigger_order,
        [({"order_id": "o-1"}, True), ({"order_id": "o-2"}, False)],
    ),
    "callable value": (
        match.eq("user_id", user_of),
        json_for_user,
        [({"user_id": 7}, True), ({"user_id": "7"}, False)],
    ),
}
STATIC = {name: case for name, case in CASES.items() if not callable(case[1])}


@pytest.mark.parametrize("builder, json_form, _", STATIC.values(), ids=STATIC.keys())
def test_the_builder_writes_the_hand_written_json_and_the_same_wake_up_keys(builder, json_form, _):
    assert builder.to_json() == json_form
    assert required_keys(builder.to_json()) == required_keys(json_form)


@pytest.mark.parametrize("builder, json_form, cases", STATIC.values(), ids=STATIC.keys())
def test_the_builder_and_the_json_agree_on_each_payload(builder, json_form, cases):
    for payload, expected in cases:
        assert matches(builder.to_json(), payload) is matches(json_form, payload) is expected


def test_a_longer_chain_is_one_flat_and_and_a_set_is_stored_in_order():
    chained = match.eq("a", 1) & match.eq("b", 2) & match.eq("c", 3)
    nodes = [atom([key], "eq", value=value) for key, value in (("a", 1), ("b", 2), ("c", 3))]
    assert chained.to_json() == stored({"kind": "and", "nodes": nodes})
    in_set = match.in_("k", {"b", "a", 1}).to_json()
    assert in_set == stored(atom(["k"], "in", values=["a", "b", 1]))
    # Values are stored as payloads are: a UUID or a Decimal as its string.
    order = uuid.uuid4()
    by_uuid = match.eq("order_id", order).to_json()
    assert by_uuid == stored(atom(["order_id"], "eq", value=str(order)))
    assert match.eq("amount", Decimal("12.50")).to_json()["expr"]["op"]["value"] == "12.50"


def test_a_run_dependent_value_is_resolved_when_the_wait_begins_not_before():
    expression = match.eq("order_id", match.from_trigger("order_id")) & match.eq("u", user_of)
    with pytest.raises(InvalidMatchExpression, match="the value of order_id eq depends on the run"):
        expression.to_json()
    assert not expression.is_static()
    assert repr(expression) == (
        '<match (order_id = "match.from_trigger((\'order_id\',))" and u = "user_of(ctx)")>'
    )


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: match.gt("amount", None), "match.gt() with None (NoneType) can never match"),
        (lambda: match.lte("flag", True), "match.lte() with True (bool) can never match"),
        (lambda: match.gte("n", [1]), "match.gte() with [1] (list) can never match"),
        (lambda: match.gt("amount", Decimal("10")), "a Decimal in a payload is stored as a string"),
        (lambda: match.eq("a", {"b": 1}), "match.eq() with a dict can never match"),
        (lambda: match.ne("a", [1, 2]), "for one of several values use match.in_(path, [...])"),
        (lambda: match.eq("a", float("nan")), "match.eq() with nan can never match"),
        (lambda: match.in_("a", []), "match.in_() with no values can never match"),
        (lambda: match.in_("a", "paid"), "a string would be its characters"),
        (lambda: match.in_("a", [1, {"x": 1}]), "match.eq() with a dict can never match"),
        (lambda: match.eq("a", 2**70), "beyond the 64-bit range"),
        (lambda: match.eq("items.0", 1), "give a tuple path, with 0 for a list index or '0' for"),
        (lambda: match.eq("a..b", 1), "match path 'a..b' has an empty key"),
        (lambda: match.eq((), 1), "match path is empty"),
        (lambda: match.eq(("a", True), 1), "each key must be a string (a mapping key) or an"),
        (lambda: match.eq(3, 1), "match path must be a string like 'customer.id' or a tuple"),
        (lambda: match.eq("a", 1) and match.eq("b", 2), "combine expressions with & and |, not"),
        (lambda: match.eq("a", 1) & {"kind": "atom"}, "combine with match expressions only"),
        (lambda: match.any() | match.eq("a", 1), "match.any() stands alone"),
    ],
)
def test_the_builder_refuses_what_can_never_match_naming_the_problem(build, message):
    with pytest.raises(InvalidMatchExpression) as info:
        build()
    assert message in str(info.value)


# --- the checks --------------------------------------------------------------------


def waiting(*wait_steps, name="m-check"):
    return define_workflow(
        name=name,
        trigger=on_event("m.start"),
        awaits={"verified": "user.email-verified"},
        steps=list(wait_steps),
        register=False,
    )


def test_a_wait_without_a_match_is_a_warning_and_match_any_silences_it():
    (warning,) = check_workflows(workflows=[waiting(steps.wait_for_event("verified"))])
    assert (type(warning), warning.id) == (django_checks.Warning, "kumiko_workflows.W090")
    assert warning.msg == (
        "workflow 'm-check': step 0 (wait_for_event 'verified') has no match: any "
        "'user.email-verified' event ends this wait in every run waiting here (one user's "
        "event would end another user's run)"
    )
    assert "match=match.any()" in warning.hint and "match.from_trigger('user_id')" in warning.hint

    for explicit in (match.any(), match.ANY, match.eq("user_id", 1), json_for_user):
        workflow = waiting(steps.wait_for_event("verified", explicit))
        assert check_workflows(workflows=[workflow]) == []


def test_match_any_uncalled_is_refused_rather_than_called_with_ctx():
    from kumiko_workflows.exceptions import WorkflowDefinitionError

    with pytest.raises(WorkflowDefinitionError, match=r"call it, match=match.any\(\)"):
        steps.wait_for_event("verified", match=match.any)


def test_match_any_is_stored_and_fingerprinted_as_no_match_so_adding_it_strands_no_run():
    without = waiting(steps.wait_for_event("verified", timeout="P1D"))
    explicit = waiting(steps.wait_for_event("verified", match=match.ANY, timeout="P1D"))
    assert explicit.fingerprint == without.fingerprint


def test_a_builder_match_is_fingerprinted_as_its_json_and_its_run_dependent_values_by_name():
    def fingerprint(expression):
        return waiting(steps.wait_for_event("verified", match=expression)).fingerprint

    hand = stored(atom(["user_id"], "eq", value=3))
    assert fingerprint(match.eq("user_id", 3)) == fingerprint(hand)
    assert fingerprint(match.eq("user_id", 3)) != fingerprint(match.eq("user_id", "3"))
    by_order = fingerprint(match.eq("id", match.from_trigger("order_id")))
    assert by_order == fingerprint(match.eq("id", match.from_trigger("order_id")))
    assert by_order != fingerprint(match.eq("id", match.from_trigger("user_id")))
    assert fingerprint(match.eq("id", user_of)) != fingerprint(match.eq("id", trigger_order))


def test_a_lambda_inside_a_builder_match_gets_the_lambda_warning():
    workflow = waiting(
        steps.wait_for_event("verified", match=match.eq("user_id", lambda ctx: 1)), name="m-lam"
    )
    (warning,) = check_workflows(workflows=[workflow])
    assert warning.id == "kumiko_workflows.W001"
    assert "step 0 (wait_for_event 'verified') match value of user_id eq is" in warning.msg


@pytest.mark.parametrize(
    "node, problem",
    [
        (atom(["n"], "gt", value=None), "['expr']: gt null can never match"),
        (atom(["n"], "lte", value=True), "['expr']: lte true can never match"),
        (
            {"kind": "or", "nodes": [atom(["a"], "eq", value=1), atom(["k"], "in", values=[])]},
            "['expr']['nodes'][1]: 'in' with no values can never match",
        ),
    ],
)
def test_a_hand_written_comparison_that_can_never_match_is_a_warning_not_a_refusal(node, problem):
    workflow = waiting(steps.wait_for_event("verified", match=stored(node)))  # still defined
    (warning,) = check_workflows(workflows=[workflow])
    assert (type(warning), warning.id) == (django_checks.Warning, "kumiko_workflows.W091")
    assert f"match expression {problem}" in warning.msg


# --- through the engine, on real events ------------------------------------------------


def _workflow(name, expression):
    return define_workflow(
        name=name,
        trigger=on_event("m.start"),
        idempotency_key=lambda event: event.payload["run_key"],
        awaits={"got": "m.event"},
        steps=[
            steps.wait("PT0S"),
            steps.wait_for_event("got", match=expression),
            steps.compute("done", lambda ctx: ctx.steps["got"]),
        ],
        register=False,
    )


def _statuses(tenant, key):
    return [
        WorkflowRun.objects.get(run_id=run_id_for(name, key, tenant)).status
        for name in ("m-builder", "m-json")
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("builder, json_form, cases", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("by", ["wake-up", "look-back"])
def test_the_engine_ends_the_same_runs_for_the_builder_and_the_json(builder, json_form, cases, by):
    from kumiko_workflows import resume_due_runs

    with registry.override(_workflow("m-builder", builder), _workflow("m-json", json_form)):
        for i, (payload, expected) in enumerate(cases):
            tenant = f"m-{i}"  # a tenant per payload: no other run sees its event
            start = trigger("m.start", tenant_id=tenant, order_id="o-1", user_id=7)
            key = start.payload["run_key"]
            if by == "look-back":  # appended before the wait begins: found when it does
                append_event(uuid.uuid4(), "thing", "m.event", payload, tenant_id=tenant)
            resume_due_runs(tenant_id=tenant)
            if by == "wake-up":
                assert _statuses(tenant, key) == ["waiting", "waiting"]
                append_event(uuid.uuid4(), "thing", "m.event", payload, tenant_id=tenant)
                resume_due_runs(tenant_id=tenant)
            status = "completed" if expected else "waiting"
            assert _statuses(tenant, key) == [status, status], payload


@pytest.mark.django_db
def test_a_builder_wait_is_stored_under_the_same_key_as_its_json():
    from kumiko_workflows import resume_due_runs

    builder = match.eq("order_id", match.from_trigger("order_id"))
    with registry.override(
        _workflow("m-builder", builder), _workflow("m-json", json_for_trigger_order)
    ):
        trigger("m.start", order_id="o-9", user_id=7)
        resume_due_runs()
        rows = WorkflowRunPending.objects.filter(wait_event_type="m.event")
        expected = stored(atom(["order_id"], "eq", value="o-9"))
        assert [row.match_expr for row in rows] == [expected, expected]
        keys = {(k.path, k.value) for k in WorkflowWaitKey.objects.all()}
        assert keys == {('["order_id"]', '"o-9"')}
        assert {row.match_scan for row in rows} == {False}


@pytest.mark.django_db
def test_match_any_waits_like_no_match_and_any_event_of_the_type_ends_it():
    from kumiko_workflows import resume_due_runs

    with registry.override(_workflow("m-builder", match.ANY), _workflow("m-json", None)):
        start = trigger("m.start", order_id="o-1", user_id=7)
        resume_due_runs()
        rows = WorkflowRunPending.objects.filter(wait_event_type="m.event")
        assert [(row.match_expr, row.match_scan) for row in rows] == [(None, True)] * 2
        append_event(uuid.uuid4(), "thing", "m.event", {"anything": 1})
        resume_due_runs()
        assert _statuses("default", start.payload["run_key"]) == ["completed", "completed"]


def _absent(ctx):
    return None


@pytest.mark.django_db
@pytest.mark.parametrize(
    "expression, detail",
    [
        (
            match.eq("order_id", match.from_trigger("customer.id")),
            "match expression: the trigger event's payload has no value at customer.id",
        ),
        (match.gt("amount", _absent), "match.gt() with None (NoneType) can never match"),
        (match.in_("kind", _absent), "match.in_() takes a list of values, got None"),
    ],
)
def test_a_run_dependent_value_that_could_never_match_fails_the_run_saying_why(expression, detail):
    from kumiko_workflows import resume_due_runs

    with registry.override(_workflow("m-builder", expression)):
        start = trigger("m.start", order_id="o-1")
        resume_due_runs()
        run_id = run_id_for("m-builder", start.payload["run_key"], "default")
        failed = run_events(run_id)[-1]
        assert failed.type == et.RUN_FAILED
        assert (failed.payload["reason"], failed.payload["step"]) == ("invalid_step_argument", "1")
        assert detail in WorkflowRun.objects.get(run_id=run_id).last_error


@pytest.mark.django_db
@pytest.mark.parametrize(
    "expected, arrived, told",
    [
        ("3", 3, 'user_id is 3 (a number) in the event, "3" (a string) in the match'),
        (3, "3", 'user_id is "3" (a string) in the event, 3 (a number) in the match'),
        (["1.5", "x"], 1.5, 'user_id is 1.5 (a number) in the event, "1.5" (a string) in the'),
    ],
)
def test_the_run_page_names_an_arrived_event_that_differs_from_the_match_in_type_only(
    expected, arrived, told
):
    from django.utils import timezone

    from kumiko_workflows import resume_due_runs
    from kumiko_workflows.operations.explain import explain

    many = isinstance(expected, list)
    expression = match.in_("user_id", expected) if many else match.eq("user_id", expected)
    with registry.override(_workflow("m-builder", expression)):
        start = trigger("m.start")
        resume_due_runs()
        run = WorkflowRun.objects.get(run_id=run_id_for("m-builder", start.payload["run_key"]))
        append_event(uuid.uuid4(), "user", "m.event", {"user_id": 4})  # unlike in any type
        assert "Near miss" not in dict(explain(run, timezone.now()).facts)

        near = append_event(uuid.uuid4(), "user", "m.event", {"user_id": arrived})
        resume_due_runs()
        run.refresh_from_db()
        assert run.status == "waiting"  # "3" never equals 3: the wait goes on
        facts = dict(explain(run, timezone.now()).facts)
        assert facts["Near miss"].startswith(
            f"event #{near.id} would end this wait but for the type of a value: {told}"
        )
