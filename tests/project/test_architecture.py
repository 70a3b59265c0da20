"""The package's shape, held by reading its source: layers import only downward, no cycles.

The import graph is built with ast from tspbench/ and strategies/ (installed as
tspbench.strategies). Function-level imports count, and so do imports under ``if TYPE_CHECKING:``
(a type-only import still ties two modules: no circle through one either).
Rules (docs/strategies.md, "Where the code lives"):

    core        no torch, nothing else from tspbench
    model       core only, never torch.distributed
    strategies  (the plugins) only the plugin API, dist, model, costs and core
    strategy    (the plugin API) never imports a plugin
    report      no torch anywhere in what it imports; sweep and report reach strategies only
                through the registry
    calibrate   measuring a host into a profile: above measure (it runs real steps), below sweep
    checks      the models' checks: above analytic, measure, calibrate, sweep and report (they
                drive them all); nothing but cli imports a check (the report and the docs read
                what the checks stored)
    cli         the only package that parses argv or prints; nothing imports it
and no private name is imported across modules, tspbench modules are imported lazily only
in cli, and no harness (apt-get, Slurm daemons) ships inside the installed package.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = {"tspbench": ROOT / "tspbench", "tspbench.strategies": ROOT / "strategies"}

# Layers, bottom to top: a module imports its own layer or lower ones only.
LAYERS = {
    "core": 0, "model": 1, "costs": 1, "dist": 2, "strategy": 3, "strategies": 4,
    "analytic": 5, "measure": 6, "calibrate": 7, "sweep": 8, "report": 9, "checks": 10, "cli": 11,
}  # fmt: skip
HARNESS_WORDS = ("apt-get", "slurmctld", "slurmdbd", "munged", "mariadb")


@dataclass
class Module:
    name: str
    path: Path
    imports: set[str] = field(default_factory=set)  # every module-or-package name imported
    statements: list[tuple[str, list[str]]] = field(default_factory=list)  # (from-base, full names)
    lazy: set[str] = field(default_factory=set)  # tspbench modules imported inside a function
    private: list[str] = field(default_factory=list)  # "from x import _y" of a tspbench x
    prints: list[int] = field(default_factory=list)  # lines that call print()

    @property
    def package(self) -> str:
        """'core', 'model', ..., 'strategies' for the plugins, '' for top-level modules."""
        parts = self.name.split(".")
        return parts[1] if len(parts) > 2 or (self.path.name == "__init__.py" and len(parts) > 1) else ""


def _module_name(base: str, root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([base, *parts])


def _parse(name: str, path: Path) -> Module:
    tree = ast.parse(path.read_text())
    module = Module(name, path)
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nested = {id(n) for f in functions for n in ast.walk(f) if n is not f}
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            module.prints.append(node.lineno)
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative imports: resolve against this module's package
                here = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            if base.startswith("tspbench"):
                module.private += [f"{base}.{a.name}" for a in node.names if a.name.startswith("_")]
        module.imports.update(t for t in targets if t)
        if targets:
            module.statements.append((targets[0], targets[1:] or targets))
        if targets and id(node) in nested and targets[0].startswith("tspbench"):
            module.lazy.add(targets[0])
    return module


def modules() -> dict[str, Module]:
    out = {}
    for base, root in PACKAGE_DIRS.items():
        for path in sorted(root.rglob("*.py")):
            name = _module_name(base, root, path)
            out[name] = _parse(name, path)
    return out


def edges(mods: dict[str, Module]) -> dict[str, set[str]]:
    """Module -> the tspbench modules it imports ('from pkg import mod' counts as mod, not pkg)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, mod in mods.items():
        for base, names in mod.statements:
            found = [t for t in names if t in mods] or ([base] if base in mods else [])
            graph[name].update(t for t in found if t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


MODS = modules()
GRAPH = edges(MODS)


def of(package: str) -> list[Module]:
    return [m for m in MODS.values() if m.package == package]


def tspbench_imports(mod: Module) -> set[str]:
    return {t for t in mod.imports if t.startswith("tspbench.") and t in MODS}


def test_every_layer_has_modules() -> None:
    assert set(LAYERS) <= {m.package for m in MODS.values()}, "a layer listed here has no modules"
    strays = [
        m.name for m in MODS.values() if m.package == "" and m.name not in ("tspbench", "tspbench.__main__")
    ]
    assert not strays, f"modules outside the layered subpackages: {strays}"


def test_no_import_cycles() -> None:
    assert cycles(GRAPH) == []


def test_layers_import_only_downward() -> None:
    bad = []
    for mod in MODS.values():
        if mod.package not in LAYERS:
            continue
        for target in tspbench_imports(mod):
            layer = MODS[target].package
            if layer in LAYERS and LAYERS[layer] > LAYERS[mod.package]:
                bad.append(f"{mod.name} ({mod.package}) imports {target} ({layer})")
    assert not bad, "\n".join(bad)


def test_core_imports_no_torch_and_nothing_else_from_tspbench() -> None:
    for mod in of("core"):
        assert not any(t.split(".")[0] == "torch" for t in mod.imports), mod.name
        assert all(t.startswith("tspbench.core") for t in tspbench_imports(mod)), mod.name


def test_the_model_imports_only_core_and_never_torch_distributed() -> None:
    for mod in of("model"):
        assert not any(t.startswith("torch.distributed") for t in mod.imports), mod.name
        assert all(t.startswith(("tspbench.core", "tspbench.model")) for t in tspbench_imports(mod)), mod.name


def test_plugins_import_only_the_api_dist_model_costs_and_core() -> None:
    allowed = tuple(f"tspbench.{p}" for p in ("strategy", "strategies", "dist", "model", "costs", "core"))
    for mod in of("strategies"):
        extra = sorted(t for t in tspbench_imports(mod) if not t.startswith(allowed))
        assert not extra, f"{mod.name} imports {extra}"


def test_the_plugin_api_never_imports_a_plugin() -> None:
    for mod in of("strategy"):
        assert not any(t.startswith("tspbench.strategies") for t in mod.imports), mod.name


def test_sweep_and_report_reach_strategies_only_through_the_registry() -> None:
    for mod in of("sweep") + of("report"):
        assert not any(t.startswith("tspbench.strategies") for t in mod.imports), mod.name


def test_report_needs_no_torch() -> None:
    for mod in of("report"):
        reached = closure(GRAPH, mod.name)
        torchy = sorted(m for m in reached if any(t.split(".")[0] == "torch" for t in MODS[m].imports))
        assert not torchy, f"{mod.name} reaches torch through {torchy}"


def test_only_cli_parses_argv_or_prints() -> None:
    for mod in MODS.values():
        if mod.package == "cli":
            continue
        assert "argparse" not in mod.imports, f"{mod.name} imports argparse"
        assert not mod.prints, f"{mod.name} calls print() on lines {mod.prints}"


def test_nothing_imports_cli() -> None:
    importers = sorted(m for m, targets in GRAPH.items() if MODS[m].package != "cli" and any(
        t.startswith("tspbench.cli") for t in targets))  # fmt: skip
    assert importers in ([], ["tspbench.__main__"]), importers


def test_only_cli_imports_the_checks() -> None:
    importers = sorted(m for m, targets in GRAPH.items() if MODS[m].package not in ("cli", "checks") and any(
        t.startswith("tspbench.checks") for t in targets))  # fmt: skip
    assert importers == [], importers


def test_no_private_names_across_modules_and_no_lazy_tspbench_imports_outside_cli() -> None:
    for mod in MODS.values():
        assert not mod.private, f"{mod.name} imports private names {mod.private}"
        if mod.package != "cli":
            assert not mod.lazy, f"{mod.name} imports {sorted(mod.lazy)} inside a function"


@pytest.mark.parametrize("word", HARNESS_WORDS)
def test_no_harness_inside_the_installed_package(word: str) -> None:
    hits = [m.name for m in MODS.values() if word in m.path.read_text()]
    assert not hits, f"{word!r} appears in {hits}: harnesses belong in tools/ or tests/"


def test_pyproject_installs_every_package_and_no_top_level_strategies() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {m.name for m in MODS.values() if m.path.name == "__init__.py"}
    assert set(config["packages"]) == packages
    assert config["package-dir"] == {"tspbench.strategies": "strategies"}
    assert "strategies" not in config["packages"]


def test_the_graph_sees_known_edges() -> None:
    """The checks above are only as good as the graph: a few edges that must be in it."""
    assert "tspbench.dist.comm" in GRAPH["tspbench.strategies.tsp_ring"]
    assert "tspbench.strategy.base" in GRAPH["tspbench.strategy.registry"]
    assert "tspbench.checks.backtest" in GRAPH["tspbench.cli.backtest"]  # a lazy import counts
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_measure_holds_only_what_runs_a_step() -> None:
    """measure/ runs or executes a step; calibrating a host and the GPU check live elsewhere."""
    modules_of_measure = sorted(m.name for m in of("measure") if m.path.name != "__init__.py")
    assert len(modules_of_measure) <= 16, modules_of_measure
    assert LAYERS["measure"] < LAYERS["calibrate"] < LAYERS["sweep"]
    assert "tspbench.calibrate.profile" in GRAPH["tspbench.checks.gpu_check"]  # gpu-check calibrates
