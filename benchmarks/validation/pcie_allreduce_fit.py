"""``nccl.efficiency`` and ``nccl_efficiency_by_gpus`` of presets/interconnects/pcie{4,5}.yaml, read from
aiconfigurator's measured NCCL all-reduce tables, and tfcalc's error on every row of them.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install aiconfigurator``;
its tables ship in the package, pandas and pyarrow read them) and run

    PYTHONPATH=. python benchmarks/validation/pcie_allreduce_fit.py

Each table (aiconfigurator_core/systems/data/<gpu>/comm/nccl/<version>/nccl_perf, the ``half`` all_reduce rows)
times one all-reduce of ``message_size`` elements of 2 bytes (the convention of its custom all-reduce tables,
custom_allreduce_fit.py), latency in ms. Per GPU count: the bus bandwidth (nccl-tests doc/PERFORMANCE.md,
2 (n - 1) / n x bytes / time) of messages >= 16 MiB, its median over the fabric's bandwidth is the efficiency.
Then every row >= 64 KiB is priced with the preset as it is (``tfcalc.calc.comm.all_reduce`` over
``Interconnect.nccl_for``) and the median and worst |tfcalc / measured - 1| per GPU count printed.
"""

from __future__ import annotations

import glob
import statistics
from pathlib import Path

MIB = 1 << 20
TABLES = {"l40s": "pcie4", "rtx_pro_6000_server": "pcie5"}


def rows(gpu_dir: str) -> tuple[str, list[tuple[int, float, float]]]:
    """(NCCL version, [(GPUs, bytes, seconds)]) of the newest NCCL all-reduce table of one system."""
    import aiconfigurator_core
    import pandas as pd

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / gpu_dir / "comm" / "nccl"
    path = sorted(glob.glob(str(root / "*" / "nccl_perf.parquet")))[-1]
    frame = pd.read_parquet(path)
    frame = frame[(frame.op_name == "all_reduce") & (frame.nccl_dtype == "half")]
    return Path(path).parent.name, [(int(r.num_gpus), 2.0 * r.message_size, r.latency * 1e-3)
                                    for r in frame.itertuples()]


def main() -> None:
    from tfcalc.calc.comm import all_reduce
    from tfcalc.spec.interconnect import load_interconnect

    for gpu_dir, preset in TABLES.items():
        version, data = rows(gpu_dir)
        fabric = load_interconnect(preset)
        print(f"{gpu_dir} (NCCL {version}) against {preset}:")
        for n in sorted({r[0] for r in data}):
            big = [2 * (n - 1) / n * b / t for g, b, t in data if g == n and b >= 16 * MIB]
            bus = statistics.median(big)
            link = fabric.nccl_for(n)
            errors = [abs(all_reduce(b, n, link, fabric.algorithm).seconds / t - 1) for g, b, t in data
                      if g == n and b >= 64 * 1024]
            print(f"  {n} GPUs: bus {bus / 1e9:5.2f} GB/s = {bus / fabric.nccl.bandwidth_bytes_per_s:.3f} of "
                  f"{fabric.nccl.bandwidth_bytes_per_s / 1e9:.0f}; preset {link.efficiency:.3f}: "
                  f"|err| median {statistics.median(errors):.0%}, worst {max(errors):.0%} ({len(errors)} rows)")


if __name__ == "__main__":
    main()
