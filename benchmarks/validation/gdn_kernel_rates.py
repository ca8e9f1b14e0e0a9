"""Gated DeltaNet kernels per engine and GPU from aiconfigurator's measured tables: the ``kernels.gdn_efficiency``
values of presets/engines/*.yaml, and a check of tfcalc's decode pricing of the recurrence.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install aiconfigurator``;
its kernel tables ship in the package) and run

    python benchmarks/validation/gdn_kernel_rates.py [--min-tokens 4096] [--held-out 512]

Each engine's newest table (aiconfigurator_core/systems/data/<gpu>/linear_attention/<engine>/<version>/gdn_perf)
times the kernels it runs for Qwen3.5's Gated DeltaNet layers at many batch sizes, lengths and head counts: the
chunked prefill (vLLM 0.24: FlashInfer's chunk_gated_delta_rule; SGLang 0.5.14 and TensorRT-LLM 1.3: the
flash-linear-attention chunk kernels) and the one-token recurrence of decode. Prefill: for the rows with at least
``--min-tokens`` tokens, the fraction of the GPU's dense bf16 peak the kernel reaches on the FLOPs tfcalc counts
(``kernels.gated_delta_rule``: 6 dk dv + 4 C (dk + dv) per token and value head): the value that makes the median of
tfcalc / measured 1 over the table's shapes, found by bisection with the kernel priced whole (floor and memory term
included): what ``kernels.gdn_efficiency`` takes. The floors printed are the medians of the rows at <= 8 tokens
(prefill, 16 value heads or fewer) and of the one-sequence decode rows: ``kernels.floors_us.gdn_prefill`` and
``gdn_decode``. With ``--held-out N`` the rows of N to --min-tokens tokens (left out of the fit) are priced at the
engine preset's values and the median tfcalc / measured is printed per GPU and by value-head count (what is left is
shape dependence the model does not have). Decode: the rows at 1-512 sequences priced by the same function with the
GPU preset's rates and the tables' float32 states (Qwen3.5's mamba_ssm_dtype), tfcalc / measured by batch band.
"""

from __future__ import annotations

import argparse
import glob
import statistics
from pathlib import Path

GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
ENGINES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm"}
STATE_BYTES = 4  # the tables time Qwen3.5 checkpoints: float32 recurrent state (mamba_ssm_dtype)
ACT_BYTES = 2


def _table(root: Path, system: str, engine: str):  # -> pandas.DataFrame | None
    import pandas as pd

    tables = sorted(glob.glob(str(root / system / "linear_attention" / engine / "*" / "gdn_perf.parquet")))
    return (pd.read_parquet(tables[-1]), Path(tables[-1]).parent.name) if tables else (None, "")


def _flops_per_token_head(dk: int, dv: int) -> float:
    from tfcalc.calc.kernels import GDN_CHUNK

    return 6.0 * dk * dv + 4.0 * GDN_CHUNK * (dk + dv)


def _price(rates, row, decode: bool) -> float:  # noqa: ANN001 - a Rates and a table row
    from tfcalc.calc import kernels

    heads, dk, dv = int(row.num_v_heads), int(row.head_k_dim), int(row.head_v_dim)
    seqs, tokens = int(row.batch_size), int(row.num_tokens)
    io = tokens * (2 * int(row.num_k_heads) * dk + 2 * heads * dv) * ACT_BYTES
    return kernels.gated_delta_rule(rates, seqs=seqs, tokens=tokens, heads=heads, key_dim=dk, value_dim=dv,
                                    state_bytes=heads * dk * dv * STATE_BYTES, io_bytes=io, decode=decode).seconds


def _fit(rates, rows) -> float:  # noqa: ANN001 - a Rates and table rows
    """The gdn_efficiency at which the median of tfcalc / measured over ``rows`` is 1 (bisection in log space)."""
    from dataclasses import replace

    low, high = 1e-3, 1.0
    for _ in range(40):
        mid = (low * high) ** 0.5
        priced = replace(rates, gdn_efficiency=mid)
        ratio = statistics.median(_price(priced, r, False) / (r.latency * 1e-3) for r in rows)
        low, high = (mid, high) if ratio > 1 else (low, mid)
    return (low * high) ** 0.5


def main() -> None:
    import aiconfigurator_core

    from tfcalc.calc.latency import rates_for
    from tfcalc.spec.presets import load_engine, load_gpu

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-tokens", type=int, default=4096)
    parser.add_argument("--held-out", type=int, default=0, help="price rows of N to --min-tokens tokens")
    args = parser.parse_args()
    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    for engine in ENGINES:
        kernels_of = load_engine(ENGINES[engine]).kernels
        for system, preset in GPUS.items():
            df, version = _table(root, system, engine)
            if df is None:
                continue
            gpu = load_gpu(preset)
            rates = rates_for(gpu, kernels_of)
            peak = gpu.peak_flops("bf16")[1]
            prefill = df[(df.phase == "context") & df.kernel_source.str.contains("chunk_gated_delta_rule")]
            big = prefill[prefill.num_tokens >= args.min_tokens]
            achieved = [r.num_tokens * r.num_v_heads * _flops_per_token_head(r.head_k_dim, r.head_v_dim)
                        / (r.latency * 1e-3) / peak for r in big.itertuples()]
            kernel = sorted(set(prefill.kernel_source))
            small = prefill[(prefill.num_tokens <= 8) & (prefill.num_v_heads <= 16)]
            one = df[(df.phase == "generation") & df.kernel_source.str.contains("recurrent") & (df.batch_size == 1)]
            print(f"{engine:6s} {version:10s} {preset:8s} prefill {'/'.join(kernel)}: {len(achieved)} rows >= "
                  f"{args.min_tokens} tokens, fit {_fit(rates, list(big.itertuples())):.3f} of the bf16 peak (raw "
                  f"FLOPs / time: median {statistics.median(achieved):.3f}); floors: prefill "
                  f"{small.latency.median() * 1e3:.1f} us, decode {one.latency.median() * 1e3:.1f} us")
            if args.held_out:
                held = prefill[(prefill.num_tokens >= args.held_out) & (prefill.num_tokens < args.min_tokens)]
                ratios = [_price(rates, r, False) / (r.latency * 1e-3) for r in held.itertuples()]
                by_heads: dict[int, list[float]] = {}
                for r, x in zip(held.itertuples(), ratios, strict=True):
                    by_heads.setdefault(int(r.num_v_heads), []).append(x)
                print(f"    held out {args.held_out}-{args.min_tokens - 1} tokens: tfcalc / measured median "
                      f"{statistics.median(ratios):.2f} over {len(ratios)} rows; by value heads "
                      + ", ".join(f"{h}: {statistics.median(v):.2f}" for h, v in sorted(by_heads.items())))
            decode = df[(df.phase == "generation") & df.kernel_source.str.contains("recurrent")]
            for low, high in ((1, 8), (9, 64), (65, 512)):
                rows = decode[(decode.batch_size >= low) & (decode.batch_size <= high)]
                if len(rows):
                    ratios = [_price(rates, r, True) / (r.latency * 1e-3) for r in rows.itertuples()]
                    print(f"    decode batch {low}-{high}: tfcalc / measured median {statistics.median(ratios):.2f} "
                          f"over {len(ratios)} rows")


if __name__ == "__main__":
    main()
