"""SGLang's MXFP4 x MXFP8 fused MoE on Blackwell (FlashInfer's TRT-LLM-gen kernels): a cost per touched expert.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment and run

    python benchmarks/validation/sglang_mxfp4_experts.py            # fit, held-out rows, the Kimi K3 op
    python benchmarks/validation/sglang_mxfp4_experts.py --routing  # the power-law loads, sampled against tfcalc's

Rows: aiconfigurator 0.12 systems/data/{b200_sxm,b300_sxm}/moe/sglang/0.5.14/moe_perf, w4a8_mxfp4_mxfp8, at most
one smallest row tile per expert on average (T k <= 8 E, kernels.MOE_OWN_STREAM_ROWS). On the balanced rows with
T k <= E (each touched expert one row) the time grows by a fixed step per touched expert; over all shapes and
widths that step is the expert's MXFP4 bytes at 7.26 TB/s plus 0.125 us (least squares over the 54 shapes), the
stream within 1 % of the B200's bf16 fused-MoE figure (presets/gpus/b200.yaml moe_memory_efficiency 0.90 x 8 TB/s).
So tfcalc streams these experts at the GPU's fused-MoE figure (kernels.moe_own_stream) and adds one cost per
touched expert (kernels.moe_touched_expert_us), the one parameter, fitted (median tfcalc / measured 1) on the
B200's gpt-oss shapes (2880 x 2880, 32 and 128 experts, top 4), balanced, ep 1; every other row is held out: the
B200's other shapes (Kimi K3's latent 3584 x 3072 of 896 experts, top 16; 4096 x 2048 / 256 / 6; 7168 x 3072 /
384 / 6), the B300's, the power-law rows and ep > 1.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

SYSTEMS = {"b200_sxm": "b200", "b300_sxm": "b300"}
DTYPE = "w4a8_mxfp4_mxfp8"
FIT_SHAPES = {(2880, 32), (2880, 128)}  # gpt-oss-20b / -120b: hidden x experts
OWN_STREAM_ROWS = 8  # kernels.MOE_OWN_STREAM_ROWS


def rows(root: Path):  # noqa: ANN201 - a pandas.DataFrame
    """Every SGLang 0.5.14 MXFP4 x MXFP8 row of both systems with T k <= 8 E, ``system`` column added."""
    import pandas as pd

    frames = []
    for system in SYSTEMS:
        df = pd.read_parquet(root / system / "moe" / "sglang" / "0.5.14" / "moe_perf.parquet")
        df = df[(df.moe_dtype == DTYPE) & (df.num_tokens * df.topk <= OWN_STREAM_ROWS * df.num_experts)]
        frames.append(df.assign(system=system))
    return pd.concat(frames)


def priced(df, touched_us: float | None) -> list[float]:  # noqa: ANN001 - a pandas.DataFrame
    """tfcalc / measured for each row, with ``touched_us`` per touched expert (None: the preset's)."""
    from tfcalc.calc import kernels
    from tfcalc.calc.latency import linear_mode, rates_for
    from tfcalc.dtypes import get_dtype
    from tfcalc.spec.presets import load_engine, load_gpu

    engine = load_engine("sglang").kernels
    out = []
    for system, preset in SYSTEMS.items():
        gpu = load_gpu(preset)
        rates, mode = rates_for(gpu, engine), linear_mode(get_dtype("mxfp4"), gpu)
        if touched_us is not None:
            rates = replace(rates, moe_touched_expert={**rates.moe_touched_expert, "mxfp4": touched_us * 1e-6})
        for r in df[df.system == system].itertuples():
            dist = r.distribution
            routing = (kernels.parse_routing("power-law:" + dist.rsplit("_", 1)[1]) if dist.startswith("power_law")
                       else kernels.UNIFORM)
            ep = r.moe_ep_size
            cost = kernels.moe_experts(rates, tokens=r.num_tokens, experts_local=r.num_experts // ep,
                                       experts_total=r.num_experts, top_k=r.topk, hidden=r.hidden_size,
                                       expert_width=r.inter_size // r.moe_tp_size, gated=True, weight_bits=mode.bits,
                                       compute=mode.compute, dequant=mode.dequant, weight_format=mode.weights,
                                       routing=routing, replicated=False)
            out.append(cost.seconds / (r.latency * 1e-3))
    return out


def subset(df, system: str | None, fitted: bool, distribution: str, ep1: bool):  # noqa: ANN001, ANN201
    """The rows of ``system`` (None: both), of the fitted shapes or the others, a distribution, ep 1 or above."""
    shape = df.apply(lambda r: (r.hidden_size, r.num_experts) in FIT_SHAPES, axis=1)
    keep = (df.distribution.str.startswith(distribution)) & ((df.moe_ep_size == 1) == ep1) & (shape == fitted)
    if system:
        keep &= df.system == system
    return df[keep]


def fit(df) -> float:  # noqa: ANN001 - a pandas.DataFrame
    """The us per touched expert that makes the median tfcalc / measured 1 over ``df`` (bisection; it rises in c)."""
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if statistics.median(priced(df, mid)) < 1 else (lo, mid)
    return (lo + hi) / 2


def summary(label: str, ratios: list[float]) -> str:
    """One line: rows, median and quartiles of tfcalc / measured."""
    if not ratios:
        return f"  {label:34s}    0 rows"
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return (f"  {label:34s} {len(ratios):4d} rows  median {statistics.median(ratios):.3f}  "
            f"quartiles {q[0]:.2f}-{q[2]:.2f}")


def kimi_k3_op() -> None:
    """aiconfigurator's op query of Kimi K3's routed experts (B300, SGLang 0.5.14, tp 8, ep 1, 64 tokens) and
    tfcalc's price of the same op."""
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk import operations as ops
    from aiconfigurator_core.sdk.perf_database import get_database

    db = get_database("b300_sxm", "sglang", "0.5.14", allow_unlisted_version=True)
    for dist in ("power_law_1.01", "balanced"):
        op = ops.MoE("moe", 1, 3584, 3072, 16, 896, 8, 1, common.MoEQuantMode.w4a8_mxfp4_mxfp8, dist, 1)
        print(f"aiconfigurator op query, Kimi K3 routed experts, 64 tokens, {dist}: "
              f"{float(op._engine_query(db, x=64)) * 1e3:.1f} us")


def routing_check() -> None:
    """aiconfigurator's power-law sampler (collector helper.py _generate_power_law_distribution, re-implemented:
    loads x^-a on [1, 0.8 T] when T k > E else [0.01, 2], scaled to T k rows, rounded, capped at T, the rest one
    row at a time to the least-loaded expert) against tfcalc's expected touched experts (kernels.routed_rows)."""
    import numpy as np

    from tfcalc.calc import kernels

    rng = np.random.default_rng(0)
    for tokens, experts, top_k in ((32, 896, 16), (64, 896, 16), (128, 896, 16), (64, 384, 6), (64, 128, 4)):
        lo, hi = (1.0, 0.8 * tokens) if tokens * top_k > experts else (0.01, 2.0)
        touched, busiest = [], []
        for _ in range(200):
            g = -0.01
            x = ((hi ** g - lo ** g) * rng.random(experts) + lo ** g) ** (1 / g)
            c = np.minimum(np.round(x / x.sum() * tokens * top_k).astype(int), tokens)
            for _ in range(tokens * top_k - int(c.sum())):  # rows short of T k: to the least-loaded with room
                room = np.flatnonzero(c < tokens)
                c[room[np.argmin(c[room])]] += 1
            for _ in range(int(c.sum()) - tokens * top_k):  # rows over: off the busiest
                c[np.argmax(c)] -= 1
            touched.append(int((c > 0).sum()))
            busiest.append(int(c.max()))
        model = kernels.routed_rows(experts, top_k, tokens, kernels.parse_routing("power-law:1.01"))[0]
        print(f"  T {tokens:4d}, E {experts}, k {top_k:2d}: sampled touched {statistics.fmean(touched):6.1f}, "
              f"busiest expert {statistics.fmean(busiest):4.1f} rows; tfcalc touched {model:6.1f}")


def main() -> None:
    import aiconfigurator_core

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routing", action="store_true", help="the power-law loads, sampled against tfcalc's")
    args = parser.parse_args()
    if args.routing:
        routing_check()
        return
    df = rows(Path(aiconfigurator_core.__file__).parent / "systems" / "data")
    fitted = fit(subset(df, "b200_sxm", True, "balanced", True))
    print(f"fitted: {fitted:.3f} us per touched expert (B200 gpt-oss shapes, balanced, ep 1)")
    for label, c in (("the preset (sglang-0.5.10.yaml)", None), ("the fused-MoE stream, no cost per expert", 0.0),
                     (f"the fused-MoE stream and {fitted:.3f} us per touched expert", fitted)):
        print(label)
        for system in SYSTEMS:
            for dist in ("balanced", "power_law"):
                for fit_rows, ep1, name in ((True, True, "gpt-oss shapes, ep 1"), (False, True, "others, ep 1"),
                                            (True, False, "gpt-oss shapes, ep > 1"),
                                            (False, False, "others, ep > 1")):
                    part = subset(df, system, fit_rows, dist, ep1)
                    print(summary(f"{system} {dist} {name}", priced(part, c)))
        k3 = df[(df.hidden_size == 3584) & (df.moe_tp_size == 8) & (df.moe_ep_size == 1) & (df.num_tokens == 64)
                & (df.distribution == "power_law_1.01") & (df.system == "b300_sxm")]
        print(f"  Kimi K3 op (B300, tp 8, 64 tokens, power-law 1.01): tfcalc / measured "
              f"{statistics.median(priced(k3, c)):.3f} (table {k3.latency.median() * 1e3:.1f} us)")
    kimi_k3_op()


if __name__ == "__main__":
    main()
