"""The calculator's table and JSON paths never import torch or pandas (speed and a light install)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
from tfcalc.cli import app
try:
    app({args!r})
except SystemExit:
    pass
print(json.dumps(sorted(m for m in ("torch", "pandas", "numpy", "pynvml", "matplotlib") if m in sys.modules)),
      file=sys.stderr)
"""


@pytest.mark.parametrize("args", [
    ["kv-cache", "-p", "llama3-70b"],
    ["kv-cache", "-p", "llama3-70b", "--format", "json"],
    ["params", "-p", "deepseek-v3"],
    ["memory", "-p", "gpt-oss-120b", "-f", "json"],
    ["presets", "list"],
])
def test_no_heavy_imports(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True,
                          check=False)
    heavy = json.loads(done.stderr.strip().splitlines()[-1])
    assert heavy == [], f"{args} imported {heavy}"


def test_csv_path_does_import_pandas() -> None:
    # The check above could pass vacuously if the probe never rendered anything; CSV must load pandas.
    done = subprocess.run([sys.executable, "-c", PROBE.format(args=["kv-cache", "-p", "llama3-70b", "-f", "csv"])],
                          capture_output=True, text=True, check=False)
    assert "pandas" in json.loads(done.stderr.strip().splitlines()[-1])


def test_kv_cache_does_not_load_the_latency_model_or_engines() -> None:
    """kv-cache answers from the model spec alone: the latency model, engine and fabric presets stay unloaded."""
    probe = PROBE.replace('("torch", "pandas", "numpy", "pynvml", "matplotlib")',
                          '("tfcalc.calc.latency", "tfcalc.calc.kernels", "tfcalc.calc.comm", "tfcalc.calc.plan", '
                          '"tfcalc.spec.engine", "tfcalc.spec.interconnect", "tfcalc.report.estimate")')
    assert probe != PROBE
    done = subprocess.run([sys.executable, "-c", probe.format(args=["kv-cache", "-p", "llama3-70b"])],
                          capture_output=True, text=True, check=False)
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
    done = subprocess.run([sys.executable, "-c", probe.format(args=["estimate", "-p", "llama3-8b"])],
                          capture_output=True, text=True, check=False)
    assert "tfcalc.calc.latency" in json.loads(done.stderr.strip().splitlines()[-1])  # the probe sees them


ROOT = Path(__file__).resolve().parents[1]


def test_layer_contract_holds() -> None:
    """pyproject.toml's [tool.importlinter] contract: cli -> profile -> model -> report | output -> calc -> spec ->
    dtypes -> units -> errors, imports inside functions included."""
    from importlinter.cli import lint_imports

    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0


def test_layer_contract_catches_an_upward_import(tmp_path: Path) -> None:
    """The check is not vacuous: with two real layers swapped (units imports errors), it fails."""
    from importlinter.cli import lint_imports

    config = tmp_path / "contract.toml"
    config.write_text('[tool.importlinter]\nroot_package = "tfcalc"\n[[tool.importlinter.contracts]]\nname = "x"\n'
                      'type = "layers"\nlayers = ["tfcalc.errors", "tfcalc.units"]\n')
    assert lint_imports(config_filename=str(config), no_cache=True, no_logo=True) == 1
