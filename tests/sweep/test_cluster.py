"""Cluster profiles are checked before anything reaches a job script (#45): an ``extra:`` value
with a newline (a command carried into the script), a key that is no sbatch option, an option
the executor computes (nodes, time: the summary would no longer say what runs), an empty value,
``--exclusive=False``, 10^12 CPUs per task: each one line naming the file and key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from submitit.slurm.slurm import _make_sbatch_string

from tspbench.core.errors import UsageError
from tspbench.sweep.cluster import load_profile

BASE = "partition: gpu\ngpus_per_node: 2\nnodes: 1\ndevice: cpu\n"


def profile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(BASE + text)
    return path


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('extra: {qos: "high\\nrm -rf ~"}', "extra.qos: 'high\\nrm -rf ~': one word"),
        ("extra: {nodes: 64}", "extra.nodes: set by tspbench"),
        ("extra: {time: 100000}", "extra.time: set by tspbench"),
        ("extra: {ntasks-per-node: 8}", "extra.ntasks-per-node: set by tspbench"),
        ('extra: {"a b;c": 1}', "not an sbatch option name"),
        ('extra: {qos: ""}', "extra.qos: '': one word"),
        ("extra: {exclusive: false}", "a flag is true or left out"),
        ("extra: {qos: .inf}", "must be a finite number"),
        ("extra: {comment: 'a; b'}", "one word"),
        ("cpus_per_task: 1000000000000", "cpus_per_task: must be <= 4096"),
        ('partition: "gpu\\n#SBATCH --nodes=64"', "is not a Slurm partition"),
        ('mem: "lots"', "is not a Slurm mem"),
        ('setup: ["module load cuda\\nrm -rf ~"]', "setup[0]: expected one shell line"),
    ],
)
def test_a_value_that_would_break_or_bend_the_job_script_is_refused(text: str, says: str, tmp_path) -> None:
    path = profile(tmp_path, text.replace("partition: gpu\n", "") if text.startswith("partition") else text)
    if text.startswith("partition"):
        path.write_text(BASE.replace("partition: gpu\n", "") + text)
    with pytest.raises(UsageError) as caught:
        load_profile(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and says in message and "\n" not in message, message


def test_a_good_profile_writes_a_job_script_bash_reads(tmp_path: Path) -> None:
    path = profile(tmp_path, "extra: {qos: high, exclusive: true, gres: 'gpu:2'}\nsetup: ['export A=1']\n")
    params = load_profile(str(path)).parameters(1, 2, 5, "tspbench-x")
    script = _make_sbatch_string(command="python -c pass", folder=str(tmp_path / "%j"), **params)
    assert "#SBATCH --qos=high" in script and "#SBATCH --exclusive" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
