"""Small experiment files the sweep and fault tests write (tests/cli/test_faults_*.py,
tests/sweep/test_local.py, tests/sweep/test_slurm_timeout.py): one place for their YAML."""

from __future__ import annotations


def predict_study(seq_lens: str = "256, 512") -> str:
    """TSP 2 on the small preset at each of ``seq_lens``, priced on the cpu profile (fast: no rank runs
    under the predict executor)."""
    return f"""
name: tiny
hardware: cpu
model: {{preset: small}}
settings: {{batch: 1, mode: train, recompute: none, dtype: float32, device: cpu}}
sweep:
  grid: {{seq_len: [{seq_lens}]}}
  zip:
    - layout: [{{strategy: tsp, tsp: 2}}]
"""


def tiny_study(name: str, layout: str, run: str = "") -> str:
    """One point of the tiny preset at 64 tokens, training in float32 on CPU, in ``layout``
    (a YAML flow mapping) with an optional ``run:`` line."""
    return f"""
name: {name}
model: {{preset: tiny}}
settings: {{batch: 1, seq_len: 64, mode: train, recompute: none, dtype: float32, device: cpu}}
sweep:
  zip:
    - layout: [{layout}]
{run}"""
