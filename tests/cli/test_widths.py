"""Every command's default table at 80 and 120 columns: no cell cut, no number split across lines, no line wider
than the terminal; and the width comes from a real terminal (a pseudo-terminal of 80 columns, no $COLUMNS)."""

from __future__ import annotations

import functools
import json
import os
import sys

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from tfcalc.cli import app
from tfcalc.output.columns import format_cell
from tfcalc.output.table import select_columns

runner = CliRunner()
TINY_PROFILE = ["--device", "cpu", "-p", "llama3.2-1b", "--layers", "1", "--hidden", "64", "--intermediate", "128",
                "--vocab", "256", "--prompt-len", "8", "--gen-len", "2", "--repeats", "1", "--warmup", "0"]


def _columns(command: list[str]) -> list:
    """The columns the command declares for its (first) table."""
    from tfcalc.cli import bench, capacity, estimate, kv_cache, memory, params, plan, presets, profile

    name = command[0]
    if name == "capacity":  # a column per latency target
        targets = [t for flag in ("ttft", "tpot", "itl", "e2e") if f"--{flag}" in command
                   for t in capacity.parse_targets([command[command.index(f"--{flag}") + 1]], flag)]
        return capacity.summary_columns(targets)
    if name == "presets":
        if command[1] == "show":
            return []  # field/value rows: checked by the generic line checks only
        kind = command[command.index("--kind") + 1] if "--kind" in command else "model"
        return presets.LIST_COLUMNS[kind]
    if name == "bench":
        return {"ceilings": bench.CEILING_COLUMNS, "attention": bench.ATTENTION_COLUMNS,
                "moe": bench.MOE_COLUMNS}[command[1]]
    modules = {"kv-cache": kv_cache, "memory": memory, "plan": plan, "estimate": estimate, "profile": profile}
    if name == "params":
        return params.SUMMARY_COLUMNS
    return modules[name].COLUMNS


def assert_nothing_cut(text: str, rows: list[dict], columns: list, width: int) -> None:
    lines = text.splitlines()
    assert "…" not in text
    too_wide = [line for line in lines if cell_len(line) > width]
    assert not too_wide, f"{len(too_wide)} lines wider than {width}: {too_wide[:2]}"
    for c in select_columns(rows, columns):
        for row in rows:
            cell = format_cell(row.get(c.key), c)
            if c.wraps:  # words may go to the next line, never lose a character
                assert all(any(word in line for line in lines) for word in cell.split()), (c.key, cell)
            else:  # a number or an identifier stays whole on one line
                assert any(cell in line for line in lines), (c.key, cell, text)


COMMANDS = [
    ["kv-cache", "--preset", "llama3-70b"],
    ["kv-cache", "-p", "gemma2-27b,gpt-oss-120b,deepseek-v3", "--context", "8k,128k"],
    ["kv-cache", "-p", "llama3-70b", "--compare-attention", "--context", "128k", "--kv-dtype", "bf16,fp8"],
    ["params", "-p", "mixtral-8x7b,deepseek-v3"],
    ["memory", "-p", "gpt-oss-120b", "--context", "128k"],
    ["memory", "-p", "llama3-70b", "-w", "bf16,fp8,int4", "--kv-dtype", "fp8", "--context", "32k", "--batch", "8,16"],
    ["plan", "--preset", "llama3-70b", "--gpu", "h100-sxm", "--num-gpus", "4"],
    ["plan", "-p", "llama3-70b", "--max-model-len", "128k", "-tp", "4", "--engine", "vllm,sglang,trtllm,ideal"],
    ["plan", "-p", "llama3-70b,qwen2.5-72b", "-n", "2,4,8", "-w", "bf16,fp8", "--gpu", "h100-sxm,h200"],
    ["estimate", "--preset", "llama3-8b"],
    ["estimate", "-p", "llama3-8b,llama3-70b", "--gpu", "h100-sxm,h200", "--batch", "1,64", "--tp", "8"],
    ["estimate", "-p", "mixtral-8x7b", "--engine", "vllm,sglang", "--batch", "1,16", "--ep", "1,2", "--tp", "2"],
    ["presets", "list"],
    ["presets", "list", "--kind", "gpu"],
    ["presets", "list", "--kind", "engine"],
    ["presets", "list", "--kind", "interconnect"],
    ["presets", "show", "deepseek-v3"],
    ["presets", "show", "h100-sxm"],
    ["presets", "show", "vllm-0.21"],
    ["presets", "show", "nvlink4"],
    ["capacity", "-p", "llama3-70b", "--rate", "2", "--input-len", "1024", "--output-len", "256", "--ttft", "p90=1s",
     "--tpot", "p90=50ms", "--no-simulate"],
    ["capacity", "-p", "llama3-8b,mixtral-8x7b", "--gpu", "h100-sxm,l40s", "--engine", "vllm,sglang", "--rate", "4",
     "--ttft", "p90=1s", "--itl", "p99=100ms", "--e2e", "mean=20s", "--max-num-seqs", "64", "--no-simulate"],
]
TORCH_COMMANDS = [
    ["profile", *TINY_PROFILE, "--batch", "1,2"],
    ["bench", "ceilings", "--device", "cpu", "--copy-size", "1m", "--matmul-size", "64", "--repeats", "2"],
    ["bench", "attention", "--device", "cpu", "--backend", "math,flash,cudnn", "--seq-len", "64", "--kv-heads", "8,2",
     "--repeats", "1", "--warmup", "0"],  # cudnn: an 'unavailable' row with its note
    ["bench", "moe", "--device", "cpu", "--tokens", "4,16", "--hidden", "64", "--experts", "4",
     "--experts-per-token", "2", "--expert-intermediate", "64", "--repeats", "1", "--warmup", "0"],
]


@functools.cache
def _json_rows(command: tuple[str, ...]) -> list[dict]:
    """The command's rows as JSON, run once for both widths (the calculator's answer does not depend on them)."""
    return json.loads(runner.invoke(app, [*command, "-f", "json"]).stdout)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
@pytest.mark.parametrize("width", [80, 120])
def test_calculator_tables_fit(command: list[str], width: int) -> None:
    table = runner.invoke(app, command, env={"COLUMNS": str(width)})
    assert table.exit_code == 0, table.output
    rows = _json_rows(tuple(command))
    if command[0] == "capacity":  # the first table lists the cheapest configurations; the frontier has its own
        rows = [row for row in rows if row["role"] != "frontier"]
    assert_nothing_cut(table.stdout, rows, _columns(command), width)


@pytest.mark.parametrize("command", TORCH_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_profiler_tables_fit(command: list[str], fixed_ceilings: None) -> None:
    """One run each (a second run would measure other numbers): its JSON rows, then the table the command draws
    (``render_table``) from those very rows at 80 and 120 columns."""
    from tfcalc.output.columns import REGISTRY
    from tfcalc.output.table import render_table

    result = runner.invoke(app, [*command, "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert all(key in REGISTRY for row in rows for key in row), sorted(k for r in rows for k in r if k not in REGISTRY)
    for width in (80, 120):
        assert_nothing_cut(render_table(rows, _columns(command), "title", width=width), rows, _columns(command), width)


def test_wide_and_columns_never_cut_either() -> None:
    from tfcalc.cli.common import parse_table_view
    from tfcalc.cli.estimate import COLUMNS

    command = ["estimate", "-p", "llama3-8b,mixtral-8x7b", "--batch", "1,8,64"]
    rows = json.loads(runner.invoke(app, [*command, "-f", "json"]).stdout)
    default = select_columns(rows, COLUMNS)
    for args in (["--wide"], ["--columns", "model,prompt_len,ttft_s,tpot_s,decode_tokens_per_s_per_seq"]):
        table = runner.invoke(app, [*command, *args], env={"COLUMNS": "80"})
        assert table.exit_code == 0, table.output
        shown = select_columns(rows, COLUMNS, parse_table_view("--wide" in args, args[1:] or None))
        assert_nothing_cut(table.stdout, rows, shown, 80)
        if "--wide" in args:
            assert len(shown) > 3 * len(default)
        else:
            assert [c.key for c in shown] == args[1].split(",")


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_real_terminal_width() -> None:
    """On a terminal of 80 columns (window size set on the pseudo-terminal, $COLUMNS unset), the table is fitted
    to 80 columns; through a pipe the same command draws its natural width."""
    import fcntl
    import pty
    import struct
    import subprocess
    import termios

    command = [sys.executable, "-m", "tfcalc", "estimate", "-p", "llama3-8b,llama3-70b", "--batch", "1,64"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        process = subprocess.Popen(command, stdout=follower, stderr=subprocess.DEVNULL, env=env)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=60) == 0
    finally:
        os.close(leader)
    text = b"".join(chunks).decode("utf-8").replace("\r\n", "\n")
    assert "…" not in text and max(cell_len(line) for line in text.splitlines()) <= 80
    assert "22.45 ms" in text or "ms" in text
    piped = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
    assert max(cell_len(line) for line in piped.splitlines()) > 80  # a pipe keeps the natural width



@pytest.mark.parametrize("command", [["--help"], ["bench", "--help"], ["presets", "--help"]])
def test_command_list_fills_each_line(command: list[str]) -> None:
    """A command's summary in a group's list wraps at the panel's width, not where its docstring's source line
    ended (Typer's rich list keeps those breaks: "KV tokens; max" once ended a line 30 columns short)."""
    from tfcalc.cli import COMMANDS, build_app

    lines = runner.invoke(build_app(COMMANDS), command).output.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("╭─ Commands")))
    rows = [line[2:-1] for line in lines[start + 1:] if line.startswith("│ ")]
    column = max(len(row) - len(row.lstrip()) for row in rows)  # where a continued summary starts
    assert column or command == ["presets", "--help"]  # only presets' summaries all fit on one line
    width = len(rows[0]) - column - 1  # a space of padding before the border
    for row, following in zip(rows, rows[1:], strict=False):
        if not column or following[:column].strip():  # the next row is the next command
            continue
        text, next_word = row[column:].rstrip(), following[column:].split()[0]
        assert len(text) + 1 + len(next_word) > width, (text, next_word)
