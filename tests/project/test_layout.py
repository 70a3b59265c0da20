"""Tests you can find (tests/README.md): a test file sits in tests/<layer>/, the layer of tspbench
it tests (a folder of tspbench/, or strategies/ for the plugins), or in tests/project/ when it
tests the repository as a whole, and is named test_<module>.py or test_<topic>.py; the helpers the
files share (conftest.py, cli_exit.py, ...) sit at tests/ itself. Every plugin module of
strategies/ and every module of tspbench/costs/ is imported by name by at least one test file.

The folders and the modules are read from the repository, so a new layer, plugin or cost module
is held to the rule the moment it exists."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
LAYERS = sorted(p.name for p in (ROOT / "tspbench").iterdir() if (p / "__init__.py").exists())
FOLDERS = {*LAYERS, "strategies", "project"}
ALLOWED = ", ".join(sorted(FOLDERS))


def _modules(folder: Path, package: str) -> list[str]:
    return sorted(f"{package}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__")


MUST_BE_IMPORTED = [
    *_modules(ROOT / "strategies", "tspbench.strategies"),
    *_modules(ROOT / "tspbench" / "costs", "tspbench.costs"),
]


@functools.cache
def _imports(path: Path) -> set[str]:
    """Modules a file imports: ``import a.b``, ``from a.b import c`` (a.b, and a.b.c in case c is
    a module); function-level imports count."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_layers_are_the_packages_of_tspbench() -> None:
    assert {"core", "model", "dist", "strategy", "costs", "analytic", "measure"} <= set(LAYERS)
    assert {"sweep", "report", "checks", "cli"} <= set(LAYERS)


def test_every_test_file_sits_in_a_layer_folder_and_every_helper_at_tests() -> None:
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        where = path.relative_to(TESTS)
        is_test = where.name.startswith("test_") or where.stem.endswith("_test")  # what pytest collects
        if len(where.parts) == 1:
            if is_test:
                wrong.append(f"tests/{where}: a test file goes in tests/<layer>/ ({ALLOWED})")
        elif len(where.parts) > 2 or where.parts[0] not in FOLDERS:
            wrong.append(f"tests/{where}: not one of tests/<layer>/ ({ALLOWED})")
        elif not where.name.startswith("test_"):
            wrong.append(f"tests/{where}: a file of a layer folder is a test_*.py; helpers sit at tests/")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module", MUST_BE_IMPORTED)
def test_every_plugin_and_cost_module_is_imported_by_a_test(module: str) -> None:
    importers = [path for path in TESTS.rglob("test_*.py") if module in _imports(path)]
    layer = "strategies" if module.startswith("tspbench.strategies.") else "costs"
    name = module.rpartition(".")[2]
    assert importers, f"{module}: no test imports it (its test: tests/{layer}/test_{name}.py)"
