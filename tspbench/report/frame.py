"""Stored records as the one frame tables and figures read, and what to call where they came from.

Records come in kinds told apart by ``source``: measured (``tspbench bench``: peak memory
measured, the model's prediction beside it), fake (the real step executed under fake tensors,
the prediction beside it: "measured" columns hold what the fake world executed) and predicted
(the analytic model alone: its peak memory *is* the prediction). ``prepare`` maps them onto
one set of columns so that tables and figures need not care which they hold; ``Context``
says which in every title.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tspbench.analytic.profile_choice import named_profile, profile_name
from tspbench.core.errors import HardwareError
from tspbench.core.names import AXES, CATEGORIES, PHASES
from tspbench.core.spec import model_label
from tspbench.core.units import degrees_text
from tspbench.report.costs import add_costs
from tspbench.report.legend import EXCHANGES, LAYOUTS, exchange_of, with_exchange

STRATEGY_RANK = {s: i for i, s in enumerate(LAYOUTS)}
EXCHANGE_RANK = {e: i for i, e in enumerate(EXCHANGES)}
RECOMPUTE_RANK = {"none": 0, "selective": 1, "op": 2, "full": 3}


@dataclass
class Context:
    """How titles name what was run and where, and what a 'device' is called."""

    where: str  # "projected for MI300X (analytic model)", "measured on CPU (2 cores, gloo)"
    noun: str  # "GPU" or "rank"
    strategies: list[str]  # every strategy in the records, so colors agree across figures
    executed: str = "measured"  # what the non-predicted numbers are: "measured" or "fake-world"
    damaged: list[str] = field(default_factory=list)  # stored files a figure skipped ("PATH: why")

    def title(self, what: str, df: pd.DataFrame) -> str:
        shown = ("model", "mode", "dtype")
        fixed = {c: str(df[c].iloc[0]) for c in shown if c in df and df[c].nunique() == 1}
        if fixed.get("model"):  # '7b preset' as it is; a changed one by its own name (#46)
            fixed["model"] = model_label(fixed["model"])
        shape = ", ".join(v for v in fixed.values() if v)
        return f"{what}\n{shape} - {self.where}" if shape else f"{what}\n{self.where}"


def column(df: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column, NaN where absent (records of other executors lack some fields)."""
    if name not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[name], errors="coerce").astype(float)


def series_label(strategy: str, degree_text: str) -> str:
    """'tsp8' for a one-axis strategy named after its axis, else 'tp_sp tp2 x sp4'; a layout of a
    mesh strategy with an axis of 1 says what it is: 'tp_sp tp8 x sp1 (= tp8)' runs plain TP."""
    parts = degree_text.split(" x ")
    if parts[0].rstrip("0123456789") == strategy:
        return degree_text
    kept = [p for p in parts if p.lstrip("abcdefghijklmnopqrstuvwxyz_") != "1"]
    same = f" (= {' x '.join(kept)})" if kept and len(kept) < len(parts) else ""
    return f"{strategy} {degree_text}{same}"


def series_labels(
    strategies: pd.Series, degrees: pd.Series, exchanges: pd.Series, switches: list[str] | None = None
) -> list[str]:
    """``series_label`` per row, its other switches after it ('tp8 + Megatron SP') and the K/V
    exchange last where it is not the all-gather: 'sp8 (ring)' and 'sp8' are two lines of a
    figure and two layouts of a table, not one (#48), and so are 'tsp8 + MLP broadcast' and 'tsp8'."""
    words = switches or [""] * len(strategies)
    rows = zip(strategies, degrees, exchanges, words, strict=True)
    return [with_exchange(series_label(s, d) + (f" + {w}" if w else ""), e) for s, d, e, w in rows]


def switch_words(df: pd.DataFrame) -> list[str]:
    """'Megatron SP, MLP broadcast, no overlap': the switches other than the K/V exchange that a
    row sets away from their defaults (a record omits one left at its default)."""

    def word(row: pd.Series) -> str:  # == 1 and == 0: Python's, numpy's and stored bools alike; NaN neither
        mlp = row.get("mlp_exchange")
        said = ["Megatron SP" if row.get("megatron_sp") == 1 else "",
                f"MLP {mlp}" if isinstance(mlp, str) and mlp not in ("", "ring") else "",
                "no overlap" if row.get("overlap") == 0 else ""]  # fmt: skip
        return ", ".join(w for w in said if w)

    return [word(row) for _, row in df.iterrows()]


def prepare(frame: pd.DataFrame) -> pd.DataFrame:
    """The records with the columns tables and figures read, in a fixed, sensible order."""
    df = frame.copy()
    for name in (*AXES, "world_size", "seq_len", "batch"):
        df[name] = column(df, name).fillna(1).astype(int)
    for name in ("strategy", "mode", "recompute", "dtype", "model", "device"):
        df[name] = df[name].fillna("").astype(str) if name in df else ""
    predicted = (df["source"] == "predicted") if "source" in df else pd.Series(False, index=df.index)
    if "method" in df:
        predicted |= df["method"] == "predict"
    fake = (df["source"] == "fake") if "source" in df else pd.Series(False, index=df.index)
    df["source"] = np.where(predicted, "predicted", np.where(fake, "fake", "measured"))
    df["degrees"] = df.apply(lambda row: degrees_text(row["strategy"], row), axis=1)
    stored = df["kv_exchange"] if "kv_exchange" in df else pd.Series(None, index=df.index, dtype=object)
    df["kv_exchange"] = [exchange_of(v) for v in stored]  # records stored before #48: the all-gather
    words = switch_words(df)
    df["series"] = series_labels(df["strategy"], df["degrees"], df["kv_exchange"], words)
    mp = df.apply(lambda row: degrees_text(row["strategy"], row, with_dp=False), axis=1)
    df["series_mp"] = series_labels(df["strategy"], mp, df["kv_exchange"], words)
    add_metrics(df, predicted)
    return sort(df)


def add_metrics(df: pd.DataFrame, predicted: pd.Series) -> None:
    """Memory, speed and comm columns that mean the same for measured and predicted records."""
    done = df["status"] == "completed"
    peak = column(df, "peak_memory_bytes")
    df["peak"] = peak
    df["measured_peak"] = peak.where(~predicted & done)
    df["pred_peak"] = peak.where(predicted, column(df, "predicted_peak_memory_bytes"))
    df["error_pct"] = (df["pred_peak"] / df["measured_peak"] - 1) * 100
    df["measured_time"] = column(df, "step_time_s").where(~predicted & done)
    df["pred_time"] = column(df, "predicted_step_time_s").where(~predicted)
    add_capacity(df)
    add_costs(df)  # device-hours and energy per token, TTFT p99 (#43)
    df["oom_at"] = df["pred_peak"].fillna(df["capacity"]).where(df["status"] == "oom")
    df["tput"] = column(df, "tokens_per_s_per_gpu").where(done)
    df["agg"] = df["tput"] * df["world_size"]
    df["tflops"] = column(df, "tflops_per_gpu").where(done)
    df["mfu_pct"] = column(df, "mfu").where(done) * 100
    df["comm"] = column(df, "comm_bytes_per_step").where(done)
    for cat in CATEGORIES:
        df[f"peak_memory_{cat}_bytes"] = column(df, f"peak_memory_{cat}_bytes")
    df["breakdown"] = df[[f"peak_memory_{c}_bytes" for c in CATEGORIES]].notna().any(axis=1)
    skip = {"comm_bytes_per_step", *(f"comm_{p}_bytes" for p in PHASES)}
    ops = sorted(c for c in df.columns if c.startswith("comm_") and c.endswith("_bytes") and c not in skip)
    for name in ops:
        df[f"comm_op_{name.removeprefix('comm_').removesuffix('_bytes')}"] = column(df, name)


def add_capacity(df: pd.DataFrame) -> None:
    """``capacity``: the memory a point may use, ``capacity_of``: whose it is ('MI300X' for a
    hardware profile's usable memory, '' for a CPU run's simulated limit), ``memory_total``: the
    profile's whole memory. The fake world records no capacity (it never runs out): its points
    take the usable memory of the profile they were priced on, as the analytic model's do, so
    a figure can show which executed peaks would not fit."""
    df["capacity"] = column(df, "capacity_bytes")
    # a measured run's limit is its own (--capacity); a CPU profile's memory is the host's, not a rank's
    priced = (df["source"] != "measured") & (df["device"] == "cuda")
    names = pd.Series("", index=df.index, dtype=object)
    if priced.any():
        names[priced] = df[priced].apply(profile_name, axis=1)
    profiles = {name: profile_memory(name) for name in set(names) - {""}}
    usable = names.map(lambda n: profiles.get(n, (np.nan, np.nan))[0]).astype(float)
    df["memory_total"] = names.map(lambda n: profiles.get(n, (np.nan, np.nan))[1]).astype(float)
    df.loc[df["source"] == "fake", "capacity"] = df["capacity"].fillna(usable)
    known = df["memory_total"].notna() & (df["capacity"] == usable)
    df["capacity_of"] = np.where(known, names.str.upper(), "")
    done = df["status"] == "completed"
    df["over_capacity"] = done & (df["source"] == "fake") & (df["peak"] > df["capacity"])


def profile_memory(name: str) -> tuple[float, float]:
    """(usable, total) bytes of the hardware profile ``name``; NaN when no profile has it."""
    try:
        hw = named_profile(name)
    except HardwareError:
        return np.nan, np.nan
    return float(hw.usable_bytes), float(hw.memory_bytes)


def sort(df: pd.DataFrame) -> pd.DataFrame:
    """Setting first (mode, recompute), then the model-parallel group size (D: layouts on the same
    GPUs side by side), strategy, layout (TP-heavy first), K/V exchange, data-parallel degree, shape."""
    keys = pd.DataFrame(
        {
            "mode": df["mode"],
            "recompute": df["recompute"].map(RECOMPUTE_RANK).fillna(9),
            "model": df["model"],
            "dtype": df["dtype"],
            "replica": df["world_size"] // df["dp"].clip(lower=1),
            "strategy": df["strategy"].map(STRATEGY_RANK).fillna(len(STRATEGY_RANK)),
            "strategy_name": df["strategy"],
            **{a: -df[a] for a in AXES[1:]},
            "kv_exchange": df["kv_exchange"].map(EXCHANGE_RANK).fillna(len(EXCHANGE_RANK)),
            "dp": df["dp"],
            "seq_len": df["seq_len"],
            "batch": df["batch"],
        }
    )
    order = keys.sort_values(list(keys.columns), kind="stable").index
    return df.loc[order].reset_index(drop=True)


def context(df: pd.DataFrame) -> Context:
    """What titles say about where the records come from."""
    parts = []
    if (df["source"] == "measured").any():
        parts.append(measured_where(df[df["source"] == "measured"]))
    if (df["source"] == "fake").any():
        parts.append(fake_where(df[df["source"] == "fake"]))
    if (df["source"] == "predicted").any():
        hardware = sorted({str(h).upper() for h in df.loc[df["source"] == "predicted", "hardware"].dropna()})
        parts.append(f"projected for {' / '.join(hardware) or 'unknown hardware'} (analytic model)")
    noun = "GPU" if (df["device"] == "cuda").any() else "rank"
    executed = df[df["source"] != "predicted"]
    word = "fake-world" if len(executed) and (executed["source"] == "fake").all() else "measured"
    return Context(" and ".join(parts), noun, list(dict.fromkeys(df["strategy"])), word)


def fake_where(df: pd.DataFrame) -> str:
    """'executed in a fake world (simulated cuda, 2-core host)': short, it goes in every title."""
    devices = "/".join(sorted(set(df["device"])))
    cores = df["env_cpu_count"].iloc[0] if "env_cpu_count" in df else None
    host = f", {int(cores)}-core host" if cores is not None and pd.notna(cores) else ""
    return f"executed in a fake world (simulated {devices}{host})"


def measured_where(df: pd.DataFrame) -> str:
    """'measured on CPU (x86_64, 2 cores, gloo)' or 'measured on NVIDIA H200' from the env fields."""
    first = df.iloc[0]
    env = {k[4:]: first[k] for k in df.columns if k.startswith("env_") and pd.notna(first[k])}
    if first["device"] == "cuda" and env.get("device_name"):
        return f"measured on {env['device_name']}"
    if first["device"] == "cpu":
        details = [env.get("device_name"), f"{env['cpu_count']} cores" if "cpu_count" in env else None,
                   env.get("backend")]  # fmt: skip
        return "measured on CPU" + (f" ({', '.join(str(d) for d in details if d)})" if any(details) else "")
    return "measured"
