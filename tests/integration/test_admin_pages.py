"""The dashboard, a workflow's page, the run page's picture and the lists, with Django's client.

Permissions as everywhere in the admin; tenant scoping; escaping of what an
attacker controls (a trigger's payload, so a step's result; an event's
payload; the query string and the URL).
"""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from kumiko_workflows import define_workflow, match, on_event, resume_due_runs, run_id_for, steps
from kumiko_workflows.models import WorkerHeartbeat, WorkflowRun
from kumiko_workflows.workflow.definition import registry
from tests.support import trigger

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:kumiko_workflows_workflowrun_dashboard"
RUNS = "admin:kumiko_workflows_workflowrun_changelist"
EVENTS = "admin:kumiko_workflows_event_changelist"
PENDING = "admin:kumiko_workflows_workflowrunpending_changelist"
EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)>"\'&'


def workflow_url(name):
    return reverse("admin:kumiko_workflows_workflowrun_workflow", args=[name])


def run_url(run_id):
    return reverse("admin:kumiko_workflows_workflowrun_change", args=[run_id])


def echo(ctx):
    return {"name": ctx.event.payload["name"], "items": [ctx.event.payload["name"], 2]}


echoing = define_workflow(
    name="t-echo",
    trigger=on_event("t.echo"),
    idempotency_key=lambda event: event.payload["run_key"],
    awaits={"verified": "t.echo-verified"},
    steps=[
        steps.compute("echo", echo),
        steps.wait_for_event("verified", match=match.any(), timeout="P1D"),
    ],
    register=False,
)


@pytest.fixture
def root(client, django_user_model):
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return user


def make_staff(django_user_model, name, *codenames, tenant=""):
    user = django_user_model.objects.create_user(
        name, f"{name}@example.com", "pw", is_staff=True, first_name=tenant
    )
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="kumiko_workflows", codename__in=codenames
        )
    )
    return user


def run_of(name, event, tenant="default"):
    return WorkflowRun.objects.get(run_id=run_id_for(name, event.payload["run_key"], tenant))


def text_of(response):
    return response.content.decode()


# --- the dashboard -------------------------------------------------------------------------


def test_the_dashboard_draws_the_figures_and_links_into_the_lists(client, root):
    trigger("t.wait", **{"for": "PT1M"})
    failed = run_of("t-fail", trigger("t.fail"))
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        name="w:1", hostname="w", pid=1, tenants=[], loop=True, started_at=now, seen_at=now
    )
    response = client.get(reverse(DASHBOARD))
    page = text_of(response)
    assert response.status_code == 200
    assert page.count("<svg") >= 2 and 'role="img"' in page
    assert "Runs per hour, last 24 hours: runs per hour, last 24 hours: 2 started" in page
    assert "100.0 %" in page  # one run finished, and it failed
    assert "w:1" in page and "alive" in page
    assert "kumiko_workflows/admin.css" in page
    # The top failure reason links to the failed runs with that reason.
    (href,) = re.findall(r'<a href="([^"]+)">step_failed</a>', page)
    query = parse_qs(urlparse(href.replace("&amp;", "&")).query)
    assert query["failure_reason"] == ["step_failed"] and query["status__exact"] == ["failed"]
    listed = client.get(href.replace("&amp;", "&"))
    assert [run.pk for run in listed.context["cl"].result_list] == [failed.pk]
    # A bucket's started runs, from the figures table.
    starts = re.findall(r'<a href="([^"]+started_at__gte[^"]+)">2</a>', page)
    assert starts
    listed = client.get(starts[0].replace("&amp;", "&"))
    assert len(listed.context["cl"].result_list) == 2


def test_the_dashboard_for_one_workflow_and_its_page(client, root):
    trigger("t.branch", go_then=False)
    trigger("t.fail")
    page = text_of(client.get(reverse(DASHBOARD), {"workflow": "t-branch"}))
    assert '<option value="t-branch" selected>' in page
    assert "1 started, 1 completed, 0 failed" in page
    workflow = text_of(client.get(workflow_url("t-branch")))
    assert "each &#x27;t.branch&#x27; event" in workflow
    assert 'data-step="1.else.0"' in workflow and "otherwise" in workflow
    assert "1 started, 1 completed, 0 failed, 0 cancelled; 0 due now" in workflow
    missing = client.get(workflow_url("t-nope"))
    assert missing.status_code == 200 and "No workflow named t-nope" in text_of(missing)


def test_the_pages_need_the_run_view_permission(client, django_user_model):
    urls = [reverse(DASHBOARD), workflow_url("t-wait")]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"], url
    client.force_login(make_staff(django_user_model, "nobody"))
    for url in urls:
        assert client.get(url).status_code == 403, url
    client.force_login(make_staff(django_user_model, "viewer", "view_workflowrun"))
    for url in urls:
        assert client.get(url).status_code == 200, url
    not_staff = django_user_model.objects.create_user("plain", "p@example.com", "pw")
    client.force_login(not_staff)
    for url in urls:
        assert client.get(url).status_code == 302, url


@pytest.fixture
def scoped(settings):
    settings.KUMIKO_WORKFLOWS = {"ADMIN_TENANT": "tests.integration.test_admin.tenant_of_user"}


def test_a_tenant_scoped_user_sees_only_its_tenant_s_figures(client, django_user_model, scoped):
    trigger("t.fail", tenant_id="acme")
    for _ in range(3):
        trigger("t.fail", tenant_id="rival")
    client.force_login(make_staff(django_user_model, "ann", "view_workflowrun", tenant="acme"))
    page = text_of(client.get(reverse(DASHBOARD)))
    assert "1 started, 0 completed, 1 failed" in page
    assert "3 started" not in page and "4 started" not in page
    workflow = text_of(client.get(workflow_url("t-fail")))
    assert "1 started, 0 completed, 1 failed" in workflow


def test_what_a_user_types_is_escaped_on_the_dashboard_and_the_workflow_page(client, root):
    page = text_of(client.get(reverse(DASHBOARD), {"workflow": EVIL}))
    assert "<script>" not in page and "onerror=alert(1)>" not in page
    assert "&lt;script&gt;" in page
    page = text_of(client.get(workflow_url(EVIL)))
    assert "<script>" not in page and "&lt;script&gt;" in page


# --- the run page --------------------------------------------------------------------------


def test_a_waiting_run_page_draws_its_path_and_its_results(client, root):
    event = trigger("t.branch", go_then=True, **{"for": "PT1H"})
    run = run_of("t-branch", event)
    page = text_of(client.get(run_url(run.run_id)))
    assert 'id="kw-diagram"' in page
    assert page.count('aria-current="step"') == 2  # the branch and the wait in it
    assert re.search(r'data-step="1\.then\.1" data-state="current"', page)
    assert re.search(r'data-step="1\.else\.0" data-state="skipped"', page)
    assert re.search(r'data-step="2" data-state="pending"', page)
    assert '<th scope="row">first<span class="kw-step-name">step 0 (compute' in page
    # Engine internals are folded away.
    assert re.search(r"<details class=\"kw-internals\">\s*<summary>Engine details", page)
    assert run.definition_fingerprint in page.split('class="kw-internals"')[1]


def test_a_finished_run_shows_no_current_step_nor_empty_sections(client, root):
    completed = run_of("t-branch", trigger("t.branch", go_then=False))
    failed = run_of("t-fail", trigger("t.fail"))
    done = text_of(client.get(run_url(completed.run_id)))
    assert ">Suspension</h2>" not in done and ">Failure</h2>" not in done
    assert "form-row field-current_step" not in done and "form-row field-finished" in done
    broken = text_of(client.get(run_url(failed.run_id)))
    assert ">Failure</h2>" in broken and ">Suspension</h2>" not in broken
    assert re.search(r'data-step="0" data-state="failed"', broken)
    waiting = run_of("t-wait", trigger("t.wait", **{"for": "PT1H"}))
    page = text_of(client.get(run_url(waiting.run_id)))
    assert ">Suspension</h2>" in page and "form-row field-finished" not in page


def test_a_step_result_and_an_event_payload_an_attacker_wrote_are_escaped(client, root):
    with registry.override(echoing):
        event = trigger("t.echo", name=EVIL)
        trigger("t.echo-verified", note=EVIL)
        resume_due_runs(now=timezone.now() + timedelta(seconds=1))
        run = run_of("t-echo", event)
        page = text_of(client.get(run_url(run.run_id)))
        events = text_of(client.get(reverse(EVENTS), {"kind": "domain"}))
    assert run.status == "completed"
    for html in (page, events):
        assert "<script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "<dt>name</dt>" in page and "<dt>items</dt>" in page  # pairs, not raw JSON
    assert "the awaited event <a href=" in page
    assert "&lt;script&gt;" in events and "note=" in events


# --- the lists -----------------------------------------------------------------------------


def test_lists_read_at_a_glance(client, root):
    trigger("t.wait", **{"for": "PT1H"})
    trigger("t.signed-up", user_id="u-1", timeout="P2D")
    trigger("t.fail")
    runs = text_of(client.get(reverse(RUNS)))
    for status, symbol in (("waiting", "‖"), ("failed", "✗")):
        assert (
            f'<span class="kw-badge kw-badge--{status}"><span class="kw-sym" aria-hidden="true">'
            f"{symbol}</span>{status}</span>" in runs
        )
    # The failed run is at no current step; the waiting one says where, with the name.
    assert (
        '<span class="kw-nowrap">0</span><span class="kw-step-name"><span aria-hidden="true">'
        "✉ </span>wait for &#x27;verified&#x27;</span>" in runs
    )
    assert "(wait_for_event &#x27;verified&#x27;)" not in runs  # not the long label
    pending = text_of(client.get(reverse(PENDING)))
    assert (
        '<span class="kw-nowrap">1</span><span class="kw-step-name"><span aria-hidden="true">'
        "◷ </span>wait</span>" in pending
    )
    engine = client.get(reverse(EVENTS), {"kind": "engine"})
    domain = client.get(reverse(EVENTS), {"kind": "domain"})
    assert {e.aggregate_type for e in engine.context["cl"].result_list} == {"workflow-run"}
    assert "workflow-run" not in {e.aggregate_type for e in domain.context["cl"].result_list}
    assert "kw-preview" in text_of(domain) and "user_id=u-1" in text_of(domain)
    assert "waits for a &#x27;t.verified&#x27; event" in text_of(engine)
    # One placeholder everywhere.
    # (in the run list's table: Django 6's page chrome has dashes of its own)
    table = re.search(r'<table id="result_list".*?</table>', runs, re.S)
    assert table is not None
    assert " - " not in re.sub(r"<[^>]+>", " ", table.group(0))


def test_the_app_index_links_the_dashboard(client, root):
    page = text_of(client.get(reverse("admin:app_list", args=["kumiko_workflows"])))
    assert reverse(DASHBOARD) in page
