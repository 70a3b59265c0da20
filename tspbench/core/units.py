"""Sizes, error excerpts and layout degrees as text: the formatting every layer agrees on."""

from __future__ import annotations

import re
from collections.abc import Mapping

from tspbench.core.names import AXES

_BYTE_UNITS = {
    None: 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}  # fmt: skip


def parse_bytes(text: str) -> int:
    """'512MiB', '2GB', '1e9' -> bytes; ValueError naming the text otherwise, and for a part of a
    byte ('1.5' is not 1 byte: most likely a unit was left out)."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B|B)?\s*", text)
    try:
        value = float(m.group(1)) * _BYTE_UNITS[m.group(2)] if m else _bad_size(text)
        whole = int(value)
    except (ValueError, OverflowError):  # '1e400': inf bytes is no size (#45)
        return _bad_size(text)
    if whole != value:
        raise ValueError(f"not a whole number of bytes: {text!r} (a unit left out? e.g. 1.5GiB)")
    return whole


def _bad_size(text: str) -> int:
    raise ValueError(f"not a size: {text!r} (e.g. 512MiB, 2GB, 1e9)")


_SCALES = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float) -> str:
    """A size in the binary unit that suits it, as every command prints one: '134.0 GiB' (not
    '137169.1 MiB'), '1.50 KiB' (not '0.000 GiB'), '512 B'. Three or four significant figures:
    two decimals below 10, one above; the unit steps up once the number shown would reach 1024."""
    value, unit = float(n), "B"
    for bigger in _SCALES:
        if abs(float(_figures(value, unit))) < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{_figures(value, unit)} {unit}"


def _figures(value: float, unit: str) -> str:
    return f"{value:.0f}" if unit == "B" else f"{value:.{2 if abs(value) < 10 else 1}f}"


_RAW_BYTES = re.compile(r"\b(\d{1,3}(?:,\d{3})+|\d+) B\b")


def readable_sizes(text: str) -> str:
    """Every byte count written out in ``text`` in the unit that suits it, as the tables show
    sizes: 'peak 111,909,279,744 B exceeds usable 81,604,378,624 B' -> 'peak 104.2 GiB exceeds
    usable 76.0 GiB'. Reasons stored before #46 carry raw bytes; they are shown this way."""
    return _RAW_BYTES.sub(lambda m: format_bytes(int(m.group(1).replace(",", ""))), text)


def excerpt(text: str, limit: int = 4000) -> str:
    """The head and the tail of a long error (where the exception and the raise site are)."""
    return text if len(text) <= limit else text[:1000] + "\n...\n" + text[-(limit - 1000) :]


def degrees_text(strategy: str, degrees: Mapping[str, int], with_dp: bool = True) -> str:
    """'tsp8 x dp128', 'tp2 x sp4', 'dp4': the strategy's own axes always (its name lists them,
    as in tp_sp), any other axis above 1, data parallel last; '1' for a single device."""
    own = [a for a in strategy.split("_") if a in AXES and a != "dp"]
    if own[:1] == ["fsdp"] and len(own) > 1:  # fsdp_sp: FSDP over the sp ranks, no fsdp axis
        own = own[1:]
    mp = [a for a in AXES[1:] if a in own or int(degrees.get(a, 1)) > 1]
    dp = int(degrees.get("dp", 1))
    shown = [*mp, "dp"] if with_dp and (dp > 1 or strategy == "dp" or not mp) else mp
    return " x ".join(f"{a}{int(degrees.get(a, 1))}" for a in shown) or "1"


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of ``values``, linearly interpolated between order statistics
    (numpy's default), e.g. a step time's p90."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
