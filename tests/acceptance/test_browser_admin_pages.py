"""The dashboard and the run pages in a real browser: widths, themes, overflow, accessibility.

Headless Chromium (Debian's, as in ``tests/acceptance/test_browser.py``) opens the
dashboard, a workflow's page and four runs (waiting, failed, retried,
completed) at 1366 and 1920 px, in admin's light and dark themes; on each
it checks that nothing is wider than the window or than its own box, and
runs axe-core in the page (the copy that the ``axe-playwright-python``
package ships, from the ``test`` extra: nothing is fetched), failing on any
serious or critical violation of WCAG 2.1 A/AA, colour contrast included.
Screenshots go to ``OUTPUT_DIR/browser/admin-pages/`` (``test-output/`` in a
clone, which git ignores; ``KUMIKO_TEST_OUTPUT`` moves it).
"""

from __future__ import annotations

import json
from datetime import timedelta
from importlib import resources
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from kumiko_workflows import resume_due_runs, run_id_for
from kumiko_workflows.models import WorkerHeartbeat, WorkflowRun
from tests.acceptance.test_browser import CHROMIUM, CHROMIUM_ARGS, in_a_thread, log_in, pytestmark  # noqa: F401
from tests.support import trigger

WIDTHS = (1366, 1920)
THEMES = ("light", "dark")

#: Everything on the page wider than the window, or wider than the box it scrolls in.
OVERFLOW = """() => {
    const width = document.documentElement.clientWidth;
    const found = [];
    if (document.documentElement.scrollWidth > width) {
        found.push('page: ' + document.documentElement.scrollWidth + ' > ' + width);
    }
    for (const box of document.querySelectorAll('#content *')) {
        const r = box.getBoundingClientRect();
        if (r.width && r.right > width + 0.5) {
            const name = box.id || box.className || box.tagName;
            found.push(name + ' ends at ' + Math.round(r.right));
        }
    }
    for (const box of document.querySelectorAll('.kw-diagram, .kw-table-wrap, .kw-chart')) {
        if (box.scrollWidth > box.clientWidth + 1) {
            const name = box.id || box.className;
            found.push(name + ' scrolls: ' + box.scrollWidth + ' > ' + box.clientWidth);
        }
    }
    return found.slice(0, 20);
}"""

AXE = """async () => {
    const result = await axe.run(document, {
        runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']},
        resultTypes: ['violations'],
    });
    return result.violations
        .filter(v => v.impact === 'serious' || v.impact === 'critical')
        .map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 5)
            .map(n => n.target.join(' ') + ': ' + n.failureSummary)}));
}"""


def axe_source() -> str:
    return (resources.files("axe_playwright_python") / "axe.min.js").read_text(encoding="utf-8")


def seed_runs() -> dict[str, str]:
    """A waiting, a failed, a retried and a completed run; a worker's heartbeat. Their ids."""
    until = (timezone.now() + timedelta(hours=1)).isoformat()
    waiting = trigger("t.branch", go_then=True, **{"for": until})
    failed = trigger("t.fail")
    retried = trigger("t.retry", fail_attempts=1)
    completed = trigger("t.branch", go_then=False)
    resume_due_runs(now=timezone.now() + timedelta(minutes=5))
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        name="web-1:4242",
        hostname="web-1",
        pid=4242,
        tenants=[],
        loop=True,
        started_at=now,
        seen_at=now,
    )
    ids = {
        "waiting": run_id_for("t-branch", waiting.payload["run_key"], "default"),
        "failed": run_id_for("t-fail", failed.payload["run_key"], "default"),
        "retried": run_id_for("t-retry", retried.payload["run_key"], "default"),
        "completed": run_id_for("t-branch", completed.payload["run_key"], "default"),
    }
    statuses = {name: WorkflowRun.objects.get(run_id=run_id).status for name, run_id in ids.items()}
    assert statuses == {
        "waiting": "waiting",
        "failed": "failed",
        "retried": "completed",
        "completed": "completed",
    }
    return {name: str(run_id) for name, run_id in ids.items()}


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_and_run_pages_fit_both_widths_and_themes_and_pass_axe(
    live_server, django_user_model
):
    from playwright.sync_api import expect, sync_playwright

    django_user_model.objects.create_superuser("root", "root@example.com", "secret-pw")
    ids = seed_runs()
    admin = "/admin/kumiko_workflows/workflowrun"
    pages = {
        "dashboard": f"{admin}/dashboard/",
        "workflow": f"{admin}/workflows/t-branch/",
        **{name: f"{admin}/{run_id}/change/" for name, run_id in ids.items()},
    }
    folder = Path(settings.OUTPUT_DIR) / "browser" / "admin-pages"
    folder.mkdir(parents=True, exist_ok=True)
    axe = axe_source()
    problems: dict[str, list] = {}

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for theme in THEMES:
                for width in WIDTHS:
                    context = browser.new_context(
                        viewport={"width": width, "height": 1000}, color_scheme=theme
                    )
                    page = context.new_page()
                    log_in(page, live_server.url, "/admin/")
                    # Admin's own theme switch, set as its toggle sets it.
                    page.evaluate("(theme) => localStorage.setItem('theme', theme)", theme)
                    for name, url in pages.items():
                        page.goto(live_server.url + url)
                        expect(page.locator("#content")).to_be_visible()
                        assert (
                            page.evaluate("() => document.documentElement.dataset.theme") == theme
                        ), (name, theme)
                        key = f"{name}-{width}-{theme}"
                        page.screenshot(path=str(folder / f"{key}.png"), full_page=True)
                        overflow = page.evaluate(OVERFLOW)
                        if overflow:
                            problems[f"overflow {key}"] = overflow
                        if width == WIDTHS[0]:  # the same page at both widths: one axe run
                            page.add_script_tag(content=axe)
                            violations = page.evaluate(AXE)
                            if violations:
                                problems[f"axe {key}"] = violations
                    context.close()
        finally:
            browser.close()

    (folder / "problems.json").write_text(json.dumps(problems, indent=1))
    assert problems == {}, json.dumps(problems, indent=1)
    shots = sorted(path.name for path in folder.glob("*.png"))
    assert len(shots) >= len(pages) * len(WIDTHS) * len(THEMES)


@pytest.mark.django_db(transaction=True)
def test_the_run_page_shows_the_path_and_the_dashboard_links_into_the_lists(
    live_server, django_user_model
):
    from playwright.sync_api import expect, sync_playwright

    django_user_model.objects.create_superuser("root", "root@example.com", "secret-pw")
    ids = seed_runs()
    admin = f"{live_server.url}/admin/kumiko_workflows/workflowrun"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 1000})
            waiting = f"/admin/kumiko_workflows/workflowrun/{ids['waiting']}/change/"
            log_in(page, live_server.url, waiting)
            here = page.locator('[aria-current="step"]')
            expect(here).to_have_count(2)  # the branch, and the wait inside it
            expect(here.last).to_contain_text("waiting here")
            expect(page.locator('[data-arm="else"]')).to_contain_text("not taken")
            expect(page.locator("#kw-results")).to_contain_text("first")
            internals = page.locator("#kw-results details")
            expect(internals.locator("table")).to_be_hidden()
            internals.locator("summary").focus()
            page.keyboard.press("Enter")  # a keyboard opens the folded engine details
            expect(internals.locator("table")).to_be_visible()

            page.goto(f"{admin}/dashboard/")
            expect(page.locator("#kw-card-started")).to_contain_text("4")
            page.get_by_label("Workflow").select_option("t-fail")
            page.get_by_role("button", name="Show").click()
            expect(page).to_have_url(f"{admin}/dashboard/?workflow=t-fail")
            page.locator("#kw-reasons").get_by_role("link", name="step_failed").click()
            expect(page.locator("#result_list tbody tr")).to_have_count(1)
            expect(page.locator("#result_list")).to_contain_text("failed")
        finally:
            browser.close()
