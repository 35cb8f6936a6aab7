"""The event store: appending, reading, refusing bad input, append-only rows."""

from __future__ import annotations

import asyncio
import enum
import json
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from datetime import time as time_of_day
from decimal import Decimal
from types import MappingProxyType

import pytest
from django.core.exceptions import SynchronousOnlyOperation
from django.db import IntegrityError, connection, transaction
from django.db.models.signals import post_save, pre_save

from kumiko_workflows import VersionConflict, append_event, load_stream
from kumiko_workflows.exceptions import AppendOnlyError, InvalidEvent
from kumiko_workflows.models import Event
from kumiko_workflows.store import event_checks
from kumiko_workflows.store import events as store
from kumiko_workflows.store.dispatch import registry as projections
from tests.support import REPO, subprocess_env

pytestmark = pytest.mark.django_db


def new_stream() -> uuid.UUID:
    return uuid.uuid4()


def append(stream, type="t.thing", payload=None, **kwargs):
    return append_event(stream, "thing", type, payload or {}, **kwargs)


@pytest.fixture
def projection():
    """Register a temporary projection; it is removed after the test."""
    names = []

    def register(name, handles, apply, order=100):
        projections.register(name, handles, apply, order=order)
        names.append(name)

    yield register
    for name in names:
        projections.unregister(name)


# --- appending and reading ---------------------------------------------------


def test_append_gives_the_next_version_of_each_stream():
    a, b = new_stream(), new_stream()

    versions = [append(a).version, append(a).version, append(b).version, append(a).version]

    assert versions == [1, 2, 1, 3]


def test_append_stores_every_field():
    stream = new_stream()
    at = datetime(2026, 1, 31, 9, 0, tzinfo=UTC)

    event = append_event(
        str(stream),
        "order",
        "order.placed",
        {"total": 12.5},
        tenant_id="acme",
        metadata={"request": "r-1"},
        created_by="alice",
        event_version=2,
        created_at=at,
    )

    row = Event.objects.get(pk=event.pk)
    assert (row.aggregate_id, row.aggregate_type, row.type, row.version) == (
        stream,
        "order",
        "order.placed",
        1,
    )
    assert (row.tenant_id, row.created_by, row.event_version, row.created_at) == (
        "acme",
        "alice",
        2,
        at,
    )
    assert (row.payload, row.metadata) == ({"total": 12.5}, {"request": "r-1"})


def test_tenant_defaults_to_the_setting(settings):
    settings.KUMIKO_WORKFLOWS = {"DEFAULT_TENANT": "fallback"}

    assert append(new_stream()).tenant_id == "fallback"


def test_expected_version_appends_right_after_it():
    stream = new_stream()
    assert append(stream, expected_version=0).version == 1
    assert append(stream, expected_version=1).version == 2


def test_expected_version_already_taken_raises_version_conflict():
    stream = new_stream()
    append(stream)
    append(stream)

    with pytest.raises(VersionConflict, match=f"stream {stream} already has version 2") as info:
        append(stream, "t.late", expected_version=1)

    assert (info.value.aggregate_id, info.value.expected_version) == (stream, 1)
    assert not Event.objects.filter(type="t.late").exists()


def test_expected_version_beyond_the_stream_is_a_conflict_not_a_gap():
    stream = new_stream()
    append(stream)

    with pytest.raises(VersionConflict, match="is at version 1, not at the expected version 3"):
        append(stream, "t.gap", expected_version=3)
    with pytest.raises(VersionConflict, match="is at version 0, not at the expected version 1"):
        append(new_stream(), "t.gap", expected_version=1)

    assert not Event.objects.filter(type="t.gap").exists()


def test_version_conflict_leaves_the_callers_transaction_usable():
    stream, other = new_stream(), new_stream()
    append(stream)

    with transaction.atomic():
        append(stream, "t.mine", {"n": 1}, expected_version=1)
        with pytest.raises(VersionConflict):
            append(stream, "t.mine", {"n": 2}, expected_version=1)
        # On PostgreSQL a failed statement outside a savepoint would abort
        # the transaction; these writes and reads prove it was contained.
        append(other, "t.instead")
        assert Event.objects.filter(aggregate_id=stream).count() == 2

    assert [e.type for e in load_stream(stream)] == ["t.thing", "t.mine"]
    assert [e.type for e in load_stream(other)] == ["t.instead"]


def test_load_stream_returns_one_stream_in_version_order():
    stream, other = new_stream(), new_stream()
    for n in range(5):
        append(stream, payload={"n": n})
        append(other, payload={"n": -n})

    events = load_stream(str(stream))

    assert [e.version for e in events] == [1, 2, 3, 4, 5]
    assert [e.payload["n"] for e in events] == [0, 1, 2, 3, 4]
    assert load_stream(new_stream()) == []
    with pytest.raises(InvalidEvent, match="aggregate_id must be a UUID or a saved model"):
        load_stream("nope")


def test_aware_datetimes_dates_uuids_and_tuples_are_stored_as_json():
    ident = uuid.uuid4()
    berlin = timezone(timedelta(hours=1))
    payload = {
        "at": datetime(2026, 1, 31, 9, 0, tzinfo=berlin),
        "day": date(2026, 2, 1),
        "id": ident,
        "pair": (1, "two"),
        "deep": [{"when": datetime(2026, 1, 1, tzinfo=UTC)}],
    }

    event = append(new_stream(), payload=payload)

    expected = {
        "at": "2026-01-31T09:00:00+01:00",
        "day": "2026-02-01",
        "id": str(ident),
        "pair": [1, "two"],
        "deep": [{"when": "2026-01-01T00:00:00+00:00"}],
    }
    assert event.payload == expected
    assert Event.objects.get(pk=event.pk).payload == expected


def test_payload_and_metadata_round_trip_and_answer_key_lookups():
    payload = {"note": '€ naïve\u2028 "quoted"', "items": [1, {"x": None}], "n": 2**63 - 1}

    event = append(new_stream(), payload=payload, metadata={"who": "zoë"})

    stored = Event.objects.get(pk=event.pk)
    assert (stored.payload, stored.metadata) == (payload, {"who": "zoë"})
    assert Event.objects.filter(pk=event.pk, payload__note=payload["note"]).exists()
    assert Event.objects.filter(pk=event.pk, payload__items__1__x=None).exists()
    assert Event.objects.filter(pk=event.pk, metadata__who="zoë").exists()
    assert Event.objects.filter(aggregate_id=event.aggregate_id).get() == stored


# --- bad input ---------------------------------------------------------------


class Opaque:
    pass


NAIVE = datetime(2026, 1, 31, 9, 0)
BAD_INPUT = {
    "empty type": ({"type": ""}, "type must be a non-empty string, got ''"),
    "blank type": ({"type": "   "}, "type must be a non-empty string, got '   '"),
    "type not a string": ({"type": 7}, "type must be a non-empty string, got 7"),
    "overlong type": ({"type": "t" * 201}, "type is longer than 200 characters"),
    "blank aggregate type": (
        {"aggregate_type": " "},
        "aggregate_type must be a non-empty string",
    ),
    "aggregate id not a UUID": (
        {"aggregate_id": "order-17"},
        "aggregate_id must be a UUID or a saved model instance, got 'order-17'",
    ),
    "aggregate id an int": (
        {"aggregate_id": 17},
        "aggregate_id must be a UUID or a saved model instance, got 17: an integer is not",
    ),
    "payload a list": (
        {"payload": [1, 2]},
        r"payload must be a JSON object \(a dict\), got list",
    ),
    "payload a string": ({"payload": "{}"}, "payload must be a JSON object"),
    "object in a list": (
        {"payload": {"items": [1, 2, Opaque()]}},
        r"payload\['items'\]\[2\] is a Opaque, which is not JSON-serialisable",
    ),
    "set": ({"payload": {"tags": {"a"}}}, r"payload\['tags'\] is a set"),
    "Decimal NaN": (
        {"payload": {"x": [Decimal("NaN")]}},
        r"payload\['x'\]\[0\] is Decimal\('NaN'\), which JSON cannot hold",
    ),
    "aware time": (
        {"payload": {"x": time_of_day(9, tzinfo=UTC)}},
        r"payload\['x'\] is a time with a time zone",
    ),
    "bytes": ({"payload": {"raw": b"x"}}, r"payload\['raw'\] is a bytes"),
    "NaN": ({"payload": {"x": float("nan")}}, r"payload\['x'\] is nan, which JSON cannot hold"),
    "infinity": (
        {"payload": {"a": {"b": float("inf")}}},
        r"payload\['a'\]\['b'\] is inf, which JSON cannot hold",
    ),
    "int json.dumps refuses": (
        {"payload": {"n": [10**5000]}},
        r"payload\['n'\]\[0\] is an integer beyond the 64-bit range",
    ),
    "int of 4001 digits": (
        {"payload": {"n": -(10**4000)}},
        r"payload\['n'\] is an integer beyond the 64-bit range",
    ),
    "non-string key": ({"payload": {1: "a"}}, "payload has a key 1 that is not a string"),
    "nested non-string key": (
        {"payload": {"a": [{None: 1}]}},
        r"payload\['a'\]\[0\] has a key None that is not a string",
    ),
    "NUL character": (
        {"payload": {"note": "a\x00b"}},
        r"payload\['note'\] contains a NUL character",
    ),
    "NUL in a key": (
        {"payload": {"a\x00": 1}},
        r"payload has a key 'a\\x00' that contains a NUL character",
    ),
    "lone surrogate": (
        {"payload": {"s": "\ud800"}},
        r"payload\['s'\] is not valid Unicode text",
    ),
    "naive datetime in payload": (
        {"payload": {"at": NAIVE}},
        r"payload\['at'\] is a naive datetime \(2026-01-31T09:00:00\); give it a time zone",
    ),
    "too deep": (
        {"payload": {"a": json.loads("[" * 70 + "]" * 70)}},
        "is nested more than 64 levels deep",
    ),
    "metadata not JSON": (
        {"metadata": {"who": Opaque()}},
        r"metadata\['who'\] is a Opaque",
    ),
    "metadata a list": ({"metadata": ["x"]}, "metadata must be a JSON object"),
    "naive created_at": (
        {"created_at": NAIVE},
        r"created_at is a naive datetime \(2026-01-31T09:00:00\)",
    ),
    "created_at a string": (
        {"created_at": "2026-01-31T09:00:00Z"},
        "created_at must be an aware datetime, got '2026-01-31T09:00:00Z'",
    ),
    "negative expected_version": (
        {"expected_version": -1},
        "expected_version must be an integer >= 0, got -1",
    ),
    "expected_version a string": (
        {"expected_version": "1"},
        "expected_version must be an integer >= 0, got '1'",
    ),
    "expected_version a bool": (
        {"expected_version": True},
        "expected_version must be an integer >= 0, got True",
    ),
    "expected_version a float": (
        {"expected_version": 1.0},
        "expected_version must be an integer >= 0, got 1.0",
    ),
    "event_version zero": ({"event_version": 0}, "event_version must be an integer >= 1"),
    "event_version a bool": ({"event_version": True}, "event_version must be an integer >= 1"),
    "empty tenant": ({"tenant_id": ""}, "tenant_id must be a non-empty string, got ''"),
    "blank tenant": ({"tenant_id": "  "}, "tenant_id must be a non-empty string"),
    "tenant not a string": ({"tenant_id": 5}, "tenant_id must be a non-empty string, got 5"),
    "overlong tenant": ({"tenant_id": "t" * 101}, "tenant_id is longer than 100 characters"),
    "created_by not a string": ({"created_by": 3}, "created_by must be a string, got 3"),
}


@pytest.mark.parametrize("overrides, message", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_refused_with_its_message_and_no_row(overrides, message):
    stream = new_stream()
    append(stream)
    arguments = {
        "aggregate_id": stream,
        "aggregate_type": "thing",
        "type": "t.thing",
        "payload": {},
    } | overrides
    before = Event.objects.count()

    with pytest.raises(InvalidEvent, match=message):
        append_event(**arguments)

    assert Event.objects.count() == before
    # The refused call did not break the transaction either.
    assert append(stream).version == 2


def test_key_paths_run_through_tuples_other_mappings_and_subclasses():
    class Label(str):
        pass

    class Level(enum.IntEnum):
        HIGH = 3

    payload = {"a": (1, MappingProxyType({Label("b"): [Level.HIGH, Opaque()]}))}

    with pytest.raises(InvalidEvent, match=r"^payload\['a'\]\[1\]\['b'\]\[1\] is a Opaque,"):
        append(new_stream(), payload=payload)
    event = append(new_stream(), payload={"a": (1, MappingProxyType({Label("b"): [Level.HIGH]}))})
    assert Event.objects.get(pk=event.pk).payload == {"a": [1, {"b": [3]}]}


def test_a_refused_name_is_refused_again_with_the_same_message():
    for _ in range(2):
        with pytest.raises(InvalidEvent, match=r"^type contains a control character \('\\n' at"):
            append(new_stream(), "t.a\nb")
        with pytest.raises(InvalidEvent, match="^tenant_id must be a non-empty string, got ' '"):
            append(new_stream(), tenant_id=" ")


def test_a_model_whose_fields_moved_stops_appends_loudly(monkeypatch):
    """``append_event`` builds Events by position: a changed model must not go unnoticed."""
    moved = (*store._FIELDS[:5], store._FIELDS[6], store._FIELDS[5], *store._FIELDS[7:])
    monkeypatch.setattr(store, "_FIELDS", moved)
    store._created_at_field.cache_clear()
    try:
        with pytest.raises(AssertionError, match="append_event expects"):
            append(new_stream(), created_at=datetime(2026, 1, 1, tzinfo=UTC))
    finally:
        monkeypatch.undo()
        store._created_at_field.cache_clear()
    assert append(new_stream()).version == 1


def test_the_names_remembered_as_valid_stay_bounded(monkeypatch):
    monkeypatch.setattr(event_checks, "_VALID_NAMES_LIMIT", 4)
    event_checks._valid_names.clear()

    for n in range(10):
        append(new_stream(), f"t.bounded-{n}")

    assert 0 < len(event_checks._valid_names) <= 4


def test_payload_over_the_size_limit_is_refused(settings):
    settings.KUMIKO_WORKFLOWS = {"MAX_PAYLOAD_BYTES": 40}
    stream = new_stream()

    append(stream, payload={"x": "a" * 30})  # {"x":"aaa…"} is 38 bytes
    with pytest.raises(
        InvalidEvent,
        match=r"payload is 41 bytes of JSON, over the limit of 40 bytes "
        r"\(KUMIKO_WORKFLOWS\['MAX_PAYLOAD_BYTES'\]\)",
    ):
        append(stream, payload={"x": "a" * 33})
    with pytest.raises(InvalidEvent, match="metadata is 41 bytes of JSON, over the limit"):
        append(stream, metadata={"x": "a" * 33})

    assert [e.version for e in load_stream(stream)] == [1]


def test_size_limit_counts_utf8_bytes_not_characters(settings):
    settings.KUMIKO_WORKFLOWS = {"MAX_PAYLOAD_BYTES": 20}

    with pytest.raises(InvalidEvent, match="payload is 23 bytes"):
        append(new_stream(), payload={"x": "€" * 5})  # 8 + 5 × 3 bytes


# --- append-only -------------------------------------------------------------


def test_saving_an_existing_event_is_refused_and_changes_nothing():
    event = append(new_stream(), payload={"n": 1})
    event.payload = {"n": 2}

    with pytest.raises(AppendOnlyError, match=f"Event #{event.pk} is append-only"):
        event.save()
    with pytest.raises(AppendOnlyError):
        event.save(update_fields=["payload"])
    fetched = Event.objects.get(pk=event.pk)
    fetched.type = "t.changed"
    with pytest.raises(AppendOnlyError):
        fetched.save()

    assert Event.objects.get(pk=event.pk).payload == {"n": 1}
    assert Event.objects.get(pk=event.pk).type == "t.thing"


def test_deleting_an_event_is_refused_and_changes_nothing():
    event = append(new_stream())

    with pytest.raises(AppendOnlyError, match=f"Event #{event.pk} is append-only"):
        event.delete()
    with pytest.raises(AppendOnlyError, match=r"QuerySet.delete\(\) is refused"):
        Event.objects.filter(pk=event.pk).delete()
    with pytest.raises(AppendOnlyError):
        Event.objects.all().delete()

    assert Event.objects.filter(pk=event.pk).exists()


def test_queryset_updates_are_refused_and_change_nothing():
    event = append(new_stream(), payload={"n": 1})

    with pytest.raises(AppendOnlyError, match=r"QuerySet.update\(\) is refused"):
        Event.objects.filter(pk=event.pk).update(payload={"n": 2})
    with pytest.raises(AppendOnlyError):
        Event.objects.update(type="t.changed")
    event.payload = {"n": 3}
    # bulk_update() runs in atomic(savepoint=False): give it a savepoint so
    # the refusal does not doom the test's own transaction.
    with pytest.raises(AppendOnlyError), transaction.atomic():
        Event.objects.bulk_update([event], ["payload"])

    assert Event.objects.get(pk=event.pk).payload == {"n": 1}


# --- projections ---------------------------------------------------------------


def test_projections_see_each_new_event_in_order_in_the_same_transaction(projection):
    seen = []
    projection("test.second", {"t.seen"}, lambda e, r: seen.append(("second", e.pk)), order=200)
    projection("test.first", {"t.seen"}, lambda e, r: seen.append(("first", e.pk)), order=150)

    event = append(new_stream(), "t.seen")
    append(new_stream(), "t.not-handled")

    assert seen == [("first", event.pk), ("second", event.pk)]


def test_a_sites_projection_is_asked_at_each_event_whether_it_handles_the_type(projection):
    # The engine keeps its own projections' answers per event type; a site's
    # predicate may answer differently from one event to the next.
    wanted = {"on": False}
    seen = []
    projection("test.switch", lambda type: wanted["on"], lambda e, r: seen.append(e.pk))

    append(new_stream(), "t.switched")
    wanted["on"] = True
    event = append(new_stream(), "t.switched")

    assert seen == [event.pk]


def test_a_workflow_defined_later_starts_from_a_type_appended_before():
    from kumiko_workflows import define_workflow, on_event, steps
    from kumiko_workflows.models import WorkflowRun
    from kumiko_workflows.workflow.registry import registry as workflows

    append(new_stream(), "t.later-trigger")  # no workflow starts from it yet
    later = define_workflow(
        name="t-later",
        trigger=on_event("t.later-trigger"),
        steps=[steps.compute("one", lambda ctx: 1)],
        register=False,
    )

    with workflows.override(later):
        append(new_stream(), "t.later-trigger")
    append(new_stream(), "t.later-trigger")  # the definition is gone again

    assert WorkflowRun.objects.filter(workflow_name="t-later").count() == 1


class ProjectionBroke(Exception):
    pass


def test_a_failing_projection_rolls_the_append_back(projection):
    written = []

    def record(event, replaying):
        written.append(append(new_stream(), "t.side-effect").pk)

    def explode(event, replaying):
        raise ProjectionBroke("projection failed")

    projection("test.record", {"t.doomed"}, record, order=150)
    projection("test.explode", {"t.doomed"}, explode, order=160)
    stream = new_stream()

    with pytest.raises(ProjectionBroke, match="projection failed"):
        append(stream, "t.doomed")

    assert load_stream(stream) == []
    assert len(written) == 1
    assert not Event.objects.filter(pk=written[0]).exists()
    assert not Event.objects.filter(type__in=["t.doomed", "t.side-effect"]).exists()


def test_an_integrity_error_in_a_projection_is_not_taken_for_a_version_conflict(projection):
    def explode(event, replaying):
        raise IntegrityError("a projection's own constraint")

    projection("test.integrity", {"t.integrity"}, explode)
    stream = new_stream()

    with pytest.raises(IntegrityError, match="a projection's own constraint"):
        append(stream, "t.integrity")

    assert load_stream(stream) == []


def test_bulk_create_bypasses_the_projections(projection):
    """Documented limitation: only ``append_event`` (post_save) feeds projections."""
    seen = []
    projection("test.bulk", {"t.bulk"}, lambda e, r: seen.append(e.pk))
    stream = new_stream()

    Event.objects.bulk_create(
        [
            Event(
                tenant_id="default",
                aggregate_id=stream,
                aggregate_type="thing",
                type="t.bulk",
                version=1,
            )
        ]
    )
    assert seen == []
    assert [e.type for e in load_stream(stream)] == ["t.bulk"]

    append(stream, "t.bulk")
    assert len(seen) == 1


# --- the site's own signal receivers ---------------------------------------------


class Recorder:
    """A receiver of a model signal that records each event it is sent."""

    def __init__(self, signal, sender, asynchronous):
        self.signal, self.sender, self.seen = signal, sender, []

        async def record_async(**kwargs):
            self.record(**kwargs)

        self.function = record_async if asynchronous else self.record
        signal.connect(self.function, sender=sender, weak=False)

    def record(self, sender, instance, **kwargs):
        if isinstance(instance, Event):  # (sender=None: sent for every model)
            self.seen.append((instance, instance.pk, instance.version, kwargs.get("created")))

    def disconnect(self):
        self.signal.disconnect(self.function, sender=self.sender)


@pytest.fixture
def receiver():
    """Connect a recording receiver to a model signal for the test."""
    recorders = []

    def connect(signal, sender=Event, *, asynchronous=False):
        recorders.append(Recorder(signal, sender, asynchronous))
        return recorders[-1]

    yield connect
    for recorder in recorders:
        recorder.disconnect()


@pytest.mark.parametrize("sender", [Event, None], ids=["for Event", "for every model"])
def test_a_sites_own_receivers_see_an_event_no_projection_handles(receiver, sender):
    assert not projections.handles("t.unprojected")
    before = receiver(pre_save, sender)
    after = receiver(post_save, sender)

    event = append(new_stream(), "t.unprojected")

    assert before.seen == [(event, None, None, None)]
    assert after.seen == [(event, event.pk, 1, True)]


def test_an_async_receiver_sees_an_event_no_projection_handles(receiver):
    after = receiver(post_save, asynchronous=True)

    event = append(new_stream(), "t.unprojected")

    assert after.seen == [(event, event.pk, 1, True)]


def test_receivers_connected_and_disconnected_between_appends_are_honoured(receiver):
    stream = new_stream()
    append(stream, "t.unprojected")
    after = receiver(post_save)

    second = append(stream, "t.unprojected")
    after.disconnect()
    append(stream, "t.unprojected")

    assert after.seen == [(second, second.pk, 2, True)]


def test_projections_and_a_sites_receiver_both_see_a_projected_event(receiver, projection):
    seen = []
    projection("test.both", {"t.both"}, lambda event, replaying: seen.append(event.pk))
    after = receiver(post_save)

    event = append(new_stream(), "t.both")

    assert seen == [event.pk]
    assert after.seen == [(event, event.pk, 1, True)]


def test_post_save_is_not_sent_for_a_type_nobody_listens_for(monkeypatch, projection):
    dispatched = []
    monkeypatch.setattr(projections, "dispatch", lambda event, **kw: dispatched.append(event.type))
    projection("test.listened", {"t.listened"}, lambda event, replaying: None)

    unprojected = append(new_stream(), "t.unprojected")
    append(new_stream(), "t.listened")

    assert dispatched == ["t.listened"]
    assert (unprojected.pk, unprojected.version) == (Event.objects.get(pk=unprojected.pk).pk, 1)
    assert not unprojected._state.adding


# --- the cursor the appends keep ------------------------------------------------------


#: Why the tests that count an append's statements cannot run on distributed tables.
ONE_STATEMENT = (
    "it counts an append's statements: on distributed tables a stream's first event is six "
    "(the id from the coordinator's sequence, the insert at the next version, the insert of "
    "version 1, the question to every shard, a savepoint and its release)"
)


@pytest.mark.not_citus(reason=ONE_STATEMENT)
def test_appends_are_seen_by_query_logging_and_execute_wrappers(django_assert_num_queries):
    append(new_stream())  # the appends' cursor is open before the logging starts
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql.split()[0])
        return execute(sql, params, many, context)

    with django_assert_num_queries(1) as captured, connection.execute_wrapper(wrapper):
        append(new_stream())
    append(new_stream())

    assert captured.captured_queries[0]["sql"].startswith("INSERT INTO")
    assert seen == ["INSERT"]


@pytest.mark.not_citus(reason=ONE_STATEMENT)
def test_a_cursor_wrapped_on_the_connection_is_asked_for_every_append(monkeypatch):
    append(new_stream())
    opened = []
    original = connection.cursor

    def cursor():
        opened.append(True)
        return original()

    monkeypatch.setattr(connection, "cursor", cursor)  # as the debug toolbar and tracers do
    append(new_stream())
    append(new_stream())

    assert len(opened) == 2


def test_an_append_from_async_code_is_still_refused():
    append(new_stream())

    async def append_in_event_loop():
        append(new_stream())

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(append_in_event_loop())


@pytest.mark.django_db(transaction=True)
def test_appends_go_on_after_the_connection_is_closed():
    stream = new_stream()
    append(stream)

    connection.close()

    assert append(stream).version == 2
    assert [e.version for e in load_stream(stream)] == [1, 2]


# --- two real processes race for one version (PostgreSQL) ----------------------

RACER = textwrap.dedent(
    """
    import json, sys, uuid
    import django
    django.setup()
    from django.db import connection, transaction
    from kumiko_workflows import VersionConflict, append_event

    stream, lock_key, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Blocks until the parent releases its exclusive lock: both
            # racers then append at the same moment.
            cursor.execute("SELECT pg_advisory_xact_lock_shared(%s)", [lock_key])
        try:
            append_event(stream, "race", "race.won", {"by": name}, expected_version=1)
            outcome = "won"
        except VersionConflict as exc:
            outcome = "conflict"
            message = str(exc)
            # The same transaction goes on and commits other work.
            append_event(uuid.uuid4(), "race", "race.consolation", {"by": name})
    print(json.dumps({"name": name, "outcome": outcome}))
    """
)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_processes_append_the_same_version_exactly_one_wins():
    stream = new_stream()
    append_event(stream, "race", "race.opened", {})
    lock_key = 0x6B756D00 + uuid.uuid4().int % 1000
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_key])
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(stream), str(lock_key), name],
            cwd=REPO,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:
        deadline = time.monotonic() + 60
        waiting = 0
        while waiting < 2:
            assert time.monotonic() < deadline, "the racers never reached the lock"
            assert all(p.poll() is None for p in racers), racers[0].communicate()
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND NOT granted AND objid = %s",
                    [lock_key],
                )
                waiting = cursor.fetchone()[0]
            time.sleep(0.02)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_key])
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=60)
        assert racer.returncode == 0, err
        results.append(json.loads(out))

    outcomes = sorted(r["outcome"] for r in results)
    assert outcomes == ["conflict", "won"]
    winner = next(r["name"] for r in results if r["outcome"] == "won")
    loser = next(r["name"] for r in results if r["outcome"] == "conflict")
    events = load_stream(stream)
    assert [(e.version, e.type) for e in events] == [(1, "race.opened"), (2, "race.won")]
    assert events[1].payload == {"by": winner}
    consolation = Event.objects.filter(type="race.consolation")
    assert [e.payload for e in consolation] == [{"by": loser}]
