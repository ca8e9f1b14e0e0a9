"""How fast ``tfcalc estimate`` sweeps: rows per second of one sweep, cold caches, and a model at the layer limit.

    python benchmarks/estimate_sweep.py [--repeats N] [--routing uniform|zipf:S|power-law:ALPHA]

Target (issue 9): >= 2,000 rows per second out of one sweep (4 models x 2 GPUs x tp 1-8 x 7 batches x 5 prompts x
4 generation lengths = 4,480 rows), and a model with the most layers a spec allows (10,000, issue 11's limit) in
the time of a 32-layer one (its cost must not grow with the layer count). Each measurement runs in a fresh process
so no cache survives from one to the next. CPU time is reported beside wall time: on a shared machine the wall clock
also counts other people's work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

SWEEP = ["-p", "llama3-8b,mixtral-8x7b,deepseek-v3,qwen3-30b-a3b", "-g", "h100-sxm,h200", "--tp", "1,2,4,8",
         "--batch", "1,2,4,8,16,32,64", "--prompt-len", "512,1k,2k,4k,8k", "--gen-len", "128,256,512,1k"]

CORE = """
import json, time
from tfcalc.calc.kernels import parse_routing
from tfcalc.report.estimate import EstimateOptions, EstimateSweep, estimate_rows
from tfcalc.spec.presets import load_engine, load_gpu, load_model
specs = [load_model(n) for n in ("llama3-8b", "mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b")]
gpus = [load_gpu(g) for g in ("h100-sxm", "h200")]
options = EstimateOptions(engine=load_engine("vllm"), fit={fit}, routing=parse_routing("{routing}"))
wall, cpu = time.perf_counter(), time.process_time()
sweep = EstimateSweep(tps=[1, 2, 4, 8], pps=[1], eps=[1], batches=[1, 2, 4, 8, 16, 32, 64],
                      prompt_lens=[512, 1024, 2048, 4096, 8192], gen_lens=[128, 256, 512, 1024])
rows, _ = estimate_rows(specs, gpus, sweep, options)
print(json.dumps({{"rows": len(rows), "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}}))
"""

MILLION = """
import json, time
from tfcalc.calc.latency import deployment, estimate_latency
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.model import INT_LIMITS
from tfcalc.spec.presets import load_gpu, load_model
out = {{}}
for layers in (32, INT_LIMITS["num_layers"][1]):
    spec = load_model("llama3-8b").with_overrides(layers=layers)
    wall = time.perf_counter()
    d = deployment(spec, load_gpu("h100-sxm"), parse_weight_precision("bf16"), get_dtype("bf16"), tp={tp}, pp={pp})
    e = estimate_latency(d, 8, 4096, 256)
    out[layers] = {{"wall": time.perf_counter() - wall, "tpot_s": e.tpot_s}}
print(json.dumps(out))
"""


def _python(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cli(fmt: str, routing: str) -> tuple[float, float, int]:
    """Wall and CPU seconds (user + system of the child, from getrusage) of the whole CLI process."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tfcalc", "estimate", *SWEEP, "--routing", routing,
                                                "-f", fmt], capture_output=True,
                          text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows = len(json.loads(done.stdout)) if fmt == "json" else done.stdout.count("\n") - 1
    return wall, cpu, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--routing", default="uniform", help="MoE routing of the sweep (estimate --routing)")
    args = parser.parse_args()

    def report(label: str, runs: list[dict]) -> None:
        rows = runs[0]["rows"]
        wall = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        line = f"{label:<46}{rows:>6} rows  wall {wall:6.2f} s = {rows / wall:8,.0f} rows/s"
        print(line + (f"  cpu {cpu:6.2f} s = {rows / cpu:8,.0f} rows/s" if cpu else ""))

    report("estimate core (calc + rows + fit), cold", [_python(CORE.format(fit=True, routing=args.routing))
                                                                for _ in range(args.repeats)])
    report("estimate core without the fit check, cold", [_python(CORE.format(fit=False, routing=args.routing))
                                                        for _ in range(args.repeats)])
    for fmt in ("json", "csv"):
        runs = []
        for _ in range(args.repeats):
            wall, cpu, rows = _cli(fmt, args.routing)
            runs.append({"rows": rows, "wall": wall, "cpu": cpu})
        report(f"tfcalc estimate ... -f {fmt} (whole process)", runs)
    for tp, pp in ((1, 1), (1, 4)):
        result = _python(MILLION.format(tp=tp, pp=pp))
        (_, small), (most, big) = sorted(result.items(), key=lambda item: int(item[0]))
        print(f"llama3-8b shape, tp {tp} pp {pp}: 32 layers {small['wall'] * 1e3:7.1f} ms, {int(most):,} layers "
              f"{big['wall'] * 1e3:7.1f} ms (TPOT {big['tpot_s']:.3g} s)")


if __name__ == "__main__":
    main()
