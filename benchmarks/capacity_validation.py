"""tfcalc's serving model against published vLLM serving benchmarks (docs/capacity.md, "Validation").

Each case is one `vllm bench serve` run published with its full settings: model, GPU, tensor parallel, vLLM
version and flags, dataset (prompt and output token totals), number of prompts and the concurrency (rate
inf = every prompt sent at once). tfcalc replays it through its discrete-event simulation of the API server and the
scheduler with the engine version's memory model and kernels (``--engine vllm@VERSION``), the per-operation
latency model of ``estimate``, vLLM's default limits for the GPU (the engine preset's scheduler defaults: 1024
sequences and 8192 tokens on GPUs of 70 GiB or more except A100, else 256 and 2048) and the vLLM overheads
(the engine preset's requests: block, sourced outside these cases), and prints predicted vs reported throughput and
latencies. Nothing here is fitted per case. "before" is the first version's prediction (the 0.6-efficiency
roofline and plan's old memory arithmetic, overheads as latencies only); --mode latency runs the new step model
without the API server's queue, to show what each mechanism changes.

A second set (``--silicon``) replays NVIDIA's measured serving runs (aiconfigurator 0.12 silicon_sample.csv,
benchmarks/validation/silicon_points.json: vLLM, SGLang and TensorRT-LLM at concurrency 4, fixed lengths) the
same way, with each engine's overheads: throughput = 4 x output tokens / (TTFT + (output - 1) x TPOT).

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
import json
import math
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from tfcalc.calc.engine import scheduler_defaults
from tfcalc.calc.kv_cache import default_kv_dtype
from tfcalc.calc.params import count_params
from tfcalc.calc.serving_inputs import latency_step, replica_memory
from tfcalc.calc.serving_sim import SimConfig, Workload, simulate
from tfcalc.calc.serving_traffic import LengthDist, Overheads, engine_overheads
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import UsageError
from tfcalc.spec.engine import EngineSpec, SchedulerPolicy
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.hf_config import load_hf_config
from tfcalc.spec.presets import load_engine, load_gpu, load_model

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
    before_output_tok_s: float = 0.0   # the first version's prediction (docs/capacity.md at 2d6e0bd)
    release: str = "0.11"      # the engine release the run used
    engine: str = "vllm"       # the engine: vllm, sglang or trtllm
    ep: int = 1                # expert parallel size (TensorRT-LLM's --ep_size)
    sharegpt_cap: int = 1024   # ShareGPT lengths' cap: vLLM's loader; guidellm keeps the model's context
    published: str = ""        # held-out cases: the page's last change (its repository's commit date)


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
         232.6, 220.61, 0, 0.0, 132.86, 59.01, 7.28, "qwen3-8b/h100-latency.md (Other Benchmark Cases, BS=1)",
         before_output_tok_s=129, release="0.11"),
    Case("qwen3-8b/h100 sharegpt c=4", "tests/fixtures/hf_configs/qwen3-8b.json", "h100-sxm", 1, "sharegpt", 100, 4,
         232.6, 220.61, 0, 1020.76, 496.88, 64.00, 7.38, "qwen3-8b/h100-latency.md (BS=4)",
         before_output_tok_s=477, release="0.11"),
    Case("qwen3-8b/h100 sharegpt c=8", "tests/fixtures/hf_configs/qwen3-8b.json", "h100-sxm", 1, "sharegpt", 100, 8,
         232.6, 220.61, 0, 0.0, 917.28, 74.57, 7.71, "qwen3-8b/h100-latency.md (BS=8)",
         before_output_tok_s=853, release="0.11"),
    # Qwen3-14B (bf16), one H100 SXM / one A100 SXM 80GB, vLLM 0.11.0, rate inf.
    Case("qwen3-14b/h100 sharegpt", "benchmarks/configs/qwen3-14b.json", "h100-sxm", 1, "sharegpt", 1000, 1000,
         217.39, 201.65, 0, 0.0, 3173.92, 22141.21, 226.03, "qwen3-14b/h100.md (1. Choosing the Inference Engine)",
         before_output_tok_s=6263, release="0.11"),
    Case("qwen3-14b/h100 random 4k/200", "benchmarks/configs/qwen3-14b.json", "h100-sxm", 1, "random", 500, 500,
         3995.9, 199.61, 200, 0.0, 438.56, 112716.92, 132.45, "qwen3-14b/h100.md (Other Benchmark Cases)",
         before_output_tok_s=683, release="0.11"),
    Case("qwen3-14b/h100 random 2k/100", "benchmarks/configs/qwen3-14b.json", "h100-sxm", 1, "random", 500, 500,
         1996.35, 100.0, 100, 0.0, 505.51, 50716.13, 206.51, "qwen3-14b/h100.md (Other Benchmark Cases)",
         before_output_tok_s=866, release="0.11"),
    Case("qwen3-14b/a100 sharegpt", "benchmarks/configs/qwen3-14b.json", "a100-80gb", 1, "sharegpt", 1000, 1000,
         217.39, 201.61, 0, 0.0, 1887.31, 41875.09, 114.34, "qwen3-14b/a100.md (1. Choosing the Inference Engine)",
         before_output_tok_s=2480, release="0.11"),
    Case("qwen3-14b/a100 random 2k/100", "benchmarks/configs/qwen3-14b.json", "a100-80gb", 1, "random", 500, 500,
         1996.35, 100.0, 100, 0.0, 284.64, 86908.30, 301.73, "qwen3-14b/a100.md (Other Benchmark Cases)",
         before_output_tok_s=321, release="0.11"),
    # Qwen3-32B (bf16), one H100 SXM: 61 GiB of weights leave little KV cache.
    Case("qwen3-32b/h100 sharegpt", "benchmarks/configs/qwen3-32b.json", "h100-sxm", 1, "sharegpt", 1000, 1000,
         217.39, 201.42, 0, 0.0, 1131.55, 78118.74, 88.09, "qwen3-32b/h100.md (1. Choosing the Inference Engine)",
         before_output_tok_s=1556, release="0.11"),
    Case("qwen3-32b/h100 random 2k/100", "benchmarks/configs/qwen3-32b.json", "h100-sxm", 1, "random", 500, 500,
         1996.35, 100.0, 100, 0.0, 152.42, 163909.40, 86.62, "qwen3-32b/h100.md (Other Benchmark Cases)",
         before_output_tok_s=229, release="0.11"),
    # gpt-oss-120b, one H100 SXM (no -tp), vLLM 0.10.2, --max-model-len 32768, rate inf.
    Case("gpt-oss-120b/h100 sharegpt", "gpt-oss-120b", "h100-sxm", 1, "sharegpt", 1000, 1000, 215.31, 195.54, 0,
         6095.37, 2901.05, 24830.45, 54.10, "gpt-oss-120b/h100.md (1. Choosing the Inference Engine, vLLM)",
         32768,
         before_output_tok_s=6348, release="0.10"),
    Case("gpt-oss-120b/h100 sharegpt c=4", "gpt-oss-120b", "h100-sxm", 1, "sharegpt", 100, 4, 229.46, 216.91, 0,
         0.0, 453.04, 49.00, 8.31, "gpt-oss-120b/h100.md (Other Benchmark Cases, ShareGPT batch size 4)", 32768,
         before_output_tok_s=691, release="0.10"),
    Case("gpt-oss-120b/h100 random 4k/200", "gpt-oss-120b", "h100-sxm", 1, "random", 500, 500, 3998.5, 134.41, 200,
         14247.47, 463.35, 72954.68, 31.70, "gpt-oss-120b/h100.md (Other Benchmark Cases)", 32768,
         before_output_tok_s=1204, release="0.10"),
    Case("gpt-oss-120b/h100 random 2k/100", "gpt-oss-120b", "h100-sxm", 1, "random", 500, 500, 1998.2, 98.39, 100,
         14385.69, 675.11, 36234.76, 41.35, "gpt-oss-120b/h100.md (Other Benchmark Cases)", 32768,
         before_output_tok_s=1849, release="0.10"),
    Case("gpt-oss-120b/h100 random 128/4", "gpt-oss-120b", "h100-sxm", 1, "random", 1000, 1000, 127.76, 4.0, 4,
         17059.15, 517.91, 4850.46, 304.80, "gpt-oss-120b/h100.md (Other Benchmark Cases)", 32768,
         before_output_tok_s=1851, release="0.10"),
    # gpt-oss-20b, one H100 SXM, vLLM 0.11.0, rate inf.
    Case("gpt-oss-20b/h100 sharegpt", "gpt-oss-20b", "h100-sxm", 1, "sharegpt", 1000, 1000, 215.31, 193.98, 0,
         16493.75, 7817.03, 4881.62, 91.00, "gpt-oss-20b/h100.md (1. Choosing the Inference Engine, vLLM)",
         before_output_tok_s=19359, release="0.11"),
    Case("gpt-oss-20b/h100 random 4k/200", "gpt-oss-20b", "h100-sxm", 1, "random", 500, 500, 3998.5, 104.62, 200,
         33236.17, 847.43, 31245.12, 184.26, "gpt-oss-20b/h100.md (Other Benchmark Cases)",
         before_output_tok_s=2208, release="0.11"),
    # gpt-oss-20b, one A100 SXM 80GB, vLLM 0.11.0, rate inf.
    Case("gpt-oss-20b/a100 sharegpt", "gpt-oss-20b", "a100-80gb", 1, "sharegpt", 1000, 1000, 215.31, 194.17, 0,
         9743.28, 4620.12, 13654.59, 48.57, "gpt-oss-20b/a100.md (1. Choosing the Inference Engine, vLLM)",
         before_output_tok_s=8626, release="0.11"),
    Case("gpt-oss-20b/a100 random 2k/100", "gpt-oss-20b", "a100-80gb", 1, "random", 500, 500, 1998.2, 94.45, 100,
         18021.34, 813.35, 31669.55, 100.32, "gpt-oss-20b/a100.md (Other Benchmark Cases)",
         before_output_tok_s=1292, release="0.11"),
    # gpt-oss-120b, one A100 SXM 80GB (no -tp), vLLM 0.11.0, --max-model-len 32768, rate inf.
    Case("gpt-oss-120b/a100 sharegpt", "gpt-oss-120b", "a100-80gb", 1, "sharegpt", 1000, 1000, 215.31, 196.66, 0,
         4768.75, 2276.40, 25918.79, 97.57, "gpt-oss-120b/a100.md (1. Choosing the Inference Engine, vLLM)",
         32768,
         before_output_tok_s=3021, release="0.11"),
    Case("gpt-oss-120b/a100 sharegpt c=4", "gpt-oss-120b", "a100-80gb", 1, "sharegpt", 100, 4, 229.46, 216.91, 0,
         0.0, 326.09, 61.91, 11.67, "gpt-oss-120b/a100.md (Other Benchmark Cases, ShareGPT batch size 4)", 32768,
         before_output_tok_s=423, release="0.11"),
    # Qwen3-235B-A22B (bf16), 8 x H100 SXM, tp 8, vLLM 0.11.0, rate inf (984 prompts passed the filter).
    Case("qwen3-235b-a22b/8xh100 sharegpt", "qwen3-235b-a22b", "h100-sxm", 8, "sharegpt", 984, 984, 216.36, 197.02,
         0, 8424.86, 4015.36, 8730.69, 147.56, "qwen3-235b-a22b/h100.md (1. Choosing the Inference Engine, vLLM)",
         before_output_tok_s=5573, release="0.11"),
    Case("qwen3-235b-a22b/8xh100 random 2k/100", "qwen3-235b-a22b", "h100-sxm", 8, "random", 500, 500, 1996.35,
         99.0, 100, 23858.69, 1127.26, 21313.79, 101.08, "qwen3-235b-a22b/h100.md (Other Benchmark Cases)",
         before_output_tok_s=1740, release="0.11"),
]


# Held-out cases (issue 13), scored once before any change (docs/capacity.md, "Held-out serving runs"): the same
# lab's later pages (each page's last commit 2026-01-06, 2026-03-30 for Qwen3.5), baseline `vllm serve` /
# `sglang.launch_server` / `trtllm-serve` runs with only the flags named in the id, `vllm bench serve --backend
# openai-chat` (rate inf) unless the id says guidellm (GPUStack's benchmark-runner: constant rate 1000/s, the
# concurrency it reports). Prompt and output means are the reports' token totals over the requests.
D = "deepseek-r1/h200.md"
V = "deepseek-v3.2/h200.md"
G = "glm-4.5-air/"
Q = "qwen3-235b-a22b/a100.md"
Q35 = "qwen3.5-35b-a3b/h200.md"
PUBLIC_CASES = [
    # DeepSeek-R1-0528 (fp8 blocks), 8 x H200, tp 8: vLLM 0.11.0, SGLang 0.5.3, TensorRT-LLM 1.0.0 (--ep_size 8).
    Case("deepseek-r1/8xh200 vllm sharegpt", "deepseek-v3", "h200", 8, "sharegpt", 1000, 1000, 219.171, 200.752, 0,
         5482.59, 2621.05, 17743.08, 227.45, D + " (1. Choosing the Inference Engine, vLLM)", release="0.11",
         published="2026-01-06"),
    Case("deepseek-r1/8xh200 sglang sharegpt", "deepseek-v3", "h200", 8, "sharegpt", 1000, 1000, 219.171, 200.767,
         0, 6635.73, 3172.46, 6948.08, 420.18, D + " (1. Choosing the Inference Engine, SGLang)", release="0.5.3",
         engine="sglang", published="2026-01-06"),
    Case("deepseek-r1/8xh200 trtllm ep8 sharegpt", "deepseek-v3", "h200", 8, "sharegpt", 1000, 1000, 219.171,
         200.813, 0, 3385.88, 1618.94, 20253.9, 221.31, D + " (1. Choosing the Inference Engine, TensorRT-LLM)",
         release="1.0", engine="trtllm", ep=8, published="2026-01-06"),
    Case("deepseek-r1/8xh200 vllm sharegpt c=4", "deepseek-v3", "h200", 8, "sharegpt", 100, 4, 228.36, 213.38, 0,
         407.45, 196.81, 123.3, 19.36, D + " (Other Benchmark Cases, ShareGPT batch size 4)", release="0.11",
         published="2026-01-06"),
    Case("deepseek-r1/8xh200 vllm random 32k/100", "deepseek-v3", "h200", 8, "random", 100, 100, 31999.0, 100.0,
         100, 15514.57, 48.33, 101351.99, 365.79, D + " (Other Benchmark Cases)", release="0.11",
         published="2026-01-06"),
    Case("deepseek-r1/8xh200 vllm random 4k/200", "deepseek-v3", "h200", 8, "random", 500, 500, 3995.06, 200.0, 200,
         15808.55, 753.67, 63058.71, 164.23, D + " (Other Benchmark Cases)", release="0.11", published="2026-01-06"),
    Case("deepseek-r1/8xh200 vllm random 2k/100", "deepseek-v3", "h200", 8, "random", 500, 500, 1996.79, 100.0, 100,
         17690.89, 843.71, 28911.9, 237.02, D + " (Other Benchmark Cases)", release="0.11", published="2026-01-06"),
    Case("deepseek-r1/8xh200 vllm random 128/4", "deepseek-v3", "h200", 8, "random", 1000, 1000, 126.88, 4.0, 4,
         5931.25, 181.27, 19392.11, 351.83, D + " (Other Benchmark Cases)", release="0.11", published="2026-01-06"),
    # DeepSeek-V3.2 (fp8 blocks, sparse attention), 8 x H200, tp 8: vLLM 0.13.0, SGLang 0.5.6.post2, TensorRT-LLM
    # 1.2.0rc5 (--tp_size 8 only).
    Case("deepseek-v3.2/8xh200 vllm sharegpt", "deepseek-v3.2", "h200", 8, "sharegpt", 1000, 1000, 219.111, 196.599,
         0, 5713.95, 2702.26, 13054.63, 275.03, V + " (1. Baseline of the Inference Engine, vLLM)", release="0.13",
         published="2026-01-06"),
    Case("deepseek-v3.2/8xh200 sglang sharegpt", "deepseek-v3.2", "h200", 8, "sharegpt", 1000, 1000, 219.111,
         197.337, 0, 3012.37, 1427.44, 11470.15, 1103.96, V + " (1. Baseline of the Inference Engine, SGLang)",
         release="0.5.6", engine="sglang", published="2026-01-06"),
    Case("deepseek-v3.2/8xh200 trtllm sharegpt", "deepseek-v3.2", "h200", 8, "sharegpt", 984, 984, 218.67, 198.06,
         0, 1732.48, 823.39, 65710.22, 1391.76, V + " (1. Baseline of the Inference Engine, TensorRT-LLM)",
         release="1.2", engine="trtllm", published="2026-01-06"),
    # GLM-4.5-Air (bf16), 4 x H100 SXM / 4 x A100 SXM 80GB, tp 4: vLLM 0.11.0, SGLang 0.5.4.post2.
    Case("glm-4.5-air/4xh100 vllm sharegpt", "glm-4.5-air", "h100-sxm", 4, "sharegpt", 1000, 1000, 214.465, 199.895,
         0, 7909.53, 3815.71, 16383.88, 134.47, G + "h100.md (1. Choosing the Inference Engine, vLLM)",
         release="0.11", published="2026-01-06"),
    Case("glm-4.5-air/4xh100 sglang sharegpt", "glm-4.5-air", "h100-sxm", 4, "sharegpt", 1000, 1000, 214.465,
         199.904, 0, 9395.49, 4532.66, 4371.21, 222.86, G + "h100.md (1. Choosing the Inference Engine, SGLang)",
         release="0.5.4", engine="sglang", published="2026-01-06"),
    Case("glm-4.5-air/4xh100 vllm random 4k/200", "glm-4.5-air", "h100-sxm", 4, "random", 500, 500, 3999.57, 199.09,
         200, 6975.1, 330.75, 142573.31, 267.38, G + "h100.md (Other Benchmark Cases)", release="0.11",
         published="2026-01-06"),
    Case("glm-4.5-air/4xh100 vllm random 2k/100", "glm-4.5-air", "h100-sxm", 4, "random", 500, 500, 1998.86, 100.0,
         100, 8643.75, 411.83, 60300.0, 204.31, G + "h100.md (Other Benchmark Cases)", release="0.11",
         published="2026-01-06"),
    Case("glm-4.5-air/4xh100 vllm random 128/4", "glm-4.5-air", "h100-sxm", 4, "random", 1000, 1000, 127.88, 4.0, 4,
         6271.24, 190.21, 16583.77, 153.0, G + "h100.md (Other Benchmark Cases)", release="0.11",
         published="2026-01-06"),
    Case("glm-4.5-air/4xa100 vllm sharegpt", "glm-4.5-air", "a100-80gb", 4, "sharegpt", 1000, 1000, 214.465,
         199.904, 0, 3903.44, 1883.14, 38971.22, 104.59, G + "a100.md (1. Choosing the Inference Engine, vLLM)",
         release="0.11", published="2026-01-06"),
    Case("glm-4.5-air/4xa100 sglang sharegpt", "glm-4.5-air", "a100-80gb", 4, "sharegpt", 1000, 1000, 214.465,
         199.873, 0, 6160.72, 2971.88, 14772.52, 328.21, G + "a100.md (1. Choosing the Inference Engine, SGLang)",
         release="0.5.4", engine="sglang", published="2026-01-06"),
    # Qwen3-235B-A22B-Instruct-2507 (bf16), 8 x A100 SXM 80GB, tp 8: vLLM 0.11.0, SGLang 0.5.5.post1.
    Case("qwen3-235b-a22b/8xa100 vllm sharegpt", "qwen3-235b-a22b", "a100-80gb", 8, "sharegpt", 1000, 1000, 217.393,
         196.004, 0, 3792.5, 1798.14, 38065.91, 123.36, Q + " (1. Choosing the Inference Engine, vLLM)",
         release="0.11", published="2026-01-06"),
    Case("qwen3-235b-a22b/8xa100 sglang sharegpt", "qwen3-235b-a22b", "a100-80gb", 8, "sharegpt", 1000, 1000,
         217.393, 196.763, 0, 4635.31, 2202.21, 21130.67, 235.1, Q + " (1. Choosing the Inference Engine, SGLang)",
         release="0.5.5", engine="sglang", published="2026-01-06"),
    Case("qwen3-235b-a22b/8xa100 vllm random 32k/100", "qwen3-235b-a22b", "a100-80gb", 8, "random", 100, 100,
         32000.0, 81.91, 100, 6657.49, 17.0, 240229.05, 298.86, Q + " (Other Benchmark Cases)", release="0.11",
         published="2026-01-06"),
    Case("qwen3-235b-a22b/8xa100 vllm random 4k/200", "qwen3-235b-a22b", "a100-80gb", 8, "random", 500, 500,
         3995.88, 182.70, 200, 8170.72, 357.26, 122190.64, 205.64, Q + " (Other Benchmark Cases)", release="0.11",
         published="2026-01-06"),
    Case("qwen3-235b-a22b/8xa100 vllm random 2k/100", "qwen3-235b-a22b", "a100-80gb", 8, "random", 500, 500,
         1996.35, 99.26, 100, 9342.67, 442.54, 54722.5, 190.79, Q + " (Other Benchmark Cases)", release="0.11",
         published="2026-01-06"),
    Case("qwen3-235b-a22b/8xa100 vllm random 128/4", "qwen3-235b-a22b", "a100-80gb", 8, "random", 1000, 1000,
         127.70, 4.0, 4, 7449.43, 226.26, 12767.63, 155.16, Q + " (Other Benchmark Cases)", release="0.11",
         published="2026-01-06"),
    # Qwen3.5-35B-A3B (bf16, gated delta-net hybrid), one H200: vLLM 0.17.1, SGLang 0.5.9, --max-model-len /
    # --context-length 32768, guidellm.
    Case("qwen3.5-35b-a3b/h200 vllm sharegpt guidellm", "qwen3.5-35b-a3b", "h200", 1, "sharegpt", 1000, 512,
         342.058, 281.412, 0, 9632.01, 4347.55, 4072.64, 25.89, Q35 + " (Baseline of the Inference Engine, vLLM)",
         32768, release="0.17", sharegpt_cap=32768, published="2026-03-30"),
    Case("qwen3.5-35b-a3b/h200 sglang sharegpt guidellm", "qwen3.5-35b-a3b", "h200", 1, "sharegpt", 1000, 512,
         342.058, 281.412, 0, 4995.66, 2254.86, 34359.37, 180.73, Q35 + " (Baseline of the Inference Engine, SGLang)",
         32768, release="0.5.9", engine="sglang", sharegpt_cap=32768, published="2026-03-30"),
    Case("qwen3.5-35b-a3b/h200 vllm random 1k/128 guidellm", "qwen3.5-35b-a3b", "h200", 1, "random", 1000, 512,
         1033.93, 128.0, 128, 37934.72, 4178.94, 5809.82, 45.39, Q35 + " (Other Benchmark Cases, Throughput)", 32768,
         release="0.17", published="2026-03-30"),
    Case("qwen3.5-35b-a3b/h200 vllm random 32k/100 guidellm", "qwen3.5-35b-a3b", "h200", 1, "random", 100, 100,
         32009.93, 100.0, 100, 44993.2, 140.12, 31979.13, 319.79, Q35 + " (Other Benchmark Cases, Long Context)",
         32768, release="0.17", published="2026-03-30"),
    Case("qwen3.5-35b-a3b/h200 vllm random 1k/2k guidellm", "qwen3.5-35b-a3b", "h200", 1, "random", 200, 200,
         1009.91, 2000.0, 2000, 10455.38, 6947.3, 1915.55, 2.48, Q35 + " (Other Benchmark Cases, Generation Heavy)",
         32768, release="0.17", published="2026-03-30"),
]


def _spec(name: str):
    return load_hf_config(name) if name.endswith(".json") else load_model(name)


def _overheads(engine: object, mode: str) -> Overheads:
    o = engine_overheads(engine)
    return replace(o, api_request_s=0.0, api_input_token_s=0.0, api_token_s=0.0) if mode == "latency" else o


def run(case: Case, requests: int | None = None, mode: str = "full") -> dict:
    spec, gpu = _spec(case.model), load_gpu(case.gpu)
    engine = load_engine(f"{case.engine}@{case.release}")
    precision, kv = parse_weight_precision(spec.native_dtype), default_kv_dtype(spec, engine, gpu)
    seats, budget = scheduler_defaults(engine, gpu)
    max_len = case.max_model_len or spec.max_context
    memory = replica_memory(spec, gpu, precision, kv, tp=case.tp, pp=1, ep=case.ep, engine=engine,
                            max_model_len=max_len, max_num_seqs=seats, max_num_batched_tokens=budget)
    step = latency_step(spec, gpu, precision, kv, tp=case.tp, ep=case.ep, engine=engine)
    if case.dataset == "sharegpt":
        inputs = _sharegpt(case.input_mean, case.sharegpt_cap)
        outputs = _sharegpt(case.output_mean, case.sharegpt_cap)
    else:
        inputs = LengthDist(kind="fixed", mean=case.input_mean)
        outputs = _eos_capped(case.output_mean, case.output_cap)
    cfg = SimConfig(max_num_seqs=seats, max_num_batched_tokens=budget, kv_capacity_tokens=memory.kv_capacity_tokens,
                    block_size=memory.block_size, overheads=_overheads(engine, mode),
                    policy=engine.scheduler if case.engine != "vllm" else SchedulerPolicy())
    n = requests or case.prompts
    load = Workload(input_len=inputs, output_len=outputs, num_requests=n, concurrency=min(case.concurrency, n),
                    seed=1)
    start = time.perf_counter()
    sim = simulate(step, cfg, load)
    return {"case": case, "fits": memory.fits, "kv_tokens": memory.kv_capacity_tokens, "sim": sim,
            "seconds": time.perf_counter() - start}


def silicon_points(name: str = "silicon_points.json") -> list[dict]:
    import json

    return json.loads((Path(__file__).parent / "validation" / name).read_text())


# aiconfigurator's generator (generator/backends/trtllm.py since its first release, 2025-09; rule_plugin/*.rule
# since 2025-12): an aggregated worker's token budget is its batch size + the prompt length + 1500, and its
# TensorRT-LLM configs leave enable_chunked_prefill at false. Its SGLang rule (rule_plugin/sglang.rule, from
# 2025-12-04) sets max_prefill_tokens to the prompt length + 1500, leaves chunked_prefill_size at its default and,
# from 2026-01-19 (aiconfigurator #257/#258), turns enable_mixed_chunk on; Dynamo carried SGLang 0.5.6.post2 from
# its 0.8 release (2026-01) and 0.5.1.post1 in 0.5 (2025-09), before the generator wrote SGLang settings.
GENERATED_BUDGET_SLACK = 1500
GENERATED_SGLANG_FROM = (0, 5, 6)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".post")[0].split(".")[:3] if part.isdigit())


def deployment_limits(point: dict, engine: EngineSpec, gpu: GPUSpec) -> tuple[int, int, SchedulerPolicy]:
    """(max_num_seqs, max_num_batched_tokens, scheduler policy) a run was served with: the engine's defaults, or,
    where aiconfigurator's generator wrote the settings (``deployment``: its gap analysis), the generator's -- a
    token budget of concurrency + prompt + 1500, rounded up to a whole 32-token KV block, TensorRT-LLM without
    chunked prefill, so a step takes a whole prompt or none; SGLang from 0.5.6 with mixed chunks and its prefill
    tokens capped at prompt + 1500 within its default chunk (earlier SGLang runs: its defaults). TensorRT-LLM runs
    whose settings are not recorded are replayed chunked, not with its default of whole prompts: NVIDIA's dated
    attention-data-parallel sweeps served 8,192-token prompts to 64-256 clients (8-32 a rank) with prompts arriving
    while others decode, which a whole-prompt step under the default 8,192-token max_num_tokens cannot hold beside
    a single decode (replayed whole, those runs fall from within -1 ... +36 % to -65 ... -76 %)."""
    seats, budget = scheduler_defaults(engine, gpu)
    policy = engine.scheduler
    if point.get("deployment") != "aiconfigurator":
        if point["engine"] == "trtllm":  # settings not recorded: chunked (see the docstring)
            policy = replace(policy, chunked_prefill=True)
        return seats, budget, policy
    clients = point.get("concurrency", point.get("batch"))
    if point["engine"] == "sglang":
        if _version(point.get("engine_version") or "0") < GENERATED_SGLANG_FROM:
            return seats, budget, policy
        cap = point["prompt"] + GENERATED_BUDGET_SLACK
        return max(seats, clients), budget, replace(policy, prefill_first=False, max_prefill_tokens=cap)
    tokens = clients + point["prompt"] + GENERATED_BUDGET_SLACK
    return (max(seats, clients), -(-tokens // 32) * 32,
            replace(policy, chunked_prefill=point["engine"] != "trtllm"))


def served(point: dict) -> tuple:
    """What a measured run served: (model spec, GPU, engine -- its latest preset, or the version the run names when a
    preset covers it --, weight precision, KV format). The run served a pre-quantized checkpoint: its format, its
    declared KV cache (where the engine follows it), calibrated (static) fp8 scales."""
    model = point["model"]
    spec = load_model(model) if not model.endswith((".yaml", ".json")) else _spec(model)
    name = point["engine"]
    version = (point.get("engine_version") or "").split(".post")[0]
    engine = load_engine(name)
    if version and name in ("vllm", "sglang"):
        try:
            engine = load_engine(f"{name}@{'.'.join(version.split('.')[:3])}")
        except Exception:  # noqa: BLE001 - no preset covers it: the latest
            engine = load_engine(name)
    spec = replace(spec, native_dtype=point["weights"], checkpoint_kv_dtype=point.get("checkpoint_kv"),
                   checkpoint_activation_scale="static")
    gpu = load_gpu(point["gpu"])
    kv = get_dtype(point["kv"]) if point.get("kv") else default_kv_dtype(spec, engine, gpu)
    return spec, gpu, engine, parse_weight_precision(point["weights"]), kv


def run_silicon(point: dict, mode: str = "full", requests_per_client: int = 6, phases: str = "lockstep",
                prefix_hit: float = 0.0) -> dict:
    """One measured serving run at concurrency ``batch``, fixed lengths, the engine's latest preset (or the version
    the run names when a preset covers it). ``phases``: every client sends its first request at once (``lockstep``,
    as the benchmark starts) or at a random time within one request's lifetime (``random``: clients out of step).
    ``prefix_hit``: the share of each prompt replayed as found in the prefix cache (0: every prompt computed)."""
    spec, gpu, engine, precision, kv = served(point)
    ranks = point.get("dp", 1)   # data-parallel attention ranks: all simulated, in lockstep, each its share of clients
    clients = point.get("concurrency", point.get("batch")) // ranks
    seats, budget, policy = deployment_limits({**point, "concurrency": clients}, engine, gpu)
    length = point["prompt"] + point["gen"]
    memory = replica_memory(spec, gpu, precision, kv, tp=point["tp"], pp=1, ep=point.get("ep", 1), engine=engine,
                            max_model_len=max(length, 2048), max_num_seqs=seats, max_num_batched_tokens=budget)
    step = latency_step(spec, gpu, precision, kv, tp=point["tp"], ep=point.get("ep", 1), engine=engine)
    cfg = SimConfig(max_num_seqs=seats, max_num_batched_tokens=budget, kv_capacity_tokens=memory.kv_capacity_tokens,
                    block_size=memory.block_size, overheads=_overheads(engine, mode), policy=policy)
    lifetime = 0.0   # one request's prefill and decode at the run's concurrency: the random phases' range
    if phases == "random":
        lifetime = (step.time(0, 0.0, point["prompt"], 0.0, 1)
                    + point["gen"] * step.time(clients, point["prompt"] + point["gen"] / 2, 0, 0.0, 0))
    load = Workload(input_len=LengthDist(kind="fixed", mean=point["prompt"]),
                    output_len=LengthDist(kind="fixed", mean=point["gen"]),
                    num_requests=clients * ranks * requests_per_client, concurrency=clients * ranks, seed=1,
                    start_spread_s=lifetime, prefix_hit_ratio=prefix_hit)
    sim = simulate(step, cfg, load, ranks=ranks)
    reported = closed_loop_tok_s(clients * ranks, point["gen"], point["ttft_ms"] / 1e3, point["tpot_ms"] / 1e3)
    return {"point": point, "sim": sim, "reported_tok_s": reported, "engine": engine.label, "fits": memory.fits}


def closed_loop_tok_s(clients: int, output_tokens: int, ttft_s: float, tpot_s: float) -> float:
    """Output tokens/s of ``clients`` closed-loop clients from the mean TTFT and TPOT (how the runs report it)."""
    return clients * output_tokens / (ttft_s + (output_tokens - 1) * tpot_s)


def _error(predicted: float, reported: float) -> str:
    return f"{(predicted / reported - 1) * 100:+.0f} %" if reported else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the docs/capacity.md table")
    parser.add_argument("--only", help="run the cases whose id contains this")
    parser.add_argument("--silicon", action="store_true", help="the aiconfigurator measured runs instead")
    parser.add_argument("--public", action="store_true",
                        help="the held-out runs (PUBLIC_CASES: vLLM, SGLang, TensorRT-LLM; issue 13)")
    parser.add_argument("--silicon-all", action="store_true",
                        help="every measured run at every concurrency (validation/silicon_runs.json), summarised")
    parser.add_argument("--silicon-dp", action="store_true",
                        help="the measured runs with data-parallel attention (validation/silicon_runs_dp.json)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes for --silicon-all")
    parser.add_argument("--save", help="--silicon-all: write every run's prediction to this JSON file")
    parser.add_argument("--phases", choices=("lockstep", "random"), default="lockstep",
                        help="--silicon-all: clients start at once, or out of step (the TTFT bracket's lower end)")
    parser.add_argument("--prefix-hit", type=float, default=0.0,
                        help="--silicon-all: replay every prompt with this share found in the prefix cache (a "
                             "diagnosis: the runs do not state one)")
    args = parser.parse_args()
    if args.silicon:
        _silicon(args.markdown)
        return
    if args.public:
        _public(args.markdown, args.only, args.jobs)
        return
    if args.silicon_all:
        if not 0 <= args.prefix_hit < 1:
            parser.error("--prefix-hit must be in [0, 1)")
        _silicon_all(args.markdown, args.jobs, args.only, args.save, args.phases, args.prefix_hit)
        return
    if args.silicon_dp:
        _silicon_dp(args.phases)
        return
    rows = []
    for case in CASES:
        if args.only and args.only not in case.id:
            continue
        full, plain = run(case), run(case, mode="latency")
        rows.append((case, full["sim"], plain["sim"], full))
        if not args.markdown:
            sim = full["sim"]
            print(f"{case.id:40s} out tok/s {sim.output_throughput:9.1f} (no API queue "
                  f"{plain['sim'].output_throughput:9.1f}) vs {case.reported_output_tok_s:9.1f} "
                  f"({_error(sim.output_throughput, case.reported_output_tok_s)}); TTFT "
                  f"{sim.metric('ttft', 0) * 1e3:9.1f} vs {case.reported_ttft_ms:9.1f} ms; TPOT "
                  f"{sim.metric('tpot', 0) * 1e3:7.2f} vs {case.reported_tpot_ms:7.2f} ms; preemptions "
                  f"{sim.preemptions}; {full['seconds']:.1f} s", flush=True)
    if args.markdown:
        print("| case | GPU x tp | prompts, concurrency | output tok/s reported | before | error | latency model | "
              "error | + API server | error | TTFT mean reported / predicted | TPOT mean reported / predicted |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for case, sim, plain, _ in rows:
            conc = "rate inf" if case.concurrency == case.prompts else f"concurrency {case.concurrency}"
            rep = case.reported_output_tok_s
            print(f"| {case.id} | {case.gpu} x {case.tp} | {case.prompts}, {conc} | {rep:,.0f} | "
                  f"{case.before_output_tok_s:,.0f} | {_error(case.before_output_tok_s, rep)} | "
                  f"{plain.output_throughput:,.0f} | {_error(plain.output_throughput, rep)} | "
                  f"{sim.output_throughput:,.0f} | {_error(sim.output_throughput, rep)} | "
                  f"{case.reported_ttft_ms:,.0f} / {sim.metric('ttft', 0) * 1e3:,.0f} ms | "
                  f"{case.reported_tpot_ms:.1f} / {sim.metric('tpot', 0) * 1e3:.1f} ms |")
        for label, values in (("before", [c.before_output_tok_s for c, _, _, _ in rows]),
                              ("latency model", [p.output_throughput for _, _, p, _ in rows]),
                              ("latency model + API server", [s.output_throughput for _, s, _, _ in rows])):
            errors = [abs(v / c.reported_output_tok_s - 1) for v, (c, _, _, _) in zip(values, rows, strict=True)]
            print(f"\n{label}: {sum(e <= 0.25 for e in errors)} of {len(rows)} cases within ±25 % on output "
                  f"throughput; median |error| {sorted(errors)[len(errors) // 2] * 100:.0f} %")


def _public(markdown: bool, only: str | None, jobs: int) -> None:
    """The held-out runs: predicted against reported output throughput, TTFT and TPOT (means), and the summary."""
    from multiprocessing import Pool

    cases = [c for c in PUBLIC_CASES if not only or only in c.id]
    with Pool(max(1, jobs)) as pool:
        results = pool.map(run, cases, chunksize=1)
    if markdown:
        print("| case | engine | GPU x tp | prompts, concurrency | output tok/s reported | predicted | error | "
              "TTFT mean reported / predicted | TPOT mean reported / predicted |")
        print("|---|---|---|---|---|---|---|---|---|")
    errors = []
    for case, r in zip(cases, results, strict=True):
        sim, rep = r["sim"], case.reported_output_tok_s
        errors.append(sim.output_throughput / rep - 1)
        conc = "rate inf" if case.concurrency == case.prompts else f"concurrency {case.concurrency}"
        cells = (case.id, f"{case.engine} {case.release}", f"{case.gpu} x {case.tp}", f"{case.prompts}, {conc}",
                 f"{rep:,.0f}", f"{sim.output_throughput:,.0f}", _error(sim.output_throughput, rep),
                 f"{case.reported_ttft_ms:,.0f} / {sim.metric('ttft', 0) * 1e3:,.0f} ms",
                 f"{case.reported_tpot_ms:.1f} / {sim.metric('tpot', 0) * 1e3:.1f} ms")
        print("| " + " | ".join(cells) + " |" if markdown else "  ".join(cells), flush=True)
    inside = sum(abs(e) <= 0.25 for e in errors)
    print(f"\n{inside} of {len(errors)} held-out runs within ±25 % on output throughput; median |error| "
          f"{statistics.median(abs(e) for e in errors) * 100:.0f} %, median error "
          f"{statistics.median(errors) * 100:+.0f} %")


def _silicon(markdown: bool) -> None:
    points = silicon_points()
    errors, tpot_errors, ttft_errors = [], [], []
    if markdown:
        print("| engine | model | GPU x tp | weights | in / out | output tok/s reported | predicted | error | "
              "TTFT reported / predicted | TPOT reported / predicted |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for point in points:
        r = run_silicon(point)
        sim, rep = r["sim"], r["reported_tok_s"]
        e = sim.output_throughput / rep - 1
        errors.append(abs(e))
        tpot_errors.append(abs(sim.metric("tpot", 0) * 1e3 / point["tpot_ms"] - 1))
        ttft_errors.append(abs(sim.metric("ttft", 0) * 1e3 / point["ttft_ms"] - 1))
        line = (f"| {r['engine']} | {point['model']} | {point['gpu']} x {point['tp']} | {point['weights']} | "
                f"{point['prompt']} / {point['gen']} | {rep:,.0f} | {sim.output_throughput:,.0f} | {e * 100:+.0f} % | "
                f"{point['ttft_ms']:,.0f} / {sim.metric('ttft', 0) * 1e3:,.0f} ms | "
                f"{point['tpot_ms']:.1f} / {sim.metric('tpot', 0) * 1e3:.1f} ms |")
        print(line if markdown else line.replace("|", " ").strip(), flush=True)
    n = len(errors)
    print(f"\n{sum(x <= 0.25 for x in errors)} of {n} runs within ±25 % on output throughput (median |error| "
          f"{sorted(errors)[n // 2] * 100:.0f} %); TPOT within ±25 %: {sum(x <= 0.25 for x in tpot_errors)}; TTFT "
          f"within ±25 %: {sum(x <= 0.25 for x in ttft_errors)}")


def _silicon_dp(phases: str = "lockstep") -> None:
    """The runs with data-parallel attention: every rank of tp GPUs simulated with its share of the clients (the
    ranks' experts shared at ep = dp, priced by the latency model at ep > tp), their steps in lockstep."""
    path = Path(__file__).parent / "validation" / "silicon_runs_dp.json"
    tpots, throughputs = [], []
    for point in json.loads(path.read_text()):
        r = _replay(point, phases)
        if not r["fits"]:
            print(f"{point['id']}: {r['reason']}")
            continue
        tpot, tok = r["predicted_tpot_ms"] / point["tpot_ms"] - 1, r["predicted_tok_s"] / r["reported_tok_s"] - 1
        tpots.append(tpot)
        throughputs.append(tok)
        print(f"{r['engine_label']} {point['model']} {point['gpu']} tp{point['tp']}·dp{point['dp']}·ep{point['ep']} "
              f"{point['prompt']} / {point['gen']} at {point['concurrency']} clients: TPOT {point['tpot_ms']:.1f} / "
              f"{r['predicted_tpot_ms']:.1f} ms ({tpot * 100:+.0f} %), output tok/s {tok * 100:+.0f} %", flush=True)
    n = len(tpots)
    print(f"\n{sum(abs(e) <= 0.25 for e in throughputs)} of {n} runs within ±25 % on output throughput (median "
          f"{statistics.median(throughputs) * 100:+.0f} %); TPOT within ±25 %: {sum(abs(e) <= 0.25 for e in tpots)} "
          f"(median {statistics.median(tpots) * 100:+.0f} %)")


def _replay(point: dict, phases: str = "lockstep", prefix_hit: float = 0.0) -> dict:
    """One run of silicon_runs.json: predicted throughput (the reported one's formula), TTFT and TPOT, or
    ``fits: False`` where tfcalc's memory model has no room for the run's KV cache."""
    clients = point["concurrency"]
    per_client = max(2, min(6, 768 // clients))   # 6 requests a client, at most ~768 in all (2 a client at 512)
    try:
        r = run_silicon(point, requests_per_client=per_client, phases=phases, prefix_hit=prefix_hit)
    except UsageError as exc:  # a configuration tfcalc rejects is a row of the table, with its reason
        return {**point, "fits": False, "reason": str(exc)}
    sim = r["sim"]
    if not r["fits"] or not sim.requests:
        return {**point, "fits": False, "reason": "no room for the KV cache"}
    ttft, tpot = sim.metric("ttft", 0), sim.metric("tpot", 0)
    return {**point, "fits": True, "engine_label": r["engine"], "reported_tok_s": r["reported_tok_s"],
            "predicted_tok_s": closed_loop_tok_s(clients, point["gen"], ttft, tpot),
            "predicted_ttft_ms": ttft * 1e3, "predicted_tpot_ms": tpot * 1e3}


def configuration(point: dict) -> tuple:
    """What a run's row says was served: engine, model, GPU, format, layout, lengths and concurrency."""
    return tuple(point[k] for k in ("engine", "model", "gpu", "weights", "checkpoint_kv", "tp", "ep", "prompt", "gen",
                                    "concurrency"))


def distinct_measurements(points: list[dict]) -> list[dict]:
    """One entry per measurement: rows of the same configuration and engine version with the same TTFT and TPOT are
    one benchmark that several data sets exported; ``sources`` lists them."""
    merged: dict[tuple, dict] = {}
    for p in points:
        key = (*configuration(p), p["engine_version"], p["ttft_ms"], p["tpot_ms"])
        if key in merged:
            merged[key]["sources"].append(p["source"])
        else:
            merged[key] = {**p, "sources": [p["source"]]}
    return list(merged.values())


def _disagreements(rows: list[dict], markdown: bool) -> None:
    """Configurations measured more than once with different results: where the TPOTs' ratio exceeds 1.25 / 0.75,
    no single prediction is within ±25 % of both, whatever the model."""
    by_config: dict[tuple, list[dict]] = {}
    for r in rows:
        by_config.setdefault(configuration(r), []).append(r)
    repeated = {k: v for k, v in by_config.items() if len(v) > 1}
    spread = {k: max(r["tpot_ms"] for r in v) / min(r["tpot_ms"] for r in v) for k, v in repeated.items()}
    apart = sorted((k for k, x in spread.items() if x > 1.25 / 0.75), key=lambda k: -spread[k])
    print(f"\nthe same configuration measured more than once: {len(repeated)} configurations; their TPOTs differ by "
          f"more than 1.25 / 0.75 (no prediction within ±25 % of both) in {len(apart)}:")
    if markdown and apart:
        print("| engine | model | GPU | tp / ep | in / out | concurrency | TPOT measured (engine version, data set) "
              "|\n|---|---|---|---|---|--:|---|")
    for k in apart:
        engine, model, gpu, _, _, tp, ep, prompt, gen, conc = k
        runs = sorted(repeated[k], key=lambda r: r["tpot_ms"])
        measured = ", ".join(f"{r['tpot_ms']:.2f} ms ({r['engine_version'] or '?'}, {'; '.join(r['sources'])})"
                             for r in runs)
        cells = (engine, Path(model).name.removesuffix(".yaml"), gpu, f"{tp} / {ep}", f"{prompt} / {gen}",
                 str(conc), measured)
        print("| " + " | ".join(cells) + " |" if markdown else "  " + "  ".join(cells))


def prompt_peak_share(point: dict) -> float:
    """The share of the run's GPUs' dense datasheet peak that its prompts' matrix products alone need: measured
    requests/s x prompt tokens x 2 x the active parameters outside the embedding and lm_head, over tp GPUs' peak in
    the weights' narrowest format (fp4 for any fp4 weights, fp8 for fp8). Attention, decode and every overhead come
    on top, so a share near the engines' best GEMM efficiency means prompts the engine did not compute."""
    spec, gpu, *_ = served(point)
    counts = count_params(spec)
    linear = sum(p.total for name, p in counts.active.items() if name not in ("embedding", "lm_head"))
    weights = point["weights"]
    peak = gpu.peak_flops("fp4" if "fp4" in weights else "fp8" if "fp8" in weights else "bf16")[1]
    requests_per_s = closed_loop_tok_s(point["concurrency"], point["gen"], point["ttft_ms"] / 1e3,
                                       point["tpot_ms"] / 1e3) / point["gen"]
    return requests_per_s * point["prompt"] * 2 * linear / (peak * point["tp"] * point.get("dp", 1))


def _prompt_work(points: list[dict]) -> None:
    """Per engine and data set, the largest share of the dense peak that the measured prompts need."""
    shares: dict[str, list[float]] = {}
    for p in points:
        shares.setdefault(f"{p['engine']} {p['source']}", []).append(prompt_peak_share(p))
    print("\nthe prompts' matrix products alone, at the measured rate, as a share of the dense datasheet peak "
          "(largest; runs above 0.5):")
    for label in sorted(shares, key=lambda k: -max(shares[k])):
        values = shares[label]
        print(f"  {label}  {max(values):.2f}  {sum(v > 0.5 for v in values)} of {len(values)}")


def _bucket(concurrency: int) -> str:
    for top, label in ((4, "1-4"), (8, "5-8"), (32, "9-32"), (128, "33-128")):
        if concurrency <= top:
            return label
    return "129-512"


def _silicon_all(markdown: bool, jobs: int, only: str | None, save: str | None, phases: str,
                 prefix_hit: float = 0.0) -> None:
    import json
    from functools import partial
    from multiprocessing import Pool

    points = distinct_measurements([p for p in silicon_points("silicon_runs.json") if not only or only in p["id"]])
    start = time.perf_counter()
    with Pool(max(1, jobs)) as pool:
        rows = pool.map(partial(_replay, phases=phases, prefix_hit=prefix_hit), points, chunksize=8)
    if save:
        Path(save).write_text(json.dumps(rows))
    ran = [r for r in rows if r["fits"]]
    reasons: dict[str, int] = {}
    for r in rows:
        if not r["fits"]:
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    print(f"{sum(len(r['sources']) for r in rows)} rows, {len(rows)} distinct measurements, replayed in "
          f"{time.perf_counter() - start:.0f} s; left out below, as tfcalc rejects them: "
          f"{', '.join(f'{n} ({why})' for why, n in reasons.items()) or 'none'}")
    _disagreements(rows, markdown)
    _prompt_work(points)

    def line(label: str, group: list[dict]) -> str:
        def within(key: str, ref: str) -> str:
            errors = sorted(r[key] / r[ref] - 1 for r in group)
            inside = sum(abs(e) <= 0.25 for e in errors)
            return f"{inside} ({100 * inside / len(group):.0f} %), median {errors[len(errors) // 2] * 100:+.0f} %"
        cells = (label, str(len(group)), within("predicted_tok_s", "reported_tok_s"),
                 within("predicted_tpot_ms", "tpot_ms"), within("predicted_ttft_ms", "ttft_ms"))
        return "| " + " | ".join(cells) + " |" if markdown else "  ".join(cells)

    header = ("group", "runs", "throughput within ±25 %", "TPOT within ±25 %", "TTFT within ±25 %")
    # each group's labels for a run; a measurement that two data sets both hold counts in each data set's row
    for title, labels in (("engine, model",
                           lambda r: [f"{r['engine']} {Path(r['model']).name.removesuffix('.yaml')}"]),
                          ("concurrency", lambda r: [_bucket(r["concurrency"])]),
                          ("data set", lambda r: sorted(set(r["sources"])))):
        groups: dict[str, list[dict]] = {}
        for r in ran:
            for label in labels(r):
                groups.setdefault(label, []).append(r)
        print(f"\nby {title}:")
        if markdown:
            print("| " + " | ".join(header) + " |\n|---|--:|---|---|---|")
        for label in sorted(groups, key=lambda g: (int(g.split("-")[0]), g) if g[0].isdigit() else (0, g)):
            print(line(label, groups[label]))
        print(line("all", ran))


if __name__ == "__main__":
    main()
