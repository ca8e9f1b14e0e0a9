"""DeepSeek Sparse Attention per engine and GPU from aiconfigurator's measured tables: the ``kernels.dsa_*`` values
of presets/engines/*.yaml.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install aiconfigurator``;
its kernel tables ship in the package) and run

    python benchmarks/validation/dsa_kernel_rates.py [--heads 16]

Each engine's newest tables (aiconfigurator_core/systems/data/<gpu>/sparse_attention/<engine>/<version>/
dsa_{context,generation}_module_perf) time DeepSeek-V3.2's whole attention block (projections, the lightning
indexer, the sparse MLA, o_proj) with a bf16 cache at many batch sizes, lengths and head counts per GPU. Printed per
engine and GPU, for ``--heads`` query heads per GPU (DeepSeek-V3.2 at tp 8):

- ``decode``: the median of the one-sequence rows at contexts up to 512 (the block's fixed cost per layer:
  ``kernels.dsa_block_floors_us.<gpu>.decode``);
- ``prefill``: the median of the one-sequence rows of at most 16 tokens (``...prefill``);
- ``efficiency``: the fraction of the dense bf16 peak at which the sparse MLA prefill (on its padded heads' FLOPs)
  makes tfcalc's attention block of one layer (``latency.step_time``'s attention group of the row's prefill of
  DeepSeek-V3.2 at tp 8, fp8 weights, bf16 cache, over 61 layers; projections, indexer and floor included as
  tfcalc prices them) take the table's time: the median of tfcalc / measured over the rows of prompts longer than
  the top-k (the sparse path everywhere) and under 65,536 tokens per step, any batch, set to 1 by bisection
  (``kernels.dsa_prefill_efficiency``);
- ``full slots``: whether the time per prompt token is flat in the prompt's length below the top-k (each query's
  kernel runs all top-k slots, the invalid ones included): 8 prompts of 512 tokens take, beyond the prefill floor,
  over 0.8 of the time of one prompt of 4,096 (the same tokens; a kernel that skips the invalid slots does a
  quarter of the work).

With ``--check`` it then prices, with the engine presets' values, every prefill row the fit left out (GLM-5's too, at
its own 8 heads per GPU, 32 indexer heads and 256-wide values) and every decode row, and prints the median tfcalc /
measured per engine, GPU, model and band of tokens per step: what is left is shape dependence the model lacks.
"""

from __future__ import annotations

import argparse
import glob
import statistics
from pathlib import Path

GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
TOPK = 2048  # DeepSeek-V3.2's index_topk
ENGINES = ("vllm", "sglang", "trtllm")


def _table(root: Path, system: str, engine: str, phase: str, model: str = "V3.2"):  # -> pandas.DataFrame | None
    import pandas as pd

    tables = sorted(glob.glob(str(root / system / "sparse_attention" / engine / "*" /
                                  f"dsa_{phase}_module_perf.parquet")))
    if not tables:
        return None
    d = pd.read_parquet(tables[-1])
    d = d[d.model.str.contains(model, regex=False) & (d.kv_cache_dtype == "bfloat16")]
    if "fp8_block" in set(d.gemm_type):
        d = d[d.gemm_type == "fp8_block"]
    return d


def _fit(gpu_name: str, engine: str, rows: list[tuple[int, int, float]], decode_us: float, prefill_us: float,
         full: bool) -> float:
    """The sparse prefill efficiency at which tfcalc's attention block per layer matches the rows (median ratio 1)."""
    from dataclasses import replace

    from tfcalc.calc.latency import StepShape, deployment, step_time
    from tfcalc.dtypes import get_dtype, parse_weight_precision
    from tfcalc.spec.hf_config import load_hf_config
    from tfcalc.spec.presets import load_engine, load_gpu

    spec = load_hf_config(Path(__file__).parent / "models" / "deepseek-v3.2.json")
    preset = {"vllm": "vllm-0.21", "sglang": "sglang-0.5", "trtllm": "trtllm-1.0"}[engine]
    base = load_engine(preset).kernels
    if not rows:
        return float("nan")

    def ratio(eff: float) -> float:
        kernels = replace(base, dsa_prefill_efficiency_by_gpu={gpu_name: eff},
                          dsa_block_floors_by_gpu={gpu_name: {"decode": decode_us * 1e-6,
                                                              "prefill": prefill_us * 1e-6}},
                          dsa_prefill_full_topk_by_gpu=frozenset({gpu_name} if full else ()),
                          dsa_prefill_head_tile_by_gpu=base.dsa_prefill_head_tile_by_gpu)
        d = deployment(spec, load_gpu(gpu_name), parse_weight_precision("fp8_block"), get_dtype("bf16"), tp=8,
                       engine_kernels=kernels)
        got = [step_time(d, StepShape(prefill_seqs=int(b), prefill_tokens=int(n)), "prefill").groups["attention"]
               .seconds / spec.num_layers / (ms * 1e-3) for b, n, ms in rows]
        return statistics.median(got)

    lo, hi = 0.02, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ratio(mid) < 1 else (mid, hi)
    return (lo + hi) / 2


def _check(root: Path) -> None:
    """tfcalc's attention block per layer against every dsa module row, with the engine presets' values."""
    from tfcalc.calc.latency import StepShape, deployment, step_time
    from tfcalc.dtypes import get_dtype, parse_weight_precision
    from tfcalc.spec.hf_config import load_hf_config
    from tfcalc.spec.presets import load_engine, load_gpu

    models = {"deepseek-ai/DeepSeek-V3.2": ("deepseek-v3.2.json", 16), "zai-org/GLM-5": ("glm-5.json", 8)}
    presets = {"vllm": "vllm-0.21", "sglang": "sglang-0.5", "trtllm": "trtllm-1.0"}
    print(f"{'engine':7s} {'gpu':9s} {'model':14s} {'phase':8s} {'tokens':>13s} {'rows':>5s} {'tfcalc/measured':>16s}")
    for engine in ENGINES:
        for system, gpu_name in GPUS.items():
            for model, (config, heads) in models.items():
                spec = load_hf_config(Path(__file__).parent / "models" / config)
                kernels = load_engine(presets[engine]).kernels
                d = deployment(spec, load_gpu(gpu_name), parse_weight_precision("fp8_block"), get_dtype("bf16"),
                               tp=spec.num_attention_heads // heads, engine_kernels=kernels)
                for phase in ("context", "generation"):
                    t = _table(root, system, engine, phase, model)
                    if t is None or not len(t):
                        continue
                    t = t[(t.num_heads == heads) & ((t.step == 0) if phase == "context" else (t.step > 0))]
                    bands: dict[str, list[float]] = {}
                    for b, n, step, ms in zip(t.batch_size, t.isl, t.step, t.latency, strict=True):
                        if phase == "context":
                            shape, tokens = StepShape(prefill_seqs=int(b), prefill_tokens=int(n)), int(b * n)
                        else:
                            shape, tokens = StepShape(decode_seqs=int(b), decode_context=float(step)), int(b)
                        got = step_time(d, shape, "prefill" if phase == "context" else "decode")
                        if phase == "context":
                            band = "<4K" if tokens < 4096 else "4K-64K" if tokens < 65536 else "64K+"
                        else:
                            band = "1-16" if tokens <= 16 else "17-128" if tokens <= 128 else "129+"
                        bands.setdefault(band, []).append(got.groups["attention"].seconds / spec.num_layers
                                                          / (ms * 1e-3))
                    for band, ratios in bands.items():
                        print(f"{engine:7s} {gpu_name:9s} {config[:-5]:14s} {phase[:8]:8s} {band:>13s} "
                              f"{len(ratios):5d} {statistics.median(ratios):16.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=16, help="query heads per GPU (default 16: V3.2 at tp 8)")
    parser.add_argument("--check", action="store_true", help="then price every row with the presets' values")
    args = parser.parse_args()
    import aiconfigurator_core

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    print(f"{'engine':7s} {'gpu':9s} {'decode us':>9s} {'prefill us':>10s} {'efficiency':>10s} {'full slots':>10s}"
          "  rows")
    for engine in ENGINES:
        for system, gpu_name in GPUS.items():
            ctx, gen = _table(root, system, engine, "context"), _table(root, system, engine, "generation")
            if ctx is None or gen is None:
                continue
            one = gen[(gen.batch_size == 1) & (gen.step <= 512) & (gen.num_heads == args.heads)]
            if not len(one):
                continue
            decode = statistics.median(one.latency) * 1e3
            every = ctx[(ctx.step == 0) & (ctx.num_heads == args.heads)]
            c = every[every.batch_size == 1]
            short = c[c.isl <= 16]
            prefill = statistics.median(short.latency) * 1e3 if len(short) else float("nan")
            eight = every[(every.batch_size == 8) & (every.isl == 512)].latency
            whole = c[c.isl == 4096].latency
            full = bool(len(eight) and len(whole)
                        and (eight.min() - prefill / 1e3) / (whole.min() - prefill / 1e3) > 0.8)
            tokens = every.batch_size * every.isl
            long = every[(every.isl > TOPK) & (tokens < 65536)]
            eff = _fit(gpu_name, engine, list(zip(long.batch_size, long.isl, long.latency, strict=True)), decode,
                       prefill, full)
            print(f"{engine:7s} {gpu_name:9s} {decode:9.0f} {prefill:10.0f} {eff:10.3f} {str(full):>10s}  "
                  f"{len(one)}/{len(short)}/{len(long)}")
    if args.check:
        _check(root)


if __name__ == "__main__":
    main()
