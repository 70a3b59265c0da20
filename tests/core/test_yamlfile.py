"""The one YAML reader (#45): a 1 KB alias bomb is refused as it is read, in one short line,
before any value is built or shown; anchors and merges of ordinary size still read."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tspbench.core.errors import UsageError
from tspbench.core.yamlfile import parse_yaml, read_yaml


def alias_bomb(levels: int = 9) -> str:
    items = ["&x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    items += [f"&x{i} [{', '.join(f'*x{i - 1}' for _ in range(9))}]" for i in range(1, levels)]
    return "name: bomb\nsettings: {seq_len: [" + ", ".join(items) + "]}\n"


def test_an_alias_bomb_is_one_short_line(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert path.stat().st_size < 1024
    start = time.process_time()  # this process's CPU: a loaded host does not move it
    with pytest.raises(UsageError) as caught:
        read_yaml(path)
    message = str(caught.value)
    assert "expands to more than 100,000 values" in message and len(message) < 300, message[:300]
    assert time.process_time() - start < 2


def test_ordinary_anchors_and_merges_still_read() -> None:
    text = "base: &b {batch: 1, seq_len: 512}\nrun: {<<: *b, seq_len: 1024}\nagain: [*b, *b]\n"
    data = parse_yaml(text)
    assert data["run"] == {"batch": 1, "seq_len": 1024} and data["again"] == [data["base"]] * 2
