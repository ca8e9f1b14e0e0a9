"""`tfcalc profile` through Typer's CliRunner on the CPU: formats, faults, the calibration loop."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfcalc.cli import app
from tfcalc.profile import sweep as profiler

pytestmark = pytest.mark.usefixtures("fixed_ceilings")
runner = CliRunner()
MODEL = ["--device", "cpu", "-p", "llama3.2-1b", "--layers", "1", "--hidden", "64", "--intermediate", "128",
         "--vocab", "512", "--warmup", "0"]
TINY = [*MODEL, "--prompt-len", "8", "--gen-len", "3", "--repeats", "1"]
REQUIRED = ("device, device_name, model, layers_run, layers_total, batch, prompt_len, gen_len, dtype, attn_backend, "
            "prefill_tokens_per_s, ttft_s, decode_tokens_per_s, tpot_s, achieved_flops_per_s, mfu_datasheet, "
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
    assert result.exit_code == 1 and "pip install 'nvidia-ml-py>=12' 'torch>=2.5'" in result.output


@pytest.mark.parametrize("args, message", [
    (["--gen-len", "1"], "at least 2"),
    (["--dtype", "fp8"], "unknown profile dtype"),
    (["--layers", "0"], "must be positive"),
    (["--repeats", "0"], "--repeats"),
    (["--dtype", "bf16,,fp16"], "invalid --dtype 'bf16,,fp16': empty item"),  # it read "invalid list"
    (["--attn-backend", ""], "invalid --attn-backend '': empty"),
])
def test_bad_profile_options(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["profile", *TINY, *args])
    assert result.exit_code == 2 and message in result.output


def test_ctrl_c_keeps_rows_measured_so_far(tmp_path: Path, monkeypatch) -> None:
    real, calls = profiler.measure, []

    def interrupted_on_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(profiler, "measure", interrupted_on_second)
    out = tmp_path / "rows.json"
    result = runner.invoke(app, ["profile", *TINY, "--batch", "1,2,3", "-o", str(out)])
    assert result.exit_code == 130 and "interrupted: kept 1 row measured before Ctrl-C" in result.output
    rows = json.loads(out.read_text())
    assert [r["batch"] for r in rows] == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]  # no temporary file left behind


def test_measured_efficiencies_feed_estimate(tmp_path: Path) -> None:
    """A profile's saved efficiencies give estimate what the same figures given as flags give. Its prompt is 128
    tokens: TINY's 8 measure an MFU near 0.001 on an idle 2-core machine, under the flags' floor when it is loaded."""
    rows_file, calib = tmp_path / "rows.json", tmp_path / "calib.json"
    longer = [*MODEL, "--prompt-len", "128", "--gen-len", "3", "--repeats", "1"]
    result = runner.invoke(app, ["profile", *longer, "-o", str(rows_file), "--save-calibration", str(calib)])
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


# --- usage errors are found before anything is measured ---------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--attn-backend", "bogus"], "unknown attention backend 'bogus'"),
    (["--vocab", "1"], "--vocab 1"),
    (["--layers", "17"], "--layers 17: llama3.2-1b has 16 layers"),
    (["--experts", "4"], "--experts 4: llama3.2-1b has no experts"),
    (["--gpu", "0"], "--gpu 0 names a GPU but --device cpu"),
    (["--decode-attention", "paged"], "unknown --decode-attention 'paged'"),
    (["--weights-dtype", "int4"], "unknown --weights-dtype 'int4'"),
    (["--context", "auto"], "--context sweeps the prompt length"),  # TINY has --prompt-len
    (["--plot", "chart.svg"], "--plot writes PNG"),
    (["-o", "rows.xlsx"], "cannot tell the format"),
])
def test_usage_errors_exit_2_before_measuring(args: list[str], message: str, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(profiler, "device_context", lambda *a, **k: pytest.fail("measured before the usage check"))
    result = runner.invoke(app, ["profile", *TINY, *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("option", ["--save-calibration", "--output", "--plot"])
def test_missing_output_folder_fails_before_measuring(option: str, monkeypatch, tmp_path: Path) -> None:
    """A folder that does not exist is a runtime failure (exit 1, as for every command's --output), found by
    check_before_work before anything is measured."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(profiler, "device_context", lambda *a, **k: pytest.fail("measured before the output check"))
    result = runner.invoke(app, ["profile", *TINY, option, "missing/out.png" if option == "--plot" else
                                 "missing/out.json"])
    assert result.exit_code == 1, result.output
    assert "folder missing does not exist" in result.output and "Traceback" not in result.output


def test_two_models_are_both_profiled(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    result = runner.invoke(app, ["profile", *TINY, "-p", "qwen2.5-7b", "-o", str(out)])  # -p given twice: a, b
    assert result.exit_code == 0, result.output
    assert [r["model"] for r in json.loads(out.read_text())] == ["llama3.2-1b", "qwen2.5-7b"]


# --- rows are kept whatever happens --------------------------------------------------------------------------------


@pytest.mark.parametrize("message", [
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to allocate 4 GB",
    "DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes. Error code 12",
])
def test_cpu_out_of_memory_is_an_oom_row_and_the_sweep_goes_on(message: str, tmp_path: Path, monkeypatch) -> None:
    real = profiler.measure

    def cpu_oom_at_batch_2(model, batch, *args, **kwargs):
        if batch == 2:
            raise RuntimeError(message)
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(profiler, "measure", cpu_oom_at_batch_2)
    out = tmp_path / "rows.json"
    result = runner.invoke(app, ["profile", *TINY, "--batch", "1,2,3", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["status"] for r in rows] == ["ok", "oom", "ok"]
    assert rows[0]["tpot_s"] > 0 and rows[1]["tpot_s"] is None and rows[1]["predicted_tpot_s"] > 0


def test_out_of_memory_while_building_marks_every_row_of_that_dtype(tmp_path: Path, monkeypatch) -> None:
    real = profiler.build_model

    def oom_in_fp32(spec, **kwargs):
        if kwargs["dtype"].itemsize == 4:
            raise MemoryError()
        return real(spec, **kwargs)

    monkeypatch.setattr(profiler, "build_model", oom_in_fp32)
    result = runner.invoke(app, ["profile", *TINY, "--dtype", "fp32,bf16", "--batch", "1,2", "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["dtype"], r["status"]) for r in rows] == [("fp32", "oom"), ("fp32", "oom"), ("bf16", "ok"),
                                                           ("bf16", "ok")]


def test_interrupt_before_the_first_row_leaves_an_existing_file_alone(tmp_path: Path, monkeypatch) -> None:
    """A second Ctrl-C (or SIGTERM) during the first row: nothing measured, the previous file kept as it was."""
    out = tmp_path / "rows.json"
    out.write_text('[{"previous": "run"}]\n')
    monkeypatch.setattr(profiler, "measure", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    result = runner.invoke(app, ["profile", *TINY, "-o", str(out), "--save-calibration", str(tmp_path / "c.json")])
    assert result.exit_code == 130
    assert f"kept {out} as it was" in result.output and "interrupted: kept 0 rows" in result.output
    assert out.read_text() == '[{"previous": "run"}]\n' and not (tmp_path / "c.json").exists()


def _profile_process(out: Path, batches: int) -> subprocess.Popen:
    args = [sys.executable, "-m", "tfcalc", "profile", *MODEL, "--prompt-len", "8", "--repeats", "2", "--gen-len", "6",
            "--dtype", "fp32",  # the fp32 matmul ceiling is measured in well under a second, bf16 not on every CPU
            "--batch", ",".join(str(b) for b in range(1, batches + 1)), "-o", str(out)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _rows_in(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []


@pytest.mark.parametrize("signum, code, reason", [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_signal_mid_sweep_keeps_the_rows_so_far(signum: int, code: int, reason: str, tmp_path: Path) -> None:
    """A real `tfcalc profile --device cpu` process: once its output file holds a row (it is rewritten after
    every row), SIGINT lets the current row finish and stops; SIGTERM stops at once. Either way the file keeps
    every row measured and the exit code is 128 + the signal."""
    out = tmp_path / "rows.json"
    process = _profile_process(out, batches=40)
    deadline = time.monotonic() + 120
    while not _rows_in(out) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "the sweep ended before the signal"
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    rows = _rows_in(out)
    assert process.returncode == code, stderr
    assert 1 <= len(rows) < 40 and all(r["status"] == "ok" for r in rows)
    kept = f"kept {len(rows)} row{'' if len(rows) == 1 else 's'} measured before {reason}"
    assert f"{'terminated' if reason == 'SIGTERM' else 'interrupted'}: {kept}" in stderr
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]


def test_sigterm_before_the_first_row_keeps_the_previous_file(tmp_path: Path) -> None:
    """SIGTERM while the process measures the device's ceilings (before any row): exit 143, file untouched."""
    out = tmp_path / "rows.json"
    out.write_text('[{"previous": "run"}]\n')
    process = _profile_process(out, batches=3)
    assert process.stderr is not None
    assert process.stderr.readline().startswith("profiling llama3.2-1b: 3 points")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert out.read_text() == '[{"previous": "run"}]\n' and "terminated: kept 0 rows" in stderr


# --- what the rows say ----------------------------------------------------------------------------------------------


def test_decode_bytes_follow_the_live_length_and_the_static_cache_reads_it_all() -> None:
    result = runner.invoke(app, ["profile", *MODEL, "--prompt-len", "8,64", "--gen-len", "5", "--dtype", "fp32",
                                 "--repeats", "1", "-f", "json"])
    assert result.exit_code == 0, result.output
    short, long_ = json.loads(result.stdout)
    assert (short["decode_attention"], short["decode_context_mean"], long_["decode_context_mean"]) == ("live", 10.5,
                                                                                                      66.5)
    # one layer of 8 KV heads x 64 dims, K and V, fp32: 4096 bytes a token; 56 more tokens on average
    assert long_["kv_bytes_read_per_step"] - short["kv_bytes_read_per_step"] == 56 * 4096
    assert long_["decode_bytes_per_step"] - short["decode_bytes_per_step"] == 56 * 4096
    static = json.loads(runner.invoke(app, ["profile", *MODEL, "--prompt-len", "8", "--gen-len", "5", "--dtype", "fp32",
                                            "--repeats", "1", "--decode-attention", "static", "-f", "json"]).stdout)[0]
    assert static["decode_attention"] == "static" and static["kv_bytes_read_per_step"] == 13 * 4096


def test_fp8_weights_rows_say_how_the_gemm_ran_and_count_fp8_bytes() -> None:
    result = runner.invoke(app, ["profile", *TINY, "--weights-dtype", "fp8,fp8_block", "--dtype", "bf16",
                                 "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    plain = json.loads(runner.invoke(app, ["profile", *TINY, "-f", "json"]).stdout)[0]
    assert [r["weights_dtype"] for r in rows] == ["fp8_e4m3", "fp8_block"]
    assert [r["fp8_gemm"] for r in rows] == ["dequantized", "dequantized"]  # the CPU dequantizes, and says so
    for r in rows:
        assert r["status"] == "ok" and r["decode_bytes_per_step"] < plain["decode_bytes_per_step"]
        assert r["predicted_memory_bytes"] < plain["predicted_memory_bytes"]


def test_deepseek_v3_two_layers_keep_one_dense_and_one_moe_layer() -> None:
    result = runner.invoke(app, ["profile", "--device", "cpu", "-p", "deepseek-v3", "--layers", "2", "--hidden", "64",
                                 "--intermediate", "128", "--vocab", "256", "--experts", "8", "--prompt-len", "8",
                                 "--gen-len", "3", "--warmup", "0", "--repeats", "1", "--dtype", "fp32",
                                 "-f", "json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)[0]
    assert row["status"] == "ok" and (row["layers_run"], row["layers_total"]) == (2, 2)
    assert row["layer_pattern"] == "dense 1 of 3, moe 1 of 58 (layers 1, 32 of 61)"
    assert row["distinct_experts_per_moe_layer"] > 0


def test_context_sweep_and_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "tpot.png"
    result = runner.invoke(app, ["profile", *MODEL, "--gen-len", "3", "--repeats", "1", "--context", "16,64",
                                 "--plot", str(plot), "-f", "json"])
    assert result.exit_code == 0, result.output
    assert [r["prompt_len"] for r in json.loads(result.stdout)] == [16, 64]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- output through the shared mechanisms -------------------------------------------------------------------------


def test_a_stream_output_is_written_once_not_per_row() -> None:
    """The per-row checkpoint is for regular files only: `-o -` (or a FIFO, a device) gets the rows once."""
    result = runner.invoke(app, ["profile", *TINY, "--batch", "1,2", "-f", "json", "-o", "-"])
    assert result.exit_code == 0, result.output
    assert [r["batch"] for r in json.loads(result.stdout)] == [1, 2]


def test_progress_labels_from_a_file_are_text_on_a_terminal(monkeypatch) -> None:
    """A model named '[/]' (Rich's closing tag) with an escape sequence: the bar shows it as text, no crash, no
    escape sequence reaches the terminal."""
    import io

    import rich.console

    from tfcalc.cli import profile as profile_cli
    from tfcalc.spec.presets import load_model

    screen = io.StringIO()
    real_console = rich.console.Console
    monkeypatch.setattr(rich.console, "Console", lambda **kw: real_console(file=screen, force_terminal=True,
                                                                           width=200))
    name = "[/]\x1b]0;owned\x07[bold]x"
    spec = load_model("llama3.2-1b").with_overrides(name=name)
    sweep = profiler.Sweep(spec=spec, layers_total=16, layers_explicit=True, batches=[1], prompt_lens=[8],
                        gen_lens=[2], dtypes=["fp32"], backends=["auto"], compile_decode=False)
    stop = profiler.StopRequested()

    def fake_run_sweep(sweep, devices, on_row, stop, advance, on_build):  # noqa: ANN001, ANN202
        stop.requested = True  # the notice column renders too
        on_build(f"{sweep.spec.name} fp32: building the model (1.00 MiB of random weights on cpu)")
        advance(f"{sweep.spec.name} fp32 auto batch 1 prompt 8")
        return False

    assert profile_cli._with_bar(sweep, [torch.device("cpu")], print, stop, 1, fake_run_sweep) is False
    shown = screen.getvalue()
    assert "profiling [/][bold]x" in shown and "owned" not in shown and "\x1b]0" not in shown


def test_without_a_terminal_each_build_is_a_line_before_its_rows() -> None:
    """Random weights take minutes on a CPU for a model of tens of GB: a CI log says what is being built, and how
    big, before the rows of that model."""
    result = runner.invoke(app, ["profile", *MODEL, "--prompt-len", "8", "--gen-len", "2", "--dtype", "fp32,bf16",
                                 "--repeats", "1", "--warmup", "0", "-f", "json"])
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stderr.splitlines()]
    builds = [i for i, line in enumerate(lines) if ": building the model (" in line]
    assert [lines[i].split(":")[0] for i in builds] == ["llama3.2-1b fp32", "llama3.2-1b bf16"]
    assert all("of random weights on cpu)" in lines[i] for i in builds)
    assert lines[builds[0] + 1].startswith("1/2 llama3.2-1b fp32") and lines[builds[1] + 1].startswith("2/2")
