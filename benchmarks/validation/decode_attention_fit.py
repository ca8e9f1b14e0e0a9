"""How fast decode attention streams the KV cache, per GPU and engine, from NVIDIA aiconfigurator's measured
generation-attention tables: the values of the GPU presets' ``latency.decode_attention`` block and the engine
presets' ``kernels.fp8_kv_attention``.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install
aiconfigurator==0.12.0``; it brings pandas and pyarrow) and run

    python benchmarks/validation/decode_attention_fit.py [PATH/TO/aiconfigurator_core/systems/data]

Rows: head dim 128, no sliding window, at most 16 query heads per KV head, and KV caches of at least
``MIN_KV_BYTES``: smaller caches stay in L2 between the table's repetitions, which a served step, reading other
layers' weights in between, does not (at Llama-3.1-8B's heads vLLM's H100 table reads 32 MiB in 18-20 us and
64 MiB in 36-42 us, whatever the batch x context split; its B200 table 128 MiB in 30-40 us, 256 MiB in 47-56 us).
On the A100, L40S and RTX PRO 6000 (``FA2_SYSTEMS``: vLLM's FlashAttention-2) the rows keep at least two query heads
per KV head: FA2's varlen decode splits the KV sequence only when it folds a GQA group into the query rows
(csrc/flash_attn/flash_api.cpp ``mha_varlen_fwd``: ``set_params_splitkv`` under ``seqlenq_ngroups_swapped``,
num_heads > num_heads_k), so an MHA decode at small batch runs one CTA per (sequence, head) and streams at a
fraction of HBM (the A100 reads 256 MiB in 3.0 ms at 4 sequences of 131k tokens, one KV head). With them the A100,
L40S and RTX PRO 6000 tables fit with sd 0.34 / 0.15 / 0.25, without them 0.10 / 0.07 / 0.05. Those MHA rows run one
CTA per (sequence, head), each at a rate flat from 1 to 131k tokens: for vLLM's tables the script prints that rate
(``_unsplit``: the GPU presets' ``unsplit_mha_cta_gb_s``) and the sd of the MHA rows priced at min(the GQA rate, u x
it). Every engine's table is fitted on its own: an engine whose kernel is not the one the GPU preset measured takes
its fit as its preset's ``kernels.decode_attention`` entry (SGLang's FlashInfer on the L40S).

Model (tfcalc/calc/kernels.py ``decode_attention``), u = sequences x KV heads:

    t = floor + u x stream_s + KV bytes / (datasheet bandwidth x e x u / (u + u_half))

``floor`` is the GPU preset's attention floor (batch 1, context <= 64); for each u_half on a grid, ``stream_s`` and
1 / e are a least-squares fit of t - floor weighted by 1 / t (relative errors); the u_half with the least weighted
error is printed with its e, stream_s (ns) and the spread of log(model / measured). The same over the fp8-cache
rows prints the fp8 kernel's own e at the bf16 fit's u_half and stream_s, and the engine presets'
``kernels.fp8_kv_attention`` (``_fixed_scale``): fixed, the median extra time of the fp8 kernel at batch 1 and
<= 64 tokens, and scale, its KV streaming time over the bf16 cache's for the same tokens at the GPU preset's
(vLLM's) u_half, e and stream_s.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300", "gb200": "gb200",
           "gb300": "gb300", "a100_sxm": "a100-80gb", "l40s": "l40s", "rtx_pro_6000_server": "rtx-pro-6000"}
ENGINES = ("vllm", "sglang", "trtllm")
MIN_KV_BYTES = 256 * 2**20  # the HBM regime of the tables (module docstring)
MAX_GROUP = 16  # query heads per KV head
FA2_SYSTEMS = frozenset({"a100_sxm", "l40s", "rtx_pro_6000_server"})  # vLLM runs FA2 there: GQA rows only
UNSPLIT_FIT_STREAMS = 16  # MHA rows fitting the per-CTA rate: 16 CTAs stream far below any GPU's HBM rate
HALF_GRID = tuple(round(0.1 * i, 1) for i in range(1, 61))  # u_half from 0.1 to 6.0


def _newest(folder: Path) -> Path | None:
    versions = sorted(p for p in folder.glob("*") if (p / "generation_attention_perf.parquet").exists()) \
        if folder.exists() else []
    return versions[-1] if versions else None


def _rows(table, kv: str, min_group: int = 1) -> list[tuple[tuple[int, int, int, int, str], float, float, float]]:
    """(shape key, u, KV bytes, seconds) of the rows the fit uses: ``min_group`` to ``MAX_GROUP`` query heads per
    KV head."""
    out = []
    per_elem = 1 if kv == "fp8" else 2
    for r in table[(table.kv_cache_dtype == kv)].itertuples():
        group = r.num_heads // r.num_key_value_heads
        if r.head_dim != 128 or getattr(r, "window_size", 0) != 0 or not min_group <= group <= MAX_GROUP:
            continue
        ctx = r.isl + r.step
        kv_bytes = 2.0 * ctx * r.num_key_value_heads * 128 * per_elem * r.batch_size
        if kv_bytes * 2 / per_elem < MIN_KV_BYTES:  # the bf16 cache's size: the same shapes for both caches
            continue
        out.append(((r.batch_size, ctx, r.num_heads, r.num_key_value_heads, r.kernel_source),
                    float(r.batch_size * r.num_key_value_heads), kv_bytes, r.latency * 1e-3))
    return out


def _fit(rows, bandwidth: float, floor: float, halves=HALF_GRID, stream_s: float | None = None):
    """(u_half, e, stream_s, sd of log model / measured) minimising the 1 / t weighted squared error."""
    best = None
    for half in halves:
        # t - floor = c u + (1 / e) x bytes (u + half) / (u bandwidth): weighted linear least squares in (c, 1 / e)
        xs = [(u, b * (u + half) / (u * bandwidth), t) for _, u, b, t in rows]
        if stream_s is None:
            s11 = sum((u / t) ** 2 for u, _, t in xs)
            s12 = sum(u * x / t**2 for u, x, t in xs)
            s22 = sum((x / t) ** 2 for _, x, t in xs)
            y1 = sum(u * (t - floor) / t**2 for u, _, t in xs)
            y2 = sum(x * (t - floor) / t**2 for _, x, t in xs)
            det = s11 * s22 - s12 * s12
            c, inv_e = (y1 * s22 - y2 * s12) / det, (s11 * y2 - s12 * y1) / det
        else:
            c = stream_s
            inv_e = (sum(x * (t - floor - c * u) / t**2 for u, x, t in xs) / sum((x / t) ** 2 for _, x, t in xs))
        if inv_e <= 0:
            continue
        logs = [math.log((floor + c * u + inv_e * x) / t) for u, x, t in xs]
        err = sum(v * v for v in logs)
        mean = sum(logs) / len(logs)
        sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / len(logs))
        if best is None or err < best[0]:
            best = (err, half, 1 / inv_e, c, sd)
    return best[1:] if best else None


def _mha_rows(table) -> list[tuple[tuple[int, int, int, int, str], float, float, float]]:
    """``_rows`` of the bf16 cache with as many query heads as KV heads."""
    return [r for r in _rows(table, "bfloat16") if r[0][2] == r[0][3]]


def _unsplit(rows, bandwidth: float, floor: float, fit) -> tuple[float, float, float] | None:
    """An unsplit MHA decode (one CTA per sequence and head): (bytes/s per CTA, the median over the MHA rows of
    u <= ``UNSPLIT_FIT_STREAMS``, far below saturation, of bytes / (u (t - floor - u stream_s)); the sd of log model
    / measured over every MHA row, t = floor + u stream_s + bytes / min(the GQA fit's rate, u x per-CTA rate); the
    same sd without the per-CTA cap)."""
    half, e, c = fit[0], fit[1], fit[2]
    per_cta = sorted(b / (u * (t - floor - c * u)) for _, u, b, t in rows if u <= UNSPLIT_FIT_STREAMS)
    if not per_cta:
        return None
    cta = per_cta[len(per_cta) // 2]

    def sd(cap: float) -> float:
        logs = [math.log((floor + c * u + b / min(bandwidth * e * u / (u + half), u * cap)) / t) for _, u, b, t in rows]
        mean = sum(logs) / len(logs)
        return math.sqrt(sum((v - mean) ** 2 for v in logs) / len(logs))

    return cta, sd(cta), sd(math.inf)


def _small(table, kv: str) -> dict[tuple[int, int, int, int, str], float]:
    """Seconds of the batch-1 rows with a context of at most 64 tokens (the attention floor's rows), by shape."""
    out = {}
    for r in table[(table.kv_cache_dtype == kv)].itertuples():
        ctx = r.isl + r.step
        if r.head_dim == 128 and getattr(r, "window_size", 0) == 0 and r.batch_size == 1 and ctx <= 64:
            out[(r.batch_size, ctx, r.num_heads, r.num_key_value_heads, r.kernel_source)] = r.latency * 1e-3
    return out


def _fixed_scale(table, fp8_rows, bandwidth: float, floor: float, fit) -> tuple[float, float] | None:
    """``kernels.fp8_kv_attention`` (fixed, scale): fixed = the median fp8 - bf16 time over the floor's rows
    (batch 1, context <= 64); scale: t_fp8 = floor + fixed + u stream_s + scale x (the bf16 cache's streaming
    time at ``fit``: u_half, e, stream_s), least squares weighted by 1 / t_fp8 over the HBM rows."""
    bf16, fp8 = _small(table, "bfloat16"), _small(table, "fp8")
    gaps = sorted(fp8[key] - bf16[key] for key in fp8 if key in bf16)
    if not gaps or len(fp8_rows) < 10:
        return None
    fixed = gaps[len(gaps) // 2]
    half, e, c = fit[0], fit[1], fit[2]
    xs = [(2 * b * (u + half) / (u * bandwidth * e), t - floor - fixed - c * u, t) for _, u, b, t in fp8_rows]
    return fixed, sum(x * y / t**2 for x, y, t in xs) / sum((x / t) ** 2 for x, _, t in xs)


def main() -> None:
    import pandas as pd

    from tfcalc.spec.presets import load_gpu

    if len(sys.argv) > 1:
        data = Path(sys.argv[1])
    else:
        import aiconfigurator_core
        data = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    print("gpu      engine kernel      rows uhalf    e    ns    sd | fp8 e    sd fixed scale")
    for system, preset in SYSTEMS.items():
        gpu = load_gpu(preset)
        bandwidth, floor = gpu.hbm_bandwidth_bytes_per_s, gpu.latency.floors_s["attention"]
        preset_fit = None  # vLLM's, the GPU preset's values: the engines' fp8 scale is relative to them
        for engine in ENGINES:
            folder = _newest(data / system / "attention" / engine)
            if folder is None:
                continue
            table = pd.read_parquet(folder / "generation_attention_perf.parquet")
            for kernel in sorted(table.kernel_source.unique()):
                one = table[table.kernel_source == kernel]
                group = 2 if system in FA2_SYSTEMS else 1
                bf16, fp8 = _rows(one, "bfloat16", group), _rows(one, "fp8", group)
                fit = _fit(bf16, bandwidth, floor) if len(bf16) >= 10 else None
                if fit is None:
                    continue
                preset_fit = preset_fit or fit
                half, e, c, sd = fit
                line = (f"{system:8} {engine:6} {kernel[:10]:10} {len(bf16):5} {half:5.1f} {e:.3f} "
                        f"{c * 1e9:5.1f} {sd:5.3f} |")
                own = _fit(fp8, bandwidth, floor, (half,), c) if len(fp8) >= 10 else None
                pair = _fixed_scale(one, fp8, bandwidth, floor, preset_fit)
                if own is not None:
                    line += f"{own[1]:6.3f} {own[3]:5.3f}"
                if pair is not None:
                    line += f" {pair[0] * 1e6:5.1f} {pair[1]:4.2f}"
                print(line)
                fa2 = system in FA2_SYSTEMS and engine == "vllm"
                mha = _unsplit(_mha_rows(one), bandwidth, floor, fit) if fa2 else None
                if mha is not None:
                    print(f"{'':8} {engine:6} {kernel[:10]:10} unsplit MHA: {mha[0] / 1e9:.1f} GB/s per CTA, "
                          f"sd {mha[1]:.3f} over the MHA rows ({mha[2]:.3f} without it)")

if __name__ == "__main__":
    main()
