"""The example shop's order workflow.

order.placed → reserve stock, one child run per line (a fan-out) → wait for
order.paid (matched on order id, with a payment window) → if unpaid: cancel;
if paid: charge (a flaky payment provider, retried with backoff) → wait
before shipping → ship. If the charge fails for good (or support cancels the
order asking for it), the reservations are released: the fan-out's
compensation.
"""

from __future__ import annotations

from kumiko_workflows import define_workflow, match, on_call, on_event, steps


class ChargeDeclined(Exception):
    """The (simulated) payment provider declined; worth trying again."""


def order_key(event) -> str:
    return event.payload["order_id"]


def reserve_line(ctx) -> dict:
    """One line's reservation, in its own child run (its trigger's payload: the line)."""
    line = ctx.event.payload["item"]
    ctx.append_event(line["order_id"], "order", "order.stock-reserved", {"line": line["line"]})
    return {"line": line["line"], "reserved": True}


#: Reserves one line of an order: started by the order's fan-out, never by an event.
line_reservation = define_workflow(
    name="order-line-reservation",
    trigger=on_call(),
    steps=[steps.compute("reservation", reserve_line)],
)


def order_lines(ctx) -> list:
    order_id = ctx.event.payload["order_id"]
    return [{"order_id": order_id, "line": line} for line in ctx.event.payload.get("items", [])]


def release_stock(ctx) -> None:
    """The fan-out's compensation: give back what its children reserved."""
    lines = [reservation["line"] for reservation in ctx.steps["reserve"]]
    ctx.append_event(ctx.event.aggregate_id, "order", "order.stock-released", {"lines": lines})


#: The order.paid event of this order: its order_id is the order.placed event's.
this_order = match.eq("order_id", match.from_trigger("order_id"))


def payment_window(ctx) -> str:
    return ctx.event.payload.get("payment_window", "P3D")


def unpaid(ctx) -> bool:
    return ctx.steps["paid"] is None


def cancel_order(ctx) -> str:
    ctx.append_event(ctx.event.aggregate_id, "order", "order.cancelled", {"reason": "unpaid"})
    return "cancelled"


def charge(ctx) -> dict:
    # The demo's provider declines the first `declines` attempts of an order.
    if ctx.retry_attempt <= ctx.event.payload.get("declines", 0):
        raise ChargeDeclined(f"card declined on attempt {ctx.retry_attempt}")
    amount = ctx.steps["paid"]["amount"]
    ctx.append_event(ctx.event.aggregate_id, "order", "order.charged", {"amount": amount})
    return {"amount": amount, "attempt": ctx.retry_attempt}


def retry_base(ctx) -> str:
    return ctx.event.payload.get("retry_base", "PT30S")


def ship_delay(ctx) -> str:
    return ctx.event.payload.get("ship_after", "PT1H")


def ship(ctx) -> str:
    ctx.append_event(ctx.event.aggregate_id, "order", "order.shipped", {})
    return "shipped"


order_fulfilment = define_workflow(
    name="order-fulfilment",
    trigger=on_event("order.placed"),
    idempotency_key=order_key,
    awaits={"paid": "order.paid"},
    # Orders are placed by web requests: queue the run and return at once;
    # a worker reserves the stock right after the request commits.
    start="worker",
    steps=[
        steps.fan_out(
            "reserve", workflow=line_reservation, items=order_lines, compensate=release_stock
        ),
        steps.wait_for_event("paid", match=this_order, timeout=payment_window),
        steps.branch(
            if_=unpaid,
            then=[steps.compute("cancel", cancel_order)],
            else_=[
                steps.retry(
                    times=4,
                    backoff="exponential",
                    base_delay=retry_base,
                    do=[steps.compute("charge", charge)],
                ),
                steps.wait(ship_delay),
                steps.compute("ship", ship),
            ],
        ),
    ],
)
