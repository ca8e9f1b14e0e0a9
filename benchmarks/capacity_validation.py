"""tfcalc's serving model against published vLLM serving benchmarks (docs/capacity.md, "Validation").

Each case is one `vllm bench serve` run published with its full settings: model, GPU, tensor parallel, vLLM
version and flags, dataset (prompt and output token totals), number of prompts and the concurrency (rate
inf = every prompt sent at once). tfcalc replays it through its discrete-event scheduler simulation with the
roofline step-time model at default efficiencies, vLLM's default limits for the GPU (max_num_seqs 1024 and
max_num_batched_tokens 8192 on GPUs of 70 GiB or more except A100, else 256 and 2048: vLLM
EngineArgs.get_batch_defaults) and the vLLM request overheads (tfcalc/calc/serving_traffic.py), and
prints predicted vs reported throughput and latencies. Nothing here is fitted per case.

Source of every case: gpustack/gpustack@47277d7, docs/performance-lab/<model>/<gpu>.md, the "baseline (vLLM
without any optimizations)" runs: vLLM 0.10.2 / 0.11.0, `vllm bench serve --backend openai-chat`.
Length distributions are not published: ShareGPT prompts and outputs are taken as lognormal with a
coefficient of variation of 1 (capped as vLLM's ShareGPT loader caps them: prompt <= 1024, prompt + output
<= 2048), random-dataset prompts as fixed, and random-dataset outputs (requested N, stopped early at EOS) as a
geometric length capped at N with the published mean.

Usage: python benchmarks/capacity_validation.py [--markdown] [--only ID]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

from tfcalc.calc.kv_cache import default_kv_dtype
from tfcalc.calc.roofline import Efficiency
from tfcalc.calc.serving_inputs import replica_memory, step_model, step_work
from tfcalc.calc.serving_sim import SimConfig, Workload, simulate
from tfcalc.calc.serving_traffic import ENGINE_OVERHEADS, LengthDist
from tfcalc.dtypes import parse_weight_precision
from tfcalc.spec.hf_config import load_hf_config
from tfcalc.spec.presets import load_gpu, load_model

SOURCE = "gpustack/gpustack@47277d7 docs/performance-lab/"


@dataclass(frozen=True)
class Case:
    id: str
    model: str                 # preset name or path to a config.json
    gpu: str
    tp: int
    dataset: str               # "sharegpt" or "random"
    prompts: int
    concurrency: int           # = prompts for rate inf
    input_mean: float
    output_mean: float
    output_cap: int            # random: the requested output length; sharegpt: 0
    reported_total_tok_s: float
    reported_output_tok_s: float
    reported_ttft_ms: float
    reported_tpot_ms: float
    doc: str
    max_model_len: int = 0     # 0: the model's own


def _sharegpt(mean: float, cap: int) -> LengthDist:
    """Lognormal (cv 1) quantiles, capped, as an empirical distribution of 2,000 values."""
    s2 = math.log(2.0)
    from tfcalc.calc.serving_traffic import normal_quantile

    values = [min(cap, max(4, round(mean * math.exp(-s2 / 2 + math.sqrt(s2) * normal_quantile((i + 0.5) / 2000)))))
              for i in range(2000)]
    scale = mean / (sum(values) / len(values))     # restore the published mean after the cap
    return LengthDist(kind="empirical", values=tuple(max(1, round(v * scale)) for v in values))


def _eos_capped(mean: float, cap: int) -> LengthDist:
    """Outputs that stop at EOS with a constant per-token probability p, or at the requested cap:
    E[min(Geometric(p), cap)] = (1 - (1 - p)^cap) / p = mean, solved for p; 2,000 quantiles."""
    if mean >= cap - 0.5:
        return LengthDist(kind="fixed", mean=float(cap))
    lo, hi = 1e-9, 1.0
    for _ in range(100):
        p = (lo + hi) / 2
        lo, hi = (p, hi) if (1 - (1 - p) ** cap) / p > mean else (lo, p)
    values = [min(cap, 1 + int(math.log(1 - (i + 0.5) / 2000) / math.log(1 - p))) for i in range(2000)]
    return LengthDist(kind="empirical", values=tuple(values))


CASES = [
    # Qwen3-8B, one H100 SXM, vLLM 0.11.0, ShareGPT, 100 prompts, max concurrency 1 / 4 / 8.
    Case("qwen3-8b/h100 sharegpt c=1", "tests/fixtures/hf_configs/qwen3-8b.json", "h100-sxm", 1, "sharegpt", 100, 1,
         232.6, 220.61, 0, 0.0, 132.86, 59.01, 7.28, "qwen3-8b/h100-latency.md (Other Benchmark Cases, BS=1)"),
    Case("qwen3-8b/h100 sharegpt c=4", "tests/fixtures/hf_configs/qwen3-8b.json", "h100-sxm", 1, "sharegpt", 100, 4,
         232.6, 220.61, 0, 1020.76, 496.88, 64.00, 7.38, "qwen3-8b/h100-latency.md (BS=4)"),
    Case("qwen3-8b/h100 sharegpt c=8", "tests/fixtures/hf_configs/qwen3-8b.json", "h100-sxm", 1, "sharegpt", 100, 8,
         232.6, 220.61, 0, 0.0, 917.28, 74.57, 7.71, "qwen3-8b/h100-latency.md (BS=8)"),
    # Qwen3-14B (bf16), one H100 SXM / one A100 SXM 80GB, vLLM 0.11.0, rate inf.
    Case("qwen3-14b/h100 sharegpt", "benchmarks/configs/qwen3-14b.json", "h100-sxm", 1, "sharegpt", 1000, 1000,
         217.39, 201.65, 0, 0.0, 3173.92, 22141.21, 226.03, "qwen3-14b/h100.md (1. Choosing the Inference Engine)"),
    Case("qwen3-14b/h100 random 4k/200", "benchmarks/configs/qwen3-14b.json", "h100-sxm", 1, "random", 500, 500,
         3995.9, 199.61, 200, 0.0, 438.56, 112716.92, 132.45, "qwen3-14b/h100.md (Other Benchmark Cases)"),
    Case("qwen3-14b/h100 random 2k/100", "benchmarks/configs/qwen3-14b.json", "h100-sxm", 1, "random", 500, 500,
         1996.35, 100.0, 100, 0.0, 505.51, 50716.13, 206.51, "qwen3-14b/h100.md (Other Benchmark Cases)"),
    Case("qwen3-14b/a100 sharegpt", "benchmarks/configs/qwen3-14b.json", "a100-80gb", 1, "sharegpt", 1000, 1000,
         217.39, 201.61, 0, 0.0, 1887.31, 41875.09, 114.34, "qwen3-14b/a100.md (1. Choosing the Inference Engine)"),
    Case("qwen3-14b/a100 random 2k/100", "benchmarks/configs/qwen3-14b.json", "a100-80gb", 1, "random", 500, 500,
         1996.35, 100.0, 100, 0.0, 284.64, 86908.30, 301.73, "qwen3-14b/a100.md (Other Benchmark Cases)"),
    # Qwen3-32B (bf16), one H100 SXM: 61 GiB of weights leave little KV cache.
    Case("qwen3-32b/h100 sharegpt", "benchmarks/configs/qwen3-32b.json", "h100-sxm", 1, "sharegpt", 1000, 1000,
         217.39, 201.42, 0, 0.0, 1131.55, 78118.74, 88.09, "qwen3-32b/h100.md (1. Choosing the Inference Engine)"),
    Case("qwen3-32b/h100 random 2k/100", "benchmarks/configs/qwen3-32b.json", "h100-sxm", 1, "random", 500, 500,
         1996.35, 100.0, 100, 0.0, 152.42, 163909.40, 86.62, "qwen3-32b/h100.md (Other Benchmark Cases)"),
    # gpt-oss-120b, one H100 SXM (no -tp), vLLM 0.10.2, --max-model-len 32768, rate inf.
    Case("gpt-oss-120b/h100 sharegpt", "gpt-oss-120b", "h100-sxm", 1, "sharegpt", 1000, 1000, 215.31, 195.54, 0,
         6095.37, 2901.05, 24830.45, 54.10, "gpt-oss-120b/h100.md (1. Choosing the Inference Engine, vLLM)",
         32768),
    Case("gpt-oss-120b/h100 sharegpt c=4", "gpt-oss-120b", "h100-sxm", 1, "sharegpt", 100, 4, 229.46, 216.91, 0,
         0.0, 453.04, 49.00, 8.31, "gpt-oss-120b/h100.md (Other Benchmark Cases, ShareGPT batch size 4)", 32768),
    Case("gpt-oss-120b/h100 random 4k/200", "gpt-oss-120b", "h100-sxm", 1, "random", 500, 500, 3998.5, 134.41, 200,
         14247.47, 463.35, 72954.68, 31.70, "gpt-oss-120b/h100.md (Other Benchmark Cases)", 32768),
    Case("gpt-oss-120b/h100 random 2k/100", "gpt-oss-120b", "h100-sxm", 1, "random", 500, 500, 1998.2, 98.39, 100,
         14385.69, 675.11, 36234.76, 41.35, "gpt-oss-120b/h100.md (Other Benchmark Cases)", 32768),
    Case("gpt-oss-120b/h100 random 128/4", "gpt-oss-120b", "h100-sxm", 1, "random", 1000, 1000, 127.76, 4.0, 4,
         17059.15, 517.91, 4850.46, 304.80, "gpt-oss-120b/h100.md (Other Benchmark Cases)", 32768),
    # gpt-oss-20b, one H100 SXM, vLLM 0.11.0, rate inf.
    Case("gpt-oss-20b/h100 sharegpt", "gpt-oss-20b", "h100-sxm", 1, "sharegpt", 1000, 1000, 215.31, 193.98, 0,
         16493.75, 7817.03, 4881.62, 91.00, "gpt-oss-20b/h100.md (1. Choosing the Inference Engine, vLLM)"),
    Case("gpt-oss-20b/h100 random 4k/200", "gpt-oss-20b", "h100-sxm", 1, "random", 500, 500, 3998.5, 104.62, 200,
         33236.17, 847.43, 31245.12, 184.26, "gpt-oss-20b/h100.md (Other Benchmark Cases)"),
    # gpt-oss-20b, one A100 SXM 80GB, vLLM 0.11.0, rate inf.
    Case("gpt-oss-20b/a100 sharegpt", "gpt-oss-20b", "a100-80gb", 1, "sharegpt", 1000, 1000, 215.31, 194.17, 0,
         9743.28, 4620.12, 13654.59, 48.57, "gpt-oss-20b/a100.md (1. Choosing the Inference Engine, vLLM)"),
    Case("gpt-oss-20b/a100 random 2k/100", "gpt-oss-20b", "a100-80gb", 1, "random", 500, 500, 1998.2, 94.45, 100,
         18021.34, 813.35, 31669.55, 100.32, "gpt-oss-20b/a100.md (Other Benchmark Cases)"),
    # gpt-oss-120b, one A100 SXM 80GB (no -tp), vLLM 0.11.0, --max-model-len 32768, rate inf.
    Case("gpt-oss-120b/a100 sharegpt", "gpt-oss-120b", "a100-80gb", 1, "sharegpt", 1000, 1000, 215.31, 196.66, 0,
         4768.75, 2276.40, 25918.79, 97.57, "gpt-oss-120b/a100.md (1. Choosing the Inference Engine, vLLM)",
         32768),
    Case("gpt-oss-120b/a100 sharegpt c=4", "gpt-oss-120b", "a100-80gb", 1, "sharegpt", 100, 4, 229.46, 216.91, 0,
         0.0, 326.09, 61.91, 11.67, "gpt-oss-120b/a100.md (Other Benchmark Cases, ShareGPT batch size 4)", 32768),
    # Qwen3-235B-A22B (bf16), 8 x H100 SXM, tp 8, vLLM 0.11.0, rate inf (984 prompts passed the filter).
    Case("qwen3-235b-a22b/8xh100 sharegpt", "qwen3-235b-a22b", "h100-sxm", 8, "sharegpt", 984, 984, 216.36, 197.02,
         0, 8424.86, 4015.36, 8730.69, 147.56, "qwen3-235b-a22b/h100.md (1. Choosing the Inference Engine, vLLM)"),
    Case("qwen3-235b-a22b/8xh100 random 2k/100", "qwen3-235b-a22b", "h100-sxm", 8, "random", 500, 500, 1996.35,
         99.0, 100, 23858.69, 1127.26, 21313.79, 101.08, "qwen3-235b-a22b/h100.md (Other Benchmark Cases)"),
]


def _spec(name: str):
    return load_hf_config(name) if name.endswith(".json") else load_model(name)


def run(case: Case, requests: int | None = None) -> dict:
    spec, gpu = _spec(case.model), load_gpu(case.gpu)
    precision, kv = parse_weight_precision(spec.native_dtype), default_kv_dtype(spec)
    large = gpu.memory_bytes >= 70 * (1 << 30) and "a100" not in gpu.name
    seats, budget = (1024, 8192) if large else (256, 2048)
    max_len = case.max_model_len or spec.max_context
    memory = replica_memory(spec, gpu, precision, kv, tp=case.tp, pp=1, ep=1, max_model_len=max_len,
                            max_num_batched_tokens=budget, gpu_memory_utilization=0.9, block_size=16,
                            runtime_overhead_bytes=1 << 30)
    step = step_model(step_work(spec, precision, kv, case.tp), gpu, Efficiency())
    if case.dataset == "sharegpt":
        inputs = _sharegpt(case.input_mean, 1024)
        outputs = _sharegpt(case.output_mean, 1024)
    else:
        inputs = LengthDist(kind="fixed", mean=case.input_mean)
        outputs = _eos_capped(case.output_mean, case.output_cap)
    cfg = SimConfig(max_num_seqs=seats, max_num_batched_tokens=budget, kv_capacity_tokens=memory.kv_capacity_tokens,
                    overheads=ENGINE_OVERHEADS["vllm"])
    n = requests or case.prompts
    load = Workload(input_len=inputs, output_len=outputs, num_requests=n, concurrency=min(case.concurrency, n),
                    seed=1)
    start = time.perf_counter()
    sim = simulate(step, cfg, load)
    return {"case": case, "fits": memory.fits, "kv_tokens": memory.kv_capacity_tokens, "sim": sim,
            "seconds": time.perf_counter() - start}


def _error(predicted: float, reported: float) -> str:
    return f"{(predicted / reported - 1) * 100:+.0f} %" if reported else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the docs/capacity.md table")
    parser.add_argument("--only", help="run the cases whose id contains this")
    args = parser.parse_args()
    rows = []
    for case in CASES:
        if args.only and args.only not in case.id:
            continue
        r = run(case)
        sim = r["sim"]
        total = sim.total_throughput if case.reported_total_tok_s else None
        rows.append((case, sim, total, r))
        if not args.markdown:
            print(f"{case.id:40s} out tok/s {sim.output_throughput:9.1f} vs {case.reported_output_tok_s:9.1f} "
                  f"({_error(sim.output_throughput, case.reported_output_tok_s)}); TTFT "
                  f"{sim.metric('ttft', 0) * 1e3:9.1f} vs {case.reported_ttft_ms:9.1f} ms; TPOT "
                  f"{sim.metric('tpot', 0) * 1e3:7.2f} vs {case.reported_tpot_ms:7.2f} ms; preemptions "
                  f"{sim.preemptions}; {r['seconds']:.1f} s", flush=True)
    if args.markdown:
        print("| case | GPU x tp | prompts, concurrency | output tok/s reported | predicted | error | "
              "TTFT mean reported | predicted | TPOT mean reported | predicted |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for case, sim, _, _ in rows:
            conc = "rate inf" if case.concurrency == case.prompts else f"concurrency {case.concurrency}"
            print(f"| {case.id} | {case.gpu} x {case.tp} | {case.prompts}, {conc} | "
                  f"{case.reported_output_tok_s:,.0f} | {sim.output_throughput:,.0f} | "
                  f"{_error(sim.output_throughput, case.reported_output_tok_s)} | "
                  f"{case.reported_ttft_ms:,.0f} ms | {sim.metric('ttft', 0) * 1e3:,.0f} ms | "
                  f"{case.reported_tpot_ms:.1f} ms | {sim.metric('tpot', 0) * 1e3:.1f} ms |")
        errors = [abs(sim.output_throughput / case.reported_output_tok_s - 1) for case, sim, _, _ in rows]
        inside = sum(e <= 0.25 for e in errors)
        print(f"\n{inside} of {len(rows)} cases within ±25 % on output throughput; median |error| "
              f"{sorted(errors)[len(errors) // 2] * 100:.0f} %")


if __name__ == "__main__":
    main()
