"""What this device can actually do: a large device-to-device copy and a large matmul, measured in the same run.

Copy bandwidth counts bytes read + written (2 x buffer) with buffers far larger than any cache (L2 is 50-60 MB
on H100/H200; the CPU buffer is 256 MiB). Matmul FLOP/s = 2 n^3 / time for an n x n x n product of random
inputs (zeros make some GPUs run faster than real data).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from tfcalc.profile.device import dtype_name, is_oom, release_memory
from tfcalc.profile.timing import Timing, first_sentence, time_call


@dataclass(frozen=True, kw_only=True)
class Ceiling:
    name: str
    dtype: str
    size: int
    value: float  # bytes/s for copy, FLOP/s for matmul
    timing: Timing


def copy_bandwidth(device: torch.device, buffer_bytes: int | None = None, repeats: int = 10) -> Ceiling:
    """Bytes read + written per second by ``dst.copy_(src)`` (default: 1 GiB on a GPU, 256 MiB on the CPU)."""
    size = buffer_bytes or ((1 << 30) if device.type == "cuda" else (256 << 20))
    # Random bytes, not zeros: 1 MiB of them tiled (drawing 256 MiB one by one takes seconds on a small CPU).
    tile = torch.randint(0, 255, (min(size, 1 << 20),), dtype=torch.uint8, device=device)
    src = tile.repeat(-(-size // tile.numel()))[:size].contiguous()
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device, warmup=3, repeats=repeats)
    return Ceiling(name="copy", dtype="uint8", size=size, value=2 * size / timing.median_s, timing=timing)


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 10) -> Ceiling:
    """2 n^3 / time for a square matmul (default n = 8192 on a GPU, 1024 on the CPU)."""
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    b = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    timing = time_call(lambda: a @ b, device, warmup=3, repeats=repeats)
    return Ceiling(name="matmul", dtype=str(dtype).removeprefix("torch."), size=n, value=2 * n**3 / timing.median_s,
                   timing=timing)


def fp8_matmul_flops(device: torch.device, n: int | None = None, repeats: int = 10) -> Ceiling:
    """2 n^3 / time for an n x n x n FP8 product through the profiler's own GEMM (``tfcalc.model.fp8``: per-token
    activation scales, per-tensor weight scale, ``torch.nn.functional.scaled_mm`` RowWise), activations
    quantized outside the timing. Only meaningful where that kernel runs (``native_gemm_works``)."""
    from tfcalc.model.fp8 import quantize_activation, quantize_weight, scaled_gemm

    n = n or (8192 if device.type == "cuda" else 1024)
    xq, xs = quantize_activation(torch.randn(n, n, device=device), block=False)
    wq, ws = quantize_weight(torch.randn(n, n, device=device), block=False)
    timing = time_call(lambda: scaled_gemm(xq, xs, wq, ws, False, torch.bfloat16), device, warmup=3, repeats=repeats)
    return Ceiling(name="matmul", dtype="fp8_e4m3", size=n, value=2 * n**3 / timing.median_s, timing=timing)


# --- the rows of tfcalc bench ceilings ---------------------------------------------------------------------------


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
    timing spread: rates at the p75 and p25 times (slow and fast quartiles: p25_bytes_per_s and p75_bytes_per_s, or
    p25_flops_per_s and p75_flops_per_s)."""
    def row(c: Ceiling | None, kind: str, dtype: str, size: int, work: float, status: str = "ok",
            note: str = "") -> dict[str, object]:
        t = c.timing if c else None
        unit = "bytes_per_s" if kind == "copy" else "flops_per_s"
        out: dict[str, object] = {
            "device": str(device), "ceiling": kind, "dtype": dtype,
            "size": size, "size_unit": "bytes per buffer" if kind == "copy" else "n (n x n x n)",
            "work_per_call": work, "work_unit": "bytes read + written" if kind == "copy" else "FLOP (2 n^3)",
            "time_s": t.median_s if t else None, "time_p25_s": t.p25_s if t else None,
            "time_p75_s": t.p75_s if t else None, "bytes_per_s": None, "flops_per_s": None,
            f"p25_{unit}": work / t.p75_s if t else None, f"p75_{unit}": work / t.p25_s if t else None,
            "spread": t.spread if t else None, "repeats": t.repeats if t else None, "status": status, "note": note,
        }
        out[unit] = c.value if c else None
        return out

    rows = []
    size = copy_bytes or ((1 << 30) if device.type == "cuda" else (256 << 20))
    try:
        c = copy_bandwidth(device, size, repeats=repeats)
        rows.append(row(c, "copy", "uint8", c.size, 2 * c.size))
    except RuntimeError as exc:
        release_memory(device)
        rows.append(row(None, "copy", "uint8", size, 2 * size, "oom" if is_oom(exc) else "error",
                            first_sentence(exc)))
    for dtype in dtypes:
        n = matmul_n or (8192 if device.type == "cuda" else _cpu_matmul_size(dtype))
        try:
            c = matmul_flops(device, dtype, n, repeats=repeats)
            rows.append(row(c, "matmul", dtype_name(dtype), n, 2 * n**3))
        except RuntimeError as exc:
            release_memory(device)
            rows.append(row(None, "matmul", dtype_name(dtype), n, 2 * n**3, "oom" if is_oom(exc) else "error",
                            first_sentence(exc)))
        release_memory(device)
    return rows
