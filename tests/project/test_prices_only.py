"""One price list (issue #42): work becomes seconds in tspbench/analytic/prices.py and nowhere
else, and a point's hardware profile is chosen where a command, sweep or check starts, never
inside measure/. Held by reading the source (ast, so docstrings and comments never count, and
f-string expressions do).

A conversion of work into seconds is found by its shape, in any module of tspbench/,
strategies/ and tools/ (the docs' numbers) but the price list:

    per-op time    an expression where a profile's ``*_us`` figure (op_overhead_us,
                   host_overhead_us, launch_us, a link's latency_us ...) meets arithmetic and
                   1e-6 (or 1e6): op counts x overhead, or microseconds into seconds
    rate to base   a ``*_gbs`` or ``*tflops`` figure scaled by 1e9 or 1e12 into bytes/s or
                   FLOP/s: the divisor that turns bytes or FLOPs into seconds
    over a rate    work divided by an expression that names a rate (``*gbs``, ``*tflops``,
                   ``*bandwidth``): work over a rate is seconds (``1 / x`` is a rate, not work)

Printing a size or a rate in other units (``b / 2**30`` GiB, ``tflops * 1e3`` GFLOP/s, ``x / 1e9``
GB), a rate measured from seconds (``bandwidth / 1e9``), or a what-if scaling a figure in its own
unit (``latency_us * factor``) matches none of them. ALLOWED names the few functions whose match
is no price, each with its reason; an entry that no longer matches is stale and fails, so the
list only shrinks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = [ROOT / "tspbench", ROOT / "strategies", ROOT / "tools"]
PRICE_LIST = "tspbench/analytic/prices.py"

PER_OP_TIME = re.compile(r"_us$")
MICRO = {1e-6, 1e6}
RATE_FIGURE = re.compile(r"(gbs|tflops)$")  # a profile's rate, in GB/s or TFLOP/s
RATE = re.compile(r"(gbs|tflops|bandwidth)$")  # any rate
BASE_UNITS = {1e9, 1e12, 1e-9, 1e-12}
ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div)

# (file, function) -> why its match is not a price
ALLOWED = {
    ("tspbench/analytic/hardware.py", "Hardware.link"): (
        "the profile's own units: a link's latency (us -> s) and bus bandwidth (GB/s -> bytes/s) "
        "that prices.collective_seconds prices a collective with; no work is converted there"
    ),
    ("tspbench/costs/flops.py", "mfu"): (
        "MFU: model FLOPs over step seconds x the peak FLOP/s, a ratio of rates, not a time"
    ),
    ("tspbench/calibrate/profile.py", "calibrate"): (
        "calibrate measures a profile: the element-wise bandwidth it just measured, GB/s -> bytes/s, "
        "for step_figures to turn measured seconds into passes (the inverse of a price)"
    ),
}


def name_of(node: ast.AST) -> str:
    """The name an operand reads: ``x``, ``hw.x``, ``d["x"]``; '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return ""


def constant_in(node: ast.AST, values: set[float]) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, float) and node.value in values


def arithmetic(expression: ast.BinOp) -> list[ast.AST]:
    """The BinOps of one arithmetic expression and their operands (not what a call inside takes:
    its arguments are expressions of their own)."""
    out: list[ast.AST] = [expression]
    stack = [expression]
    while stack:
        node = stack.pop()
        for operand in (node.left, node.right):
            out.append(operand)
            if isinstance(operand, ast.BinOp):
                stack.append(operand)
    return out


def per_op_time(nodes: list[ast.AST]) -> bool:
    """A ``*_us`` figure in arithmetic, and a 1e-6 (or 1e6) in the same expression."""
    figure = any(
        isinstance(n, ast.BinOp)
        and isinstance(n.op, ARITHMETIC)
        and any(PER_OP_TIME.search(name_of(o)) for o in (n.left, n.right))
        for n in nodes
    )
    return figure and any(constant_in(n, MICRO) for n in nodes)


def scaled_or_over_a_rate(node: ast.BinOp) -> str | None:
    """'rate to base' or 'over a rate' where ``node`` itself has that shape, else None."""
    if isinstance(node.op, (ast.Mult, ast.Div)):
        for rate, scale in ((node.left, node.right), (node.right, node.left)):
            if RATE_FIGURE.search(name_of(rate)) and constant_in(scale, BASE_UNITS):
                return "rate to base"
    work = not isinstance(node.left, ast.Constant)  # 1 / x is a rate, not work over one
    if isinstance(node.op, ast.Div) and work and any(RATE.search(name_of(n)) for n in ast.walk(node.right)):
        return "over a rate"
    return None


def conversion(expression: ast.BinOp) -> str | None:
    """Which shape of a conversion into seconds the arithmetic ``expression`` has (the module
    docstring), or None."""
    nodes = arithmetic(expression)
    if per_op_time(nodes):
        return "per-op time"
    shapes = (scaled_or_over_a_rate(n) for n in nodes if isinstance(n, ast.BinOp))
    return next((shape for shape in shapes if shape), None)


def conversions(source: str) -> list[tuple[str, int, str, str]]:
    """(enclosing function, line, shape, source text) of every expression converting into seconds."""
    found: list[tuple[str, int, str, str]] = []

    def visit(node: ast.AST, scope: list[str], in_arithmetic: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = [*scope, node.name]
        binop = isinstance(node, ast.BinOp)
        if binop and not in_arithmetic and (shape := conversion(node)):
            found.append((".".join(scope), node.lineno, shape, ast.get_source_segment(source, node) or ""))
        for child in ast.iter_child_nodes(node):
            visit(child, scope, binop)

    visit(ast.parse(source), [], False)
    return found


def scanned_files() -> list[Path]:
    files = (p for folder in SCANNED for p in folder.rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(p for p in files if p.relative_to(ROOT).as_posix() != PRICE_LIST)


def all_conversions() -> list[tuple[str, str, int, str, str]]:
    """(file, function, line, shape, text) over every scanned module."""
    return [
        (path.relative_to(ROOT).as_posix(), *hit)
        for path in scanned_files()
        for hit in conversions(path.read_text())
    ]


def test_work_becomes_seconds_only_in_the_price_list() -> None:
    found = [hit for hit in all_conversions() if (hit[0], hit[1]) not in ALLOWED]
    assert not found, "conversions into seconds outside tspbench/analytic/prices.py (price them there):\n" + (
        "\n".join(
            f"  {f}:{line} in {fn or '<module>'} ({shape}): {text}" for f, fn, line, shape, text in found
        )
    )


def test_every_allowed_entry_still_matches() -> None:
    used = {(hit[0], hit[1]) for hit in all_conversions()}
    stale = [key for key in ALLOWED if key not in used]
    assert not stale, f"ALLOWED entries that match nothing any more (remove them): {stale}"


SHAPES = {
    "x = kernels * hw.op_overhead_us * 1e-6": "per-op time",
    "x = hw.host_overhead_us * 1e-6": "per-op time",
    "x = max(0.0, ops * hw.launch_us * 1e-6 - device_s)": "per-op time",
    "rate = hw.hbm_bandwidth_gbs * 1e9": "rate to base",
    "rate = hw.gemm_tflops * 1e12": "rate to base",
    "x = nbytes / (bandwidth_gbs * 1e9)": "over a rate",
    "x = flops / (hw.gemm_tflops * 1e12)": "over a rate",
    "x = nbytes / bandwidth": "over a rate",
    "x = nbytes / hw.link('all_gather', 2, 2, False)[1] / rates['hbm_gbs']": "over a rate",
}
NOT_PRICES = [
    "s = f'{b / 2**30:.2f} GiB'",
    "s = f\"{copy['bytes'] / 1e9:.1f}\"",
    "s = f'{cpu.gemm_tflops * 1e3:.1f}'",
    "tflops = flops / median / world / 1e12",
    "d = {'op_overhead_us': overhead * 1e6}",
    "bandwidth = 1 / inverse_bandwidth",
    "x = hw.op_overhead_us",
    "x = c.batched_latency_us * factor",
    "bandwidth_gbs = bandwidth / 1e9",
]


def test_the_scan_finds_each_shape() -> None:
    """The scan is no stronger than its shapes: each is found, and unit formatting is not."""
    for line, shape in SHAPES.items():
        assert [hit[2] for hit in conversions(line)] == [shape], line
    for line in NOT_PRICES:
        assert conversions(line) == [], line


def test_measure_never_chooses_a_profile() -> None:
    """bench and fake_bench take the point's HardwareChoice from their callers (the CLI, the
    sweep's executors, the checks): a default chosen inside measure/ would price a point on a
    profile its caller never saw."""
    calls = [
        f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
        for path in sorted((ROOT / "tspbench" / "measure").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if "choose_profile" in (getattr(node, key, None) for key in ("id", "attr", "name"))
    ]
    assert not calls, f"measure/ names choose_profile: {calls}"
