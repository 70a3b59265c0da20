"""Render README.md and docs/*.md from docs/templates/, every quoted number from results/.

A template's ``{{group.name}}`` is replaced by the value ``name`` of ``GROUPS[group](results)``:
the numbers and tables are computed from the stored records by tools/docs_numbers/ (studies,
time_checks, paper_checks: out of the installed package, since only the docs quote them), and
the words around them are the templates' own. A value may be a ``Part``, a fragment of
docs/templates/parts/ filled with its own ``{{name}}`` values, where the wording depends on the
data, or None, where a conditional sentence does not apply.
tests/project/test_docs.py fails when a rendered file no longer matches what the records give.

    python -m tools.gen_docs            # write README.md and docs/*.md
    python -m tools.gen_docs --check    # exit 1 naming every file that differs
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from tools.docs_numbers import best, hinges, kv_exchange, paper_checks, settings_memory, studies, time_checks
from tools.docs_numbers.stored import Part
from tspbench.core.fields import markdown_table
from tspbench.report import backtest
from tspbench.report.formats import Values

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "docs" / "templates"
PARTS = TEMPLATES / "parts"
RESULTS = ROOT / "results"


def crossover(results: Path) -> Values:
    """The planner's crossover (tspbench plan prints it) for the 7B at D = 8, in inference and in
    training with full recomputation. The planner imports torch, which the other groups do
    without, so it is imported only when this group renders."""
    from tspbench.analytic.planner import crossover_tokens
    from tspbench.core.spec import ModelConfig, Workload

    def at(mode: str, recompute: str) -> str:
        workload = Workload(ModelConfig.preset("7b"), 1, 8192, mode, recompute, "bfloat16", "cuda")
        return f"{crossover_tokens(workload, 8):,.0f}"

    return {"infer": at("infer", "none"), "train": at("train", "full")}


GROUPS: dict[str, Callable[[Path], Values]] = {
    "timings": studies.timings,
    "cpu_memory": studies.cpu_memory,
    "memory_128k": studies.memory_128k,
    "kv_memory": kv_exchange.kv_memory,  # the peers' K/V exchanges at 128K (#48)
    "projected": studies.projected,
    # the backtest's summary (studies) and its three profiles side by side (report.backtest)
    "backtest": lambda results: studies.backtest(results) | backtest.doc_values(results),
    "tsp_fsdp": studies.tsp_fsdp,
    "gpu_scores": studies.gpu_scores,
    "gpu_ops": studies.gpu_op_scores,
    "headline": studies.headline,
    "decode": studies.decode,
    "fake_cost": studies.fake_cost,
    "mfu": studies.mfu_convention,
    "crossover": crossover,
    "fields": lambda results: {"table": markdown_table()},
    "op_check": time_checks.op_check,
    "steps": time_checks.steps,
    "split": time_checks.split,
    "timeline_checks": time_checks.timeline_checks,
    "cpu_profile": time_checks.cpu_profile,
    "host_drift": time_checks.host_drift,
    "repeat": time_checks.repeat_spread,
    "paper_scale": paper_checks.paper_scale,
    "torch": paper_checks.torch_estimator,
    "overlap": paper_checks.overlap,
    "ledger": lambda results: {"table": ledger_table(results)},  # the paper's claims
    "best": best.best,  # each layout at its best setting (report.best)
    "scaling_train": best.scaling_train,  # training from 8 to 1,024 GPUs, each layout at its best
    "walls": best.walls,  # the micro-batch study's walls at 64K and 128K
    "verdicts": best.hardware_verdicts,  # the 128K verdict on the MI300X and H100 profiles
    "settings_memory": settings_memory.settings_memory,  # Megatron SP, TSP's exchanges, executed
    "hinges": hinges.hinges,  # where a projected speed verdict flips (tspbench sensitivity)
}


def ledger_table(results: Path) -> str:
    """The ledger's verdicts (tspbench.report.ledger), computed from the paper studies' records, one
    line per claim: a page of the docs reads as prose, not as a table of checks (results/report/
    ledger.md has the table)."""
    from tspbench.report.build import for_claims
    from tspbench.report.ledger import ledger
    from tspbench.sweep.store import load

    found = [p for p in sorted(results.glob("paper_*")) if any(p.glob("*/point.json"))]
    papers = {p.name: for_claims(load(p), p.name) for p in found}  # as the report's ledger.md judges
    return "\n".join(f"- ({r.key}) {r.claim}: **{r.verdict}** ({r.evidence})." for r in ledger(papers))


# Every setting that changes a layout's speed or memory (#43): what it changes, its values; the
# layouts it applies to come from the registry (Strategy.switches), the studies that sweep it from
# experiments/*.yaml, so the table cannot drift from the code.
SETTINGS_TABLE = {
    "recompute": ("none, selective, op, full", "none (paper studies: selective)",
                  "memory down (activations), time up (forward work again in backward)"),
    "megatron_sp": ("false, true", "false", "norms and residual stream sharded over tp: memory down; "
                    "all-reduce becomes all-gather + reduce-scatter"),
    "overlap": ("true, false", "true", "weight movement hidden behind compute (and TSP's cross-pass "
                "prefetch of W_0); false: blocking transfers, one shard less in flight"),
    "kv_exchange": ("allgather, ring, ulysses", "allgather", "K/V of the whole sequence gathered, passed "
                    "round a ring, or all-to-all to head shards: peak memory and exposed comm"),
    "mlp_exchange": ("ring, broadcast", "ring", "TSP's MLP shards passed round a ring (one link) or "
                     "broadcast from each owner (every link): comm time"),
}  # fmt: skip


def settings_table(results: Path) -> Values:
    """The settings table: setting, layouts, values, default, what it changes, studies sweeping it."""
    from tspbench.strategy import iter_strategies

    takers = {k: [s.name for s in iter_strategies() if k in s.switches] for k in SETTINGS_TABLE}
    takers["recompute"] = ["every layout (training)"]
    rows = [
        "| setting | applies to | values | default | what it changes | swept by |",
        "|---|---|---|---|---|---|",
    ]
    for key, (values, default, what) in SETTINGS_TABLE.items():
        studies_ = [p.stem for p in sorted((ROOT / "experiments").glob("*.yaml"))
                    if f"{key}:" in p.read_text().partition("\nsweep:")[2]]  # fmt: skip
        rows.append(f"| `{key}` | {', '.join(takers[key])} | {values} | {default} | {what} | "
                    f"{', '.join(studies_) or 'none'} |")  # fmt: skip
    return {"table": "\n".join(rows)}


GROUPS["settings"] = settings_table  # #43: every layout's settings, from the registry


PLACEHOLDER = re.compile(r"{{(\w+)(?:\.(\w+))?}}")


@cache
def group(name: str) -> Values:
    """A group's values, computed once however many templates quote them."""
    return GROUPS[name](RESULTS)


def fill(text: str, where: str, lookup: Callable[[str, str | None], Any]) -> str:
    """``text`` with every placeholder replaced by its rendered value."""

    def value(match: re.Match[str]) -> str:
        try:
            found = lookup(match.group(1), match.group(2))
        except KeyError:
            raise KeyError(f"{where}: no value for {match.group(0)} (tools/gen_docs.py GROUPS)") from None
        return as_text(found)

    return PLACEHOLDER.sub(value, text)


def as_text(value: Any) -> str:
    """A value as the docs print it: a Part rendered from its fragment, None as nothing."""
    if value is None:
        return ""
    if isinstance(value, Part):
        path = PARTS / f"{value.name}.md"
        return fill(path.read_text().removesuffix("\n"), str(path), lambda name, _key: value.values[name])
    return str(value)


def render(template: Path) -> str:
    """A template with every ``{{group.name}}`` filled (a KeyError names the placeholder)."""

    def lookup(name: str, key: str | None) -> Any:
        if key is None or name not in GROUPS:
            raise KeyError(name)
        return group(name)[key]

    return fill(template.read_text(), str(template), lookup)


def target(template: Path) -> Path:
    """Where a template renders to: README.md at the root, every other page in docs/."""
    return ROOT / "README.md" if template.name == "README.md" else ROOT / "docs" / template.name


def main(argv: list[str] | None = None) -> int:
    """Write every page; with --check, write none and return 1 naming every page that differs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    differ = []
    for template in sorted(TEMPLATES.glob("*.md")):
        text, out = render(template), target(template)
        if args.check:
            if not out.exists() or out.read_text() != text:
                differ.append(str(out.relative_to(ROOT)))
        else:
            out.write_text(text)
    if differ:
        print("stale (run python -m tools.gen_docs): " + ", ".join(differ), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
