"""What this device can actually do: a large device-to-device copy and a large matmul, measured in the same run.

Copy bandwidth counts bytes read + written (2 x buffer) with buffers far larger than any cache (L2 is 50-60 MB
on H100/H200; the CPU buffer is 256 MiB). Matmul FLOP/s = 2 n^3 / time for an n x n x n product of random
inputs (zeros make some GPUs run faster than real data).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcalc.profile.timing import Timing, time_call


@dataclass(frozen=True)
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
    return Ceiling("copy", "uint8", size, 2 * size / timing.median_s, timing)


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 10) -> Ceiling:
    """2 n^3 / time for a square matmul (default n = 8192 on a GPU, 1024 on the CPU)."""
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    b = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    timing = time_call(lambda: a @ b, device, warmup=3, repeats=repeats)
    return Ceiling("matmul", str(dtype).removeprefix("torch."), n, 2 * n**3 / timing.median_s, timing)


def fp8_matmul_flops(device: torch.device, n: int | None = None, repeats: int = 10) -> Ceiling:
    """2 n^3 / time for an n x n x n FP8 product through the profiler's own GEMM (``tfcalc.model.fp8``: per-token
    activation scales, per-tensor weight scale, ``torch.nn.functional.scaled_mm`` RowWise), activations
    quantized outside the timing. Only meaningful where that kernel runs (``native_gemm_works``)."""
    from tfcalc.model.fp8 import quantize_activation, quantize_weight, scaled_gemm

    n = n or (8192 if device.type == "cuda" else 1024)
    xq, xs = quantize_activation(torch.randn(n, n, device=device), block=False)
    wq, ws = quantize_weight(torch.randn(n, n, device=device), block=False)
    timing = time_call(lambda: scaled_gemm(xq, xs, wq, ws, False, torch.bfloat16), device, warmup=3, repeats=repeats)
    return Ceiling("matmul", "fp8_e4m3", n, 2 * n**3 / timing.median_s, timing)
