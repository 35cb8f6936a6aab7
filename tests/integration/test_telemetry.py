"""OpenTelemetry traces and metrics, read back through the SDK's in-memory exporters.

Each test gets providers of its own (``telemetry.configure``), so no span or
count leaks between tests and the rest of the suite runs untraced. Without
the API installed, nothing of OpenTelemetry is imported and runs behave the
same (a child process whose ``import opentelemetry`` fails).
"""

from __future__ import annotations

import re
import textwrap
from datetime import datetime, timedelta
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from kumiko_workflows import (
    define_workflow,
    on_event,
    resume_due_runs,
    run_id_for,
    steps,
    telemetry,
    telemetry_instruments,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.engine.cron import fire_due_schedules
from kumiko_workflows.engine.worker import Worker
from kumiko_workflows.models import Event, WorkflowRunPending
from kumiko_workflows.workflow.registry import registry
from tests.acceptance.test_docs import DOCS, python_blocks
from tests.support import run_python, trigger, types_of
from tests.testapp import cron_workflows as cw
from tests.testapp import workflows as w

HOUR = timedelta(hours=1)

#: A run that waits, then retries a step that fails on its first attempts
#: (``fail_attempts`` in the trigger's payload), then completes.
traced = define_workflow(
    name="t-otel",
    trigger=on_event("t.otel"),
    idempotency_key=w.run_key,
    steps=[
        steps.compute("before", w.record("before")),
        steps.wait(w.payload_value("for", "PT1H")),
        steps.retry(
            times=2, backoff="linear", base_delay="PT1S", do=[steps.compute("gate", w.gate)]
        ),
        steps.compute("after", w.record("after")),
    ],
    register=False,
)


class Otel:
    """The SDK's in-memory span exporter and metric reader, installed for one test."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        found = self.spans.get_finished_spans()
        return [span for span in found if name is None or span.name == name]

    def metrics(self) -> dict[str, dict[frozenset[tuple[str, Any]], Any]]:
        """Data points by metric name, then by their attributes."""
        points: dict[str, dict[frozenset[tuple[str, Any]], Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        key = frozenset((point.attributes or {}).items())
                        points.setdefault(metric.name, {})[key] = point
        return points

    def value(self, name: str, **attributes: Any) -> Any:
        """A counter's or gauge's value (a histogram's count) at exactly ``attributes``."""
        key = frozenset({f"kumiko.{k}": v for k, v in attributes.items()}.items())
        point = self.metrics().get(name, {}).get(key)
        if point is None:
            return 0
        return point.count if hasattr(point, "bucket_counts") else point.value


@pytest.fixture
def otel():
    installed = Otel()
    telemetry.configure(installed.tracer_provider, installed.meter_provider)
    try:
        yield installed
    finally:
        telemetry.configure()
        installed.tracer_provider.shutdown()
        installed.meter_provider.shutdown()


def _children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def _no_secret_anywhere(spans: list[ReadableSpan]) -> None:
    """No payload data and no exception message: every test error says "secret-detail"."""
    for span in spans:
        texts = [str(span.attributes), str(span.status.description), span.name]
        texts += [str(event.attributes) for event in span.events]
        assert not [text for text in texts if "secret" in text or "4242" in text], span.to_json()
        assert not span.events, span.to_json()  # no exception event: it holds the message


@pytest.mark.django_db
def test_the_span_tree_of_a_run_that_waits_and_retries_is_linked_across_suspensions(otel):
    request_tracer = otel.tracer_provider.get_tracer("the-site")
    with registry.override(traced), request_tracer.start_as_current_span("POST /orders") as request:
        event = trigger("t.otel", fail_attempts=1)
    run_id = run_id_for("t-otel", event.payload["run_key"], "default")
    moment = event.created_at + 2 * HOUR
    with registry.override(traced):
        assert resume_due_runs(now=moment).suspended == 1  # attempt 1 failed: retry scheduled
        assert resume_due_runs(now=moment + HOUR).completed == 1
    spans = otel.finished()
    _no_secret_anywhere(spans)

    # The start: a child of the request that appended the trigger event.
    (start,) = otel.finished("start t-otel")
    assert start.parent is not None and start.parent.span_id == request.get_span_context().span_id
    assert (
        start.context is not None and start.context.trace_id == request.get_span_context().trace_id
    )
    assert dict(start.attributes or {}) == {
        "kumiko.workflow": "t-otel",
        "kumiko.workflow_version": 1,
        "kumiko.tenant": "default",
        "kumiko.run_id": str(run_id),
        "kumiko.outcome": "suspended",
    }
    before, waiting = _children(spans, start)
    assert (before.name, waiting.name) == ("compute 'before'", "wait")
    assert dict(before.attributes or {}) == {
        "kumiko.run_id": str(run_id),
        "kumiko.workflow": "t-otel",
        "kumiko.workflow_version": 1,
        "kumiko.tenant": "default",
        "kumiko.step": "0",
        "kumiko.step_kind": "compute",
        "kumiko.attempt": 1,
        "kumiko.outcome": "completed",
    }
    assert (waiting.attributes or {})["kumiko.outcome"] == "suspended"
    assert waiting.status.status_code == StatusCode.UNSET

    # Each resumed segment starts a trace of its own, linked to the start.
    first, second = otel.finished("resume t-otel")
    for segment in (first, second):
        assert segment.parent is None
        assert [link.context.span_id for link in segment.links] == [start.context.span_id]
        assert [link.context.trace_id for link in segment.links] == [start.context.trace_id]
        assert (segment.attributes or {})["kumiko.run_id"] == str(run_id)
        assert (segment.attributes or {})["kumiko.workflow_version"] == 1
    # The position of the suspension: the wait's (the segment goes on after it).
    assert {k: (first.attributes or {})[k] for k in ("kumiko.step", "kumiko.suspension")} == {
        "kumiko.step": "1",
        "kumiko.suspension": "wait",
    }
    assert (first.attributes or {})["kumiko.outcome"] == "suspended"
    assert (second.attributes or {})["kumiko.suspension"] == "retry"
    assert (second.attributes or {})["kumiko.attempt"] == 2
    assert (second.attributes or {})["kumiko.outcome"] == "completed"

    # The failed attempt: its step span has the error class and the reason, no message.
    (retry,) = _children(spans, first)
    assert (retry.name, (retry.attributes or {})["kumiko.outcome"]) == ("retry", "suspended")
    (failed_gate,) = _children(spans, retry)
    assert failed_gate.name == "compute 'gate'"
    assert failed_gate.status.status_code == StatusCode.ERROR
    assert failed_gate.status.description == "step_failed"
    assert {k: (failed_gate.attributes or {})[k] for k in ("error.type", "kumiko.step")} == {
        "error.type": "FlakyError",
        "kumiko.step": "2.do.0",
    }
    assert (failed_gate.attributes or {})["kumiko.attempt"] == 1
    (retry_again, after) = _children(spans, second)
    (passed_gate,) = _children(spans, retry_again)
    assert (passed_gate.attributes or {})["kumiko.attempt"] == 2
    assert passed_gate.status.status_code == StatusCode.UNSET
    assert (after.attributes or {})["kumiko.outcome"] == "completed"

    # The link rode in each suspension's state snapshot.
    context = start.context
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    suspensions = Event.objects.filter(aggregate_id=run_id, type__in=et.SUSPENSIONS)
    assert [e.payload["state"]["trace"] for e in suspensions.order_by("version")] == [
        traceparent,
        traceparent,
    ]


@pytest.mark.django_db
def test_a_failed_run_has_an_error_status_with_its_reason_and_class_only(otel):
    event = trigger("t.fail")
    run_id = run_id_for("t-fail", event.payload["run_key"], "default")
    assert types_of(run_id)[-1] == et.RUN_FAILED
    spans = otel.finished()
    _no_secret_anywhere(spans)
    (start,) = otel.finished("start t-fail")
    assert start.status.status_code == StatusCode.ERROR
    assert start.status.description == "step_failed"
    attributes = dict(start.attributes or {})
    assert attributes["kumiko.outcome"] == "failed"
    assert attributes["kumiko.failure_reason"] == "step_failed"
    assert attributes["error.type"] == "RuntimeError"
    (boom,) = _children(spans, start)
    assert boom.status.status_code == StatusCode.ERROR
    assert (boom.attributes or {})["error.type"] == "RuntimeError"


@pytest.mark.django_db
def test_a_queued_run_links_its_worker_segment_to_the_start_in_the_request(otel):
    from kumiko_workflows import start_in_worker

    with registry.override(traced):
        with start_in_worker():
            event = trigger("t.otel", fail_attempts=0, **{"for": "PT0S"})
        resume_due_runs(now=event.created_at + timedelta(seconds=1))
    (start,) = otel.finished("start t-otel")
    assert (start.attributes or {})["kumiko.outcome"] == "queued"
    assert not _children(otel.finished(), start)  # no step ran in the request
    (resumed, due) = otel.finished("resume t-otel")
    for segment in (resumed, due):
        assert [link.context.span_id for link in segment.links] == [start.context.span_id]


@pytest.mark.django_db
def test_a_duplicate_trigger_and_a_declined_one_say_so(otel):
    with registry.override(traced):
        first = trigger("t.otel", **{"for": "P1D"})
        trigger("t.otel", run_key=first.payload["run_key"])
    starts = otel.finished("start t-otel")
    assert [(s.attributes or {})["kumiko.outcome"] for s in starts] == ["suspended", "duplicate"]
    assert "kumiko.run_id" not in (starts[1].attributes or {})
    assert otel.value("kumiko.claim.conflicts", conflict="start") == 1


@pytest.mark.django_db(transaction=True)
def test_metric_values_after_a_known_sequence_of_runs(otel):
    with registry.override(traced):
        quick = trigger("t.otel", fail_attempts=0)  # resumes once, completes
        retried = trigger("t.otel", fail_attempts=1)  # resumes, retries, resumes, completes
        trigger("t.otel", run_key=quick.payload["run_key"])  # the run exists: a conflict
        trigger("t.fail")  # fails at once
        moment = retried.created_at + 2 * HOUR
        first = resume_due_runs(now=moment)
        second = resume_due_runs(now=moment + HOUR)
    assert (first.completed, first.suspended, second.completed) == (1, 1, 1)

    assert otel.value("kumiko.runs.started", workflow="t-otel") == 2
    assert otel.value("kumiko.runs.started", workflow="t-fail") == 1
    assert otel.value("kumiko.runs.completed", workflow="t-otel") == 2
    assert otel.value("kumiko.runs.failed", workflow="t-fail", failure_reason="step_failed") == 1
    assert otel.value("kumiko.resumes", workflow="t-otel") == 3
    assert otel.value("kumiko.claim.conflicts", conflict="start") == 1

    # Resume lag: due (the wait's end, an hour after the trigger) to resumed.
    (lag,) = otel.metrics()["kumiko.resume.lag"].values()
    assert lag.count == 3
    assert tuple(lag.explicit_bounds) == telemetry_instruments.LAG_BUCKETS  # the buckets it advises
    # Each wait's end as its run recorded it (a step's clock reads after the
    # trigger's insert, so the trigger's created_at is not the wait's start).
    ends = [
        datetime.fromisoformat(wait.payload["wake_at"])
        for wait in Event.objects.filter(type=et.WAITING).order_by("id")
    ]
    assert len(ends) == 2
    waited = [(moment - end).total_seconds() for end in ends]
    waited.append((moment + HOUR - (moment + timedelta(seconds=1))).total_seconds())
    assert lag.sum == pytest.approx(sum(waited), abs=0.01)

    durations = otel.metrics()["kumiko.step.duration"]
    counted = {tuple(sorted(dict(key).items())): point.count for key, point in durations.items()}
    step = "kumiko.step"

    def runs_of(workflow: str, position: str, outcome: str) -> int:
        key = (("kumiko.outcome", outcome), (step, position), ("kumiko.workflow", workflow))
        return counted.get(key, 0)

    assert runs_of("t-otel", "0", "completed") == 2  # before, in each start
    assert runs_of("t-otel", "1", "suspended") == 2  # the wait
    assert runs_of("t-otel", "2.do.0", "failed") == 1  # the failed attempt
    assert runs_of("t-otel", "2.do.0", "completed") == 2
    assert runs_of("t-otel", "2", "suspended") == 1  # the retry scheduled
    assert runs_of("t-otel", "3", "completed") == 2
    assert runs_of("t-fail", "0", "failed") == 1


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_start_counts_nothing(otel):
    from django.db import transaction

    with registry.override(traced), pytest.raises(ZeroDivisionError):
        with transaction.atomic():
            trigger("t.otel", fail_attempts=0)
            raise ZeroDivisionError
    assert otel.value("kumiko.runs.started", workflow="t-otel") == 0
    assert len(otel.finished("start t-otel")) == 1  # it did run, and was traced


@pytest.mark.django_db(transaction=True)
def test_worker_cron_and_due_backlog_metrics(otel):
    now = datetime.fromisoformat("2030-01-01T05:00:00+00:00")
    with registry.override(traced, cw.hourly_all):
        # Due now (a zero wait) in two tenants, due tomorrow in a third.
        for tenant in ("acme", "acme", "globex"):
            trigger("t.otel", tenant_id=tenant, fail_attempts=0, **{"for": "PT0S"})
        trigger("t.otel", tenant_id="initech", **{"for": "P1D"})
        assert otel.value("kumiko.runs.due", tenant="acme") == 2
        assert otel.value("kumiko.runs.due", tenant="globex") == 1
        assert otel.value("kumiko.runs.due", tenant="initech") == 0

        fire_due_schedules(now=now)  # the schedule starts: no slot yet
        worker = Worker(tenants=["acme", "globex"])
        worker.run_once(now=now + 2 * HOUR + timedelta(minutes=1))  # two slots, three runs
        worker.run_once()

    assert otel.value("kumiko.cron.slots_fired", workflow="t-cron-hourly-all") == 2
    assert otel.value("kumiko.worker.passes") == 2
    assert otel.value("kumiko.worker.errors", error="run") == 0
    assert otel.value("kumiko.runs.completed", workflow="t-otel") == 3
    assert otel.value("kumiko.runs.due", tenant="acme") == 0
    assert WorkflowRunPending.objects.filter(tenant_id="initech").count() == 1


def test_the_backlog_gauge_never_raises_where_the_database_is_out_of_reach(otel):
    # No django_db mark: pytest-django refuses every query here.
    assert otel.value("kumiko.runs.due", tenant="default") == 0
    assert "kumiko.runs.due" not in otel.metrics()


@pytest.mark.django_db(transaction=True)
def test_without_the_api_nothing_of_opentelemetry_is_imported_and_runs_still_run():
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # "import opentelemetry" now fails

        import django
        django.setup()

        from datetime import timedelta
        from kumiko_workflows import resume_due_runs, run_id_for, telemetry
        from kumiko_workflows.engine.worker import Worker
        from kumiko_workflows.models import WorkflowRun
        from tests.support import trigger

        event = trigger("t.wait", **{"for": "PT1H"})
        run = run_id_for("t-wait", event.payload["run_key"], "default")
        assert WorkflowRun.objects.get(run_id=run).status == "waiting"
        report = Worker(cron=True).run_once(now=event.created_at + timedelta(hours=2))
        assert report.report.completed == 1, report
        failed = trigger("t.fail")
        failed_run = run_id_for("t-fail", failed.payload["run_key"], "default")
        assert WorkflowRun.objects.get(run_id=failed_run).status == "failed"
        assert WorkflowRun.objects.get(run_id=run).status == "completed"
        assert telemetry.trace is None and telemetry._active is None
        loaded = sorted(
            name for name, module in sys.modules.items()
            if name.split(".")[0] == "opentelemetry" and module is not None
        )
        print("LOADED", loaded)
        """
    )
    done = run_python(script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "LOADED []" in done.stdout, done.stdout + done.stderr


class LedgerLocked(Exception):
    pass


@pytest.mark.django_db(transaction=True)
def test_a_resume_that_raises_is_an_error_span_and_counts_nothing(otel):
    """A site's projection raises in one run's resume: rolled back, uncounted, an error span."""
    from kumiko_workflows.store.dispatch import registry as projections

    stuck = trigger("t.wait", **{"for": "PT0S"})
    stuck_id = run_id_for("t-wait", stuck.payload["run_key"], "default")
    fine = trigger("t.wait", **{"for": "PT0S"})

    def explode(event, replaying):
        if event.aggregate_id == stuck_id:
            raise LedgerLocked("secret-detail: the ledger is locked")

    projections.register("test.explode-on-resume", {et.RESUMED}, explode)
    try:
        report = resume_due_runs(now=fine.created_at + timedelta(seconds=1))
    finally:
        projections.unregister("test.explode-on-resume")
    assert (report.completed, report.errors) == (1, 1), report

    assert otel.value("kumiko.resumes", workflow="t-wait") == 1
    assert otel.value("kumiko.runs.completed", workflow="t-wait") == 1
    assert otel.value("kumiko.resume.lag", workflow="t-wait") == 1
    resumes = otel.finished("resume t-wait")
    failed = [s for s in resumes if (s.attributes or {})["kumiko.run_id"] == str(stuck_id)]
    assert [(s.attributes or {})["kumiko.outcome"] for s in failed] == ["error"]
    assert (failed[0].attributes or {})["error.type"] == "LedgerLocked"
    assert failed[0].status.status_code == StatusCode.ERROR
    _no_secret_anywhere(otel.finished())


@pytest.mark.django_db
def test_a_rerun_of_a_failed_run_still_links_to_its_start(otel):
    from kumiko_workflows import rerun_run

    with registry.override(traced):
        # Two failing attempts: the retry gives up and the run fails at resume.
        event = trigger("t.otel", fail_attempts=5, **{"for": "PT0S"})
        run_id = run_id_for("t-otel", event.payload["run_key"], "default")
        moment = event.created_at + timedelta(seconds=1)
        resume_due_runs(now=moment)
        assert resume_due_runs(now=moment + HOUR).failed == 1
        assert rerun_run(run_id)
        resume_due_runs(now=moment + 2 * HOUR)
    (start,) = otel.finished("start t-otel")
    resumes = otel.finished("resume t-otel")
    assert [(s.attributes or {})["kumiko.suspension"] for s in resumes] == [
        "wait",
        "retry",
        "rerun",
    ]
    assert [(s.attributes or {})["kumiko.outcome"] for s in resumes] == [
        "suspended",
        "failed",
        "suspended",
    ]
    for segment in resumes:
        assert [link.context.span_id for link in segment.links] == [start.context.span_id]
    assert resumes[1].status.description == "step_failed"


@pytest.mark.django_db(transaction=True)
def test_the_docs_prometheus_snippet_serves_the_metrics():
    """docs/howto/observability.md: its serve_metrics() in a process of its own, then a scrape."""
    page = (DOCS / "howto" / "observability.md").read_text()
    (block,) = [b.code for b in python_blocks(page) if "def serve_metrics" in b.code]
    script = textwrap.dedent(
        """
        import sys, urllib.request
        from datetime import timedelta
        import django
        django.setup()
        from kumiko_workflows import resume_due_runs
        from tests.support import trigger
        from tests.support.faults import free_port

        namespace = {}
        exec(sys.argv[1], namespace)
        port = free_port()
        namespace["serve_metrics"](port)

        event = trigger("t.wait", **{"for": "PT1H"})
        trigger("t.fail")
        resume_due_runs(now=event.created_at + timedelta(hours=2))
        trigger("t.wait", tenant_id="acme", **{"for": "PT0S"})
        print(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode())
        """
    )
    done = run_python(script, block)
    assert done.returncode == 0, done.stdout + done.stderr

    def sample(name: str, value: str, **labels: str) -> None:
        wanted = "".join(rf'(?=[^}}]*\bkumiko_{k}="{v}")' for k, v in labels.items())
        assert re.search(rf"^{name}\{{{wanted}[^}}]*\}} {value}$", done.stdout, re.M), (
            name,
            labels,
            done.stdout,
        )

    sample("kumiko_runs_started_total", "2.0", workflow="t-wait")
    sample("kumiko_runs_failed_total", "1.0", workflow="t-fail", failure_reason="step_failed")
    sample("kumiko_runs_completed_total", "1.0", workflow="t-wait")
    sample("kumiko_resumes_total", "1.0", workflow="t-wait")
    sample("kumiko_resume_lag_seconds_count", "1.0", workflow="t-wait")
    sample("kumiko_step_duration_seconds_count", "2.0", workflow="t-wait", step="0")
    sample("kumiko_runs_due", "1.0", tenant="acme")


@pytest.mark.django_db
def test_the_queued_gauge_counts_the_runs_a_limit_holds_back(otel, future):
    from kumiko_workflows import resume_due_runs

    for _ in range(3):
        trigger("t.limit-active", key="k", **{"for": future})
    resume_due_runs()  # two hold the key's slots, one queues

    assert otel.value("kumiko.runs.queued", tenant="default", suspension="limited") == 1
    assert otel.value("kumiko.runs.queued", tenant="default", suspension="rate") == 0


@pytest.mark.django_db(transaction=True)
def test_a_batch_adds_its_resume_counts_once_at_its_commit(otel, monkeypatch):
    events = [trigger("t.wait", **{"for": "PT0S"}) for _ in range(5)]
    active = telemetry._active
    assert active is not None
    added: list[tuple[str, int]] = []
    for name in ("resumes", "completed"):
        counter = getattr(active, name)

        def add(amount, attributes=None, *args, _add=counter.add, _name=name, **kwargs):
            added.append((_name, amount))
            return _add(amount, attributes, *args, **kwargs)

        monkeypatch.setattr(counter, "add", add)
    report = resume_due_runs(now=events[-1].created_at + timedelta(seconds=1))
    assert report.completed == 5
    # One batch: one increment of five per counter, not five of one.
    assert sorted(added) == [("completed", 5), ("resumes", 5)]
    assert otel.value("kumiko.resumes", workflow="t-wait") == 5
    assert otel.value("kumiko.runs.completed", workflow="t-wait") == 5
    (lag,) = otel.metrics()["kumiko.resume.lag"].values()
    assert lag.count == 5
