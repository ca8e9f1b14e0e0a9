"""The profile sweep: measure each point, account its FLOPs and bytes, and put prediction beside measurement.

Bytes per decode step (``decode_bytes_per_step``), counted explicitly by ``tfcalc.calc.roofline.decode_work``:
every weight read once (for MoE the routed experts the step really touched, from the router's counts, instead
of all of them; of the untied embedding only the batch's rows) + the KV cache read + the new K/V written +
fp32 logits + hidden-state traffic. The bundled decoder attends over its whole static cache through a mask,
so the KV read is counted at the cache length (prompt + generated tokens), which is what the kernel reads.
Achieved bandwidth = bytes per step / TPOT; MBU = achieved / peak (datasheet, and the copy ceiling measured
on this device in the same run). Prefill FLOPs (``prefill_work``): 2 x active linear params x tokens +
causal attention + the last position's logits; achieved FLOP/s = FLOPs / TTFT; MFU = achieved / peak.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tfcalc.calc import roofline
from tfcalc.calc.kv_cache import kv_cache_bytes
from tfcalc.calc.memory import activation_workspace_bytes, weights_bytes
from tfcalc.calc.params import count_params
from tfcalc.dtypes import WeightPrecision, get_dtype
from tfcalc.errors import UsageError
from tfcalc.model.transformer import build_model
from tfcalc.profile.ceilings import Ceiling, copy_bandwidth, matmul_flops
from tfcalc.profile.device import DeviceInfo, describe
from tfcalc.profile.measure import Measurement, backend_available, measure, torch_dtype
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec

Row = dict[str, object]
# Fraction of free device memory the profiled model may use; the rest is left to the allocator and kernels.
MEMORY_HEADROOM = 0.9


@dataclass(frozen=True)
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
    efficiency: roofline.Efficiency | None = None

    def points(self) -> list[tuple[str, str, int, int, int]]:
        return [(d, b, batch, p, g) for d in self.dtypes for b in self.backends for batch in self.batches
                for p in self.prompt_lens for g in self.gen_lens]


@dataclass(frozen=True)
class DeviceContext:
    device: torch.device
    info: DeviceInfo
    gpu: GPUSpec | None  # the matched preset (datasheet peaks), if any
    copy: Ceiling
    matmul: dict[str, Ceiling]  # per profile dtype


class StopRequested:
    """Ctrl-C once: finish the current row, then stop. Twice: stop now."""

    def __init__(self) -> None:
        self.requested = False

    @contextmanager
    def installed(self) -> Iterator[None]:
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum: int, frame: object) -> None:
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True

        try:
            signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread: Ctrl-C then raises KeyboardInterrupt as usual
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


def device_context(device: torch.device, dtypes: list[str]) -> DeviceContext:
    """Device facts, its GPU preset if the name matches one, and the ceilings measured now."""
    from tfcalc.spec.presets import load_gpu

    info = describe(device)
    gpu = load_gpu(info.gpu_preset) if info.gpu_preset else None
    matmul = {name: matmul_flops(device, torch_dtype(name)) for name in dtypes}
    return DeviceContext(device, info, gpu, copy_bandwidth(device), matmul)


def predicted_memory_bytes(spec: ModelSpec, dtype: str, batch: int, prompt_len: int, gen_len: int) -> int:
    """What ``tfcalc memory`` predicts for this row: weights + KV cache (window caps applied) + activations."""
    fmt = get_dtype(dtype)
    weights = weights_bytes(count_params(spec), WeightPrecision(fmt))
    kv = kv_cache_bytes(spec, fmt, prompt_len + gen_len, batch)
    return weights + kv + activation_workspace_bytes(spec, batch, prompt_len, fmt, batch * prompt_len)


def layers_that_fit(spec: ModelSpec, sweep: Sweep, free_bytes: int) -> int:
    """The most layers (binary search) whose largest sweep point fits in MEMORY_HEADROOM of free memory; 0 if none."""

    def fits(layers: int) -> bool:
        candidate = spec.with_overrides(layers=layers)
        need = max(predicted_memory_bytes(candidate, d, b, p, g) for d, _, b, p, g in sweep.points())
        return need <= MEMORY_HEADROOM * free_bytes

    low, high = 0, spec.num_layers  # fits(low) is taken as true, fits(high + 1) is false
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def _measured_gpu(ctx: DeviceContext, dtype: str) -> GPUSpec:
    """A roofline 'GPU' made of this device's measured ceilings, for devices no preset describes."""
    return GPUSpec(name=f"measured {ctx.info.device}", memory_bytes=ctx.info.memory_bytes or 1,
                   hbm_bandwidth_bytes_per_s=ctx.copy.value,
                   dense_flops_per_s={"bf16": ctx.matmul[dtype].value, dtype: ctx.matmul[dtype].value},
                   interconnect_bandwidth_bytes_per_s=1.0)


def _prediction(spec: ModelSpec, ctx: DeviceContext, sweep: Sweep, dtype: str, batch: int, prompt_len: int,
                gen_len: int) -> tuple[roofline.Estimate, str]:
    fmt = get_dtype(dtype)
    if ctx.gpu is not None:
        eff = sweep.efficiency or roofline.Efficiency()
        return (roofline.estimate(spec, ctx.gpu, WeightPrecision(fmt), fmt, 1, batch, prompt_len, gen_len, eff),
                f"tfcalc estimate on {ctx.gpu.name} ({eff.source})")
    eff = sweep.efficiency or roofline.Efficiency(1, 1, 1, 1, "100 % of the ceilings")
    estimate = roofline.estimate(spec, _measured_gpu(ctx, dtype), WeightPrecision(fmt), fmt, 1, batch, prompt_len,
                                 gen_len, eff)
    return estimate, f"roofline on this device's measured copy and matmul ceilings, no preset matched ({eff.source})"


def device_columns(info: DeviceInfo) -> Row:
    """NVML facts of the device (empty where unknown, e.g. on the CPU) and why any are missing."""
    return {
        "device_memory_bytes": info.memory_bytes, "memory_clock_hz": info.memory_clock_hz,
        "memory_bus_width_bits": info.memory_bus_width_bits,
        "nvml_bandwidth_bytes_per_s": info.theoretical_bandwidth_bytes_per_s, "sm_clock_hz": info.sm_clock_hz,
        "power_w": info.power_w, "power_limit_w": info.power_limit_w, "temperature_c": info.temperature_c,
        "driver": info.driver,
        "device_note": info.note or (None if info.gpu_preset or info.device == "cpu"
                                     else f"no GPU preset matches '{info.name}': no datasheet peaks"),
    }


def _ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def row_for(spec: ModelSpec, layers_total: int, ctx: DeviceContext, sweep: Sweep, dtype: str, backend: str,
            batch: int, prompt_len: int, gen_len: int, m: Measurement | None, status: str) -> Row:
    """One output row: measured values beside the calculator's predictions (measured ones empty unless ok)."""
    fmt = get_dtype(dtype)
    model = roofline.make_model(spec, WeightPrecision(fmt), fmt, 1)
    estimate, basis = _prediction(spec, ctx, sweep, dtype, batch, prompt_len, gen_len)
    row: Row = {
        "device": ctx.info.device, "device_name": ctx.info.name, "gpu_preset": ctx.info.gpu_preset,
        "model": spec.name, "layers_run": spec.num_layers, "layers_total": layers_total,
        "batch": batch, "prompt_len": prompt_len, "gen_len": gen_len, "dtype": dtype,
        "attn_backend": m.attn_backend if m else backend, "compiled": m.compiled if m else None,
        "prefill_tokens_per_s": None, "ttft_s": None, "ttft_spread": None,
        "decode_tokens_per_s": None, "decode_tokens_per_s_per_seq": None, "tpot_s": None, "tpot_spread": None,
        "prefill_flops": None, "achieved_flops_per_s": None, "mfu": None, "mfu_measured": None,
        "decode_bytes_per_step": None, "achieved_bytes_per_s": None, "mbu_datasheet": None, "mbu_measured": None,
        "peak_memory_bytes": m.peak_memory_bytes if m else None,
        "predicted_memory_bytes": predicted_memory_bytes(spec, dtype, batch, prompt_len, gen_len),
        "predicted_ttft_s": estimate.ttft_s, "predicted_tpot_s": estimate.tpot_s,
        "predicted_decode_tokens_per_s": estimate.decode_tokens_per_s,
        "measured_over_predicted": None, "prediction_basis": basis,
        "copy_bandwidth_bytes_per_s": ctx.copy.value, "matmul_flops_per_s": ctx.matmul[dtype].value,
        "datasheet_bandwidth_bytes_per_s": ctx.gpu.hbm_bandwidth_bytes_per_s if ctx.gpu else None,
        "datasheet_flops_per_s": ctx.gpu.peak_flops(roofline.compute_dtype_for(WeightPrecision(fmt)))[1]
        if ctx.gpu else None,
        "status": status,
        **device_columns(ctx.info),
    }
    if m is None:
        return row
    ttft, tpot = m.prefill.median_s, m.decode_loop.median_s / m.decode_steps
    prefill = roofline.prefill_work(model, batch, prompt_len)
    # The static cache is read whole each step: count it at its full length, prompt + generated tokens.
    decode = roofline.decode_work(model, batch, prompt_len + gen_len, m.distinct_experts)
    achieved_flops, achieved_bytes = prefill.flops / ttft, decode.bytes / tpot
    row.update({
        "prefill_tokens_per_s": batch * prompt_len / ttft, "ttft_s": ttft, "ttft_spread": m.prefill.spread,
        "decode_tokens_per_s": batch / tpot, "decode_tokens_per_s_per_seq": 1 / tpot, "tpot_s": tpot,
        "tpot_spread": m.decode_loop.spread, "prefill_flops": round(prefill.flops),
        "achieved_flops_per_s": achieved_flops, "mfu": _ratio(achieved_flops, row["datasheet_flops_per_s"]),
        "mfu_measured": achieved_flops / ctx.matmul[dtype].value,
        "decode_bytes_per_step": round(decode.bytes), "achieved_bytes_per_s": achieved_bytes,
        "mbu_datasheet": _ratio(achieved_bytes, row["datasheet_bandwidth_bytes_per_s"]),
        "mbu_measured": achieved_bytes / ctx.copy.value,
        "measured_over_predicted": (batch / tpot) / estimate.decode_tokens_per_s,
    })
    if m.distinct_experts:
        row["distinct_experts_per_moe_layer"] = sum(m.distinct_experts.values()) / len(m.distinct_experts)
    return row


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def run_sweep(sweep: Sweep, devices: list[torch.device], on_row: Callable[[Row], None],
              stop: StopRequested | None = None, advance: Callable[[str], None] | None = None) -> bool:
    """Profile every point on every device, calling ``on_row`` per row. Returns False if stopped early.

    CUDA out-of-memory marks the row ``oom`` and the sweep goes on; Ctrl-C (``stop``) ends it after the
    current row.
    """
    stop = stop or StopRequested()
    for device in devices:
        ctx = device_context(device, sweep.dtypes)
        spec, layers_total = sweep.spec, sweep.layers_total
        if device.type == "cuda" and not sweep.layers_explicit:
            fit = layers_that_fit(spec, sweep, torch.cuda.mem_get_info(device)[0])
            if fit == 0:
                raise UsageError(f"{spec.name}: even one layer of the largest sweep point does not fit in "
                                 f"{ctx.info.name}'s free memory; lower --batch/--prompt-len or pass size overrides")
            spec = spec.with_overrides(layers=fit)
        for dtype in sweep.dtypes:
            model = None
            try:
                model = build_model(spec, dtype=torch_dtype(dtype), device=device)
            except Exception as exc:
                if not is_oom(exc):
                    raise
            for _, backend, batch, prompt_len, gen_len in [p for p in sweep.points() if p[0] == dtype]:
                if stop.requested:
                    return False
                status, measured = "ok", None
                if model is None:
                    status = "oom"
                elif not backend_available(model, backend, device):
                    status = f"unavailable: SDPA backend {backend} does not run here"
                else:
                    try:
                        measured = measure(model, batch, prompt_len, gen_len, backend, sweep.compile_decode,
                                           sweep.warmup, sweep.repeats)
                    except Exception as exc:
                        if not is_oom(exc):
                            raise
                        status = "oom"
                        _release(device)
                if status == "ok" and spec.num_layers < layers_total:
                    status = f"ok (ran {spec.num_layers} of {layers_total} layers to fit)"
                on_row(row_for(spec, layers_total, ctx, sweep, dtype, backend, batch, prompt_len, gen_len,
                               measured, status))
                if advance:
                    advance(f"{dtype} {backend} batch {batch} prompt {prompt_len}")
            del model
            _release(device)
    return not stop.requested


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
