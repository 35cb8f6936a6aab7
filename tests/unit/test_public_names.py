"""The package's public names: ``_EXPORTS``, ``__all__`` and the typing imports say the same."""

from __future__ import annotations

import ast
from pathlib import Path

import kumiko_workflows

SOURCE = Path(kumiko_workflows.__file__).read_text()


def _typing_imports() -> dict[str, str]:
    """name -> module of every import under ``if TYPE_CHECKING:`` in ``__init__.py``."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(SOURCE)):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in ast.walk(node):
                if isinstance(statement, ast.ImportFrom) and statement.module:
                    for alias in statement.names:
                        name = alias.asname or alias.name
                        module = statement.module
                        if module == "kumiko_workflows":  # ``import steps``: the module itself
                            module = f"{module}.{alias.name}"
                        found[name] = module
    return found


def test_all_the_exports_and_the_typing_imports_name_the_same_things():
    exports = kumiko_workflows._EXPORTS
    assert sorted(kumiko_workflows.__all__) == sorted([*exports, "__version__"])
    assert _typing_imports() == exports


def test_every_public_name_resolves_to_what_its_module_holds():
    from importlib import import_module

    for name, module_name in kumiko_workflows._EXPORTS.items():
        module = import_module(module_name)
        expected = module if module_name.endswith("." + name) else getattr(module, name)
        assert getattr(kumiko_workflows, name) is expected, name


def test_the_step_kind_helpers_are_public():
    from kumiko_workflows import steps

    helpers = {"Step", "Execution", "Suspend", "describe_value", "is_static", "path_text"}
    assert helpers | {"callable_name", "iter_steps"} <= set(steps.__all__)
    assert all(getattr(steps, name) for name in steps.__all__)
