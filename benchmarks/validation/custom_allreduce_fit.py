"""The ``custom_allreduce`` blocks of presets/interconnects/nvlink{3,4,5}.yaml, fitted to aiconfigurator's measured
custom all-reduce tables, and tfcalc's error on every row of them.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install aiconfigurator``;
its tables ship in the package, pandas and pyarrow read them) and run

    python benchmarks/validation/custom_allreduce_fit.py [--engine vllm] [--check]

Each table (aiconfigurator_core/systems/data/<gpu>/comm/<engine>/<version>/custom_allreduce_perf, the CUDA-graph
rows) times one all-reduce of ``message_size`` bf16 *elements* (collector/collect_all_reduce.py builds a
[tokens, 4096] tensor of that many), so a row's message is 2 x message_size bytes. The fit, per GPU:
- launch: the median time of messages up to 8 KiB;
- one-shot (the rows vLLM's rule sends there: 2 GPUs, or <= 4 GPUs below 512 KiB, or <= 8 below 256 KiB; 64 KiB
  and up): least squares through the origin of time - launch on (n - 1) x bytes -> its bandwidth;
- two-shot (the other rows below vLLM's 8 MiB limit): least squares of time - launch on 2 (n - 1) / n x bytes ->
  its latency (the intercept) and bandwidth.
Efficiencies are those bandwidths over the fabric's (presets/interconnects). Where the engine preset gives its own
two-shot kernel on a fabric (``kernels.custom_allreduce_two_shot``: vLLM's on the B200), the two-shot rows it covers
(below its ``below_kib``) fit that kernel's latency and latency per peer GPU instead: least squares of time -
launch - 2 (n - 1) / n x bytes / beta_2 (the fabric's) on (n - 1). ``--check`` prices every row below
8 MiB with the presets as they are (``tfcalc.calc.comm.custom_all_reduce``, the engine preset's rule and launch
cost) and prints
median and worst |tfcalc / measured - 1|, and the rows per GPU count.
"""

from __future__ import annotations

import argparse
import glob
import statistics
from pathlib import Path

KIB = 1024
MAX_BYTES = 8 * 1024 * KIB
TABLES = {"h100_sxm": ("h100-sxm", "nvlink4"), "h200_sxm": ("h200", "nvlink4"), "a100_sxm": ("a100-80gb", "nvlink3"),
          "b200_sxm": ("b200", "nvlink5")}


def _rows(gpu_dir: str, engine: str) -> tuple[str, list[tuple[int, float, float]]]:
    """(version, [(GPUs, bytes, seconds)]) of the newest table of ``engine`` on one GPU, CUDA-graph rows."""
    import aiconfigurator_core
    import pandas as pd

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / gpu_dir / "comm" / engine
    def version(path: str) -> list[int | str]:
        return [int(x) if x.isdigit() else x for x in Path(path).parent.name.replace("rc", ".").split(".")]

    files = sorted(glob.glob(str(root / "*" / "custom_allreduce_perf.parquet")), key=version)
    if not files:
        return "", []
    frame = pd.read_parquet(files[-1])
    column = next(c for c in ("backend", "implementation", "kernel_source") if c in frame)
    frame = frame[~frame[column].astype(str).str.contains("eager")]
    return Path(files[-1]).parent.name, [(int(r.num_gpus), 2.0 * r.message_size, r.latency * 1e-3)
                                         for r in frame.itertuples()]


def fit(rows: list[tuple[int, float, float]], one_shot) -> tuple[float, float, float, float]:
    """(launch s, one-shot bytes/s, two-shot extra latency s, two-shot bytes/s) as the module docstring says."""
    launch = statistics.median(t for _, b, t in rows if b <= 8 * KIB)
    ones = [((n - 1) * b, t - launch) for n, b, t in rows if 64 * KIB <= b < MAX_BYTES and one_shot(b, n)]
    beta1 = sum(x * x for x, _ in ones) / sum(x * y for x, y in ones)
    twos = [(2 * (n - 1) / n * b, t - launch) for n, b, t in rows if b < MAX_BYTES and not one_shot(b, n)]
    mx, my = statistics.fmean(x for x, _ in twos), statistics.fmean(y for _, y in twos)
    slope = sum((x - mx) * (y - my) for x, y in twos) / sum((x - mx) ** 2 for x, _ in twos)
    return launch, beta1, my - slope * mx, 1 / slope


def fit_own_two_shot(rows: list[tuple[int, float, float]], kernel, covers, one_shot) -> tuple[float, float, int]:
    """(latency s, per-peer latency s, rows) of an engine's own two-shot kernel over the rows ``covers`` keeps,
    with the fabric ``kernel``'s launch and two-shot bandwidth."""
    beta = kernel.bandwidth_bytes_per_s * kernel.two_shot_efficiency
    points = [(n - 1, t - kernel.launch_s - 2 * (n - 1) / n * b / beta) for n, b, t in rows
              if n > 1 and covers(b, n) and not one_shot(b, n)]
    mx, my = statistics.fmean(x for x, _ in points), statistics.fmean(y for _, y in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope, len(points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="vllm", help="vllm, sglang or trtllm (aiconfigurator's table names)")
    parser.add_argument("--check", action="store_true", help="price every row with the presets as they are")
    args = parser.parse_args()
    from tfcalc.calc import comm
    from tfcalc.spec.interconnect import load_interconnect
    from tfcalc.spec.presets import load_engine

    kernels = load_engine(args.engine).kernels
    for gpu_dir, (gpu, fabric_name) in TABLES.items():
        version, rows = _rows(gpu_dir, args.engine)
        if not rows:
            continue
        fabric = load_interconnect(fabric_name)
        bandwidth = fabric.nccl.bandwidth_bytes_per_s

        def one_shot(b: float, n: int) -> bool:
            return kernels.one_shot_allreduce(b, n, b / (4096 * 2))   # the collector's tokens: [b / 8 KiB, 4096]

        own = kernels.custom_allreduce_two_shot.get(fabric_name)
        if not args.check:
            launch, beta1, extra, beta2 = fit(rows, one_shot)
            print(f"{gpu} ({args.engine} {version}, {fabric_name} {bandwidth / 1e9:.0f} GB/s): launch_us "
                  f"{launch * 1e6:.1f}, one_shot_efficiency {beta1 / bandwidth:.2f} ({beta1 / 1e9:.0f} GB/s), "
                  f"two_shot_latency_us {extra * 1e6:.1f}, two_shot_efficiency {beta2 / bandwidth:.2f} "
                  f"({beta2 / 1e9:.0f} GB/s)")
            if own is not None:
                latency, per_peer, count = fit_own_two_shot(rows, kernels.custom_allreduce_on(fabric), own.covers,
                                                            one_shot)
                print(f"  its own two-shot below {dict((g, b / KIB) for g, b in own.below_bytes)} KiB ({count} "
                      f"rows): latency_us {latency * 1e6:.1f}, per_peer_us {per_peer * 1e6:.2f}")
            continue
        errors, by_gpus = [], {}
        for n, b, t in sorted(rows):
            if b >= MAX_BYTES or n == 1:
                continue
            kernel = kernels.custom_allreduce_on(fabric, b, n)   # the engine's own launch and two-shot where measured
            assert kernel is not None
            p = comm.custom_all_reduce(b, n, kernel, one_shot(b, n)).seconds
            errors.append(abs(p / t - 1))
            by_gpus.setdefault(n, []).append(f"{b / KIB:g}K {t * 1e6:.1f}/{p * 1e6:.1f}")
        print(f"{gpu} ({args.engine} {version}): {len(errors)} rows, median |err| {statistics.median(errors):.0%}, "
              f"worst {max(errors):.0%}  (measured / tfcalc us)")
        for n, cells in by_gpus.items():
            print(f"  {n} GPUs: " + ", ".join(cells))


if __name__ == "__main__":
    main()
