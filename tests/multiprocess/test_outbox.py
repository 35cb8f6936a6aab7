"""The outbox: appends in a transaction on the site's database, relayed to the engine's.

A real site in subprocesses (``tests/settings_outbox.py``: the engine on
``workflows``, the site and its outbox on ``default``), two PostgreSQL
databases or two SQLite files. A rolled-back site transaction leaves no
event, run or signal anywhere; a committed one always gets its run: relayed
by the process right after its commit, or, when that process was SIGKILLed
right after the commit, by the next worker pass, exactly once; a relay
killed between the engine's commit and the outbox row's deletion appends
nothing twice; racing relays (PostgreSQL) relay each row once, each stream
in order.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid

import pytest

from tests.multiprocess import test_database_alias
from tests.support import REPO, subprocess_env

# Fixtures: two databases (two PostgreSQL databases, or two SQLite files), migrated.
two_databases = test_database_alias.two_databases
site_and_engine = test_database_alias.site_and_engine

SETTINGS = "tests.settings_outbox"


def _env(names, **extra):
    env = subprocess_env(
        DJANGO_SETTINGS_MODULE=SETTINGS,
        KUMIKO_TEST_ALIAS_DEFAULT=names[0],
        KUMIKO_TEST_ALIAS_WORKFLOWS=names[1],
        **extra,
    )
    env.pop("KUMIKO_TEST_DB_NAME", None)
    return env


def _run(args, names, timeout=180, returncode=0, **extra):
    result = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=_env(names, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == returncode, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def _json(names, *args):
    out = _run(["-m", "tests.support.alias_outbox", *args], names)
    return json.loads(out.strip().splitlines()[-1])


def _killed(names, *args):
    """Run ``tests.support.alias_outbox ARGS``, which must die of SIGKILL; its stdout."""
    return _run(["-m", "tests.support.alias_outbox", *args], names, returncode=-signal.SIGKILL)


def _pass(names, returncode=0, **extra):
    """One worker pass, a process of its own (``manage.py resume_due_runs``); its summary."""
    manage = str(REPO / "manage.py")
    out = _run([manage, "resume_due_runs", "--no-cron"], names, returncode=returncode, **extra)
    return out.strip().splitlines()[-1]


NOTHING = {"group": False, "events": [], "run": None, "signals": [], "outbox": 0, "records": 0}
STARTED = {
    "group": True,
    "events": ["t.recorded", "t.wait"],  # the trigger and the first step's side event
    "run": "waiting",
    "signals": ["run_started", "run_suspended"],
    "outbox": 0,
    "records": 0,
}
#: What a killed process's case leaves once relayed by another (its signals were heard there).
RELAYED = {**STARTED, "signals": []}


def _picked(seen, keys):
    return {key: seen[key] for key in keys}


@pytest.mark.django_db
def test_an_append_in_the_sites_transaction_commits_and_rolls_back_with_it(site_and_engine):
    seen = _json(site_and_engine, "cases")

    # Rolled back: nothing anywhere, no signal.
    assert _picked(seen["site_rollback"], NOTHING) == NOTHING, seen["site_rollback"]
    # Committed: inside the block only the outbox row (the Event returned unsaved, with
    # its relay id); after the commit, relayed: the event, the run, the signals.
    commit = seen["site_commit"]
    assert commit["returned"] == [None, None, True], commit
    assert (commit["outbox_inside"], commit["events_inside"], commit["heard_inside"]) == (1, 0, [])
    assert _picked(commit, STARTED) == STARTED, commit

    # Open on both aliases (either outermost): the outbox too; relayed once both committed.
    for name in ("both_commit", "both_site_outer_commit"):
        both = seen[name]
        assert _picked(both, STARTED) == STARTED, (name, both)
        assert (both["heard_inside"], both["events_after_inner"]) == ([], 0), (name, both)
    assert _picked(seen["both_site_outer_rollback"], NOTHING) == NOTHING
    # The engine's block outermost, rolled back after the site's committed: the site's
    # write stands, and so does its append, left in the outbox for the next pass.
    rolled = seen["both_rollback"]
    assert _picked(rolled, NOTHING) == {**NOTHING, "group": True, "outbox": 1}, rolled

    # expected_version cannot be checked before the relay: refused, the caller's block goes on.
    refused = seen["expected_version"]
    assert refused["expected_version"].startswith(
        "append_event() with expected_version=0 was called inside a transaction on database "
        "'default': the append goes to its outbox"
    ), refused
    assert _picked(refused, NOTHING) == {**NOTHING, "group": True}, refused
    # Bad input raises at the call, as for any append, and writes nothing.
    bad = seen["bad_input"]
    assert "not JSON-serialisable" in bad["payload"] and "NUL" in bad["tenant"], bad
    assert bad["identity"].endswith("is a stream of aggregate type 'other', not 't'"), bad
    assert _picked(bad, NOTHING) == {**NOTHING, "group": True}, bad

    # One transaction's appends to a stream reach it in their order.
    assert seen["in_order"]["seqs"] == [0, 1, 2, 3, 4], seen["in_order"]
    # No transaction, or one on the engine's alias only: appended at once, as before.
    assert seen["direct"]["direct"] == [1, 2, None, None], seen["direct"]
    # A resume pass inside the site's transaction is refused; so is cancel_run (its
    # writes cannot go through an outbox).
    refusals = seen["refusals"]
    assert refusals["resume_due_runs"].startswith(
        "resume_due_runs() was called inside a transaction on database 'default'"
    ), refusals
    assert refusals["cancel_run"].startswith("cancel_run() was called inside a transaction")
    assert refusals["pass_in_both"].startswith("resumed=0"), refusals

    # The leftover of the rolled-back engine block: the next pass relays it.
    assert "relayed=1" in _pass(site_and_engine)
    after = _json(site_and_engine, "read", rolled["key"])
    assert after == RELAYED, after


@pytest.mark.django_db
def test_a_process_killed_right_after_its_commit_gets_its_run_from_the_next_pass(site_and_engine):
    key = f"killed-{uuid.uuid4().hex[:8]}"
    _killed(site_and_engine, "die-after-commit", key)

    # Committed, not relayed: the site's write and the outbox row, nothing on the engine's.
    left = _json(site_and_engine, "read", key)
    assert left == {**NOTHING, "group": True, "outbox": 1}, left
    # workflow_status shows the backlog; --check fails once it is older than --max-lag.
    manage = str(REPO / "manage.py")
    status = json.loads(_run([manage, "workflow_status", "--json"], site_and_engine))
    backlog = status["outbox"]["default"]
    assert (backlog["waiting"], backlog["held"], backlog["last_error"]) == (1, 0, None), backlog
    assert backlog["oldest_seconds"] >= 0, backlog
    check = [manage, "workflow_status", "--check", "--json", "--max-heartbeat-age", "off"]
    verdict = json.loads(_run([*check, "--max-lag", "0.001"], site_and_engine, returncode=1))
    assert verdict["healthy"] is False and verdict["outbox"]["default"]["waiting"] == 1, verdict
    assert verdict["problems"][0].startswith("the outbox on 'default' has an append waiting"), (
        verdict
    )

    assert "relayed=1" in _pass(site_and_engine)
    assert _json(site_and_engine, "read", key) == RELAYED
    verdict = json.loads(_run([*check, "--max-lag", "0.001"], site_and_engine))
    assert verdict["outbox"]["default"]["waiting"] == 0, verdict
    # Exactly once: another pass relays nothing, the stream has its one trigger.
    assert "relayed" not in _pass(site_and_engine)
    assert _json(site_and_engine, "read", key) == RELAYED


@pytest.mark.django_db
def test_a_relay_killed_after_the_engines_commit_appends_nothing_twice(site_and_engine):
    key = f"relay-{uuid.uuid4().hex[:8]}"
    _killed(site_and_engine, "die-in-relay", key)

    # Appended on the engine's database, the outbox row not yet deleted, the record there.
    left = _json(site_and_engine, "read", key)
    assert left == {**RELAYED, "outbox": 1, "records": 1}, left

    # The next pass finds the record: it deletes the row and appends nothing.
    assert "relayed" not in _pass(site_and_engine)
    assert _json(site_and_engine, "read", key) == RELAYED


@pytest.mark.postgres
@pytest.mark.django_db
def test_racing_relays_relay_each_leftover_once_each_stream_in_order(site_and_engine, tmp_path):
    # 900 leftovers: 300 streams of 3 rows; 4 racers taking 25 rows a round.
    streams = json.loads(_killed(site_and_engine, "leave", "300", "3").strip().splitlines()[0])
    go = tmp_path / "go"
    racers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.alias_outbox", "race", str(go), "25"],
            cwd=REPO,
            env=_env(site_and_engine),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    # Go once all four are connected and waiting.
    for racer in racers:
        line = racer.stdout.readline()
        assert line.strip() == "ready", f"a racer did not start: {line!r}"
    go.touch()
    reports = []
    for racer in racers:
        out, err = racer.communicate(timeout=180)
        assert racer.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))

    # Each relayed once (none found relayed already: SKIP LOCKED kept the racers apart),
    # shared out between them, each stream in order.
    assert sum(report["relayed"] for report in reports) == 900, reports
    assert sum(report["repeated"] for report in reports) == 0, reports
    assert sum(1 for report in reports if report["relayed"]) >= 2, reports
    seqs = _json(site_and_engine, "streams", *streams)
    assert seqs == {stream: [0, 1, 2] for stream in streams}, seqs
    assert _json(site_and_engine, "read", "none")["records"] == 0


@pytest.mark.django_db
def test_a_missing_outbox_table_is_a_check_error_and_a_clear_refusal(site_and_engine):
    manage = str(REPO / "manage.py")
    _run([manage, "check", "--database", "default", "--fail-level", "WARNING"], site_and_engine)
    seen = _json(site_and_engine, "without-table", f"nt-{uuid.uuid4().hex[:8]}")
    assert seen["refused"].startswith(
        "append_event() was called inside a transaction on database 'default', which "
        "KUMIKO_WORKFLOWS['OUTBOX_DATABASES'] lists, but 'default' has no outbox table"
    ), seen
    assert seen["group"] is True, seen

    checked = subprocess.run(
        [sys.executable, manage, "check", "--database", "default"],
        cwd=REPO,
        env=_env(site_and_engine),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 1 and "kumiko_workflows.E057" in checked.stderr, checked.stderr
    # The migration before the outbox's, whatever its number: faked back, then migrated again.
    assert re.search(
        r"migrate kumiko_workflows 00\d\d_\w+ --fake --database default", checked.stderr
    )


def test_outbox_settings_are_checked(settings):
    from kumiko_workflows.checks import check_settings

    def ids(value):
        settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "OUTBOX_DATABASES": value}
        return [
            error.id
            for error in check_settings()
            if error.id in ("kumiko_workflows.E055", "kumiko_workflows.E056")
        ]

    assert ids(["default"]) == ["kumiko_workflows.E056"]  # the engine's own alias here
    assert ids("default") == ["kumiko_workflows.E055"]  # a string, not a list
    assert ids(["nowhere"]) == ["kumiko_workflows.E055"]
    assert ids([]) == []


@pytest.mark.django_db
def test_a_relay_that_keeps_failing_holds_its_row_visibly_and_its_stream_waits(site_and_engine):
    big, other = json.loads(_killed(site_and_engine, "leave-one-too-big").strip().splitlines()[0])
    # The relaying processes' limit is lower than the caller's was: the first row of the
    # big stream fails each pass (the command exits 1, saying so); its stream's second
    # row waits behind it; the other stream is relayed.
    smaller = {"KUMIKO_TEST_MAX_PAYLOAD_BYTES": "1000"}
    summaries = [_pass(site_and_engine, returncode=1, **smaller) for _ in range(3)]
    assert "relayed=1 relay_errors=1" in summaries[0], summaries
    assert all("relay_errors=1" in line for line in summaries[1:]), summaries
    # Held after MAX_RESUME_ERRORS (3) failures: no longer tried, shown, --check fails.
    assert "relay" not in _pass(site_and_engine, **smaller)
    manage = str(REPO / "manage.py")
    backlog = json.loads(_run([manage, "workflow_status", "--json"], site_and_engine))["outbox"]
    assert (backlog["default"]["waiting"], backlog["default"]["held"]) == (2, 1), backlog
    assert backlog["default"]["last_error"].startswith("InvalidEvent: payload is "), backlog
    check = [manage, "workflow_status", "--check", "--max-heartbeat-age", "off"]
    unhealthy = subprocess.run(
        [sys.executable, *check],
        cwd=REPO,
        env=_env(site_and_engine),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unhealthy.returncode == 1, unhealthy.stderr
    assert "the outbox on 'default' holds 1 append(s) whose relay failed" in unhealthy.stderr
    assert _json(site_and_engine, "streams", big, other) == {big: [], other: [0]}
    # The admin's run list says so, above the runs.
    admin = _json(site_and_engine, "admin-outbox")
    assert admin["status"] == 200, admin
    assert "the outbox on &#x27;default&#x27; holds 1 append(s)" in admin["outbox"], admin

    # The cause fixed (the limit back), the rows tried again: both, in order.
    _run(["-m", "tests.support.alias_outbox", "requeue"], site_and_engine)
    assert "relayed=2" in _pass(site_and_engine)
    assert _json(site_and_engine, "streams", big, other) == {big: [0, 1], other: [0]}
    assert _json(site_and_engine, "admin-outbox") == {"status": 200, "outbox": ""}
