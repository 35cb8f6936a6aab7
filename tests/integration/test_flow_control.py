"""Flow control: tenants take turns in a resume pass, proven from the run streams' order.

The order runs were resumed in is read from their ``workflow.step.resumed``
events, by id: each is inserted as its run is claimed, in the claiming
transaction. In one process ids are the claim order exactly; across
processes (the PostgreSQL test) an id is taken at insert, not at commit, so
"inserted before" is what the test counts, once every worker has stopped
and every event is committed.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from kumiko_workflows import event_types as et
from kumiko_workflows import resume_due_runs, run_id_for, signals
from kumiko_workflows.engine.worker import Worker
from kumiko_workflows.exceptions import InvalidArgument
from kumiko_workflows.models import Event, RunStatus, WorkflowRun
from tests.support import trigger

pytestmark = pytest.mark.django_db


def _start(tenant: str, count: int, until: str) -> list[uuid.UUID]:
    """``count`` runs of ``t-wait`` in ``tenant``, each waiting until ``until``."""
    keys = [f"{tenant}-{i}" for i in range(count)]
    for key in keys:
        trigger("t.wait", tenant_id=tenant, run_key=key, **{"for": until})
    return [run_id_for("t-wait", key, tenant) for key in keys]


def resumed_tenants() -> list[str]:
    """The tenant of each resumed run, in the order the resumes were inserted (event id)."""
    return list(
        Event.objects.filter(aggregate_type=et.RUN_AGGREGATE_TYPE, type=et.RESUMED)
        .order_by("id")
        .values_list("tenant_id", flat=True)
    )


def test_a_pass_takes_a_turn_of_each_tenant_in_turn(settings, past):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_SIZE": 5}
    _start("a-big", 40, past)
    _start("b-small", 3, past)

    report = resume_due_runs()

    assert report.completed == 43
    # One turn of the big tenant (BATCH_SIZE runs, oldest first), then the
    # small one's, then the rest: not the whole backlog first.
    assert resumed_tenants() == ["a-big"] * 5 + ["b-small"] * 3 + ["a-big"] * 35


def test_weights_lengthen_a_tenants_turn(settings, past):
    settings.KUMIKO_WORKFLOWS = {
        **settings.KUMIKO_WORKFLOWS,
        "BATCH_SIZE": 4,
        "TENANT_WEIGHTS": {"b-heavy": 3},
    }
    _start("a-light", 10, past)
    _start("b-heavy", 20, past)

    resume_due_runs()

    assert resumed_tenants() == (
        ["a-light"] * 4 + ["b-heavy"] * 12 + ["a-light"] * 4 + ["b-heavy"] * 8 + ["a-light"] * 2
    )


def test_within_a_tenant_the_oldest_due_run_goes_first(settings, now):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_SIZE": 2}
    runs = []
    for i, wait in enumerate(("PT30M", "PT1M", "PT20M", "PT10M")):
        trigger("t.wait", tenant_id="one", run_key=f"k{i}", **{"for": wait})
        runs.append(run_id_for("t-wait", f"k{i}", "one"))

    resume_due_runs(now=now + timedelta(hours=1))

    order = list(
        Event.objects.filter(type=et.RESUMED).order_by("id").values_list("aggregate_id", flat=True)
    )
    assert order == [runs[1], runs[3], runs[2], runs[0]]


@pytest.mark.django_db(transaction=True)
def test_a_tenant_whose_runs_come_due_during_a_pass_joins_it(settings, now):
    # Between rounds the pass looks again (every BATCH_SECONDS, here always).
    settings.KUMIKO_WORKFLOWS = {
        **settings.KUMIKO_WORKFLOWS,
        "BATCH_SIZE": 2,
        "BATCH_SECONDS": 1e-9,
    }
    _start("a-big", 10, "PT0S")

    def start_late(**kwargs):
        # After the first commit of the pass, another tenant's run comes due.
        if not WorkflowRun.objects.filter(tenant_id="c-late").exists():
            trigger("t.wait", tenant_id="c-late", run_key="late", **{"for": "PT0S"})

    signals.run_completed.connect(start_late, dispatch_uid="start_late")
    try:
        resume_due_runs(now=now + timedelta(hours=1))
    finally:
        signals.run_completed.disconnect(dispatch_uid="start_late")

    assert resumed_tenants() == ["a-big"] * 4 + ["c-late"] + ["a-big"] * 6


def test_a_workers_tenants_take_turns_too(settings, past):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_SIZE": 3}
    _start("a-big", 9, past)
    _start("b-small", 2, past)
    _start("c-other", 5, past)  # not this worker's

    Worker(tenants=["a-big", "b-small"], cron=False, heartbeat=False).run_once()

    assert resumed_tenants() == ["a-big"] * 3 + ["b-small"] * 2 + ["a-big"] * 6
    assert WorkflowRun.objects.filter(tenant_id="c-other", status=RunStatus.WAITING).count() == 5


def test_a_limit_still_counts_across_the_turns(settings, past):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "BATCH_SIZE": 2}
    _start("a-big", 6, past)
    _start("b-small", 6, past)

    assert resume_due_runs(limit=5).completed == 5
    assert resumed_tenants() == ["a-big", "a-big", "b-small", "b-small", "a-big"]


def test_bad_tenants_are_refused_before_any_statement():
    with pytest.raises(InvalidArgument, match="tenant_id or tenants, not both"):
        resume_due_runs("acme", tenants=["acme"])
    with pytest.raises(InvalidArgument, match="tenants must be a list"):
        resume_due_runs(tenants="acme")


# --- on PostgreSQL, two --loop workers ------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_small_tenant_is_not_held_up_by_a_big_backlog(tmp_path: Path):
    from tests.integration.test_load import generate_waiting_runs
    from tests.support.faults import Worker as WorkerProcess
    from tests.support.faults import wait_for

    created = timezone.now() - timedelta(minutes=5)
    due = (created + timedelta(seconds=1)).isoformat()
    # "a-big" sorts first: before turns, a pass drained it all before "b-small".
    generate_waiting_runs([f"a{i}" for i in range(20_000)], due, created, tenant="a-big")
    small = generate_waiting_runs([f"b{i}" for i in range(10)], due, created, tenant="b-small")
    workers = [
        WorkerProcess(tmp_path, "--loop", "--no-cron", "--interval", "1", name=f"w{i}")
        for i in range(2)
    ]
    try:
        wait_for(
            lambda: (
                WorkflowRun.objects.filter(run_id__in=small, status=RunStatus.COMPLETED).count()
                == len(small)
            ),
            "the small tenant's runs to complete",
        )
    finally:
        for worker in workers:
            worker.stop()

    order = resumed_tenants()
    last_small = max(i for i, tenant in enumerate(order) if tenant == "b-small")
    before = order[:last_small].count("a-big")
    # Each worker takes at most a turn of the big tenant (BATCH_SIZE = 50)
    # before the small one's, and another while the other takes the small
    # one's: far from 20,000.
    assert before <= 4 * 50, f"{before} runs of a-big were resumed before b-small's last"
    assert order.count("b-small") == len(small)
