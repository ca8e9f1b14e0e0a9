"""The calculator sweeps (kv-cache, memory, plan, estimate) keep the rows made before Ctrl-C or SIGTERM: written as
a complete run writes them, one line saying how far the sweep got, exit 130 / 143 (tfcalc.cli.common.run_sweep)."""

from __future__ import annotations

import csv
import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcalc.cli import app
from tfcalc.errors import Terminated

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]

# (command line of a 12-row sweep, the report module and the function each row calls once, in the row's loop)
SWEEPS = {
    "kv-cache": (["kv-cache", "-p", "llama3-8b,qwen3-8b", "--context", "1k,4k,8k", "--batch", "1,8"],
                 "tfcalc.report.kv_cache", "kv_cache_bytes"),
    "memory": (["memory", "-p", "llama3-8b", "-w", "bf16,fp8", "--context", "1k,4k,8k", "--batch", "1,8"],
               "tfcalc.report.memory", "activation_workspace_bytes"),
    "plan": (["plan", "-p", "llama3-8b", "--gpu", "h100-sxm,a100-80gb", "--context", "1k,4k,8k", "--batch", "1,8"],
             "tfcalc.report.plan", "_plan_row"),
    "estimate": (["estimate", "-p", "llama3-8b", "--tp", "1,2", "--batch", "1,8", "--prompt-len", "1k,2k,4k"],
                 "tfcalc.report.estimate", "estimate_latency"),
}
TOTAL = 12


def interrupt_after(monkeypatch: pytest.MonkeyPatch, module: str, function: str, rows: int,
                    signal_error: type[KeyboardInterrupt]) -> None:
    """The row function raises ``signal_error`` (as the signal handlers do) on its call ``rows + 1``: mid-sweep."""
    import importlib

    target = importlib.import_module(module)
    original = getattr(target, function)
    calls = [0]

    def wrapped(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        if calls[0] > rows:
            raise signal_error()
        return original(*args, **kwargs)

    monkeypatch.setattr(target, function, wrapped)


def parse(text: str, fmt: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text))) if fmt == "csv" else json.loads(text)


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize(("signal_error", "code", "reason"), [(KeyboardInterrupt, 130, "Ctrl-C"),
                                                              (Terminated, 143, "SIGTERM")])
@pytest.mark.parametrize("command", list(SWEEPS))
def test_an_interrupted_sweep_writes_the_rows_made(monkeypatch, command: str, signal_error, code: int, reason: str,
                                                   fmt: str) -> None:
    """Stopped at row 6 of 12: stdout holds exactly the complete run's first 5 rows, with the same columns."""
    args, module, function = SWEEPS[command]
    complete = runner.invoke(app, [*args, "-f", fmt])
    assert complete.exit_code == 0, complete.output
    full = parse(complete.stdout, fmt)
    assert len(full) == TOTAL
    interrupt_after(monkeypatch, module, function, 5, signal_error)
    result = runner.invoke(app, [*args, "-f", fmt])
    assert result.exit_code == code, result.output
    kept = parse(result.stdout, fmt)
    assert kept == full[:5]
    assert (list(csv.reader(io.StringIO(result.stdout)))[0] == list(csv.reader(io.StringIO(complete.stdout)))[0]
            if fmt == "csv" else list(kept[0]) == list(full[0]))
    assert result.stderr.strip().splitlines() == [
        f"error: {'terminated' if code == 143 else 'interrupted'}: kept the 5 of {TOTAL} rows computed before {reason}"]


@pytest.mark.parametrize("command", list(SWEEPS))
def test_an_interrupted_sweep_replaces_the_output_file_with_its_rows_and_a_table_shows_them(
        monkeypatch, tmp_path: Path, command: str) -> None:
    args, module, function = SWEEPS[command]
    out = tmp_path / "rows.csv"
    out.write_text("old\n")
    interrupt_after(monkeypatch, module, function, 3, Terminated)
    result = runner.invoke(app, [*args, "-o", str(out)])
    assert result.exit_code == 143, result.output
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 3 and "model" in rows[0]
    assert result.stderr.splitlines()[-2:] == [f"wrote 3 rows to {out}", f"error: terminated: kept the 3 of {TOTAL} "
                                               "rows computed before SIGTERM"]
    assert [p.name for p in tmp_path.iterdir()] == ["rows.csv"]  # no temporary file left
    monkeypatch.undo()
    interrupt_after(monkeypatch, module, function, 3, KeyboardInterrupt)
    table = runner.invoke(app, args)  # a table of the kept rows, its notes included
    assert table.exit_code == 130 and table.stdout.count("llama3-8b") >= 3


@pytest.mark.parametrize("command", list(SWEEPS))
def test_a_sweep_stopped_before_its_first_row_writes_nothing(monkeypatch, tmp_path: Path, command: str) -> None:
    """No row: an existing --output stays as it was (a run with nothing to say replaces nothing)."""
    args, module, function = SWEEPS[command]
    out = tmp_path / "rows.csv"
    out.write_text("old\n")
    interrupt_after(monkeypatch, module, function, 0, KeyboardInterrupt)
    result = runner.invoke(app, [*args, "-o", str(out)])
    assert result.exit_code == 130
    assert out.read_text() == "old\n"
    assert result.stderr.strip() == f"error: interrupted: no row of {TOTAL} computed before Ctrl-C; nothing written"


def test_plan_explain_and_verdict_follow_the_kept_rows(monkeypatch) -> None:
    """--explain traces the kept rows only; the interruption, not a verdict on them, ends the run."""
    args, module, function = SWEEPS["plan"]
    interrupt_after(monkeypatch, module, function, 2, KeyboardInterrupt)
    result = runner.invoke(app, [*args, "--explain"])
    assert result.exit_code == 130
    assert result.stdout.count("\n# model=") == 2


def test_progress_waits_a_second_then_shows_a_bar_on_a_terminal(monkeypatch) -> None:
    """run_sweep's progress: nothing on a terminal for the first second, then the bar, at most every 0.1 s; without
    a terminal a plain line every 10 s."""
    import tfcalc.output.progress as progress
    from tfcalc.cli.common import run_sweep

    clock = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    drawn: list[tuple[str, int]] = []
    monkeypatch.setattr(progress.Progress, "_bar", lambda self, message, done: drawn.append((message, done)))
    lines: list[str] = []
    monkeypatch.setattr("tfcalc.output.print_stderr", lines.append)

    def rows():  # noqa: ANN202 - each row takes 0.3 s of the fake clock
        for i in range(10):
            clock[0] += 0.3
            yield i

    for terminal in (True, False):
        clock[0] = 0.0
        monkeypatch.setattr(progress, "stderr_is_terminal", lambda terminal=terminal: terminal)
        assert run_sweep(rows(), 10, "plan").items == list(range(10))
    assert drawn[0] == ("plan: row 4 of 10", 4) and [d for _, d in drawn] == list(range(4, 11))  # from 1.2 s on
    assert lines == []  # 3 s in all: no plain line yet
    clock[0] = 0.0
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: False)
    slow = progress.Progress(100)
    for done in range(1, 31):
        clock[0] += 1.0
        slow.say(f"row {done}", done)
    assert lines == ["row 10, 10.0 s", "row 20, 20.0 s", "row 30, 30.0 s"]


def _signal_a_real_sweep(tmp_path: Path, signum: int) -> tuple[int, str, Path]:
    """A 30,000-row plan sweep in a real tfcalc process with stderr on a pseudo-terminal: once its progress bar
    shows (the sweep has run a second), send ``signum``; the exit code, what the terminal got, the output file."""
    import pty

    out = tmp_path / "plan.csv"
    batches = ",".join(str(b) for b in range(1, 301))
    contexts = ",".join(str(1024 * c) for c in range(1, 101))
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120"}
    proc = subprocess.Popen([sys.executable, "-m", "tfcalc", "plan", "-p", "llama3-8b", "--batch", batches,
                             "--context", contexts, "-o", str(out)], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=slave, env=env)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    signalled = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the process closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            if not signalled and b"row" in seen:
                proc.send_signal(signum)
                signalled = True
            if proc.poll() is not None and not ready:
                break
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert signalled, seen
    return code, seen.decode("utf-8", "replace"), out


@pytest.mark.parametrize(("signum", "code", "reason"), [(signal.SIGINT, 130, "Ctrl-C"),
                                                        (signal.SIGTERM, 143, "SIGTERM")])
def test_a_real_process_keeps_its_rows_on_a_signal(tmp_path: Path, signum: int, code: int, reason: str) -> None:
    exit_code, terminal, out = _signal_a_real_sweep(tmp_path, signum)
    assert exit_code == code, terminal
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert 0 < len(rows) < 30_000
    header = runner.invoke(app, ["plan", "-p", "llama3-8b", "-f", "csv"]).stdout.splitlines()[0]
    assert out.read_text().splitlines()[0] == header
    assert f"kept the {len(rows):,} of 30,000 rows computed before {reason}" in terminal
