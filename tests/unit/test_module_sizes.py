"""No module of the package is over 500 lines: a module holds one idea (CONTRIBUTING).

The migrations are Django's and left out. A module that grows past the
limit is split along its ideas into modules beside it.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent.parent / "kumiko_workflows"
MOST_LINES = 500


def _lengths() -> dict[str, int]:
    """Each module's lines (migrations aside), by its path inside the package."""
    return {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.relative_to(PACKAGE).parts
    }


def _oversized(lengths: dict[str, int]) -> list[str]:
    return [
        f"kumiko_workflows/{name} has {count} lines (at most {MOST_LINES})"
        for name, count in lengths.items()
        if count > MOST_LINES
    ]


def test_no_module_of_the_package_is_over_500_lines():
    lengths = _lengths()
    assert "engine/segment.py" in lengths and "migrations/0001_initial.py" not in lengths
    assert _oversized(lengths) == []


def test_the_size_check_names_a_module_over_the_limit_and_its_length():
    assert _oversized({"engine/big.py": 501, "engine/small.py": 500}) == [
        "kumiko_workflows/engine/big.py has 501 lines (at most 500)"
    ]
