"""How `tfcalc plan`'s work grows: plan rows per second in a sweep, a model of 10^6 layers, and --min-gpus with
an upper bound of 10^9 GPUs, each with every engine memory model. Targets: >= 1,000 rows/s for llama3-70b on
the default engine; the 10^6-layer plan and the 10^9-GPU search under 1 s each (calculation only, no CLI start).

Usage: python benchmarks/plan_scale.py
"""

from __future__ import annotations

import time

from tfcalc.calc.plan import PlanConfig, min_gpus, plan_fit
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.presets import load_engine, load_gpu, load_model


def timed(label: str, work, repeat: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        work()
    seconds = (time.perf_counter() - start) / repeat
    print(f"{label:<60} {seconds * 1e3:9.2f} ms")
    return seconds


def main() -> None:
    gpu, bf16, kv = load_gpu("h100-sxm"), parse_weight_precision("bf16"), get_dtype("bf16")
    spec = load_model("llama3-70b")
    for name in ("vllm", "vllm@0.19", "sglang", "trtllm", "ideal"):
        engine = None if name == "ideal" else load_engine(name)
        cfg = PlanConfig(num_gpus=4, tp=4, context=32768, batch=8, engine=engine)
        seconds = timed(f"plan llama3-70b tp 4 ({name}), one row", lambda c=cfg: plan_fit(spec, gpu, bf16, kv, c), 200)
        print(f"{'':<60} {1 / seconds:9.0f} rows/s")
    huge = load_model("llama3-8b").with_overrides(layers=10_000)  # the spec's layer limit
    engine = load_engine("vllm")
    timed("plan a 10^4-layer model, pp 64 (vllm)", lambda: plan_fit(
        huge, gpu, bf16, kv, PlanConfig(num_gpus=64, pp=64, context=4096, engine=engine)))
    timed("--min-gpus llama3-70b batch 64 at 128k, max 10^9 GPUs", lambda: min_gpus(
        spec, gpu, bf16, kv, PlanConfig(num_gpus=1, context=131072, batch=64, engine=engine), max_gpus=10**9))
    timed("--min-gpus llama3.1-405b batch 10^5 at 128k, max 10^9 GPUs", lambda: min_gpus(
        load_model("llama3.1-405b"), gpu, bf16, kv,
        PlanConfig(num_gpus=1, context=131072, batch=100_000, engine=engine), max_gpus=10**9))


if __name__ == "__main__":
    main()
