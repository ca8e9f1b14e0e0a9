"""Median wall time of `tfcalc kv-cache --preset llama3-70b` beside the floor of our CLI stack.

The floor is `python -c "import typer, rich.console, rich.table, yaml"`: what any Typer + Rich + PyYAML
program pays before doing anything. Target: tfcalc within 1.3x of the floor.

`--against DIR` compares this checkout with another source tree of tfcalc (e.g. `git worktree add /tmp/base
main`, or `git archive main | tar -x -C /tmp/base`): both run as `python -m tfcalc` with PYTHONPATH set to the
tree, one after the other in each round, so that a load that comes and goes on a shared machine hits both alike.

Usage: python benchmarks/cli_latency.py [--runs 21] [--against DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = [["kv-cache", "--preset", "llama3-70b"], ["kv-cache", "--preset", "llama3-70b", "--format", "json"],
            ["--help"]]


def median_seconds(command: list[str], runs: int) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # use .pyc files, as installs do
    subprocess.run(command, capture_output=True, check=True, env=env)  # warm the file cache and .pyc files
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True, env=env)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), statistics.quantiles(samples, n=4)[2] - statistics.quantiles(samples, n=4)[0]


def interleaved(trees: list[Path], args: list[str], runs: int) -> list[tuple[list[float], list[float]]]:
    """(wall times, CPU times: user + system) of ``python -m tfcalc ARGS`` per tree, the trees taking turns in every
    round. CPU time is the steadier of the two on a loaded machine (waiting for a core does not count)."""
    import resource

    # Each runs in its own tree: `python -m` puts the working directory first on sys.path, before PYTHONPATH. Bytecode
    # is written and used, as an installed tfcalc's is (PYTHONDONTWRITEBYTECODE would recompile every module per run).
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    environments = [{**base, "PYTHONPATH": str(tree)} for tree in trees]
    command = [sys.executable, "-m", "tfcalc", *args]
    for tree, env in zip(trees, environments, strict=True):  # warm the file cache and .pyc files
        subprocess.run(command, capture_output=True, check=True, env=env, cwd=tree)
    samples: list[tuple[list[float], list[float]]] = [([], []) for _ in trees]
    for _ in range(runs):
        for tree, env, (wall, cpu) in zip(trees, environments, samples, strict=True):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(command, capture_output=True, check=True, env=env, cwd=tree)
            wall.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return samples


def compare(against: Path, runs: int) -> None:
    here, against = Path(__file__).resolve().parents[1], against.resolve()
    print(f"{'command':45s} {'tree':>8s} {'wall ms':>8s} {'IQR':>6s} {'CPU ms':>8s} {'IQR':>6s}")
    for args in COMMANDS:
        for tree, (wall, cpu) in zip(("this", "against"), interleaved([here, against], args, runs), strict=True):
            qw, qc = statistics.quantiles(wall, n=4), statistics.quantiles(cpu, n=4)
            print(f"{'tfcalc ' + ' '.join(args):45s} {tree:>8s} {statistics.median(wall) * 1e3:8.1f} "
                  f"{(qw[2] - qw[0]) * 1e3:6.1f} {statistics.median(cpu) * 1e3:8.1f} {(qc[2] - qc[0]) * 1e3:6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--against", type=Path, help="another tfcalc source tree to compare with, interleaved")
    options = parser.parse_args()
    if options.against is not None:
        compare(options.against, options.runs)
        return
    runs = options.runs
    tfcalc = shutil.which("tfcalc") or sys.exit("tfcalc is not on PATH: pip install -e . first")
    cases = [
        ("floor: import typer, rich.console, rich.table, yaml",
         [sys.executable, "-c", "import typer, rich.console, rich.table, yaml"]),
        ("tfcalc kv-cache --preset llama3-70b", [tfcalc, "kv-cache", "--preset", "llama3-70b"]),
        ("tfcalc kv-cache --preset llama3-70b --format json",
         [tfcalc, "kv-cache", "--preset", "llama3-70b", "--format", "json"]),
        ("python -c 'import torch' (for scale)", [sys.executable, "-c", "import torch"]),
    ]
    results = []
    for label, command in cases:
        try:
            results.append((label, *median_seconds(command, runs)))
        except subprocess.CalledProcessError:
            results.append((label, float("nan"), float("nan")))
    floor = results[0][1]
    print(f"{'command':55s} {'median ms':>10s} {'IQR ms':>8s} {'x floor':>8s}")
    for label, median, iqr in results:
        print(f"{label:55s} {median * 1e3:10.1f} {iqr * 1e3:8.1f} {median / floor:8.2f}")
    print(f"target: kv-cache within 1.3x of the floor -> {'met' if results[1][1] <= 1.3 * floor else 'NOT met'}")


if __name__ == "__main__":
    main()
