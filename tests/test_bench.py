"""``manage.py kumiko_bench`` runs every scenario at a tiny size and leaves nothing behind.

No timings are asserted: the figures depend on the machine. Worker processes
need committed rows, hence ``transaction=True``.
"""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from kumiko_workflows.definition import registry
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from tests.conftest import on_postgres

pytestmark = pytest.mark.django_db(transaction=True)


def _bench(*args: str) -> str:
    out = StringIO()
    # The bench registers its own workflows: keep them out of the other tests.
    with registry.override():
        call_command("kumiko_bench", *args, "--rounds", "1", stdout=out)
    return out.getvalue()


def _tables() -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.table_names(cursor))


def test_every_scenario_prints_its_result_lines_and_removes_its_scratch_data(tmp_path):
    tables = _tables()
    report = tmp_path / "bench.json"

    output = _bench("--n", "20", "--json", str(report))

    for name in ("append", "start", "drain", "scan", "memory"):
        assert re.search(
            rf"^RESULT name=kumiko_{name} n=\d+ seconds=[\d.]+ per_sec=[\d.]+$", output, re.M
        ), output
    for name in ("append", "drain"):
        assert re.search(rf"^RATIO name={name} value=[\d.]+$", output, re.M), output
    # With 20 rows the planner may rightly prefer a sequential scan.
    assert re.search(r"^SCAN ms=[\d.]+ index=(yes|no)$", output, re.M), output
    if on_postgres():
        assert re.search(r"^RESULT name=kumiko_wake n=20 ", output, re.M), output
        assert re.search(r"^RATIO name=drain_2 value=", output, re.M), output
        assert re.search(r"^RATIO name=drain_2_vs_1 value=", output, re.M), output
    else:
        assert "SKIPPED name=kumiko_wake reason=needs PostgreSQL" in output
        assert "SKIPPED name=kumiko_drain_2" in output
    assert "scenario" in output and "per sec" in output  # the table for people
    assert '"results"' in report.read_text()

    tenant = re.search(r"tenant=(kumiko-bench-\w+)", output).group(1)
    assert not Event.objects.filter(tenant_id=tenant).exists()
    assert not WorkflowRun.objects.filter(tenant_id=tenant).exists()
    assert not WorkflowRunPending.objects.filter(tenant_id=tenant).exists()
    assert _tables() == tables


def test_the_users_rows_are_left_alone():
    from kumiko_workflows import append_event

    mine = append_event("6f1c2e1a-7a51-4bb8-9d5e-2b1d4a0c9e11", "note", "note.added", {"n": 1})

    _bench("--n", "5", "--scenario", "append", "--scenario", "scan")

    assert list(Event.objects.values_list("pk", flat=True)) == [mine.pk]


def test_an_unknown_scenario_is_refused():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="invalid choice"):
        call_command("kumiko_bench", "--scenario", "nope")
