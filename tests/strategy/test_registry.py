"""The strategy registry (tspbench.strategy.registry): names are unique and every error that
refuses one lists the known ones; a layout for any world; the checks run before any rank."""

from __future__ import annotations

import pytest

from tspbench.core.errors import LayoutError, WorkloadError
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.strategy import Strategy, registry

TINY = ModelConfig.preset("tiny")
BUILT_IN = {"dp", "fsdp", "fsdp_sp", "sp", "tp", "tp_sp", "tsp"}


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry as loaded, in a copy this test may add to (put back after it)."""
    registry.available()  # built-ins and entry points loaded into the real one first
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_a_duplicate_name_raises_and_lists_the_known_names(scratch_registry: None) -> None:
    class Impostor(Strategy):
        name = "tp"

    with pytest.raises(ValueError, match=r"'tp' is already registered by tspbench\.strategies\.tp") as info:
        registry.register(Impostor)
    assert "known: " + ", ".join(sorted(registry.available())) in str(info.value)
    assert registry.get_strategy("tp") is not Impostor


def test_registering_the_same_class_twice_is_harmless_and_a_nameless_one_raises(
    scratch_registry: None,
) -> None:
    @registry.register
    class Extra(Strategy):
        name = "extra"

    assert registry.register(Extra) is Extra and registry.get_strategy("extra") is Extra
    assert "extra" in registry.available() and Extra in list(registry.iter_strategies())

    class Nameless(Strategy):
        pass

    with pytest.raises(ValueError, match="Nameless has no name"):
        registry.register(Nameless)


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(LayoutError) as info:
        registry.get_strategy("zero")
    assert str(info.value) == f"unknown strategy 'zero'; known: {', '.join(registry.available())}"


def test_available_is_sorted_and_holds_the_built_ins() -> None:
    names = registry.available()
    assert names == sorted(names) and set(names) >= BUILT_IN
    assert [cls.name for cls in registry.iter_strategies()] == names


@pytest.mark.parametrize(
    ("strategy", "world", "degrees"),
    [
        ("dp", 4, {"dp": 4}),  # no axes of its own: dp takes the world
        ("tp", 8, {"tp": 8}),
        ("tp_sp", 8, {"tp": 4, "sp": 2}),  # innermost axis first, factors of two in turn
        ("tp_sp", 1, {}),
    ],
)
def test_layout_for_spreads_a_power_of_two_over_the_axes(strategy: str, world: int, degrees: dict) -> None:
    layout = registry.layout_for(registry.get_strategy(strategy), world)
    assert layout == Layout(strategy, **degrees) and layout.world_size == world


@pytest.mark.parametrize("world", [0, 3, 6])
def test_layout_for_refuses_a_world_that_is_not_a_power_of_two(world: int) -> None:
    with pytest.raises(LayoutError, match=f"power-of-two world, got {world}"):
        registry.layout_for(registry.get_strategy("tp"), world)


def test_check_layout_returns_the_class_and_refuses_an_axis_it_does_not_use() -> None:
    assert registry.check_layout(Layout("tp", tp=2), Workload(TINY)) is registry.get_strategy("tp")
    with pytest.raises(LayoutError, match=r"uses axes \['dp', 'tp'\]; sp=2 must be 1"):
        registry.check_layout(Layout("tp", tp=2, sp=2), Workload(TINY))


def test_a_switch_the_strategy_ignores_is_refused_naming_who_takes_it() -> None:
    takers = [cls.name for cls in registry.iter_strategies() if "megatron_sp" in cls.switches]
    assert takers, "some built-in strategy acts on megatron_sp"
    with pytest.raises(WorkloadError, match=f"it applies to {', '.join(takers)} only, not 'dp'"):
        registry.check_layout(Layout("dp"), Workload(TINY, megatron_sp=True))


def test_check_fake_world_names_the_obstacle() -> None:
    registry.check_fake_world(Layout("dp", dp=2), Workload(TINY, mode="infer"))  # prefill: fine
    with pytest.raises(LayoutError, match=r"cannot run in the fake world: torch DDP"):
        registry.check_fake_world(Layout("dp", dp=2), Workload(TINY))
