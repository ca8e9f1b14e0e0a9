"""tfcalc's routed-expert kernel against SGLang's measured wide expert-parallel MoE (DeepEP + DeepGEMM), per GPU, ep
and token band: the MoE part of a DeepSeek-V3 step at ep 4-256, which no held-out grid covers.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install aiconfigurator``;
its tables ship in the package, pandas and pyarrow read them) and run

    python benchmarks/validation/wideep_moe_check.py [--fit]

Rows: aiconfigurator_core/systems/data/<gpu>/moe/sglang/<newest>/wideep_{generation,context}_moe_perf, uniform
routing, DeepSeek-V3's experts (256 of width 2048 on 7168, top-8, fp8 with 128 x 128 block scales). Its collector
(collector/sglang/collect_deepep_moe.py) runs one rank's share of the experts (256 / ep) on one GPU and logs
``num_tokens`` as the tokens of all ep ranks (the tokens a rank holds x ep): the tokens the experts of the group
see, as ``tfcalc.calc.kernels.moe_experts`` takes them (``tokens``: every rank's; ``replicated=False``: they came by
all-to-all). Generation rows are DeepGEMM's masked layout under CUDA graphs, context rows its contiguous layout; each
is priced at the sglang preset's rates on that GPU (``rates_for``) with CUDA graphs for generation only, and at the
tables' routing: every local expert gets exactly T k / E rows (``moe_kernel_rates._balanced_rows``) and no rank more
than its share (``kernels.rank_imbalance`` 1), where serving prices random routing's busiest rank. Generation rows
run the preset's experts' kernel behind DeepEP (``kernels.deepep_moe``), as decode-only steps do; context rows the
fused MoE's rates, as prefill steps do.

``--fit`` searches that kernel's grouped efficiency, weight stream and fixed cost per table (least squares of
log(tfcalc / measured) over a grid) and prints the best, then the B200's fit on the GB200's table (held out: the
gb200 preset runs the b200 entry).
"""

from __future__ import annotations

import argparse
import glob
import itertools
import math
import statistics
from pathlib import Path

GPUS = {"h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200"}
BANDS = ((0, 256, "< 256"), (256, 4096, "256-4095"), (4096, 1 << 40, ">= 4096"))


def _newest(directory: Path, name: str) -> Path | None:
    def version(path: str) -> list[int | str]:
        return [int(x) if x.isdigit() else x for x in Path(path).parent.name.replace("post", ".").split(".")]

    files = sorted(glob.glob(str(directory / "*" / name)), key=version)
    return Path(files[-1]) if files else None


def _price(rates, row, mode) -> float:  # noqa: ANN001 - Rates, a table row, the experts' _Linear
    """tfcalc / measured for one table row."""
    from tfcalc.calc import kernels

    cost = kernels.moe_experts(rates, tokens=row.num_tokens, experts_local=row.num_experts // row.moe_ep_size,
                               experts_total=row.num_experts, top_k=row.topk, hidden=row.hidden_size,
                               expert_width=row.inter_size, gated=True, weight_bits=mode.bits, compute=mode.compute,
                               dequant=mode.dequant, weight_format=mode.weights, replicated=False)
    return cost.seconds / (row.latency * 1e-3)


def _tables() -> list[tuple[str, str, Path]]:
    import aiconfigurator_core

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    return [(preset, phase, path) for system, preset in GPUS.items() for phase in ("generation", "context")
            if (path := _newest(root / system / "moe" / "sglang", f"wideep_{phase}_moe_perf.parquet")) is not None]


def _rates(preset: str, phase: str, kernel=None):  # noqa: ANN001, ANN202 - ArchitectureMoe | None -> Rates
    from tfcalc.calc.latency import _with_moe_kernel, engine_kernels_gpu, rates_for
    from tfcalc.spec.presets import load_engine, load_gpu

    engine, gpu = load_engine("sglang").kernels, load_gpu(preset)
    rates = rates_for(gpu, engine, cuda_graphs=phase == "generation")
    if phase == "generation":
        kernel = kernel or engine.deepep_moe_by_gpu.get(engine_kernels_gpu(gpu, engine))
        rates = _with_moe_kernel(rates, kernel) if kernel is not None else rates
    return rates


def fit(rows: list, preset: str, mode) -> tuple[float, float, float, float]:  # noqa: ANN001
    """(rms of log ratio, efficiency, weight stream, fixed seconds) that fit ``rows`` best on the grid."""
    from tfcalc.spec.engine import ArchitectureMoe

    best = []
    for g, w, f in itertools.product((0.9, 1.0, 1.1, 1.2, 1.3, 1.4), (0.6, 0.65, 0.7, 0.75, 0.8, 0.85),
                                     (14e-6, 16e-6, 18e-6, 20e-6, 22e-6, 24e-6)):
        kernel = ArchitectureMoe(efficiency={"fp8_block": g}, memory_efficiency={"fp8_block": w},
                                 floors_s={"fp8_block": f}, fused_rows=frozenset({"fp8_block"}))
        rates = _rates(preset, "generation", kernel)
        logs = [math.log(_price(rates, row, mode)) for row in rows]
        best.append((math.sqrt(sum(v * v for v in logs) / len(logs)), g, w, f))
    return min(best)


def main() -> None:
    import pandas as pd
    from moe_kernel_rates import _balanced_rows

    from tfcalc.calc import kernels
    from tfcalc.calc.latency import linear_mode
    from tfcalc.dtypes import get_dtype
    from tfcalc.spec.presets import load_gpu

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="fit the experts' kernel behind DeepEP per GPU")
    args = parser.parse_args()
    kernels.routed_rows = _balanced_rows   # the tables' deterministic routing, not random routing
    kernels.rank_imbalance = lambda *args: 1.0
    for preset, phase, path in _tables():
        mode = linear_mode(get_dtype("fp8_block"), load_gpu(preset))
        table = pd.read_parquet(path)
        table = table[table.distribution == "uniform"]
        if args.fit:
            if phase == "generation":
                rms, g, w, f = fit(list(table.itertuples()), preset, mode)
                print(f"{preset:6s} fit: efficiency {g:.2f}, weight stream {w:.2f}, fixed {f * 1e6:.0f} us "
                      f"(rms log {rms:.3f})")
            continue
        rates = _rates(preset, phase)
        for ep, rows in table.groupby("moe_ep_size"):
            bands: dict[str, list[float]] = {}
            for row in rows.itertuples():
                band = next(label for lo, hi, label in BANDS if lo <= row.num_tokens < hi)
                bands.setdefault(band, []).append(_price(rates, row, mode))
            medians = ", ".join(f"{band} {statistics.median(v):.2f} ({len(v)})" for band, v in bands.items())
            print(f"{preset:6s} sglang {path.parent.name:11s} {phase:10s} ep {ep:3d}: tfcalc / measured, "
                  f"median by all-rank tokens: {medians}")
        if phase == "generation":
            ratios = [_price(rates, row, mode) for row in table.itertuples()]
            print(f"{preset:6s} generation, all {len(ratios)} rows: median {statistics.median(ratios):.2f}, "
                  f"within 10 % {sum(abs(r - 1) <= 0.1 for r in ratios)}, within 20 % "
                  f"{sum(abs(r - 1) <= 0.2 for r in ratios)}")


if __name__ == "__main__":
    main()
