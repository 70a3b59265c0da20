"""The size rules (issue #42), held by reading the source: files a reader takes in at one sitting,
functions that fit on a screen.

    every .py of tspbench/, strategies/ and tools/        at most 400 lines
    every module of tspbench/core/, tspbench/strategy/    at most 300 lines, unless its module
      and strategies/ (the core and the plugin API and      docstring has a line starting
      the plugins: what a plugin author reads)              "Over 300 lines because"
    every function and method there                       at most 60 lines (def to last line)

Tests are not held to them: a test file is a list of cases. A failure names each file or
function and its length, so the fix starts from the message.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = [ROOT / "tspbench", ROOT / "strategies", ROOT / "tools"]
SHORT = [ROOT / "tspbench" / "core", ROOT / "tspbench" / "strategy", ROOT / "strategies"]
FILE_LINES, SHORT_LINES, FUNCTION_LINES = 400, 300, 60
REASON = "Over 300 lines because"


def _sources(folders: list[Path]) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _gives_a_reason(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
    return any(line.strip().startswith(REASON) for line in doc.splitlines())


def test_the_rules_see_the_code() -> None:
    """A moved folder must not make the rules hold by checking nothing."""
    assert len(_sources(CHECKED)) > 100
    assert all(_sources([folder]) for folder in SHORT)


def test_no_file_over_400_lines() -> None:
    long = [f"{_name(p)}: {n} lines" for p in _sources(CHECKED) if (n := _lines(p)) > FILE_LINES]
    assert not long, f"over {FILE_LINES} lines (split it by concern):\n" + "\n".join(long)


def test_core_plugin_api_and_plugins_under_300_lines_or_say_why() -> None:
    long = [
        f"{_name(p)}: {n} lines"
        for p in _sources(SHORT)
        if (n := _lines(p)) > SHORT_LINES and not _gives_a_reason(p)
    ]
    assert not long, (
        f"over {SHORT_LINES} lines: split it, or begin a line of its module docstring with "
        f"'{REASON} ...':\n" + "\n".join(long)
    )


def test_no_function_over_60_lines() -> None:
    long = []
    for path in _sources(CHECKED):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES:
                    long.append(f"{_name(path)}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"functions over {FUNCTION_LINES} lines (split them):\n" + "\n".join(long)
