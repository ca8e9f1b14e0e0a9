"""How fast each engine's GEMMs run, per GPU and weight format, from NVIDIA aiconfigurator's measured GEMM tables:
the values of the GPU presets' ``latency.gemm_memory_efficiency`` and the engine presets'
``kernels.gemm_memory_efficiency`` (small-M weight streaming) and ``kernels.gemm_efficiency`` (large-GEMM compute).

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install
aiconfigurator==0.12.0``; it brings pandas and pyarrow) and run

    python benchmarks/validation/gemm_rates_fit.py [--overlap] [PATH/TO/aiconfigurator_core/systems/data]

Streaming, the method the GPU presets' ``memory_efficiency`` cites: over the rows with M <= 8 and N x K >= 4096^2,
the median of (weight + activation bytes) / (time - the GPU preset's GEMM floor) / datasheet bandwidth.
Compute, the GPU presets' ``gemm_efficiency`` model (peak x efficiency x K / (K + K0), tfcalc/calc/kernels.py): over
the rows with M, N >= 4096, the median of 2 M N K / ((time - floor) x peak x K / (K + K0)). The vLLM rows check the
method: they give the GPU presets' values within a few per cent (the presets were fitted to them).
The per-tensor fp8 rows time the whole linear layer, the quantisation of its input included: the tables' own
``computescale`` (the dynamic scale's reduction) and ``scale_matrix`` (the cast) at the row's M and K are taken off,
as a checkpoint with static scales runs it with the cast fused into the preceding norm (``fused_activation_quant``)
or priced as its own kernel. SGLang's quantize tables are not comparable (its ``scale_matrix`` is 8 us at M = 8,
five times vLLM's), so its fp8 rows are printed without that correction and not used. Block-fp8 rows include a
per-token-group quantisation no table times, so their compute fraction is printed and not used either.

The older wheels (``pip download aiconfigurator==0.8.0``; unzip it) keep one folder per engine release instead,
``aiconfigurator/systems/data/<gpu>/<engine>/<version>/gemm_perf.txt`` with its quantize tables beside it:
TensorRT-LLM 1.0.0rc3, vLLM 0.12.0, SGLang 0.5.6.post2 and others, the releases NVIDIA's measured serving runs used.
Given such a folder, every release in it is printed (the 16-bit rows there are float16).

``--overlap``: tfcalc's dense GEMM time (``kernels.gemm`` with the engine's rates) over the measured one, median per
band of M over the rows with N, K >= 2048, with the compute and memory times combined as the larger one and as
the p-norm of ``kernels.GEMM_OVERLAP_P`` (the value it prints), for bf16 and per-tensor fp8 (SGLang: bf16 only).
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300", "gb200": "gb200",
           "gb300": "gb300",
           "l40s": "l40s", "rtx_pro_6000_server": "rtx-pro-6000"}
ENGINES = ("vllm", "trtllm", "sglang")
# aiconfigurator gemm_dtype -> weight bytes per element (NVFP4: 4 bits and one fp8 scale per 16)
FORMATS = {"bfloat16": 2, "fp8": 1, "fp8_block": 1, "nvfp4": 9 / 16}
MIN_M = 4096  # compute rows: M, N >= 4096, the GPU presets' method


def _version_key(path: Path) -> tuple[tuple[int, str], ...]:
    """0.5.14 after 0.5.6.post2: the release's numbers compared as numbers, the rest as text."""
    return tuple((int(part), "") if part.isdigit() else (-1, part) for part in re.split(r"[.]|(?<=\d)(?=[a-z])",
                                                                                      path.name))


def _newest(folder: Path) -> Path | None:
    versions = sorted((p for p in folder.glob("*") if (p / "gemm_perf.parquet").exists()), key=_version_key) \
        if folder.exists() else []
    return versions[-1] if versions else None


def _tables(data: Path):  # -> Iterator[tuple[str, str, str, DataFrame, dict]]
    """(system, engine, version, GEMM table, input quantisation by (M, K)) of every table to fit: the newest release
    per engine (aiconfigurator 0.12's ``gemm/<engine>/<version>/*.parquet``), or every release (the older wheels'
    ``<engine>/<version>/*.txt``, module docstring)."""
    import pandas as pd

    for system in SYSTEMS:
        for engine in ENGINES:
            folder = _newest(data / system / "gemm" / engine)
            if folder is not None:
                quant = {} if engine == "sglang" else _quantize(data, system, engine, folder.name)
                yield system, engine, folder.name, pd.read_parquet(folder / "gemm_perf.parquet"), quant
                continue
            releases = (data / system / engine).glob("*/gemm_perf.txt")
            for release in sorted(releases, key=lambda path: _version_key(path.parent)):
                table = pd.read_csv(release)
                table["gemm_dtype"] = table["gemm_dtype"].replace({"float16": "bfloat16"})
                quant = {} if engine == "sglang" else _quant_tables(release.parent, "txt")
                yield system, engine, release.parent.name, table, quant


def _quantize(data: Path, system: str, engine: str, version: str) -> dict[tuple[int, int], float]:
    """(M, K) -> seconds of the fp8 input quantisation the linear layer's row includes (empty: no tables)."""
    return _quant_tables(data / system / "quantize" / engine / version, "parquet")


def _quant_tables(folder: Path, suffix: str) -> dict[tuple[int, int], float]:
    """(M, K) -> seconds of ``computescale`` + ``scale_matrix`` (fp8) in ``folder``'s ``*_perf.<suffix>`` tables;
    empty unless both are there."""
    import pandas as pd

    paths = [folder / f"{name}_perf.{suffix}" for name in ("computescale", "scale_matrix")]
    if not all(path.exists() for path in paths):
        return {}
    out: dict[tuple[int, int], float] = {}
    for path in paths:
        table = pd.read_parquet(path) if suffix == "parquet" else pd.read_csv(path)
        for m, k, ms in table[table.quant_dtype == "fp8"][["m", "k", "latency"]].itertuples(index=False):
            out[(int(m), int(k))] = out.get((int(m), int(k)), 0.0) + ms * 1e-3
    return out


def _compute_fractions(table, fmt: str, quant: dict[tuple[int, int], float], gpu, floor: float) -> list[float]:
    """Per row with M, N >= 4096: achieved FLOP/s over peak x K / (K + K0), its input quantisation taken off."""
    from tfcalc.calc.kernels import GEMM_K0

    compute = {"bfloat16": "bf16", "nvfp4": "fp4"}.get(fmt, "fp8")
    _, peak = gpu.peak_flops(compute)
    k0 = GEMM_K0[compute]
    rows = table[(table.gemm_dtype == fmt) & (table.m >= MIN_M) & (table.n >= MIN_M)]
    out = []
    for m, n, k, ms in rows[["m", "n", "k", "latency"]].itertuples(index=False):
        seconds = ms * 1e-3 - (quant.get((int(m), int(k)), 0.0) if fmt == "fp8" else 0.0) - floor
        if seconds > 0:
            out.append(2.0 * m * n * k / (seconds * peak * k / (k + k0)))
    return out


M_BANDS = ((1, 16), (17, 64), (65, 255), (256, 511), (512, 1023), (1024, 2047), (2048, 4095), (4096, 1 << 30))


def overlap(data: Path) -> None:
    """Predicted / measured dense GEMM time by band of M, the max and the p-norm side by side (module docstring)."""
    import pandas as pd

    from tfcalc.calc import kernels
    from tfcalc.calc.latency import rates_for
    from tfcalc.spec.presets import load_engine, load_gpu

    print(f"predicted / measured GEMM time, median by M band: max | p-norm (p = {kernels.GEMM_OVERLAP_P})")
    print("GPU       engine  format    " + " ".join(f"{lo}-{hi}" if hi < 1 << 30 else f">={lo}" for lo, hi in M_BANDS))
    for system, preset in SYSTEMS.items():
        gpu = load_gpu(preset)
        for engine in ENGINES:
            folder = _newest(data / system / "gemm" / engine)
            if folder is None:
                continue
            rates = rates_for(gpu, load_engine(engine).kernels)
            table = pd.read_parquet(folder / "gemm_perf.parquet")
            quant = {} if engine == "sglang" else _quantize(data, system, engine, folder.name)
            for fmt, compute, bits, name in (("bfloat16", "bf16", 16, "bf16"), ("fp8", "fp8", 8, "fp8_e4m3")):
                if fmt == "fp8" and not quant:
                    continue
                rows = table[(table.gemm_dtype == fmt) & (table.n >= 2048) & (table.k >= 2048)]
                by_band: dict[tuple[int, int], tuple[list[float], list[float]]] = {b: ([], []) for b in M_BANDS}
                for m, n, k, ms in rows[["m", "n", "k", "latency"]].itertuples(index=False):
                    seconds = ms * 1e-3 - (quant.get((int(m), int(k)), 0.0) if fmt == "fp8" else 0.0)
                    cost = kernels.gemm(rates, m, n, k, bits, compute, weight_format=name)
                    if seconds <= 0 or cost.bound == "floor":
                        continue
                    work = cost.seconds - cost.floor_seconds
                    t_compute = 2.0 * m * n * k / rates.gemm_flops_per_s(compute, k, weight_format=name)
                    t_memory = kernels.gemm_compute_seconds(work, t_compute)  # the p-norm is symmetric
                    band = next(b for b in M_BANDS if b[0] <= m <= b[1])
                    by_band[band][0].append((max(t_compute, t_memory) + cost.floor_seconds) / seconds)
                    by_band[band][1].append(cost.seconds / seconds)
                cells = [f"{statistics.median(a):.2f}|{statistics.median(b):.2f}" if a else "-"
                         for a, b in by_band.values()]
                print(f"{preset:<9} {engine:<7} {name:<9} " + " ".join(cells))


def main() -> None:
    import aiconfigurator_core

    from tfcalc.spec.presets import load_gpu

    args = [a for a in sys.argv[1:] if a != "--overlap"]
    data = Path(args[0]) if args else Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    if "--overlap" in sys.argv[1:]:
        overlap(data)
        return
    print("GPU       engine  version      format     rows  streaming (HBM)  rows  compute (peak x K/(K+K0))")
    for system, engine, version, table, quant in _tables(data):
        gpu = load_gpu(SYSTEMS[system])
        floor = gpu.latency.floors_s["gemm"]
        for fmt, width in FORMATS.items():
            rows = table[(table.gemm_dtype == fmt) & (table.m <= 8) & (table.n * table.k >= 4096 ** 2)]
            fractions = []
            for m, n, k, ms in rows[["m", "n", "k", "latency"]].itertuples(index=False):
                seconds = ms * 1e-3 - (quant.get((int(m), int(k)), 0.0) if fmt == "fp8" else 0.0) - floor
                if seconds > 0:
                    fractions.append((n * k * width + m * k * 2 + m * n * 2) / seconds
                                     / gpu.hbm_bandwidth_bytes_per_s)
            compute = _compute_fractions(table, fmt, quant, gpu, floor)
            if fractions or compute:
                note = (" (quantisation not taken off)" if fmt == "fp8" and not quant else
                        " (its input quantisation included)" if fmt in ("fp8_block", "nvfp4") else "")
                stream = f"{statistics.median(fractions):.3f}" if fractions else "-"
                fit = f"{statistics.median(compute):.3f}" if compute else "-"
                print(f"{SYSTEMS[system]:<9} {engine:<7} {version:<12} {fmt:<10} {len(fractions):>5}  {stream:<15}  "
                      f"{len(compute):>4}  {fit}{note}")


if __name__ == "__main__":
    main()
