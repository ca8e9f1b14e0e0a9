"""`tfcalc profile --tp / --ep` on 2 CPU ranks (gloo): what the rows say, torchrun, usage errors before any rank
starts, and the faults: a killed rank, Ctrl-C and a killed command each end every rank within a bounded time,
keep the rows measured so far, and leave no process behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcalc.cli import app

runner = CliRunner()
MODEL = ["--device", "cpu", "-p", "llama3.2-1b", "--layers", "2", "--hidden", "64", "--intermediate", "128",
         "--vocab", "512", "--dtype", "fp32", "--warmup", "0"]
POINT = ["--prompt-len", "8", "--gen-len", "4", "--repeats", "2"]
TP2 = [*MODEL, "--tp", "2", *POINT]
BOUND_S = 60  # every ending below comes well within this on a loaded 2-core machine


def test_tp2_rows_say_how_they_ran_and_time_their_collectives() -> None:
    result = runner.invoke(app, ["profile", *TP2, "--batch", "1,2", "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["batch"] for r in rows] == [1, 2]
    from tfcalc.output.columns import REGISTRY

    assert all(key in REGISTRY for row in rows for key in row)
    for r in rows:
        assert r["status"] == "ok" and (r["world_size"], r["tp"], r["ep"], r["dp"]) == (2, 2, 1, 1)
        assert r["dist_backend"] == "gloo" and "tp 2, ep 1" in r["prediction_basis"]
        # 2 layers: an all-reduce after attention and after the FFN, the embedding's, the logits' gather
        assert r["collectives_per_prefill"] == 6 and r["collectives_per_decode_step"] == 6
        assert 0 < r["prefill_comm_s"] <= r["prefill_comm_s_max"] < r["ttft_s"]
        assert 0 < r["decode_comm_s"] <= r["decode_comm_s_max"] < r["tpot_s"]
        assert r["decode_comm_fraction"] == pytest.approx(r["decode_comm_s"] / r["tpot_s"])
        assert r["predicted_prefill_comm_s"] > 0 and r["predicted_decode_comm_s"] > 0
    single = json.loads(runner.invoke(app, ["profile", *MODEL, *POINT, "--batch", "1", "-f", "json"]).stdout)[0]
    assert single["world_size"] == 1 and single["prefill_comm_s"] is None
    # one rank's share: less memory and fewer bytes per step than the whole model on one device
    assert rows[0]["predicted_memory_bytes"] < single["predicted_memory_bytes"]
    assert rows[0]["decode_bytes_per_step"] < single["decode_bytes_per_step"]
    from tfcalc.cli.profile import _columns

    sharded = {c.key for c in _columns(rows)} - {c.key for c in _columns([single])}
    assert sharded == {"tp", "ep", "decode_comm_s", "predicted_decode_comm_s"}  # in the table only when sharded


def test_tp2_fp8_rows_count_a_rank_s_fp8_bytes_and_say_how_the_gemm_ran() -> None:
    """FP8 weights sharded over 2 ranks (each keeps its slice and the scales): ok rows, the GEMM dequantized on the
    CPU, and the bytes and memory predicted for one rank's FP8 shard: less than the one-device FP8 model's."""
    result = runner.invoke(app, ["profile", *TP2, "--batch", "1", "--weights-dtype", "fp8", "-f", "json"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    assert row["status"] == "ok" and row["tp"] == 2 and row["fp8_gemm"] == "dequantized"
    assert row["weights_dtype"] == "fp8_e4m3" and "tp 2, ep 1" in row["prediction_basis"]
    single = json.loads(runner.invoke(app, ["profile", *MODEL, *POINT, "--batch", "1", "--weights-dtype", "fp8",
                                            "-f", "json"]).stdout)[0]
    assert row["decode_bytes_per_step"] < single["decode_bytes_per_step"]
    assert row["predicted_memory_bytes"] < single["predicted_memory_bytes"]


@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "tp 3 does not divide the 32 attention heads"),
    (["--ep", "2"], "ep 2 given but llama3.2-1b has no experts"),
    (["--tp", "2", "--weights-dtype", "fp8_block"], "fp8_block: ffn.w_in would keep rows 0..64 (64 wide) of 256"),
    (["--experts", "4", "--tp", "1", "--ep", "2", "--batch", "3"],
     "--batch 3 does not split over the 2 attention replicas"),
    (["--tp", "0"], "--tp and --ep must be at least 1"),
])
def test_sharding_usage_errors_before_any_rank_starts(args: list[str], message: str, monkeypatch) -> None:
    from tfcalc.profile import distributed

    monkeypatch.setattr(distributed, "launch", lambda *a, **k: pytest.fail("a rank started before the check"))
    model = [("mixtral-8x7b" if "--experts" in args and a == "llama3.2-1b" else a) for a in MODEL]
    result = runner.invoke(app, ["profile", *model, *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_torchrun_world_must_match(monkeypatch) -> None:
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29999")):
        monkeypatch.setenv(name, value)
    result = runner.invoke(app, ["profile", *TP2])
    assert result.exit_code == 2 and "torchrun started 4 ranks but --tp 2 --ep 1 needs 2" in result.output


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun is not installed beside this Python")
def test_under_torchrun_rank_0_writes_the_rows_of_expert_parallel_replicas(tmp_path: Path) -> None:
    """torchrun starts the ranks (env://); tp 1 x ep 2 is two attention replicas whose MoE tokens travel by
    all-to-all: 3 collectives per MoE layer (counts, tokens, results) and one row, written by rank 0 alone."""
    out = tmp_path / "rows.json"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    args = [torchrun, "--nproc-per-node", "2", "--master-port", str(29400 + os.getpid() % 500), "-m", "tfcalc",
            "profile", "--device", "cpu", "-p", "mixtral-8x7b", "--layers", "2", "--hidden", "64",
            "--intermediate", "128", "--vocab", "512", "--experts", "4", "--tp", "1", "--ep", "2", "--batch", "2",
            "--prompt-len", "8", "--gen-len", "4", "--repeats", "2", "--warmup", "0", "--dtype", "fp32",
            "-o", str(out)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=BOUND_S * 2)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(out.read_text())
    assert (row["world_size"], row["tp"], row["ep"], row["dp"], row["batch"]) == (2, 1, 2, 2, 2)
    assert row["collectives_per_decode_step"] == 3 * 2 and row["decode_comm_s"] > 0
    assert row["distinct_experts_per_moe_layer"] > 0 and row["predicted_decode_comm_s"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]
    assert done.stderr.count("profiling mixtral-8x7b") == 1  # rank 1 says nothing


# --- faults, on real processes ------------------------------------------------------------------------------------


def _parents() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                    out[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def _descendants(pid: int) -> set[int]:
    parents, found, frontier = _parents(), set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _gone(pids: set[int], within_s: float = 15) -> set[int]:
    deadline = time.monotonic() + within_s
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                alive.discard(pid)
        time.sleep(0.1)
    return alive


def _start(out: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "tfcalc", "profile", *TP2, "--batch", ",".join(map(str, range(1, 41))),
            "-o", str(out)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as a terminal's foreground job


def _rows(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def _running_with_ranks(process: subprocess.Popen, out: Path) -> set[int]:
    """Wait for the first row on file; the command's processes then (fork server, tracker, 2 ranks)."""
    deadline = time.monotonic() + BOUND_S * 2
    while not _rows(out) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "the sweep ended before the fault"
    family = _descendants(process.pid)
    assert len(family) >= 3, family
    return family


def _ranks(family: set[int]) -> list[int]:
    ranks = []
    for pid in family:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"forkserver" in cmdline.read() and _parents().get(pid) in family:
                    ranks.append(pid)
        except OSError:
            continue
    return sorted(ranks)


def test_a_killed_rank_ends_the_run_with_one_line_naming_it_and_keeps_the_rows(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    process = _start(out)
    family = _running_with_ranks(process, out)
    ranks = _ranks(family)
    assert len(ranks) == 2, family
    os.kill(ranks[1], signal.SIGKILL)
    start = time.monotonic()
    _, stderr = process.communicate(timeout=BOUND_S)
    assert time.monotonic() - start < BOUND_S
    assert process.returncode == 1, stderr
    [error] = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert "was killed by SIGKILL; stopped the other 1 rank (kept" in error and error.startswith("error: rank ")
    rows = _rows(out)
    assert 1 <= len(rows) < 40 and all(r["status"] == "ok" for r in rows)
    assert not _gone(family), "a process outlived the command"


def test_ctrl_c_stops_every_rank_and_keeps_the_rows(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    process = _start(out)
    family = _running_with_ranks(process, out)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal sends the foreground job: every process gets it
    _, stderr = process.communicate(timeout=BOUND_S)
    assert process.returncode == 130, stderr
    rows = _rows(out)
    assert 1 <= len(rows) < 40 and f"interrupted: kept {len(rows)} row" in stderr
    assert not _gone(family) and [p.name for p in tmp_path.iterdir()] == ["rows.json"]


def test_a_killed_command_leaves_no_rank_behind(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    process = _start(out)
    family = _running_with_ranks(process, out)
    process.kill()  # SIGKILL: no handler runs; the ranks see their fork server go and exit
    process.wait(timeout=BOUND_S)
    assert not _gone(family), "a rank outlived the killed command"
    assert _rows(out)  # the rows checkpointed before stay
