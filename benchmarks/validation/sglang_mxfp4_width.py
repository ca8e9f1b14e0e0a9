"""How SGLang's MXFP4 x MXFP8 fused MoE on Blackwell (FlashInfer's TRT-LLM-gen kernels) streams narrow expert slices.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment and run

    python benchmarks/validation/sglang_mxfp4_width.py [--shape 7168x3072]

Mechanism: at decode sizes FlashInfer's TRT-LLM-gen batched GEMMs run with the weights as the MMA's M side and the
tokens as N ("transposeMmaOutput" kernels, tile 128 x 8 x 256: TensorRT-LLM
cpp/tensorrt_llm/kernels/trtllmGenKernels/gemmGatedAct/trtllmGen_gatedAct_export/KernelMetaInfo.h), so each CTA loops
over K in tiles of 256 and pays a pipeline fill before its first tile. The down GEMM's K is the per-GPU expert width
w: a narrow slice has few K tiles (w = 384: two, the second half empty) and the fill weighs more. Model: a GEMM of
depth K streams its weights at ``(ceil(K / 256) + fill) x 256 / K`` times their ideal time, gate/up (K = hidden) and
down (K = w) weighted by their bytes (2 : 1); ``fill`` (K tiles) is the one parameter.

Rows: aiconfigurator 0.12 systems/data/{b200_sxm,b300_sxm}/moe/sglang/0.5.14/moe_perf, w4a8_mxfp4_mxfp8, balanced,
ep 1, the token counts at which every expert gets one to eight rows (one smallest row tile). Measured stream: the
padded experts' MXFP4 bytes (4.25 bits; SGLang pads the hidden size to 256 and the width to 128) over the latency less
the kernel's fixed cost (presets/engines/sglang-0.5.10.yaml kernels.moe_floors_us mxfp4), as a fraction of 8 TB/s.
The fit uses one shape's widths (default 7168 x 3072, 384 experts, top 6 -- not Kimi K3, whose routed experts
aiconfigurator's model queries as its latent 3584 x 3072 of 896, top 16: sdk/models/kimi_k3.py) as ratios to its
widest slice, so no
base rate enters it; the other shapes (gpt-oss 2880 x 2880 at 32 and 128 experts, 4096 x 2048, 3584 x 3072) are held
out. Beside it, tfcalc's present price of the same rows (power-law 1.01 routing, as validate.py prices Kimi K3):
tfcalc / measured per width.

Result (this script, default shape): fill 0.36 K tiles; fitted (Kimi K3, 8 rows) rms log 0.018, model / measured
0.98-1.03; held out (46 rows) median 1.05 but rms log 0.29, range 0.98-2.19: the model holds from 512 columns up and
misses the slices of 384 and below on the other shapes (3584 x 3072 at 384: measured 0.64 of its widest slice, model
0.85, where 7168 x 3072's 384 is 0.86), so the width alone does not set the loss and the term is not in the presets.
tfcalc priced 7168 x 3072's tp-8 slice (384) at 0.96 / 0.97 of the table (B200 / B300) and its wide slices 8-14 %
slow; Kimi K3's own slice (3584 x 384) at 0.74. What the rows follow is a cost per touched expert:
sglang_mxfp4_experts.py.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

K_TILE = 256  # the kernels' tileK (tile128x8x256)
FLOOR_S = 16.9e-6  # kernels.moe_floors_us b200 mxfp4 (FlashInfer TRT-LLM's FP4 MoE)
BANDWIDTH = 8e12  # B200 / B300 HBM3e datasheet, bytes/s
SYSTEMS = {"b200_sxm": "b200", "b300_sxm": "b300"}


def pad(value: int, multiple: int) -> int:
    """``value`` rounded up to ``multiple`` (SGLang's MXFP4 weight padding)."""
    return -(-value // multiple) * multiple


def slowdown(k: int, fill: float) -> float:
    """A GEMM of depth ``k``: its weight stream's time over the ideal, (ceil(k / 256) + fill) x 256 / k."""
    return (math.ceil(k / K_TILE) + fill) * K_TILE / k


def relative_time(hidden: int, width: int, fill: float) -> float:
    """The experts' stream time over the ideal: gate/up (K = hidden, 2 w rows) and down (K = w, hidden rows)."""
    return (2 * slowdown(hidden, fill) + slowdown(width, fill)) / 3


def measured(root: Path) -> dict[tuple[str, int, int, int, int], float]:
    """(system, hidden, experts, top_k, width) -> the median measured stream fraction over its one-tile rows."""
    import pandas as pd

    out: dict[tuple[str, int, int, int, int], list[float]] = {}
    for system in SYSTEMS:
        df = pd.read_parquet(root / system / "moe" / "sglang" / "0.5.14" / "moe_perf.parquet")
        df = df[(df.moe_dtype == "w4a8_mxfp4_mxfp8") & (df.distribution == "balanced") & (df.moe_ep_size == 1)]
        for r in df.itertuples():
            pairs = r.num_tokens * r.topk
            if not r.num_experts <= pairs <= 8 * r.num_experts:
                continue
            hidden, width = pad(r.hidden_size, 256), pad(r.inter_size // r.moe_tp_size, 128)
            stream = r.num_experts * 3 * hidden * width * 4.25 / 8 / (r.latency * 1e-3 - FLOOR_S) / BANDWIDTH
            key = (system, r.hidden_size, r.num_experts, r.topk, r.inter_size // r.moe_tp_size)
            out.setdefault(key, []).append(stream)
    return {k: statistics.median(v) for k, v in out.items()}


def ratios(streams: dict, fill: float, shapes: set[tuple[int, int]] | None = None) -> list[tuple[tuple, float, float]]:
    """(key, measured s(w) / s(widest), model's) for each row of ``shapes`` (all when None)."""
    out = []
    for key, value in streams.items():
        system, hidden, experts, top_k, width = key
        if shapes is not None and (hidden, experts) not in shapes:
            continue
        widest = max(k[4] for k in streams if k[:4] == key[:4])
        ref = streams[(*key[:4], widest)]
        h = pad(hidden, 256)
        model = relative_time(h, pad(widest, 128), fill) / relative_time(h, pad(width, 128), fill)
        out.append((key, value / ref, model))
    return out


def fit(streams: dict, shapes: set[tuple[int, int]]) -> float:
    """The fill (K tiles) that minimises the rms of log(model / measured) over ``shapes``' rows, by golden search."""
    def cost(fill: float) -> float:
        r = ratios(streams, fill, shapes)
        return sum(math.log(m / x) ** 2 for _, x, m in r) / len(r)

    lo, hi = 0.0, 8.0
    for _ in range(60):
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        lo, hi = (lo, b) if cost(a) < cost(b) else (a, hi)
    return (lo + hi) / 2


def tfcalc_ratios(root: Path) -> dict[tuple[str, int, int, int, int], float]:
    """tfcalc / measured (median over the decode rows, 1-128 tokens, power-law 1.01) per system and shape."""
    import pandas as pd

    from tfcalc.calc import kernels
    from tfcalc.calc.latency import linear_mode, rates_for
    from tfcalc.dtypes import get_dtype
    from tfcalc.spec.presets import load_engine, load_gpu

    out: dict[tuple[str, int, int, int, int], list[float]] = {}
    routing = kernels.parse_routing("power-law:1.01")
    for system, preset in SYSTEMS.items():
        df = pd.read_parquet(root / system / "moe" / "sglang" / "0.5.14" / "moe_perf.parquet")
        df = df[(df.moe_dtype == "w4a8_mxfp4_mxfp8") & (df.distribution == "power_law_1.01") & (df.moe_ep_size == 1)
                & (df.num_tokens <= 128)]
        gpu = load_gpu(preset)
        rates, mode = rates_for(gpu, load_engine("sglang").kernels), linear_mode(get_dtype("mxfp4"), gpu)
        for r in df.itertuples():
            width = r.inter_size // r.moe_tp_size
            cost = kernels.moe_experts(rates, tokens=r.num_tokens, experts_local=r.num_experts,
                                       experts_total=r.num_experts, top_k=r.topk, hidden=r.hidden_size,
                                       expert_width=width, gated=True, weight_bits=mode.bits, compute=mode.compute,
                                       dequant=mode.dequant, weight_format=mode.weights, routing=routing)
            key = (system, r.hidden_size, r.num_experts, r.topk, width)
            out.setdefault(key, []).append(cost.seconds / (r.latency * 1e-3))
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    import aiconfigurator_core

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="7168x384", metavar="HIDDENxEXPERTS", help="the fitted shape")
    args = parser.parse_args()
    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    streams = measured(root)
    fitted = {tuple(int(v) for v in args.shape.split("x"))}
    fill = fit(streams, fitted)
    held = {(k[1], k[2]) for k in streams} - fitted
    print(f"fill {fill:.2f} K tiles of {K_TILE} (fitted on {args.shape}: hidden x experts)")
    tf = tfcalc_ratios(root)
    for label, shapes in (("fitted", fitted), ("held out", held)):
        rows = ratios(streams, fill, shapes)
        errs = [m / x for _, x, m in rows]
        rms = math.sqrt(statistics.fmean(math.log(e) ** 2 for e in errs))
        print(f"{label}: {len(rows)} widths, model / measured median {statistics.median(errs):.3f}, "
              f"range {min(errs):.2f}-{max(errs):.2f}, rms log {rms:.3f}")
        for key, x, m in sorted(rows):
            print(f"  {key[0]:8s} {key[1]}x{key[2]} k{key[3]} w{key[4]:5d}: stream {streams[key]:.2f}, "
                  f"/ widest {x:.2f}, model {m:.2f}; tfcalc / measured now {tf.get(key, float('nan')):.2f}")


if __name__ == "__main__":
    main()
