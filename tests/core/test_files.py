"""Files written together (tspbench.core.files.interrupt_deferred): a Ctrl-C that arrives while a
record and the summary listing it are written stops the run after both, never between them."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tspbench.core.files import interrupt_deferred, write_atomic


def test_a_ctrl_c_inside_the_block_is_raised_after_every_write(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), interrupt_deferred():
        write_atomic(tmp_path / "record.json", "{}")
        os.kill(os.getpid(), signal.SIGINT)  # arrives between the two writes
        write_atomic(tmp_path / "summary.json", '{"checks": ["record"]}')
    assert (tmp_path / "record.json").read_text() == "{}"
    assert (tmp_path / "summary.json").is_file()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back


def test_a_block_without_ctrl_c_raises_nothing_and_an_ignored_one_stays_ignored(tmp_path: Path) -> None:
    with interrupt_deferred():
        write_atomic(tmp_path / "a", "a")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup
    try:
        with interrupt_deferred():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
