"""Shell completion through the installed entry point: the script, its installation, and what it completes
(command names, options, preset names, engines, column keys)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TFCALC = shutil.which("tfcalc", path=str(Path(sys.executable).parent)) or shutil.which("tfcalc")
pytestmark = pytest.mark.skipif(TFCALC is None, reason="the tfcalc entry point is not installed (pip install -e .)")


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TFCALC, *args], capture_output=True, text=True, timeout=60,  # type: ignore[list-item]
                          env={**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1", **env})


def _complete(words: str) -> list[str]:
    """What bash completion offers for the last word of ``words``."""
    parts = words.split(" ")
    result = _run(COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1), _TFCALC_COMPLETE="complete_bash")
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_show_and_install_completion(tmp_path: Path) -> None:
    shown = _run("--show-completion", "bash")
    assert shown.returncode == 0 and "_TFCALC_COMPLETE=complete_bash" in shown.stdout
    installed = _run("--install-completion", "bash", HOME=str(tmp_path))
    assert installed.returncode == 0, installed.stderr
    script = tmp_path / ".bash_completions" / "tfcalc.sh"
    assert "_TFCALC_COMPLETE=complete_bash" in script.read_text()
    assert str(script) in (tmp_path / ".bashrc").read_text()


def test_completes_commands_options_and_names() -> None:
    assert _complete("tfcalc kv") == ["kv-cache"]
    assert "--max-model-len" in _complete("tfcalc plan --max")
    assert _complete("tfcalc kv-cache --preset mixtral") == ["mixtral-8x22b", "mixtral-8x7b"]
    assert _complete("tfcalc plan --gpu h1") == ["h100-nvl", "h100-pcie", "h100-sxm"]
    assert "vllm-0.21" in _complete("tfcalc estimate --engine vllm")
    assert _complete("tfcalc plan --columns model,kv_tok") == ["model,kv_tokens_per_gpu"]
