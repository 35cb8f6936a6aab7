"""What ``pip install .`` ships: the engine, and no benchmark.

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

import pytest

from tests.conftest import REPO

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
