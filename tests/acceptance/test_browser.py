"""The admin in a real browser: headless Chromium driven by Playwright.

Log in, open a waiting run, press "Wake now", see the success message, let a
worker pass run, and see the run completed. At 1366 px, the lists of runs,
events and pending rows fit: every column is inside the list and the screen
(a check of where the cells are, not of pixels), ids are cut on screen and
whole in the text; a cron schedule is paused and fired from its buttons.
Screenshots are saved under ``OUTPUT_DIR/browser/``.
"""

from __future__ import annotations

import re
import shutil
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from kumiko_workflows import event_types as et
from kumiko_workflows import resume_due_runs, run_id_for
from kumiko_workflows.models import WorkflowRun
from tests.support import trigger, types_of

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and not shutil.which("chromium"),
        reason="needs Debian's chromium (apt-get install chromium; .ci/run installs it)",
    ),
]


def in_a_thread(fn):
    """Run ``fn`` in a thread of its own, with its own database connection.

    Playwright's sync API keeps an event loop running in the test's thread,
    where Django refuses synchronous database access.
    """
    result = {}

    def target():
        try:
            result["value"] = fn()
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    return result["value"]


def log_in(page, server: str, then: str) -> None:
    """Log in as root (password secret-pw), then land on ``then``."""
    page.goto(f"{server}/admin/login/?next={then}")
    page.fill("#id_username", "root")
    page.fill("#id_password", "secret-pw")
    page.click("input[type=submit]")


@pytest.mark.django_db(transaction=True)
def test_wake_a_waiting_run_from_its_admin_page(live_server, django_user_model):
    from playwright.sync_api import expect, sync_playwright

    django_user_model.objects.create_superuser("root", "root@example.com", "secret-pw")
    until = (timezone.now() + timedelta(hours=1)).isoformat()
    event = trigger("t.wait", **{"for": until})
    run_id = run_id_for("t-wait", event.payload["run_key"], "default")
    screenshots = Path(settings.OUTPUT_DIR) / "browser"
    screenshots.mkdir(parents=True, exist_ok=True)
    run_url = f"{live_server.url}/admin/kumiko_workflows/workflowrun/{run_id}/change/"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            log_in(page, live_server.url, run_url[len(live_server.url) :])

            expect(page.locator("#kw-why h2")).to_have_text("Why is this run waiting?")
            expect(page.locator("#kw-why")).to_contain_text("Due")
            expect(page.locator("#kw-why")).to_contain_text("no, in 59 min")
            page.screenshot(path=str(screenshots / "waiting.png"), full_page=True)
            page.click("#kw-wake_now")

            expect(page).to_have_url(run_url)
            expect(page.locator(".messagelist .success")).to_have_text(
                "Woke 1 run: the next worker pass resumes it."
            )
            expect(page.locator("#kw-why")).to_contain_text("yes, for")
            expect(page.locator("#kw-timeline")).to_contain_text(et.WAKE_REQUESTED)

            report = in_a_thread(resume_due_runs)
            page.reload()

            expect(page.locator("#kw-why h2")).to_have_text("Where is this run?")
            expect(page.locator("#kw-why")).to_contain_text("Completed: every step ran.")
            expect(page.locator("#kw-timeline")).to_contain_text(et.RUN_COMPLETED)
            expect(page.locator("#kw-wake_now")).to_have_count(0)
            page.screenshot(path=str(screenshots / "wake-now.png"), full_page=True)
        finally:
            browser.close()

    assert report.completed == 1
    assert WorkflowRun.objects.get(run_id=run_id).status == "completed"
    assert types_of(run_id)[-3:] == [et.WAKE_REQUESTED, et.RESUMED, et.RUN_COMPLETED]
    assert (screenshots / "wake-now.png").stat().st_size > 10_000


#: The lists a support person reads, and a column each must show.
LISTS = {
    "runs": ("workflowrun", "failure"),
    "events": ("event", "aggregate id"),
    "pending": ("workflowrunpending", "due"),
}


def columns_outside(page, width: int) -> list[str]:
    """Header and body cells of the list that are not wholly inside the list and the screen."""
    return page.evaluate(
        """(width) => {
            const box = document.querySelector('#changelist .results').getBoundingClientRect();
            const cells = document.querySelectorAll('#result_list thead th, #result_list tbody td');
            return Array.from(cells)
                .filter(cell => {
                    const r = cell.getBoundingClientRect();
                    return r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.right > width;
                })
                .map(cell => cell.className + ': ' + cell.textContent.trim());
        }""",
        width,
    )


@pytest.mark.django_db(transaction=True)
def test_the_lists_fit_a_1366_px_screen_and_the_schedule_buttons_work(
    live_server, django_user_model
):
    from playwright.sync_api import expect, sync_playwright

    from kumiko_workflows import fire_due_schedules
    from kumiko_workflows.workflow.registry import registry
    from tests.testapp import cron_workflows as cw

    django_user_model.objects.create_superuser("root", "root@example.com", "secret-pw")
    until = (timezone.now() + timedelta(hours=1)).isoformat()
    for tenant in ("default", "tenant-with-a-long-name"):
        trigger("t.wait", tenant_id=tenant, **{"for": until})
        trigger("t.fail", tenant_id=tenant)
        trigger("t.retry", tenant_id=tenant, fail_attempts=5)
        trigger("t.signed-up", tenant_id=tenant, user_id="u-" + "7" * 40, timeout="P2D")
    failed = WorkflowRun.objects.filter(status="failed").first()
    screenshots = Path(settings.OUTPUT_DIR) / "browser"
    screenshots.mkdir(parents=True, exist_ok=True)
    admin = f"{live_server.url}/admin/kumiko_workflows"

    with registry.override(cw.nightly_berlin), sync_playwright() as playwright:
        in_a_thread(fire_due_schedules)
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            log_in(page, live_server.url, "/admin/")

            for name, (model, column) in LISTS.items():
                page.goto(f"{admin}/{model}/")
                expect(page.locator("#result_list thead")).to_contain_text(column, ignore_case=True)
                page.screenshot(path=str(screenshots / f"{name}-1366.png"), full_page=True)
                assert columns_outside(page, 1366) == [], name
                results = page.locator("#changelist .results")
                assert results.evaluate("e => e.scrollWidth <= e.clientWidth"), name
                # Ids are cut on screen, whole in the text: hover and copy give all of it.
                short = page.locator("#result_list .kw-id").first
                full = short.get_attribute("title")
                assert short.text_content() == full and len(full) == 36
                assert short.evaluate("e => e.scrollWidth > e.clientWidth"), name

            page.goto(f"{admin}/workflowrun/")
            schedules = page.locator("#kw-cron-schedules")
            expect(schedules).to_contain_text(cw.nightly_berlin.name)
            expect(schedules).to_contain_text(re.compile(r":30:00 CES?T"))  # its own zone, named
            for button in ("Pause", "Fire now"):
                box = schedules.get_by_role("button", name=button).bounding_box()
                assert box is not None and box["x"] + box["width"] <= 1366, button

            schedules.get_by_role("button", name="Pause").click()
            expect(page.locator(".messagelist .success")).to_contain_text("Paused")
            expect(page.locator("#kw-cron-schedules")).to_contain_text("paused since")
            page.locator("#kw-cron-schedules").get_by_role("button", name="Fire now").click()
            fired = page.locator(".messagelist .success")
            expect(fired).to_contain_text(f"Fired {cw.nightly_berlin.name} (tenant default) now")
            fired.get_by_role("link").click()
            expect(page.locator("#kw-why")).to_contain_text("Trigger event")
            expect(page.locator("#kw-timeline")).to_contain_text(et.RUN_STARTED)

            page.goto(f"{admin}/workflowrun/{failed.run_id}/change/")
            details = page.locator("#kw-timeline details").last
            expect(details.locator("pre")).to_be_hidden()
            details.locator("summary").click()
            expect(details.locator("pre")).to_be_visible()
            expect(details.locator("pre")).to_contain_text('"reason": "step_failed"')
            page.screenshot(path=str(screenshots / "failed-run-1366.png"), full_page=True)
        finally:
            browser.close()
