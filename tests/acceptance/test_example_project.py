"""The example shop's order workflow, tested as a site would test its own: on a virtual clock.

Each test covers days of the workflow's life (a three-day payment window,
retries with backoff, an hour before shipping) in milliseconds, with the
``workflows`` fixture of :mod:`kumiko_workflows.testing`.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event


def place_order(workflows, **payload):
    """Append ``order.placed`` at the virtual now; return the order id and its run id."""
    order = uuid.uuid4()
    workflows.append_event(
        order, "order", "order.placed", {"order_id": str(order), "items": ["book"], **payload}
    )
    return order, workflows.run_id("order-fulfilment", str(order))


def pay(workflows, order, amount=12):
    workflows.append_event(
        uuid.uuid4(), "payment", "order.paid", {"order_id": str(order), "amount": amount}
    )


def order_events(order):
    return list(
        Event.objects.filter(aggregate_id=order).order_by("id").values_list("type", flat=True)
    )


def test_an_unpaid_order_is_cancelled_when_its_three_days_are_up(workflows):
    """The example of docs/howto/testing.md, on the example project's workflow."""
    order = uuid.uuid4()
    workflows.append_event(
        order, "order", "order.placed", {"order_id": str(order), "items": ["book"]}
    )
    run = workflows.run_id("order-fulfilment", str(order))

    workflows.advance("P2DT23H59M")
    workflows.assert_status(run, "waiting")

    workflows.advance("PT1M")
    workflows.assert_status(run, "completed")
    workflows.assert_step_results(run, {"paid": None, "cancel": "cancelled"})
    assert order_events(order) == ["order.placed", "order.stock-reserved", "order.cancelled"]


def test_a_paid_order_is_charged_and_shipped_an_hour_later(workflows):
    order, run = place_order(workflows)
    workflows.advance("P1D")
    pay(workflows, order, amount=30)
    paid_at = workflows.now

    workflows.run_until_idle()

    workflows.assert_status(run, "completed")
    workflows.assert_step_results(
        run,
        {"paid": {"order_id": str(order), "amount": 30}, "charge": {"amount": 30, "attempt": 1}},
    )
    shipped = Event.objects.get(aggregate_id=order, type="order.shipped")
    assert shipped.created_at == paid_at + timedelta(hours=1)
    workflows.assert_event_types(
        run,
        [
            et.RUN_STARTED,
            et.RUN_QUEUED,  # placed by a web request: a worker starts it
            et.RESUMED,
            et.WAITING_FOR_EVENT,
            et.WAKE_REQUESTED,
            et.RESUMED,
            et.WAITING,
            et.RESUMED,
            et.RUN_COMPLETED,
        ],
    )


def test_a_declined_card_is_charged_again_with_exponential_backoff(workflows):
    order, run = place_order(workflows, declines=2)
    pay(workflows, order)
    paid_at = workflows.now

    progress = workflows.run_until_idle()

    # The payment resumes the run at once; declined, then 30 s and 60 s later; shipped 1 h on.
    assert progress.instants == [
        paid_at,
        paid_at + timedelta(seconds=30),
        paid_at + timedelta(seconds=90),
        paid_at + timedelta(seconds=90, hours=1),
    ]
    workflows.assert_step_results(run, {"charge": {"amount": 12, "attempt": 3}})
    workflows.assert_status(run, "completed")


def test_a_card_declined_every_time_fails_the_run_after_four_attempts(workflows):
    order, run = place_order(workflows, declines=99)
    pay(workflows, order)

    workflows.run_until_idle()

    failed = workflows.assert_status(run, "failed")
    assert (failed.failure_reason, failed.error_class) == ("step_failed", "ChargeDeclined")
    assert "order.charged" not in order_events(order)
