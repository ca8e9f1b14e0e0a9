"""tfcalc's routed-expert kernel against SGLang's measured wide expert-parallel MoE (DeepEP + DeepGEMM), per GPU, ep
and token band: the MoE part of a DeepSeek-V3 step at ep 4-256, which no held-out grid covers.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install aiconfigurator``;
its tables ship in the package, pandas and pyarrow read them) and run

    python benchmarks/validation/wideep_moe_check.py

Rows: aiconfigurator_core/systems/data/<gpu>/moe/sglang/<newest>/wideep_{generation,context}_moe_perf, uniform
routing, DeepSeek-V3's experts (256 of width 2048 on 7168, top-8, fp8 with 128 x 128 block scales). Its collector
(collector/sglang/collect_deepep_moe.py) runs one rank's share of the experts (256 / ep) on one GPU and logs
``num_tokens`` as the tokens of all ep ranks (the tokens a rank holds x ep): the tokens the experts of the group
see, as ``tfcalc.calc.kernels.moe_experts`` takes them (``tokens``: every rank's; ``replicated=False``: they came by
all-to-all). Generation rows are DeepGEMM's masked layout under CUDA graphs, context rows its contiguous layout; each
is priced at the sglang preset's rates on that GPU (``rates_for``) with CUDA graphs for generation only, and at the
tables' routing: every local expert gets exactly T k / E rows (``moe_kernel_rates._balanced_rows``) and no rank more
than its share (``kernels.rank_imbalance`` 1), where serving prices random routing's busiest rank.
"""

from __future__ import annotations

import glob
import statistics
from pathlib import Path

GPUS = {"h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200"}
BANDS = ((0, 256, "< 256"), (256, 4096, "256-4095"), (4096, 1 << 40, ">= 4096"))


def _newest(directory: Path, name: str) -> Path | None:
    def version(path: str) -> list[int | str]:
        return [int(x) if x.isdigit() else x for x in Path(path).parent.name.replace("post", ".").split(".")]

    files = sorted(glob.glob(str(directory / "*" / name)), key=version)
    return Path(files[-1]) if files else None


def main() -> None:
    import aiconfigurator_core
    import pandas as pd
    from moe_kernel_rates import _balanced_rows

    from tfcalc.calc import kernels
    from tfcalc.calc.latency import linear_mode, rates_for
    from tfcalc.dtypes import get_dtype
    from tfcalc.spec.presets import load_engine, load_gpu

    kernels.routed_rows = _balanced_rows   # the tables' deterministic routing, not random routing
    kernels.rank_imbalance = lambda *args: 1.0
    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    engine = load_engine("sglang").kernels
    for system, preset in GPUS.items():
        gpu = load_gpu(preset)
        mode = linear_mode(get_dtype("fp8_block"), gpu)
        for phase in ("generation", "context"):
            path = _newest(root / system / "moe" / "sglang", f"wideep_{phase}_moe_perf.parquet")
            if path is None:
                continue
            rates = rates_for(gpu, engine, cuda_graphs=phase == "generation")
            table = pd.read_parquet(path)
            table = table[table.distribution == "uniform"]
            for ep, rows in table.groupby("moe_ep_size"):
                bands: dict[str, list[float]] = {}
                for row in rows.itertuples():
                    cost = kernels.moe_experts(rates, tokens=row.num_tokens, experts_local=row.num_experts // ep,
                                               experts_total=row.num_experts, top_k=row.topk,
                                               hidden=row.hidden_size, expert_width=row.inter_size, gated=True,
                                               weight_bits=mode.bits, compute=mode.compute, dequant=mode.dequant,
                                               weight_format=mode.weights, replicated=False)
                    band = next(label for lo, hi, label in BANDS if lo <= row.num_tokens < hi)
                    bands.setdefault(band, []).append(cost.seconds / (row.latency * 1e-3))
                medians = ", ".join(f"{band} {statistics.median(v):.2f} ({len(v)})" for band, v in bands.items())
                print(f"{preset:6s} sglang {path.parent.name:11s} {phase:10s} ep {ep:3d}: tfcalc / measured, "
                      f"median by all-rank tokens: {medians}")


if __name__ == "__main__":
    main()
