"""``tfcalc bench attention``: SDPA per backend x sequence length x GQA ratio, with the FLOP and byte counts.

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

import warnings
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from tfcalc.errors import UsageError
from tfcalc.profile.device import dtype_name, is_oom, release_memory
from tfcalc.profile.timing import Timing, first_sentence, time_or_failure

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
        return first_sentence(exc)
    return None


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
        return None, "oom" if is_oom(exc) else f"error: {first_sentence(exc)}", None
    is_causal = causal and phase == "prefill"

    def call() -> torch.Tensor:
        with _sdpa_context(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)

    ran = auto_choice(q, k, v, is_causal) if backend == "auto" else backend
    timing, status = time_or_failure(call, device, warmup, repeats)
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
