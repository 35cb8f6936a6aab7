"""What ``pip install .`` ships: the engine, no benchmark, and complete metadata.

``pip install .`` builds this wheel and unpacks it, so its file list is what
a user's site gets. The build runs on a copy of the checkout (setuptools
writes ``build/`` and ``*.egg-info`` where it builds), offline, with the
backend of the test venv.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.message import Message
from email.parser import Parser

import pytest

from tests.support import REPO

pytestmark = pytest.mark.packaging


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            "test-output",
            "*.sqlite3",
            "_build",
        ),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            "--wheel-dir",
            str(root / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = (root / "dist").glob("kumiko_workflows-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def test_the_wheel_ships_the_engine_and_no_benchmark(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    # It is the engine's wheel: the package, its commands and migrations are in it.
    assert "kumiko_workflows/__init__.py" in names
    assert "kumiko_workflows/management/commands/resume_due_runs.py" in names
    assert "kumiko_workflows/migrations/0001_initial.py" in names
    # Neither the bench app nor the old in-package bench.
    assert not [name for name in names if name.startswith("kumiko_bench")]
    assert not [name for name in names if "bench" in name.rsplit("/", 1)[-1]], names
    (top_level,) = (name for name in names if name.endswith(".dist-info/top_level.txt"))
    assert wheel.read(top_level).decode().split() == ["kumiko_workflows"]


def test_no_shipped_module_refers_to_the_benchmark(wheel: zipfile.ZipFile) -> None:
    # Nothing the site imports may reach for the bench (it is not installed there).
    referring = [
        name
        for name in wheel.namelist()
        if name.endswith(".py") and b"kumiko_bench" in wheel.read(name)
    ]
    assert referring == []


def test_the_wheel_ships_the_admin_templates(wheel: zipfile.ZipFile) -> None:
    templates = [name for name in wheel.namelist() if name.endswith(".html")]
    assert "kumiko_workflows/templates/admin/kumiko_workflows/workflowrun/change_form.html" in (
        templates
    )
    shipped = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "kumiko_workflows" / "templates").rglob("*.html")
    }
    assert set(templates) == shipped
    assert not [name for name in wheel.namelist() if "__pycache__" in name]


def test_the_wheel_ships_the_admin_stylesheet(wheel: zipfile.ZipFile) -> None:
    styles = {name for name in wheel.namelist() if name.endswith(".css")}
    shipped = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "kumiko_workflows" / "static").rglob("*.css")
    }
    assert "kumiko_workflows/static/kumiko_workflows/admin.css" in styles
    assert styles == shipped


def _metadata(wheel: zipfile.ZipFile) -> Message:
    (name,) = (name for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
    return Parser().parsestr(wheel.read(name).decode())


def test_the_wheel_metadata_is_complete(wheel: zipfile.ZipFile) -> None:
    metadata = _metadata(wheel)

    assert metadata["Name"] == "kumiko-workflows"
    assert metadata["Version"]
    assert metadata["Summary"].startswith("Durable, event-sourced workflows for Django")
    assert metadata["Author"] == "The kumiko_workflows authors"
    assert metadata["Requires-Python"] == ">=3.11"
    # The licence: an SPDX expression, and the file itself in the wheel.
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    (licence,) = (name for name in wheel.namelist() if name.endswith(".dist-info/licenses/LICENSE"))
    assert wheel.read(licence).decode() == (REPO / "LICENSE").read_text()
    classifiers = metadata.get_all("Classifier")
    for expected in (
        "Development Status :: 3 - Alpha",
        "Framework :: Django",
        "Framework :: Django :: 5.2",
        "Intended Audience :: Developers",
        "Programming Language :: Python :: 3.11",
        "Typing :: Typed",
    ):
        assert expected in classifiers
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Source", "Changelog", "Issues"}
    assert all(url.startswith("https://") for url in urls.values())
    assert {"postgres", "otel", "docs", "test"} <= set(metadata.get_all("Provides-Extra"))
    # The test extra installs the docs build, so the README's test command can build them.
    requires = metadata.get_all("Requires-Dist")
    assert any(r.startswith("sphinx") and 'extra == "test"' in r for r in requires), requires
    assert any(r.startswith("myst-parser") and 'extra == "test"' in r for r in requires)
    # The long description is the README, shown as Markdown.
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (REPO / "README.md").read_text().strip()
