"""The admin with Django's test client: pages, permissions, actions, tenant scoping."""

from __future__ import annotations

import html as html_module
import json
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from kumiko_workflows import define_workflow, on_event, resume_due_runs, run_id_for, steps
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from kumiko_workflows.store.streams import FAILURE_REASONS
from kumiko_workflows.workflow.registry import registry
from tests.support import trigger, types_of
from tests.testapp import workflows as w

pytestmark = pytest.mark.django_db

RUNS = "admin:kumiko_workflows_workflowrun_changelist"
EVENTS = "admin:kumiko_workflows_event_changelist"
PENDING = "admin:kumiko_workflows_workflowrunpending_changelist"
VIEW_PERMS = ("view_event", "view_workflowrun", "view_workflowrunpending")


def tenant_of_user(request):
    """The test suite's ADMIN_TENANT: a staff user's first name is their tenant."""
    return request.user.first_name or None


def start(type_, tenant="default", **payload):
    event = trigger(type_, tenant_id=tenant, **payload)
    name = {
        "t.wait": "t-wait",
        "t.signed-up": "t-event",
        "t.fail": "t-fail",
        "t.retry": "t-retry",
    }[type_]
    return WorkflowRun.objects.get(run_id=run_id_for(name, event.payload["run_key"], tenant))


def change_url(run):
    return reverse("admin:kumiko_workflows_workflowrun_change", args=[run.pk])


def post_action(client, action, *runs, **extra):
    data = {"action": action, "_selected_action": [str(run.pk) for run in runs], **extra}
    return client.post(reverse(RUNS), data)


def messages_of(response):
    return [str(m) for m in response.context["messages"]] if response.context else []


def make_user(django_user_model, name, *perms, staff=True, tenant=""):
    user = django_user_model.objects.create_user(
        name, f"{name}@example.com", "pw", is_staff=staff, first_name=tenant
    )
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="kumiko_workflows", codename__in=perms)
    )
    return user


@pytest.fixture
def root(client, django_user_model):
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return user


@pytest.fixture
def future_iso():
    return (timezone.now() + timedelta(hours=1)).isoformat()


# --- pages ----------------------------------------------------------------------


def test_every_page_renders_for_a_superuser(client, root, future_iso):
    waiting = start("t.wait", **{"for": future_iso})
    awaiting = start("t.signed-up", user_id="u-42", timeout="P2D")
    retrying = start("t.retry", fail_attempts=5)
    failed = start("t.fail")
    done = start("t.wait", **{"for": "PT0S"})
    resume_due_runs(now=timezone.now() + timedelta(seconds=1))
    cancelled = start("t.wait", **{"for": future_iso})
    post_action(client, "cancel_runs", cancelled, kw_confirm="yes", reason="test")
    pending = WorkflowRunPending.objects.get(run_id=awaiting.run_id)
    an_event = Event.objects.filter(aggregate_id=waiting.run_id).first()

    pages = [
        reverse("admin:index"),
        reverse("admin:app_list", args=["kumiko_workflows"]),
        reverse(EVENTS),
        reverse(EVENTS) + "?type__exact=t.wait&tenant_id__exact=default",
        reverse(EVENTS) + f"?q={waiting.run_id}",
        reverse("admin:kumiko_workflows_event_change", args=[an_event.pk]),
        reverse(RUNS),
        reverse(RUNS) + "?status__exact=waiting&workflow_name__exact=t-wait",
        reverse(RUNS) + f"?q={waiting.idempotency_key}",
        reverse(PENDING),
        reverse(PENDING) + "?suspension_type__exact=event",
        reverse("admin:kumiko_workflows_workflowrunpending_change", args=[pending.pk]),
    ] + [change_url(run) for run in (waiting, awaiting, retrying, failed, done, cancelled)]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url

    page = client.get(change_url(awaiting)).content.decode()
    assert "Why is this run waiting?" in page
    assert "t.verified" in page and "user_id = &quot;u-42&quot;" in page
    assert "Deadline" in page and "Due</th><td>no, in 1 d 23 h" in page
    assert "Wake now" in page and "Cancel…" in page
    assert et.WAITING_FOR_EVENT in page  # the timeline

    page = client.get(change_url(retrying)).content.decode()
    assert "attempt 1 of 3 failed with FlakyError" in page

    page = client.get(change_url(failed)).content.decode()
    assert "Why did this run fail?" in page
    assert "step_failed" in page and "RuntimeError" in page
    assert "database password is hunter2" in page  # last_error, shown to staff only
    assert 'id="kw-rerun_failed"' in page and "Wake now" not in page
    assert "Rerun</th><td>possible: it re-enters the step" in page

    page = client.get(change_url(cancelled)).content.decode()
    assert "Cancelled: it will not run again." in page and "admin:root" in page
    assert 'class="kw-actions"' not in page

    listing = client.get(reverse(PENDING)).content.decode()
    assert 't.verified where user_id = "u-42"' in listing.replace("&quot;", '"')


def test_search_finds_runs_by_id_and_key_and_events_by_aggregate(client, root, future_iso):
    one = start("t.wait", **{"for": future_iso})
    other = start("t.wait", **{"for": future_iso})

    runs = client.get(reverse(RUNS), {"q": str(one.run_id)}).context["cl"].result_list
    assert [run.pk for run in runs] == [one.pk]
    runs = client.get(reverse(RUNS), {"q": other.idempotency_key}).context["cl"].result_list
    assert [run.pk for run in runs] == [other.pk]
    events = client.get(reverse(EVENTS), {"q": str(one.run_id)}).context["cl"].result_list
    assert {event.aggregate_id for event in events} == {one.run_id}
    assert [e.id for e in events] == sorted((e.id for e in events), reverse=True)


def test_event_page_shows_the_payload_as_pretty_json(client, root, future_iso):
    run = start("t.wait", **{"for": future_iso})
    started = Event.objects.get(aggregate_id=run.run_id, version=1)

    page = client.get(reverse("admin:kumiko_workflows_event_change", args=[started.pk]))

    text = page.content.decode()
    pretty = json.dumps(started.payload, indent=2, sort_keys=True).replace('"', "&quot;")
    assert f"<pre>{pretty}</pre>" in text
    assert change_url(run) in text


def test_nothing_is_editable_through_the_admin(client, root, future_iso):
    run = start("t.wait", **{"for": future_iso})
    started = Event.objects.get(aggregate_id=run.run_id, version=1)
    pending = WorkflowRunPending.objects.get(run_id=run.run_id)

    for model in ("event", "workflowrun", "workflowrunpending"):
        assert client.get(reverse(f"admin:kumiko_workflows_{model}_add")).status_code == 403
    for model, pk in (("event", started.pk), ("workflowrun", run.pk), ("workflowrunpending", 1)):
        pk = pending.pk if model == "workflowrunpending" else pk
        url = reverse(f"admin:kumiko_workflows_{model}_delete", args=[pk])
        assert client.post(url, {"post": "yes"}).status_code == 403
    client.post(change_url(run), {"status": "completed", "tenant_id": "other"})
    client.post(reverse("admin:kumiko_workflows_event_change", args=[started.pk]), {"type": "x"})

    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"
    assert Event.objects.get(pk=started.pk).type == et.RUN_STARTED
    assert client.get(reverse(EVENTS)).context["action_form"] is None  # no delete_selected


def test_a_non_staff_user_is_refused(client, django_user_model, future_iso):
    run = start("t.wait", **{"for": future_iso})
    user = make_user(django_user_model, "pat", *VIEW_PERMS, "wake_workflowrun", staff=False)
    client.force_login(user)

    for url in (reverse(RUNS), reverse(EVENTS), reverse(PENDING), change_url(run)):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url
    post_action(client, "wake_now", run)

    assert types_of(run.run_id) == [et.RUN_STARTED, et.WAITING]


# --- actions ----------------------------------------------------------------------


def test_wake_now_appends_a_wake_request_and_the_worker_resumes_the_run(client, root, future_iso):
    run = start("t.wait", **{"for": future_iso})
    finished = start("t.wait", **{"for": "PT0S"})
    resume_due_runs(now=timezone.now() + timedelta(seconds=1))

    response = post_action(client, "wake_now", run, finished)

    assert response.status_code == 302
    texts = messages_of(client.get(response["Location"]))
    assert "Woke 1 run: the next worker pass resumes it." in texts
    assert "Skipped 1 run: not waiting." in texts
    wake = Event.objects.get(aggregate_id=run.run_id, type=et.WAKE_REQUESTED)
    assert wake.payload["by"] == "admin:root"
    assert types_of(finished.run_id)[-1] == et.RUN_COMPLETED

    assert resume_due_runs().completed == 1
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"


def test_a_button_on_the_run_page_returns_to_the_run_page(client, root, future_iso):
    run = start("t.wait", **{"for": future_iso})

    response = post_action(client, "wake_now", run, _kw_return="1")

    assert response.status_code == 302 and response["Location"] == change_url(run)
    page = client.get(response["Location"])
    assert "Woke 1 run: the next worker pass resumes it." in messages_of(page)
    assert "Due</th><td>yes, for" in page.content.decode()


def test_cancel_asks_for_a_reason_before_cancelling(client, root, future_iso):
    run = start("t.wait", **{"for": future_iso})

    ask = post_action(client, "cancel_runs", run)
    assert ask.status_code == 200 and "Reason (kept in each run" in ask.content.decode()
    assert str(run.run_id) in ask.content.decode()
    blank = post_action(client, "cancel_runs", run, kw_confirm="yes", reason="  ")
    assert blank.status_code == 200 and "Give a reason." in blank.content.decode()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"

    done = post_action(client, "cancel_runs", run, kw_confirm="yes", reason="customer left")

    assert done.status_code == 302
    assert "Cancelled 1 run." in messages_of(client.get(done["Location"]))
    assert WorkflowRun.objects.get(pk=run.pk).status == "cancelled"
    cancelled = Event.objects.get(aggregate_id=run.run_id, type=et.RUN_CANCELLED)
    assert cancelled.payload["reason"] == "customer left"
    assert cancelled.payload["by"] == "admin:root"
    assert not WorkflowRunPending.objects.filter(run_id=run.run_id).exists()


def test_cancel_skips_finished_runs(client, root, future_iso):
    run = start("t.wait", **{"for": future_iso})
    failed = start("t.fail")

    response = post_action(client, "cancel_runs", run, failed, kw_confirm="yes", reason="x")

    texts = messages_of(client.get(response["Location"]))
    assert texts == ["Cancelled 1 run.", "Skipped 1 run: already finished."]
    assert types_of(failed.run_id)[-1] == et.RUN_FAILED


def test_rerun_reenters_the_failed_step(client, root):
    failed = start("t.fail")
    assert WorkflowRun.objects.get(pk=failed.pk).status == "failed"

    response = post_action(client, "rerun_failed", failed)

    assert (
        "Rerun requested for 1 run: the next worker pass runs it from where its failed "
        "attempt began." in messages_of(client.get(response["Location"]))
    )
    rerun = Event.objects.get(aggregate_id=failed.run_id, type=et.RERUN_REQUESTED)
    assert rerun.payload["step"] == "0" and rerun.payload["by"] == "admin:root"
    assert WorkflowRun.objects.get(pk=failed.pk).status == "waiting"
    resume_due_runs()
    # t-fail's step always raises: the worker re-entered it, and it failed again.
    assert types_of(failed.run_id)[-3:] == [et.RERUN_REQUESTED, et.RESUMED, et.RUN_FAILED]


def test_rerun_is_refused_when_the_definition_changed(client, root):
    failed = start("t.fail")
    changed = define_workflow(
        name="t-fail",
        trigger=on_event("t.fail"),
        idempotency_key=w.run_key,
        steps=[steps.compute("boom", w.record("renamed"))],
        register=False,
    )

    with registry.override(changed):
        page = client.get(change_url(failed)).content.decode()
        response = post_action(client, "rerun_failed", failed)

    assert (
        f"Rerun</th><td>not possible: run {failed.run_id} cannot be rerun, its workflow changed"
        in page
    )
    assert 'id="kw-rerun_failed"' not in page  # not offered beside "not possible"
    texts = messages_of(client.get(response["Location"]))
    assert len(texts) == 1 and texts[0].startswith("Refused 1 run: ")
    assert "changed where the run is (step 0)" in texts[0]
    assert types_of(failed.run_id)[-1] == et.RUN_FAILED


# --- permissions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "missing"),
    [
        ("wake_now", "wake_workflowrun"),
        ("cancel_runs", "cancel_workflowrun"),
        ("rerun_failed", "rerun_workflowrun"),
    ],
)
def test_staff_without_the_action_permission_cannot_run_it(
    client, django_user_model, future_iso, action, missing
):
    others = {"wake_workflowrun", "cancel_workflowrun", "rerun_workflowrun"} - {missing}
    user = make_user(django_user_model, "sam", *VIEW_PERMS, *others)
    client.force_login(user)
    run = start("t.fail") if action == "rerun_failed" else start("t.wait", **{"for": future_iso})
    before = types_of(run.run_id)

    page = client.get(change_url(run))
    response = post_action(client, action, run, kw_confirm="yes", reason="no")

    assert page.status_code == 200
    assert f'id="kw-{action}"' not in page.content.decode()
    assert response.status_code == 302
    assert types_of(run.run_id) == before
    listing = client.get(reverse(RUNS))
    choices = [name for name, _ in listing.context["action_form"].fields["action"].choices]
    assert action not in choices and len(choices) == 3  # "---------" and the two others


def test_staff_with_the_permission_can_run_it(client, django_user_model, future_iso):
    user = make_user(django_user_model, "kim", *VIEW_PERMS, "wake_workflowrun")
    client.force_login(user)
    run = start("t.wait", **{"for": future_iso})

    assert 'id="kw-wake_now"' in client.get(change_url(run)).content.decode()
    post_action(client, "wake_now", run)

    assert types_of(run.run_id)[-1] == et.WAKE_REQUESTED


# --- tenant scoping ----------------------------------------------------------------


@pytest.fixture
def scoped(settings):
    settings.KUMIKO_WORKFLOWS = {
        "DEFAULT_TENANT": "default",
        "ADMIN_TENANT": "tests.integration.test_admin.tenant_of_user",
    }


def test_tenant_scoped_staff_see_only_their_tenant(client, django_user_model, scoped, future_iso):
    mine = start("t.wait", tenant="acme", **{"for": future_iso})
    theirs = start("t.wait", tenant="globex", **{"for": future_iso})
    user = make_user(django_user_model, "alice", *VIEW_PERMS, tenant="acme")
    client.force_login(user)

    runs = client.get(reverse(RUNS)).context["cl"].result_list
    assert [run.pk for run in runs] == [mine.pk]
    events = client.get(reverse(EVENTS)).context["cl"].result_list
    assert {event.tenant_id for event in events} == {"acme"}
    pending = client.get(reverse(PENDING)).context["cl"].result_list
    assert [row.run_id for row in pending] == [mine.run_id]
    listing = client.get(reverse(RUNS)).content.decode()
    assert "globex" not in listing
    # Edited URLs: another tenant's run, event and pending row do not exist for alice.
    their_event = Event.objects.filter(tenant_id="globex").first()
    their_row = WorkflowRunPending.objects.get(run_id=theirs.run_id)
    for url in (
        change_url(theirs),
        reverse("admin:kumiko_workflows_event_change", args=[their_event.pk]),
        reverse("admin:kumiko_workflows_workflowrunpending_change", args=[their_row.pk]),
    ):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"] == reverse("admin:index")
    assert client.get(change_url(mine)).status_code == 200


def test_tenant_scoped_staff_act_only_on_their_tenant(
    client, django_user_model, scoped, future_iso
):
    mine = start("t.wait", tenant="acme", **{"for": future_iso})
    theirs = start("t.wait", tenant="globex", **{"for": future_iso})
    failed = start("t.fail", tenant="globex")
    perms = ("wake_workflowrun", "cancel_workflowrun", "rerun_workflowrun")
    client.force_login(make_user(django_user_model, "alice", *VIEW_PERMS, *perms, tenant="acme"))

    post_action(client, "wake_now", mine, theirs)
    post_action(client, "cancel_runs", theirs, kw_confirm="yes", reason="not mine")
    post_action(client, "rerun_failed", failed)
    post_action(client, "wake_now", theirs, _kw_return="1")

    assert types_of(mine.run_id)[-1] == et.WAKE_REQUESTED
    assert types_of(theirs.run_id) == [et.RUN_STARTED, et.WAITING]
    assert types_of(failed.run_id)[-1] == et.RUN_FAILED


def test_superusers_see_every_tenant_even_when_scoping_is_on(client, root, scoped, future_iso):
    a = start("t.wait", tenant="acme", **{"for": future_iso})
    b = start("t.wait", tenant="globex", **{"for": future_iso})

    runs = client.get(reverse(RUNS)).context["cl"].result_list

    assert {run.pk for run in runs} == {a.pk, b.pk}


def test_staff_the_callable_does_not_limit_see_all(client, django_user_model, scoped, future_iso):
    a = start("t.wait", tenant="acme", **{"for": future_iso})
    b = start("t.wait", tenant="globex", **{"for": future_iso})
    client.force_login(make_user(django_user_model, "ops", *VIEW_PERMS))

    runs = client.get(reverse(RUNS)).context["cl"].result_list

    assert {run.pk for run in runs} == {a.pk, b.pk}


def test_cancel_from_the_run_page_asks_then_returns_to_it(client, root, future_iso):
    run = start("t.wait", **{"for": future_iso})

    ask = post_action(client, "cancel_runs", run, _kw_return="1")
    assert 'name="_kw_return" value="1"' in ask.content.decode()
    done = post_action(
        client, "cancel_runs", run, _kw_return="1", kw_confirm="yes", reason="duplicate order"
    )

    assert done.status_code == 302 and done["Location"] == change_url(run)
    page = client.get(done["Location"])
    assert "Cancelled 1 run." in messages_of(page)
    assert "duplicate order" in page.content.decode()


def test_a_waiting_run_without_a_pending_row_says_so(client, root, future_iso):
    run = start("t.wait", **{"for": future_iso})
    WorkflowRunPending.objects.filter(run_id=run.run_id).delete()

    page = client.get(change_url(run)).content.decode()

    assert "it has no pending row, so no worker will resume it" in page
    assert "rebuild_workflow_projections --check" in page


def test_runs_show_their_version_with_a_filter_and_a_stranded_run_says_it_will_fail(
    client, root, future_iso
):
    original = registry.get("t-wait")
    v2 = define_workflow(
        name="t-wait",
        trigger=on_event("t.wait"),
        idempotency_key=w.run_key,
        version=2,
        steps=[steps.wait(w.payload_value("for", "PT1H")), steps.compute("after", w.record("a"))],
        register=False,
    )
    old = start("t.wait", **{"for": future_iso})
    with registry.override(original, v2):
        new = start("t.wait", **{"for": future_iso})
        listing = client.get(reverse(RUNS))
        only_v2 = client.get(reverse(RUNS), {"workflow_version__exact": "2"})
        pending_v1 = client.get(reverse(PENDING), {"workflow_version__exact": "1"})
        declared = client.get(change_url(old)).content.decode()
    with registry.override(v2):
        stranded = client.get(change_url(old)).content.decode()

    assert "column-workflow_version" in listing.content.decode()
    assert "By workflow version" in listing.content.decode()
    assert [run.pk for run in only_v2.context["cl"].result_list] == [new.pk]
    assert [row.run_id for row in pending_v1.context["cl"].result_list] == [old.run_id]
    assert "Workflow version" in declared and "no longer declared" not in declared
    assert "Definition</th><td>workflow &#x27;t-wait&#x27; version 1 is no longer declared" in (
        stranded
    )


def test_run_list_shows_each_cron_schedule_with_its_last_and_next_slot(
    client, django_user_model, scoped
):
    from datetime import UTC, datetime

    from kumiko_workflows import fire_due_schedules, run_id_for
    from kumiko_workflows.workflow.registry import registry
    from tests.testapp import cron_workflows as cw

    settings_tenants = "tests.integration.test_admin.two_tenants"
    with override_cron_tenants(settings_tenants), registry.override(cw.hourly_skip):
        fire_due_schedules(now=datetime(2026, 1, 5, 9, 30, tzinfo=UTC))  # schedules start
        fire_due_schedules(now=datetime(2026, 1, 5, 10, 0, 30, tzinfo=UTC))  # the 10:00 slot
        user = make_user(django_user_model, "alice", *VIEW_PERMS, tenant="acme")
        client.force_login(user)
        response = client.get(reverse(RUNS))

    page = response.content.decode()
    assert "Cron schedules" in page
    assert cw.hourly_skip.name in page and "acme" in page
    assert "globex" not in page  # another tenant's schedule stays hidden
    (schedule,) = response.context["kw_schedules"]
    assert schedule["last_slot"] == datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
    assert schedule["next_slot"] > datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
    slot_run = run_id_for(cw.hourly_skip.name, "2026-01-05T10:00:00+00:00", "acme")
    assert reverse("admin:kumiko_workflows_workflowrun_change", args=[slot_run]) in page


@pytest.mark.parametrize(
    "expression, problem",
    [
        (
            "0 0 30 2 *",
            "cron expression &#x27;0 0 30 2 *&#x27; never fires within the next 5 years",
        ),
        ("0 0 1 1 1#5", "never fires within the next 5 years"),
        ("R R * * *", "has the random field &#x27;R&#x27;"),
    ],
)
def test_run_list_shows_a_schedule_that_cannot_fire_and_the_others(
    client, root, expression, problem
):
    """A definition that skipped validation (older than it, or a stale deploy)."""
    from datetime import UTC, datetime

    from kumiko_workflows import fire_due_schedules
    from kumiko_workflows.exceptions import ScheduleError
    from kumiko_workflows.workflow.cron import CronTrigger
    from kumiko_workflows.workflow.definition import Workflow
    from tests.testapp import cron_workflows as cw

    stale = Workflow("t-cron-stale", CronTrigger(expression), [steps.compute("x", cw.slot_of)])
    with registry.override(cw.hourly_skip, stale):
        with pytest.raises(ScheduleError):
            fire_due_schedules(now=datetime(2026, 1, 5, 9, 30, tzinfo=UTC))
        response = client.get(reverse(RUNS))
        pending = client.get(reverse(PENDING))

    assert (response.status_code, pending.status_code) == (200, 200)
    page = response.content.decode()
    assert "Cron schedules" in page and "t-cron-stale" in page
    assert "cannot fire: cron expression" in page and problem in page
    rows = {row["workflow_name"]: row for row in response.context["kw_schedules"]}
    assert rows["t-cron-stale"]["next_slot"] is None
    assert rows[cw.hourly_skip.name]["next_slot"] is not None
    assert rows[cw.hourly_skip.name]["problem"] is None


def two_tenants():
    return ["acme", "globex"]


def override_cron_tenants(path):
    from django.test import override_settings

    return override_settings(
        KUMIKO_WORKFLOWS={
            "DEFAULT_TENANT": "default",
            "ADMIN_TENANT": "tests.integration.test_admin.tenant_of_user",
            "CRON_TENANTS": path,
        }
    )


#: Why the tests that migrate the app back cannot run on distributed tables.
MIGRATES_BACK = (
    "it migrates kumiko_workflows back below 0021, which is refused while the tables are "
    "distributed (their keys must keep tenant_id)"
)


@pytest.mark.not_citus(reason=MIGRATES_BACK)
@pytest.mark.django_db(transaction=True)
def test_the_old_retry_permission_is_renamed_in_place_and_its_grants_kept():
    """Migration 0007 renames retry_workflowrun to rerun_workflowrun; a group that held it
    still does, and migrating back restores the old name."""
    from django.contrib.auth.models import Group, Permission
    from django.core.management import call_command

    permission = Permission.objects.get(codename="rerun_workflowrun")
    group = Group.objects.create(name="support")
    group.permissions.add(permission)
    try:
        call_command("migrate", "kumiko_workflows", "0006", verbosity=0)
        permission.refresh_from_db()
        assert permission.codename == "retry_workflowrun"
        call_command("migrate", "kumiko_workflows", verbosity=0)
        permission.refresh_from_db()
        assert permission.codename == "rerun_workflowrun"
        assert list(group.permissions.values_list("codename", flat=True)) == ["rerun_workflowrun"]
    finally:
        call_command("migrate", "kumiko_workflows", verbosity=0)


# --- the admin across runs ---------------------------------------------------------------


def page_text(response):
    """What a reader sees: the HTML without scripts, styles and tags."""
    html = re.sub(r"<(script|style)\b.*?</\1>", "", response.content.decode(), flags=re.S)
    return html_module.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def test_the_run_list_has_a_failure_column_and_a_filter_on_it(client, root, future_iso):
    failed = start("t.fail")
    waiting = start("t.wait", **{"for": future_iso})

    listing = client.get(reverse(RUNS))
    filtered = client.get(reverse(RUNS), {"failure_reason": "step_failed"})
    other = client.get(reverse(RUNS), {"failure_reason": "invalid_match"})

    assert "failure" in [header["text"] for header in listing.context["result_headers"]]
    assert "step_<wbr>failed" in listing.content.decode()
    (failure_filter,) = [
        f for f in listing.context["cl"].filter_specs if f.title == "failure reason"
    ]
    offered = [choice["display"] for choice in failure_filter.choices(listing.context["cl"])]
    # Only the reasons failed runs have; the one the list is filtered by stays named.
    assert offered == ["All", "step_failed"]
    (other_filter,) = [f for f in other.context["cl"].filter_specs if f.title == "failure reason"]
    chosen = [choice["display"] for choice in other_filter.choices(other.context["cl"])]
    assert chosen == ["All", "step_failed", "invalid_match"]
    assert set(FAILURE_REASONS) >= {"step_failed", "invalid_match"}
    assert [run.pk for run in filtered.context["cl"].result_list] == [failed.pk]
    assert list(other.context["cl"].result_list) == []
    assert waiting.pk in [run.pk for run in listing.context["cl"].result_list]


def order_number(event):
    return f"order-{event.payload['order']}"


shop = define_workflow(
    name="t-shop",
    trigger=on_event("t.shop"),
    idempotency_key=w.run_key,
    search_key=order_number,
    steps=[steps.wait(w.payload_value("for", "PT1H"))],
    register=False,
)


def test_search_finds_a_run_by_its_search_key_or_its_shortened_id(client, root, future_iso):
    with registry.override(shop):
        trigger("t.shop", order=1234)
        other = trigger("t.shop", order=12345)
    run = WorkflowRun.objects.get(search_key="order-1234")
    pending = WorkflowRunPending.objects.get(run_id=run.run_id)

    def found(url, term):
        return [row.pk for row in client.get(reverse(url), {"q": term}).context["cl"].result_list]

    assert found(RUNS, "order-1234") == [run.pk]  # exactly: not order-12345 too
    assert found(RUNS, "order-123") == []
    assert found(RUNS, other.payload["run_key"]) == []  # t-shop's runs go by their search key
    assert found(RUNS, str(run.run_id)) == [run.pk]
    assert found(RUNS, str(run.run_id)[:8]) == [run.pk]  # what the list shows
    assert found(RUNS, str(run.run_id).upper()) == [run.pk]
    assert found(PENDING, str(run.run_id)[:8]) == [pending.pk]
    assert found(PENDING, "order-1234") == []
    started = Event.objects.get(aggregate_id=run.run_id, version=1)
    assert started.pk in found(EVENTS, str(run.run_id)[:8])
    assert found(EVENTS, f"#{started.pk}") == [started.pk]


def test_lists_show_short_ids_whole_in_the_text_and_times_with_their_zone(client, root, future_iso):
    run = start("t.wait", **{"for": future_iso})

    for url in (RUNS, PENDING, EVENTS):
        html = client.get(reverse(url)).content.decode()
        # Cut to 8 characters on screen only: hovering and copying give the whole id.
        assert re.search(f'class="kw-id"[^>]* title="{run.run_id}">{run.run_id}</', html), url
    listing = client.get(reverse(RUNS))
    headers = [header["text"] for header in listing.context["result_headers"]]
    assert "updated (UTC)" in headers
    page = client.get(change_url(run)).content.decode()
    started = WorkflowRun.objects.get(pk=run.pk).started_at
    assert f"{started:%Y-%m-%d %H:%M:%S} UTC" in page


def test_a_tenant_column_only_when_there_is_more_than_one_tenant(client, root, future_iso):
    start("t.wait", **{"for": future_iso})
    alone = [h["text"] for h in client.get(reverse(RUNS)).context["result_headers"]]
    start("t.wait", tenant="acme", **{"for": future_iso})
    both = client.get(reverse(RUNS))
    events = [h["text"] for h in client.get(reverse(EVENTS)).context["result_headers"]]

    assert "workflow" in alone and "workflow (tenant)" not in alone
    assert "workflow (tenant)" in [h["text"] for h in both.context["result_headers"]]
    assert '<div class="kw-tenant">acme</div>' in both.content.decode()
    assert "tenant id" in events


def test_the_pending_list_says_due_or_not_yet_in_words(client, root, future_iso):
    start("t.wait", **{"for": future_iso})
    due = start("t.wait", **{"for": future_iso})
    wake = post_action(client, "wake_now", due)
    assert wake.status_code == 302
    start("t.signed-up", user_id="u-1", timeout=None)

    listing = client.get(reverse(PENDING))
    texts = {
        str(row.run_id): listing.context["cl"].model_admin.due(row)
        for row in listing.context["cl"].result_list
    }

    html = listing.content.decode()
    assert "icon-no" not in html and "icon-yes" not in html
    assert texts[str(due.run_id)].startswith("due, for ")
    assert sorted(texts.values())[-1].startswith("on the event")
    assert any(text.startswith("not yet: in 59 min") for text in texts.values())


def test_wake_and_rerun_messages_say_it_for_one_run_and_them_for_more(client, root, future_iso):
    runs = [start("t.wait", **{"for": future_iso}) for _ in range(2)]
    failed = [start("t.fail") for _ in range(2)]

    woke_two = messages_of(client.get(post_action(client, "wake_now", *runs)["Location"]))
    rerun_two = messages_of(client.get(post_action(client, "rerun_failed", *failed)["Location"]))

    assert woke_two == ["Woke 2 runs: the next worker pass resumes them."]
    assert rerun_two == [
        "Rerun requested for 2 runs: the next worker pass runs each from where its failed "
        "attempt began."
    ]


def test_no_page_shows_a_literal_backtick(client, root, future_iso):
    waiting = start("t.wait", **{"for": future_iso})
    due = start("t.wait", **{"for": future_iso})
    post_action(client, "wake_now", due)
    orphan = start("t.wait", **{"for": future_iso})
    WorkflowRunPending.objects.filter(run_id=orphan.run_id).delete()
    pending = WorkflowRunPending.objects.filter(run_id=waiting.run_id).first()

    for url in (
        reverse(RUNS),
        reverse(EVENTS),
        reverse(PENDING),
        change_url(waiting),
        change_url(due),
        change_url(orphan),
        reverse("admin:kumiko_workflows_workflowrunpending_change", args=[pending.pk]),
    ):
        assert "`" not in page_text(client.get(url)), url
    assert "the next resume_due_runs pass resumes it" in page_text(client.get(change_url(due)))


def test_a_retry_shows_its_attempt_as_its_error_text_counts_it(client, root):
    run = start("t.retry", fail_attempts=5)

    waiting = page_text(client.get(change_url(run)))
    assert "Last error (attempt 1 of 3)" in waiting
    assert "attempt 1 of 3 failed with FlakyError; attempt 2 at" in waiting
    assert "attempt 1 of 3 failed; attempt 2 is next" in waiting  # the Failure fieldset

    for minutes in (10, 20):
        resume_due_runs(now=timezone.now() + timedelta(minutes=minutes))
    failed = page_text(client.get(change_url(run)))
    assert "attempt 3 of 3 failed with FlakyError" in failed  # the error text
    assert "Last error (attempt 3 of 3)" in failed
    assert "Attempt 3 of 3: the retry gave up" in failed
    assert "Retry attempt: attempt 3 of 3 failed" in failed
    assert "runs attempt 2" in failed and "runs attempt 3" in failed  # the timeline


def test_timeline_details_open_onto_the_whole_payload(client, root):
    long_id = "u-" + "x" * 300
    run = start("t.signed-up", user_id=long_id, timeout="P2D")

    html = client.get(change_url(run)).content.decode()
    entries = client.get(change_url(run)).context["kw_timeline"]

    waiting = next(item["entry"] for item in entries if item["entry"].type == et.WAITING_FOR_EVENT)
    assert long_id in waiting.summary  # the words are not cut either
    assert "<details><summary>" in html
    assert html_module.escape(f'"value": "{long_id}"', quote=True) in html  # the whole JSON
    assert "…" not in waiting.summary


def test_a_run_page_links_its_trigger_and_awaited_events_and_they_link_back(client, root):
    run = start("t.signed-up", user_id="u-7", timeout="P2D")
    verified = trigger("t.verified", user_id="u-7")
    trigger_event = Event.objects.get(pk=WorkflowRun.objects.get(pk=run.pk).trigger_event_id)
    event_url = reverse("admin:kumiko_workflows_event_change", args=[trigger_event.pk])
    verified_url = reverse("admin:kumiko_workflows_event_change", args=[verified.pk])

    page = client.get(change_url(run))
    html = page.content.decode()
    assert f'<a href="{event_url}">#{trigger_event.pk} t.signed-up,' in html  # fieldset and box
    awaited = [link for label, link in page.context["kw_related"] if label == "Awaited event"]
    assert [str(link).split(",")[0] for link in awaited] == [
        f'<a href="{verified_url}">#{verified.pk} t.verified'
    ]
    started_page = client.get(event_url).content.decode()
    assert "started: " in started_page and change_url(run) in started_page
    woke_page = client.get(verified_url).content.decode()
    assert "woke: " in woke_page and change_url(run) in woke_page
    unrelated = trigger("t.unrelated")
    none_page = client.get(reverse("admin:kumiko_workflows_event_change", args=[unrelated.pk]))
    assert "it started no run and woke none" in none_page.content.decode()


# --- cron schedules in the admin ------------------------------------------------------------


SCHEDULES = "admin:kumiko_workflows_workflowrun_schedule"


def schedule_post(client, op, workflow, tenant="default", **extra):
    return client.post(
        reverse(SCHEDULES), {"op": op, "workflow": workflow, "tenant": tenant, **extra}
    )


def schedule_events(workflow, tenant="default"):
    from kumiko_workflows.engine.cron import schedule_id

    stream = Event.objects.filter(aggregate_id=schedule_id(workflow.name, tenant))
    return list(stream.order_by("version"))


def test_a_schedule_is_paused_resumed_and_fired_from_the_run_list(client, root):
    from kumiko_workflows import fire_due_schedules
    from tests.testapp import cron_workflows as cw

    with registry.override(cw.nightly_berlin):
        fire_due_schedules()
        listing = client.get(reverse(RUNS))
        (row,) = listing.context["kw_schedules"]
        html = listing.content.decode()
        assert 'value="Pause"' in html and 'value="Fire now"' in html
        # Forms of their own, before the list's form for the actions (forms do not nest).
        assert html.index('id="kw-cron-schedules"') < html.index('id="changelist-form"')
        # Its times are in its own zone, which they name (CET or CEST).
        assert re.search(r"\d\d:30:00 CES?T", row["next_slot_text"])

        paused = schedule_post(client, "pause", cw.nightly_berlin.name)
        paused_page = client.get(paused["Location"])
        resumed = schedule_post(client, "resume", cw.nightly_berlin.name)
        resumed_messages = messages_of(client.get(resumed["Location"]))
        fired = schedule_post(client, "fire", cw.nightly_berlin.name, key=row["fire_key"])
        fired_messages = messages_of(client.get(fired["Location"]))
        twice = schedule_post(client, "fire", cw.nightly_berlin.name, key=row["fire_key"])
        twice_messages = messages_of(client.get(twice["Location"]))

    assert paused.status_code == 302 and paused["Location"].endswith("#kw-cron-schedules")
    assert messages_of(paused_page)[0].startswith(f"Paused {cw.nightly_berlin.name} (tenant")
    assert "paused since " in page_text(paused_page) and "by admin:root" in page_text(paused_page)
    assert 'value="Resume"' in paused_page.content.decode()
    assert resumed_messages == [
        f"Resumed {cw.nightly_berlin.name} (tenant default): its slots from now on fire."
    ]
    run_id = run_id_for(cw.nightly_berlin.name, f"now:{row['fire_key']}", "default")
    assert fired_messages[0].startswith(f"Fired {cw.nightly_berlin.name} (tenant default) now")
    assert str(run_id) in fired_messages[0]
    assert "nothing fired again" in twice_messages[0]
    types = [event.type for event in schedule_events(cw.nightly_berlin)]
    assert types == [
        et.SCHEDULE_STARTED,
        et.SCHEDULE_PAUSED,
        et.SCHEDULE_RESUMED,
        et.SCHEDULE_FIRED_NOW,
    ]
    assert {event.payload.get("by") for event in schedule_events(cw.nightly_berlin)[1:]} == {
        "admin:root"
    }
    fired_run = WorkflowRun.objects.get(run_id=run_id)
    assert fired_run.workflow_name == cw.nightly_berlin.name
    # The admin request queued the run: its steps run in a worker, not in the request.
    assert (fired_run.status, fired_run.suspension_type) == ("waiting", "queued")
    # The event page of the fire links the run it started.
    fire_event = schedule_events(cw.nightly_berlin)[-1]
    fire_page = client.get(reverse("admin:kumiko_workflows_event_change", args=[fire_event.pk]))
    assert change_url(WorkflowRun.objects.get(run_id=run_id)) in fire_page.content.decode()


@pytest.mark.parametrize(
    "op, needed",
    [("pause", "pause_schedule"), ("resume", "pause_schedule"), ("fire", "fire_schedule")],
)
def test_schedule_buttons_need_their_permission(client, django_user_model, op, needed):
    from kumiko_workflows import fire_due_schedules, pause_schedule
    from tests.testapp import cron_workflows as cw

    others = {"pause_schedule", "fire_schedule"} - {needed}
    client.force_login(make_user(django_user_model, "sam", *VIEW_PERMS, *others))
    with registry.override(cw.hourly_skip):
        fire_due_schedules()
        if op == "resume":
            pause_schedule(cw.hourly_skip.name)
        before = len(schedule_events(cw.hourly_skip))
        html = client.get(reverse(RUNS)).content.decode()
        refused = schedule_post(client, op, cw.hourly_skip.name, key="k")

    assert refused.status_code == 403
    assert len(schedule_events(cw.hourly_skip)) == before
    label = {"pause": 'value="Pause"', "resume": 'value="Resume"', "fire": 'value="Fire now"'}
    assert label[op] not in html
    assert WorkflowRun.objects.filter(workflow_name=cw.hourly_skip.name).count() == 0


def test_tenant_scoped_staff_act_only_on_their_tenants_schedule(client, django_user_model):
    from kumiko_workflows import fire_due_schedules
    from tests.testapp import cron_workflows as cw

    perms = ("pause_schedule", "fire_schedule")
    client.force_login(make_user(django_user_model, "alice", *VIEW_PERMS, *perms, tenant="acme"))
    tenants = "tests.integration.test_admin.two_tenants"
    with override_cron_tenants(tenants), registry.override(cw.hourly_skip):
        fire_due_schedules()
        mine = schedule_post(client, "pause", cw.hourly_skip.name, tenant="acme")
        theirs = schedule_post(client, "pause", cw.hourly_skip.name, tenant="globex")
        fired = schedule_post(client, "fire", cw.hourly_skip.name, tenant="globex", key="k")
        texts = messages_of(client.get(theirs["Location"]))
        messages_of(client.get(fired["Location"]))

    assert mine.status_code == theirs.status_code == 302
    assert [e.type for e in schedule_events(cw.hourly_skip, "acme")][-1] == et.SCHEDULE_PAUSED
    assert [e.type for e in schedule_events(cw.hourly_skip, "globex")] == [et.SCHEDULE_STARTED]
    assert "No such cron schedule." in texts
    assert not WorkflowRun.objects.filter(tenant_id="globex").exists()


def test_a_schedule_action_for_no_schedule_is_refused_plainly(client, root):
    response = schedule_post(client, "pause", "t-wait")

    assert messages_of(client.get(response["Location"])) == ["No such cron schedule."]
    assert client.get(reverse(SCHEDULES)).status_code == 302  # GET changes nothing
    assert schedule_post(client, "explode", "t-wait").status_code == 403


@pytest.mark.not_citus(reason=MIGRATES_BACK)
@pytest.mark.django_db(transaction=True)
def test_migration_0008_adds_the_schedule_permissions():
    from django.core.management import call_command

    try:
        call_command("migrate", "kumiko_workflows", "0007", verbosity=0)
        call_command("migrate", "kumiko_workflows", verbosity=0)
        codenames = set(
            Permission.objects.filter(content_type__app_label="kumiko_workflows").values_list(
                "codename", flat=True
            )
        )
    finally:
        call_command("migrate", "kumiko_workflows", verbosity=0)
    assert {"pause_schedule", "fire_schedule"} <= codenames
