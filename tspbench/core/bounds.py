"""The largest numbers an input may hold: one table for a command's flags and a sweep's keys (#45).

A number that parses is not yet one the work can take: 1e400 is inf as a float and overflows
an int(); a timeout of 1e15 s overflows the C ``time_t`` of a timer; a vocabulary of 10^8 rows
is a real 200 GB embedding; 512 CPU ranks on a 2-core host are 512 processes. Each bound sits
far beyond any real use and well inside what the machine's calls take, and the CLI's flags
(tspbench.cli.args) and an experiment's keys (tspbench.sweep.experiment) read the same ones.
"""

from __future__ import annotations

import math
import os

MAX_COUNT = 2**31 - 1  # any count of steps, tokens, rounds: a C int
MAX_SECONDS = 30 * 86400.0  # a timeout or a watch: 30 days (setitimer, time_t stay far away)
MAX_CAPACITY_BYTES = 2**50  # a simulated device: 1 PiB
MAX_VOCAB = 2**20  # rows of the embedding: 4x the largest vocabularies trained (256K)


def max_cpu_ranks() -> int:
    """The most CPU ranks one host starts: each is a process of its own, so 4 per core (and at
    least 16, the test suite's worlds)."""
    return max(16, 4 * (os.cpu_count() or 1))


def bound_problem(value: float, low: float, high: float, unit: str = "") -> str | None:
    """Why ``value`` is not a finite number in [low, high] (None: it is)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if value < low:
        return f"must be >= {_text(low)}, got {_text(value)}"
    if value > high:
        return f"must be at most {_text(high)}{f' {unit}' if unit else ''}, got {_text(value)}"
    return None


def _text(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:,.6g}"


MAX_GPUS = 2**17  # 131,072 ranks in one layout: past the largest clusters built
# An experiment's model overrides (ModelConfig fields): far past any model trained, well short of
# a dimension whose weights this host could not even allocate to count.
MODEL_BOUNDS: dict[str, tuple[float, float]] = {
    "hidden": (1, 2**17),
    "n_layers": (1, 2**12),
    "n_heads": (1, 2**12),
    "n_kv_heads": (1, 2**12),
    "ffn_hidden": (1, 2**19),
    "vocab_size": (1, MAX_VOCAB),
    "rope_theta": (1.0, 1e12),  # theta <= 0 makes every rotary frequency nan or inf
    "norm_eps": (1e-12, 1.0),
    "max_seq_len": (1, 2**24),
}
