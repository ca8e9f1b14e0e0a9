"""Speed of the capacity search: 10,000+ candidate configurations should take under 10 s (issue 13).

The search: Llama 3 70B at 20 req/s (prompts 1k, outputs 256, lognormal), TTFT p90 <= 1 s and TPOT p90 <= 50
ms, with vLLM (memory model and kernels of the current version), over every priced GPU preset x tp 1/2/4/8 x pp 1/2
x weights bf16/fp8/int4 x KV bf16/fp8 x max_num_seqs 8...512 (7 values) x max_num_batched_tokens 512/1k/2k/4k/8k.
Reports wall and CPU time of ``search`` with one process and with two (forked) workers, each in a fresh process
(cold caches), and of the whole command line (without the simulation check).

Usage: python benchmarks/capacity_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from tfcalc.calc.capacity import GpuOffer, SearchSpace, count_candidates, search
from tfcalc.calc.serving_traffic import LengthDist, Target, Traffic
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.presets import load_engine, load_gpu, load_model
from tfcalc.spec.prices import load_prices


def _space() -> SearchSpace:
    prices = load_prices()
    return SearchSpace(gpus=tuple(GpuOffer(gpu=load_gpu(n), price_per_hour=p.usd_per_gpu_hour)
                                  for n, p in sorted(prices.items())),
                       weight_precisions=tuple(parse_weight_precision(w) for w in ("bf16", "fp8", "int4")),
                       kv_dtypes=(get_dtype("bf16"), get_dtype("fp8")), tps=(1, 2, 4, 8), pps=(1, 2),
                       chunk_sizes=(512, 1024, 2048, 4096, 8192), engines=(load_engine("vllm"),))


def _search_once(workers: int) -> None:
    """One search in this (fresh) process; prints its wall time, CPU time of the process and its workers, results."""
    import json
    import resource

    spec, space = load_model("llama3-70b"), _space()
    traffic = Traffic(input_len=LengthDist(kind="lognormal", mean=1024, spread=0.5),
                      output_len=LengthDist(kind="lognormal", mean=256, spread=0.8), rate_per_s=20)
    targets = (Target(metric="ttft", percentile=90, seconds=1.0), Target(metric="tpot", percentile=90, seconds=0.05))
    wall, cpu = time.perf_counter(), time.process_time()
    result = search(spec, traffic, targets, space, workers=workers, operating=False)
    wall = time.perf_counter() - wall
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wall": wall, "cpu": time.process_time() - cpu + children.ru_utime + children.ru_stime,
                      "candidates": count_candidates(spec, space), "fits": sum(e.fits for e in result.evaluations),
                      "feasible": sum(e.feasible for e in result.evaluations),
                      "best": result.best.candidate.label if result.best else "-"}))


def main() -> None:
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--once", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.once:
        _search_once(args.once)
        return
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (1 min), "
          f"{os.getloadavg()[1]:.2f} (5 min); python {sys.version.split()[0]}")
    for workers in (1, 2):
        runs = []
        for _ in range(args.repeat):
            done = subprocess.run([sys.executable, __file__, "--once", str(workers)], capture_output=True, text=True,
                                  check=True)
            runs.append(json.loads(done.stdout))
        walls = [r["wall"] for r in runs]
        last = runs[-1]
        print(f"search, {workers} process(es), fresh process each: median wall {statistics.median(walls):.2f} s (runs "
              f"{', '.join(f'{w:.2f}' for w in walls)}), CPU {statistics.median(r['cpu'] for r in runs):.2f} s; "
              f"{last['candidates']:,} candidates, {last['fits']:,} fit, {last['feasible']:,} feasible; cheapest: "
              f"{last['best']}; load average now {os.getloadavg()[0]:.2f}")
    tfcalc = shutil.which("tfcalc")
    if tfcalc:
        command = [tfcalc, "capacity", "-p", "llama3-70b", "--rate", "20", "--input-len", "1k", "--output-len", "256",
                   "--length-dist", "lognormal", "--ttft", "p90=1s", "--tpot", "p90=50ms", "--tp", "1,2,4,8", "--pp",
                   "1,2", "--weights-dtype", "bf16,fp8,int4", "--kv-dtype", "bf16,fp8", "--max-num-batched-tokens",
                   "512,1k,2k,4k,8k", "--no-simulate"]
        for label, extra in (("table", []), ("JSON, frontier points (default)", ["-f", "json"]),
                             ("JSON of every point", ["-f", "json", "--points", "all"])):
            start = time.perf_counter()
            done = subprocess.run(command + extra, capture_output=True, text=True, check=False)
            print(f"command line, {label} (no simulation): {time.perf_counter() - start:.2f} s, exit "
                  f"{done.returncode}, {len(done.stdout):,} bytes")

if __name__ == "__main__":
    main()
