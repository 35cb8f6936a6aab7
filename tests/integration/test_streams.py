"""Stream identity: a stream's first event fixes its tenant and aggregate type.

Appends from another tenant, or with another aggregate type, are refused with
``StreamIdentityError`` and write nothing; engine streams take only the
engine's event types; and every read of a stream is tenant-scoped, so two
streams with one id in two tenants (which only a race of their first appends
can make) never see each other.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import transaction
from django.urls import reverse

from kumiko_workflows import (
    StreamIdentityError,
    append_event,
    cancel_run,
    define_workflow,
    fire_due_schedules,
    load_stream,
    on_event,
    resume_due_runs,
    run_id_for,
    steps,
    wake_run,
)
from kumiko_workflows import event_types as et
from kumiko_workflows.engine.cron import schedule_id, schedule_overview
from kumiko_workflows.exceptions import InvalidEvent
from kumiko_workflows.models import Event, WorkflowRun
from kumiko_workflows.operations.rebuild import check
from kumiko_workflows.store.stream_ids import engine_stream
from kumiko_workflows.store.streams import RunStream
from kumiko_workflows.workflow.registry import registry
from tests.support import trigger, types_of
from tests.testapp import cron_workflows as cw

pytestmark = pytest.mark.django_db

SECRET = "globex-private-note-7f3a"


def waiting_run(tenant: str, now) -> uuid.UUID:
    """A run of ``tenant`` waiting until an hour after ``now``."""
    event = trigger("t.wait", tenant_id=tenant, **{"for": (now + timedelta(hours=1)).isoformat()})
    return run_id_for("t-wait", event.payload["run_key"], tenant)


def foreign_append(stream, **kwargs):
    arguments = {"tenant_id": "globex"} | kwargs
    return append_event(stream, "order", "order.note", {"note": SECRET}, **arguments)


def refused(call, match="belongs to another tenant"):
    before = Event.objects.count()
    with pytest.raises(StreamIdentityError, match=match) as caught:
        call()
    assert Event.objects.count() == before
    assert "acme" not in str(caught.value)  # nothing about the owner leaks
    return caught.value


# --- the three kinds of stream, across two tenants -----------------------------------


@pytest.mark.parametrize("expected_version", [None, 0, 1, 2, 5])
def test_another_tenant_cannot_append_to_a_run_stream(now, expected_version):
    run_id = waiting_run("acme", now)

    error = refused(lambda: foreign_append(run_id, expected_version=expected_version))

    assert isinstance(error, InvalidEvent)
    assert not Event.objects.filter(payload__note=SECRET).exists()
    # The run is untouched: it can be woken, resumed and finishes.
    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]
    assert wake_run(run_id, by="test") is True
    report = resume_due_runs(tenant_id="acme", now=now + timedelta(minutes=1))
    assert (report.completed, report.errors) == (1, 0), report
    assert WorkflowRun.objects.get(run_id=run_id).status == "completed"


def test_a_refused_foreign_append_leaves_cancel_working(now):
    run_id = waiting_run("acme", now)
    refused(lambda: foreign_append(run_id))

    assert cancel_run(run_id, "customer asked", by="test") is True
    assert WorkflowRun.objects.get(run_id=run_id).status == "cancelled"


def test_another_tenant_cannot_append_to_a_schedule_stream(settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "CRON_TENANTS": lambda: ["acme"]}
    workflow = cw.hourly_all
    stream = schedule_id(workflow.name, "acme")
    start = datetime.fromisoformat("2030-01-01T05:02:00+00:00")
    with registry.override(workflow):
        fire_due_schedules(now=start)

        refused(lambda: foreign_append(stream))
        refused(lambda: foreign_append(stream, expected_version=1))

        # Every later pass still fires the schedule.
        assert fire_due_schedules(now=start + timedelta(hours=1)) == 1
        assert fire_due_schedules(now=start + timedelta(hours=2)) == 1
        assert [row["last_slot"].hour for row in schedule_overview(now=start)] == [7]
    assert [e.type for e in load_stream(stream)] == [
        et.SCHEDULE_STARTED,
        et.SCHEDULE_SLOT_FIRED,
        et.SCHEDULE_SLOT_FIRED,
    ]


def test_a_domain_stream_refuses_another_tenant_and_another_aggregate_type():
    stream = uuid.uuid4()
    append_event(stream, "order", "order.placed", {"n": 1}, tenant_id="acme")

    # Another tenant, whatever aggregate type it claims.
    refused(lambda: append_event(stream, "invoice", "invoice.sent", {"n": SECRET}, "globex"))
    refused(lambda: foreign_append(stream))
    # The same tenant with another aggregate type: the owner may learn the type.
    refused(
        lambda: append_event(stream, "invoice", "invoice.sent", {}, tenant_id="acme"),
        match=f"stream {stream} is a stream of aggregate type 'order', not 'invoice'",
    )

    append_event(stream, "order", "order.paid", {"n": 2}, tenant_id="acme")
    assert [(e.type, e.version) for e in load_stream(stream)] == [
        ("order.placed", 1),
        ("order.paid", 2),
    ]


@pytest.mark.parametrize("expected_version", [None, 0, 1])
def test_a_refusal_leaves_the_callers_transaction_usable(expected_version):
    stream, other = uuid.uuid4(), uuid.uuid4()
    append_event(stream, "order", "order.placed", {}, tenant_id="acme")

    with transaction.atomic():
        append_event(other, "order", "order.placed", {}, tenant_id="globex")
        refused(lambda: foreign_append(stream, expected_version=expected_version))
        # On PostgreSQL a failed statement would have aborted the transaction:
        # these writes and reads prove the refusal raised no database error.
        append_event(other, "order", "order.paid", {}, tenant_id="globex")
        assert Event.objects.filter(aggregate_id=other).count() == 2

    assert [e.type for e in load_stream(other)] == ["order.placed", "order.paid"]
    assert [e.type for e in load_stream(stream)] == ["order.placed"]


def test_the_admin_timeline_of_a_run_never_shows_a_foreign_append(client, django_user_model, now):
    run_id = waiting_run("acme", now)
    refused(lambda: foreign_append(run_id))
    staff = django_user_model.objects.create_user("ann", password="pw", is_staff=True)
    staff.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="kumiko_workflows", codename="view_workflowrun"
        )
    )
    client.force_login(staff)

    response = client.get(reverse("admin:kumiko_workflows_workflowrun_change", args=[run_id]))

    assert response.status_code == 200
    content = response.content.decode()
    assert "kw-timeline" in content
    assert et.WAITING in content
    assert SECRET not in content
    assert "order.note" not in content
    timeline = [row["entry"].type for row in response.context["kw_timeline"]]
    assert timeline == [et.RUN_STARTED, et.WAITING]


def test_another_tenant_cannot_take_a_run_id_or_a_schedule_id_first(settings, now):
    """Engine stream ids are derived from the tenant: a stream another tenant
    started with such an id first is its own, and does not block the run."""
    key = uuid.uuid4().hex
    run_id = run_id_for("t-wait", key, "acme")
    foreign_append(run_id)
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "CRON_TENANTS": lambda: ["acme"]}
    workflow = cw.hourly_all
    foreign_append(schedule_id(workflow.name, "acme"))

    trigger(
        "t.wait", tenant_id="acme", run_key=key, **{"for": (now + timedelta(hours=1)).isoformat()}
    )
    start = datetime.fromisoformat("2030-01-01T05:02:00+00:00")
    with registry.override(workflow):
        fire_due_schedules(now=start)
        assert fire_due_schedules(now=start + timedelta(hours=1)) == 1

    assert WorkflowRun.objects.get(run_id=run_id).status == "waiting"
    assert [e.type for e in load_stream(run_id, tenant_id="acme")] == [et.RUN_STARTED, et.WAITING]
    assert [e.type for e in load_stream(run_id, tenant_id="globex")] == ["order.note"]
    schedule = load_stream(schedule_id(workflow.name, "acme"), tenant_id="acme")
    assert [e.type for e in schedule] == [et.SCHEDULE_STARTED, et.SCHEDULE_SLOT_FIRED]


# --- engine streams take only the engine's event types -------------------------------


def test_engine_streams_take_only_their_own_event_types_even_from_the_engine(now):
    run_id = waiting_run("acme", now)
    schedule = uuid.uuid4()

    with engine_stream(), pytest.raises(InvalidEvent, match="takes only workflow run events"):
        append_event(run_id, et.RUN_AGGREGATE_TYPE, "order.note", {}, "acme", expected_version=2)
    with engine_stream(), pytest.raises(InvalidEvent, match="takes only workflow run events"):
        append_event(run_id, et.RUN_AGGREGATE_TYPE, et.SCHEDULE_SLOT_FIRED, {}, "acme")
    with engine_stream(), pytest.raises(InvalidEvent, match="takes only cron schedule events"):
        append_event(schedule, et.SCHEDULE_AGGREGATE_TYPE, et.RUN_STARTED, {}, "acme")
    run = WorkflowRun.objects.get(run_id=run_id)
    stream = RunStream(run_id, "acme", "t-wait", run.version, run.definition_fingerprint, None)
    with pytest.raises(InvalidEvent, match="takes only workflow run events"):
        stream.append("custom.note", {})

    assert types_of(run_id) == [et.RUN_STARTED, et.WAITING]
    assert not Event.objects.filter(aggregate_id=schedule).exists()


def cancel_the_victim(ctx):
    """A step that writes to another run's stream as if it were the engine."""
    trigger_event = Event.objects.get(pk=ctx.event.payload["trigger_event_id"])
    append_event(
        uuid.UUID(trigger_event.payload["victim"]),
        et.RUN_AGGREGATE_TYPE,
        et.RUN_CANCELLED,
        {"workflow_name": "t-wait", "reason": "hijacked", "by": "step"},
        tenant_id=ctx.tenant_id,
    )


def started_a_wait_run(event):
    return event.payload["workflow_name"] == "t-wait"


def stream_of(event):
    return str(event.aggregate_id)


def test_a_step_started_by_an_engine_event_does_not_write_as_the_engine(now):
    """A workflow triggered by a run event runs inside the engine's append: its
    steps must not inherit the engine's right to write to run streams."""
    victim = waiting_run("default", now)
    watcher = define_workflow(
        name="t-watch-starts",
        trigger=on_event(et.RUN_STARTED, filter=started_a_wait_run),
        idempotency_key=stream_of,
        steps=[steps.compute("hijack", cancel_the_victim)],
        register=False,
    )
    later = (now + timedelta(hours=1)).isoformat()
    with registry.override(watcher):
        event = trigger("t.wait", victim=str(victim), **{"for": later})

    assert types_of(victim) == [et.RUN_STARTED, et.WAITING]
    assert WorkflowRun.objects.get(run_id=victim).status == "waiting"
    started = run_id_for("t-wait", event.payload["run_key"])
    watch = WorkflowRun.objects.get(run_id=run_id_for("t-watch-starts", str(started)))
    assert (watch.status, watch.failure_reason) == ("failed", "step_failed")
    assert "'workflow-run' is reserved" in watch.last_error


# --- every read is tenant-scoped ------------------------------------------------------


def twin_stream(run_id, tenant: str = "globex") -> None:
    """Another tenant's stream with the run's id, as a race of two first appends leaves it.

    ``bulk_create`` writes the rows without ``append_event``'s identity check.
    """
    Event.objects.bulk_create(
        [
            Event(
                tenant_id=tenant,
                aggregate_id=run_id,
                aggregate_type="order",
                type="order.note",
                version=version,
                payload={"note": SECRET},
            )
            for version in (1, 2, 3, 4)
        ]
    )


def test_a_same_id_stream_of_another_tenant_is_invisible_to_every_read(
    client, django_user_model, now
):
    run_id = waiting_run("acme", now)
    twin_stream(run_id)

    assert [e.type for e in load_stream(run_id)] == [et.RUN_STARTED, et.WAITING]
    assert [e.type for e in load_stream(run_id, tenant_id="acme")] == [et.RUN_STARTED, et.WAITING]
    assert [e.version for e in load_stream(run_id, tenant_id="globex")] == [1, 2, 3, 4]
    assert load_stream(run_id, tenant_id="initech") == []

    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    page = client.get(reverse("admin:kumiko_workflows_workflowrun_change", args=[run_id]))
    assert page.status_code == 200
    assert SECRET not in page.content.decode()

    # The run goes on at its own versions: wake, resume, complete, rebuild.
    assert wake_run(run_id, by="test") is True
    report = resume_due_runs(now=now + timedelta(minutes=1))
    assert (report.completed, report.errors) == (1, 0), report
    assert types_of(run_id)[2:] == [et.WAKE_REQUESTED, et.RESUMED, et.RUN_COMPLETED]
    assert check().differences == []


def test_a_same_id_stream_of_another_tenant_does_not_disturb_a_schedule(settings):
    settings.KUMIKO_WORKFLOWS = {**settings.KUMIKO_WORKFLOWS, "CRON_TENANTS": lambda: ["acme"]}
    workflow = cw.hourly_all
    start = datetime.fromisoformat("2030-01-01T05:02:00+00:00")
    with registry.override(workflow):
        fire_due_schedules(now=start)
        twin_stream(schedule_id(workflow.name, "acme"))

        assert fire_due_schedules(now=start + timedelta(hours=1)) == 1
    assert [e.version for e in load_stream(schedule_id(workflow.name, "acme"))] == [1, 2]
