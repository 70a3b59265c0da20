"""Reading YAML the one strict way every input file is read (experiments, hardware and cluster
profiles, and the values of ``--set``).

Plain ``yaml.safe_load`` keeps the last of two equal keys of a mapping without a word, so a
file with ``seq_len`` twice runs with whichever came last; and a byte that is not UTF-8 ends in
a UnicodeDecodeError traceback. Here both are one-line errors that name the file and the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tspbench.core.errors import UsageError
from tspbench.core.files import read_input_text

_MERGE_TAG = "tag:yaml.org,2002:merge"
YAML_LIMIT = 4 * 2**20  # bytes: far past any profile or experiment file


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that names one key twice (YAML requires keys to be unique)."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (``<<`` merges may still be
    overridden: that is what they are for)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first_line.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error says so below
                continue
            if seen is not None:
                problem = f"duplicate key {key!r} (first given at line {seen})"
                raise DuplicateKeyError(None, None, problem, key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


MAX_VALUES = 100_000  # values a document may expand to: far past any profile or experiment


def parse_yaml(text: str) -> Any:
    """``text`` as YAML, refusing duplicate keys and documents that expand past MAX_VALUES values
    through aliases (raises yaml.YAMLError): 1 KB of nested ``*alias`` lists names 10^9 values,
    which every error message that shows the value would print (#45)."""
    loader = StrictLoader(text)  # a SafeLoader: builds plain data only
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {})
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, seen: dict[int, int]) -> int:
    """How many values ``node`` stands for with every alias expanded (each shared node counted
    once per use, computed once); ConstructorError past MAX_VALUES."""
    if id(node) in seen:
        return seen[id(node)]
    seen[id(node)] = 1  # an alias of its own ancestor counts once, not for ever
    if isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_expanded_size(child, seen) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total = 1 + sum(_expanded_size(k, seen) + _expanded_size(v, seen) for k, v in node.value)
    else:
        total = 1
    if total > MAX_VALUES:
        problem = f"expands to more than {MAX_VALUES:,} values (aliases repeat what they name)"
        raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark)
    seen[id(node)] = total
    return total


def read_yaml(path: Path, error: type[UsageError] = UsageError) -> Any:
    """The YAML document in ``path``; ``error`` with one line naming the file (and the line)
    when its bytes are not UTF-8, it is not valid YAML, or a mapping names a key twice."""
    text = read_input_text(path, YAML_LIMIT, error)  # a regular file, bounded: never a FIFO
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML{_where(exc)}: {_problem(exc)}") from None


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""


def _problem(exc: yaml.YAMLError) -> str:
    return getattr(exc, "problem", None) or str(exc).splitlines()[0]
