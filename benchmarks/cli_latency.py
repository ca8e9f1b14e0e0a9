"""Median wall time of `tfcalc kv-cache --preset llama3-70b` beside the floor of our CLI stack.

The floor is `python -c "import typer, rich.console, rich.table, yaml"`: what any Typer + Rich + PyYAML
program pays before doing anything. Target: tfcalc within 1.3x of the floor.

Usage: python benchmarks/cli_latency.py [--runs 21]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def median_seconds(command: list[str], runs: int) -> tuple[float, float]:
    subprocess.run(command, capture_output=True, check=True)  # warm the file cache and .pyc files
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), statistics.quantiles(samples, n=4)[2] - statistics.quantiles(samples, n=4)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    runs = parser.parse_args().runs
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
