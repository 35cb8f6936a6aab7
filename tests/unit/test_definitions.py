"""Workflow definitions: validation and checks, fingerprints, durations, matching."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.apps import apps
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from kumiko_workflows import define_workflow, match, on_cron, on_event, run_id_for, steps
from kumiko_workflows.checks import check_settings, check_workflows
from kumiko_workflows.exceptions import (
    InvalidArgument,
    InvalidDuration,
    InvalidMatchExpression,
    RegistryNotReady,
    WorkflowDefinitionError,
)
from kumiko_workflows.workflow.cron import CronTrigger
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.durations import as_delay, parse_duration, parse_instant, wake_time
from kumiko_workflows.workflow.matching import matches, validate
from kumiko_workflows.workflow.registry import WorkflowRegistry, registry
from tests.support import REPO, run_manage, subprocess_env


def noop(ctx):
    return None


def other_noop(ctx):
    return None


def key_of(event):
    return event.payload["id"]


def atom(path, op):
    return {"version": 1, "expr": {"kind": "atom", "path": path, "op": op}}


EQ_A = atom(["a"], {"kind": "eq", "value": 1})


def build(steps_, *, awaits=None, name="w", version=1, trigger=None, key=None):
    """A definition that is not validated or registered (as the checks see it)."""
    return Workflow(name, trigger or on_event("w.go"), steps_, key, awaits, version)


def define(steps_, **kwargs):
    return define_workflow(
        kwargs.pop("name", "w"),
        kwargs.pop("trigger", on_event("w.go")),
        steps_,
        register=False,
        **kwargs,
    )


# --- every definition error, at define time and as a system check -------------

NAIVE = datetime(2026, 1, 31, 9, 0)
DEEP = {"kind": "and", "nodes": [EQ_A["expr"]]}
for _ in range(16):
    DEEP = {"kind": "and", "nodes": [DEEP]}

ERRORS = {
    "undeclared awaits key": (
        [steps.wait_for_event("paid", match=match.ANY)],
        {"awaits": {"shipped": "order.shipped"}},
        "E001",
        "step 0 (wait_for_event 'paid') names awaits key 'paid', which is not declared "
        "(declared: shipped)",
    ),
    "no awaits at all": (
        [steps.compute("a", noop), steps.wait_for_event("paid", match=match.ANY)],
        {},
        "E001",
        "step 1 (wait_for_event 'paid') names awaits key 'paid', which is not declared "
        "(declared: none)",
    ),
    "unknown op": (
        [steps.wait_for_event("k", match=atom(["a"], {"kind": "like", "value": "x"}))],
        {"awaits": {"k": "e"}},
        "E002",
        "step 0 (wait_for_event 'k'): match expression ['expr']['op']['kind']: "
        "unknown op 'like'; use one of eq, ne, gt, gte, lt, lte, in",
    ),
    "missing value": (
        [steps.wait_for_event("k", match=atom(["a"], {"kind": "eq"}))],
        {"awaits": {"k": "e"}},
        "E002",
        "match expression ['expr']['op']: an 'eq' op takes exactly 'kind' and 'value'",
    ),
    "wrong version": (
        [steps.wait_for_event("k", match={"version": 2, "expr": EQ_A["expr"]})],
        {"awaits": {"k": "e"}},
        "E002",
        "match expression ['version']: must be 1, got 2",
    ),
    "empty nodes": (
        [steps.wait_for_event("k", match={"version": 1, "expr": {"kind": "or", "nodes": []}})],
        {"awaits": {"k": "e"}},
        "E002",
        "match expression ['expr']['nodes']: must be a non-empty list",
    ),
    "bad path element": (
        [
            steps.wait_for_event(
                "k",
                match={
                    "version": 1,
                    "expr": {
                        "kind": "and",
                        "nodes": [
                            EQ_A["expr"],
                            atom(["a", 1.5], {"kind": "eq", "value": 1})["expr"],
                        ],
                    },
                },
            )
        ],
        {"awaits": {"k": "e"}},
        "E002",
        "match expression ['expr']['nodes'][1]['path'][1]: must be a string or an integer, got 1.5",
    ),
    "too deep": (
        [steps.wait_for_event("k", match={"version": 1, "expr": DEEP})],
        {"awaits": {"k": "e"}},
        "E002",
        "is nested more than 16 levels deep",
    ),
    "non-scalar value": (
        [steps.wait_for_event("k", match=atom(["a"], {"kind": "eq", "value": [1]}))],
        {"awaits": {"k": "e"}},
        "E002",
        "match expression ['expr']['op']['value']: must be a string, number, boolean or null",
    ),
    "NaN value": (
        [steps.wait_for_event("k", match=atom(["a"], {"kind": "eq", "value": math.nan}))],
        {"awaits": {"k": "e"}},
        "E002",
        "match expression: is not JSON-serialisable",
    ),
    "wait in a retry body": (
        [steps.retry(times=3, do=[steps.compute("a", noop), steps.wait("PT1M")])],
        {},
        "E003",
        "step 0 (retry) contains the suspending step 0.do.1 (wait); a retry body may not suspend",
    ),
    "wait_for_event in a branch in a retry body": (
        [
            steps.retry(
                times=3,
                do=[
                    steps.branch(noop, then=[], else_=[steps.wait_for_event("k", match=match.ANY)])
                ],
            )
        ],
        {"awaits": {"k": "e"}},
        "E003",
        "step 0 (retry) contains the suspending step 0.do.0.else.0 (wait_for_event 'k')",
    ),
    "times 0": (
        [steps.retry(times=0, do=[steps.compute("a", noop)])],
        {},
        "E004",
        "step 0 (retry): times must be an integer >= 1, got 0",
    ),
    "times a string": (
        [steps.retry(times="3", do=[steps.compute("a", noop)])],
        {},
        "E004",
        "step 0 (retry): times must be an integer >= 1, got '3'",
    ),
    "quadratic backoff": (
        [steps.retry(times=2, backoff="quadratic", do=[steps.compute("a", noop)])],
        {},
        "E005",
        "step 0 (retry): backoff must be 'linear' or 'exponential', got 'quadratic'",
    ),
    "negative wait": (
        [steps.wait("-PT1S")],
        {},
        "E006",
        "step 0 (wait): for_='-PT1S' is invalid: '-PT1S' is negative",
    ),
    "empty duration": (
        [steps.wait("PT")],
        {},
        "E006",
        "step 0 (wait): for_='PT' is invalid: 'PT' is not an ISO 8601 duration",
    ),
    "words": (
        [steps.wait("1 hour")],
        {},
        "E006",
        "for_='1 hour' is invalid: '1 hour' is neither an ISO 8601 duration (PT1H) nor an instant",
    ),
    "naive datetime": (
        [steps.wait(NAIVE)],
        {},
        "E006",
        "is invalid: 2026-01-31T09:00:00 is a naive datetime; give it a time zone",
    ),
    "months": (
        [steps.wait("P1M")],
        {},
        "E006",
        "for_='P1M' is invalid: 'P1M' uses years or months, which have no fixed length",
    ),
    "negative timeout": (
        [steps.wait_for_event("k", match=match.ANY, timeout="-PT1S")],
        {"awaits": {"k": "e"}},
        "E006",
        "step 0 (wait_for_event 'k'): timeout='-PT1S' is invalid: '-PT1S' is negative",
    ),
    "timeout in years": (
        [steps.wait_for_event("k", match=match.ANY, timeout="P1Y")],
        {"awaits": {"k": "e"}},
        "E006",
        "timeout='P1Y' is invalid: 'P1Y' uses years or months",
    ),
    "naive timeout": (
        [steps.wait_for_event("k", match=match.ANY, timeout=NAIVE)],
        {"awaits": {"k": "e"}},
        "E006",
        "timeout=datetime.datetime(2026, 1, 31, 9, 0) is invalid: 2026-01-31T09:00:00 is a naive",
    ),
    "negative base_delay": (
        [steps.retry(times=2, base_delay="-PT1S", do=[steps.compute("a", noop)])],
        {},
        "E006",
        "step 0 (retry): base_delay='-PT1S' is invalid: '-PT1S' is negative",
    ),
    "base_delay in words": (
        [steps.retry(times=2, base_delay="1 hour", do=[steps.compute("a", noop)])],
        {},
        "E006",
        "base_delay='1 hour' is invalid: '1 hour' is not an ISO 8601 duration",
    ),
    "max_delay in months": (
        [steps.retry(times=2, max_delay="P1M", do=[steps.compute("a", noop)])],
        {},
        "E006",
        "max_delay='P1M' is invalid: 'P1M' uses years or months",
    ),
    "base_delay a datetime": (
        [
            steps.retry(
                times=2, base_delay=datetime(2026, 1, 1, tzinfo=UTC), do=[steps.compute("a", noop)]
            )
        ],
        {},
        "E006",
        "is not a duration (give an ISO 8601 string, a timedelta or seconds)",
    ),
    "duplicate compute names": (
        [steps.compute("a", noop), steps.branch(noop, then=[steps.compute("a", other_noop)])],
        {},
        "E007",
        "step 1.then.0 (compute 'a') stores its result as ctx.steps['a'], which "
        "step 0 (compute 'a') already uses",
    ),
    "compute named like an awaits key": (
        [steps.wait_for_event("k", match=match.ANY), steps.compute("k", noop)],
        {"awaits": {"k": "e"}},
        "E007",
        "step 1 (compute 'k') stores its result as ctx.steps['k'], which "
        "step 0 (wait_for_event 'k') already uses",
    ),
    "no steps": ([], {}, "E013", "has no steps"),
    "empty retry body": (
        [steps.retry(times=2, do=[])],
        {},
        "E013",
        "step 0 (retry) has an empty body",
    ),
}


@pytest.mark.parametrize("steps_, kwargs, check, message", ERRORS.values(), ids=ERRORS.keys())
def test_definition_error_at_define_time(steps_, kwargs, check, message):
    with pytest.raises(WorkflowDefinitionError) as info:
        define(steps_, **kwargs)

    text = str(info.value)
    assert text.startswith(f"[kumiko_workflows.{check}] workflow 'w': ")
    assert message in text


@pytest.mark.parametrize("steps_, kwargs, check, message", ERRORS.values(), ids=ERRORS.keys())
def test_definition_error_as_a_system_check(steps_, kwargs, check, message):
    workflow = build(steps_, **kwargs)

    errors = check_workflows(workflows=[workflow])

    assert [e.id for e in errors] == [f"kumiko_workflows.{check}"]
    assert message in errors[0].msg
    assert errors[0].obj is workflow
    assert errors[0].is_serious()


def test_system_check_reports_every_problem_with_its_hint():
    workflow = build(
        [
            steps.wait_for_event("paid", match=atom(["a"], {"kind": "like", "value": 1})),
            steps.retry(times=0, backoff="quadratic", do=[steps.wait("PT1S")]),
        ]
    )

    errors = check_workflows(workflows=[workflow])

    assert [(e.id, e.hint) for e in errors] == [
        ("kumiko_workflows.E001", "Declare it: define_workflow(awaits={key: 'event.type'})."),
        ("kumiko_workflows.E002", "The grammar: docs/howto/match-expressions.md."),
        ("kumiko_workflows.E003", "Move waits out of retry(do=[...])."),
        ("kumiko_workflows.E004", "times counts all attempts, the first included."),
        (
            "kumiko_workflows.E005",
            "linear waits base × attempt; exponential waits base × 2^(attempt-1).",
        ),
    ]


def test_define_time_error_names_the_first_problem_and_its_hint():
    with pytest.raises(WorkflowDefinitionError) as info:
        define([steps.wait_for_event("paid"), steps.wait("soon")])

    assert str(info.value) == (
        "[kumiko_workflows.E001] workflow 'w': step 0 (wait_for_event 'paid') names awaits "
        "key 'paid', which is not declared (declared: none). "
        "HINT: Declare it: define_workflow(awaits={key: 'event.type'})."
    )


def test_invalid_cron_is_refused_by_on_cron_and_by_the_check():
    with pytest.raises(WorkflowDefinitionError, match=r"\[kumiko_workflows.E008\] cron expr"):
        on_cron("every monday")
    with pytest.raises(WorkflowDefinitionError, match="'Mars/Base' is not a known IANA"):
        on_cron("0 9 * * 1", timezone="Mars/Base")
    with pytest.raises(WorkflowDefinitionError, match="catch_up must be one of skip, latest"):
        on_cron("0 9 * * 1", catch_up="never")

    workflow = build([steps.compute("a", noop)], trigger=CronTrigger("61 * * * *"))
    errors = check_workflows(workflows=[workflow])
    assert [e.id for e in errors] == ["kumiko_workflows.E008"]
    assert "cron expression '61 * * * *' is not valid" in errors[0].msg
    assert errors[0].hint == (
        "Use a 5-field cron expression of fixed times (no R or H fields) that names dates "
        "which exist, and an IANA time zone."
    )


def test_callable_arguments_are_not_validated_at_define_time():
    workflow = define(
        [
            steps.wait(noop),
            steps.wait_for_event("k", match=noop, timeout=noop),
            steps.retry(times=noop, backoff=noop, base_delay=noop, do=[steps.compute("a", noop)]),
        ],
        awaits={"k": "e"},
    )

    assert check_workflows(workflows=[workflow]) == []


def test_malformed_arguments_to_the_builders_are_refused():
    cases = [
        (lambda: steps.compute("", noop), "compute() needs a non-empty name"),
        (lambda: steps.compute("a", "noop"), "fn must be callable"),
        (lambda: steps.wait_for_event(""), "wait_for_event() needs an awaits key"),
        (lambda: steps.retry(3, do=[], give_up_on=[ValueError, "x"]), "takes exception classes"),
        (lambda: steps.branch(noop, then=noop), "branch(then=...) must be a list of steps"),
        (lambda: steps.branch(noop, then=["x"]), "branch(then=...)[0] is 'x', not a step"),
        (lambda: on_event(""), "on_event() needs an event type"),
        (lambda: on_event("e", filter="yes"), "must be callable"),
        (lambda: build([], name=""), "a workflow needs a name"),
        (lambda: build([], trigger="e"), "trigger must be on_event"),
        (lambda: build([], version=0), "version must be an integer from 1 to 2147483647, got 0"),
        (lambda: build([], version=True), "must be an integer from 1 to 2147483647, got True"),
        (lambda: build([], awaits={"k": ""}), "awaits maps keys to event types"),
        (lambda: build([], key=3), "idempotency_key must be a string, a callable or None"),
    ]
    for make, message in cases:
        with pytest.raises(WorkflowDefinitionError, match=re.escape(message)):
            make()


# --- the registry ----------------------------------------------------------------


def test_a_second_workflow_with_the_same_name_is_an_error():
    own = WorkflowRegistry()
    first = own.register(build([steps.compute("a", noop)], name="dup"))

    with pytest.raises(WorkflowDefinitionError, match="a workflow named 'dup' is already defined"):
        own.register(build([steps.compute("a", other_noop)], name="dup"))

    assert own.register(build([steps.compute("a", noop)], name="dup")) is first
    assert own.all() == [first]


def test_define_workflow_refuses_a_name_the_project_already_uses():
    existing = registry.get("t-wait")

    with pytest.raises(WorkflowDefinitionError, match="a workflow named 't-wait' is already"):
        define_workflow("t-wait", on_event("t.wait"), [steps.compute("x", noop)])
    # Importing the workflows module again defines identical workflows: no error.
    again = define_workflow(
        "t-wait", existing.trigger, list(existing.steps), existing.idempotency_key
    )
    assert again is existing
    assert registry.get("t-wait") is existing


def test_the_registry_before_apps_are_ready_says_how_to_fix_it(monkeypatch):
    # As in a process that has not called django.setup() yet (once the registry
    # has found the apps ready, it does not ask again).
    monkeypatch.setattr(apps, "ready", False)
    monkeypatch.setattr(registry, "_apps_ready", False)

    with pytest.raises(RegistryNotReady) as info:
        registry.get("t-wait")
    with pytest.raises(RegistryNotReady):
        registry.all()

    message = str(info.value)
    assert "after django.setup()" in message
    assert '"kumiko_workflows" is in INSTALLED_APPS' in message


def test_override_and_without_swap_definitions_for_a_block():
    replacement = define([steps.compute("x", noop)], name="t-wait", trigger=on_event("t.other"))
    original = registry.get("t-wait")

    with registry.override(replacement):
        assert registry.get("t-wait") is replacement
        assert registry.triggered_by("t.other") == [replacement]
        assert original not in registry.triggered_by("t.wait")
    with registry.without("t-wait"):
        assert registry.get("t-wait") is None
        assert registry.triggered_by("t.wait") == []

    assert registry.get("t-wait") is original
    assert registry.triggered_by("t.wait") == [original]


def test_versions_of_one_name_live_side_by_side_and_new_runs_start_on_the_highest():
    own = WorkflowRegistry()
    v1 = own.register(
        build([steps.wait_for_event("paid")], awaits={"paid": "w.paid"}, trigger=on_event("w.a"))
    )
    v3 = own.register(build([steps.compute("a", noop)], version=3, trigger=on_event("w.b")))
    v2 = own.register(build([steps.compute("a", other_noop)], version=2, trigger=on_event("w.a")))

    assert own.get("w") is v3 and own.get("w", 1) is v1 and own.get("w", 4) is None
    assert own.versions("w") == [v1, v2, v3]
    assert own.all() == [v3] and own.every_version() == [v1, v2, v3]
    # Only the highest version starts runs; a run of any version may still await its event.
    assert own.triggered_by("w.b") == [v3] and own.triggered_by("w.a") == []
    assert own.is_awaited("w.paid")
    # A run resumes on its recorded version, or (recorded by no version) on its fingerprint's.
    assert own.of_run("w", 2, "anything") is v2
    assert own.of_run("w", None, v1.fingerprint) is v1
    assert own.of_run("w", None, "unknown") is None
    with pytest.raises(WorkflowDefinitionError, match="already defined at version 2"):
        own.register(build([steps.compute("b", noop)], version=2))


def test_override_declares_exactly_the_versions_given_for_a_name():
    v2 = define([steps.compute("x", noop)], name="t-wait", trigger=on_event("t.wait"), version=2)
    original = registry.get("t-wait")

    with registry.override(v2):  # a deploy that replaced v1 by v2
        assert registry.versions("t-wait") == [v2]
    with registry.override(original, v2):  # a deploy that added v2 beside v1
        assert registry.versions("t-wait") == [original, v2]
        assert registry.triggered_by("t.wait") == [v2]

    assert registry.versions("t-wait") == [original]


@pytest.mark.parametrize(
    ("migrates_from", "message"),
    [
        ([1], "migrates_from must map older versions"),
        ({2: {"0": "0"}}, "names version 2; give older versions of this workflow"),
        ({0: {"0": "0"}}, "names version 0"),
        ({True: {"0": "0"}}, "names version True"),
        ({1: {0: "0"}}, r"migrates_from\[1\] must map step positions to step positions"),
        ({1: ["0"]}, r"migrates_from\[1\] must map step positions"),
    ],
)
def test_a_malformed_migrates_from_is_refused_at_definition(migrates_from, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        define([steps.compute("a", noop)], version=2, migrates_from=migrates_from)


def test_migrates_from_positions_are_checked_against_both_versions():
    with pytest.raises(
        WorkflowDefinitionError,
        match=r"\[kumiko_workflows.E014\] workflow 'w' "
        r"version 2: migrates_from\[1\] maps step 1 to '3', which this version "
        "has no step at",
    ):
        define([steps.wait("PT1H")], version=2, migrates_from={1: {"1": "3"}})
    with pytest.raises(WorkflowDefinitionError, match="maps 'one', which is not a step position"):
        define([steps.wait("PT1H")], version=2, migrates_from={1: {"one": "0"}})

    old = define([steps.compute("a", noop), steps.wait("PT1H")], name="t-moved")
    new = define(
        [steps.wait("PT1H")], name="t-moved", version=2, migrates_from={1: {"1": "0", "5": "0"}}
    )
    with registry.override(old, new):
        errors = check_workflows(workflows=[new])
    with registry.override(new):  # the old version is gone: nothing to compare with
        assert check_workflows(workflows=[new]) == []

    assert [(e.id, e.msg) for e in errors] == [
        (
            "kumiko_workflows.E014",
            "workflow 't-moved' version 2: migrates_from[1] maps step 5, which version 1 has "
            "no step at",
        )
    ]
    # migrates_from is not in the fingerprint: adding it to a running version strands nothing.
    assert new.fingerprint == define([steps.wait("PT1H")], name="t-moved", version=2).fingerprint


def test_run_ids_are_uuid5_per_tenant_name_and_key():
    one = run_id_for("w", "k-1", "acme")

    assert one.version == 5
    assert run_id_for("w", "k-1", "acme") == one
    assert len({one, run_id_for("w", "k-1", "other"), run_id_for("v", "k-1", "acme")}) == 3
    assert run_id_for("w", "k-2", "acme") != one
    assert run_id_for("w", "k-1") == run_id_for("w", "k-1", "default")
    with pytest.raises(InvalidArgument, match="idempotency key must be a string"):
        run_id_for("w", None, "acme")


# --- system checks of the settings and the real project -----------------------

SETTINGS_ERRORS = {
    "not a dict": (["x"], "E020", "KUMIKO_WORKFLOWS must be a dict."),
    "unknown key": (
        {"BATCHSIZE": 5},
        "E021",
        "KUMIKO_WORKFLOWS has an unknown setting 'BATCHSIZE'.",
    ),
    "zero batch": (
        {"BATCH_SIZE": 0},
        "E022",
        "KUMIKO_WORKFLOWS['BATCH_SIZE'] must be a positive number, got 0.",
    ),
    "string interval": (
        {"WORKER_INTERVAL": "5"},
        "E022",
        "KUMIKO_WORKFLOWS['WORKER_INTERVAL'] must be a positive number, got '5'.",
    ),
    "bool payload limit": (
        {"MAX_PAYLOAD_BYTES": True},
        "E022",
        "KUMIKO_WORKFLOWS['MAX_PAYLOAD_BYTES'] must be a positive number, got True.",
    ),
    "zero resume errors": (
        {"MAX_RESUME_ERRORS": 0},
        "E022",
        "KUMIKO_WORKFLOWS['MAX_RESUME_ERRORS'] must be a positive number, got 0.",
    ),
    "empty tenant": (
        {"DEFAULT_TENANT": ""},
        "E023",
        "KUMIKO_WORKFLOWS['DEFAULT_TENANT'] must be a non-empty string, got ''.",
    ),
    "overlong tenant": (
        {"DEFAULT_TENANT": "t" * 101},
        "E023",
        "KUMIKO_WORKFLOWS['DEFAULT_TENANT'] is longer than 100 characters.",
    ),
    "tenant with a NUL": (
        {"DEFAULT_TENANT": "acme\x00"},
        "E023",
        "KUMIKO_WORKFLOWS['DEFAULT_TENANT'] contains a NUL character (\\u0000), which the "
        "database cannot store.",
    ),
    "weights not a dict": (
        {"TENANT_WEIGHTS": ["acme"]},
        "E110",
        "KUMIKO_WORKFLOWS['TENANT_WEIGHTS'] must be a dict, got ['acme'].",
    ),
    "zero weight": (
        {"TENANT_WEIGHTS": {"acme": 0}},
        "E110",
        "KUMIKO_WORKFLOWS['TENANT_WEIGHTS']['acme'] must be a positive integer, got 0.",
    ),
    "unimportable tenants": (
        {"CRON_TENANTS": "no.such.module.tenants"},
        "E024",
        "KUMIKO_WORKFLOWS['CRON_TENANTS'] = 'no.such.module.tenants' cannot be imported",
    ),
}


@pytest.mark.parametrize("value, check, message", SETTINGS_ERRORS.values(), ids=SETTINGS_ERRORS)
def test_settings_check_flags_bad_values(settings, value, check, message):
    settings.KUMIKO_WORKFLOWS = value

    errors = check_settings()

    assert [e.id for e in errors] == [f"kumiko_workflows.{check}"]
    assert errors[0].msg.startswith(message)


def test_settings_check_hints_and_a_clean_configuration(settings):
    settings.KUMIKO_WORKFLOWS = {"BATCHSIZE": 5, "BATCH_SIZE": -1}
    errors = check_settings()
    assert errors[0].hint.startswith("Known settings: ADMIN_TENANT, BATCH_SECONDS, BATCH_SIZE,")
    assert errors[1].hint == "The default is 50."

    settings.KUMIKO_WORKFLOWS = {"BATCH_SIZE": 10, "CRON_TENANTS": "tests.support.on_postgres"}
    assert check_settings() == []


def test_registered_workflows_pass_their_checks():
    assert check_workflows() == []


def test_manage_py_check_is_clean():
    result = run_manage("check", "--fail-level", "WARNING")

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


# --- fingerprints --------------------------------------------------------------


def shape(*extra, version=1, trigger="w.go", key=key_of, awaits=None, wait="PT1H"):
    return build(
        [steps.compute("a", noop), steps.wait(wait), *extra],
        version=version,
        trigger=on_event(trigger),
        key=key,
        awaits=awaits,
    )


def test_equal_definitions_have_equal_fingerprints():
    one, two = shape(steps.compute("b", noop)), shape(steps.compute("b", noop))

    assert one is not two
    assert one.fingerprint == two.fingerprint
    assert one.step_fingerprints == two.step_fingerprints
    assert len(one.fingerprint) == 64
    assert set(one.step_fingerprints) == {"workflow", "0", "1", "2"}


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(lambda: shape(), id="step removed"),
        pytest.param(lambda: shape(steps.compute("b", noop), steps.wait("PT1S")), id="added"),
        pytest.param(
            lambda: build(
                [steps.wait("PT1H"), steps.compute("a", noop), steps.compute("b", noop)],
                key=key_of,
            ),
            id="reordered",
        ),
        pytest.param(lambda: shape(steps.compute("b", noop), wait="PT2H"), id="static argument"),
        pytest.param(lambda: shape(steps.compute("b", other_noop)), id="callable swapped"),
        pytest.param(lambda: shape(steps.compute("c", noop)), id="step renamed"),
        pytest.param(lambda: shape(steps.compute("b", noop), version=2), id="version bump"),
        pytest.param(lambda: shape(steps.compute("b", noop), trigger="w.went"), id="trigger"),
        pytest.param(lambda: shape(steps.compute("b", noop), key="fixed"), id="key"),
        pytest.param(lambda: shape(steps.compute("b", noop), awaits={"k": "e"}), id="awaits"),
    ],
)
def test_fingerprint_differs_when_the_structure_changes(changed):
    base = shape(steps.compute("b", noop))

    assert changed().fingerprint != base.fingerprint


def test_fingerprint_of_nested_steps_sees_changes_inside_arms():
    def nested(then):
        return build([steps.branch(noop, then=then, else_=[steps.compute("e", noop)])])

    base = nested([steps.wait("PT1H")])

    assert nested([steps.wait("PT1H")]).fingerprint == base.fingerprint
    assert nested([steps.wait("PT2H")]).fingerprint != base.fingerprint
    assert nested([steps.wait("PT1H"), steps.wait("PT1H")]).fingerprint != base.fingerprint
    assert set(base.step_fingerprints) == {"workflow", "0", "0.then.0", "0.else.0"}


def test_changes_since_names_the_changed_steps():
    before = shape(steps.compute("b", noop))

    swapped = shape(steps.compute("b", other_noop))
    assert swapped.changes_since(before.step_fingerprints) == "step 2 (compute 'b') changed"
    grown = shape(steps.compute("b", noop), steps.compute("c", noop))
    assert grown.changes_since(before.step_fingerprints) == "step 3 (compute 'c') was added"
    shrunk = shape()
    assert shrunk.changes_since(before.step_fingerprints) == "step 2 was removed"
    bumped = shape(steps.compute("b", noop), version=2)
    assert bumped.changes_since(before.step_fingerprints) == (
        "the workflow's trigger, version, awaits or idempotency key changed"
    )
    reordered = build(
        [steps.wait("PT1H"), steps.compute("a", noop), steps.compute("b", noop)], key=key_of
    )
    assert reordered.changes_since(before.step_fingerprints) == (
        "step 0 (wait) changed; step 1 (compute 'a') changed"
    )
    assert before.changes_since(before.step_fingerprints) == "its definition changed"
    assert before.changes_since(None) == "its definition changed"


def test_a_static_argument_json_cannot_hold_gets_a_stable_fingerprint():
    class Flag:
        pass

    one = build([steps.branch(Flag(), then=[steps.compute("a", noop)])])
    two = build([steps.branch(Flag(), then=[steps.compute("a", noop)])])

    assert one.fingerprint == two.fingerprint


FINGERPRINT_CHILD = textwrap.dedent(
    """
    import json
    import django
    django.setup()
    from kumiko_workflows.workflow.registry import registry
    print(json.dumps({w.name: [w.fingerprint, w.step_fingerprints] for w in registry.all()}))
    """
)


def test_fingerprints_are_equal_in_another_process():
    here = {w.name: [w.fingerprint, w.step_fingerprints] for w in registry.all()}
    result = subprocess.run(
        [sys.executable, "-c", FINGERPRINT_CHILD],
        cwd=REPO,
        env=subprocess_env(PYTHONHASHSEED="4242"),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert "t-branch" in here
    assert json.loads(result.stdout) == here


# --- durations --------------------------------------------------------------------

NOW = datetime(2026, 1, 31, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("PT90S", NOW + timedelta(seconds=90)),
        ("P1DT2H", NOW + timedelta(days=1, hours=2)),
        ("P2W", NOW + timedelta(weeks=2)),
        ("PT0.5S", NOW + timedelta(seconds=0.5)),
        ("PT1,5M", NOW + timedelta(seconds=90)),
        ("pt1h", NOW + timedelta(hours=1)),
        ("PT0S", NOW),
        ("2026-02-01T10:00:00Z", datetime(2026, 2, 1, 10, tzinfo=UTC)),
        ("2026-02-01T10:00:00+01:00", datetime(2026, 2, 1, 9, tzinfo=UTC)),
        (timedelta(minutes=5), NOW + timedelta(minutes=5)),
        (30, NOW + timedelta(seconds=30)),
        (datetime(2026, 2, 1, 12, tzinfo=timezone(timedelta(hours=2))), NOW + timedelta(hours=25)),
        ("2020-01-01T00:00:00Z", NOW),
        (datetime(2000, 1, 1, tzinfo=UTC), NOW),
    ],
)
def test_wake_time_accepts_durations_and_instants(value, expected):
    assert wake_time(value, NOW) == expected


def test_wake_time_is_in_utc():
    assert wake_time("2026-02-01T10:00:00+01:00", NOW).utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "value, message",
    [
        ("-PT1S", "'-PT1S' is negative; a wait cannot go back in time"),
        ("PT", "'PT' is not an ISO 8601 duration (examples: PT90S"),
        ("P", "'P' is not an ISO 8601 duration"),
        ("P1DT", "'P1DT' is not an ISO 8601 duration"),
        ("P1M", "'P1M' uses years or months, which have no fixed length; use days or weeks"),
        ("P1Y", "uses years or months"),
        ("1 hour", "'1 hour' is neither an ISO 8601 duration (PT1H) nor an instant"),
        ("", "'' is neither an ISO 8601 duration"),
        ("2026-02-01T10:00:00", "'2026-02-01T10:00:00' has no UTC offset; add Z or +01:00"),
        (NAIVE, "2026-01-31T09:00:00 is a naive datetime; give it a time zone"),
        (timedelta(seconds=-1), "is negative; a delay cannot go back in time"),
        (-5, "-5 is negative"),
        (math.nan, "nan is not a number of seconds"),
        (True, "True is not a duration"),
        (None, "None is not a duration"),
        ("P" + "9" * 70 + "D", "is not an ISO 8601 duration"),
        ("P999999999D", "'P999999999D' is longer than 1000 years"),
        (timedelta(days=999_999_999), "is longer than 1000 years"),
        ("9999-12-31T23:00:00-14:00", "is out of range"),
    ],
)
def test_wake_time_refuses_the_rest(value, message):
    with pytest.raises(InvalidDuration) as info:
        wake_time(value, NOW)

    assert message in str(info.value)


def test_parse_helpers():
    assert parse_duration("P1DT2H3M4S") == timedelta(days=1, hours=2, minutes=3, seconds=4)
    assert parse_instant("2026-02-01T10:00:00Z") == datetime(2026, 2, 1, 10, tzinfo=UTC)
    assert as_delay("PT10S") == as_delay(10) == as_delay(timedelta(seconds=10))
    with pytest.raises(InvalidDuration, match="is not an ISO 8601 instant"):
        parse_instant(5)


def test_wake_time_near_the_end_of_the_calendar_is_refused_not_overflowing():
    late = datetime(9999, 12, 31, tzinfo=UTC)

    with pytest.raises(InvalidDuration, match="from now is out of range"):
        wake_time("P7D", late)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)
ANYTHING = JSONISH | st.datetimes(timezones=st.none() | st.timezones()) | st.timedeltas()


@hypothesis_settings(deadline=None, max_examples=150)
@given(st.one_of(ANYTHING, st.text(max_size=30), st.from_regex(r"-?P\d*[YMWD]?T?\d*[HMS]?")))
def test_durations_raise_only_invalid_duration(value):
    for parse in (lambda v: wake_time(v, NOW), parse_duration, parse_instant, as_delay):
        try:
            result = parse(value)
        except InvalidDuration:
            continue
        if isinstance(result, datetime):
            assert result >= NOW or parse is parse_instant


# --- match expressions -------------------------------------------------------


def expr(op, path=("a",)):
    return atom(list(path), op)


@pytest.mark.parametrize(
    "op, actual, expected",
    [
        ({"kind": "eq", "value": 1}, 1, True),
        ({"kind": "eq", "value": 1}, 1.0, True),
        ({"kind": "eq", "value": 1}, "1", False),
        ({"kind": "eq", "value": 1}, True, False),
        ({"kind": "eq", "value": True}, True, True),
        ({"kind": "eq", "value": None}, None, True),
        ({"kind": "ne", "value": 1}, 2, True),
        ({"kind": "ne", "value": 1}, "1", True),
        ({"kind": "ne", "value": 1}, 1, False),
        ({"kind": "gt", "value": 1}, 2, True),
        ({"kind": "gt", "value": 1}, 1, False),
        ({"kind": "gte", "value": 1}, 1, True),
        ({"kind": "lt", "value": 1}, 0.5, True),
        ({"kind": "lte", "value": 1}, 2, False),
        ({"kind": "gt", "value": "b"}, "c", True),
        ({"kind": "lt", "value": "b"}, "a", True),
        ({"kind": "gt", "value": 1}, "2", False),
        ({"kind": "gt", "value": "1"}, 2, False),
        ({"kind": "gte", "value": 1}, True, False),
        ({"kind": "gte", "value": False}, False, False),
        ({"kind": "lt", "value": 1}, None, False),
        ({"kind": "lt", "value": 5}, [1], False),
        ({"kind": "in", "values": [1, "x", None]}, "x", True),
        ({"kind": "in", "values": [1, "x"]}, 2, False),
        ({"kind": "in", "values": [1]}, True, False),
        ({"kind": "in", "values": []}, 1, False),
    ],
)
def test_match_ops(op, actual, expected):
    expression = validate(expr(op))

    assert matches(expression, {"a": actual}) is expected


def test_missing_paths_match_nothing_but_ne_and_or():
    assert not matches(expr({"kind": "eq", "value": None}), {})
    assert not matches(expr({"kind": "ne", "value": 1}), {})
    assert not matches(expr({"kind": "lt", "value": 1}), {"b": 0})
    assert not matches(expr({"kind": "eq", "value": 1}, ["a", "b"]), {"a": 1})
    assert not matches(expr({"kind": "eq", "value": 1}, ["a", "b"]), "not a dict")


def test_paths_walk_dicts_and_list_indexes():
    payload = {"order": {"lines": [{"sku": "x"}, {"sku": "y"}]}}

    assert matches(expr({"kind": "eq", "value": "y"}, ["order", "lines", 1, "sku"]), payload)
    assert matches(expr({"kind": "eq", "value": "y"}, ["order", "lines", -1, "sku"]), payload)
    assert not matches(expr({"kind": "eq", "value": "y"}, ["order", "lines", 2, "sku"]), payload)
    assert not matches(expr({"kind": "eq", "value": "x"}, ["order", "lines", "0", "sku"]), payload)
    assert not matches(expr({"kind": "eq", "value": 1}, ["order", 0]), payload)


def test_and_or_combine():
    a1 = expr({"kind": "eq", "value": 1})["expr"]
    b2 = expr({"kind": "eq", "value": 2}, ["b"])["expr"]
    both = validate({"version": 1, "expr": {"kind": "and", "nodes": [a1, b2]}})
    either = validate({"version": 1, "expr": {"kind": "or", "nodes": [a1, b2]}})

    assert matches(both, {"a": 1, "b": 2})
    assert not matches(both, {"a": 1, "b": 3})
    assert matches(either, {"a": 0, "b": 2})
    assert not matches(either, {"a": 0, "b": 0})
    assert matches(None, {"anything": True})


@pytest.mark.parametrize(
    "expression, message",
    [
        ("x", "match expression: must be a dict like {'version': 1, 'expr': ...}, got str"),
        ({"version": 1}, "has no 'expr'"),
        ({"version": 1, "expr": EQ_A["expr"], "extra": 1}, "unknown keys ['extra']"),
        ({"version": 1.0, "expr": EQ_A["expr"]}, "['version']: must be 1, got 1.0"),
        ({"version": True, "expr": EQ_A["expr"]}, "['version']: must be 1, got True"),
        ({"version": 1, "expr": {"kind": ["and"]}}, "['expr']['kind']: must be 'and', 'or'"),
        (expr({"kind": ["eq"], "value": 1}), "['expr']['op']['kind']: unknown op \"['eq']\""),
        (expr({"kind": "eq", "value": 1}, []), "['expr']['path']: must be a non-empty list"),
        (expr({"kind": "eq", "value": 1}, ["a"] * 17), "['path']: is longer than 16 keys"),
        (expr({"kind": "eq", "value": 1}, [True]), "['path'][0]: must be a string or an int"),
        (expr({"kind": "in", "values": "ab"}), "['expr']['op']['values']: must be a list"),
        (expr({"kind": "in", "values": [{}]}), "['op']['values'][0]: must be a string, number"),
        (expr({"kind": "in", "value": [1]}), "an 'in' op takes exactly 'kind' and 'values'"),
        (expr("eq"), "['expr']['op']: must be a dict with a 'kind'"),
        ({"version": 1, "expr": {"kind": "atom", "path": ["a"]}}, "takes exactly 'kind', 'path'"),
        (
            {"version": 1, "expr": {"kind": "or", "nodes": [EQ_A["expr"]] * 300}},
            "the expression has more than 256 nodes",
        ),
        (expr({"kind": "eq", "value": "x" * 70_000}), "over the limit of 65536"),
    ],
)
def test_malformed_match_expressions_say_what_and_where(expression, message):
    with pytest.raises(InvalidMatchExpression) as info:
        validate(expression)

    assert message in str(info.value)


def test_a_very_deep_expression_is_refused_without_recursing():
    node = EQ_A["expr"]
    for _ in range(5000):
        node = {"kind": "and", "nodes": [node]}

    with pytest.raises(InvalidMatchExpression, match="nested more than 16 levels deep"):
        validate({"version": 1, "expr": node})


MATCH_KEYS = st.sampled_from(["version", "expr", "kind", "nodes", "path", "op", "value", "values"])
MATCH_KINDS = st.sampled_from(["and", "or", "atom", "eq", "ne", "gt", "gte", "lt", "lte", "in"])
EXPRESSIONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | MATCH_KINDS | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(MATCH_KEYS, children, max_size=4)
    ),
    max_leaves=25,
)
ATOMS = st.builds(
    lambda path, kind, value: atom(
        path, {"kind": kind, "values": value} if kind == "in" else {"kind": kind, "value": value}
    ),
    st.lists(st.text(max_size=2) | st.integers(-3, 3), min_size=1, max_size=3),
    MATCH_KINDS,
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
)


@hypothesis_settings(deadline=None, max_examples=200)
@given(st.one_of(EXPRESSIONISH, ATOMS), JSONISH)
def test_validate_raises_only_invalid_match_and_matches_never_raises(expression, payload):
    try:
        valid = validate(expression)
    except InvalidMatchExpression:
        return
    assert isinstance(matches(valid, payload), bool)


def test_cron_workflow_with_an_idempotency_key_is_refused():
    with pytest.raises(WorkflowDefinitionError, match=r"E009.*keyed by their slot"):
        define_workflow(
            name="cron-with-key",
            trigger=on_cron("0 9 * * *"),
            idempotency_key="x",
            steps=[steps.compute("a", noop)],
            register=False,
        )


def test_lambdas_get_a_warning_since_their_bodies_are_not_fingerprinted():
    from django.core import checks as django_checks

    workflow = define_workflow(
        name="with-lambda",
        trigger=on_event("x.happened", filter=lambda event: True),
        steps=[steps.compute("a", noop), steps.branch(if_=lambda ctx: True, then=[])],
        register=False,
    )
    messages = check_workflows(workflows=[workflow])
    assert [(type(m), m.id) for m in messages] == [
        (django_checks.Warning, "kumiko_workflows.W001"),
        (django_checks.Warning, "kumiko_workflows.W001"),
    ]
    assert "the trigger filter" in messages[0].msg and "<lambda>" in messages[0].msg
    assert "step 1 (branch) if_" in messages[1].msg


def test_the_exceptions_the_api_raises_and_the_run_context_are_importable_from_the_package():
    import kumiko_workflows

    names = ("RunNotFound", "RunNotRerunnable", "InvalidEvent", "InvalidArgument", "RunContext")
    for name in names:
        assert name in kumiko_workflows.__all__
        assert getattr(kumiko_workflows, name).__name__ == name
