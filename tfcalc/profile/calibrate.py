"""Measurements for a latency-model calibration file (``tfcalc bench calibrate``; format: tfcalc/calc/calibration.py).

Four sweeps, each timed after warm-up: with device events on a GPU, the median repeat; with perf_counter on a CPU,
the fastest repeat (on a shared CPU other processes' time slices land in the timings -- an intra-op thread waiting
for a busy core adds ~10 ms to a 0.2 ms GEMM -- and a calibration wants what the device can do):

- GEMM efficiency curve: ``a @ b.T`` with a [M x K] and b [N x K] (a linear layer's shapes) over M x (N = K), random
  inputs, per dtype;
- bandwidth by size: ``dst.copy_(src)`` of uint8 buffers from 4 KiB up; bytes moved = 2 x size (read + write);
- launch floor: N tiny in-place adds (one element) launched eagerly, and the same N replayed from one CUDA graph
  (GPU only); per-kernel time = total / N;
- attention by context: SDPA causal prefill (q, k, v of T tokens, GQA via ``enable_gqa``) and decode (one query per
  sequence against T cached keys).

Sizes are smaller on the CPU, where the same code runs (and is tested) in seconds.
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tfcalc.calc.calibration import KIND, VERSION
from tfcalc.profile.timing import Timing, time_call


@dataclass(frozen=True, kw_only=True)
class CalibrationPlan:
    """What to measure: shapes per sweep (defaults per device in ``default_plan``)."""

    gemm_dtypes: tuple[str, ...]
    gemm_m: tuple[int, ...]
    gemm_nk: tuple[int, ...]
    copy_bytes: tuple[int, ...]
    launch_kernels: int
    attention_seq: tuple[int, ...]
    heads: int
    kv_heads: int
    head_dim: int
    decode_batch: int
    warmup: int = 2
    repeats: int = 5


def default_plan(device: torch.device, quick: bool = False) -> CalibrationPlan:
    """GPU: M 1..8192 x N = K 1024..8192 (bf16, fp16), copies 4 KiB..1 GiB, attention 256..16k tokens (32/8 heads
    of 128). CPU (or ``quick``): small shapes that finish in seconds."""
    if device.type == "cuda" and not quick:
        return CalibrationPlan(gemm_dtypes=("bf16", "fp16"), gemm_m=(1, 8, 32, 128, 512, 1024, 2048, 4096, 8192),
                               gemm_nk=(1024, 2048, 4096, 8192), copy_bytes=tuple(4096 * 4**i for i in range(10)),
                               launch_kernels=200, attention_seq=(256, 1024, 4096, 16384), heads=32, kv_heads=8,
                               head_dim=128, decode_batch=16, warmup=3, repeats=10)
    return CalibrationPlan(gemm_dtypes=("fp32",) if device.type == "cpu" else ("bf16",), gemm_m=(1, 16, 256, 1024),
                           gemm_nk=(256, 1024), copy_bytes=tuple(4096 * 4**i for i in range(7)), launch_kernels=50,
                           attention_seq=(128, 1024), heads=8, kv_heads=2, head_dim=64, decode_batch=4, warmup=1,
                           repeats=3)


def _seconds(timing: Timing, device: torch.device) -> float:
    """The time a calibration keeps (module docstring): median on a GPU, fastest repeat on a CPU."""
    return timing.min_s if device.type == "cpu" else timing.median_s


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def gemm_rows(device: torch.device, plan: CalibrationPlan, progress: Callable[[str], None] | None = None) -> list[dict]:
    rows = []
    for name in plan.gemm_dtypes:
        dtype = _DTYPES[name]
        for nk in plan.gemm_nk:
            weight = torch.randn(nk, nk, device=device, dtype=torch.float32).to(dtype)
            for m in plan.gemm_m:
                if progress:
                    progress(f"gemm {name} {m}x{nk}x{nk}")
                x = torch.randn(m, nk, device=device, dtype=torch.float32).to(dtype)
                timing = time_call(lambda x=x, w=weight: F.linear(x, w), device, plan.warmup, plan.repeats)
                rows.append({"dtype": name, "m": m, "n": nk, "k": nk, "seconds": _seconds(timing, device)})
            del weight
    return rows


def memory_rows(device: torch.device, plan: CalibrationPlan,
                progress: Callable[[str], None] | None = None) -> list[dict]:
    rows = []
    for size in plan.copy_bytes:
        if progress:
            progress(f"copy {size:,} B")
        src = torch.empty(size, dtype=torch.uint8, device=device).random_(0, 255)
        dst = torch.empty_like(src)
        timing = time_call(lambda dst=dst, src=src: dst.copy_(src), device, plan.warmup, plan.repeats)
        rows.append({"bytes": 2 * size, "seconds": _seconds(timing, device)})
        del src, dst
    return rows


def launch_floor(device: torch.device, plan: CalibrationPlan) -> dict:
    """Per-kernel time of N tiny adds: eager, and replayed from one CUDA graph (None on the CPU)."""
    x = torch.zeros(1, device=device)
    n = plan.launch_kernels

    def many() -> None:
        for _ in range(n):
            x.add_(1)

    eager = _seconds(time_call(many, device, plan.warmup, plan.repeats), device) / n
    graph = None
    if device.type == "cuda":
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            many()  # warm up on the side stream before capture, as torch.cuda.graphs requires
        torch.cuda.current_stream(device).wait_stream(stream)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            many()
        graph = time_call(captured.replay, device, plan.warmup, plan.repeats).median_s / n
    return {"graph_seconds": graph, "eager_seconds": eager}


def attention_rows(device: torch.device, plan: CalibrationPlan,
                   progress: Callable[[str], None] | None = None) -> list[dict]:
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    h, kv, d = plan.heads, plan.kv_heads, plan.head_dim
    rows = []
    for seq in plan.attention_seq:
        if progress:
            progress(f"attention {seq} tokens")
        q = torch.randn(1, h, seq, d, device=device, dtype=dtype)
        k = torch.randn(1, kv, seq, d, device=device, dtype=dtype)
        v = torch.randn_like(k)
        timing = time_call(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                  enable_gqa=True),
                           device, plan.warmup, plan.repeats)
        rows.append({"phase": "prefill", "batch": 1, "heads": h, "kv_heads": kv, "head_dim": d, "seq_len": seq,
                     "seconds": _seconds(timing, device)})
        b = plan.decode_batch
        q1 = torch.randn(b, h, 1, d, device=device, dtype=dtype)
        kc = torch.randn(b, kv, seq, d, device=device, dtype=dtype)
        vc = torch.randn_like(kc)
        timing = time_call(lambda q1=q1, kc=kc, vc=vc: F.scaled_dot_product_attention(q1, kc, vc, enable_gqa=True),
                           device, plan.warmup, plan.repeats)
        rows.append({"phase": "decode", "batch": b, "heads": h, "kv_heads": kv, "head_dim": d, "seq_len": seq,
                     "seconds": _seconds(timing, device)})
        del q, k, v, q1, kc, vc
    return rows


def measure_calibration(device: torch.device, device_name: str, plan: CalibrationPlan,
                        progress: Callable[[str], None] | None = None) -> dict:
    """Run the four sweeps and return the calibration mapping (tfcalc/calc/calibration.py format)."""
    from tfcalc import __version__

    data = {
        "kind": KIND, "version": VERSION, "device_name": device_name,
        "source": f"tfcalc bench calibrate on {device_name} (torch {torch.__version__}, {platform.machine()})",
        "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tfcalc_version": __version__,
    }
    data["gemm"] = gemm_rows(device, plan, progress)
    data["memory"] = memory_rows(device, plan, progress)
    if progress:
        progress("launch floor")
    data["launch"] = launch_floor(device, plan)
    data["attention"] = attention_rows(device, plan, progress)
    return data
