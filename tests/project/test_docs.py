"""README.md and docs/: rendered from the stored records, every quick command runs, no story of
how the project got here, and the record fields they describe are the ones records have."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tools import gen_docs
from tools.docs_numbers.stored import Part
from tspbench.cli import main
from tspbench.core.fields import field_for

REPO = Path(__file__).resolve().parents[2]
PAGES = (
    "strategies", "measuring", "fake-world", "time-model", "gpu-test-set", "decode", "slurm", "results",
    "reproducing-the-paper",
)  # fmt: skip
DOCS = [REPO / "README.md", *(REPO / "docs" / f"{page}.md" for page in PAGES)]
# how a change log talks; the README and docs say what holds now
HISTORY = re.compile(
    r"\b(this stop|last stop|this session|until now|until this|generations?|no longer|used to be|"
    r"previously|was fixed|were fixed|we fixed|before this change|the old (code|model)|"
    r"previous measurement|calibrated before this run|this time|fixed before|before that|"
    r"has not been \w+ that way|\d+ s here|now \d)\b",
    re.IGNORECASE,
)


def test_readme_and_docs_are_rendered_from_the_records() -> None:
    """Every number they quote comes from results/ through tools/gen_docs.py: a record that
    changes without the docs (or docs edited by hand) fails here."""
    assert gen_docs.main(["--check"]) == 0


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_a_page_names_no_path_of_this_checkout(page: Path) -> None:
    """A path the docs give is relative to the checkout's root: one rendered as this checkout's
    absolute path would be stale in every other clone (and fail the check above there)."""
    assert str(REPO) not in page.read_text()


def test_a_part_is_its_fragment_filled_and_a_missing_value_names_its_file(tmp_path: Path) -> None:
    """Wording that depends on the data is a fragment of docs/templates/parts/; a sentence that
    does not apply is None and leaves nothing; a placeholder with no value fails naming the file."""
    assert gen_docs.as_text(Part("ring_ahead", {"from": "64K"})) == ", more than the broadcasts from 64K on"
    assert gen_docs.as_text(None) == ""
    page = tmp_path / "page.md"
    page.write_text("{{nowhere.value}}")
    with pytest.raises(KeyError, match=re.escape("page.md: no value for {{nowhere.value}}")):
        gen_docs.render(page)


def test_readme_fits_in_a_sitting_and_every_page_exists() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 250
    for page in DOCS[1:]:
        assert page.exists(), page
        assert len(page.read_text().splitlines()) < 400, page


def test_no_development_history_in_readme_or_docs() -> None:
    found = [
        f"{page.name}:{n}: {line.strip()}"
        for page in DOCS
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "\n".join(found)


def test_every_field_of_every_stored_record_is_documented() -> None:
    unknown: dict[str, str] = {}
    for path in [*REPO.glob("results/**/result.json"), *REPO.glob("results/published/fake/*.json")]:
        for key in json.loads(path.read_text()):
            if field_for(key) is None:
                unknown.setdefault(key, str(path.relative_to(REPO)))
    assert not unknown, unknown


def _quick_blocks() -> list[tuple[str, str]]:
    """(where, command) for every line of every ```bash quick block of README.md and docs/."""
    out = []
    for page in (p for p in DOCS if p.exists()):  # a missing page fails its own test, not collection
        for block in re.findall(r"```bash quick\n(.*?)```", page.read_text(), re.DOTALL):
            for line in block.splitlines():
                command = line.split("  #")[0].strip()
                if command:
                    out.append((page.name, command))
    return out


def test_readme_and_docs_show_quick_commands() -> None:
    assert {where for where, _ in _quick_blocks()} >= {"README.md", "time-model.md", "decode.md"}


def _run(command: str) -> tuple[int, str]:
    """A ``tspbench ...`` line (output to the terminal or /dev/null) runs in this process through
    the CLI's own entry point, saving a torch import per command; anything else runs in bash."""
    argv = shlex.split(command)
    if argv[0] == "tspbench" and not set(argv) & {"|", "&&", ";", "<", ">>"}:
        if ">" in argv:
            if argv[argv.index(">") + 1 :] != ["/dev/null"]:
                return _bash(command)
            argv = argv[: argv.index(">")]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                code = main(argv[1:])
            except SystemExit as exc:  # argparse's --version and usage errors
                code = exc.code if isinstance(exc.code, int) else 1
        return code, err.getvalue()
    return _bash(command)


def _bash(command: str) -> tuple[int, str]:
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    done = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    return done.returncode, done.stderr


def _unique_commands() -> list[tuple[str, str]]:
    """Each quick command once (the pages that show it joined), whatever its output goes to."""
    pages: dict[str, list[str]] = {}
    for where, command in _quick_blocks():
        pages.setdefault(command.split(" > /dev/null")[0].strip(), []).append(where)
    return [(", ".join(dict.fromkeys(where)), command) for command, where in pages.items()]


@pytest.mark.slow
@pytest.mark.parametrize("where, command", _unique_commands(), ids=[c[:60] for _, c in _unique_commands()])
def test_a_quick_command_of_the_docs_runs(where: str, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    code, err = _run(command)
    assert code == 0, f"{where}: {command}\n{err[-2000:]}"


def test_the_readme_is_for_users() -> None:
    """At most 150 lines; no issue numbers or check tables in it or docs/; every command of its
    quick block prints what it did (none ends in /dev/null)."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for page in DOCS:
        text = page.read_text()
        assert not re.search(r"(issue #|\(#)\d+", text), page.name
        assert "| holds |" not in text, page.name
    quick = [command for where, command in _quick_blocks() if where == "README.md"]
    assert quick and not [c for c in quick if "/dev/null" in c]
