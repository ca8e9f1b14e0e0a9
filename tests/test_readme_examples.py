"""README's console examples reproduce: every line a block shows appears, in order, in what the command prints today
(compared word by word, so the terminal width the block was captured at does not matter)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcalc.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"
# profile times the machine it runs on: its numbers are an example, not a reproducible result
NOT_REPRODUCIBLE = ("tfcalc profile",)


def _examples() -> list[tuple[str, list[str]]]:
    """(command line, the output lines shown under it) for each `$ tfcalc ...` in a console block."""
    out: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", README.read_text(), re.S):
        current: list | None = None
        for line in block.splitlines():
            if line.startswith("$ "):
                current = [line[2:], []]
                out.append(current)  # type: ignore[arg-type]
            elif current is not None and current[0].endswith("\\") and not current[1]:
                current[0] = current[0][:-1] + " " + line.strip()
            elif current is not None:
                current[1].append(line)
    return [(cmd, lines) for cmd, lines in out if not cmd.startswith(NOT_REPRODUCIBLE)]


EXAMPLES = _examples()


def test_the_readme_has_examples() -> None:
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("command,shown", EXAMPLES, ids=[c[:60] for c, _ in EXAMPLES])
def test_readme_example_reproduces(command: str, shown: list[str]) -> None:
    args = shlex.split(command)
    assert args[0] == "tfcalc"
    result = CliRunner().invoke(app, args[1:], env={"COLUMNS": "240"})
    words = result.output.split()
    at = 0
    for line in shown:
        want = line.split()
        if not want or set(line.strip()) <= set("─━-"):
            continue
        found = next((i for i in range(at, len(words) - len(want) + 1) if words[i:i + len(want)] == want), None)
        assert found is not None, f"README line not in today's output of `{command}`:\n{line}\n--- output:\n" + \
            result.output
        at = found + len(want)
