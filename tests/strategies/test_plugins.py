"""Every built-in plugin module (strategies/, installed as tspbench.strategies): the strategy
modules each register one strategy under their file's name, and the helper modules of TSP
(its attention loop and its rings) register none. Each strategy's numerics are checked against
the single-device reference in tests/strategies/test_numerics.py; this test only holds the plugin
folder and the registry to each other."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from tspbench.strategies import dp, fsdp, fsdp_sp, sp, tp, tp_sp, tsp, tsp_attention, tsp_mlp, tsp_ring

from tspbench.strategy import Strategy, available, get_strategy

FOLDER = Path(__file__).resolve().parents[2] / "strategies"
MODULES = sorted(p.stem for p in FOLDER.glob("*.py") if p.stem != "__init__")
HELPERS = {"tsp_attention", "tsp_mlp", "tsp_ring"}  # TSP's pieces, not strategies
# imported by name, not from a string: tests/project/test_layout.py reads which modules tests import
IMPORTED = {
    m.__name__.rpartition(".")[2]: m
    for m in (dp, fsdp, fsdp_sp, sp, tp, tp_sp, tsp, tsp_attention, tsp_mlp, tsp_ring)
}


@pytest.mark.parametrize("module", MODULES)
def test_each_plugin_module_imports_and_defines_what_its_name_says(module: str) -> None:
    assert module in IMPORTED, f"strategies/{module}.py: import it above"
    loaded = IMPORTED[module]
    own = [
        c for _, c in inspect.getmembers(loaded, inspect.isclass)
        if issubclass(c, Strategy) and c.__module__ == loaded.__name__ and c.name
    ]  # fmt: skip
    if module in HELPERS:
        assert own == []
    else:
        assert [c.name for c in own] == [module]
        assert get_strategy(module) is own[0]


def test_the_registry_holds_exactly_the_strategy_modules() -> None:
    assert set(available()) >= set(MODULES) - HELPERS
    assert set(MODULES) - HELPERS == {"dp", "fsdp", "fsdp_sp", "sp", "tp", "tp_sp", "tsp"}
