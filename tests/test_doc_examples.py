"""The console examples of README.md and docs/ reproduce: every line a block shows appears, in order, in what the
command prints today (compared word by word, so the terminal width the block was captured at does not matter; a
"..." line marks output left out)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcalc.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
# profile and bench time the machine they run on: their numbers are examples, not reproducible results
NOT_REPRODUCIBLE = ("tfcalc profile", "tfcalc bench")


def _examples() -> list[tuple[str, list[str]]]:
    """(command line, the output lines shown under it) for each `$ tfcalc ...` in a console block."""
    out: list[tuple[str, list[str]]] = []
    blocks = [block for page in PAGES for block in re.findall(r"```console\n(.*?)```", page.read_text(), re.S)]
    for block in blocks:
        current: list | None = None
        for line in block.splitlines():
            if line.startswith("$ "):
                current = [line[2:], []]
                out.append(current)  # type: ignore[arg-type]
            elif current is not None and current[0].endswith("\\") and not current[1]:
                current[0] = current[0][:-1] + " " + line.strip()
            elif current is not None:
                current[1].append(line)
    return [(cmd, lines) for cmd, lines in out if cmd.startswith("tfcalc ") and not cmd.startswith(NOT_REPRODUCIBLE)]


EXAMPLES = _examples()


def test_the_pages_have_examples() -> None:
    assert len(EXAMPLES) >= 15


@pytest.mark.parametrize("command,shown", EXAMPLES, ids=[c[:60] for c, _ in EXAMPLES])
def test_readme_example_reproduces(command: str, shown: list[str]) -> None:
    args = shlex.split(command)
    assert args[0] == "tfcalc"
    result = CliRunner().invoke(app, args[1:], env={"COLUMNS": "240"})
    words = result.output.split()
    at = 0
    for line in shown:
        want = line.split()
        if not want or set(line.strip()) <= set("─━-") or line.strip() == "...":
            continue
        found = next((i for i in range(at, len(words) - len(want) + 1) if words[i:i + len(want)] == want), None)
        assert found is not None, f"example line not in today's output of `{command}`:\n{line}\n--- output:\n" + \
            result.output
        at = found + len(want)
