"""The engine's model instances, made without ``Model.__init__``, are Django's own.

``new_instance`` stores an instance's values in one step where nothing could
tell; a receiver of ``pre_init``/``post_init`` gets Django's way back.
"""

import uuid

import pytest
from django.db.models.signals import post_init, pre_init
from django.utils import timezone

from kumiko_workflows import append_event, load_stream
from kumiko_workflows.models import Event, WorkflowRunPending
from kumiko_workflows.store.statement_cache import new_instance

pytestmark = pytest.mark.django_db

STREAM = uuid.UUID("0b5c4d3e-2f1a-4e6b-9c8d-7a6b5c4d3e2f")


def _values(model, instance):
    return [getattr(instance, field.attname) for field in model._meta.concrete_fields]


def test_a_new_event_is_what_its_constructor_makes():
    values = (None, "acme", STREAM, "order", 3, "order.paid", 1, {"n": 1}, {}, "", timezone.now())
    made, django = new_instance(Event, values), Event(*values)

    assert _values(Event, made) == _values(Event, django)
    assert list(vars(made)) == list(vars(django))  # nothing more, nothing less, same order
    assert (made._state.adding, made._state.db) == (True, None)
    made.save()  # the ORM takes it as one of its own
    assert Event.objects.get(pk=made.pk).payload == {"n": 1}


def test_a_loaded_row_is_what_from_db_makes():
    values = [getattr(WorkflowRunPending(run_id=STREAM), f.attname) for f in _fields()]

    made = new_instance(WorkflowRunPending, values, "default")
    django = WorkflowRunPending.from_db("default", None, values)

    assert _values(WorkflowRunPending, made) == _values(WorkflowRunPending, django)
    assert list(vars(made)) == list(vars(django))
    assert (made._state.adding, made._state.db) == (False, "default")
    with pytest.raises(IndexError, match="WorkflowRunPending takes"):
        new_instance(WorkflowRunPending, values[:-1], "default")


@pytest.mark.parametrize("signal", [pre_init, post_init], ids=["pre_init", "post_init"])
def test_a_receiver_of_the_init_signals_sees_every_instance_the_engine_makes(signal):
    seen = []

    def receiver(sender, **kwargs):
        if sender is Event:
            seen.append(kwargs.get("instance"))

    signal.connect(receiver)
    try:
        appended = append_event(STREAM, "order", "order.paid", {"n": 1}, tenant_id="acme")
        loaded = load_stream(STREAM, tenant_id="acme")
    finally:
        signal.disconnect(receiver)

    assert len(seen) >= 2  # the appended event, and the one loaded back
    if signal is post_init:
        assert appended in seen and loaded[0] in seen


def _fields():
    return WorkflowRunPending._meta.concrete_fields
