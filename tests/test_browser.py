"""The admin in a real browser: headless Chromium driven by Playwright.

Log in, open a waiting run, press "Wake now", see the success message, let a
worker pass run, and see the run completed. A screenshot of the run page is
saved under ``OUTPUT_DIR/browser/`` before and after.
"""

from __future__ import annotations

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
from tests.conftest import trigger, types_of

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
            page.goto(f"{live_server.url}/admin/login/?next={run_url[len(live_server.url) :]}")
            page.fill("#id_username", "root")
            page.fill("#id_password", "secret-pw")
            page.click("input[type=submit]")

            expect(page.locator("#kw-why h2")).to_have_text("Why is this run waiting?")
            expect(page.locator("#kw-why")).to_contain_text("Due")
            expect(page.locator("#kw-why")).to_contain_text("no, in 59 min")
            page.screenshot(path=str(screenshots / "waiting.png"), full_page=True)
            page.click("#kw-wake_now")

            expect(page).to_have_url(run_url)
            expect(page.locator(".messagelist .success")).to_have_text(
                "Woke 1 run: the next worker pass resumes them."
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
