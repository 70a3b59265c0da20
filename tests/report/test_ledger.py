"""The claims ledger: verdicts come from the records' columns, so altered records change them,
and the evidence class follows the records' source (a re-run on a cluster needs no new code)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tspbench.report.build import for_claims
from tspbench.report.claims import Comparison, Hinge
from tspbench.report.ledger import ledger, markdown

ROOT = Path(__file__).resolve().parents[2] / "results"
NAMES = ("paper_memory", "paper_memory_fake", "paper_throughput", "paper_microbatch", "paper_scaling",
         "paper_scaling_crossnode", "paper_decode")  # fmt: skip


@pytest.fixture(scope="module")
def studies() -> dict[str, pd.DataFrame]:
    """The records each claim judges, as the report passes them (a speed study that swept
    settings: each layout at its best, tspbench.report.build.for_claims)."""
    return {n: for_claims(pd.read_parquet(ROOT / n / "records.parquet"), n) for n in NAMES}


def _verdicts(studies: dict[str, pd.DataFrame]) -> dict[str, str]:
    return {c.key: c.verdict for c in ledger(studies)}


def test_a_larger_tsp_peak_turns_the_lowest_memory_verdict(studies: dict[str, pd.DataFrame]) -> None:
    """TSP's peak raised past TP's at one length: the claim no longer holds at every length."""
    assert _verdicts(studies)["a"] == "holds"
    fake = studies["paper_memory_fake"].copy()
    where = (fake["strategy"] == "tsp") & (fake["seq_len"] == 16384) & (fake["recompute"] == "full")
    fake.loc[where, "peak_memory_bytes"] = 10 * fake["peak_memory_bytes"].max()
    verdict = _verdicts({**studies, "paper_memory_fake": fake})["a"]
    assert verdict.startswith("holds only at") and "not at 16K full" in verdict


def test_a_faster_tsp_turns_the_throughput_verdict(studies: dict[str, pd.DataFrame]) -> None:
    """TSP's tokens/s at 128K doubled: against every layout at its best it was competitive
    nowhere; now it is at 128K, and only there."""
    assert _verdicts(studies)["d"] == "does not hold"
    runs = studies["paper_throughput"].copy()
    where = (runs["strategy"] == "tsp") & (runs["seq_len"] == 131072)
    runs.loc[where, "tokens_per_s_per_gpu"] *= 2
    verdict = _verdicts({**studies, "paper_throughput": runs})["d"]
    assert verdict.startswith("holds only at") and "D 8 128K" in verdict.split("; not at")[0]
    assert "D 8 16K" in verdict.split("; not at")[1]


def test_the_evidence_class_follows_the_records_source(studies: dict[str, pd.DataFrame]) -> None:
    """Records marked measured (what a cluster run writes) are judged as measured evidence, and
    preferred to the fake world's for memory."""
    measured = studies["paper_memory"].assign(source="measured", env_device_name="AMD Instinct MI300X")
    rows = {c.key: c for c in ledger({**studies, "paper_memory": measured})}
    assert rows["a"].evidence == "measured on AMD Instinct MI300X"
    assert {c.key: c for c in ledger(studies)}["a"].evidence == "executed in a fake world"
    assert {c.key: c for c in ledger(studies)}["d"].evidence == "projected on the mi300x profile"


def test_a_missing_study_is_not_testable(studies: dict[str, pd.DataFrame]) -> None:
    rest = {k: v for k, v in studies.items() if k != "paper_decode"}
    assert _verdicts(rest)["i"].startswith("not testable here")


def test_projected_verdicts_carry_their_hinges_and_the_paper_stands_beside(
    studies: dict[str, pd.DataFrame],
) -> None:
    """The finder is asked for each projected comparison; its break-even values are printed,
    and the paper's numbers are labelled second-hand."""
    asked: list[Comparison] = []

    def finder(c: Comparison) -> list[Hinge]:
        asked.append(c)
        return [Hinge("ring_shift_gbs", 48, "GB/s", "assumed", 24.6, None)]

    page = markdown(ledger(studies, finder))
    assert any(c.layout == "tsp:8" and c.against.startswith("tp_sp:") and c.seq_len == 131072 for c in asked)
    assert "flips it at 24.6 GB/s" in page
    assert "The paper (second-hand): 8 MI300X at 128K: TSP 38.8 GB" in page
    assert "173M tokens/s" in page
