"""Component benchmarks, each its own table: SDPA attention, the MoE layer against a dense FFN, and the ceilings.

Pure measurement: every function returns rows (one dict per measurement, exact counts under unit-bearing keys)
and never prints. The FLOP and byte counts are separate functions so they can be checked by hand.

Attention FLOP convention (FlashAttention's ``benchmarks/benchmark_flash_attention.py``, used by FA2/FA3 and
the SDPA numbers in pytorch#142132): QK^T and PV are two matmuls of 2·B·H·Tq·Tk·D FLOPs each (a multiply-add
counts 2), so a full forward is 4·B·H·Tq·Tk·D; a causal prefill (Tq = Tk = T) is credited half of it,
4·B·H·T²·D / 2. Softmax, scaling and masking are not counted. H is the number of *query* heads: GQA shares
K/V between heads but does not reduce the matmul work.

Decode-style attention (one new query token against T cached keys) is memory-bound; its rate is the bytes of
K and V read per second, 2·B·Hkv·T·D·element_bytes per call (Q and the output, B·H·D each, are not counted).
A single query sees every cached key, so the decode call is made with ``is_causal=False`` (SDPA's causal mask
is aligned top-left, which for Tq = 1 would hide all keys but the first).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from tfcalc.errors import UsageError
from tfcalc.profile.device import DTYPES, dtype_name, is_oom, release_memory, torch_dtype  # noqa: F401 (cli/bench)
from tfcalc.profile.timing import Timing, time_call

ATTENTION_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")

CAUSAL_CONVENTION = ("attention FLOPs = 4 x B x H x Tq x Tk x D (QK^T and PV, multiply-add = 2 FLOPs, H = query "
                     "heads), halved for a causal prefill: 4 B H T^2 D / 2 (the FlashAttention papers' convention); "
                     "decode bytes = K + V read = 2 B Hkv T D x element bytes")


# --- counts (no timing) --------------------------------------------------------------------------------------


def attention_flops(batch: int, heads: int, q_len: int, kv_len: int, head_dim: int, causal: bool) -> float:
    """4·B·H·Tq·Tk·D, halved when ``causal`` (only meaningful for Tq = Tk, the prefill square)."""
    flops = 4 * batch * heads * q_len * kv_len * head_dim
    return flops / 2 if causal else float(flops)


def prefill_attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool = True) -> float:
    """Causal: 4·B·H·T²·D / 2; non-causal: 4·B·H·T²·D."""
    return attention_flops(batch, heads, seq_len, seq_len, head_dim, causal)


def decode_attention_flops(batch: int, heads: int, kv_len: int, head_dim: int) -> float:
    """One query per sequence against T keys: 4·B·H·T·D (nothing to halve)."""
    return attention_flops(batch, heads, 1, kv_len, head_dim, causal=False)


def decode_kv_bytes(batch: int, kv_heads: int, kv_len: int, head_dim: int, element_bytes: int) -> int:
    """K and V read by one decode call: 2·B·Hkv·T·D·element_bytes."""
    return 2 * batch * kv_heads * kv_len * head_dim * element_bytes


# --- attention -----------------------------------------------------------------------------------------------


def _sdpa_context(backend: str):
    from tfcalc.model.layers import sdpa_context

    return sdpa_context(backend)


def sdpa_runs(backend: str, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
              causal: bool = True) -> str | None:
    """None when ``backend`` runs the benchmark's own call here (``is_causal``, ``enable_gqa``, no mask) on a
    tiny input, else the reason it does not. :func:`tfcalc.model.layers.backend_works` probes with a boolean
    mask, which the flash backend never accepts; this probe mirrors the call that is timed."""
    if backend not in ATTENTION_BACKENDS:
        raise UsageError(f"unknown attention backend '{backend}' (known: {', '.join(ATTENTION_BACKENDS)})")
    q = torch.randn(1, heads, 4, head_dim, dtype=dtype, device=device)
    kv = torch.randn(1, kv_heads, 4, head_dim, dtype=dtype, device=device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns once per rejected kernel before raising
            with _sdpa_context(backend):
                F.scaled_dot_product_attention(q, kv, kv, is_causal=causal, enable_gqa=True)
    except RuntimeError as exc:
        return _first_sentence(exc)
    return None


def _first_sentence(exc: BaseException, limit: int = 120) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(". ")[0].rstrip(".")[:limit]


def _timed(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> tuple[Timing | None, str]:
    """(timing, "ok"), or (None, "oom" / "error: ...") when the call fails at this size."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return time_call(fn, device, warmup=warmup, repeats=repeats), "ok"
    except RuntimeError as exc:
        release_memory(device)
        if is_oom(exc):
            return None, "oom"
        return None, f"error: {_first_sentence(exc)}"


def attention_rows(device: torch.device, dtype: torch.dtype, backends: Iterable[str], seq_lens: Iterable[int],
                   heads: int, kv_heads_list: Iterable[int], head_dim: int, batch: int, causal: bool = True,
                   decode: bool = True, decode_batch: int | None = None, peak_flops_per_s: float | None = None,
                   peak_bytes_per_s: float | None = None, warmup: int = 2, repeats: int = 5,
                   progress: Callable[[str], None] | None = None) -> list[dict[str, object]]:
    """Time ``F.scaled_dot_product_attention`` for each backend x KV-head count x sequence length.

    prefill: q [B, H, T, D], k/v [B, Hkv, T, D], ``is_causal=causal``, ``enable_gqa=True``; rate in FLOP/s under
    the convention above. decode (when ``decode``): q [Bd, H, 1, D] against k/v [Bd, Hkv, T, D]; rate in bytes/s
    of K+V read (and FLOP/s for reference). A backend that cannot run here gives one ``unavailable`` row per
    would-be measurement, with the reason in ``note``; a size that runs out of memory gives ``oom``.
    ``peak_*`` (e.g. a datasheet figure) adds the fraction achieved.
    """
    backends, seq_lens, kv_list = list(backends), list(seq_lens), list(kv_heads_list)
    decode_batch = decode_batch or batch
    element = torch.empty((), dtype=dtype).element_size()
    for kv in kv_list:
        if kv <= 0 or heads % kv:
            raise UsageError(f"kv heads {kv} must divide the {heads} query heads (GQA groups)")
    rows: list[dict[str, object]] = []
    phases = ("prefill", "decode") if decode else ("prefill",)
    for backend in backends:
        for kv in kv_list:
            reason = sdpa_runs(backend, heads, kv, head_dim, dtype, device, causal)
            for t in seq_lens:
                for phase in phases:
                    b = batch if phase == "prefill" else decode_batch
                    if phase == "prefill":
                        flops = prefill_attention_flops(b, heads, t, head_dim, causal)
                        nbytes = None
                    else:
                        flops = decode_attention_flops(b, heads, t, head_dim)
                        nbytes = decode_kv_bytes(b, kv, t, head_dim, element)
                    row: dict[str, object] = {
                        "device": str(device), "backend": backend, "backend_ran": None, "dtype": dtype_name(dtype),
                        "batch": b, "heads": heads, "kv_heads": kv, "gqa_ratio": heads // kv, "head_dim": head_dim,
                        "seq_len": t, "phase": phase, "causal": causal if phase == "prefill" else False,
                        "flops": flops, "bytes": nbytes, "time_s": None, "time_p25_s": None, "time_p75_s": None,
                        "flops_per_s": None, "tflops_per_s": None, "bytes_per_s": None,
                        "flops_fraction_of_peak": None, "bandwidth_fraction_of_peak": None,
                        "status": "unavailable" if reason else "ok", "note": reason or "",
                    }
                    rows.append(row)
                    if reason:
                        continue
                    if progress is not None:
                        progress(f"attention {backend} T={t} Hkv={kv} {phase}")
                    timing, status, ran = _time_attention(device, dtype, backend, phase, b, heads, kv, t,
                                                          head_dim, causal, warmup, repeats)
                    row["backend_ran"] = ran
                    row["status"] = "ok" if timing else status.split(":")[0]
                    row["note"] = "" if timing else status
                    if timing is None:
                        continue
                    rate = flops / timing.median_s
                    row.update(time_s=timing.median_s, time_p25_s=timing.p25_s, time_p75_s=timing.p75_s,
                               flops_per_s=rate, tflops_per_s=rate / 1e12)
                    if nbytes is not None:
                        row["bytes_per_s"] = nbytes / timing.median_s
                    if peak_flops_per_s and phase == "prefill":
                        row["flops_fraction_of_peak"] = rate / peak_flops_per_s
                    if peak_bytes_per_s and nbytes is not None:
                        row["bandwidth_fraction_of_peak"] = nbytes / timing.median_s / peak_bytes_per_s
    return rows


def _time_attention(device: torch.device, dtype: torch.dtype, backend: str, phase: str, batch: int, heads: int,
                    kv_heads: int, seq_len: int, head_dim: int, causal: bool, warmup: int,
                    repeats: int) -> tuple[Timing | None, str, str | None]:
    """(timing or None, status, the kernel that ran: the forced backend, or torch's choice for ``auto``)."""
    q_len = seq_len if phase == "prefill" else 1
    try:
        # Random, non-zero inputs (never time on zeros); unit scale keeps the softmax well conditioned.
        q = torch.randn(batch, heads, q_len, head_dim, dtype=dtype, device=device)
        k = torch.randn(batch, kv_heads, seq_len, head_dim, dtype=dtype, device=device)
        v = torch.randn(batch, kv_heads, seq_len, head_dim, dtype=dtype, device=device)
    except RuntimeError as exc:
        release_memory(device)
        return None, "oom" if is_oom(exc) else f"error: {_first_sentence(exc)}", None
    is_causal = causal and phase == "prefill"

    def call() -> torch.Tensor:
        with _sdpa_context(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)

    ran = auto_choice(q, k, v, is_causal) if backend == "auto" else backend
    timing, status = _timed(call, device, warmup, repeats)
    release_memory(device)  # q, k, v go with this frame; the caching allocator keeps their blocks until emptied
    return timing, status, ran


def auto_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> str | None:
    """The backend SDPA's dispatcher picks for these inputs with nothing forced (``torch._fused_sdp_choice``,
    a private API: None where it is missing or fails)."""
    from torch.nn.attention import SDPBackend

    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
             SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
    try:
        choice = SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=is_causal, enable_gqa=True))
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None
    return names.get(choice, choice.name.lower())


# --- MoE vs dense ----------------------------------------------------------------------------------------------


def moe_layer_params(spec) -> dict[str, int]:  # spec: ModelSpec with moe
    """Parameter counts of one MoE layer, asked of ``tfcalc.calc.params`` (the one derivation of shapes): total,
    active per token (router + K experts + shared), one expert, the router, and the dense FFN of width K·I
    (+ shared width) that matches the active expert parameters."""
    from tfcalc.calc.params import count_params, ffn_params

    moe = spec.moe
    totals = count_params(spec).total
    layers = spec.num_moe_layers
    per_expert = ffn_params(spec, moe.expert_intermediate_size, moe.expert_bias).total
    router = totals["router"].total // layers
    shared = totals["shared_experts"].total // layers
    dense = ffn_params(spec, dense_intermediate(spec), False).total
    return {"total": totals["experts"].total // layers + router + shared,
            "active": router + moe.experts_per_token * per_expert + shared,
            "per_expert": per_expert, "router": router, "dense": dense}


def dense_intermediate(spec) -> int:
    """K x expert width + shared width: a dense FFN with the MoE layer's active expert parameters per token."""
    moe = spec.moe
    return moe.experts_per_token * moe.expert_intermediate_size + moe.num_shared_experts * \
        moe.shared_expert_intermediate_size


def expert_load(counts: list[int], experts_per_token: int, tokens: int) -> dict[str, float]:
    """From per-expert (token, expert) pair counts: max and mean tokens per expert, max / mean, distinct
    experts touched, and the distinct count expected under uniform routing, E(1 - (1 - k/E)^N)."""
    from tfcalc.calc.kernels import distinct_experts

    e = len(counts)
    mean = tokens * experts_per_token / e
    peak = max(counts)
    return {"max_tokens_per_expert": peak, "mean_tokens_per_expert": mean,
            "load_imbalance": peak / mean if mean else math.nan,
            "distinct_experts": sum(1 for c in counts if c > 0),
            "expected_distinct_experts": distinct_experts(e, experts_per_token, tokens)}


def moe_rows(device: torch.device, dtype: torch.dtype, spec, tokens_list: Iterable[int], warmup: int = 2,
             repeats: int = 5, seed: int = 0,
             progress: Callable[[str], None] | None = None) -> list[dict[str, object]]:
    """The bundled :class:`~tfcalc.model.layers.MoE` layer of ``spec`` (already scaled to fit) against a dense
    :class:`~tfcalc.model.layers.FeedForward` of width :func:`dense_intermediate` (same active expert
    parameters per token), both on N random tokens; per N: time, tokens/s, moe/dense and the expert load the
    layer's ``expert_counts`` recorded for that input."""
    from tfcalc.model.layers import FeedForward, MoE

    if spec.moe is None:
        raise UsageError(f"{spec.name} has no MoE layers; pick an MoE preset (e.g. mixtral-8x7b, qwen3-30b-a3b)")
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in the benchmark dtype: no fp32 copy of a GPU-sized layer first
    try:
        with torch.device(device):
            moe_layer = MoE(spec).eval()
            dense = FeedForward(spec, dense_intermediate(spec), bias=False).eval()
    finally:
        torch.set_default_dtype(previous)
    params = moe_layer_params(spec)
    m = spec.moe
    rows: list[dict[str, object]] = []
    for n in tokens_list:
        row: dict[str, object] = {
            "device": str(device), "model": spec.name, "dtype": dtype_name(dtype), "hidden": spec.hidden_size,
            "experts": m.num_experts, "experts_per_token": m.experts_per_token,
            "expert_intermediate": m.expert_intermediate_size, "dense_intermediate": dense_intermediate(spec),
            "moe_params": params["total"], "moe_active_params": params["active"], "dense_params": params["dense"],
            "tokens": n, "moe_time_s": None, "dense_time_s": None, "moe_tokens_per_s": None,
            "dense_tokens_per_s": None, "moe_over_dense": None, "max_tokens_per_expert": None,
            "mean_tokens_per_expert": None, "load_imbalance": None, "distinct_experts": None,
            "expected_distinct_experts": None, "status": "ok", "note": "",
        }
        rows.append(row)
        if progress is not None:
            progress(f"moe tokens={n}")
        try:
            x = torch.randn(n, spec.hidden_size, device=device, dtype=dtype)
        except RuntimeError as exc:
            release_memory(device)
            row["status"] = "oom" if is_oom(exc) else "error"
            row["note"] = _first_sentence(exc)
            continue
        with torch.inference_mode():
            moe_t, moe_status = _timed(lambda x=x: moe_layer(x), device, warmup, repeats)
            counts = [int(c) for c in moe_layer.expert_counts.tolist()]  # the timed input's routing
            dense_t, dense_status = _timed(lambda x=x: dense(x), device, warmup, repeats)
        if moe_t is None or dense_t is None:
            bad = moe_status if moe_t is None else dense_status
            row["status"], row["note"] = bad.split(":")[0], bad
            continue
        row.update(moe_time_s=moe_t.median_s, dense_time_s=dense_t.median_s, moe_tokens_per_s=n / moe_t.median_s,
                   dense_tokens_per_s=n / dense_t.median_s, moe_over_dense=dense_t.median_s / moe_t.median_s,
                   **expert_load(counts, m.experts_per_token, n))
    release_memory(device)
    return rows


# --- ceilings --------------------------------------------------------------------------------------------------


def _cpu_matmul_size(dtype: torch.dtype, largest: int = 1024, budget_s: float = 0.1) -> int:
    """The largest power of two <= ``largest`` whose CPU matmul should take under ``budget_s``, extrapolated
    (n^3) from a 128^3 call: fp16 has no fast kernel on most CPUs and runs 100x slower than fp32."""
    import time

    a = torch.randn(128, 128).to(dtype)
    a @ a
    start = time.perf_counter()
    a @ a
    elapsed = max(time.perf_counter() - start, 1e-6)
    n = 128
    while n < largest and elapsed * (2 * n / 128) ** 3 < budget_s:
        n *= 2
    return n


def ceiling_rows(device: torch.device, dtypes: Iterable[torch.dtype], copy_bytes: int | None = None,
                 matmul_n: int | None = None, repeats: int = 10) -> list[dict[str, object]]:
    """The device's copy bandwidth (bytes read + written / s, :func:`tfcalc.profile.ceilings.copy_bandwidth`)
    and, per dtype, square-matmul FLOP/s (2 n³ / time, :func:`~tfcalc.profile.ceilings.matmul_flops`), with the
    timing spread: rates at the p75 and p25 times (slow and fast quartiles)."""
    from tfcalc.profile.ceilings import Ceiling, copy_bandwidth, matmul_flops

    def row(c: Ceiling | None, kind: str, dtype: str, size: int, work: float, status: str = "ok",
            note: str = "") -> dict[str, object]:
        t = c.timing if c else None
        rate_key = "bytes_per_s" if kind == "copy" else "flops_per_s"
        out: dict[str, object] = {
            "device": str(device), "ceiling": kind, "dtype": dtype,
            "size": size, "size_unit": "bytes per buffer" if kind == "copy" else "n (n x n x n)",
            "work_per_call": work, "work_unit": "bytes read + written" if kind == "copy" else "FLOP (2 n^3)",
            "time_s": t.median_s if t else None, "time_p25_s": t.p25_s if t else None,
            "time_p75_s": t.p75_s if t else None, "bytes_per_s": None, "flops_per_s": None,
            "rate_p25": work / t.p75_s if t else None, "rate_p75": work / t.p25_s if t else None,
            "spread": t.spread if t else None, "repeats": t.repeats if t else None, "status": status, "note": note,
        }
        out[rate_key] = c.value if c else None
        return out

    rows = []
    size = copy_bytes or ((1 << 30) if device.type == "cuda" else (256 << 20))
    try:
        c = copy_bandwidth(device, size, repeats=repeats)
        rows.append(row(c, "copy", "uint8", c.size, 2 * c.size))
    except RuntimeError as exc:
        release_memory(device)
        rows.append(row(None, "copy", "uint8", size, 2 * size, "oom" if is_oom(exc) else "error",
                            _first_sentence(exc)))
    for dtype in dtypes:
        n = matmul_n or (8192 if device.type == "cuda" else _cpu_matmul_size(dtype))
        try:
            c = matmul_flops(device, dtype, n, repeats=repeats)
            rows.append(row(c, "matmul", dtype_name(dtype), n, 2 * n**3))
        except RuntimeError as exc:
            release_memory(device)
            rows.append(row(None, "matmul", dtype_name(dtype), n, 2 * n**3, "oom" if is_oom(exc) else "error",
                            _first_sentence(exc)))
        release_memory(device)
    return rows


# --- sizing helpers for the CLI ----------------------------------------------------------------------------------

CPU_MOE_HIDDEN = 512  # hidden width the CPU default scales an MoE preset down to (experts and top-k kept)


def moe_bench_spec(spec, device: torch.device, hidden: int | None = None, experts: int | None = None,
                   experts_per_token: int | None = None, expert_intermediate: int | None = None):
    """``spec`` for the MoE benchmark: the preset's sizes on a GPU; on the CPU, hidden scaled down to 512.
    Whenever hidden changes and no expert width is given, the expert width (and a shared expert's) is scaled by
    the same factor, rounded to 16; experts and top-k are kept unless given."""
    from tfcalc.model.transformer import scale_spec

    if spec.moe is None:
        raise UsageError(f"{spec.name} has no MoE layers; pick an MoE preset (e.g. mixtral-8x7b, qwen3-30b-a3b)")
    if device.type == "cpu" and hidden is None and spec.hidden_size > CPU_MOE_HIDDEN:
        hidden = CPU_MOE_HIDDEN
    if hidden is not None and hidden > 0 and hidden != spec.hidden_size and expert_intermediate is None:
        factor = hidden / spec.hidden_size
        expert_intermediate = max(16, round(spec.moe.expert_intermediate_size * factor / 16) * 16)
    for value, what in ((hidden, "hidden"), (experts, "experts"), (experts_per_token, "experts per token"),
                        (expert_intermediate, "expert intermediate")):
        if value is not None and value <= 0:
            raise UsageError(f"--{what.replace(' ', '-')} must be positive")
    return scale_spec(spec, hidden=hidden, experts=experts, experts_per_token=experts_per_token,
                      expert_intermediate=expert_intermediate)


def check_fits(device: torch.device, nbytes: int, what: str, hint: str) -> None:
    """Refuse up front when ``nbytes`` of weights exceed 80 % of the GPU's free memory."""
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    if nbytes > 0.8 * free:
        raise UsageError(f"{what} needs {nbytes / (1 << 30):,.1f} GiB but {device} has {free / (1 << 30):,.1f} GiB "
                         f"free; {hint}")


def datasheet_peaks(device: torch.device, dtype: torch.dtype) -> tuple[float | None, float | None, str | None]:
    """(dense FLOP/s for ``dtype``, HBM bytes/s, preset name) of the GPU preset this device's name matches;
    (None, None, None) on the CPU or when no preset matches."""
    if device.type != "cuda":
        return None, None, None
    from tfcalc.profile.device import match_gpu_preset
    from tfcalc.spec.presets import load_gpu

    preset = match_gpu_preset(torch.cuda.get_device_name(device))
    if preset is None:
        return None, None, None
    gpu = load_gpu(preset)
    return gpu.dense_flops_per_s.get(dtype_name(dtype)), gpu.hbm_bandwidth_bytes_per_s, preset
