"""The documentation's Python runs: every ```python block of every page, against the test database.

The pages are README.md and every Markdown page of the docs site (docs/).
Each page runs in a namespace of its own, its blocks in order, as a reader
following the page top to bottom would; a page that builds on another says
so in a ``<!-- continues: other/page.md -->`` line (its first), and starts
from the namespace that page's blocks leave. The site's own workflows are
hidden meanwhile, so each page's definitions stand alone, and whatever a
page defines is gone after it. A block that cannot run on its own (a line
of settings.py) says why in a ``<!-- not-run: reason -->`` comment right
above it; there are few.

The site itself is built by ``.ci/run`` with warnings as errors; the tests
below also prove that such a build fails on a code fence left open and on
a broken link.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kumiko_workflows import event_types as et
from kumiko_workflows import load_stream, run_id_for
from kumiko_workflows.conf import DEFAULTS
from kumiko_workflows.models import WorkflowRun
from kumiko_workflows.workflow.registry import registry
from tests.support import REPO

DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
from fences import unclosed_fences  # noqa: E402 - the docs' own Sphinx extension

README = REPO / "README.md"
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
NOT_RUN = re.compile(r"^<!-- not-run: (?P<reason>.*\S) -->$")
CONTINUES = re.compile(r"^<!-- continues: (?P<page>\S+\.md) -->$")
#: Blocks the pages may leave unrun, all pages together; each costs a reader's trust.
MOST_NOT_RUN = 3


def page_name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@dataclass
class Block:
    line: int  # the page's line of the block's first line of code
    code: str
    not_run: str | None  # why it is not run, or None


def python_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() != "```python":
            index += 1
            continue
        before = index - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = NOT_RUN.match(lines[before].strip()) if before >= 0 else None
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        code = textwrap.dedent("\n".join(lines[index + 1 : end]))  # a block in a list item
        blocks.append(Block(index + 2, code, marker and marker["reason"]))
        index = end + 1
    return blocks


def continues(path: Path) -> Path | None:
    """The page this page builds on, from its first line, or None."""
    first = path.read_text().splitlines()[0].strip()
    found = CONTINUES.match(first)
    return DOCS / found["page"] if found else None


def run_page(path: Path, namespace: dict) -> None:
    before = continues(path)
    if before is not None:
        run_page(before, namespace)
    for block in python_blocks(path.read_text()):
        if block.not_run:
            continue
        # Padded so that a traceback names the page's own line numbers; compiled
        # without this module's __future__ imports, as a reader's module would be.
        padded = "\n" * (block.line - 1) + block.code
        code = compile(padded, str(path), "exec", dont_inherit=True)
        exec(code, namespace)  # noqa: S102 - the docs' own code


def test_every_page_is_found_and_few_blocks_are_not_run():
    names = {page_name(path) for path in PAGES}
    assert {"README.md", "docs/index.md", "docs/reference/api.md"} <= names
    blocks = [
        (page_name(path), block) for path in PAGES for block in python_blocks(path.read_text())
    ]
    assert len(blocks) >= 20
    not_run = [(name, block.line, block.not_run) for name, block in blocks if block.not_run]
    assert len(not_run) <= MOST_NOT_RUN, not_run
    for name, block in blocks:
        compile(block.code, f"{name}:{block.line}", "exec")  # even those not run parse


def test_a_continued_page_exists_and_continues_no_further():
    for path in PAGES:
        before = continues(path)
        if before is not None:
            assert before.is_file(), f"{page_name(path)} continues a missing page"
            assert continues(before) is None, f"{page_name(path)}: one level is enough"


def test_the_block_finder_sees_markers_lines_and_indented_blocks():
    text = (
        "a\n```python\nx = 1\n```\n\n<!-- not-run: settings -->\n\n```python\ny = 2\n```\n"
        "1. a step\n\n   ```python\n   z = 3\n   ```\n"
    )
    assert python_blocks(text) == [
        Block(3, "x = 1", None),
        Block(9, "y = 2", "settings"),
        Block(14, "z = 3", None),
    ]


def _lifecycle(namespace: dict) -> None:
    # The order of the first workflow: woken by its payment, charged, then cancelled.
    order_run = WorkflowRun.objects.get(
        run_id=run_id_for("order-fulfilment", namespace["order_id"])
    )
    assert order_run.status == "cancelled"
    types = [event.type for event in load_stream(order_run.run_id)]
    assert types[:2] == [et.RUN_STARTED, et.WAITING_FOR_EVENT]
    assert et.RUN_CANCELLED in types
    assert namespace["report"].resumed == 1  # woken by order.paid, then waiting an hour


def _readme(namespace: dict) -> None:
    run = WorkflowRun.objects.get(run_id=run_id_for("onboarding", namespace["user_id"]))
    assert run.status == "completed"
    assert load_stream(run.run_id)[-1].payload["state"]["results"]["greet"] == "welcomed"


def _cron(namespace: dict) -> None:
    assert registry.get("dunning") is namespace["nightly_dunning"]


def _versions(namespace: dict) -> None:
    assert [w.version for w in registry.versions("order-fulfilment")] == [1, 2]


#: What some pages' blocks did, as the page says they do.
CHECKS: dict[str, Callable[[dict], None]] = {
    "README.md": _readme,
    "docs/concepts/lifecycle.md": _lifecycle,
    "docs/howto/cron.md": _cron,
    "docs/howto/versions.md": _versions,
}


@pytest.mark.django_db
@pytest.mark.parametrize("path", PAGES, ids=page_name)
def test_every_python_block_of_the_page_runs_in_order(path: Path):
    namespace: dict = {"__name__": "docs_" + re.sub(r"\W", "_", page_name(path))}
    site = [workflow.name for workflow in registry.all()]
    with registry.without(*site):
        run_page(path, namespace)
        check = CHECKS.get(page_name(path))
        if check is not None:
            check(namespace)
    assert registry.get("dunning") is None  # what a page defined is gone after it


def test_the_settings_block_shows_every_default():
    (block,) = (
        block
        for block in python_blocks((DOCS / "reference" / "settings.md").read_text())
        if '"DATABASE": "default",' in block.code
    )
    namespace: dict = {}
    exec(block.code, namespace)  # noqa: S102 - the docs' own code
    assert namespace["KUMIKO_WORKFLOWS"] == DEFAULTS


def test_the_readme_is_a_front_page_with_its_test_command():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200
    # .ci/run reads the command as the second line after the marker.
    marker = lines.index("<!-- test-command -->")
    assert lines[marker + 1] == "```sh"
    assert lines[marker + 2].startswith("python3 -m venv .venv && ")
    assert ".venv/bin/pytest" in lines[marker + 2]


@pytest.mark.parametrize("path", PAGES, ids=page_name)
def test_every_code_fence_is_closed(path: Path):
    assert unclosed_fences(path.read_text()) == []


def test_the_fence_check_finds_a_fence_left_open():
    # How "Health checks for orchestrators" once rendered inside a shell block.
    left_open = (
        "## Retention\n\n```sh\npurge\n\n### Health checks\n\n```yaml\nprobe: 1\n```\n\ntext\n"
    )
    (problem,) = unclosed_fences(left_open)
    assert "opened on line 3 is not closed before another opens on line 8" in problem
    assert unclosed_fences("```python\nx = 1\n") == [
        "the code fence opened on line 1 is never closed"
    ]
    # Closed fences, a longer fence around a shorter one, and tildes are fine.
    fine = "```sh\na\n```\n\n````md\n```python\nx\n```\n````\n\n   ~~~\n   b\n   ~~~\n"
    assert unclosed_fences(fine) == []


def _build(source: Path, page: str) -> subprocess.CompletedProcess[str]:
    source.mkdir()
    (source / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(DOCS / '_ext')!r})\n"
        "extensions = ['myst_parser', 'fences']\nmyst_heading_anchors = 3\n"
    )
    (source / "index.md").write_text("# Index\n\n```{toctree}\nother\n```\n\n## A heading\n")
    (source / "other.md").write_text(page)
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         str(source), str(source / "_build")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_build_with_warnings_as_errors_fails_on_an_open_fence_and_a_broken_link(tmp_path):
    good = _build(
        tmp_path / "good", "# Other\n\n[the index](index.md#a-heading)\n\n```sh\nls\n```\n"
    )
    assert good.returncode == 0, good.stderr

    left_open = _build(tmp_path / "open", "# Other\n\n```sh\nls\n\n## Gone\n\n```yaml\na: 1\n```\n")
    assert left_open.returncode != 0
    assert "is not closed before another opens on line 8" in left_open.stderr

    broken = _build(
        tmp_path / "broken", "# Other\n\n[nowhere](missing.md) [no heading](index.md#nope)\n"
    )
    assert broken.returncode != 0
    assert "missing.md" in broken.stderr and "nope" in broken.stderr


def test_the_readmes_links_to_files_of_the_repository_exist():
    # The README is not part of the Sphinx build, which checks the docs' own links.
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [target for target in targets if "://" not in target]
    assert "docs/index.md" in local and "CONTRIBUTING.md" in local
    assert [target for target in local if not (REPO / target).exists()] == []
