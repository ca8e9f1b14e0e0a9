"""`tfcalc profile` through Typer's CliRunner on the CPU: formats, faults, the calibration loop."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfcalc.cli import app
from tfcalc.profile import bench

pytestmark = pytest.mark.usefixtures("fixed_ceilings")
runner = CliRunner()
TINY = ["--device", "cpu", "-p", "llama3.2-1b", "--layers", "1", "--hidden", "64", "--intermediate", "128",
        "--vocab", "512", "--prompt-len", "8", "--gen-len", "3", "--warmup", "0", "--repeats", "1"]
REQUIRED = ("device, device_name, model, layers_run, layers_total, batch, prompt_len, gen_len, dtype, attn_backend, "
            "prefill_tokens_per_s, ttft_s, decode_tokens_per_s, tpot_s, achieved_flops_per_s, mfu, "
            "decode_bytes_per_step, achieved_bytes_per_s, mbu_datasheet, mbu_measured, peak_memory_bytes, "
            "predicted_memory_bytes, predicted_decode_tokens_per_s, measured_over_predicted, status").split(", ")


def test_profile_csv_has_the_contract_columns(tmp_path: Path) -> None:
    out = tmp_path / "rows.csv"
    result = runner.invoke(app, ["profile", *TINY, "--batch", "1,2", "--dtype", "fp32", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 and all(key in rows[0] for key in REQUIRED)
    for row in rows:
        assert row["status"] == "ok" and row["device"] == "cpu" and row["mbu_datasheet"] == ""
        assert (row["layers_run"], row["layers_total"]) == ("1", "1")  # an explicit --layers: no scaling up
        assert float(row["decode_tokens_per_s"]) > 0 and float(row["tpot_s"]) > 0
        assert int(float(row["decode_bytes_per_step"])) > 0 and float(row["measured_over_predicted"]) > 0


def test_profile_table_and_json() -> None:
    table = runner.invoke(app, ["profile", *TINY])
    assert table.exit_code == 0, table.output
    assert "TPOT" in table.output and "MBU (measured copy)" in table.output and "ok" in table.output
    rows = json.loads(runner.invoke(app, ["profile", *TINY, "-f", "json"]).stdout)
    assert rows[0]["dtype"] == "bf16" and isinstance(rows[0]["predicted_memory_bytes"], int)


def test_no_gpu_one_line_exit_2() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = runner.invoke(app, ["profile", "--gpu", "0"])
    assert result.exit_code == 2 and "pass --device cpu" in result.output and "Traceback" not in result.output


def test_no_torch_says_what_to_install(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    result = runner.invoke(app, ["profile", "--device", "cpu"])
    assert result.exit_code == 1 and "pip install 'tfcalc[profile]'" in result.output


@pytest.mark.parametrize("args, message", [
    (["--gen-len", "1"], "at least 2"),
    (["--dtype", "fp8"], "unknown profile dtype"),
    (["--layers", "0"], "must be positive"),
    (["--repeats", "0"], "--repeats"),
])
def test_bad_profile_options(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["profile", *TINY, *args])
    assert result.exit_code == 2 and message in result.output


def test_ctrl_c_keeps_rows_measured_so_far(tmp_path: Path, monkeypatch) -> None:
    real, calls = bench.measure, []

    def interrupted_on_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "measure", interrupted_on_second)
    out = tmp_path / "rows.json"
    result = runner.invoke(app, ["profile", *TINY, "--batch", "1,2,3", "-o", str(out)])
    assert result.exit_code == 130 and "interrupted: kept the 1 rows measured before Ctrl-C" in result.output
    rows = json.loads(out.read_text())
    assert [r["batch"] for r in rows] == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]  # no temporary file left behind


def test_measured_efficiencies_feed_estimate(tmp_path: Path) -> None:
    rows_file, calib = tmp_path / "rows.json", tmp_path / "calib.json"
    result = runner.invoke(app, ["profile", *TINY, "-o", str(rows_file), "--save-calibration", str(calib)])
    assert result.exit_code == 0, result.output
    saved = json.loads(calib.read_text())
    assert 0 < saved["bandwidth_efficiency"]["decode"] <= 1 and "measured ceilings" in saved["source"]
    for source in (calib, rows_file):
        estimate = runner.invoke(app, ["estimate", "-p", "llama3-8b", "--gpu", "h100-sxm", "--calibration",
                                       str(source), "-f", "json"])
        assert estimate.exit_code == 0, estimate.output
        expected = json.loads(runner.invoke(app, ["estimate", "-p", "llama3-8b", "--gpu", "h100-sxm",
                                                  "--bandwidth-efficiency",
                                                  str(saved["bandwidth_efficiency"]["decode"]),
                                                  "--compute-efficiency",
                                                  str(saved["compute_efficiency"]["prefill"]),
                                                  "-f", "json"]).output)
        assert json.loads(estimate.output)[0]["tpot_s"] == pytest.approx(expected[0]["tpot_s"])
