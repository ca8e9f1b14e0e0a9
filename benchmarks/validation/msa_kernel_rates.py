"""MiniMax-M3's sparse attention (MSA) from aiconfigurator 0.12's msa_{context,generation}_module tables: TensorRT-LLM's
``msa_decode`` / ``msa_prefill`` block floors (``dsa_block_floors_us``) and ``msa_fp32_expansion`` fractions
(presets/engines/trtllm-1.0.yaml), SGLang's ``msa_prefill`` floor (presets/engines/sglang-0.5.10.yaml). Run with
aiconfigurator installed:

    python benchmarks/validation/msa_kernel_rates.py

A table row times one MSA layer on one GPU (projections, block indexer, top-k, sparse GQA; collector/trtllm/
collect_msa_module.py, CUDA graphs but for the SM100 prefill) at 8 or 16 query heads per GPU (the 64-head model at
tp 8 / tp 4), bf16 GEMMs on the H200, NVFP4 on the B200:

- floors: the median of the one-sequence rows at contexts up to 512 (decode) and of the one-sequence prompts of at
  most 16 tokens (prefill);
- on the H200 (kernel_source "default": the Triton path, sparse/minimax_m3/triton_backend.py, per-query FP32 copies
  of every key) the fraction of the datasheet bandwidth at which ``kernels.msa_fp32_expansion_bytes`` move: the
  slope of the rows' time beyond the floor against those bytes (least squares through the origin, the fixed cost
  + slope of dsa_block_floors' decode) over rows of 1-64 sequences at 1,024-16,384 tokens; the rows' own fractions
  (median, 10th and 90th percentile) beside it.

SGLang 0.5.16 (kernel_source sglang_minimax_prefill_triton_sparse on both GPUs, timed eagerly as its prefill runs):
the median of its one-sequence prompts of at most 16 tokens, bf16, 8 and 16 heads per GPU (tp 8 and 4).

The B200's TensorRT-LLM context rows (kernel_source msa_fmha_sm100, timed eagerly) are printed to show they are no
function of the work (docs/estimate-validation.md); no prefill rate is taken from them.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tfcalc.calc.kernels import msa_fp32_expansion_bytes  # noqa: E402

VERSION = "1.3.0rc23"
HEADS = (8, 16)  # per GPU: the 64-head model at tp 8 and tp 4
GEMM = {"h200_sxm": "bfloat16", "b200_sxm": "nvfp4"}
BANDWIDTH = {"h200_sxm": 4.8e12}  # presets/gpus/h200.yaml hbm_bandwidth
KV_GROUP, INDEX_HEADS, INDEX_DIM, HEAD_DIM = 16, 4, 128, 128  # MiniMax-M3: 64 / 4 heads, a 4-head indexer of 128


def _table(system: str, phase: str, engine: str = "trtllm", version: str = VERSION):  # noqa: ANN202 - a DataFrame
    import aiconfigurator_core
    import pandas as pd

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    df = pd.read_parquet(root / system / "msa" / engine / version / f"msa_{phase}_module_perf.parquet")
    gemm = GEMM[system] if engine == "trtllm" else "bfloat16"
    df = df[(df.gemm_type == gemm) & (df.kv_cache_dtype == "bfloat16") & df.num_heads.isin(HEADS)]
    return df[df.step == 0] if phase == "context" else df


def floors(system: str) -> dict[str, float]:
    """Microseconds: the block's fixed cost per phase (module docstring)."""
    gen, ctx = _table(system, "generation"), _table(system, "context")
    out = {"msa_decode": 1e3 * statistics.median(gen[(gen.batch_size == 1) & (gen.step <= 512)].latency)}
    if system in BANDWIDTH:
        out["msa_prefill"] = 1e3 * statistics.median(ctx[(ctx.batch_size == 1) & (ctx.isl <= 16)].latency)
    return out


def expansion(system: str) -> dict[str, tuple[float, float, float, float]]:
    """Per phase: the slope's fraction of the datasheet bandwidth, then the rows' median, 10th and 90th percentile
    (module docstring)."""
    fixed = floors(system)
    out = {}
    for phase, key in (("context", "msa_prefill"), ("generation", "msa_decode")):
        df = _table(system, phase)
        fractions, points = [], []
        for r in df.itertuples():
            keys = r.isl if phase == "context" else r.step + 1
            if not (r.batch_size <= 64 and 1024 <= keys <= 16384):
                continue
            queries = r.batch_size * (r.isl if phase == "context" else 1)
            kv = max(1, r.num_heads // KV_GROUP)
            nbytes = msa_fp32_expansion_bytes(seqs=r.batch_size, queries=queries, keys=keys, kv_heads=kv,
                                              q_heads=r.num_heads, head_dim=HEAD_DIM, index_heads=INDEX_HEADS,
                                              index_dim=INDEX_DIM)
            seconds = (r.latency - fixed[key] / 1e3) / 1e3
            fractions.append(nbytes / seconds / BANDWIDTH[system])
            points.append((nbytes, seconds))
        slope = sum(b * b for b, _ in points) / sum(b * t for b, t in points) / BANDWIDTH[system]
        q = statistics.quantiles(fractions, n=10)
        out["prefill" if phase == "context" else "decode"] = (slope, statistics.median(fractions), q[0], q[-1])
    return out


def sglang_prefill_floor(system: str) -> float:
    """Microseconds: SGLang 0.5.16's MSA prefill block at its fewest tokens (module docstring)."""
    ctx = _table(system, "context", "sglang", "0.5.16")
    return 1e3 * statistics.median(ctx[(ctx.batch_size == 1) & (ctx.isl <= 16)].latency)


def main() -> None:
    for system in GEMM:
        print(system, f"SGLang 0.5.16 msa_prefill {sglang_prefill_floor(system):.1f} us")
        print(system, {k: round(v, 1) for k, v in floors(system).items()}, "us")
        if system in BANDWIDTH:
            for phase, (slope, med, lo, hi) in expansion(system).items():
                print(f"  {phase}: {slope:.2f} of the datasheet bandwidth (rows: median {med:.2f}, 10-90 % "
                      f"{lo:.2f}-{hi:.2f})")
    ctx = _table("b200_sxm", "context")
    one = ctx[(ctx.num_heads == 16)].pivot_table(index="isl", columns="batch_size", values="latency")
    print("b200_sxm msa_context_module, 16 heads, ms (rows: prompt tokens, columns: sequences):")
    print(one.iloc[:, :4].round(1).to_string())


if __name__ == "__main__":
    main()
