"""Each layout at its best setting beside its default (#43): the first rule of comparing layouts
is never tuned settings for one against defaults for another.

A point's coordinates split in two. The *settings* (SETTINGS: recompute and the layout switches
of tspbench.strategy.registry.SWITCHES) are what a layout may tune; everything else (layout and
degrees, seq_len, batch, mode, world, model, dtype, device, hardware) says which comparison a point
belongs to. Per group of equal coordinates:

    default   the record whose settings are all at their defaults (DEFAULTS, ``default_settings``)
    best      the feasible record (completed: not OOM, not failed) with the highest tokens/s per
              device, or, for a memory study, the lowest peak memory (``metric_of``)
    winner    the settings in which the best differs from the default ("default" where they agree)

A group with one setting only reads "default only": that layout was not swept. Pure functions on a
records frame (``tspbench.report.frame.prepare``'s or the store's raw one); no torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tspbench.core.names import AXES
from tspbench.core.units import degrees_text
from tspbench.report.frame import series_label

# What a layout may tune, and each one's default. Recompute's is the paper's (selective, every
# paper training study's base); the switches' are the Workload's (tspbench.core.spec).
SWITCH_DEFAULTS: dict[str, object] = {
    "megatron_sp": False,
    "overlap": True,
    "kv_exchange": "allgather",
    "mlp_exchange": "ring",
}
SETTINGS = ("recompute", *SWITCH_DEFAULTS)
COORDINATES = ("strategy", *AXES, "seq_len", "batch", "mode", "world_size", "model", "dtype", "device",
               "decode_tokens", "hardware")  # fmt: skip
METRICS = {"speed": ("tokens_per_s_per_gpu", "tokens/s per device, highest"),
           "memory": ("peak_memory_bytes", "peak memory per device, lowest")}  # fmt: skip


def default_settings(mode: str) -> dict[str, object]:
    """The defaults a record of ``mode`` is compared from: recompute selective where it trains
    (the paper's), none otherwise (nothing to recompute without a backward pass)."""
    return {"recompute": "selective" if mode == "train" else "none", **SWITCH_DEFAULTS}


def metric_of(name: str) -> str:
    """'memory' for a memory study (its name says so: paper_memory, paper_memory_kv), else 'speed':
    a memory study asks what fits, so its best is the smallest peak, not the fastest step."""
    return "memory" if "memory" in name else "speed"


def with_settings(df: pd.DataFrame) -> pd.DataFrame:
    """The records with every setting column filled: records omit a switch left at its default
    (kv_exchange, mlp_exchange), and older ones predate a switch."""
    out = df.copy()
    for name, default in SWITCH_DEFAULTS.items():
        stored = out[name] if name in out else pd.Series(None, index=out.index, dtype=object)
        out[name] = [default if v is None or (isinstance(v, float) and pd.isna(v)) else v for v in stored]
        if isinstance(default, bool):
            out[name] = out[name].astype(bool)
    out["recompute"] = out["recompute"].fillna("none").astype(str) if "recompute" in out else "none"
    return out


def coordinates(df: pd.DataFrame) -> list[str]:
    """The coordinate columns present in ``df`` (a group key must exist in every row's record)."""
    return [c for c in COORDINATES if c in df]


def is_default(df: pd.DataFrame) -> pd.Series:
    """True for the rows whose settings are all at their defaults (for their mode)."""
    modes = df["mode"] if "mode" in df else pd.Series("train", index=df.index)
    rows = zip(df.iterrows(), modes, strict=True)
    flags = [all(row[k] == v for k, v in default_settings(m).items()) for (_, row), m in rows]
    return pd.Series(flags, index=df.index, dtype=bool)


def feasible(df: pd.DataFrame, metric: str) -> pd.Series:
    """Completed rows with a value of the metric: an OOM, a failure or a timeout has no best."""
    value = pd.to_numeric(df[METRICS[metric][0]], errors="coerce") if METRICS[metric][0] in df else None
    done = df["status"] == "completed"
    return done & value.notna() if value is not None else done & False


def best_index(group: pd.DataFrame, metric: str) -> object | None:
    """The index of the group's best feasible row (ties: the default, then the first); None if none fits."""
    ok = group[feasible(group, metric)]
    if ok.empty:
        return None
    value = pd.to_numeric(ok[METRICS[metric][0]], errors="coerce")
    top = value.max() if metric == "speed" else value.min()
    winners = ok[value == top]
    defaults = winners[is_default(winners)]
    return (defaults if len(defaults) else winners).index[0]


def winner(best: pd.Series, default: pd.Series | None) -> str:
    """'megatron_sp true, recompute none': the settings in which ``best`` differs from ``default``
    (from the defaults when the default point was not run); 'default' where none does."""
    base = default if default is not None else pd.Series(default_settings(str(best.get("mode", "train"))))
    changed = [f"{k} {text(best[k])}" for k in SETTINGS if best[k] != base[k]]
    return ", ".join(changed) or "default"


def text(value: object) -> str:
    """'true' / 'false' as the YAML and the CLI write a switch (numpy's bools too)."""
    return str(value).lower() if isinstance(value, bool | np.bool_) else str(value)


def best_rows(df: pd.DataFrame, metric: str = "speed", per: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per group: its best feasible record, or, where none is feasible, its default (so an
    OOM still shows as one): what a figure comparing best against best draws. ``per``: settings
    kept apart (a memory figure's panels, one per recompute mode)."""
    df = with_settings(df)
    keep = []
    for _, group in df.groupby([*coordinates(df), *per], sort=False, dropna=False):
        pick = best_index(group, metric)
        if pick is None:
            defaults = group[is_default(group)]
            pick = (defaults if len(defaults) else group).index[0]
        keep.append(pick)
    return df.loc[sorted(keep)]


def best_against_default(df: pd.DataFrame, metric: str = "speed") -> pd.DataFrame:
    """Per group: the default's and the best's value, the best over the default, the winning
    settings and how many settings were tried (``tried``; 1: "default only")."""
    df = with_settings(df)
    column = METRICS[metric][0]
    rows = []
    for _, group in df.groupby(coordinates(df), sort=False, dropna=False):
        first = group.iloc[0]
        defaults = group[is_default(group)]
        default = defaults.iloc[0] if len(defaults) else None
        pick = best_index(group, metric)
        best = group.loc[pick] if pick is not None else None
        value = {k: float(r[column]) if r is not None and feasible(r.to_frame().T, metric).iloc[0] else None
                 for k, r in (("default", default), ("best", best))}  # fmt: skip
        rows.append({**{c: first[c] for c in coordinates(df)}, "tried": len(group),
                     "default": value["default"], "best": value["best"],
                     "won": verdict(group, default, best)})  # fmt: skip
    out = pd.DataFrame(rows)
    out["gain"] = out["best"] / out["default"]
    return out


def verdict(group: pd.DataFrame, default: pd.Series | None, best: pd.Series | None) -> str:
    """What the last column says: the winning settings, or why there is none to name."""
    if len(group) == 1:
        return "default only"
    if best is None:
        return "no setting fits"
    return winner(best, default)


def markdown_lines(df: pd.DataFrame, name: str, source: str) -> list[str]:
    """The report.md section: each layout's best feasible setting beside its default, per
    sequence length (and batch, mode or world where they vary); ``source`` says where the numbers
    come from ('projected for MI300X (analytic model)')."""
    metric = metric_of(name)
    table = best_against_default(df, metric)
    if table.empty:
        return []
    what = METRICS[metric][1]
    speed = metric == "speed"
    unit = "tokens/s per device" if speed else "peak GiB per device"
    shown = [c for c in ("batch", "mode", "world_size") if c in table and table[c].nunique() > 1]
    head = [
        "layout",
        "seq",
        *shown,
        "settings tried",
        f"default ({unit})",
        f"best ({unit})",
        "best / default",
        "winning setting",
    ]
    rule = ["---" if h in ("layout", "winning setting") else "---:" for h in head]
    intro = f"Best: the feasible setting (completed, not OOM) with the {what}; default: {defaults_text()}."
    lines = [f"{intro} Numbers {source}.", "", "| " + " | ".join(head) + " |", "|" + "|".join(rule) + "|"]
    for _, r in table.iterrows():
        cells = [layout_text(r), tokens_text(int(r["seq_len"])), *(str(r[c]) for c in shown), str(r["tried"]),
                 value_text(r["default"], speed), value_text(r["best"], speed),
                 "" if pd.isna(r["gain"]) else f"{r['gain']:.2f}x", r["won"]]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def defaults_text() -> str:
    switches = ", ".join(f"{k} {text(v)}" for k, v in SWITCH_DEFAULTS.items())
    return f"recompute selective in training (none otherwise), {switches}"


def layout_text(row: pd.Series) -> str:
    """'tp_sp tp2 x sp4', 'tsp8': the layout without its settings (they are what was tuned)."""
    degrees = " x ".join(f"{a}{int(row[a])}" for a in AXES if a in row and int(row[a]) > 1) or "dp1"
    return degrees if degrees.rstrip("0123456789") == row["strategy"] else f"{row['strategy']} {degrees}"


def tokens_text(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def value_text(value: float | None, speed: bool) -> str:
    if value is None or pd.isna(value):
        return "OOM / not run"
    return f"{value:,.1f}" if speed else f"{value / 2**30:,.2f}"


def swept(df: pd.DataFrame, per: tuple[str, ...] = ()) -> bool:
    """Whether some layout was run at more than one setting (else best and default are one point);
    ``per``: settings that do not count (they are kept apart)."""
    df = with_settings(df)
    return bool(df.groupby([*coordinates(df), *per], dropna=False).size().gt(1).any())


def exchanges_only(df: pd.DataFrame) -> bool:
    """Whether the K/V exchange is the only switch swept (paper_memory_kv): a study of the
    exchanges, whose figures draw each one."""
    df = with_settings(df)
    varied = [k for k in SWITCH_DEFAULTS if df[k].astype(str).nunique() > 1]
    return varied == ["kv_exchange"]


def best_view(df: pd.DataFrame, name: str) -> pd.DataFrame | None:
    """The rows a paper study's figures draw to compare best against best: one line per layout
    (labelled without its settings, which vary along it); for a memory study its lowest peak,
    a panel per recompute mode still. None where nothing was swept, in a study of the K/V
    exchanges (paper_memory_kv: its figures draw each one), or in a study of its own that
    compares settings side by side (sp_kv_exchange_cpu's exchanges, tsp_vs_fsdp_sp's
    recomputation): only the paper's studies compare layouts best against best."""
    if not name.startswith("paper_"):
        return None
    if metric_of(name) == "memory":
        if exchanges_only(df) or not swept(df, per=("recompute",)):
            return None
        return as_layouts(best_rows(df, "memory", per=("recompute",)))
    if not swept(df):
        return None
    # a layout's best recomputes as its best point does, which varies along its line: the view
    # names no recompute mode, so no figure splits a layout's line into panels by it
    return as_layouts(best_rows(df, "speed").assign(recompute=""))


def as_layouts(best: pd.DataFrame) -> pd.DataFrame:
    """``best`` with each row's series, and its per-replica one, named for its layout alone: its
    switches and K/V exchange are settings that may vary along the line."""
    if "degrees" not in best:
        return best
    rows = [row for _, row in best.iterrows()]
    return best.assign(
        series=[series_label(r["strategy"], r["degrees"]) for r in rows],
        series_mp=[series_label(r["strategy"], degrees_text(r["strategy"], r, with_dp=False)) for r in rows],
    )
