"""A measured CPU point this host cannot hold is refused before any rank starts (#45).

A CPU rank's tensors are real, so a huge ``--batch`` is swapping or the OOM killer, not an
``oom`` record. The bound is the memory model's peak per rank times the ranks (each a process
here) against the host's available memory; ``bench``, ``validate`` and a local sweep's points
meet the same bound. The host's memory is set here, so the tests hold on any machine; what the
refusal says is checked against the analytic model's own prediction (tspbench.analytic.predict),
not against the check's arithmetic.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_exit import exit_code
from study_files import tiny_study

import tspbench.measure.bench
from tspbench.analytic import host_memory
from tspbench.analytic.predict import predict
from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.names import STRATEGIES
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.strategy import available

HAVE = 256 << 20  # the host's available memory in these tests: 256 MiB


@pytest.fixture
def small_host(monkeypatch) -> None:
    """A host with HAVE bytes available, on which no rank may start."""

    def must_not_start(*args: object, **kwargs: object) -> None:
        raise AssertionError("a rank started before the host's memory was checked")

    monkeypatch.setattr(host_memory, "available_bytes", lambda *a: HAVE)
    monkeypatch.setattr(tspbench.measure.bench, "launch", must_not_start)


def refusal(argv: list[str], says: str, capsys) -> str:
    assert exit_code(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert says in err, err
    return err


def host_bytes_by_the_model(batch: int, seq_len: int = 512) -> int:
    """tp 2 on tiny, training: two ranks, each the model's predicted peak."""
    workload = Workload(ModelConfig.preset("tiny"), batch, seq_len, "train", device="cpu")
    hw = choose_profile(None, device="cpu", measured=False).hardware
    return 2 * predict(Layout("tp", tp=2), workload, hw).memory.peak_bytes


def largest_said(err: str) -> int:
    return int(err.split("a batch of at most ")[1].split()[0].replace(",", ""))


def test_a_batch_past_the_hosts_memory_is_refused_naming_the_flag_and_the_bound(small_host, capsys) -> None:
    point = ["--strategy", "tp", "--tp", "2", "--model", "tiny", "--seq-len", "512", "--dtype", "float32"]
    err = refusal(
        ["bench", *point, "--batch", "100000"], "--batch 100,000: tp(tp2), tiny: the memory", capsys
    )
    assert "2 ranks x" in err and "more than the 256.0 MiB it has available" in err
    most = largest_said(err)
    assert host_bytes_by_the_model(most) <= HAVE < host_bytes_by_the_model(most + 1)
    again = refusal(["validate", *point, "--batch", str(most + 1)], f"--batch {most + 1:,}", capsys)
    assert largest_said(again) == most  # validate's bound is bench's
    with pytest.raises(AssertionError, match="a rank started"):  # the bound itself passes the check
        exit_code(["bench", *point, "--batch", str(most)])


def test_a_sequence_no_batch_fits_names_the_sequence(small_host, capsys) -> None:
    argv = ["validate", "--strategy", "tp", "--tp", "2", "--model", "tiny", "--seq-len", "16384"]
    refusal(argv, "--seq-len 16,384: tp(tp2), tiny: the memory model puts", capsys)


@pytest.mark.parametrize(
    ("change", "key"),
    [("settings.batch=100000", "settings.batch"), ("sweep.grid.batch=[1, 100000]", "sweep.grid.batch[1]")],
)
def test_a_local_sweep_point_meets_the_bound_bench_does(
    change: str, key: str, small_host, tmp_path, capsys
) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(tiny_study("s", "{strategy: tp, tp: 2}").replace("seq_len: 64", "seq_len: 512"))
    argv = ["run", str(study), "--executor", "local", "--set", change, "--results", str(tmp_path / "r")]
    err = refusal(argv, f"{key}: batch 100,000: tp(tp2): the memory model puts 2 ranks x", capsys)
    assert host_bytes_by_the_model(largest_said(err)) <= HAVE < host_bytes_by_the_model(largest_said(err) + 1)
    assert not (tmp_path / "r").exists()  # nothing written


def test_available_memory_is_what_the_kernel_says_can_be_allocated(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"
    )
    assert host_memory.available_bytes(meminfo) == 20000000 * 1024
    meminfo.write_text("MemTotal: 1 kB\n")  # no MemAvailable (an old kernel): the physical memory
    assert host_memory.available_bytes(meminfo) > 1024


def test_a_flag_is_refused_before_torch_is_imported() -> None:
    """Building the parser imports no torch, pandas or numpy (each command imports what it
    runs), so a bad flag is one line in a fraction of a second, not after torch's import."""
    code = (
        "import sys\nfrom tspbench.cli.main import main\n"
        "try:\n    main(['bench', '--strategy', 'tp', '--batch', '1e400'])\n"
        "except SystemExit as exc:\n    rc = exc.code\n"
        "print(rc, sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[0] == "2 []", (done.stdout, done.stderr)
    assert done.stderr.strip().startswith("tspbench bench: error: argument --batch: not an integer")


def test_the_built_in_layouts_named_in_help_are_the_registered_ones() -> None:
    assert set(STRATEGIES) <= set(available())
