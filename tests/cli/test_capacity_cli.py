"""``tfcalc capacity`` end to end: the table fits 100 columns, long-format CSV/JSON, plot, explain, launch
command lines, and one-line errors for bad input."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcalc.cli import app
from tfcalc.cli.capacity import parse_duration, parse_targets

runner = CliRunner()
SMALL = ["capacity", "-p", "llama3-8b", "--gpu", "h100-sxm,l40s", "--tp", "1,2", "--max-num-seqs", "32,128",
         "--chunk", "2048", "--rate", "8", "--input-len", "1000", "--output-len", "200", "--ttft", "p90=800ms",
         "--tpot", "p90=60ms", "--sim-requests", "400"]


def run(*args: str):
    return runner.invoke(app, list(args))


def test_table_fits_100_columns_and_names_the_plan() -> None:
    result = run(*SMALL)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "cheapest plan for llama3-8b at 8 req/s" in out
    assert "per million input" in out and "per million output" in out
    assert "vllm serve llama3-8b" in out and "--max-num-seqs" in out and "--tensor-parallel-size" in out
    assert "sglang.launch_server" in out and "--max-running-requests" in out
    assert "simulation of one replica" in out
    assert "Pareto frontier" in out


def test_long_format_csv_and_json_have_every_candidate() -> None:
    csv_out = run(*SMALL, "--format", "csv", "--no-simulate")
    assert csv_out.exit_code == 0, csv_out.output
    rows = list(csv.DictReader(io.StringIO(csv_out.stdout)))
    assert {"gpu", "tp", "max_num_seqs", "metric", "value", "unit"} <= set(rows[0])
    configs = {(r["gpu"], r["tp"], r["weights_dtype"], r["kv_dtype"], r["max_num_seqs"]) for r in rows}
    assert len(configs) == 2 * 2 * 2 * 2 * 2      # GPUs x tp x weights x KV x seqs (one chunk size)
    chosen = [r for r in rows if r["metric"] == "chosen" and r["value"] == "True"]
    assert len(chosen) == 1
    json_out = run(*SMALL, "--format", "json", "--no-simulate")
    data = json.loads(json_out.stdout)
    assert len(data) == len(rows)
    costs = [r for r in data if r["metric"] == "cost_per_hour" and r["value"] is not None]
    assert all(isinstance(r["value"], float) for r in costs)


def test_json_path_imports_neither_torch_nor_pandas() -> None:
    probe = ("import json, sys\nfrom tfcalc.cli import app\ntry:\n    app({args!r})\nexcept SystemExit:\n    pass\n"
             "print(json.dumps(sorted(m for m in ('torch', 'pandas') if m in sys.modules)), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe.format(args=[*SMALL, "-f", "json", "--no-simulate"])],
                          capture_output=True, text=True, check=False)
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []


def test_plot_and_explain(tmp_path: Path) -> None:
    png = tmp_path / "frontier.png"
    result = run(*SMALL, "--plot", str(png), "--explain", "--no-simulate")
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "explain llama3-8b:" in result.stdout and "TTFT = request overhead" in result.stdout
    assert "capacity: one replica carries" in result.stdout


def test_concurrency_options_and_overrides() -> None:
    result = run("capacity", "-p", "llama3-8b", "--gpu", "h100-sxm", "--price", "h100-sxm=2.00", "--tp", "1",
                 "--max-num-seqs", "64", "--chunk", "2048", "--concurrency", "40", "--length-dist", "lognormal",
                 "--input-spread", "0.5", "--ttft", "mean=500ms", "--e2e", "p99=30s", "--speculative", "3",
                 "--acceptance", "0.7", "--prefix-hit", "0.3", "--request-overhead", "20ms", "--no-simulate")
    assert result.exit_code == 0, result.output
    assert "$2.00" in result.stdout or "2.00" in result.stdout
    assert "40 concurrent requests" in result.stdout


def test_lengths_csv(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    path.write_text("input_tokens,output_tokens\n500,100\n1500,300\n900,50\n")
    result = run("capacity", "-p", "llama3-8b", "--gpu", "h100-sxm", "--tp", "1", "--max-num-seqs", "64",
                 "--chunk", "2048", "--rate", "5", "--lengths-csv", str(path), "--ttft", "p90=1s", "--no-simulate")
    assert result.exit_code == 0, result.output
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,completion\n1,2\n")
    result = run("capacity", "-p", "llama3-8b", "--rate", "5", "--lengths-csv", str(bad), "--ttft", "p90=1s")
    assert result.exit_code == 2 and "needs columns input_tokens and output_tokens" in result.output


@pytest.mark.parametrize("args,message", [
    (["--rate", "5"], "give at least one latency target"),
    (["--ttft", "p90=1s"], "give the traffic as --rate"),
    (["--rate", "5", "--concurrency", "4", "--ttft", "p90=1s"], "one of them"),
    (["--rate", "5", "--ttft", "p90=soon"], "invalid --ttft target 'soon'"),
    (["--rate", "5", "--ttft", "q90=1s"], "is not p50"),
    (["--rate", "5", "--ttft", "p90=1s", "--gpu", "a100-40gb"], "no price for GPU 'a100-40gb'"),
    (["--rate", "5", "--ttft", "p90=1s", "--price", "h100-sxm=free"], "is not a number"),
    (["--rate", "-1", "--ttft", "p90=1s"], "request rate must be positive"),
    (["--rate", "5", "--ttft", "p90=1s", "--engine", "tgi"], "unknown engine 'tgi'"),
])
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = run("capacity", "-p", "llama3-8b", *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.output


def test_impossible_targets_exit_1_with_the_closest() -> None:
    result = run("capacity", "-p", "llama3-8b", "--gpu", "l40s", "--tp", "1", "--max-num-seqs", "64", "--chunk",
                 "2048", "--rate", "5", "--ttft", "p50=1ms", "--no-simulate")
    assert result.exit_code == 1
    assert "no configuration of llama3-8b meets the targets" in result.output


def test_parsers() -> None:
    assert parse_duration("500ms", "x") == pytest.approx(0.5)
    assert parse_duration("2", "x") == 2.0
    assert parse_duration("800us", "x") == pytest.approx(8e-4)
    (a, b) = parse_targets(["p50=200ms,p99.9=2s"], "ttft")
    assert (a.percentile, a.seconds, b.percentile, b.seconds) == (50, 0.2, 99.9, 2.0)
    assert parse_targets(["mean=40ms"], "tpot")[0].percentile == 0
