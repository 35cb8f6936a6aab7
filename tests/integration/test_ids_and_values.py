"""What a Django site hands the engine: model instances as stream ids, Django's values as JSON.

A model instance names a stream by a uuid5 of its model and primary key
(``stream_id_for``); an integer is refused with a message that says what to
pass. ``Decimal``, dates, times, durations, UUIDs and lazy text are encoded
as ``DjangoJSONEncoder`` does (except where a guarantee of the store says
otherwise), in payloads, metadata and step results alike.
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.core.serializers.json import DjangoJSONEncoder
from django.test.utils import isolate_apps
from django.utils import timezone as django_timezone
from django.utils.dateparse import parse_duration
from django.utils.translation import gettext_lazy

from kumiko_workflows import (
    InvalidEvent,
    append_event,
    define_workflow,
    load_stream,
    on_event,
    resume_due_runs,
    run_id_for,
    steps,
    stream_id_for,
)
from kumiko_workflows.models import Event, WorkflowRun
from kumiko_workflows.workflow.registry import registry

pytestmark = pytest.mark.django_db


# --- model instances as stream ids ------------------------------------------------


def test_the_stream_id_of_a_model_instance_is_fixed_for_ever():
    # Pinned: a stream id that changed would split every existing stream.
    assert stream_id_for(User(pk=42)) == uuid.UUID("38af8047-4e61-5786-a60b-f545adad35ee")
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, "https://kumiko-workflows/model-instance")
    assert stream_id_for(User(pk=42)) == uuid.uuid5(namespace, "auth.user:42")
    # The key as its field reads it back, and the concrete model's label.
    assert stream_id_for(User(pk="42")) == stream_id_for(User(pk=42))
    assert stream_id_for(User(pk=43)) != stream_id_for(User(pk=42))


@isolate_apps("tests.testapp")
def test_a_proxy_model_shares_its_models_streams():
    class StaffUser(User):
        class Meta:
            proxy = True
            app_label = "testapp"

    assert stream_id_for(StaffUser(pk=42)) == stream_id_for(User(pk=42))


def test_append_event_and_load_stream_take_a_model_instance():
    user = User.objects.create(username="ada")

    first = append_event(user, "user", "t.user-renamed", {"name": "Ada"})
    second = append_event(User.objects.get(pk=user.pk), "user", "t.user-renamed", {"name": "A"})

    assert first.aggregate_id == second.aggregate_id == stream_id_for(user)
    assert [e.version for e in load_stream(user)] == [1, 2]
    assert load_stream(stream_id_for(user)) == load_stream(user)


BAD_IDS = {
    "an integer": (
        42,
        r"aggregate_id must be a UUID or a saved model instance, got 42: an integer is not "
        r"a stream id; pass the model instance itself \(its stream id is "
        r"kumiko_workflows.stream_id_for\(instance\)\), or a UUID of your own",
    ),
    "a bool": (True, r"aggregate_id must be a UUID or a saved model instance, got True$"),
    "text that is no UUID": ("order-17", "got 'order-17'$"),
    "an unsaved instance": (User(), "a auth.User without a primary key names no stream"),
}


@pytest.mark.parametrize("aggregate_id, message", BAD_IDS.values(), ids=BAD_IDS)
def test_an_id_that_names_no_stream_is_refused_saying_what_to_pass(aggregate_id, message):
    with pytest.raises(InvalidEvent, match=message):
        append_event(aggregate_id, "user", "t.user-renamed", {})
    assert not Event.objects.exists()


def test_stream_id_for_takes_only_a_model_instance():
    with pytest.raises(InvalidEvent, match="stream_id_for takes a model instance, got 42"):
        stream_id_for(42)  # type: ignore[arg-type]


# --- Django's values in payloads ----------------------------------------------------

AT = datetime(2026, 1, 31, 9, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def django_values() -> dict[str, Any]:
    return {
        "amount": Decimal("12.50"),
        "tiny": Decimal("1E-7"),
        "at": AT,
        "day": date(2026, 2, 1),
        "opens": time(9, 30),
        "delay": timedelta(days=1, hours=2, seconds=3),
        "id": ID,
        "label": gettext_lazy("Order"),
        "nested": [{"amount": Decimal("-0.01")}],
    }


STORED = {
    "amount": "12.50",
    "tiny": "1E-7",
    "at": "2026-01-31T09:00:00.123456+01:00",
    "day": "2026-02-01",
    "opens": "09:30:00",
    "delay": "P1DT02H00M03S",
    "id": "12345678-1234-5678-1234-567812345678",
    "label": "Order",
    "nested": [{"amount": "-0.01"}],
}


def test_django_values_are_stored_as_djangojsonencoder_writes_them():
    values = django_values()
    event = append_event(uuid.uuid4(), "order", "t.priced", values, metadata=values)

    stored = Event.objects.get(pk=event.pk)
    assert stored.payload == event.payload == STORED
    assert stored.metadata == STORED
    # The encoder agrees on everything but the datetime, where it cuts the
    # microseconds and the value would no longer read back as the instant.
    encoded = DjangoJSONEncoder()
    for key, value in django_values().items():
        if key not in ("at", "nested"):
            assert STORED[key] == encoded.default(value), key
    assert encoded.default(AT) == "2026-01-31T09:00:00.123+01:00"
    # Each reads back as the value appended.
    assert Decimal(stored.payload["amount"]) == Decimal("12.50")
    assert datetime.fromisoformat(stored.payload["at"]) == AT
    assert time.fromisoformat(stored.payload["opens"]) == time(9, 30)
    assert parse_duration(stored.payload["delay"]) == timedelta(days=1, hours=2, seconds=3)
    assert uuid.UUID(stored.payload["id"]) == ID
    # And can be queried as the strings they are.
    assert Event.objects.filter(pk=event.pk, payload__amount="12.50").exists()


REFUSED = {
    "Decimal NaN": (Decimal("NaN"), r"payload\['x'\] is Decimal\('NaN'\), which JSON cannot hold"),
    "Decimal infinity": (
        [Decimal("-Infinity")],
        r"payload\['x'\]\[0\] is Decimal\('-Infinity'\), which JSON cannot hold",
    ),
    "time with an offset": (
        time(9, 30, tzinfo=UTC),
        r"payload\['x'\] is a time with a time zone \(09:30:00 in UTC\); store the naive "
        r"time, or an aware datetime",
    ),
    "time in a zone": (
        time(9, 30, tzinfo=ZoneInfo("Europe/Berlin")),
        r"is a time with a time zone \(09:30:00 in Europe/Berlin\)",
    ),
    "naive datetime": (
        datetime(2026, 1, 31, 9, 0),
        r"payload\['x'\] is a naive datetime \(2026-01-31T09:00:00\); give it a time zone",
    ),
    "lazy text with a NUL": (gettext_lazy("a\x00b"), r"payload\['x'\] contains a NUL"),
}


@pytest.mark.parametrize("value, message", REFUSED.values(), ids=REFUSED)
def test_values_json_cannot_hold_alike_stay_refused(value, message):
    with pytest.raises(InvalidEvent, match=message):
        append_event(uuid.uuid4(), "order", "t.priced", {"x": value})
    assert not Event.objects.exists()


def test_the_size_limit_counts_the_encoded_values(settings):
    settings.KUMIKO_WORKFLOWS = {"MAX_PAYLOAD_BYTES": 40}

    # {"x":"111…"}: 38 bytes, the Decimal as its text
    append_event(uuid.uuid4(), "order", "t.priced", {"x": Decimal("1" * 30)})
    with pytest.raises(InvalidEvent, match="payload is 41 bytes of JSON, over the limit"):
        append_event(uuid.uuid4(), "order", "t.priced", {"x": Decimal("1" * 33)})


# --- Django's values as step results ------------------------------------------------

#: What each recording step saw in ctx.steps["values"], in order.
SEEN: list[Any] = []


def compute_values(ctx):
    return django_values()


def record_values(ctx):
    SEEN.append(ctx.steps["values"])
    return ctx.steps["values"]["amount"]


values_workflow = define_workflow(
    name="t-django-values",
    trigger=on_event("t.django-values"),
    idempotency_key=lambda event: event.payload["key"],
    steps=[
        steps.compute("values", compute_values),
        steps.compute("before", record_values),
        steps.wait("PT1M"),
        steps.compute("after", record_values),
    ],
    register=False,
)


def test_a_step_result_is_encoded_at_once_and_reads_the_same_after_a_wait():
    SEEN.clear()
    with registry.override(values_workflow):
        append_event(uuid.uuid4(), "order", "t.django-values", {"key": "k1"})
        report = resume_due_runs(now=django_timezone.now() + timedelta(minutes=2))

    assert report.completed == 1
    run = WorkflowRun.objects.get(run_id=run_id_for("t-django-values", "k1"))
    assert run.status == "completed"
    # The step right after saw the stored form, as the step after the wait did:
    # a result means the same whether or not the run suspended in between.
    assert SEEN == [STORED, STORED]
