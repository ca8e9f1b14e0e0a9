"""Time of one GPU kernel from its FLOPs and bytes: the per-operation latency model behind ``tfcalc estimate``.

Every kernel costs

    time = max(FLOPs / achievable FLOP/s(shape, dtype), bytes / achievable bandwidth(size), dequant time) + floor

- **Achievable FLOP/s** = dense peak x the GPU's large-GEMM efficiency for the compute dtype x K / (K + K0):
  each output tile pays a prologue/epilogue worth about K0 = 128 elements of its K loop, so short-K GEMMs
  (MoE down projections at high tensor parallelism) run far below peak. Measured: bf16 GEMMs with M, N >= 4096
  on an H200 reach 0.50 / 0.63 / 0.70 / 0.75 of peak at K = 256 / 512 / 1024 / >= 2048 (aiconfigurator's
  vLLM 0.24 gemm table), which 0.77 x K / (K + 128) reproduces within 3 %.
- **Achievable bandwidth** = datasheet HBM x the GPU's streaming efficiency, or a measured curve by size from a
  calibration file.
- **Dequantisation** (weight-only int8/int4/fp4 GEMMs in 16-bit activations): every weight element is unpacked and
  scaled on the CUDA cores; at ``DEQUANT_OPS`` instructions per element the ALUs, not HBM, bound the kernel
  (gpt-fast int8 decode reaches 52 % of A100 HBM against 69 % in bf16; vLLM's MXFP4 MoE on an H200 streams
  4.7e12 weights/s, 7 instructions each at the fp32 rate).
- **Floor**: the fixed cost of a kernel (launch, ramp-up, tail) per kernel class, measured on the GPU (preset) or
  by ``tfcalc bench calibrate``; without CUDA graphs a kernel also waits for the host to launch it.
- **Flash attention** (prefill): query tiles of 128 rows against key tiles of 128 (FlashAttention-2, arXiv
  2307.08691, sec. 3); causal diagonal tiles are computed whole and each query tile pays a prologue of about
  two key tiles; the kernel takes max(total tile work / SMs, longest query tile) -- with fewer query tiles than
  SMs the longest one sets the time.
- **Decode attention** streams the KV cache; split-KV kernels need enough (sequence, KV head) streams in flight
  to reach full bandwidth: with u streams they reach u / (u + u_half) of it (u_half = 2.8 fits FlashAttention-3
  decode on an H200 within 10 % from 1 to 256 streams, aiconfigurator vLLM 0.24 table).

``ideal=True`` rates turn every efficiency to 1 and every floor to 0: the pure roofline.
Pure math: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from tfcalc.calc.comm import LinkFit

# Elements of K loop one output tile's prologue/epilogue costs, per compute dtype (module docstring): fit of
# eff x K / (K + K0) to GEMMs with M, N >= 4096 swept over K on an H200 (aiconfigurator vLLM 0.24 gemm table):
# bf16 0.50 / 0.70 / 0.75 at K = 256 / 1024 / 8192; fp8 (CUTLASS scaled-mm with per-token scales in the epilogue)
# 0.27 / 0.42 / 0.62 at K = 512 / 1024 / 8192.
GEMM_K0 = {"bf16": 128, "fp16": 128, "fp32": 128, "fp8": 512, "int8": 512, "fp4": 512}
FLASH_TILE = 128  # rows per query tile and keys per key tile (FlashAttention-2/3 on Hopper)
FLASH_PROLOGUE_TILES = 2  # key tiles' worth of work each query tile pays up front
MOE_TILE_M = 64  # rows of a grouped-GEMM tile: an expert with fewer tokens still computes 64 rows
DECODE_STREAMS_HALF = 2.8  # u_half of decode attention (module docstring)

# CUDA-core instructions per weight element to dequantise in a weight-only GEMM (unpack, convert, scale), per
# storage format. gpt-fast README (A100-80GB at 330 W, batch 1, the 70B model where kernel floors matter least):
# Llama-2-70B int8 19.13 tok/s = 1.32e12 weights/s against the A100's 9.75e12 fp32 FMA/s -> 7.4; int4-g32
# 25.25 tok/s = 1.74e12 weights/s -> 5.6; vLLM's MXFP4 MoE on an H200 (aiconfigurator vLLM 0.24 moe table, all 128
# experts streamed at >= 256 tokens): 4.7e12 weights/s at 33.5e12 FMA/s -> 7.1. fp8 weight-only (Marlin on
# Ampere) is taken as int8.
DEQUANT_OPS = {"int8": 7.4, "fp8": 7.4, "int4": 5.6, "fp4": 7.1}

KERNEL_CLASSES = ("gemm", "elementwise", "attention", "moe")


@dataclass(frozen=True, kw_only=True)
class Rates:
    """What one GPU achieves, as the latency model uses it (SI units: FLOP/s, bytes/s, seconds)."""

    name: str
    peak_flops: dict[str, float] = field(hash=False)  # dense datasheet peak per compute dtype
    gemm_efficiency: dict[str, float] = field(hash=False)  # large-GEMM fraction of peak per compute dtype
    attention_efficiency: float  # flash-attention prefill fraction of the 16-bit peak on long sequences
    moe_efficiency: float  # grouped expert GEMMs relative to a dense GEMM of the same shape
    memory_bandwidth: float  # datasheet bytes/s
    memory_efficiency: float  # fraction of it large streaming kernels reach
    alu_ops_per_s: float  # CUDA-core instructions/s (fp32 FMA rate) for dequantisation
    sm_count: int
    floors: dict[str, float] = field(hash=False)  # seconds per kernel class (KERNEL_CLASSES)
    launch_s: float = 0.0  # host launch interval per kernel when not under CUDA graphs
    cuda_graphs: bool = True
    bandwidth_points: tuple[tuple[float, float], ...] = ()  # measured (bytes, achievable bytes/s), sorted
    ideal: bool = False
    source: str = ""
    collectives: LinkFit | None = None  # a measured link (tfcalc bench collectives): replaces the fabric's NCCL link
    # derived once (the model prices millions of kernels): resolved floors and streaming bandwidth
    _floor: dict[str, float] = field(init=False, repr=False, compare=False, hash=False)
    _stream: float = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        floors = {kind: 0.0 if self.ideal else (value if self.cuda_graphs else max(value, self.launch_s))
                  for kind, value in self.floors.items()}
        object.__setattr__(self, "_floor", floors)
        stream = self.memory_bandwidth if self.ideal else (0.0 if self.bandwidth_points else
                                                           self.memory_bandwidth * self.memory_efficiency)
        object.__setattr__(self, "_stream", stream)

    def peak(self, compute: str) -> tuple[str, float]:
        """(dtype used, dense FLOP/s); a dtype the chip lacks falls back to bf16, then fp16."""
        for key in (compute, "bf16", "fp16"):
            if key in self.peak_flops:
                return key, self.peak_flops[key]
        raise ValueError(f"{self.name}: no dense throughput for {compute}")

    def gemm_flops_per_s(self, compute: str, k: float) -> float:
        """Peak x large-GEMM efficiency x K / (K + K0) (module docstring); the peak alone when ideal."""
        dtype, peak = self.peak(compute)
        if self.ideal:
            return peak
        eff = self.gemm_efficiency.get(dtype, self.gemm_efficiency.get("bf16", 0.7))
        k0 = GEMM_K0.get(dtype, 128)
        return peak * eff * k / (k + k0)

    def bandwidth(self, nbytes: float) -> float:
        """Achievable bytes/s for a kernel moving ``nbytes``: the calibrated curve (log-linear), else constant."""
        if self._stream:
            return self._stream
        points = self.bandwidth_points
        if nbytes <= points[0][0]:
            return points[0][1]
        if nbytes >= points[-1][0]:
            return points[-1][1]
        for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
            if nbytes <= x1:
                w = math.log(nbytes / x0) / math.log(x1 / x0)
                return y0 + w * (y1 - y0)
        return points[-1][1]  # unreachable

    def floor(self, kind: str) -> float:
        """Fixed seconds of one kernel of ``kind``; without CUDA graphs at least the host's launch interval."""
        floor = self._floor.get(kind)
        if floor is None:
            floor = self._floor.get("gemm", 0.0)
        return floor

    def as_ideal(self) -> Rates:
        return replace(self, ideal=True)

    def with_efficiency(self, compute: float | None = None, memory: float | None = None) -> Rates:
        """The same GPU with every compute efficiency (GEMM, attention) and/or the memory efficiency replaced."""
        changes: dict[str, object] = {}
        if compute is not None:
            changes.update(gemm_efficiency={k: compute for k in self.gemm_efficiency}, attention_efficiency=compute)
        if memory is not None:
            changes.update(memory_efficiency=memory, bandwidth_points=())
        return replace(self, **changes) if changes else self


class Cost(NamedTuple):
    """One kernel (or ``kernels`` identical kernels): time, work and what bound it (a tuple: built by the million)."""

    seconds: float
    flops: float
    bytes: float
    bound: str  # compute | memory | dequant | floor
    kernels: int = 1
    floor_seconds: float = 0.0  # the fixed part included in ``seconds``
    weight_bytes: float = 0.0  # the part of ``bytes`` that is weights
    ideal_bytes: float = 0.0  # compulsory traffic the pure roofline counts: weights, KV, hidden states, logits


def _finish(rates: Rates, kind: str, flops: float, nbytes: float, t_compute: float, t_dequant: float = 0.0,
            kernels: int = 1, weight_bytes: float = 0.0, ideal_bytes: float = 0.0) -> Cost:
    stream = rates._stream
    t_memory = (nbytes / (stream or rates.bandwidth(nbytes))) if nbytes else 0.0
    work = t_compute if t_compute > t_memory else t_memory
    if t_dequant > work:
        work = t_dequant
    floor = rates._floor.get(kind)
    floor = kernels * (rates.floor(kind) if floor is None else floor)
    if floor > work:
        bound = "floor"
    elif work == t_compute:
        bound = "compute"
    elif work == t_memory:
        bound = "memory"
    else:
        bound = "dequant"
    return Cost(work + floor, flops, nbytes, bound, kernels, floor, weight_bytes, ideal_bytes)


def gemm(rates: Rates, m: float, n: float, k: float, weight_bits: float, compute: str, act_bytes: float = 2.0,
         out_bytes: float = 2.0, dequant: str = "") -> Cost:
    """[m x k] @ [k x n]: 2mnk FLOPs; weights n k x bits/8 + activations m k + output m n bytes.

    ``dequant`` (a DEQUANT_OPS format) marks a weight-only kernel: 16-bit tensor cores plus dequantisation.
    """
    flops = 2.0 * m * n * k
    weights = n * k * weight_bits / 8
    nbytes = weights + m * k * act_bytes + m * n * out_bytes
    t_compute = flops / rates.gemm_flops_per_s(compute, k) if flops else 0.0
    t_dequant = 0.0
    if dequant and not rates.ideal:
        t_dequant = n * k * DEQUANT_OPS[dequant] / rates.alu_ops_per_s
    return _finish(rates, "gemm", flops, nbytes, t_compute, t_dequant, weight_bytes=weights, ideal_bytes=weights)


def elementwise(rates: Rates, nbytes: float, flops: float = 0.0, kernels: int = 1, ideal_bytes: float = 0.0) -> Cost:
    """A memory-bound kernel (norm, activation, rotary, cache write, quantisation) moving ``nbytes``; of them
    ``ideal_bytes`` are compulsory traffic (hidden states, KV written, logits) the pure roofline counts."""
    return _finish(rates, "elementwise", flops, nbytes, 0.0, kernels=kernels, ideal_bytes=ideal_bytes)


def _tiles(tokens: int, past: int, window: int | None) -> tuple[float, float, int]:
    """For one sequence's query tiles (tokens new after ``past`` cached): (sum of key tiles over query tiles,
    key tiles of the longest query tile, query tiles). Query tile i ends at row past + (i+1) x 128 and sees
    min(that, window) keys, in whole key tiles (causal diagonal tiles computed whole)."""
    q_tiles = -(-tokens // FLASH_TILE)
    if q_tiles == 0:
        return 0.0, 0.0, 0
    p = past / FLASH_TILE
    cap = math.inf if window is None else math.ceil(window / FLASH_TILE) + 1  # a window spans one more tile
    # key tiles of query tile i: min(ceil(p) + i + 1, cap) -- arithmetic series capped at ``cap``
    first = math.ceil(p) + 1
    uncapped = max(0, min(q_tiles, int(cap - first) + 1)) if cap != math.inf else q_tiles
    total = uncapped * first + uncapped * (uncapped - 1) / 2
    total += (q_tiles - uncapped) * (cap if cap != math.inf else 0)
    longest = min(first + q_tiles - 1, cap)
    return total, longest, q_tiles


def flash_prefill(rates: Rates, *, seqs: int, tokens: int, past: int, heads: int, qk_dim: int, v_dim: int,
                  window: int | None, kv_bytes_read: float, exact_flops: float) -> Cost:
    """Causal flash attention for ``seqs`` sequences of ``tokens`` new tokens after ``past`` cached ones.

    ``exact_flops`` (2 heads (qk + v) per query-key pair actually attended) is reported; the time follows the
    tile work of the module docstring.
    """
    if seqs == 0 or tokens == 0:
        return Cost(0.0, 0.0, 0.0, "compute", 0)
    dtype, peak = rates.peak("bf16")
    rate = peak if rates.ideal else peak * rates.attention_efficiency
    if rates.ideal:
        t_compute = exact_flops / rate
    else:
        total, longest, _ = _tiles(tokens, past, window)
        tile_flops = 2.0 * FLASH_TILE * FLASH_TILE * (qk_dim + v_dim)
        per_sm = rate / rates.sm_count
        work = seqs * heads * (total + (FLASH_PROLOGUE_TILES * -(-tokens // FLASH_TILE)))
        t_compute = tile_flops / per_sm * max(work / rates.sm_count, longest + FLASH_PROLOGUE_TILES)
    return _finish(rates, "attention", exact_flops, kv_bytes_read, t_compute, ideal_bytes=kv_bytes_read)


def decode_attention(rates: Rates, seqs: int, kv_heads: int, kv_bytes: float, flops: float,
                     compute_rate_dtype: str = "bf16") -> Cost:
    """One query token per sequence against its cache: streams ``kv_bytes``; ``kv_heads`` per GPU (1 for MLA)."""
    if seqs == 0:
        return Cost(0.0, 0.0, 0.0, "memory", 0)
    _, peak = rates.peak(compute_rate_dtype)
    rate = peak if rates.ideal else peak * rates.attention_efficiency
    t_compute = flops / rate
    streams = seqs * max(kv_heads, 1)
    util = 1.0 if rates.ideal else streams / (streams + DECODE_STREAMS_HALF)
    t_memory = kv_bytes / (rates.bandwidth(kv_bytes) * util) if kv_bytes else 0.0
    work = max(t_compute, t_memory)
    floor = rates.floor("attention")
    bound = "floor" if floor > work else ("compute" if t_compute >= t_memory else "memory")
    return Cost(work + floor, flops, kv_bytes, bound, 1, floor, 0.0, kv_bytes)


@lru_cache(maxsize=8192)
def distinct_experts(experts: int, top_k: int, tokens: float, skew: float = 0.0) -> float:
    """Expected distinct experts ``tokens`` tokens touch, each picking ``top_k`` of ``experts``.

    Uniform routing (skew 0): E (1 - (1 - k/E)^T). With popularity skew s, expert i is picked with probability
    q_i = min(1, k p_i), p_i proportional to i^-s (Zipf), and the count is sum_i 1 - (1 - q_i)^T: hot experts are
    shared, so fewer distinct experts are read than under uniform routing.
    """
    if skew <= 0:
        return experts * (1 - (1 - top_k / experts) ** tokens)
    weights = [(i + 1) ** -skew for i in range(experts)]
    total = sum(weights)
    return sum(1 - (1 - min(1.0, top_k * w / total)) ** tokens for w in weights)


def moe_experts(rates: Rates, *, tokens: float, experts_local: int, experts_total: int, top_k: int, hidden: int,
                expert_width: int, gated: bool, weight_bits: float, compute: str, dequant: str = "",
                act_bytes: float = 2.0, skew: float = 0.0) -> Cost:
    """Fused MoE (route, permute, grouped gate/up GEMM, activation, grouped down GEMM, combine) on one GPU.

    ``tokens`` enter the layer on this GPU; each picks ``top_k`` of ``experts_total`` experts under uniform
    routing, of which ``experts_local`` live here (each sliced to ``expert_width``). Distinct experts touched:
    E_local x (1 - (1 - k/E)^T); every touched expert's weights are read once and its rows are padded to whole
    tiles of MOE_TILE_M.
    """
    if tokens <= 0 or experts_local == 0:
        return Cost(0.0, 0.0, 0.0, "memory", 0)
    share = experts_local / experts_total
    pairs = tokens * top_k * share  # (token, expert) pairs computed here
    distinct = distinct_experts(experts_total, top_k, tokens, skew) * share
    in_width = (2 if gated else 1) * expert_width
    rows_per_expert = pairs / distinct if distinct else 0.0
    padded_rows = distinct * math.ceil(rows_per_expert / MOE_TILE_M - 1e-9) * MOE_TILE_M if distinct else 0.0
    rows = max(padded_rows, pairs)
    w8a8 = compute in ("fp8", "int8", "fp4") and not rates.ideal
    quant_in = act_bytes + weight_bits / 8 if w8a8 else 0.0  # activation quantisation before each GEMM
    # the kernels in sequence: (name, FLOPs, padded FLOPs, weight bytes, activation bytes, K)
    stages = (
        ("up", 2.0 * pairs * hidden * in_width, 2.0 * rows * hidden * in_width, distinct * hidden * in_width,
         pairs * (hidden * (act_bytes + quant_in) + in_width * act_bytes), hidden),
        ("act", 0.0, 0.0, 0.0, pairs * (in_width + expert_width) * act_bytes, 0),
        ("down", 2.0 * pairs * expert_width * hidden, 2.0 * rows * expert_width * hidden,
         distinct * expert_width * hidden, pairs * (expert_width * (act_bytes + quant_in) + hidden * act_bytes),
         expert_width),
        ("combine", 0.0, 0.0, 0.0, (pairs + tokens * share) * hidden * act_bytes, 0),
    )
    if rates.ideal:  # the pure roofline: weights once, each pair's input and output row once, no padding
        weights = distinct * hidden * (in_width + expert_width) * weight_bits / 8
        flops = 2.0 * pairs * hidden * (in_width + expert_width)
        nbytes = weights + 2 * pairs * hidden * act_bytes
        t = max(flops / rates.gemm_flops_per_s(compute, hidden), nbytes / rates.bandwidth(nbytes))
        return Cost(t, flops, nbytes, "compute" if t * rates.gemm_flops_per_s(compute, hidden) <= flops * 1.000001
                    else "memory", 1, 0.0, weights, weights)
    seconds = flops = nbytes = weight_total = 0.0
    by_bound: dict[str, float] = {}
    for _, f, padded, weights, acts, k in stages:
        w_bytes = weights * weight_bits / 8
        b = w_bytes + acts
        grouped = 1.0 if rates.ideal else rates.moe_efficiency
        t_c = padded / (rates.gemm_flops_per_s(compute, k) * grouped) if padded else 0.0
        t_m = b / rates.bandwidth(b) if b else 0.0
        t_d = 0.0
        if dequant and not rates.ideal and weights:
            t_d = weights * DEQUANT_OPS[dequant] / rates.alu_ops_per_s
        t = max(t_c, t_m, t_d)
        bound = "compute" if t == t_c and t_c else ("memory" if t == t_m else "dequant")
        by_bound[bound] = by_bound.get(bound, 0.0) + t
        seconds, flops, nbytes, weight_total = seconds + t, flops + f, nbytes + b, weight_total + w_bytes
    floor = rates.floor("moe")
    bound = "floor" if floor > seconds else max(by_bound, key=by_bound.__getitem__)
    return Cost(seconds + floor, flops, nbytes, bound, 1, floor, weight_total, weight_total)
