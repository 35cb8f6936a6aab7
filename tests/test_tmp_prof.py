import time, uuid, pytest
from django.db import transaction
from kumiko_workflows import append_event, resume_due_runs, run_id_for, define_workflow, on_event, on_call, steps
from kumiko_workflows.workflow.definition import registry

def _noop(ctx): return None
def _items(ctx): return list(range(ctx.event.payload["count"]))
def _key(e): return e.payload["key"]

@pytest.mark.django_db(transaction=True)
def test_prof():
    child = define_workflow("p-child", on_call(), start="worker", steps=[steps.compute("noop", _noop)], register=False)
    parent = define_workflow("p-parent", on_event("p.fan"), idempotency_key=_key, steps=[steps.fan_out("c", workflow=child, items=_items)], register=False)
    one = define_workflow("p-one", on_event("p.one"), idempotency_key=_key, start="worker", steps=[steps.compute("noop", _noop)], register=False)
    n = 1000
    with registry.override(child, parent, one):
        t = time.perf_counter()
        append_event(uuid.uuid4(), "s", "p.fan", {"key": "k", "count": n})
        t1 = time.perf_counter()
        while resume_due_runs().processed: pass
        t2 = time.perf_counter()
        with transaction.atomic():
            for i in range(n):
                append_event(uuid.uuid4(), "s", "p.one", {"key": uuid.uuid4().hex})
        t3 = time.perf_counter()
        while resume_due_runs().processed: pass
        t4 = time.perf_counter()
    print(f"\nfan trigger {t1-t:.2f}s drain {t2-t1:.2f}s | independent seed {t3-t2:.2f}s drain {t4-t3:.2f}s")
