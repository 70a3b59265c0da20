"""Experiment files: every shipped one loads and expands; bad input is one clear line, exit 2.

The CLI cases call ``tspbench.cli.main`` in-process with ``--dry-run``, so nothing runs and
each case costs milliseconds; they check the exit code, that stderr is exactly one line, and
that the line names the file, the key path and what is allowed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tspbench.cli.main import main
from tspbench.core.errors import ExperimentError
from tspbench.core.names import MODES
from tspbench.strategy import available
from tspbench.sweep.cluster import load_profile, profile_names
from tspbench.sweep.experiment import load_experiment
from tspbench.sweep.points import expand

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((REPO / "experiments").glob("*.yaml"))


def needs_decode(path: Path) -> bool:
    """A study of decode mode, which the schema knows once the decode mechanism (#15) is in."""
    return (yaml.safe_load(path.read_text()).get("settings") or {}).get("mode") == "decode"


WITHOUT_DECODE = pytest.mark.skipif(
    "decode" not in MODES, reason="mode 'decode' is not in this tree yet (#15)"
)
EXPERIMENT_PARAMS = [pytest.param(p, marks=[WITHOUT_DECODE] if needs_decode(p) else []) for p in EXPERIMENTS]
TINY = {
    "name": "t",
    "model": {"preset": "tiny"},
    "settings": {"seq_len": 256},
    "sweep": {
        "grid": {"seq_len": [256, 512]},
        "zip": [
            {
                "layout": [
                    {"strategy": "dp", "dp": 2},
                    {"strategy": "tp", "tp": 2},
                    {"strategy": "tsp", "tsp": 4},
                ]
            }
        ],
    },
}


def write(tmp_path: Path, data: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(["run", *argv, "--dry-run", "--results", "/nonexistent-results"])
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out: str) -> list[list[str]]:
    """The rows of the --dry-run table (after its header line; not the skipped lines, nor the
    sbatch jobs a slurm executor lists after them)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["run_id", "strategy"])
    return [ln.split() for ln in lines[start + 1 :] if not ln.startswith(("skipped", "slurm ", "  "))]


def one_line_error(capsys: pytest.CaptureFixture, *argv: str) -> str:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("path", EXPERIMENT_PARAMS, ids=[p.stem for p in EXPERIMENTS])
def test_every_experiment_loads_and_expands(path: Path) -> None:
    exp = load_experiment(path)
    points, skipped = expand(exp)
    assert points and not skipped, skipped
    assert len({p.run_id for p in points}) == len(points), "run ids must be unique"
    assert exp.name == path.stem
    for p in points:
        assert p.world_size == p.layout.world_size >= 1
        assert p.nodes(8) == -(-p.world_size // 8)
        assert p.tasks_per_node(8) == min(p.world_size, 8)


def test_shipped_experiments_cover_the_studies() -> None:
    quick, _ = expand(load_experiment(REPO / "experiments" / "quickstart.yaml"))
    assert {p.layout.strategy for p in quick} == set(available())  # every strategy
    assert {p.world_size for p in quick} == {4}
    assert all(p.config["workload"]["device"] == "cpu" for p in quick)
    scaling, _ = expand(load_experiment(REPO / "experiments" / "paper_scaling.yaml"))
    assert max(p.world_size for p in scaling) == 1024
    assert max(p.nodes(8) for p in scaling) == 128
    memory, _ = expand(load_experiment(REPO / "experiments" / "paper_memory.yaml"))
    assert {p.config["workload"]["recompute"] for p in memory} >= {"none", "selective", "full"}  # the paper's
    assert {p.config["workload"]["seq_len"] for p in memory} == {16384, 32768, 65536, 131072}
    assert {p.layout.describe() for p in memory} >= {"tsp(tsp8)", "fsdp_sp(sp8)"}  # side by side
    throughput, _ = expand(load_experiment(REPO / "experiments" / "paper_throughput.yaml"))
    assert {p.layout.sp for p in throughput if p.layout.strategy == "fsdp_sp"} == {2, 4, 8}


@pytest.mark.parametrize(
    "name", ["paper_memory", "paper_throughput", "paper_scaling", "paper_scaling_train", "paper_microbatch"]
)
def test_paper_studies_tune_every_layout_not_only_tsp(name: str) -> None:
    """#43: TSP's MLP exchange and TP's Megatron SP among the swept settings of each paper study,
    and the K/V exchange wherever a sequence axis is swept."""
    points, _ = expand(load_experiment(REPO / "experiments" / f"{name}.yaml"))
    work = [(p.layout, p.config["workload"]) for p in points]
    tsp = [w for lay, w in work if lay.strategy == "tsp"]
    assert {w.get("mlp_exchange", "ring") for w in tsp} == {"ring", "broadcast"}
    assert {w["overlap"] for lay, w in work if lay.strategy == "tsp"} == {True, False}
    assert {w["megatron_sp"] for lay, w in work if lay.tp > 1} == {True, False}
    assert {w.get("kv_exchange", "allgather") for lay, w in work if lay.sp > 1} >= {"allgather", "ring"}


def test_every_cluster_profile_loads() -> None:
    assert {"local", "mi300x", "h100"} <= set(profile_names())
    assert load_profile("local").gpus_per_node == 2 and load_profile("local").device == "cpu"
    for name in ("mi300x", "h100"):
        profile = load_profile(name)
        assert (profile.gpus_per_node, profile.device) == (8, "cuda")


def test_run_ids_are_stable_and_hash_the_resolved_point(tmp_path: Path) -> None:
    path = write(tmp_path, TINY)
    first = [p.run_id for p in expand(load_experiment(path))[0]]
    assert first == [p.run_id for p in expand(load_experiment(path))[0]]
    assert all(len(i) == 10 and int(i, 16) >= 0 for i in first)
    steps = [p.run_id for p in expand(load_experiment(path, ["run.steps=7"]))[0]]
    assert set(steps).isdisjoint(first)
    # the timeout is a limit, not part of the measurement: same points, same folders
    longer = [p.run_id for p in expand(load_experiment(path, ["run.timeout=5000"]))[0]]
    assert longer == first


def test_grid_times_zip_and_invalid_combinations_are_skipped(tmp_path: Path, capsys) -> None:
    data = {**TINY, "sweep": {**TINY["sweep"], "grid": {"seq_len": [256, 260]}}}
    points, skipped = expand(load_experiment(write(tmp_path, data)))
    assert [(p.layout.strategy, p.config["workload"]["seq_len"]) for p in points] == [
        ("dp", 256), ("tp", 256), ("tsp", 256), ("dp", 260), ("tp", 260),
    ]  # fmt: skip
    assert len(skipped) == 1 and "divisible by 2 x tsp = 8" in skipped[0].reason
    code, out, _ = run_cli(capsys, str(write(tmp_path, data)))
    assert code == 0
    assert "skipped (invalid): tsp tsp4 seq 260" in out and "sweep.grid.seq_len[1]" in out
    assert out.count("\n") >= 7  # header lines + 5 points + the skipped one


def test_typo_in_a_key_names_path_and_suggestion(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, {**TINY, "settings": {"seqlen": 256}})
    err = one_line_error(capsys, str(path))
    assert str(path) in err and "settings.seqlen" in err and "did you mean 'seq_len'" in err


def test_tp_degree_that_does_not_divide_the_heads(tmp_path: Path, capsys) -> None:
    data = yaml.safe_load(yaml.safe_dump(TINY))
    data["sweep"]["zip"][0]["layout"][1]["tp"] = 3
    err = one_line_error(capsys, str(write(tmp_path, data)))
    assert "sweep.zip[0].layout[1]" in err and "n_heads 4 is not divisible by tp = 3" in err


def test_unknown_strategy_lists_the_known_ones(tmp_path: Path, capsys) -> None:
    data = yaml.safe_load(yaml.safe_dump(TINY))
    data["sweep"]["zip"][0]["layout"][2]["strategy"] = "tps"
    err = one_line_error(capsys, str(write(tmp_path, data)))
    assert "sweep.zip[0].layout[2].strategy" in err
    assert "'tps' is not one of: dp, fsdp, fsdp_sp, sp, tp, tp_sp, tsp" in err


def test_missing_file(tmp_path: Path, capsys) -> None:
    err = one_line_error(capsys, str(tmp_path / "nope.yaml"))
    assert "nope.yaml: no such experiment file" in err


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"model": {"preset": "huge"}}, "model.preset: 'huge' is not one of: 1b, 7b, small, tiny, tiny-gqa"),
        ({"settings": {"batch": "two"}}, "settings.batch: expected an integer, got str 'two'"),
        ({"settings": {"capacity": "lots"}}, "settings.capacity: not a size of at least 1 byte: 'lots'"),
        ({"run": {"steps": 0}}, "run.steps: must be >= 1, got 0"),
        ({"executor": "cloud"}, "executor: 'cloud' is not one of: local, slurm, predict"),
        ({"sweep": {"grid": {"seq_len": []}}}, "sweep.grid.seq_len: expected a non-empty list"),
        ({"sweep": {"grid": {"seq_len": [256, "x"]}}}, "sweep.grid.seq_len[1]: expected an integer"),
        ({"sweep": {"zip": [{"seq_len": [256], "batch": [1, 2]}]}}, "sweep.zip[0].batch: zip lists"),
        ({"sweep": {"grid": {"seq_len": [256]}, "zip": [{"seq_len": [512]}]}}, "already swept by"),
        ({"name": "a b"}, "name: 'a b' must be a folder name"),
        ({"settings": {"capacity": -5}}, "settings.capacity: not a size of at least 1 byte: -5"),
        (
            {"sweep": {"grid": {"capacity": ["1MiB", 0]}}},
            "sweep.grid.capacity[1]: not a size of at least 1 byte",
        ),
        ({"run": {"timeout": float("nan")}}, "run.timeout: must be a finite number, got nan"),
        ({"run": {"warmup": -3}}, "run.warmup: must be >= 0, got -3"),
        ({"settings": {"seed": 10**23}}, "settings.seed: must be <= 18446744073709551614, got 1000"),
        (
            {"sweep": {"grid": {"seed": [0, -(2**63) - 1]}}},
            "sweep.grid.seed[1]: must be >= -9223372036854775808",
        ),
        (
            {"settings": {"mode": "infer", "recompute": "full"}, "sweep": None, "layout": {"strategy": "dp"}},
            "settings.recompute: gives no valid point: recompute 'full': recomputation applies to "
            "training only: mode 'infer' has no backward pass",
        ),
        (
            {"settings": {"megatron_sp": True}, "sweep": None, "layout": {"strategy": "sp", "sp": 2}},
            "settings: gives no valid point: megatron_sp (--megatron-sp) shards the residual stream over "
            "a tensor-parallel axis: it applies to tp, tp_sp only, not 'sp'",
        ),
        (
            {"settings": {"overlap": False}, "sweep": None, "layout": {"strategy": "tp", "tp": 2}},
            "settings: gives no valid point: overlap: false (--no-overlap) makes TSP's weight transfers "
            "blocking: it applies to tsp only, not 'tp'",
        ),
    ],
)
def test_bad_values_are_one_line(tmp_path: Path, capsys, change: dict, expected: str) -> None:
    err = one_line_error(capsys, str(write(tmp_path, {**TINY, **change})))
    assert expected in err, err


def test_invalid_yaml_names_the_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: t\nmodel: {preset: tiny\n")
    assert "not valid YAML at line" in one_line_error(capsys, str(path))


def test_a_key_given_twice_names_the_file_line_and_key(tmp_path: Path, capsys) -> None:
    """PyYAML keeps the last of two equal keys in silence: the sweep would run the wrong length."""
    path = tmp_path / "twice.yaml"
    path.write_text("name: t\nmodel: {preset: tiny}\nsettings:\n  seq_len: 256\n  seq_len: 512\n")
    err = one_line_error(capsys, str(path))
    assert f"{path}: not valid YAML at line 5" in err, err
    assert "duplicate key 'seq_len' (first given at line 4)" in err, err
    profile = tmp_path / "cluster.yaml"
    profile.write_text("gpus_per_node: 2\ndevice: cpu\nnodes: 2\ngpus_per_node: 4\n")
    err = one_line_error(capsys, str(write(tmp_path, TINY)), "--cluster", str(profile))
    assert f"{profile}: not valid YAML at line 4" in err and "duplicate key 'gpus_per_node'" in err, err


def test_a_byte_that_is_not_utf8_names_the_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: t\nmodel: {preset: tiny}\ndescription: caf\xe9\n")
    err = one_line_error(capsys, str(path))
    assert f"{path}: not UTF-8 text: byte 0xe9 at line 3" in err, err


def test_a_folder_lists_the_experiment_files_inside_it(tmp_path: Path, capsys) -> None:
    write(tmp_path, TINY, "b.yaml")
    write(tmp_path, TINY, "a.yaml")
    err = one_line_error(capsys, str(tmp_path))
    assert f"{tmp_path}: is a folder, not an experiment file; the YAML files in it: a.yaml, b.yaml" in err
    assert "no such experiment file" not in err


def test_set_overrides_any_value(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, TINY)
    code, out, _ = run_cli(
        capsys, str(path), "--set", "sweep.grid.seq_len=[1024]", "--set", "sweep.zip[0].layout[1].tp=4"
    )
    assert code == 0, out
    lines = table_rows(out)
    assert [(ln[1], ln[3], ln[9]) for ln in lines] == [
        ("dp", "1", "1024"),
        ("tp", "4", "1024"),
        ("tsp", "1", "1024"),
    ]
    exp = load_experiment(path, ["settings.megatron_sp=true", "model.vocab_size=1024", "cluster=local"])
    assert exp.settings["megatron_sp"] is True and exp.model["vocab_size"] == 1024 and exp.cluster == "local"


def test_bad_set_names_the_override(tmp_path: Path, capsys) -> None:
    path = str(write(tmp_path, TINY))
    err = one_line_error(capsys, path, "--set", "settings.batch=abc")
    assert "settings.batch: expected an integer" in err and "--set settings.batch=abc" in err
    assert "did you mean 'steps'" in one_line_error(capsys, path, "--set", "run.stepz=2")
    assert "expected KEY.PATH=VALUE" in one_line_error(capsys, path, "--set", "oops")
    assert "no list item [5]" in one_line_error(capsys, path, "--set", "sweep.zip[5].batch=[1]")
    err = one_line_error(capsys, path, "--set", "settings={seq_len: 256, seq_len: 512}")
    assert "duplicate key 'seq_len'" in err, err


def test_executor_and_cluster_errors(tmp_path: Path, capsys) -> None:
    path = str(write(tmp_path, TINY))
    assert "needs a cluster profile" in one_line_error(capsys, path, "--executor", "slurm")
    assert "cluster profile 'nowhere' not found; known:" in one_line_error(
        capsys, path, "--executor", "slurm", "--cluster", "nowhere"
    )
    err = one_line_error(capsys, path, "--executor", "slurm", "--cluster", "h100")
    assert "settings.device 'cpu' does not match cluster profile" in err
    assert "needs a hardware profile" in one_line_error(capsys, path, "--executor", "predict")
    err = one_line_error(capsys, path, "--executor", "predict", "--set", "hardware=nosuch")
    assert "hardware 'nosuch'" in err and "known:" in err, err
    err = one_line_error(capsys, path, "--executor", "local", "--cluster", "local")
    assert "--cluster local: a cluster profile is for the slurm executor, not --executor local" in err


def test_cluster_implies_the_slurm_executor(tmp_path: Path, capsys) -> None:
    code, out, err = run_cli(capsys, str(write(tmp_path, TINY)), "--cluster", "local")
    assert code == 0, err
    assert "executor slurm, cluster local (2 per node)" in out


def test_dry_run_lists_nodes_for_the_cluster(capsys) -> None:
    code, out, _ = run_cli(capsys, str(REPO / "experiments" / "paper_scaling.yaml"))
    assert code == 0
    rows = table_rows(out)
    assert len(rows) == 8 * (4 + 2 + 6 + 6)  # dp 1..128 x settings: tsp 4, tp 2, tp_sp 2x4 and 4x2 6 each
    world, nodes = zip(*[(int(r[7]), int(r[8])) for r in rows], strict=True)
    assert (
        max(world) == 1024
        and max(nodes) == 128
        and all(n == -(-w // 8) for w, n in zip(world, nodes, strict=True))
    )


def test_dry_run_names_the_largest_job_against_the_clusters_size(capsys, monkeypatch, tmp_path) -> None:
    """#46: paper_scaling plans 128-node jobs; the dry run says so, and whether the cluster's size
    is known (the profile's nodes:, or sinfo) or must be set to refuse larger points."""
    monkeypatch.setattr("tspbench.sweep.slurm.partition_nodes", lambda partition: None)  # no sinfo here
    study = str(REPO / "experiments" / "paper_scaling.yaml")
    code, out, _ = run_cli(capsys, study)
    assert code == 0
    assert "the largest job asks 128 nodes (1,024 GPUs); this cluster's size is unknown here" in out
    sized = tmp_path / "sized.yaml"
    sized.write_text((REPO / "slurm" / "mi300x.yaml").read_text().replace("nodes: null", "nodes: 256"))
    code, out, _ = run_cli(capsys, study, "--cluster", str(sized))
    assert code == 0 and "the largest job asks 128 nodes (1,024 GPUs); this cluster allows 256 nodes" in out


def test_experiment_error_is_a_usage_error() -> None:
    with pytest.raises(ExperimentError, match="no such experiment file"):
        load_experiment("does/not/exist.yaml")


def test_the_training_scaling_and_micro_batch_studies_reach_where_they_bind() -> None:
    """#43: a training study to 1,024 GPUs with the TP+SP grids wider than a node (8x2 = 16,
    8x8 = 64 GPUs), and micro-batches to 16 at lengths where some layouts run out of memory."""
    train, _ = expand(load_experiment(REPO / "experiments" / "paper_scaling_train.yaml"))
    assert max(p.world_size for p in train) == 1024 and min(p.world_size for p in train) == 8
    assert {p.config["workload"]["mode"] for p in train} == {"train"}
    grids = {(p.layout.tp, p.layout.sp) for p in train if p.layout.strategy == "tp_sp"}
    assert {(8, 2), (8, 8)} <= grids
    micro, _ = expand(load_experiment(REPO / "experiments" / "paper_microbatch.yaml"))
    assert {p.config["workload"]["seq_len"] for p in micro} == {16384, 65536, 131072}
    assert {p.config["workload"]["batch"] for p in micro} >= {1, 16}


def test_a_layout_entry_carries_its_own_settings(tmp_path: Path) -> None:
    """#43: a setting swept only for the layouts it applies to, and a default row keeps its run id."""
    rows = [
        {"strategy": "tp", "tp": 2},
        {"strategy": "tp", "tp": 2, "megatron_sp": True},
        {"strategy": "tsp", "tsp": 2, "mlp_exchange": "ring"},
        {"strategy": "tsp", "tsp": 2, "mlp_exchange": "broadcast"},
    ]
    data = {**TINY, "sweep": {"zip": [{"layout": rows}]}}
    points = expand(load_experiment(write(tmp_path, data)))[0]
    assert [p.layout.describe() for p in points] == ["tp(tp2)", "tp(tp2)", "tsp(tsp2)", "tsp(tsp2)"]
    assert all(set(p.config["layout"]) == {"strategy", "dp", "tp", "sp", "tsp", "fsdp"} for p in points)
    assert [(p.workload.megatron_sp, p.workload.mlp_exchange) for p in points] == [
        (False, "ring"), (True, "ring"), (False, "ring"), (False, "broadcast"),
    ]  # fmt: skip
    plain = {**TINY, "sweep": {"zip": [{"layout": [{"strategy": "tsp", "tsp": 2}]}]}}
    assert points[2].run_id == expand(load_experiment(write(tmp_path, plain, "plain.yaml")))[0][0].run_id
    clash = {**TINY, "sweep": {"grid": {"megatron_sp": [False, True]}, "zip": [{"layout": rows}]}}
    with pytest.raises(ExperimentError, match="already swept"):
        load_experiment(write(tmp_path, clash, "clash.yaml"))


def test_a_points_label_names_every_switch_it_sets(tmp_path: Path) -> None:
    """Progress lines and logs name a point by its label: tp8 with and without Megatron SP, tsp
    with and without overlap, must not read alike."""
    entries = [
        {"strategy": "tp", "tp": 2}, {"strategy": "tp", "tp": 2, "megatron_sp": True},
        {"strategy": "tsp", "tsp": 2},
        {"strategy": "tsp", "tsp": 2, "overlap": False, "mlp_exchange": "broadcast"},
    ]  # fmt: skip
    path = write(tmp_path, {**TINY, "sweep": {"zip": [{"layout": entries}]}})
    labels = [p.label.split(" ", 1)[1] for p in expand(load_experiment(path))[0]]
    assert len(set(labels)) == 4
    assert "megatron_sp" in labels[1] and "megatron_sp" not in labels[0]
    assert "no overlap" in labels[3] and "mlp broadcast" in labels[3] and "overlap" not in labels[2]
