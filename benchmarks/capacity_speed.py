"""Speed of the capacity search: 10,000+ candidate configurations should take under 10 s (issue 13).

The search: Llama 3 70B at 20 req/s (prompts 1k, outputs 256, lognormal), TTFT p90 <= 1 s and TPOT p90 <= 50
ms, over every priced GPU preset x tp 1/2/4/8 x pp 1/2 x weights bf16/fp8/int4 x KV bf16/fp8 x max_num_seqs
8...512 (7 values) x max_num_batched_tokens 512/1k/2k/4k/8k. Reports wall and CPU time of ``search`` with one
process and with two (forked) workers, and of the whole command line (without the simulation check).

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
from tfcalc.calc.serving_traffic import ENGINE_OVERHEADS, LengthDist, Target, Traffic
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.presets import load_gpu, load_model
from tfcalc.spec.prices import load_prices


def _space() -> SearchSpace:
    prices = load_prices()
    return SearchSpace(gpus=tuple(GpuOffer(gpu=load_gpu(n), price_per_hour=p.usd_per_gpu_hour)
                                  for n, p in sorted(prices.items())),
                       weight_precisions=tuple(parse_weight_precision(w) for w in ("bf16", "fp8", "int4")),
                       kv_dtypes=(get_dtype("bf16"), get_dtype("fp8")), tps=(1, 2, 4, 8), pps=(1, 2),
                       chunk_sizes=(512, 1024, 2048, 4096, 8192))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    repeat = parser.parse_args().repeat
    spec, space = load_model("llama3-70b"), _space()
    traffic = Traffic(input_len=LengthDist(kind="lognormal", mean=1024, spread=0.5),
                      output_len=LengthDist(kind="lognormal", mean=256, spread=0.8), rate_per_s=20)
    targets = (Target(metric="ttft", percentile=90, seconds=1.0), Target(metric="tpot", percentile=90, seconds=0.05))
    overheads = ENGINE_OVERHEADS["vllm"]
    total = count_candidates(spec, space)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; python {sys.version.split()[0]}")
    print(f"candidates: {total:,}")
    for workers in (1, 2):
        walls, cpus = [], []
        for _ in range(repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            result = search(spec, traffic, targets, space, overheads, workers=workers)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        fits = sum(e.fits for e in result.evaluations)
        feasible = sum(e.feasible for e in result.evaluations)
        print(f"search, {workers} process(es): median wall {statistics.median(walls):.2f} s (runs "
              f"{', '.join(f'{w:.2f}' for w in walls)}), main-process CPU {statistics.median(cpus):.2f} s; "
              f"{fits:,} fit, {feasible:,} feasible; cheapest: {result.best.candidate.label if result.best else '-'}")
    tfcalc = shutil.which("tfcalc")
    if tfcalc:
        command = [tfcalc, "capacity", "-p", "llama3-70b", "--rate", "20", "--input-len", "1k", "--output-len", "256",
                   "--length-dist", "lognormal", "--ttft", "p90=1s", "--tpot", "p90=50ms", "--tp", "1,2,4,8", "--pp",
                   "1,2", "--weights-dtype", "bf16,fp8,int4", "--kv-dtype", "bf16,fp8", "--chunk",
                   "512,1k,2k,4k,8k", "--no-simulate"]
        for label, extra in (("table", []), ("JSON of every point", ["-f", "json"])):
            start = time.perf_counter()
            done = subprocess.run(command + extra, capture_output=True, text=True, check=False)
            print(f"command line, {label} (no simulation): {time.perf_counter() - start:.2f} s, exit "
                  f"{done.returncode}, {len(done.stdout):,} bytes")

if __name__ == "__main__":
    main()
