"""The package's layers, checked from its source: one-way imports, no cycle, no hidden import.

Layers, lowest first: the workflow model (``workflow/``, with ``steps`` and
``event_types`` its public import paths, ``exceptions`` and ``conf``)
touches no database; ``store/`` and ``models/`` (the database layer, the
event store, run streams); ``projections/``; ``engine/`` (segments, starts,
resuming, the worker, cron, wake-ups); ``operations/`` and the admin
package and commands on top. A module may
import its own layer and those below it, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent.parent / "kumiko_workflows"

#: The layer of each module, by the first match of its dotted name's prefix.
LAYERS = [
    ("kumiko_workflows.workflow", 0),
    ("kumiko_workflows.steps", 0),  # the public path of workflow.steps
    ("kumiko_workflows.match", 0),  # the match builder, beside the step vocabulary
    ("kumiko_workflows.event_types", 0),  # the public path of workflow.event_types
    ("kumiko_workflows.exceptions", 0),
    ("kumiko_workflows.conf", 0),
    ("kumiko_workflows.signals", 0),  # the signals' definitions: what a site connects to
    ("kumiko_workflows.models", 1),
    ("kumiko_workflows.routers", 1),
    ("kumiko_workflows.store", 1),
    ("kumiko_workflows.telemetry", 1),
    ("kumiko_workflows.telemetry_instruments", 1),  # the attribute keys and instruments
    ("kumiko_workflows.projections", 2),
    ("kumiko_workflows.engine", 3),
    ("kumiko_workflows.operations", 4),
    ("kumiko_workflows.checks", 4),
    ("kumiko_workflows.tasks", 4),  # the Django Tasks backend: runs on the engine
    ("kumiko_workflows.admin", 5),
    ("kumiko_workflows.aio", 5),
    ("kumiko_workflows.management", 5),
    ("kumiko_workflows.apps", 5),
    ("kumiko_workflows", 5),  # the package's lazy public names
]
#: Where an import inside a function is the Django way, not a cycle dodged:
#: the app's ready() wiring, and the package's lazy public names.
FUNCTION_IMPORTS_ALLOWED = {"kumiko_workflows.apps", "kumiko_workflows"}


def layer(module: str) -> int:
    return next(
        level for prefix, level in LAYERS if module == prefix or module.startswith(prefix + ".")
    )


def _modules() -> dict[str, str]:
    """The package's modules (migrations aside), by dotted name, with their source."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path.read_text()
    return found


def _imports(modules: dict[str, str]) -> list[tuple[str, str, bool]]:
    """(importer, imported, inside a function) for every import of a package module."""
    found = []
    for name, source in modules.items():
        tree = ast.parse(source)
        in_function = {
            id(node)
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(function)
        }
        typing_only = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
            for node in ast.walk(block)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "kumiko_workflows":
                    targets = [f"kumiko_workflows.{a.name}" for a in node.names]
                elif node.module.startswith("kumiko_workflows."):
                    targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("kumiko_workflows")]
            for target in targets:
                if target in modules and target != name:
                    found.append((name, target, id(node) in in_function))
    return found


def _upward(modules: dict[str, str]) -> list[str]:
    return [
        f"{importer} (layer {layer(importer)}) imports {imported} (layer {layer(imported)})"
        for importer, imported, _ in _imports(modules)
        if layer(imported) > layer(importer)
    ]


def _hidden(modules: dict[str, str]) -> list[str]:
    return [
        f"{importer} imports {imported} inside a function"
        for importer, imported, inside in _imports(modules)
        if inside and importer not in FUNCTION_IMPORTS_ALLOWED
    ]


def test_no_module_imports_a_layer_above_its_own():
    assert _upward(_modules()) == []


def test_the_workflow_model_never_touches_the_database():
    modules = _modules()
    for name, source in modules.items():
        if layer(name) == 0:
            assert "django.db" not in source, f"{name} imports django.db"


def test_no_import_cycle_and_no_import_hidden_in_a_function():
    modules = _modules()
    imports = _imports(modules)
    assert _hidden(modules) == []

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for importer, imported, _ in imports:
        graph[importer].add(imported)
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    # The package itself imports its submodules lazily (its public names):
    # a submodule importing ``kumiko_workflows`` is the package's own init.
    cycles = [c for c in cycles if "kumiko_workflows" not in c]
    assert cycles == []


def test_the_layer_checks_see_a_violation():
    """The checks above can fail: an upward and a hidden import are both found."""
    modules = {
        "kumiko_workflows.workflow.bad": (
            "from kumiko_workflows.engine import resume\n"
            "def f():\n    from kumiko_workflows.store import db\n"
        ),
        "kumiko_workflows.engine.resume": "",
        "kumiko_workflows.store.db": "",
    }
    assert _upward(modules) == [
        "kumiko_workflows.workflow.bad (layer 0) imports kumiko_workflows.engine.resume (layer 3)",
        "kumiko_workflows.workflow.bad (layer 0) imports kumiko_workflows.store.db (layer 1)",
    ]
    assert _hidden(modules) == [
        "kumiko_workflows.workflow.bad imports kumiko_workflows.store.db inside a function"
    ]
