"""``tfcalc profile``'s sweep: measure each point, account its FLOPs and bytes, put the prediction beside them.

Bytes per decode step (``decode_bytes_per_step``), counted explicitly by ``tfcalc.calc.work.decode_work``:
every weight read once (for MoE the routed experts the step really touched, from the router's counts, instead
of all of them; of the untied embedding only the batch's rows; FP8 matrices at one byte plus their scales) + the
KV cache read + the new K/V written + fp32 logits + hidden-state traffic. Decode reads only the live cache: step
j of the G - 1 timed steps attends P + j tokens (min(P + j, window) on a rolling buffer, the latent for MLA), so
the row counts the mean of ``decode_work`` over those contexts; ``static`` decode reads the whole cache of P + G
slots every step and is counted so. Achieved bandwidth = bytes per step / TPOT; MBU = achieved / peak (datasheet,
and the copy ceiling measured on this device in the same run). Prefill FLOPs (``prefill_work``): 2 x active
linear params x tokens + causal attention + the last position's logits; achieved FLOP/s = FLOPs / TTFT.

The prediction beside each row is ``tfcalc estimate``'s latency model (``tfcalc.calc.latency``) for the same
model, batch, prompt and generation: on the GPU's preset rates when a preset matched, else on this device's
measured ceilings (``measured_rates``); a ``--calibration`` applies to either (``calibrated_rates``). Prefill is
priced without CUDA graphs (it runs eagerly), decode with them where it ran captured. FP8 rows that ran
``dequantized`` are priced as weight-only FP8 (16-bit tensor cores + dequantisation), never at the FP8 peak.

Sharded over ranks (``--tp``, ``--ep``: :class:`ParallelProfile`, run on every rank by
``tfcalc.profile.distributed``): every rank builds its shard of the same model (``tfcalc.model.parallel``) and
measures every point in step with the others, with the time its collectives took; rank 0 gathers the
measurements into one row per point. A row's batch counts the sequences of all attention replicas; its times
are the slowest rank's medians; its bytes, FLOPs, memory and ceilings are one rank's (``work.make_model(...,
tp, ep)``); its collective times the ranks' mean (and max). The prediction is the latency model with the same
tp and ep, its communication on the GPU preset's fabric, or, where no preset matched, on the link measured at
the start of the run (``measure_link``: all-reduces fitted by ``tfcalc.calc.comm.fit_link``); a calibration
with a ``collectives`` section replaces either.
"""
from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch

from tfcalc.calc import comm, latency, work
from tfcalc.calc.calibration import Calibration, Efficiency, calibrated_rates
from tfcalc.calc.kernels import Rates
from tfcalc.calc.kv_cache import held_elements, kv_cache_bytes
from tfcalc.calc.memory import activation_workspace_bytes, weights_bytes
from tfcalc.calc.params import count_params
from tfcalc.calc.shard import Parallelism, shard, stage_weight_bytes
from tfcalc.dtypes import WeightPrecision, get_dtype, parse_weight_precision
from tfcalc.errors import UsageError
from tfcalc.model.fp8 import FORMATS as FP8_FORMATS
from tfcalc.model.fp8 import native_gemm_works
from tfcalc.model.layers import SDPA_BACKENDS, STATIC
from tfcalc.model.parallel import Parallel, check_sharding, world_size
from tfcalc.model.scaling import describe_layers, keep_layers, pick_layers, scale_spec
from tfcalc.model.transformer import DECODE_ATTENTION, build_model, check_fp8_sharding
from tfcalc.profile.ceilings import Ceiling, copy_bandwidth, fp8_matmul_flops, matmul_flops
from tfcalc.profile.device import DeviceInfo, available_memory_bytes, describe, is_oom, release_memory, torch_dtype
from tfcalc.profile.distributed import RankContext
from tfcalc.profile.measure import Measurement, backend_available, measure
from tfcalc.spec.engine import EngineKernels
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.interconnect import Interconnect, Link
from tfcalc.spec.model import ModelSpec
from tfcalc.units import format_bytes

Row = dict[str, object]
# Fraction of free device memory the profiled model may use; the rest is left to the allocator and kernels.
MEMORY_HEADROOM = 0.9
ATTENTION_BACKENDS = ("auto", *SDPA_BACKENDS)
WEIGHTS_DTYPES = tuple(FP8_FORMATS)
# What the CLI validates and scales with, so that it needs no import from tfcalc.model:
__all__ = ["ATTENTION_BACKENDS", "DECODE_ATTENTION", "WEIGHTS_DTYPES", "check_fp8_sharding", "check_sharding",
           "describe_layers", "pick_layers", "scale_spec", "world_size"]


class Point(NamedTuple):
    """One row of a sweep: compute dtype, FP8 weight format (None: weights in the compute dtype), SDPA backend,
    batch, prompt and generated tokens."""

    dtype: str
    weights: str | None
    backend: str
    batch: int
    prompt_len: int
    gen_len: int


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """What to profile: the model that runs (after overrides) and the lists that make the rows."""

    spec: ModelSpec
    layers_total: int
    layers_explicit: bool
    batches: list[int]
    prompt_lens: list[int]
    gen_lens: list[int]
    dtypes: list[str]
    backends: list[str]
    compile_decode: bool
    warmup: int = 2
    repeats: int = 5
    calibration: Calibration | Efficiency | None = None  # applied to the prediction's rates
    weights_dtypes: list[str | None] = field(default_factory=lambda: [None])
    decode_attention: str = "auto"
    layer_note: str = ""  # which layers a scaled model kept (tfcalc.model.scaling.describe_layers)

    def points(self) -> list[Point]:
        return [Point(d, w, b, batch, p, g) for d in self.dtypes for w in self.weights_dtypes for b in self.backends
                for batch in self.batches for p in self.prompt_lens for g in self.gen_lens]


@dataclass(frozen=True, kw_only=True)
class DeviceContext:
    device: torch.device
    info: DeviceInfo
    gpu: GPUSpec | None  # the matched preset (datasheet peaks), if any
    copy: Ceiling
    matmul: dict[str, Ceiling]  # per profile dtype, and "fp8" where the FP8 GEMM runs natively
    parallel_units: int  # a GPU's streaming multiprocessors, the CPU's threads (where attention tiles spread)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How a row's model is spread: tp x ep over ``world`` ranks (world / tp attention replicas), the collectives'
    backend, and the fabric the prediction prices them on (None: the GPU preset's)."""

    tp: int = 1
    ep: int = 1
    backend: str | None = None
    link: Interconnect | None = None

    @property
    def world(self) -> int:
        return world_size(self.tp, self.ep)

    @property
    def dp(self) -> int:
        return self.world // self.tp

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(tp=self.tp, ep=self.ep, dp=self.dp)


SINGLE = Layout()


class StopRequested:
    """Ctrl-C during a sweep: the first SIGINT sets ``requested`` and the sweep stops after the current row; a
    second raises KeyboardInterrupt at once. SIGTERM is not handled here: the console entry point's handler
    (``tfcalc.cli.common.install_signal_handlers``) raises ``tfcalc.errors.Terminated``, a KeyboardInterrupt that
    stops the sweep at once like a second Ctrl-C."""

    def __init__(self) -> None:
        self.requested = False

    @contextmanager
    def installed(self) -> Iterator[None]:
        def on_sigint(signum: int, frame: object) -> None:
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True

        try:
            previous = signal.signal(signal.SIGINT, on_sigint)
        except ValueError:  # not the main thread: Ctrl-C keeps its default behaviour
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


def weight_precision(dtype: str, weights: str | None) -> WeightPrecision:
    """The formats the model holds: the compute dtype, or FP8 matrices with the embedding, lm_head and router
    kept in the compute dtype (:func:`tfcalc.model.fp8.quantize_block`)."""
    if weights is None:
        return WeightPrecision(get_dtype(dtype))
    return parse_weight_precision(f"embedding={dtype},lm_head={dtype},router={dtype},default={FP8_FORMATS[weights]}")


def device_context(device: torch.device, dtypes: list[str], fp8: bool = False) -> DeviceContext:
    """Device facts, its GPU preset if the name matches one, and the ceilings measured now (with the FP8 GEMM's
    when FP8 weights are profiled and the device runs that GEMM natively)."""
    from tfcalc.spec.presets import load_gpu

    info = describe(device)
    gpu = load_gpu(info.gpu_preset) if info.gpu_preset else None
    matmul = {name: matmul_flops(device, torch_dtype(name)) for name in dtypes}
    if fp8 and device.type == "cuda" and native_gemm_works(device, False, torch.bfloat16):
        matmul["fp8"] = fp8_matmul_flops(device)
    units = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" \
        else torch.get_num_threads()
    return DeviceContext(device=device, info=info, gpu=gpu, copy=copy_bandwidth(device), matmul=matmul,
                         parallel_units=units)


def predicted_memory_bytes(spec: ModelSpec, dtype: str, batch: int, prompt_len: int, gen_len: int,
                           weights: str | None = None, layout: Layout = SINGLE) -> int:
    """What ``tfcalc memory`` predicts for this row: weights + KV cache (window caps applied) + activations; for a
    sharded row, one rank's: its shard (``tfcalc.calc.shard``), the cache of its replica's batch / dp sequences
    (its KV heads, or MLA's whole latent), activations at 1/tp width."""
    fmt, precision = get_dtype(dtype), weight_precision(dtype, weights)
    if layout.world == 1:
        held = weights_bytes(count_params(spec), precision)
        kv = kv_cache_bytes(spec, fmt, prompt_len + gen_len, batch)
        return held + kv + activation_workspace_bytes(spec, batch, prompt_len, fmt, batch * prompt_len)
    sh = shard(spec, layout.parallelism)
    held = stage_weight_bytes(spec, sh, precision, range(spec.num_layers), first=True, last=True)
    per_replica = batch // layout.dp
    kv = fmt.bytes_for(per_replica * held_elements(spec, prompt_len + gen_len, sh.kv_elements, sh.full_kv_elements))
    return held + int(kv) + activation_workspace_bytes(spec, per_replica, prompt_len, fmt, per_replica * prompt_len,
                                                       layout.tp)


def largest_point_bytes(spec: ModelSpec, sweep: Sweep) -> int:
    return max(predicted_memory_bytes(spec, p.dtype, p.batch, p.prompt_len, p.gen_len, p.weights)
               for p in sweep.points())


def layers_that_fit(spec: ModelSpec, sweep: Sweep, free_bytes: int) -> int:
    """The most layers (binary search; the layer pattern kept) whose largest sweep point fits in MEMORY_HEADROOM
    of free memory; 0 if none."""

    def fits(layers: int) -> bool:
        return largest_point_bytes(scale_spec(spec, layers=layers), sweep) <= MEMORY_HEADROOM * free_bytes

    low, high = 0, spec.num_layers  # fits(low) is taken as true, fits(high + 1) is false
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def contexts_that_fit(spec: ModelSpec, sweep: Sweep, free_bytes: int | None, start: int) -> list[int]:
    """Prompt lengths start, 2 start, 4 start, ... up to the model's max context (less the generated tokens) and
    the longest whose largest point fits in MEMORY_HEADROOM of ``free_bytes`` (unknown: no memory limit)."""
    top = spec.max_context - max(sweep.gen_lens)
    lengths = []
    length = start
    while length <= top:
        trial = replace(sweep, prompt_lens=[length])
        if free_bytes is not None and largest_point_bytes(spec, trial) > MEMORY_HEADROOM * free_bytes:
            break
        lengths.append(length)
        length *= 2
    if lengths and lengths[-1] < top and (free_bytes is None or largest_point_bytes(
            spec, replace(sweep, prompt_lens=[top])) <= MEMORY_HEADROOM * free_bytes):
        lengths.append(top)  # the model's max itself when it fits
    return lengths


def _measured_gpu(ctx: DeviceContext, dtype: str) -> GPUSpec:
    """This device as a GPU spec of its measured ceilings, for a device no preset describes: the measured matmul
    as the dense peak of the compute dtype (and of bf16, which the model falls back to), the FP8 GEMM's where it
    runs natively, the measured copy as the memory bandwidth."""
    flops = {"bf16": ctx.matmul[dtype].value, dtype: ctx.matmul[dtype].value}
    if "fp8" in ctx.matmul:
        flops["fp8"] = ctx.matmul["fp8"].value
    return GPUSpec(name=f"measured {ctx.info.device}", memory_bytes=ctx.info.memory_bytes or 1,
                   hbm_bandwidth_bytes_per_s=ctx.copy.value, dense_flops_per_s=flops,
                   interconnect_bandwidth_bytes_per_s=1.0)


def measured_rates(ctx: DeviceContext, gpu: GPUSpec) -> Rates:
    """The latency model's rates for a device no preset describes: its measured ceilings reached in full
    (efficiencies 1: they are what the device was just measured to do), flash attention's tiles over its
    parallel units, dequantisation at half the matmul rate (one FMA per two FLOPs, as ``rates_for`` takes the
    fp32 rate); kernel floors and the launch interval are the generic GPU ones on a GPU, none on the CPU (a CPU
    step of milliseconds dwarfs the dispatch of its few dozen operators)."""
    peaks = dict(gpu.dense_flops_per_s)
    floors = dict(latency.GENERIC_LATENCY["floors_s"]) if ctx.device.type == "cuda" else {}
    return Rates(name=gpu.name, peak_flops=peaks, gemm_efficiency=dict.fromkeys(peaks, 1.0), attention_efficiency=1.0,
                 moe_efficiency=1.0, memory_bandwidth=gpu.hbm_bandwidth_bytes_per_s, memory_efficiency=1.0,
                 alu_ops_per_s=peaks["bf16"] / 2, sm_count=ctx.parallel_units, floors=floors,
                 launch_s=EngineKernels().eager_launch_s if floors else 0.0,
                 source="this device's measured copy and matmul ceilings")


def fp8_runs_natively(ctx: DeviceContext, p: Point, m: Measurement | None) -> bool:
    """Whether an FP8 row's GEMMs ran (or, unmeasured, would run) on FP8 tensor cores: every one through
    scaled_mm; a row that dequantized any is priced as dequantized."""
    if m is not None:
        return m.fp8_gemm == "scaled_mm"
    return "fp8" in ctx.matmul


def prediction(spec: ModelSpec, ctx: DeviceContext, sweep: Sweep, p: Point, m: Measurement | None,
               layout: Layout = SINGLE) -> tuple[latency.LatencyEstimate, str]:
    """tfcalc estimate's latency model for the row (module docstring), and a sentence saying on what basis."""
    precision, kv = weight_precision(p.dtype, p.weights), get_dtype(p.dtype)
    native = p.weights is None or fp8_runs_natively(ctx, p, m)
    captured = m.compiled if m is not None else sweep.compile_decode
    if ctx.gpu is not None:
        gpu = ctx.gpu
        engine = EngineKernels()
        prefill, decode = latency.rates_for(gpu, engine, False), latency.rates_for(gpu, engine, bool(captured))
        basis = f"latency model on the {gpu.name} preset"
    else:
        gpu = _measured_gpu(ctx, p.dtype)
        prefill = decode = measured_rates(ctx, gpu)
        basis = "latency model on this device's measured copy and matmul ceilings (no GPU preset matched)"
    if sweep.calibration is not None:
        prefill = calibrated_rates(prefill, sweep.calibration, "prefill")
        decode = calibrated_rates(decode, sweep.calibration, "decode")
        basis += f", {sweep.calibration.source}"
    if not native:
        basis += "; FP8 weights priced dequantized (16-bit tensor cores), as the row ran"
    if layout.world > 1:
        calibrated = decode.collectives is not None
        fabric = "the calibration's measured link" if calibrated else (
            f"{layout.link.display_name}" if layout.link is not None else "the preset's fabric")
        basis += f"; tp {layout.tp}, ep {layout.ep}, collectives on {fabric}"
    d = latency.deployment(spec, gpu, precision, kv, tp=layout.tp, ep=layout.ep, compute="auto" if native else "bf16",
                           rates_prefill=prefill, rates_decode=decode, interconnect=layout.link)
    return latency.estimate_latency(d, p.batch, p.prompt_len, p.gen_len), basis


def _compute_dtype(ctx: DeviceContext, p: Point, m: Measurement | None) -> str:
    """The tensor-core format the row's matmuls ran in, for the datasheet peak: fp8 where FP8 GEMMs ran natively,
    else the compute dtype."""
    return "fp8" if p.weights is not None and fp8_runs_natively(ctx, p, m) else p.dtype


def device_columns(info: DeviceInfo) -> Row:
    """NVML facts of the device (empty where unknown, e.g. on the CPU) and why any are missing."""
    return {
        "gpu_memory_bytes": info.memory_bytes, "memory_clock_hz": info.memory_clock_hz,
        "memory_bus_width_bits": info.memory_bus_width_bits,
        "nvml_bandwidth_bytes_per_s": info.theoretical_bandwidth_bytes_per_s, "sm_clock_hz": info.sm_clock_hz,
        "power_w": info.power_w, "power_limit_w": info.power_limit_w, "temperature_c": info.temperature_c,
        "driver": info.driver,
        "device_note": info.note or (None if info.gpu_preset or info.device == "cpu"
                                     else f"no GPU preset matches '{info.name}': no datasheet peaks"),
    }


def _ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def decode_contexts(p: Point, decode_attention: str) -> list[int]:
    """The cache length each timed decode step reads: P + j for step j = 1..G-1 (its own token included) when
    decode reads the live cache, the whole P + G slots every step for ``static``."""
    if decode_attention == STATIC:
        return [p.prompt_len + p.gen_len]
    return [p.prompt_len + j for j in range(1, max(p.gen_len, 2))]


def row_for(spec: ModelSpec, layers_total: int, ctx: DeviceContext, sweep: Sweep, p: Point,
            m: Measurement | None, status: str, layer_note: str = "", layout: Layout = SINGLE,
            ranks: list[Measurement] | None = None) -> Row:
    """One output row: measured values beside the calculator's predictions (measured ones empty unless ok). A
    sharded row (``layout``) also says how it was spread and, from every rank's measurement (``ranks``), the time
    in collectives beside the latency model's."""
    fmt, precision = get_dtype(p.dtype), weight_precision(p.dtype, p.weights)
    model = work.make_model(spec, precision, fmt, layout.tp, layout.ep)
    estimate, basis = prediction(spec, ctx, sweep, p, m, layout)
    matmul = ctx.matmul["fp8"] if _compute_dtype(ctx, p, m) == "fp8" and "fp8" in ctx.matmul else ctx.matmul[p.dtype]
    row: Row = {
        "device": ctx.info.device, "device_name": ctx.info.name, "gpu_preset": ctx.info.gpu_preset,
        "model": spec.name, "layers_run": spec.num_layers, "layers_total": layers_total, "layer_pattern": layer_note,
        "batch": p.batch, "prompt_len": p.prompt_len, "gen_len": p.gen_len, "dtype": p.dtype,
        "weights_dtype": precision.default.name if p.weights else p.dtype, "fp8_gemm": m.fp8_gemm if m else None,
        "attn_backend": m.attn_backend if m else p.backend, "decode_attention": m.decode_attention if m else None,
        "compiled": m.compiled if m else None,
        "prefill_tokens_per_s": None, "ttft_s": None, "ttft_spread": None,
        "decode_tokens_per_s": None, "decode_tokens_per_s_per_seq": None, "tpot_s": None, "tpot_spread": None,
        "prefill_flops": None, "achieved_flops_per_s": None, "mfu_datasheet": None, "mfu_measured": None,
        "decode_context_mean": None, "kv_bytes_read_per_step": None,
        "decode_bytes_per_step": None, "achieved_bytes_per_s": None, "mbu_datasheet": None, "mbu_measured": None,
        "peak_memory_bytes": m.peak_memory_bytes if m else None,
        "predicted_memory_bytes": predicted_memory_bytes(spec, p.dtype, p.batch, p.prompt_len, p.gen_len, p.weights,
                                                         layout),
        "predicted_ttft_s": estimate.ttft_s, "predicted_tpot_s": estimate.tpot_s,
        "predicted_decode_tokens_per_s": estimate.decode_tokens_per_s,
        "measured_over_predicted": None, "prediction_basis": basis,
        "copy_bandwidth_bytes_per_s": ctx.copy.value, "matmul_flops_per_s": matmul.value,
        "datasheet_bandwidth_bytes_per_s": ctx.gpu.hbm_bandwidth_bytes_per_s if ctx.gpu else None,
        "datasheet_flops_per_s": ctx.gpu.peak_flops(_compute_dtype(ctx, p, m))[1] if ctx.gpu else None,
        "status": status,
        **parallel_columns(layout, estimate, ranks if m is not None else None),
        **device_columns(ctx.info),
    }
    if m is None:
        return row
    ttft, tpot = m.prefill.median_s, m.decode_loop.median_s / m.decode_steps
    per_gpu = p.batch // layout.dp  # the sequences one rank's attention runs
    prefill = work.prefill_work(model, per_gpu, p.prompt_len)
    contexts = decode_contexts(p, m.decode_attention)
    decode_bytes = sum(work.decode_work(model, per_gpu, c, m.distinct_experts).bytes for c in contexts)
    decode_bytes /= len(contexts)
    kv_read = sum(float(fmt.bytes_for(per_gpu * held_elements(spec, c, model.sh.kv_elements,
                                                              model.sh.full_kv_elements)))
                  for c in contexts) / len(contexts)
    achieved_flops, achieved_bytes = prefill.flops / ttft, decode_bytes / tpot
    row.update({
        "prefill_tokens_per_s": p.batch * p.prompt_len / ttft, "ttft_s": ttft, "ttft_spread": m.prefill.spread,
        "decode_tokens_per_s": p.batch / tpot, "decode_tokens_per_s_per_seq": 1 / tpot, "tpot_s": tpot,
        "tpot_spread": m.decode_loop.spread, "prefill_flops": round(prefill.flops),
        "achieved_flops_per_s": achieved_flops, "mfu_datasheet": _ratio(achieved_flops, row["datasheet_flops_per_s"]),
        "mfu_measured": achieved_flops / matmul.value,
        "decode_context_mean": sum(contexts) / len(contexts), "kv_bytes_read_per_step": round(kv_read),
        "decode_bytes_per_step": round(decode_bytes), "achieved_bytes_per_s": achieved_bytes,
        "mbu_datasheet": _ratio(achieved_bytes, row["datasheet_bandwidth_bytes_per_s"]),
        "mbu_measured": achieved_bytes / ctx.copy.value,
        "measured_over_predicted": (p.batch / tpot) / estimate.decode_tokens_per_s,
    })
    if m.distinct_experts:
        row["distinct_experts_per_moe_layer"] = sum(m.distinct_experts.values()) / len(m.distinct_experts)
    return row


def parallel_columns(layout: Layout, estimate: latency.LatencyEstimate, ranks: list[Measurement] | None) -> Row:
    """How the row was spread, and the seconds in collectives per prefill and per decode step: measured (mean and
    max over the ranks of each rank's median) beside the latency model's tp and ep communication."""
    predicted_prefill = estimate.prefill.step.tp_comm_seconds + estimate.prefill.step.ep_comm_seconds
    predicted_decode = estimate.decode.step.tp_comm_seconds + estimate.decode.step.ep_comm_seconds
    row: Row = {
        "world_size": layout.world, "tp": layout.tp, "ep": layout.ep, "dp": layout.dp,
        "dist_backend": layout.backend,
        "prefill_comm_s": None, "prefill_comm_s_max": None, "decode_comm_s": None, "decode_comm_s_max": None,
        "decode_comm_fraction": None, "collectives_per_prefill": None, "collectives_per_decode_step": None,
        "predicted_prefill_comm_s": predicted_prefill if layout.world > 1 else None,
        "predicted_decode_comm_s": predicted_decode if layout.world > 1 else None,
    }
    if not ranks or layout.world == 1 or any(m.comm_prefill is None or m.comm_decode_loop is None for m in ranks):
        return row
    steps = ranks[0].decode_steps
    prefill = [m.comm_prefill.median_s for m in ranks if m.comm_prefill is not None]
    decode = [m.comm_decode_loop.median_s / steps for m in ranks if m.comm_decode_loop is not None]
    tpot = max(m.decode_loop.median_s for m in ranks) / steps
    row.update({
        "prefill_comm_s": sum(prefill) / len(prefill), "prefill_comm_s_max": max(prefill),
        "decode_comm_s": sum(decode) / len(decode), "decode_comm_s_max": max(decode),
        "decode_comm_fraction": sum(decode) / len(decode) / tpot,
        "collectives_per_prefill": ranks[0].collectives_prefill,
        "collectives_per_decode_step": ranks[0].collectives_decode_loop / steps,
    })
    return row


def run_sweep(sweep: Sweep, devices: list[torch.device], on_row: Callable[[Row], None],
              stop: StopRequested | None = None, advance: Callable[[str], None] | None = None,
              on_build: Callable[[str], None] | None = None) -> bool:
    """Profile every point on every device, calling ``on_row`` per row. Returns False if stopped early.
    ``on_build`` hears, before each model is built, what is built (random weights are drawn at about 10^8 values a
    second on a CPU: minutes for a model of tens of GB).

    Out-of-memory on any device (CUDA's OutOfMemoryError, the CPU allocator's RuntimeError, MemoryError) while
    building the model or measuring a point marks the row ``oom``, releases memory and the sweep goes on (on the
    CPU, a point predicted above the available memory is an ``oom`` row without being run); rows
    already handed to ``on_row`` stay. Ctrl-C (``stop``) ends it after the current row; a second Ctrl-C or
    SIGTERM raises out of it at once (KeyboardInterrupt, ``tfcalc.errors.Terminated``).
    """
    stop = stop or StopRequested()
    fp8 = any(w is not None for w in sweep.weights_dtypes)
    for device in devices:
        ctx = device_context(device, sweep.dtypes, fp8)
        spec, layers_total, note = sweep.spec, sweep.layers_total, sweep.layer_note
        if device.type == "cuda" and not sweep.layers_explicit:
            fit = layers_that_fit(spec, sweep, torch.cuda.mem_get_info(device)[0])
            if fit == 0:
                raise UsageError(f"{spec.name}: even one layer of the largest sweep point does not fit in "
                                 f"{ctx.info.name}'s free memory; lower --batch/--prompt-len or pass size overrides")
            if fit < spec.num_layers:
                kept = pick_layers(spec, fit)
                note = describe_layers(spec, kept)
                spec = keep_layers(spec, kept)
        # On the CPU an allocation past the memory does not always raise: Linux may overcommit and its OOM killer
        # then ends the process. Points predicted not to fit are oom rows, never built or run.
        available = available_memory_bytes(device) if device.type == "cpu" else None
        for dtype, weights in dict.fromkeys((p.dtype, p.weights) for p in sweep.points()):
            group = [p for p in sweep.points() if (p.dtype, p.weights) == (dtype, weights)]
            need = {p: predicted_memory_bytes(spec, dtype, p.batch, p.prompt_len, p.gen_len, weights) for p in group}
            model = None
            if available is None or min(need.values()) <= available:
                if on_build:
                    held = weights_bytes(count_params(spec), weight_precision(dtype, weights))
                    on_build(f"{spec.name} {dtype}{'/' + weights if weights else ''}: building the model "
                             f"({format_bytes(held)} of random weights on {device})")
                try:
                    model = build_model(spec, dtype=torch_dtype(dtype), device=device, weights_dtype=weights,
                                        decode_attention=sweep.decode_attention)
                except Exception as exc:
                    if not is_oom(exc):
                        raise
                    release_memory(device)
            for p in group:
                if stop.requested:
                    return False
                status, measured = "ok", None
                if available is not None and need[p] > available:
                    status = f"oom (predicted {need[p] / 2**30:,.1f} GiB > {available / 2**30:,.1f} GiB available)"
                elif model is None:
                    status = "oom"
                elif not backend_available(model, p.backend, device):
                    status = f"unavailable: SDPA backend {p.backend} does not run here"
                else:
                    try:
                        measured = measure(model, p.batch, p.prompt_len, p.gen_len, p.backend, sweep.compile_decode,
                                           sweep.warmup, sweep.repeats)
                    except Exception as exc:
                        if not is_oom(exc):
                            raise
                        status = "oom"
                        release_memory(device)
                if status == "ok" and spec.num_layers < layers_total:
                    status = f"ok (ran {spec.num_layers} of {layers_total} layers to fit)"
                on_row(row_for(spec, layers_total, ctx, sweep, p, measured, status, note))
                if advance:
                    advance(f"{spec.name} {dtype}{'/' + weights if weights else ''} {p.backend} batch {p.batch} "
                            f"prompt {p.prompt_len}")
            del model
            release_memory(device)
    return not stop.requested


# --- sharded over ranks: tfcalc profile --tp / --ep ----------------------------------------------------------------

LINK_SIZES = {"cpu": (1 << 12, 1 << 22), "cuda": (1 << 16, 1 << 28)}  # all-reduce sizes of measure_link


def measure_link(ctx: RankContext, repeats: int = 3) -> Interconnect | None:
    """The link between these ranks, for a device no preset describes: all-reduces of 4 KiB-4 MiB (64 KiB-256 MiB
    on GPUs), each rank's time averaged, fitted by ``tfcalc.calc.comm.fit_link``. Every rank measures; rank 0
    gets the link (the others None)."""
    from tfcalc.profile.collectives import measure as measure_collectives
    from tfcalc.profile.collectives import message_sizes

    dtype = "fp32" if ctx.device.type == "cpu" else "bf16"
    results = measure_collectives(ctx, ["all_reduce"], message_sizes(*LINK_SIZES[ctx.device.type]), dtype,
                                  iters=5, warmup=1, repeats=repeats)
    if results is None:
        return None
    fit = comm.fit_link([(op, ctx.world, nbytes, seconds) for op, nbytes, seconds in results])
    name = f"{ctx.backend} over {ctx.world} ranks, measured"
    link = Link(name=name, bandwidth_bytes_per_s=fit.bandwidth_bytes_per_s, efficiency=1.0,
                step_latency_s=fit.step_latency_s, launch_s=fit.launch_s,
                source=f"all-reduce fit at the start of the run (residuals rms {fit.rms_residual:.0%})")
    return Interconnect(name="measured", display_name=f"the {name} link", nccl=link, algorithm="ring")


def _slowest(measurements: list[Measurement]) -> Measurement:
    """Rank 0's measurement with the slowest rank's prefill and decode (the step ends when every rank's does)
    and the largest peak memory."""
    first = measurements[0]
    peaks = [m.peak_memory_bytes for m in measurements if m.peak_memory_bytes is not None]
    return replace(first, prefill=max((m.prefill for m in measurements), key=lambda t: t.median_s),
                   decode_loop=max((m.decode_loop for m in measurements), key=lambda t: t.median_s),
                   peak_memory_bytes=max(peaks) if peaks else None)


def run_rank_sweep(sweep: Sweep, ctx: RankContext, par: Parallel, link: Interconnect | None) -> bool:
    """One sweep on this rank, in step with the others (every decision that changes what runs is agreed by all);
    rank 0 sends each row. Returns False when a Ctrl-C stopped it. Out of memory while building or measuring ends
    the run (a rank cannot leave its peers waiting in a collective); points predicted not to fit in this device's
    memory (shared by the node's ranks on the CPU) are ``oom`` rows, never run."""
    dev = device_context(ctx.device, sweep.dtypes, any(w is not None for w in sweep.weights_dtypes))
    layout = Layout(tp=par.tp, ep=par.ep, backend=ctx.backend, link=link)
    spec = sweep.spec
    available = available_memory_bytes(ctx.device)
    share = ctx.local_world if ctx.device.type == "cpu" else 1
    for dtype, weights in dict.fromkeys((p.dtype, p.weights) for p in sweep.points()):
        group = [p for p in sweep.points() if (p.dtype, p.weights) == (dtype, weights)]
        need = {p: predicted_memory_bytes(spec, dtype, p.batch, p.prompt_len, p.gen_len, weights, layout)
                for p in group}

        def too_big(nbytes: int) -> bool:
            return available is not None and nbytes * share > MEMORY_HEADROOM * available

        model = None
        if not ctx.agree_any(too_big(min(need.values()))):
            model = build_model(spec, dtype=torch_dtype(dtype), device=ctx.device, weights_dtype=weights,
                                decode_attention=sweep.decode_attention, seed=0, parallel=par)
        for p in group:
            if ctx.should_stop():
                return False
            status, measured = "ok", None
            if ctx.agree_any(too_big(need[p])) or model is None:
                assert available is not None
                status = (f"oom (predicted {need[p] / 2**30:,.1f} GiB per rank, {share} rank(s) on "
                          f"{available / 2**30:,.1f} GiB available)")
            elif not backend_available(model, p.backend, ctx.device):
                status = f"unavailable: SDPA backend {p.backend} does not run here"
            else:
                measured = measure(model, p.batch // par.dp, p.prompt_len, p.gen_len, p.backend, False,
                                   sweep.warmup, sweep.repeats, seed=par.replica)
            gathered = ctx.gather(measured)
            if gathered is not None:
                ranks = [m for m in gathered if isinstance(m, Measurement)]
                row = row_for(spec, sweep.layers_total, dev, sweep, p, _slowest(ranks) if ranks else None, status,
                              sweep.layer_note, layout, ranks or None)
                ctx.send("row", row)
        del model
        release_memory(ctx.device)
    return True


@dataclass(frozen=True)
class ParallelProfile:
    """``tfcalc profile --tp / --ep`` on one rank (a job for ``tfcalc.profile.distributed``): the process groups,
    the link where the prediction needs a measured one, then every sweep in turn."""

    sweeps: tuple[Sweep, ...]
    tp: int
    ep: int

    def __call__(self, ctx: RankContext) -> None:
        par = Parallel.create(self.tp, self.ep, ctx.device)
        from tfcalc.profile.device import match_gpu_preset

        preset = ctx.device.type == "cuda" and match_gpu_preset(torch.cuda.get_device_name(ctx.device)) is not None
        calibrated = all(_measured_collectives(s.calibration) for s in self.sweeps)
        link = measure_link(ctx) if ctx.agree_any(not preset and not calibrated) else None
        for sweep in self.sweeps:
            if not run_rank_sweep(sweep, ctx, par, link):
                return


def _measured_collectives(calibration: Calibration | Efficiency | None) -> bool:
    return isinstance(calibration, Calibration) and bool(calibration.collectives)
