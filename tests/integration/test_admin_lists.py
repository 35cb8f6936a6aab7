"""The big lists' cheap parts: their filters' choices, their capped count, no full-table count.

The choices come from loose index scans (:mod:`kumiko_workflows.store.choices`)
and must be the values the rows have, as Django's own filters list them;
the lists count at most :data:`~kumiko_workflows.admin.lists.COUNT_CAP`
rows and never count, nor read the distinct values of, a whole table.
"""

from __future__ import annotations

import re
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from kumiko_workflows import append_event
from kumiko_workflows.admin.lists import CappedPaginator
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.store.choices import distinct_values
from tests.integration.test_admin_pages import EVENTS, PENDING, RUNS, make_staff, root, scoped
from tests.support import trigger

pytestmark = pytest.mark.django_db

__all__ = ["root", "scoped"]  # fixtures, used by name

TABLES = {
    RUNS: WorkflowRun._meta.db_table,
    EVENTS: Event._meta.db_table,
    PENDING: WorkflowRunPending._meta.db_table,
}


@pytest.fixture
def spread():
    """Runs of two workflows in two tenants, one run with no recorded version, one waiting."""
    trigger("t.fail", tenant_id="acme")
    trigger("t.fail", tenant_id="rival")
    trigger("t.wait", tenant_id="rival", **{"for": "PT1H"})
    old = trigger("t.fail", tenant_id="rival")
    WorkflowRun.objects.filter(tenant_id="rival", trigger_event_id=old.id).update(
        workflow_version=None
    )


def choices(response, parameter):
    """The displayed choices of the list filter by ``parameter``, "All" left out."""
    changelist = response.context["cl"]
    for spec in changelist.filter_specs:
        if parameter in spec.expected_parameters():
            return [choice["display"] for choice in spec.choices(changelist)][1:]
    raise AssertionError(f"no filter by {parameter}")


def test_the_run_list_filters_offer_the_values_the_runs_have(client, root, spread):
    page = client.get(reverse(RUNS))
    assert choices(page, "workflow_name") == ["t-fail", "t-wait"]
    assert choices(page, "workflow_version") == ["1", "—"]  # "—": no version recorded
    assert choices(page, "tenant_id") == ["acme", "rival"]
    # Django's own filters, reading every row, would list the same.
    names = WorkflowRun.objects.order_by("workflow_name").values_list("workflow_name", flat=True)
    assert choices(page, "workflow_name") == list(names.distinct())


def test_the_event_list_offers_every_aggregate_type_an_event_type_has(client, root):
    """``order.paid`` on an invoice's stream, then on an order's: both aggregate types are
    offered (each event type's newest event alone would say "order" only), and no other."""
    for kind in ("invoice", "order"):
        append_event(uuid.uuid4(), kind, "order.paid", {"n": 1}, tenant_id="acme")
    append_event(uuid.uuid4(), "refund", "refund.made", {}, tenant_id="rival")
    events = client.get(reverse(EVENTS))
    assert choices(events, "aggregate_type") == ["invoice", "order", "refund"]
    paid = client.get(reverse(EVENTS), {"type__exact": "order.paid"})
    assert sorted(e.aggregate_type for e in paid.context["cl"].result_list) == ["invoice", "order"]


def test_a_tenant_scoped_user_s_filters_offer_its_tenant_s_values(
    client, django_user_model, scoped, spread
):
    client.force_login(make_staff(django_user_model, "ann", "view_workflowrun", tenant="acme"))
    page = client.get(reverse(RUNS))
    assert choices(page, "workflow_name") == ["t-fail"]
    assert choices(page, "workflow_version") == ["1"]
    assert choices(page, "tenant_id") == ["acme"]


def test_the_event_and_pending_filters_offer_the_values_present(client, root, spread):
    trigger("t.signed-up", tenant_id="acme", user_id="u-1", timeout="P2D")
    events = client.get(reverse(EVENTS))
    types = Event.objects.order_by("type").values_list("type", flat=True).distinct()
    assert choices(events, "type") == list(types)
    kinds = Event.objects.order_by("aggregate_type").values_list("aggregate_type", flat=True)
    assert choices(events, "aggregate_type") == list(kinds.distinct())
    assert choices(events, "tenant_id") == ["acme", "rival"]
    pending = client.get(reverse(PENDING))
    assert choices(pending, "tenant_id") == sorted(
        set(WorkflowRunPending.objects.values_list("tenant_id", flat=True))
    )
    # The workflows the runs have (the pending rows have no index of their own for them).
    assert choices(pending, "workflow_name") == sorted(
        set(WorkflowRun.objects.values_list("workflow_name", flat=True))
    )


def test_distinct_values_reads_each_level_and_the_empty_value():
    trigger("t.fail", tenant_id="b")
    trigger("t.fail", tenant_id="a")
    trigger("t.wait", tenant_id="a", **{"for": "PT1H"})
    columns = ["tenant_id", "workflow_name", "workflow_version"]
    assert distinct_values(WorkflowRun, ["tenant_id"]) == ["a", "b"]
    assert distinct_values(WorkflowRun, columns[:2]) == ["t-fail", "t-wait"]
    assert distinct_values(WorkflowRun, columns[:2], "b") == ["t-fail"]
    assert distinct_values(WorkflowRun, columns[:2], "nobody") == []
    assert distinct_values(WorkflowRun, columns, nullable=True) == [1]
    WorkflowRun.objects.filter(tenant_id="b").update(workflow_version=None)
    assert distinct_values(WorkflowRun, columns, nullable=True) == [1, None]
    assert distinct_values(WorkflowRun, columns, "b", nullable=True) == [None]
    append_event(uuid.uuid4(), "one-event", "t.noted", {}, tenant_id="a")  # no second version
    kinds = ["tenant_id", "aggregate_type"]

    def present(**where):
        rows = Event.objects.filter(tenant_id="a", **where)
        return sorted(set(rows.values_list("aggregate_type", flat=True)))

    assert distinct_values(Event, kinds, "a", where={"version": 1}) == present()
    # Among the rows that meet the condition only.
    assert "one-event" not in present(version=2)
    assert distinct_values(Event, kinds, "a", where={"version": 2}) == present(version=2)


def test_reading_filter_choices_leaves_the_caller_s_jit_setting_as_it_was():
    """The choices' query turns JIT off for itself, not for the rest of the caller's transaction."""
    if connection.vendor != "postgresql":
        pytest.skip("JIT is PostgreSQL's")
    trigger("t.fail", tenant_id="a")

    def jit() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW jit")
            return cursor.fetchone()[0]

    for setting in ("on", "off", "on"):
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('jit', %s, true)", [setting])
        # The test's transaction is the caller's: the query runs at a savepoint in it.
        assert distinct_values(WorkflowRun, ["tenant_id", "workflow_name"]) == ["t-fail"]
        assert jit() == setting


def _whole_table_reads(queries, table):
    """The queries that count every row of ``table`` or read its distinct values."""
    found = []
    for query in queries:
        sql = query["sql"]
        if f'FROM "{table}"' not in sql and f"FROM `{table}`" not in sql:
            continue
        bare_count = "COUNT(" in sql and "LIMIT" not in sql
        distinct = re.search(rf'SELECT DISTINCT "{table}"\.', sql) is not None
        if bare_count or distinct:
            found.append(sql)
    return found


@pytest.mark.parametrize("name", [RUNS, EVENTS, PENDING])
@pytest.mark.parametrize(
    "query",
    [{}, {"status__exact": "failed"}, {"tenant_id__exact": "rival"}, {"q": "nothing"}],
    ids=["all", "filtered", "tenant", "search"],
)
def test_the_lists_never_count_nor_read_a_whole_table(client, root, spread, name, query):
    if "status__exact" in query and name != RUNS:
        query = {"type__exact": "t.fail"} if name == EVENTS else {"suspension_type__exact": "wait"}
    with CaptureQueriesContext(connection) as captured:
        response = client.get(reverse(name), query)
    assert response.status_code == 200
    assert _whole_table_reads(captured.captured_queries, TABLES[name]) == []


def test_a_list_past_the_cap_says_more_than_and_pages_to_the_cap(client, root, spread, monkeypatch):
    monkeypatch.setattr(CappedPaginator, "cap", 2)
    monkeypatch.setattr("kumiko_workflows.admin.runs.WorkflowRunAdmin.list_per_page", 1)
    page = client.get(reverse(RUNS))
    text = page.content.decode()
    assert page.context["cl"].paginator.capped
    assert "more than 2 workflow runs" in text
    assert "Select all matching workflow runs (more than 2)" in text
    assert client.get(reverse(RUNS), {"p": "2"}).status_code == 200
    assert client.get(reverse(RUNS), {"p": "3"}).status_code == 302  # past the cap: no page
    few = client.get(reverse(RUNS), {"tenant_id__exact": "acme"})
    assert not few.context["cl"].paginator.capped
    assert "1 workflow run" in few.content.decode()
    assert "more than" not in few.content.decode()


def test_the_rows_checkboxes_are_django_s_own_markup(client, root, spread):
    from django.contrib import admin

    from kumiko_workflows.admin.runs import WorkflowRunAdmin

    run_admin = admin.site._registry[WorkflowRun]
    assert isinstance(run_admin, WorkflowRunAdmin)
    run = WorkflowRun.objects.first()
    ours = run_admin.action_checkbox(run)
    assert ours == admin.ModelAdmin.action_checkbox(run_admin, run)
    assert ours in client.get(reverse(RUNS)).content.decode()


def test_a_list_filtered_by_when_runs_started_or_finished_is_in_that_order(client, root, spread):
    from datetime import timedelta

    from django.utils import timezone

    since = (timezone.now() - timedelta(days=1)).isoformat()
    started = client.get(reverse(RUNS), {"started_at__gte": since}).context["cl"]
    finished = client.get(
        reverse(RUNS), {"status__exact": "failed", "finished_at__gte": since}
    ).context["cl"]
    plain = client.get(reverse(RUNS)).context["cl"]
    assert started.queryset.query.order_by[0] == "-started_at"
    assert finished.queryset.query.order_by[0] == "-finished_at"
    assert plain.queryset.query.order_by[0] == "-updated_at"
    runs = list(started.result_list)
    assert [run.started_at for run in runs] == sorted((r.started_at for r in runs), reverse=True)
    # A column the user sorts by still comes first.
    by_status = client.get(reverse(RUNS), {"started_at__gte": since, "o": "4"}).context["cl"]
    assert by_status.queryset.query.order_by[0] == "status"
