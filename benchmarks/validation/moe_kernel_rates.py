"""Grouped expert-GEMM efficiency per GPU and compute dtype from aiconfigurator's measured fused-MoE kernels: the
``moe_efficiency`` values of the ``latency:`` blocks in presets/gpus/*.yaml.

aiconfigurator is *not* a tfcalc dependency: install it in a scratch environment (``pip install aiconfigurator``;
its kernel tables ship in the package) and run

    python benchmarks/validation/moe_kernel_rates.py [--engine vllm] [--version V] [--min-tokens 4096] [--by-width]
    python benchmarks/validation/moe_kernel_rates.py --held-out 256   # presets' values on rows 256-4095 tokens
    python benchmarks/validation/moe_kernel_rates.py --expert-floors  # kernels.moe_expert_floors_us of trtllm
    python benchmarks/validation/moe_kernel_rates.py --engine sglang --kernel-source fused_moe_triton
    python benchmarks/validation/moe_kernel_rates.py --engine sglang --kernel-source flashinfer --shapes 7168x2048
    python benchmarks/validation/moe_kernel_rates.py --kernel-source gptossmxfp4 --dequant-ops --max-tp 8
    python benchmarks/validation/moe_kernel_rates.py --engine trtllm --version 1.3.0rc20 --compare
    python benchmarks/validation/moe_kernel_rates.py --engine sglang --kernel-source fused_moe_triton --large-m
    python benchmarks/validation/moe_kernel_rates.py --engine sglang --expert-parallel fp8_block
    python benchmarks/validation/moe_kernel_rates.py --ep-floor w4a16_mxfp4 --kernel-source gptoss
    python benchmarks/validation/moe_kernel_rates.py --engine trtllm --row-cost nvfp4 --kernel-source cutlass
    python benchmarks/validation/moe_kernel_rates.py --autotuned fp8
    python benchmarks/validation/moe_kernel_rates.py --engine sglang --kernel-source flashinfer_cutlass --plain \
        --arch-stream

For every GPU with a measured table (aiconfigurator_core/systems/data/<gpu>/moe/<engine>/<newest>/moe_perf), the
rows with balanced routing (each expert gets exactly T k / E tokens), >= ``--min-tokens`` tokens and no expert
parallelism are priced by ``tfcalc.calc.kernels.moe_experts`` with the table's deterministic expert counts in place
of random routing; the efficiency printed is the one that makes the median of tfcalc / measured 1 over all the
table's shapes (models, tp slices) of that weight format, found by bisection. The presets take bf16 from the
bfloat16 rows, fp8 from the fp8_block rows (the format fp8 MoE checkpoints ship in: DeepSeek-V3, Qwen3 FP8) and fp4
from the nvfp4 rows; MXFP4 experts on Hopper run weight-only at the bf16 value (their own fit is printed beside).
``--by-width`` prints the ratio per expert width at that efficiency: what is left is shape dependence the model
does not have. ``--held-out N`` prices the rows with N to --min-tokens tokens (left out of the fit) at the presets'
own values and prints the median tfcalc / measured (the check of the fit on points it did not see).

``--plain`` prices the rows as experts of two matrices (up, down; Nemotron-H's relu^2 MoE) instead of three.
``--engine sglang|trtllm`` fits (or with ``--held-out``, checks) an engine preset's ``kernels.moe_efficiency`` on
that engine's tables the same way (the held-out check prices at the engine's value where it has one, else the GPU
preset's); ``--kernel-source TEXT`` keeps the rows of one kernel (an engine's table can hold several: SGLang's bf16
has FlashInfer CUTLASS rows beside its default Triton ones). ``--compare`` prints the engine's latency over vLLM's
newest table on the same rows (weight format, tokens, shapes, tp; balanced, ep 1) per GPU and kernel pair: whether
the engines' kernels really differ, independently of tfcalc's model.

``--moe-stream`` fits, per GPU and weight format, the fraction of the datasheet bandwidth the expert weights
stream at while each expert gets one smallest row tile (2 <= T, T k / E <= 8): the GPU presets'
``latency.moe_memory_efficiency`` (vLLM's tables, the default engine's), where it differs from the GEMV figure
``memory_efficiency``.

``--tuned yes|no`` keeps the rows of the formats an engine lists tuned kernel shapes for (SGLang's and vLLM's Triton
config files, ``kernels.moe_tuned_shapes``), those whose shape (local experts, per-rank width) has a config or those
without: the fit is then ``moe_efficiency`` or ``moe_untuned_efficiency`` (with ``--large-m``,
``moe_untuned_large_m_memory_efficiency``).

``--large-m`` fits, per weight format, the fraction of the datasheet bandwidth the weight stream reaches once the
tokens outnumber the experts (rows of E < T < --min-tokens; an engine's ``kernels.moe_large_m_memory_efficiency``),
with the rows at T <= E beside it: where a kernel's default tile configuration changes at M = E (SGLang's Triton).

``--expert-parallel DTYPE`` prices the balanced rows of one table dtype whose experts are split by expert
parallelism alone (ep 1-16) at their local experts and prints the median tfcalc / measured per ep and token band:
whether the engine's kernel shrinks with its share of the experts as tfcalc's does. ``w4a16_mxfp4`` rows are a
weight-only kernel on every GPU (``table_mode``: vLLM's MXFP4 x BF16 on a B200 too).

``--ep-floor DTYPE`` prices the balanced rows of one table dtype whose experts are split by expert parallelism
alone at <= 16 tokens and prints what ep 2-16 adds to the fused MoE's fixed cost over ep 1 (the median of measured
less priced, ep > 1 less ep 1, at 1 token; 2-16 tokens held out): ``kernels.moe_ep_floors_us``.

``--autotuned DTYPE`` prices one table dtype's balanced ep-1 gated rows at the vllm preset, on TensorRT-LLM
1.3.0rc20's table (its collector autotunes the CUTLASS MoE) and on vLLM's newest (its collector runs FlashInfer's
CUTLASS MoE at the heuristic tactics, while a vLLM server autotunes them at start-up), and prints tfcalc / measured
per token band on every GPU but the B200: the per-tensor fp8 (ModelOpt) experts' rates follow the autotuned kernel.

``--arch-stream`` (with ``--kernel-source``) fits one architecture's fused MoE that an engine runs at heuristic
tactics (SGLang's FlashInfer CUTLASS MoE for Nemotron-H on Hopper, not autotuned): the weight stream at every token
count and the fixed cost over the balanced ep-1 rows below --min-tokens, the grouped efficiency from --min-tokens up
(``kernels.moe_by_architecture``'s memory_efficiency, floors_us, efficiency).

``--architecture CLASS`` prices at the engine's fused MoE for that model architecture (``kernels.moe_by_architecture``:
its efficiency, floors, weight-only kinds and expert-parallel rows) in ``--held-out``, ``--format-floor`` and
``--expert-parallel``: vLLM's Marlin experts for Kimi K3 (``--kernel-source marlin``).

``--expert-floors`` reads TensorRT-LLM's tables (1.3.0rc20) at 1 token: each row's time less tfcalc's price of it
without a per-expert cost, against the experts on the GPU (num_experts / ep). The least-squares slope through the
origin over the ep-1 rows with 128-512 experts on the H200 is the trtllm preset's per-local-expert cost; the same
slope on the H100 and B200, and the residuals of the ep > 1 rows (1-256 local experts) at it, are held out. The
nvfp4 rows (its CUTLASS flow only, not the opt-in min-latency kernel) are fitted on the B200 the same way, the B300
and the ep > 1 rows held out (the preset's nvfp4 entry).
"""

from __future__ import annotations

import argparse
import glob
import math
import statistics
from collections.abc import Callable
from pathlib import Path

GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300", "a100_sxm": "a100-80gb",
        "l40s": "l40s", "rtx_pro_6000_server": "rtx-pro-6000"}
WEIGHTS = {"bfloat16": "bf16", "fp8_block": "fp8_block", "fp8": "fp8_e4m3", "w4a16_mxfp4": "mxfp4", "nvfp4": "nvfp4",
           "w4a8_mxfp4_mxfp8": "mxfp4", "int4_wo": "int4-g128-sym"}


ALL_TOKENS = 1 << 30  # the open end of a token band
GATED = True  # --plain: the rows time experts of two matrices (up, down: Nemotron-H's relu^2), not gate + up + down
ARCHITECTURE = None  # --architecture: price at the engine's kernel for that model architecture (moe_by_architecture)


def table_mode(moe_dtype: str, gpu: object) -> object:
    """How tfcalc runs a table dtype's experts on ``gpu`` (``latency.linear_mode``): ``w4a16_mxfp4`` rows are a
    weight-only kernel (bf16 activations) even where the chip has fp4 tensor cores (vLLM's default on B200)."""
    from tfcalc.calc.latency import linear_mode
    from tfcalc.dtypes import get_dtype

    weight_only = frozenset({"fp4"}) if moe_dtype == "w4a16_mxfp4" else frozenset()
    return linear_mode(get_dtype(WEIGHTS[moe_dtype]), gpu, weight_only=weight_only)


def _balanced_rows(experts: int, top_k: int, tokens: int, skew: float = 0.0) -> tuple[float, float, float]:
    """The tables' balanced routing: every expert gets T k / E tokens, in tiles of the kernels' power of two
    (``kernels.routed_rows``' distinct experts, rows computed and row tiles)."""
    from tfcalc.calc.kernels import MOE_TILE_MAX, MOE_TILE_MIN

    pairs = tokens * top_k
    if pairs < experts:
        return float(pairs), float(pairs * MOE_TILE_MIN), float(pairs)
    mean = pairs / experts
    tile = min(max(1 << (math.ceil(mean) - 1).bit_length(), MOE_TILE_MIN), MOE_TILE_MAX)
    per_expert = math.ceil(mean / tile)
    return float(experts), experts * per_expert * tile, float(experts * per_expert)


def expert_floors(root: Path, version: str = "1.3.0rc20") -> None:
    """The per-local-expert fixed cost of TensorRT-LLM's fused MoE at 1 token (module docstring)."""
    import dataclasses

    import pandas as pd

    from tfcalc.calc import kernels
    from tfcalc.calc.latency import rates_for
    from tfcalc.spec.presets import load_engine, load_gpu

    fitted = None
    nvfp4 = None  # the CUTLASS NVFP4 slope, fitted on the B200 (B300 held out)
    for system in ("h200_sxm", "h100_sxm", "b200_sxm", "b300_sxm"):
        table = root / system / "moe" / "trtllm" / version / "moe_perf.parquet"
        if not table.exists():
            continue
        df = pd.read_parquet(table)
        gpu = load_gpu(GPUS[system])
        rates = dataclasses.replace(rates_for(gpu, load_engine("trtllm").kernels), moe_expert_floors={})
        for weights in ("fp8_block", "bfloat16", "fp8", "nvfp4"):
            mode = table_mode(weights, gpu)
            points = []  # (local experts, ep, measured - priced seconds)
            rows = df[(df.num_tokens == 1) & (df.distribution == "balanced") & (df.moe_dtype == weights)]
            if weights == "nvfp4":  # the default CUTLASS flow (not the opt-in TRTLLM-gen min-latency kernel)
                rows = rows[rows.kernel_source == "moe_torch_flow_cutlass"]
            for row in rows.itertuples():
                local = row.num_experts // row.moe_ep_size
                c = kernels.moe_experts(rates, tokens=1, experts_local=local, experts_total=row.num_experts,
                                        top_k=row.topk, hidden=row.hidden_size,
                                        expert_width=row.inter_size // row.moe_tp_size, gated=GATED,
                                        weight_bits=mode.bits, compute=mode.compute, dequant=mode.dequant,
                                        weight_format=mode.weights)
                points.append((local, row.moe_ep_size, row.latency * 1e-3 - c.seconds))
            train = [(x, y) for x, ep, y in points if ep == 1 and 128 <= x <= 512]
            if not train:
                continue
            slope = sum(x * y for x, y in train) / sum(x * x for x, _ in train)
            if system == "h200_sxm" and weights == "fp8_block":
                fitted = slope
            if system == "b200_sxm" and weights == "nvfp4":
                nvfp4 = slope
            at = (nvfp4 if weights == "nvfp4" else fitted) or slope
            held = [abs(y - at * x) for x, ep, y in points if ep > 1]
            print(f"{GPUS[system]:10s} trtllm {version} {weights:10s} slope {slope * 1e6:.3f} us per local expert "
                  f"({len(train)} rows, ep 1, 128-512 experts); ep > 1 rows at {at * 1e6:.3f}: median "
                  f"|residual| {statistics.median(held) * 1e6:.1f} us ({len(held)} rows)")


def format_floors(root: Path, engine: str, version: str, weights: str, kernel_source: str = "") -> None:
    """An engine's fused-MoE fixed cost for one table dtype per GPU (``kernels.moe_floors_us``): the median, over
    the balanced ep-1 rows at 1 token, of the measured time less tfcalc's price of it without any floor."""
    import dataclasses

    import pandas as pd

    from tfcalc.calc import kernels
    from tfcalc.calc.latency import rates_for
    from tfcalc.spec.presets import load_engine, load_gpu

    kernels_spec = load_engine(engine).kernels
    for system, preset in GPUS.items():
        table = _newest(root, system, engine, version)
        if table is None:
            continue
        df = pd.read_parquet(table)
        rows = df[(df.num_tokens == 1) & (df.distribution == "balanced") & (df.moe_ep_size == 1)
                  & (df.moe_dtype == weights) & df.kernel_source.str.contains(kernel_source, regex=False)]
        if rows.empty:
            continue
        gpu = load_gpu(preset)
        base = rates_for(gpu, kernels_spec, architecture=ARCHITECTURE)
        rates = dataclasses.replace(base, floors={**base.floors, "moe": 0.0}, moe_format_floors={},
                                    moe_expert_floors={})
        mode = table_mode(weights, gpu)
        left = []
        for row in rows.itertuples():
            c = kernels.moe_experts(rates, tokens=1, experts_local=row.num_experts, experts_total=row.num_experts,
                                    top_k=row.topk, hidden=row.hidden_size,
                                    expert_width=row.inter_size // row.moe_tp_size, gated=GATED,
                                    weight_bits=mode.bits, compute=mode.compute, dequant=mode.dequant,
                                    weight_format=mode.weights)
            left.append(row.latency * 1e-3 - c.seconds)
        print(f"{preset:10s} {engine} {table.parent.name} {weights}: fixed cost at 1 token "
              f"{statistics.median(left) * 1e6:.1f} us (median of {len(left)} rows, "
              f"{min(left) * 1e6:.1f}-{max(left) * 1e6:.1f}; {', '.join(sorted(set(rows.kernel_source)))[:60]})")


def _newest_tables(root: Path, engine: str, version: str):  # -> Iterator[tuple[str, pandas.DataFrame]]
    """(GPU preset name, the engine's newest table on it, or the named version's) for every GPU that has one, with
    tfcalc's routing set to the tables' deterministic one (``_balanced_rows``)."""
    import pandas as pd

    from tfcalc.calc import kernels

    kernels.routed_rows = _balanced_rows
    for system, preset in GPUS.items():
        table = _newest(root, system, engine, version)
        if table is not None:
            yield preset, table.parent.name, pd.read_parquet(table)


def ep_floors(root: Path, engine: str, version: str, weights: str, kernel_source: str = "") -> None:
    """What an engine's fused MoE of one table dtype adds under expert parallelism, per GPU
    (``kernels.moe_ep_floors_us``): over the balanced rows with the experts split by ep alone, the median of the
    measured time less tfcalc's price of it (without this cost) at ep 2-16 less the same median at ep 1, at 1 token;
    the same difference over 2-16 tokens is printed beside it as the held-out check."""
    import dataclasses

    from tfcalc.calc import kernels
    from tfcalc.calc.latency import rates_for
    from tfcalc.spec.presets import load_engine, load_gpu

    for preset, table_version, df in _newest_tables(root, engine, version):
        rows = df[(df.distribution == "balanced") & (df.moe_dtype == weights) & (df.moe_tp_size == 1)
                  & (df.moe_ep_size <= 16) & (df.num_tokens <= 16)
                  & df.kernel_source.str.contains(kernel_source, regex=False)]
        if rows.empty:
            continue
        gpu = load_gpu(preset)
        rates = dataclasses.replace(rates_for(gpu, load_engine(engine).kernels), moe_ep_floors={})
        mode = table_mode(weights, gpu)
        left: dict[tuple[bool, bool], list[float]] = {}  # (ep > 1, 1 token) -> measured - priced
        for row in rows.itertuples():
            c = kernels.moe_experts(rates, tokens=row.num_tokens, experts_local=row.num_experts // row.moe_ep_size,
                                    experts_total=row.num_experts, top_k=row.topk, hidden=row.hidden_size,
                                    expert_width=row.inter_size, gated=GATED, weight_bits=mode.bits,
                                    compute=mode.compute, dequant=mode.dequant, weight_format=mode.weights)
            left.setdefault((row.moe_ep_size > 1, row.num_tokens == 1), []).append(row.latency * 1e-3 - c.seconds)
        if not all(left.get(k) for k in ((True, True), (False, True), (True, False), (False, False))):
            continue
        fit, held = (statistics.median(left[(True, one)]) - statistics.median(left[(False, one)])
                     for one in (True, False))
        print(f"{preset:10s} {engine} {table_version} {weights}: ep 2-16 add {fit * 1e6:.1f} us at 1 token "
              f"({len(left[(True, True)])} / {len(left[(False, True)])} rows at ep > 1 / ep 1); held out, 2-16 "
              f"tokens: {held * 1e6:.1f} us ({len(left[(True, False)])} / {len(left[(False, False)])})")


def expert_parallel(root: Path, engine: str, version: str, weights: str, kernel_source: str = "") -> None:
    """tfcalc / measured over the balanced rows of ``weights`` (of one kernel where ``kernel_source`` names it) with
    experts sliced by expert parallelism only (moe_tp 1), per ep and token band, each row priced at its local experts
    (E / ep): whether an engine's fused MoE shrinks with its share of the experts as the model does."""
    from tfcalc.calc import kernels
    from tfcalc.calc.latency import rates_for
    from tfcalc.spec.presets import load_engine, load_gpu

    for preset, table_version, df in _newest_tables(root, engine, version):
        df = df[(df.distribution == "balanced") & (df.moe_dtype == weights) & (df.moe_tp_size == 1)
                & df.kernel_source.str.contains(kernel_source, regex=False)]
        if df.empty:
            continue
        gpu = load_gpu(preset)
        rates = rates_for(gpu, load_engine(engine).kernels, architecture=ARCHITECTURE)
        for ep, rows in df.groupby("moe_ep_size"):
            if ep > 16:
                continue
            bands: dict[str, list[float]] = {}
            for row in rows.itertuples():
                mode = table_mode(row.moe_dtype, gpu)
                c = kernels.moe_experts(rates, tokens=row.num_tokens, experts_local=row.num_experts // ep,
                                        experts_total=row.num_experts, top_k=row.topk, hidden=row.hidden_size,
                                        expert_width=row.inter_size, gated=GATED, weight_bits=mode.bits,
                                        compute=mode.compute, dequant=mode.dequant, weight_format=mode.weights)
                band = "< 256" if row.num_tokens < 256 else "256-4095" if row.num_tokens < 4096 else ">= 4096"
                bands.setdefault(band, []).append(c.seconds / (row.latency * 1e-3))
            medians = ", ".join(f"{band} tokens {statistics.median(v):.2f} ({len(v)})" for band, v in bands.items())
            print(f"{preset:10s} {engine} {table_version} {weights} ep {ep:2d}: tfcalc/measured median {medians}")


def _newest(root: Path, system: str, engine: str, version: str = "") -> Path | None:
    """The engine's moe_perf table for that GPU: ``version``'s, else the newest release's (by version number)."""
    import re

    tables = [Path(t) for t in glob.glob(str(root / system / "moe" / engine / (version or "*") / "moe_perf.parquet"))]
    key = lambda t: [int(n) for n in re.findall(r"\d+", t.parent.name)]  # noqa: E731
    return max(tables, key=key) if tables else None


def compare(root: Path, engine: str, version: str, min_tokens: int, low_tokens: int = 0) -> None:
    """``engine``'s fused-MoE latency over vLLM's newest on the same rows (weight format, tokens, hidden, expert
    width, top-k, experts, tp; balanced routing, ep 1) of each GPU: median and quartiles per kernel pair."""
    import pandas as pd

    keys = ["moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size"]
    for system, preset in GPUS.items():
        mine, vllm = _newest(root, system, engine, version), _newest(root, system, "vllm")
        if mine is None or vllm is None:
            continue
        frames = []
        for table in (mine, vllm):
            df = pd.read_parquet(table)
            tokens = ((df.num_tokens >= low_tokens) & (df.num_tokens < min_tokens) if low_tokens
                      else df.num_tokens >= min_tokens)
            frames.append(df[(df.distribution == "balanced") & (df.moe_ep_size == 1) & tokens])
        both = frames[0].merge(frames[1], on=keys, suffixes=("", "_vllm"))
        for (weights, source, other), rows in sorted(both.groupby(["moe_dtype", "kernel_source",
                                                                   "kernel_source_vllm"])):
            if len(rows) < 5:
                continue
            r = sorted(rows.latency / rows.latency_vllm)
            print(f"{preset:9s} {weights:11s} {engine} {mine.parent.name} / vllm {vllm.parent.name}: median "
                  f"{statistics.median(r):.2f}, quartiles {r[len(r) // 4]:.2f}-{r[3 * len(r) // 4]:.2f} ({len(r)} "
                  f"rows; {source[:32]} / {other[:32]})")


def band_medians(bands: tuple[tuple[int, int], ...], rows: list, ratios: Callable[[list], list[float]]) -> str:
    """"lo-hi: median" of ``ratios`` over the (table row, linear mode) pairs of each token band holding any (a band
    whose hi is ``ALL_TOKENS`` prints as "lo+")."""
    cells = []
    for lo, hi in bands:
        subset = [(row, mode) for row, mode in rows if lo <= row.num_tokens <= hi]
        if subset:
            label = f"{lo}+" if hi == ALL_TOKENS else str(lo) if hi == lo else f"{lo}-{hi}"
            cells.append(f"{label}: {statistics.median(ratios(subset)):.2f}")
    return "; ".join(cells)


def arch_stream_fit(root: Path, engine: str, version: str, kernel_source: str, min_tokens: int) -> None:
    """An architecture's fused MoE held at heuristic tactics (``kernels.moe_by_architecture``: memory_efficiency,
    floors_us, efficiency): on the balanced ep-1 rows of ``kernel_source`` in the engine's table, the weight stream
    (a fraction of the datasheet at every token count) and fixed cost that minimise the scatter of tfcalc / measured
    plus the distance of its median from 1 over the rows below ``min_tokens`` (a grid of 0.01 and 5 us), then the
    grouped efficiency that makes the median 1 over the rows from ``min_tokens`` up (bisection); the medians by
    token band beside it."""
    import dataclasses

    import pandas as pd

    from tfcalc.calc import kernels
    from tfcalc.calc.latency import rates_for
    from tfcalc.spec.presets import load_engine, load_gpu

    kernels.routed_rows = _balanced_rows
    bands = ((1, 1), (2, 16), (17, 256), (257, min_tokens - 1), (min_tokens, ALL_TOKENS))
    for system, preset in GPUS.items():
        table = _newest(root, system, engine, version)
        if table is None:
            continue
        df = pd.read_parquet(table)
        df = df[(df.distribution == "balanced") & (df.moe_ep_size == 1)
                & df.kernel_source.str.contains(kernel_source, regex=False)]
        if df.empty:
            continue
        gpu = load_gpu(preset)
        base = dataclasses.replace(rates_for(gpu, load_engine(engine).kernels), moe_tuned_shapes={})
        for weights, group in df.groupby("moe_dtype"):
            mode = table_mode(str(weights), gpu)
            fmt, rows = mode.weights, [(row, mode) for row in group.itertuples()]

            def ratios(eff: float, stream: float, floor_s: float, subset: list, fmt: str = fmt,
                       base: object = base) -> list[float]:
                return price_ratios(dataclasses.replace(
                    base, moe_efficiency_by_dtype={**base.moe_efficiency_by_dtype, fmt: eff},
                    moe_format_floors={**base.moe_format_floors, fmt: floor_s}, moe_weight_stream={fmt: stream}),
                    subset)

            small = [(row, m) for row, m in rows if row.num_tokens < min_tokens]
            large = [(row, m) for row, m in rows if row.num_tokens >= min_tokens]
            if not small or not large:
                continue
            scores = {}
            for stream in (x / 100 for x in range(5, 51)):
                for floor_us in range(0, 205, 5):
                    r = ratios(1.0, stream, floor_us * 1e-6, small)
                    scores[(stream, floor_us)] = (statistics.pstdev(math.log(x) for x in r)
                                                  + abs(math.log(statistics.median(r))))
            stream, floor_us = min(scores, key=scores.__getitem__)
            eff = fit_efficiency(lambda e, s=stream, f=floor_us, rs=large: ratios(e, s, f * 1e-6, rs))
            cells = band_medians(bands, rows, lambda subset, s=stream, f=floor_us, e=eff: ratios(e, s, f * 1e-6,
                                                                                                    subset))
            plain = "" if GATED else ", plain"
            print(f"{preset:10s} {engine} {table.parent.name} {weights} ({len(rows)} rows{plain}): "
                  f"memory_efficiency {stream:.2f}, floors_us {floor_us}, efficiency {eff:.3f}; tfcalc / measured "
                  f"median {cells}")


def autotuned(root: Path, weights: str, trtllm_version: str = "1.3.0rc20") -> None:
    """tfcalc's vLLM price (its preset) over the measured time of one table dtype's balanced ep-1 rows, by token band,
    on TensorRT-LLM's table (its collector autotunes the CUTLASS MoE) and on vLLM's newest (its collector runs
    FlashInfer's CUTLASS MoE at the heuristic tactics, no autotune): which of the two tfcalc's vLLM rates follow."""
    import pandas as pd

    from tfcalc.calc import kernels
    from tfcalc.calc.latency import rates_for
    from tfcalc.spec.presets import load_engine, load_gpu

    bands = ((1, 1), (2, 16), (17, 256), (257, 4095), (4096, ALL_TOKENS))
    kernels.routed_rows = _balanced_rows
    for system, preset in GPUS.items():
        tables = {"trtllm " + trtllm_version: root / system / "moe" / "trtllm" / trtllm_version / "moe_perf.parquet",
                  "vllm (newest)": _newest(root, system, "vllm", "")}
        gpu = load_gpu(preset)
        if gpu.name == "b200":  # vLLM's per-tensor FP8 MoE there is FlashInfer's TRT-LLM kernel, not CUTLASS
            continue
        rates, mode = rates_for(gpu, load_engine("vllm").kernels), table_mode(weights, gpu)
        for label, table in tables.items():
            if table is None or not table.exists():
                continue
            df = pd.read_parquet(table)
            df = df[(df.distribution == "balanced") & (df.moe_ep_size == 1) & (df.moe_dtype == weights)
                    & ~df.kernel_source.str.contains("nongated")]
            if df.empty:
                continue
            cells = band_medians(bands, [(row, mode) for row in df.itertuples()],
                                 lambda subset, rates=rates: price_ratios(rates, subset))
            kernel = ", ".join(sorted(set(df.kernel_source)))[:40]
            print(f"{preset:10s} {weights} rows of {label:16s} ({len(df)}, gated, {kernel}): tfcalc vllm / measured "
                  f"median {cells}")


def row_cost(root: Path, engine: str, version: str, weights: str, kernel_source: str, min_tokens: int) -> None:
    """Per GPU: each kernel's time split into a part that grows with the expert's per-rank width (the GEMMs) and
    one that does not (what the fused MoE moves per routed token row: permute, quantize, finalize). For every shape
    and token count with three or more tp slices (balanced, ep 1, >= ``min_tokens``), a least-squares line of
    latency on width; its intercept per routed pair and hidden element, in ps, for ``engine``'s rows (those whose
    kernel_source holds ``kernel_source``) and vLLM's, and their median difference in bytes per element at the GPU
    preset's bandwidth x memory_efficiency (``kernels.moe_row_bytes``)."""
    import numpy as np
    import pandas as pd

    from tfcalc.spec.presets import load_gpu

    keys = ["hidden_size", "inter_size", "topk", "num_experts", "num_tokens"]

    def intercepts(table: Path, source: str) -> dict[tuple, float]:
        df = pd.read_parquet(table)
        df = df[(df.moe_dtype == weights) & (df.distribution == "balanced") & (df.moe_ep_size == 1)
                & (df.num_tokens >= min_tokens) & df.kernel_source.str.contains(source, regex=False)]
        out = {}
        for key, rows in df.groupby(keys):
            by_tp = rows.groupby("moe_tp_size").latency.min()
            if len(by_tp) < 3:
                continue
            width = key[1] / by_tp.index.to_numpy(dtype=float)
            slope, intercept = np.polyfit(width, by_tp.to_numpy() * 1e-3, 1)
            out[key] = intercept / (key[4] * key[2] * key[0]) * 1e12  # ps per pair x hidden element
        return out

    for system, preset in GPUS.items():
        mine, vllm = _newest(root, system, engine, version), _newest(root, system, "vllm")
        if mine is None or vllm is None:
            continue
        a, b = intercepts(mine, kernel_source), intercepts(vllm, "")
        common = sorted(set(a) & set(b))
        if not common:
            continue
        gpu = load_gpu(preset)
        stream = gpu.hbm_bandwidth_bytes_per_s * gpu.latency.memory_efficiency
        extra = statistics.median(a[k] - b[k] for k in common)
        print(f"{preset:9s} {weights:6s} {engine} {mine.parent.name} ({kernel_source or 'all'}): "
              f"{statistics.median(a[k] for k in common):.2f} ps per pair x hidden element, vLLM "
              f"{statistics.median(b[k] for k in common):.2f}; difference {extra:.2f} ps = "
              f"{extra * 1e-12 * stream:.1f} B at {stream / 1e12:.2f} TB/s ({len(common)} shape x token groups)")


def fit_efficiency(ratios: Callable[[float], list[float]]) -> float:
    """The grouped-GEMM efficiency that makes the median tfcalc / measured 1, by bisection in [0.05, 3]."""
    lo, hi = 0.05, 3.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if statistics.median(ratios(mid)) > 1 else (lo, mid)
    return (lo + hi) / 2


def held_out_rows(table: object, system: str, args: argparse.Namespace, weights: str) -> list:
    """The table's balanced ep-1 rows of ``weights`` with 256 to --min-tokens tokens (the fit's held-out set)."""
    from tfcalc.spec.presets import load_gpu

    df = table[(table.distribution == "balanced") & (table.moe_ep_size == 1) & (table.moe_dtype == weights)
               & (table.num_tokens >= 256) & (table.num_tokens < args.min_tokens)
               & table.kernel_source.str.contains(args.kernel_source, regex=False)]
    gpu = load_gpu(GPUS[system])
    return [(row, table_mode(weights, gpu)) for row in df.itertuples()]


def scan_k0(base: object, compute: str, rows: list, ratios: Callable[..., list[float]], held: list,
            k0s: list[float]) -> None:
    """For each --k0 value: the efficiency fitted at that grouped-GEMM K0 (and the fraction of peak it means as K
    grows, which a real kernel keeps below 1), the scatter of tfcalc / measured over the fit rows (standard deviation
    of its log: the shape dependence left) and the held-out rows' median. The presets take the K0 of least scatter
    whose fraction of peak stays at most 1."""
    import dataclasses

    dtype, fmt = base.peak(compute)[0], rows[0][1].weights
    for k0 in k0s:
        rates = dataclasses.replace(base, moe_k0={**base.moe_k0, fmt: k0})  # the rows' format: looked up first
        eff = fit_efficiency(lambda e, rates=rates: ratios(e, rows, rates))
        r = sorted(ratios(eff, rows, rates))
        h = sorted(ratios(eff, held, rates)) if held else [float("nan")]
        spread = statistics.pstdev(math.log(x) for x in r)
        ceiling = eff * base.gemm_efficiency.get(dtype, 0.0)  # fraction of peak as K grows: at most 1 to be real
        print(f"    K0 {k0:6g}: moe_efficiency {eff:.3f} ({ceiling:.2f} of peak at large K), sd(log tfcalc/measured) "
              f"{spread:.3f}, quartiles "
              f"{r[len(r) // 4]:.2f}-{r[3 * len(r) // 4]:.2f}; held out {len(held)} rows: median "
              f"{statistics.median(h):.2f}, quartiles {h[len(h) // 4]:.2f}-{h[3 * len(h) // 4]:.2f}")


def price_ratios(rates: object, rows: list) -> list[float]:
    """tfcalc / measured for each (table row, linear mode) of ``rows`` at ``rates``, the table's own expert counts."""
    from tfcalc.calc import kernels

    return [kernels.moe_experts(rates, tokens=row.num_tokens, experts_local=row.num_experts,
                                experts_total=row.num_experts, top_k=row.topk, hidden=row.hidden_size,
                                expert_width=row.inter_size // row.moe_tp_size, gated=GATED, weight_bits=mode.bits,
                                compute=mode.compute, dequant=mode.dequant, weight_format=mode.weights).seconds
            / (row.latency * 1e-3) for row, mode in rows]


def large_m_fit(preset: str, args: argparse.Namespace, weights: str, rows: list, base: object) -> None:
    """The fraction of the datasheet bandwidth that makes the median tfcalc / measured 1 over the rows with more
    tokens than experts and fewer than --min-tokens (by bisection in [0.05, 1], at the preset's other values), with
    the rows at or below the experts' count beside it (their median at the preset, the fraction unused there)."""
    import dataclasses

    def ratios(fraction: float, subset: list) -> list[float]:
        fmt = subset[0][1].weights
        return price_ratios(dataclasses.replace(base, moe_large_m_memory={fmt: fraction} if fraction else {}), subset)

    large = [(row, mode) for row, mode in rows if row.num_tokens > row.num_experts]
    small = [(row, mode) for row, mode in rows if row.num_tokens <= row.num_experts]
    if not large or not small:
        return
    lo, hi = 0.05, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if statistics.median(ratios(mid, large)) > 1 else (lo, mid)
    r, before, s = sorted(ratios(lo, large)), sorted(ratios(0.0, large)), sorted(ratios(0.0, small))
    print(f"{preset:10s} {args.engine} {weights:12s} large-M stream {lo:.2f} of the datasheet ({len(r)} rows, "
          f"E < T < {args.min_tokens}: quartiles {r[len(r) // 4]:.2f}-{r[3 * len(r) // 4]:.2f}; without it median "
          f"{statistics.median(before):.2f}); T <= E: median {statistics.median(s):.2f}, quartiles "
          f"{s[len(s) // 4]:.2f}-{s[3 * len(s) // 4]:.2f} ({len(s)} rows)")


def moe_stream_fit(preset: str, args: argparse.Namespace, weights: str, rows: list, base: object) -> None:
    """The fraction of the datasheet bandwidth (the GPU preset's ``latency.moe_memory_efficiency`` for the rows'
    storage format) that makes the median tfcalc / measured 1 over the rows of 2 or more tokens whose experts get one
    smallest row tile each (``kernels.moe_one_tile_per_expert``), where the expert weights' stream sets the time (by
    bisection in [0.3, 1], at the preset's other values), with the median before it, that of the rows among them
    with more tokens than experts, and the rows beyond, to --min-tokens tokens, beside it."""
    import dataclasses

    def ratios(fraction: float, subset: list) -> list[float]:
        fmt = subset[0][1].weights
        own = {**base.moe_memory_efficiency, fmt: fraction} if fraction else base.moe_memory_efficiency
        return price_ratios(dataclasses.replace(base, moe_memory_efficiency=own), subset)

    from tfcalc.calc import kernels

    small = [(row, mode) for row, mode in rows
             if 2 <= row.num_tokens and kernels.moe_one_tile_per_expert(row.num_tokens, row.topk, row.num_experts)]
    large = [(row, mode) for row, mode in rows
             if not kernels.moe_one_tile_per_expert(row.num_tokens, row.topk, row.num_experts)
             and row.num_tokens < args.min_tokens]
    between = [(row, mode) for row, mode in small if row.num_tokens > row.num_experts]
    if not small:
        return
    lo, hi = 0.3, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if statistics.median(ratios(mid, small)) > 1 else (lo, mid)
    r, before = sorted(ratios(lo, small)), sorted(ratios(0.0, small))
    beside = f"; beyond, < {args.min_tokens}: median {statistics.median(ratios(lo, large)):.2f}" if large else ""
    if between:
        beside += f"; T > E among them: median {statistics.median(ratios(lo, between)):.2f} ({len(between)} rows)"
    print(f"{preset:10s} {args.engine} {weights:12s} fused-MoE stream {lo:.2f} of the datasheet ({len(r)} rows, "
          f"2 <= T, T k / E <= {kernels.MOE_OWN_STREAM_ROWS}: quartiles {r[len(r) // 4]:.2f}-"
          f"{r[3 * len(r) // 4]:.2f}; at the preset median "
          f"{statistics.median(before):.2f}){beside}")


def large_expert_fit(preset: str, args: argparse.Namespace, weights: str, rows: list, held: list,
                     base: object) -> None:
    """The engine's large-expert slowdown for one format (``kernels.moe_large_expert``: [MiB, slowdown]): over a grid
    of thresholds (4-256 MiB of one expert's per-rank gate/up matrix) and slowdowns (0-3), the pair of least scatter
    of log(tfcalc / measured) over the rows at the preset's efficiency; with the rows' medians by that matrix's size
    before and after, and the held-out rows' (256 to --min-tokens tokens) at the pair."""
    import dataclasses

    from tfcalc.calc import kernels

    fmt = rows[0][1].weights

    def priced(pair: tuple[float, float] | None, subset: list) -> list[float]:
        table = {**base.moe_large_expert, fmt: (pair[0] * 2**20, pair[1])} if pair else {
            k: v for k, v in base.moe_large_expert.items() if k != fmt}
        return price_ratios(dataclasses.replace(base, moe_large_expert=table), subset)

    def spread(values: list[float]) -> float:
        return statistics.pstdev(math.log(x) for x in values)

    if args.joint:  # the efficiency refitted at each pair (a coarser grid), kept at most 1 of the peak
        ceiling = 1 / base.gemm_efficiency.get(base.peak(rows[0][1].compute)[0], 1.0)

        def at(pair: tuple[float, float], start: object = base) -> float:
            return fit_efficiency(lambda e: price_ratios(dataclasses.replace(
                start, moe_efficiency_by_dtype={**start.moe_efficiency_by_dtype, fmt: e},
                moe_large_expert={**start.moe_large_expert, fmt: (pair[0] * 2**20, pair[1])}), rows))

        pairs = [(mib, slow / 4) for mib in (4, 8, 12, 16, 24, 32, 44, 64, 96, 128) for slow in range(13)]
        fitted = {pair: at(pair) for pair in pairs}
        allowed = [pair for pair in pairs if fitted[pair] <= ceiling] or pairs

        def joint_spread(pair: tuple[float, float]) -> float:
            rates = dataclasses.replace(base, moe_efficiency_by_dtype={**base.moe_efficiency_by_dtype,
                                                                        fmt: fitted[pair]})
            table = {**rates.moe_large_expert, fmt: (pair[0] * 2**20, pair[1])}
            return spread(price_ratios(dataclasses.replace(rates, moe_large_expert=table), rows))

        best = min(allowed, key=joint_spread)
        base = dataclasses.replace(base, moe_efficiency_by_dtype={**base.moe_efficiency_by_dtype, fmt: fitted[best]})
        print(f"{preset:10s} {args.engine} {weights:12s} joint fit: efficiency {fitted[best]:.2f} at large expert "
              f"[{best[0]}, {best[1]:.2f}] (efficiency at most {ceiling:.2f}: 1 of the peak)")
    else:
        best = min(((mib, slow / 20) for mib in range(4, 257, 2) for slow in range(61)),
                   key=lambda pair: spread(priced(pair, rows)))

    def by_size(values: list[float], subset: list) -> str:
        sizes: dict[int, list[float]] = {}
        for (row, mode), value in zip(subset, values, strict=True):
            mib = kernels.moe_expert_matrix_bytes(base, mode.weights, row.hidden_size,
                                                  2 * row.inter_size // row.moe_tp_size, mode.bits) / 2**20
            sizes.setdefault(int(mib), []).append(value)
        return " ".join(f"{m}:{statistics.median(v):.2f}" for m, v in sorted(sizes.items()))

    before, after = priced(None, rows), priced(best, rows)
    print(f"{preset:10s} {args.engine} {weights:12s} large expert [{best[0]}, {best[1]:.2f}] ({len(rows)} rows; "
          f"sd(log tfcalc/measured) {spread(before):.3f} -> {spread(after):.3f}, median "
          f"{statistics.median(before):.2f} -> {statistics.median(after):.2f})")
    print(f"    by gate/up MiB, without: {by_size(before, rows)}")
    print(f"    by gate/up MiB, with:    {by_size(after, rows)}")
    if held:
        h_before, h_after = priced(None, held), priced(best, held)
        print(f"    held out ({len(held)} rows of {args.held_out or 256}-{args.min_tokens - 1} tokens): median "
              f"{statistics.median(h_before):.2f} -> {statistics.median(h_after):.2f}, sd(log) "
              f"{spread(h_before):.3f} -> {spread(h_after):.3f}; with: {by_size(h_after, held)}")


def main() -> None:
    import dataclasses

    import aiconfigurator_core
    import pandas as pd

    from tfcalc.calc import kernels
    from tfcalc.calc.latency import rates_for
    from tfcalc.spec.presets import load_engine, load_gpu

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--version", default="", help="the engine version's table (default: the newest)")
    parser.add_argument("--min-tokens", type=int, default=4096)
    parser.add_argument("--by-width", action="store_true")
    parser.add_argument("--held-out", type=int, default=0, metavar="N",
                        help="price rows with N to --min-tokens tokens at the presets' values")
    parser.add_argument("--expert-floors", action="store_true", help="TensorRT-LLM's per-local-expert cost")
    parser.add_argument("--kernel-source", default="", metavar="TEXT", help="only rows whose kernel_source has TEXT")
    parser.add_argument("--plain", action="store_true",
                        help="price the rows as plain experts (up and down, no gate: Nemotron-H's relu^2 MoE)")
    parser.add_argument("--compare", action="store_true",
                        help="--engine's latency / vLLM's on the same shapes, GPU and weight format")
    parser.add_argument("--dequant-ops", action="store_true",
                        help="weight-only formats: the dequantisation instructions per weight that make the median "
                             "tfcalc / measured 1 over rows of 16 to --min-tokens tokens")
    parser.add_argument("--shapes", default="", metavar="HxI,...",
                        help="only rows of these (hidden size x expert width before slicing) shapes: one model "
                             "architecture's own rows (7168x2048: DeepSeek-V3 and Kimi K2)")
    parser.add_argument("--max-tp", type=int, default=0, metavar="N",
                        help="only rows whose experts are sliced over at most N GPUs (moe_tp_size)")
    parser.add_argument("--format-floor", default="", metavar="DTYPE",
                        help="the fused MoE's fixed cost at 1 token for one table dtype (kernels.moe_floors_us)")
    parser.add_argument("--ep-floor", default="", metavar="DTYPE",
                        help="what the fused MoE of one table dtype adds under expert parallelism "
                             "(kernels.moe_ep_floors_us)")
    parser.add_argument("--large-m", action="store_true",
                        help="the weight stream's fraction of the datasheet bandwidth once the tokens outnumber the "
                             "experts (kernels.moe_large_m_memory_efficiency), fitted below --min-tokens")
    parser.add_argument("--expert-parallel", default="", metavar="DTYPE",
                        help="a table dtype's balanced rows at ep 1-16 priced at their local experts, by token band")
    parser.add_argument("--row-cost", default="", metavar="DTYPE",
                        help="the width-independent part of --engine's fused MoE per routed row against vLLM's, one "
                             "table dtype (kernels.moe_row_bytes)")
    parser.add_argument("--arch-stream", action="store_true",
                        help="an architecture's fused MoE at heuristic tactics: weight stream, floor, efficiency")
    parser.add_argument("--autotuned", default="", metavar="DTYPE",
                        help="tfcalc's vLLM price of DTYPE's rows on TensorRT-LLM's autotuned table and vLLM's")
    parser.add_argument("--k0", default="", metavar="LIST",
                        help="comma-separated grouped-GEMM K0 values: the fit and its scatter at each")
    parser.add_argument("--moe-stream", action="store_true",
                        help="the GPU's fused-MoE weight stream (latency.moe_memory_efficiency) per table format, "
                             "fitted on the rows whose experts get one smallest row tile each")
    parser.add_argument("--large-expert", action="store_true",
                        help="the engine's large-expert slowdown per table format (kernels.moe_large_expert)")
    parser.add_argument("--joint", action="store_true",
                        help="with --large-expert: refit the efficiency at each (MiB, slowdown) pair")
    parser.add_argument("--tuned", choices=("yes", "no"), default="",
                        help="only rows of formats the engine lists tuned shapes for (kernels.moe_tuned_shapes), "
                             "those with a tuned config (yes) or without (no: fits moe_untuned_efficiency, and "
                             "with --large-m moe_untuned_large_m_memory_efficiency)")
    parser.add_argument("--architecture", default=None, metavar="CLASS",
                        help="price at the engine's fused MoE for that model architecture (kernels.moe_by_architecture:"
                             " --format-floor, --expert-parallel, --held-out)")
    args = parser.parse_args()
    global GATED, ARCHITECTURE
    GATED = not args.plain
    ARCHITECTURE = args.architecture
    k0s = [float(x) for x in args.k0.split(",") if x]
    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    if args.expert_floors:
        expert_floors(root)
        return
    if args.expert_parallel:
        expert_parallel(root, args.engine, args.version, args.expert_parallel, args.kernel_source)
        return
    if args.format_floor:
        format_floors(root, args.engine, args.version, args.format_floor, args.kernel_source)
        return
    if args.ep_floor:
        ep_floors(root, args.engine, args.version, args.ep_floor, args.kernel_source)
        return
    if args.compare:
        compare(root, args.engine, args.version, args.min_tokens, args.held_out)
        return
    if args.autotuned:
        autotuned(root, args.autotuned)
        return
    if args.arch_stream:
        arch_stream_fit(root, args.engine, args.version, args.kernel_source, args.min_tokens)
        return
    if args.row_cost:
        row_cost(root, args.engine, args.version, args.row_cost, args.kernel_source, args.min_tokens)
        return
    kernels.routed_rows = _balanced_rows  # price the tables' deterministic routing, not random routing
    for system, preset in GPUS.items():
        table = _newest(root, system, args.engine, args.version)  # by version number: 0.5.14 after 0.5.6.post2
        if table is None:
            continue
        whole = df = pd.read_parquet(table)
        tokens = ((df.num_tokens >= args.held_out) & (df.num_tokens < args.min_tokens) if args.held_out
                  else df.num_tokens < args.min_tokens if args.large_m or args.moe_stream
                  else df.num_tokens >= 16 if args.dequant_ops else df.num_tokens >= args.min_tokens)
        df = df[(df.distribution == "balanced") & tokens & (df.moe_ep_size == 1) & df.moe_dtype.isin(list(WEIGHTS))
                & df.kernel_source.str.contains(args.kernel_source, regex=False)]
        if args.max_tp:
            df = df[df.moe_tp_size <= args.max_tp]
        if args.shapes:
            shapes = {tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")}
            df = df[[(r.hidden_size, r.inter_size) in shapes for r in df.itertuples()]]
        gpu = load_gpu(preset)
        base = rates_for(gpu, load_engine(args.engine).kernels, architecture=ARCHITECTURE)
        if args.tuned:
            df = df[[WEIGHTS[r.moe_dtype] in base.moe_tuned_shapes
                     and kernels.moe_untuned(base, WEIGHTS[r.moe_dtype], r.num_experts // r.moe_ep_size,
                                             r.inter_size // r.moe_tp_size) == (args.tuned == "no")
                     for r in df.itertuples()]]
            if args.tuned == "no":  # price the default configuration's rows as the kernel's own: its rates are fitted
                untuned_k0 = {fmt: base.moe_untuned_k0 for fmt in base.moe_untuned_efficiency if base.moe_untuned_k0}
                base = dataclasses.replace(base, moe_tuned_shapes={},
                                           moe_large_m_memory=base.moe_untuned_large_m_memory,
                                           moe_k0={**base.moe_k0, **untuned_k0},
                                           moe_efficiency_by_dtype={**base.moe_efficiency_by_dtype,
                                                                    **base.moe_untuned_efficiency})
        groups: dict[tuple[str, str], list] = {}
        for row in df.itertuples():
            mode = table_mode(row.moe_dtype, gpu)
            groups.setdefault((mode.compute, row.moe_dtype), []).append((row, mode))
        for (compute, weights), rows in sorted(groups.items()):
            def ratios(eff: float, rows: list = rows, base: object = base) -> list[float]:
                return price_ratios(dataclasses.replace(base, moe_efficiency=eff, moe_efficiency_by_dtype={}), rows)

            if args.large_m:
                large_m_fit(preset, args, weights, rows, base)
                continue
            if args.large_expert:
                large_expert_fit(preset, args, weights, rows, held_out_rows(whole, system, args, weights), base)
                continue
            if args.moe_stream:
                moe_stream_fit(preset, args, weights, rows, base)
                continue
            if args.dequant_ops:
                fmt = rows[0][1].dequant
                if not fmt:
                    continue
                eff = base.grouped_efficiency(compute, fmt, rows[0][1].weights)
                decode = [(row, mode) for row, mode in rows if 16 <= row.num_tokens < args.min_tokens]
                base = dataclasses.replace(base, moe_dequant_ops={})  # the engine's own value: the one sought
                saved = kernels.DEQUANT_OPS[fmt]
                lo, hi = 0.5, 60.0
                for _ in range(30):
                    kernels.DEQUANT_OPS[fmt] = mid = (lo + hi) / 2
                    lo, hi = (lo, mid) if statistics.median(ratios(eff, decode, base)) > 1 else (mid, hi)
                kernels.DEQUANT_OPS[fmt] = (lo + hi) / 2
                r = sorted(ratios(eff, decode, base))
                kernels.DEQUANT_OPS[fmt] = saved
                print(f"{preset:10s} {args.engine} {weights:12s} dequant {fmt}: {(lo + hi) / 2:.1f} ops per weight "
                      f"(at moe_efficiency {eff:.2f}; {len(decode)} rows of 16-{args.min_tokens - 1} tokens, "
                      f"tfcalc/measured quartiles {r[len(r) // 4]:.2f}-{r[3 * len(r) // 4]:.2f}; preset value "
                      f"{saved:g})")
                continue
            if args.held_out:
                eff = base.grouped_efficiency(compute, rows[0][1].dequant, rows[0][1].weights)  # its kernel's entry
                r = sorted(ratios(eff))
                print(f"{preset:10s} {args.engine} {weights:12s} compute {compute:5s} preset {eff:.2f}: "
                      f"{args.held_out}-{args.min_tokens - 1} tokens (held out), {len(rows)} rows, tfcalc/measured "
                      f"median {statistics.median(r):.2f}, quartiles {r[len(r) // 4]:.2f}-{r[3 * len(r) // 4]:.2f}")
                continue
            if k0s:
                print(f"{preset:10s} {args.engine} {table.parent.name:8s} {weights:12s} "
                      f"compute {compute:5s} ({len(rows)} rows)")
                scan_k0(base, compute, rows, ratios, held_out_rows(whole, system, args, weights), k0s)
                continue
            eff = fit_efficiency(ratios)
            r = sorted(ratios(eff))
            q1, q3 = r[len(r) // 4], r[3 * len(r) // 4]
            sources = sorted({row.kernel_source for row, _ in rows})
            mode = rows[0][1]
            k0 = None if mode.dequant else (base.moe_k0.get(mode.weights) or base.moe_k0.get(base.peak(compute)[0]))
            print(f"{preset:10s} {args.engine} {table.parent.name:8s} {weights:12s} compute {compute:5s} "
                  f"moe_efficiency {eff:.2f}{f' at K0 {k0:g}' if k0 else ''}  ({len(rows)} rows, tfcalc/measured "
                  f"quartiles {q1:.2f}-{q3:.2f}; {', '.join(s[:48] for s in sources)})")
            if args.by_width:
                by_width: dict[int, list[float]] = {}
                for (row, _), value in zip(rows, ratios(eff), strict=True):
                    by_width.setdefault(row.inter_size // row.moe_tp_size, []).append(value)
                print("    " + " ".join(f"{w}:{statistics.median(v):.2f}" for w, v in sorted(by_width.items())))


if __name__ == "__main__":
    main()
