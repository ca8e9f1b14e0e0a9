"""How one GPU's measured kernel tables compare with another's, op table by op table: the evidence behind a GPU
preset whose latency block borrows a measured part's fractions (``latency.measured_on``) and behind what it
measures on its own tables (presets/gpus/b300.yaml: the B300 against the B200).

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install
aiconfigurator==0.12.0``; it brings pandas and pyarrow) and run

    python benchmarks/validation/gpu_tables_compare.py [--gpu b300_sxm] [--base b200_sxm]

For every engine's GEMM, fused-MoE and attention tables that both GPUs have (the same engine version), the rows of
the same shape are matched and the median time ratio (GPU / base, quartiles) is printed per weight or KV format and
band of M (tokens, prompt length or batch). Then the GPU presets' ``attention_efficiency`` method on each: vLLM's
flash-attention prefill at 16,384 tokens, batch 1, head dim 128, bf16 cache, no sliding window: median over head
counts of causal FLOPs (4 x heads x 128 x isl^2 / 2) / time / the bf16 peak. Then the host path of vLLM's
block-fp8 linear layers, which aiconfigurator's collector times without CUDA graphs (the vllm preset's
``kernels.linear_host_us``): the median over the rows with N x K <= 8192^2 at M = 1, and at 2 <= M <= 2,048 apart for
M not a multiple of 4 and a multiple of 4 (DeepGEMM's scale alignment).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from validate import AIC_GPU  # noqa: E402 - aiconfigurator's system -> tfcalc's GPU preset

BANDS = (0, 8, 64, 512, 4096, 10**9)
# (op folder, table file, the column that sizes a row, the column that names its format)
TABLES = (("gemm", "gemm_perf.parquet", "m", "gemm_dtype"),
          ("moe", "moe_perf.parquet", "num_tokens", "moe_dtype"),
          ("attention", "context_attention_perf.parquet", "isl", "kv_cache_dtype"),
          ("attention", "generation_attention_perf.parquet", "batch_size", "kv_cache_dtype"))


def compare(data: Path, gpu: str, base: str) -> None:
    import pandas as pd

    for folder, table, size, fmt in TABLES:
        for engine_dir in sorted((data / gpu / folder).glob("*")):
            for version_dir in sorted(engine_dir.glob("*")):
                theirs = data / base / folder / engine_dir.name / version_dir.name / table
                ours = version_dir / table
                if not (ours.exists() and theirs.exists()):
                    continue
                a, b = pd.read_parquet(theirs), pd.read_parquet(ours)
                keys = [c for c in a.columns if c not in ("latency", "device", "framework", "version", "energy",
                                                           "op_name") and not c.startswith("power")]
                rows = a.merge(b, on=keys, suffixes=("_base", "_gpu"))
                if rows.empty:
                    continue
                rows["ratio"] = rows["latency_gpu"] / rows["latency_base"]
                rows["band"] = pd.cut(rows[size], BANDS)
                print(f"{folder}/{engine_dir.name}/{version_dir.name} {table}: {len(rows):,} shared rows, "
                      f"{gpu} / {base} time by {fmt} and {size}")
                for (name, band), d in rows.groupby([fmt, "band"], observed=True):
                    print(f"  {name:<18} {size} {str(band):<18} {len(d):>6,}  median {d.ratio.median():.2f}  "
                          f"quartiles {d.ratio.quantile(0.25):.2f}-{d.ratio.quantile(0.75):.2f}")


def attention_efficiency(data: Path, system: str) -> float:
    import pandas as pd

    from tfcalc.spec.presets import load_gpu

    rows = pd.read_parquet(data / system / "attention" / "vllm" / "0.24.0" / "context_attention_perf.parquet")
    rows = rows[(rows.head_dim == 128) & (rows.batch_size == 1) & (rows.kv_cache_dtype == "bfloat16")
                & (rows.isl == 16384) & (rows.window_size == 0)]
    peak = load_gpu(AIC_GPU[system]).dense_flops_per_s["bf16"]
    rows = rows.assign(eff=4 * rows.num_heads * 128 * rows.isl ** 2 / 2 / (rows.latency * 1e-3) / peak)
    return float(rows.eff.median())


def host_path_us(data: Path, system: str) -> tuple[float, float, float]:
    """vLLM 0.24's block-fp8 rows on ``system`` (microseconds): the median at M = 1, at 2 <= M <= 2,048 with M not a
    multiple of 4, and with M a multiple of 4, over N x K <= 8192^2 (flat there: the host path, not the GEMM)."""
    import pandas as pd

    rows = pd.read_parquet(data / system / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet")
    rows = rows[(rows.gemm_dtype == "fp8_block") & (rows.n * rows.k <= 8192 ** 2) & (rows.m <= 2048)]
    us = rows.latency * 1e3
    return (float(us[rows.m == 1].median()), float(us[(rows.m >= 2) & (rows.m % 4 != 0)].median()),
            float(us[(rows.m >= 2) & (rows.m % 4 == 0)].median()))


def main() -> None:
    import aiconfigurator_core

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="b300_sxm", choices=sorted(AIC_GPU))
    parser.add_argument("--base", default="b200_sxm", choices=sorted(AIC_GPU))
    args = parser.parse_args()
    data = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    compare(data, args.gpu, args.base)
    for system in (args.base, args.gpu):
        print(f"attention_efficiency method on {system}: {attention_efficiency(data, system):.3f}")
        one, unaligned, aligned = host_path_us(data, system)
        print(f"vLLM block-fp8 host path on {system}: M = 1 {one:.1f} us, M >= 2 {unaligned:.1f} us (M not a multiple "
              f"of 4) / {aligned:.1f} us (a multiple of 4)")


if __name__ == "__main__":
    main()
