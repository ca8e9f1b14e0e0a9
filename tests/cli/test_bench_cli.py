"""``tfcalc bench attention | moe | ceilings | calibrate`` end to end on the CPU: formats, errors, lazy torch."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcalc.cli import app
from tfcalc.output.columns import REGISTRY

runner = CliRunner()
ATTENTION = ["bench", "attention", "--device", "cpu", "--seq-len", "32", "--heads", "4", "--kv-heads", "4,1",
             "--head-dim", "16", "--decode-batch", "2", "--warmup", "0", "--repeats", "1"]
MOE = ["bench", "moe", "--device", "cpu", "--hidden", "64", "--expert-intermediate", "32", "--tokens", "1,8",
       "--warmup", "0", "--repeats", "1"]
CEILINGS = ["bench", "ceilings", "--device", "cpu", "--copy-size", "1m", "--matmul-size", "64", "--repeats", "2"]
ATTENTION_KEYS = ["device", "backend", "dtype", "batch", "heads", "kv_heads", "head_dim", "seq_len", "phase",
                  "time_s", "tflops_per_s", "flops_per_s", "bytes_per_s", "status"]


def run(*args: str):
    return runner.invoke(app, list(args))


def test_attention_json() -> None:
    result = run(*ATTENTION, "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 5 * 2 * 2  # every backend, kv heads 4 and 1, prefill and decode
    assert all(key in row for row in rows for key in ATTENTION_KEYS)
    assert {r["status"] for r in rows if r["backend"] == "cudnn"} == {"unavailable"}
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r["time_s"] > 0 and r["flops_per_s"] > 0 for r in ok)
    prefill = next(r for r in ok if r["phase"] == "prefill")
    assert prefill["flops"] == 4 * 1 * 4 * 32 * 32 * 16 / 2


def test_attention_csv_and_table() -> None:
    result = run(*ATTENTION, "--backend", "math,cudnn", "--no-decode", "-f", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(r["backend"], r["kv_heads"], r["status"]) for r in rows] == [
        ("math", "4", "ok"), ("math", "1", "ok"), ("cudnn", "4", "unavailable"), ("cudnn", "1", "unavailable")]
    table = run(*ATTENTION, "--backend", "math,cudnn")
    assert table.exit_code == 0, table.output
    assert "SDPA attention" in table.stdout and "4 B H T^2 D / 2" in table.stdout
    assert "unavailable here: cudnn" in table.stdout and "FLOP/s" in table.stdout


def test_moe_formats(tmp_path: Path) -> None:
    result = run(*MOE, "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["tokens"] for r in rows] == [1, 8]
    for r in rows:
        assert r["model"] == "mixtral-8x7b" and r["hidden"] == 64 and r["dense_intermediate"] == 64
        assert r["moe_tokens_per_s"] > 0 and r["dense_tokens_per_s"] > 0
        assert r["expected_distinct_experts"] == pytest.approx(8 * (1 - (1 - 2 / 8) ** r["tokens"]))
    out = tmp_path / "moe.csv"
    assert run(*MOE, "--preset", "qwen3-30b-a3b", "--experts", "16", "--output", str(out)).exit_code == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["experts"], int(r["experts_per_token"])) for r in rows] == [("16", 8), ("16", 8)]
    table = run(*MOE)
    assert table.exit_code == 0 and "MoE layer vs dense FFN: mixtral-8x7b" in table.stdout
    assert "expected distinct" in table.stdout


def test_ceilings_formats() -> None:
    result = run(*CEILINGS, "--dtype", "fp32", "-f", "json")
    assert result.exit_code == 0, result.output
    copy, matmul = json.loads(result.stdout)
    assert copy["ceiling"] == "copy" and copy["size"] == 1 << 20 and copy["bytes_per_s"] > 0
    assert matmul["ceiling"] == "matmul" and matmul["size"] == 64 and matmul["flops_per_s"] > 0
    assert matmul["p25_flops_per_s"] <= matmul["flops_per_s"] <= matmul["p75_flops_per_s"]
    rows = list(csv.DictReader(io.StringIO(run(*CEILINGS, "-f", "csv").stdout)))
    assert [r["dtype"] for r in rows] == ["uint8", "fp32", "bf16"]  # CPU default dtypes fp32, bf16
    table = run(*CEILINGS)
    # a copy rate with its unit under any SI prefix: a loaded 2-core machine may copy 1 MiB at MB/s, not GB/s
    assert table.exit_code == 0 and "Device ceilings" in table.stdout
    assert re.search(r"\d [kMGTP]?B/s", table.stdout), table.stdout


def test_calibrate_writes_what_estimate_reads(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    result = run("bench", "calibrate", "--device", "cpu", "--quick", "--save", str(path), "-f", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert all(key in REGISTRY for row in rows for key in row)  # one registered name per key (rates as numbers)
    sweeps = {r["sweep"] for r in rows}
    assert {"gemm fp32", "copy", "launch", "attention prefill", "attention decode"} <= sweeps
    data = json.loads(path.read_text())
    assert data["kind"] == "tfcalc-calibration" and data["launch"]["graph_seconds"] is None  # no graphs on a CPU
    assert all(r["seconds"] > 0 for r in data["gemm"] + data["memory"] + data["attention"])
    estimate = run("estimate", "-p", "llama3.2-1b", "--calibration", str(path), "-f", "json")
    assert estimate.exit_code == 0, estimate.output
    row = json.loads(estimate.stdout)[0]
    assert str(path) in row["efficiency_source"] and row["tpot_s"] > 0
    table = run("bench", "calibrate", "--device", "cpu", "--quick")
    assert table.exit_code == 0 and "Calibration:" in table.stdout and "no GPU preset matches" in table.stdout


def test_calibrate_save_is_checked_before_measuring(tmp_path: Path) -> None:
    """--save goes through check_before_work: refused at once (exit 2) when it is also --output, and a missing
    folder is reported before a single kernel is timed; an existing file is left as it was."""
    path = tmp_path / "cal.json"
    path.write_text("keep")
    result = run("bench", "calibrate", "--device", "cpu", "--quick", "--save", str(path), "-o", str(path))
    assert result.exit_code == 2 and "give each output its own file" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and path.read_text() == "keep"
    result = run("bench", "calibrate", "--device", "cpu", "--quick", "--save", str(tmp_path / "no" / "cal.json"))
    assert result.exit_code != 0 and "calibrating" not in result.stderr and "Calibration:" not in result.stdout
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["attention", "moe", "ceilings", "calibrate"])
def test_cuda_without_gpu_is_one_line(command: str) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    result = run("bench", command)  # --device cuda is the default
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no CUDA GPU") and "pass --device cpu" in lines[0]


def test_usage_errors() -> None:
    result = run(*ATTENTION, "--backend", "xformers")
    assert result.exit_code == 2 and "unknown attention backend 'xformers'" in result.stderr
    result = run(*ATTENTION, "--kv-heads", "3")
    assert result.exit_code == 2 and "must divide" in result.stderr
    result = run("bench", "moe", "--device", "cpu", "--preset", "llama3-8b")
    assert result.exit_code == 2 and "no MoE layers" in result.stderr
    result = run(*CEILINGS, "--dtype", "fp8")
    assert result.exit_code == 2 and "unknown dtype 'fp8'" in result.stderr
    for args, message in ((["--heads", "0"], "--heads and --head-dim must be positive"),
                          (["--head-dim", "0"], "--heads and --head-dim must be positive"),
                          (["--peak-tflops", "-1"], "--peak-tflops must be a positive number"),
                          (["--peak-tflops", "nan"], "--peak-tflops must be a positive number"),
                          (["--heads", "100000000", "--kv-heads", "1"], "lower --seq-len, --heads")):
        result = run(*ATTENTION, *args)
        assert result.exit_code == 2 and message in result.stderr, result.output
        assert len(result.stderr.strip().splitlines()) == 1


NO_TORCH = """
import sys
sys.modules["torch"] = None  # as if PyTorch were not installed
from tfcalc.cli import app
app(["bench", "ceilings", "--device", "cpu"])
"""

PROBE = """
import json, sys
from tfcalc.cli import app
try:
    app({args!r})
except SystemExit:
    pass
print(json.dumps("torch" in sys.modules), file=sys.stderr)
"""


def test_without_torch_one_clear_line() -> None:
    done = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    from tfcalc.errors import missing_torch_message

    assert done.stderr.strip() == f"error: {missing_torch_message()}"


@pytest.mark.parametrize("args", [["kv-cache", "-p", "llama3-70b"], ["--help"], ["bench", "--help"],
                                  ["bench", "attention", "--help"]])
def test_bench_registration_keeps_torch_lazy(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True,
                          check=False)
    assert json.loads(done.stderr.strip().splitlines()[-1]) is False, done.stderr


# --- collectives: 2 CPU ranks over gloo ----------------------------------------------------------------------------

COLLECTIVES = ["bench", "collectives", "--device", "cpu", "--op", "all_reduce,all_to_all", "--max-size", "64k",
               "--repeats", "2", "--iters", "2"]


def test_collectives_rows_bandwidths_fit_and_calibration(tmp_path: Path) -> None:
    """Sizes 1-64 KiB of two ops on 2 ranks: algbw = S / t, busbw = algbw x 2(n-1)/n or (n-1)/n (nccl-tests), a
    fitted time and residual per row; the saved timings read back as a calibration whose link estimate prices."""
    from tfcalc.calc.calibration import Calibration, load_calibration

    saved = tmp_path / "collectives.json"
    result = run(*COLLECTIVES, "--save", str(saved), "-f", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["op"], r["bytes"]) for r in rows] == [(op, 1024 * 2**i) for op in ("all_reduce", "all_to_all")
                                                     for i in range(7)]
    assert all(key in REGISTRY for row in rows for key in row)
    for r in rows:
        assert r["world_size"] == 2 and r["dist_backend"] == "gloo" and r["status"] == "ok" and r["time_s"] > 0
        assert r["algbw_bytes_per_s"] == pytest.approx(r["bytes"] / r["time_s"])
        factor = 1.0 if r["op"] == "all_reduce" else 0.5
        assert r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"] * factor)
        assert r["fitted_time_s"] > 0 and r["fit_residual"] == pytest.approx(r["fitted_time_s"] / r["time_s"] - 1)
    cal = load_calibration(json.loads(saved.read_text()), str(saved))
    assert isinstance(cal, Calibration) and len(cal.collectives) == 14
    assert {(op, ranks) for op, ranks, _, _ in cal.collectives} == {("all_reduce", 2), ("all_to_all", 2)}
    plain = json.loads(run("estimate", "-p", "llama3-8b", "--tp", "2", "-f", "json").stdout)[0]
    calibrated = json.loads(run("estimate", "-p", "llama3-8b", "--tp", "2", "--calibration", str(saved),
                                "-f", "json").stdout)[0]
    assert calibrated["prefill_tp_comm_s"] != pytest.approx(plain["prefill_tp_comm_s"], rel=0.01)
    assert calibrated["tpot_s"] != plain["tpot_s"]


def test_collectives_table_says_the_fits_and_keeps_other_sections(tmp_path: Path) -> None:
    saved = tmp_path / "calibration.json"
    saved.write_text(json.dumps({"kind": "tfcalc-calibration", "version": 2,
                                 "memory": [{"bytes": 1 << 20, "seconds": 1e-4}, {"bytes": 1 << 24, "seconds": 1e-3}]}))
    result = run(*[a if a != "all_reduce,all_to_all" else "all_gather" for a in COLLECTIVES], "--save", str(saved))
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # notes wrap at the terminal's width
    assert "busbw" in text and "all_gather fit: latency" in text and "residuals rms" in text
    assert "link (all ops together" in text and "(kept its memory)" in text
    data = json.loads(saved.read_text())
    assert len(data["memory"]) == 2 and {r["op"] for r in data["collectives"]} == {"all_gather"}


@pytest.mark.parametrize("args, message", [
    (["--op", "broadcast"], "unknown collective 'broadcast'"),
    (["--min-size", "1m", "--max-size", "1k"], "at most --max-size"),
    (["--dtype", "fp8"], "--dtype takes one of"),
])
def test_collectives_usage_errors(args: list[str], message: str) -> None:
    result = run("bench", "collectives", "--device", "cpu", *args)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
