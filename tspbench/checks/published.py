"""Published GPU measurements as a test set: the schema of ``results/published/published.yaml``.

Each entry is one published run: where it was published (repository, file and commit, or paper
and table), the hardware, the model, the layout, the workload and what was measured. The file
holds values only; this module checks every key (one-line errors naming the file and the key
path, as experiment files do) and turns an entry into the point the project can run
(``Entry.point``): a Layout and a Workload, as the entry's ``expressed_as`` says.

An entry the project cannot express (float8, pipeline parallelism, async TP, a software stack
whose fused kernels no profile models, a field the source does not give) is kept with the reason
in ``not_predicted``: listed, so the test set says what it leaves out, never predicted.

``role`` keeps the entries that set a profile's number (``calibration``) apart from those that
score it (``test``); tspbench.checks.backtest reports their errors separately.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tspbench.analytic.hardware import find_profile
from tspbench.core.errors import DamagedFileError, ExperimentError, HardwareError, UsageError
from tspbench.core.files import read_input_text
from tspbench.core.names import RECOMPUTE_MODES
from tspbench.core.records import record_problem
from tspbench.core.schema import BOOL, INT, NUM, STR, Field, SchemaError, check_mapping
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.yamlfile import read_yaml
from tspbench.strategy import check_layout

ROLES = ("calibration", "test")
MEMORY_KINDS = ("reserved", "allocated", "active")
DICT, LIST = (dict,), (list,)

TOP = {"profiles": Field(DICT, required=True), "entries": Field(LIST, required=True)}
PROFILE = {  # hardware key -> the profiles that predict it
    "assumed": Field(STR, required=True),  # the shipped assumptions: nothing fitted
    "calibrated": Field(STR, required=True),  # numbers set from the calibration entries
    "calibrated_compile": Field(STR),  # the same, under torch.compile (None: compile not modelled)
}
ENTRY = {
    "id": Field(STR, required=True),
    "role": Field(STR, choices=ROLES, required=True),
    "source": Field(DICT, required=True),
    "hardware": Field(DICT, required=True),
    "model": Field(DICT, required=True),
    "layout": Field(DICT, required=True),
    "seq_len": Field(INT, minimum=1, required=True),
    "seq_len_source": Field(STR, required=True),  # where the sequence length is stated
    "local_batch": Field(INT, minimum=1, required=True),
    "global_batch": Field(INT, minimum=1, required=True),
    "activation_checkpointing": Field(STR, required=True),  # as the source names it
    "dtype": Field(STR, required=True),
    "float8": Field(BOOL, required=True),
    "compile": Field(BOOL, required=True),
    "measured": Field(DICT, required=True),
    "expressed_as": Field(DICT),  # required unless not_predicted
    "not_predicted": Field(STR),  # why the project cannot predict it
}
SOURCE = {
    "repo": Field(STR),
    "path": Field(STR),
    "commit": Field(STR),
    "paper": Field(STR),
    "where": Field(STR, required=True),  # table and row, as quoted
    "url": Field(STR, required=True),
    "run_versions": Field(STR),  # the software the run used, as the source lists it
}
HARDWARE = {
    "gpu": Field(STR, required=True),
    "gpus": Field(INT, minimum=1, required=True),
    "memory": Field(STR, required=True),
    "power_limit_w": Field(INT, minimum=1, required=True),
    "interconnect": Field(STR, required=True),
    "profile": Field(STR, required=True),  # a key of ``profiles``
}
MODEL = {
    "name": Field(STR, required=True),
    "hidden": Field(INT, minimum=1, required=True),
    "layers": Field(INT, minimum=1, required=True),
    "heads": Field(INT, minimum=1, required=True),
    "kv_heads": Field(INT, minimum=1, required=True),
    "ffn_hidden": Field(INT, minimum=1, required=True),
    "vocab": Field(INT, minimum=1, required=True),
    "rope_theta": Field(NUM, minimum=1, required=True),
}
LAYOUT = {a: Field(INT, default=1, minimum=1) for a in ("dp_replicate", "fsdp", "tp", "cp", "pp")}
MEASURED = {
    "tokens_per_s_per_gpu": Field(NUM, minimum=0, required=True),
    "memory_gib": Field(NUM, minimum=0, nullable=True),  # None: not published
    "memory_kind": Field(STR, choices=MEMORY_KINDS, nullable=True),
    "mfu": Field(NUM, minimum=0, maximum=1, nullable=True),
    "mfu_convention": Field(STR, required=True),  # FLOPs per token and peak, or why there is none
    "how": Field(STR, required=True),  # how the source took the numbers (iteration, logging)
}
EXPRESSED = {
    "strategy": Field(STR, required=True),
    **{a: Field(INT, default=1, minimum=1) for a in ("dp", "tp", "sp", "tsp", "fsdp")},
    "batch": Field(INT, minimum=1, required=True),  # micro-batch per replica
    "recompute": Field(STR, choices=RECOMPUTE_MODES, required=True),  # torchtitan's selective AC: op
    "megatron_sp": Field(BOOL, default=False),
    "why": Field(STR, required=True),  # how the published run maps, and what does not
}


@dataclass(frozen=True)
class Entry:
    """One published run, checked."""

    id: str
    role: str
    source: dict[str, Any]
    hardware: dict[str, Any]
    model: ModelConfig
    layout: dict[str, int]
    seq_len: int
    local_batch: int
    global_batch: int
    compile: bool
    measured: dict[str, Any]
    raw: dict[str, Any]  # the entry as written, checked
    expressed_as: dict[str, Any] | None
    not_predicted: str | None

    @property
    def predicted(self) -> bool:
        return self.not_predicted is None

    @property
    def published_layout(self) -> str:
        """'FSDP 8 x TP 8', the degrees the source gives (1s left out)."""
        parts = [
            f"{k.upper().replace('_REPLICATE', ' replicate')} {v}" for k, v in self.layout.items() if v > 1
        ]
        return " x ".join(parts) or "1 GPU"

    def point(self) -> tuple[Layout, Workload]:
        """The point the project runs for this entry (bf16, CUDA, training)."""
        if self.expressed_as is None:
            raise ValueError(f"entry {self.id!r} is not predicted: {self.not_predicted}")
        e = self.expressed_as
        layout = Layout(e["strategy"], dp=e["dp"], tp=e["tp"], sp=e["sp"], tsp=e["tsp"], fsdp=e["fsdp"])
        workload = Workload(
            self.model, e["batch"], self.seq_len, "train", e["recompute"], "bfloat16", "cuda",
            megatron_sp=e["megatron_sp"],
        )  # fmt: skip
        return layout, workload


@dataclass(frozen=True)
class Published:
    """The test set: the entries and which profiles predict each published hardware."""

    path: Path
    profiles: dict[str, dict[str, str | None]]
    entries: list[Entry]

    def predicted(self) -> list[Entry]:
        return [e for e in self.entries if e.predicted]


def load_published(path: str | Path) -> Published:
    """The published-measurements file, every key checked; ExperimentError naming file and key."""
    path = Path(path)
    if not path.is_file():
        raise ExperimentError(f"{path}: no such published-measurements file")
    raw = read_yaml(path, ExperimentError)
    try:
        top = check_mapping(raw, TOP, "")
        profiles = {
            str(k): check_mapping(v, PROFILE, f"profiles.{k}") for k, v in (top["profiles"] or {}).items()
        }
        _check_profiles(profiles)
        entries = [_entry(e, f"entries[{i}]", profiles) for i, e in enumerate(top["entries"])]
        _check_unique([e.id for e in entries])
    except SchemaError as exc:
        raise ExperimentError(f"{path}: {exc}") from None
    return Published(path, profiles, entries)


def _entry(data: Any, where: str, profiles: dict[str, Any]) -> Entry:
    e = check_mapping(data, ENTRY, where)
    parts = {k: check_mapping(e[k], spec, f"{where}.{k}") for k, spec in _PARTS.items()}
    _check_source(parts["source"], f"{where}.source")
    if parts["hardware"]["profile"] not in profiles:
        known = ", ".join(profiles) or "none"
        raise SchemaError(
            f"{where}.hardware.profile", f"{parts['hardware']['profile']!r} is not in profiles ({known})"
        )
    _check_degrees(parts["layout"], parts["hardware"]["gpus"], e, where)
    model = _model(parts["model"], f"{where}.model")
    expressed = None
    if e["not_predicted"] is None:
        expressed = _expressed(e, parts, profiles, where)
    entry = Entry(
        e["id"], e["role"], parts["source"], parts["hardware"], model, parts["layout"], e["seq_len"],
        e["local_batch"], e["global_batch"], e["compile"], parts["measured"],
        {**e, **parts}, expressed, e["not_predicted"],
    )  # fmt: skip
    if entry.predicted:
        try:  # the strategy exists and runs this point (degrees, divisibility)
            check_layout(*entry.point())
        except UsageError as exc:
            raise SchemaError(f"{where}.expressed_as", str(exc)) from None
    return entry


_PARTS = {"source": SOURCE, "hardware": HARDWARE, "model": MODEL, "layout": LAYOUT, "measured": MEASURED}


def _check_source(source: dict[str, Any], where: str) -> None:
    if not (source["repo"] and source["path"]) and not source["paper"]:
        raise SchemaError(
            where, "give repo and path (with commit), or paper: where the numbers are published"
        )


def _check_degrees(layout: dict[str, int], gpus: int, e: dict[str, Any], where: str) -> None:
    """The degrees multiply to the GPUs, and the global batch is the local batch times the
    data-parallel degree (replicas x FSDP shards): a typo in any of the three shows here."""
    world = 1
    for degree in layout.values():
        world *= degree
    if world != gpus:
        raise SchemaError(f"{where}.layout", f"degrees multiply to {world} GPUs, hardware.gpus is {gpus}")
    data = layout["dp_replicate"] * layout["fsdp"]
    if e["local_batch"] * data != e["global_batch"]:
        raise SchemaError(
            f"{where}.global_batch",
            f"{e['global_batch']} is not local_batch {e['local_batch']} x data-parallel degree {data}",
        )


def _model(m: dict[str, Any], where: str) -> ModelConfig:
    try:
        return ModelConfig(
            m["hidden"], m["layers"], m["heads"], m["kv_heads"], m["ffn_hidden"], vocab_size=m["vocab"],
            rope_theta=float(m["rope_theta"]), name=m["name"],
        )  # fmt: skip
    except ValueError as exc:
        raise SchemaError(where, str(exc)) from None


def _expressed(
    e: dict[str, Any], parts: dict[str, Any], profiles: dict[str, Any], where: str
) -> dict[str, Any]:
    """What a predicted entry must be: bf16, no float8, compile only where a profile models it,
    no pipeline stages, a memory kind with every memory figure, and a mapping to a layout of the
    same GPUs and sequences."""
    if e["expressed_as"] is None:
        raise SchemaError(
            f"{where}.expressed_as", "required unless not_predicted says why it is not predicted"
        )
    x = check_mapping(e["expressed_as"], EXPRESSED, f"{where}.expressed_as")
    problems = {
        "dtype": e["dtype"] != "bfloat16" and f"{e['dtype']!r}: the project predicts bfloat16 runs",
        "float8": e["float8"] and "float8 GEMMs are not modelled",
        "compile": e["compile"]
        and not profiles[parts["hardware"]["profile"]]["calibrated_compile"]
        and "no profile of this hardware models torch.compile",
        "layout.pp": parts["layout"]["pp"] > 1 and "pipeline parallelism is not a strategy here",
    }
    for key, problem in problems.items():
        if problem:
            raise SchemaError(f"{where}.{key}", f"{problem} (list it with not_predicted: <why>)")
    measured = parts["measured"]
    if measured["memory_gib"] is not None and measured["memory_kind"] is None:
        raise SchemaError(
            f"{where}.measured.memory_kind", "say which memory was measured: reserved or allocated"
        )
    _check_sizes(e, parts, where)
    world = x["dp"] * x["tp"] * x["sp"] * x["tsp"] * x["fsdp"]
    if world != parts["hardware"]["gpus"]:
        raise SchemaError(
            f"{where}.expressed_as", f"a layout of {world} GPUs for a run on {parts['hardware']['gpus']}"
        )
    if x["batch"] * x["dp"] * x["fsdp"] != e["global_batch"]:
        raise SchemaError(
            f"{where}.expressed_as.batch", f"{x['batch']} per replica is not global_batch {e['global_batch']}"
        )
    return x


def _check_sizes(e: dict[str, Any], parts: dict[str, Any], where: str) -> None:
    """Numbers a prediction can mean something for: a sequence the model can serve (a typo of
    10^11 tokens would be predicted at 0 tokens/s) and a throughput above zero to compare with."""
    limit = ModelConfig.__dataclass_fields__["max_seq_len"].default
    if e["seq_len"] > limit:
        raise SchemaError(
            f"{where}.seq_len", f"{e['seq_len']:,} tokens: more than the {limit:,} positions predicted"
        )
    if parts["measured"]["tokens_per_s_per_gpu"] <= 0:
        raise SchemaError(f"{where}.measured.tokens_per_s_per_gpu", "must be > 0 for a predicted entry")


def _check_profiles(profiles: dict[str, dict[str, str | None]]) -> None:
    """Every profile a hardware key names exists (shipped, on TSPBENCH_HARDWARE_PATH, or a .yaml
    path): found here, naming the key, not as a bare 'unknown hardware' halfway through."""
    for key, kinds in profiles.items():
        for kind, name in kinds.items():
            if name is not None:
                try:
                    find_profile(name)
                except HardwareError as exc:
                    raise SchemaError(f"profiles.{key}.{kind}", str(exc)) from None


def _check_unique(ids: list[str]) -> None:
    seen: set[str] = set()
    for i, name in enumerate(ids):
        if name in seen:
            raise SchemaError(f"entries[{i}].id", f"{name!r} is given twice")
        seen.add(name)


# ----------------------------------------------------------------------------- stored fake records


def point_key(layout: Layout, workload: Workload) -> str:
    """A short id of the point (layout and the whole workload, model included): the file name
    of its fake-world record, so an entry whose point changed finds no stale record. A workload
    field added since the records were stored is left out at its default (kv_exchange
    allgather, mlp_exchange ring, as the sweep's run ids leave them out), so the stored records
    keep their names."""
    fields = asdict(workload)
    if fields["kv_exchange"] == "allgather":
        del fields["kv_exchange"]
    if fields["mlp_exchange"] == "ring":
        del fields["mlp_exchange"]
    text = json.dumps({"layout": asdict(layout), "workload": fields}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def fake_record_path(results: Path, layout: Layout, workload: Workload) -> Path:
    return results / "fake" / f"{point_key(layout, workload)}.json"


def read_fake_record(results: Path, layout: Layout, workload: Workload) -> dict[str, Any] | None:
    """The stored fake-world record of the point, or None when it was never executed;
    DamagedFileError naming the file when it does not read back."""
    path = fake_record_path(results, layout, workload)
    if not path.is_file():
        return None
    try:
        record = json.loads(read_input_text(path) or "empty")  # bounded, UTF-8 (#45)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        what = "an empty file" if path.stat().st_size == 0 else f"not valid JSON ({exc})"
        raise DamagedFileError(f"{path}: not a readable fake-world record: {what}") from None
    if not isinstance(record, dict):
        raise DamagedFileError(f"{path}: not a fake-world record (expected a JSON mapping)")
    problem = record_problem(record)  # a field of the wrong type or inf: damaged, named (#45)
    if problem:
        raise DamagedFileError(f"{path}: not a readable fake-world record: {problem}")
    return record
