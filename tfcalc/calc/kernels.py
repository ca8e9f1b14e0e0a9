"""Time of one GPU kernel from its FLOPs and bytes: the per-operation latency model behind ``tfcalc estimate``.

Every kernel costs

    time = max(FLOPs / achievable FLOP/s(shape, dtype), bytes / achievable bandwidth(size), dequant time) + floor

except that a dense GEMM near its ridge point overlaps its loads and its MMAs imperfectly: its work is
(t_compute^p + t_memory^p)^(1/p) with p = ``GEMM_OVERLAP_P`` (``gemm_work_seconds``), which tends to the larger
one away from the ridge.

- **Achievable FLOP/s** = dense peak x the GPU's large-GEMM efficiency for the compute dtype x K / (K + K0):
  each output tile pays a prologue/epilogue worth about K0 = 128 elements of its K loop, so short-K GEMMs
  (MoE down projections at high tensor parallelism) run far below peak. Measured: bf16 GEMMs with M, N >= 4096
  on an H200 reach 0.50 / 0.63 / 0.70 / 0.75 of peak at K = 256 / 512 / 1024 / >= 2048 (aiconfigurator's
  vLLM 0.24 gemm table), which 0.77 x K / (K + 128) reproduces within 3 %.
  A fused-MoE kernel's grouped GEMMs take its engine's own K0 where the engine's kernel table shows another
  (``Rates.moe_k0``; TensorRT-LLM's CUTLASS and DeepGEMM MoE: 512-4096, presets/engines/trtllm-1.0.yaml), else
  ``MOE_K0``: an fp8 fused MoE pays about one 128-wide K block per tile, not the 512 of a dense scaled-mm (fitted
  on the block-fp8 kernels, Triton and FlashInfer TRT-LLM, that fp8 MoE checkpoints run).
- **Achievable bandwidth** = datasheet HBM x the GPU's streaming efficiency, or a measured curve by size from a
  calibration file.
- **Dequantisation** (weight-only int8/int4/fp4 GEMMs in 16-bit activations): every weight element is unpacked and
  scaled on the CUDA cores; at ``DEQUANT_OPS`` instructions per element the ALUs, not HBM, bound the kernel
  (gpt-fast int8 decode reaches 52 % of A100 HBM against 69 % in bf16; vLLM's MXFP4 MoE on an H200 streams
  4.7e12 weights/s, 7 instructions each at the fp32 rate).
- **Floor**: the fixed cost of a kernel (launch, ramp-up, tail) per kernel class, measured on the GPU (preset) or
  by ``tfcalc bench calibrate``; without CUDA graphs the host launches a kernel every ``launch_s``, so a kernel
  lasts max(work + floor, launch_s) on the timeline (``Rates.fixed``: a long kernel hides the next launch).
- **Flash attention** (prefill): query tiles of 128 rows against key tiles of 128 (FlashAttention-2, arXiv
  2307.08691, sec. 3); causal diagonal tiles are computed whole and each query tile pays a prologue of about
  two key tiles; the kernel takes max(total tile work / SMs, longest query tile) -- with fewer query tiles than
  SMs the longest one sets the time.
- **Decode attention** streams the KV cache; split-KV kernels need enough (sequence, KV head) streams in flight
  to reach full bandwidth: with u streams they reach u / (u + u_half) of it (u_half = 2.8 fits FlashAttention-3
  decode on an H200 within 10 % from 1 to 256 streams, aiconfigurator vLLM 0.24 table). Where the GPU preset
  measured its decode kernel (``latency.decode_attention``) it streams at that kernel's own fraction of the
  datasheet (0.92-0.96: FA3 and FlashInfer read the cache faster than a GEMV; 0.77 / 0.81: FlashAttention-2 on the
  A100 / L40S, fitted on GQA rows), with its own u_half, and pays a fixed time per stream (CTA setup, query and
  output: 4-17 ns); fitted on caches too large for L2 (benchmarks/validation/decode_attention_fit.py).

``ideal=True`` rates turn every efficiency to 1 and every floor to 0: the pure roofline.
Pure math: no I/O.
"""

from __future__ import annotations

import cmath
import math
import random
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from tfcalc.errors import UsageError
from tfcalc.units import parse_float

if TYPE_CHECKING:
    from tfcalc.calc.comm import LinkFit
    from tfcalc.spec.engine import LinearHostSteps

# Elements of K loop one output tile's prologue/epilogue costs, per compute dtype (module docstring): fit of
# eff x K / (K + K0) to GEMMs with M, N >= 4096 swept over K on an H200 (aiconfigurator vLLM 0.24 gemm table):
# bf16 0.50 / 0.70 / 0.75 at K = 256 / 1024 / 8192; fp8 (CUTLASS scaled-mm with per-token scales in the epilogue)
# 0.27 / 0.42 / 0.62 at K = 512 / 1024 / 8192.
GEMM_K0 = {"bf16": 128, "fp16": 128, "fp32": 128, "fp8": 512, "int8": 512, "fp4": 512}
# The same for a fused MoE's grouped GEMMs where the engine names none (else GEMM_K0): fp8 128, the K0 whose fit
# scatters least over aiconfigurator 0.12's block-fp8 MoE tables (moe_kernel_rates.py --k0 64,128,256,512; sd of
# log tfcalc / measured at 128 vs 512: vLLM 0.176 / 0.190 H100 SXM, 0.189 / 0.191 H200, 0.232 / 0.274 B200;
# SGLang 0.115 / 0.170, 0.099 / 0.145, 0.165 / 0.220); at 512 tfcalc / measured fell from 1.1-1.5 at expert width
# 128 to 0.7-0.9 at 8192+ (--by-width): block-fp8 kernels step K in 128-wide scale blocks.
MOE_K0 = {"fp8": 128}
# A dense GEMM's compute and memory times combine as a p-norm (module docstring). Fit over aiconfigurator 0.12's
# vLLM 0.24 and TensorRT-LLM 1.3.0rc20 gemm tables (H100 SXM, H200, B200, L40S; bf16 and per-tensor fp8; N, K >=
# 2048): with the max (p -> infinity) the median of predicted / measured time is 0.82 at M = 256-511 and 0.90-0.91
# at 65-255 and 512-1023; p = 2.5 gives 0.96-1.01 in every M band. SGLang 0.5.14's bf16 table, not in the fit:
# 0.84 -> 1.01 at M = 256-511 (benchmarks/validation/gemm_rates_fit.py --overlap).
GEMM_OVERLAP_P = 2.5
_INVERSE_OVERLAP_P = 1.0 / GEMM_OVERLAP_P
FLASH_TILE = 128  # rows per query tile and keys per key tile (FlashAttention-2/3 on Hopper)
FLASH_PROLOGUE_TILES = 2  # key tiles' worth of work each query tile pays up front
MOE_TILE_MIN, MOE_TILE_MAX = 16, 128  # rows of a grouped-GEMM tile (moe_tile_rows)
MOE_OWN_STREAM_ROWS = 8  # mean rows per expert up to which a fused MoE streams its weights as one tile each
# Rows a block-scale GEMM's per-token scales come in without a copy: DeepGEMM aligns the scale tensor's M to 16 bytes
# of 4-byte scales (get_tma_aligned_size; SM100 packs four UE8M0 scales per int32), so other row counts re-lay it out
SCALE_ALIGNED_ROWS = 4
DECODE_STREAMS_HALF = 2.8  # u_half of decode attention (module docstring)
_FOURIER_LOG_EPS = 30.0  # binomial_tiles drops Fourier terms below exp(-30) ~ 1e-13
_PMF_CUTOFF = 1e-16  # binomial_tiles sums the pmf where it is above this fraction of its peak
_FOURIER_COST = 4.0  # one Fourier term (complex power) costs about four pmf steps (measured, CPython 3.11)
# Draws of aiconfigurator's power-law loads _power_law_busiest_rank averages over: the same uniforms at every T, so
# the mean is smooth in T; within 2 % of 4,000 draws at E 8-256, k 2-8, 2-16 ranks, T 64-16,384
# (docs/estimate-validation.md, twenty-fourth round)
POWER_LAW_DRAWS = 128

# CUDA-core instructions per weight element to dequantise in a weight-only GEMM (unpack, convert, scale), per
# storage format. gpt-fast README (A100-80GB at 330 W, batch 1, the 70B model where kernel floors matter least):
# Llama-2-70B int8 19.13 tok/s = 1.32e12 weights/s against the A100's 9.75e12 fp32 FMA/s -> 7.4; int4-g32
# 25.25 tok/s = 1.74e12 weights/s -> 5.6; vLLM's MXFP4 MoE on an H200 (aiconfigurator vLLM 0.24 moe table, all 128
# experts streamed at >= 256 tokens): 4.7e12 weights/s at 33.5e12 FMA/s -> 7.1. fp8 weight-only (Marlin on
# Ampere) is taken as int8.
DEQUANT_OPS = {"int8": 7.4, "fp8": 7.4, "int4": 5.6, "fp4": 7.1}

KERNEL_CLASSES = ("gemm", "elementwise", "attention", "moe", "gdn_prefill", "gdn_decode")
# a class without a floor of its own takes this one's (else the GEMM's): Gated DeltaNet's chunked prefill is an
# attention-like kernel, its one-token recurrence an elementwise one
FLOOR_FALLBACK = {"gdn_prefill": "attention", "gdn_decode": "elementwise"}


@dataclass(frozen=True, kw_only=True)
class Rates:
    """What one GPU achieves, as the latency model uses it (SI units: FLOP/s, bytes/s, seconds)."""

    name: str
    peak_flops: dict[str, float] = field(hash=False)  # dense peak per compute dtype the kernels are built for
    datasheet_peak_flops: dict[str, float] = field(default_factory=dict, hash=False)  # where it differs: the ideal's
    gemm_efficiency: dict[str, float] = field(hash=False)  # large-GEMM fraction of peak per compute dtype
    attention_efficiency: float  # flash-attention prefill fraction of the 16-bit peak on long sequences
    moe_efficiency: float  # grouped expert GEMMs relative to a dense GEMM of the same shape (16-bit)
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
    moe_efficiency_by_dtype: dict[str, float] = field(default_factory=dict, hash=False)  # per compute dtype
    moe_expert_floors: dict[str, float] = field(default_factory=dict, hash=False)  # s per local expert, by dtype
    moe_dequant_ops: dict[str, float] = field(default_factory=dict, hash=False)  # replaces DEQUANT_OPS in MoE
    moe_k0: dict[str, float] = field(default_factory=dict, hash=False)  # replaces GEMM_K0 in native MoE, by dtype
    moe_dequant_per_tile: frozenset[str] = frozenset()  # weight-only MoE formats unpacked again in every row tile
    moe_fused_rows: frozenset[str] = frozenset()  # fp8 MoE formats passing 8-bit rows, activation fused (NVFP4's way)
    moe_format_floors: dict[str, float] = field(default_factory=dict, hash=False)  # s, replaces the moe floor by format
    moe_ep_floors: dict[str, float] = field(default_factory=dict, hash=False)  # s it adds under ep, by format
    # s each touched expert adds, by format; such a format streams at the GPU's fused-MoE stream (moe_touched_stream)
    moe_touched_expert: dict[str, float] = field(default_factory=dict, hash=False)
    # bytes per routed row and hidden element a fused MoE moves beyond the staged rows, by format (its own permute,
    # quantize and finalize kernels: TensorRT-LLM's CUTLASS NVFP4 flow)
    moe_row_bytes: dict[str, float] = field(default_factory=dict, hash=False)
    # the fraction of the dense bf16 peak the engine's chunked Gated DeltaNet prefill reaches on the FLOPs tfcalc
    # counts (its kernel, not a GEMM: FlashInfer's on vLLM, flash-linear-attention's Triton chain on SGLang and
    # TensorRT-LLM); 0: priced at the GEMM rate
    gdn_efficiency: float = 0.0
    # bits per weight a fused MoE streams, by the experts' storage format, where the engine upcast them at load (no
    # unpacking in the kernel): SGLang's Triton fallback for MXFP4 experts on Hopper runs them as bf16
    moe_stream_bits: dict[str, float] = field(default_factory=dict, hash=False)
    # the fused MoE's weight stream as a fraction of the datasheet bandwidth once the tokens outnumber the local
    # experts, by storage format, where the kernel switches to a slower tile configuration there (SGLang's default
    # Triton config: 16-row tiles up to M = E, 64-row tiles with GROUP_SIZE_M 8 above)
    moe_large_m_memory: dict[str, float] = field(default_factory=dict, hash=False)
    # by storage format, the (local experts, per-rank expert width) shapes the engine's fused MoE has a tuned kernel
    # configuration for (SGLang's and vLLM's Triton config files); other shapes run its default configuration at
    # moe_untuned_efficiency, streaming at moe_untuned_large_m_memory once the tokens outnumber the local experts
    moe_tuned_shapes: dict[str, frozenset[tuple[int, int]]] = field(default_factory=dict, hash=False)
    moe_untuned_efficiency: dict[str, float] = field(default_factory=dict, hash=False)
    moe_untuned_large_m_memory: dict[str, float] = field(default_factory=dict, hash=False)
    moe_untuned_k0: float = 0.0  # the default tiles' grouped-GEMM K0 (0: the tuned kernel's)
    # by storage format, (bytes, slowdown) where the engine's fused MoE slows down once one expert's per-rank gate/up
    # matrix is larger than bytes: its grouped GEMMs take 1 + slowdown x (1 - bytes / matrix bytes) times as long
    moe_large_expert: dict[str, tuple[float, float]] = field(default_factory=dict, hash=False)
    # the fused MoE's expert-weight stream as a fraction of the datasheet bandwidth, by storage format, where it
    # differs from memory_efficiency (the GPU preset's GEMV figure)
    moe_memory_efficiency: dict[str, float] = field(default_factory=dict, hash=False)
    # by storage format, where the fused MoE's expert weights stream at that fraction of the datasheet bandwidth
    # whatever the tokens (a kernel held at heuristic tactics: SGLang's FlashInfer CUTLASS MoE on Hopper); replaces
    # moe_memory_efficiency and moe_large_m_memory for the format
    moe_weight_stream: dict[str, float] = field(default_factory=dict, hash=False)
    # by storage format ("*": every format), where under expert parallelism with every token on every rank (no
    # all-to-all) the fused MoE runs its activation and combine over all T k rows and writes zeros for the rows of
    # other ranks' experts (Triton fused_moe's write_zeros_to_output), not over this rank's rows alone
    moe_ep_every_row: frozenset[str] = frozenset()
    # formats whose linear layers run outside CUDA graphs: their host seconds per call, (max tokens | None, s) steps
    linear_host: dict[str, LinearHostSteps] = field(default_factory=dict, hash=False)
    # decode attention over an fp8 cache: (fixed seconds, scale): fixed + the bf16 kernel's time over the same
    # tokens with its KV streaming time x scale (engine, GPU); None: the fp8 cache streams at the bf16 kernel's rate
    fp8_kv_attention: tuple[float, float] | None = None
    # the decode attention kernel measured on this GPU (GPU preset's latency.decode_attention): its fraction of the
    # datasheet bandwidth (0: the streaming rate, ``bandwidth``), u_half and fixed seconds per (sequence, KV head)
    decode_attention_memory: float = 0.0
    decode_streams_half: float = DECODE_STREAMS_HALF
    decode_stream_s: float = 0.0
    # bytes/s one CTA streams where that kernel runs an MHA decode with one CTA per (sequence, head), unsplit
    # (FlashAttention-2); 0: it splits the KV sequence whatever the heads
    decode_unsplit_cta_bandwidth: float = 0.0
    # prefill attention over an fp8 cache: scale x its time over a bf16 cache (engine, GPU); None: the same time
    fp8_kv_prefill_scale: float | None = None
    # a model with heads wider than FlashAttention's 256 (Gemma 4): every prefill attention on the engine's fallback
    # kernel, this times a flash attention over the whole causal triangle (EngineKernels)
    wide_head_prefill_scale: float | None = None
    dsa_prefill_head_tile: int = 0  # a DSA model's sparse MLA prefill pads each GPU's query heads up to it
    dsa_block_floors: dict[str, float] = field(default_factory=dict, hash=False)  # s per layer: decode, prefill
    dsa_prefill_efficiency: float = 0.0  # the sparse MLA prefill's fraction of the bf16 peak (0: attention's)
    dsa_prefill_full_topk: bool = False  # it runs every query's top-k slots, valid or not
    v4_prefill_efficiency: float = 0.0  # DeepSeek-V4's sparse prefill attention, of the bf16 peak (0: attention's)
    # MiniMax-M3's MSA run as per-query FP32 copies of every key (TensorRT-LLM's Triton path off SM100): the fraction
    # of the datasheet bandwidth those copies move at, by phase (prefill, decode); empty: the engine runs no such path
    msa_fp32_expansion: dict[str, float] = field(default_factory=dict, hash=False)
    # small-M GEMMs' weight streaming as a fraction of the datasheet bandwidth, by the weights' storage format, where
    # its kernels differ from memory_efficiency (fp8 scaled-mm streams slower than a bf16 GEMV)
    gemm_memory_efficiency: dict[str, float] = field(default_factory=dict, hash=False)
    # large GEMMs' fraction of the compute dtype's peak, by the weights' storage format, where the engine's kernel for
    # that format differs from the GPU preset's (TensorRT-LLM's fp8 GEMMs); replaces gemm_efficiency for it
    gemm_efficiency_by_format: dict[str, float] = field(default_factory=dict, hash=False)
    # fixed seconds of one dynamic activation scale (a max reduction before a per-tensor fp8 GEMM) where the engine
    # measured it on this GPU; None: an elementwise kernel's floor
    dynamic_scale_s: float | None = None
    # derived once (the model prices millions of kernels): resolved floors and streaming bandwidth
    _floor: dict[str, float] = field(init=False, repr=False, compare=False, hash=False)
    _stream: float = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        floors = {kind: self._resolved(value) for kind, value in self.floors.items()}
        object.__setattr__(self, "_floor", floors)
        stream = self.memory_bandwidth if self.ideal else (0.0 if self.bandwidth_points else
                                                           self.memory_bandwidth * self.memory_efficiency)
        object.__setattr__(self, "_stream", stream)

    def peak(self, compute: str) -> tuple[str, float]:
        """(dtype used, dense FLOP/s); a dtype the chip lacks falls back to bf16, then fp16. The ideal roofline
        takes the datasheet's peak where the kernels' differs (``datasheet_peak_flops``)."""
        peaks = self.datasheet_peak_flops if self.ideal and self.datasheet_peak_flops else self.peak_flops
        for key in (compute, "bf16", "fp16"):
            if key in peaks:
                return key, peaks[key]
        raise ValueError(f"{self.name}: no dense throughput for {compute}")

    def gemm_flops_per_s(self, compute: str, k: float, grouped: bool = False, weight_format: str = "",
                         k0: float = 0.0) -> float:
        """Peak x large-GEMM efficiency x K / (K + K0) (module docstring); the peak alone when ideal. A dense GEMM
        of ``weight_format`` weights takes the engine's efficiency for that format where it has one
        (``gemm_efficiency_by_format``). ``grouped``: a fused-MoE GEMM, whose K0 is the engine's own where it
        measured one (``moe_k0``: for the weights' storage format, else for the compute dtype; else ``MOE_K0``), at
        the dense efficiency of its compute dtype (the engines' MoE rates are relative to it). ``k0``: a K0 the
        caller knows (a kernel's default tiles), over all of those."""
        dtype, peak = self.peak(compute)
        if self.ideal:
            return peak
        eff = ((not grouped and self.gemm_efficiency_by_format.get(weight_format))
               or self.gemm_efficiency.get(dtype, self.gemm_efficiency.get("bf16", 0.7)))
        k0 = (k0 or (grouped and (self.moe_k0.get(weight_format) or self.moe_k0.get(dtype) or MOE_K0.get(dtype)))
              or GEMM_K0.get(dtype, 128))
        return peak * eff * k / (k + k0)

    def grouped_efficiency(self, compute: str, dequant: str = "", weight_format: str = "") -> float:
        """Grouped expert GEMMs relative to a dense GEMM of the same shape and compute dtype (1 when ideal). A
        weight-only kernel is a kernel of its own: it looks up its format's entry where the chip has no tensor
        cores for it (MXFP4 experts on Hopper: 'fp4'), else the GPU preset's 16-bit value -- never a native
        kernel's entry (fp8 forced to bf16 compute on Hopper, or an engine's bf16 kernel). A native kernel takes
        the entry of its weights' storage format where there is one (an engine's block-scale and per-tensor fp8
        fused MoE differ: ``fp8_block``, ``fp8_e4m3``), else its compute dtype's."""
        if self.ideal:
            return 1.0
        by_dtype = self.moe_efficiency_by_dtype
        if dequant:  # its storage format's entry, else its kind's where the chip cannot run it natively
            own = by_dtype.get(weight_format) or (by_dtype.get(dequant) if dequant not in self.peak_flops else None)
            return own or self.moe_efficiency
        return by_dtype.get(weight_format) or by_dtype.get(self.peak(compute)[0], self.moe_efficiency)

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

    def _resolved(self, floor_s: float) -> float:
        """A kernel's fixed seconds as this run pays them: none when ideal."""
        return 0.0 if self.ideal else floor_s

    def fixed(self, floor_s: float, work_s: float, kernels: int = 1) -> float:
        """The fixed seconds ``kernels`` kernels add to ``work_s``: their floors; without CUDA graphs the host
        launches one kernel per ``launch_s``, so each lasts at least that long on the timeline and a longer one
        hides the next launch: max(floors, kernels x launch_s - work)."""
        if self.ideal or self.cuda_graphs:
            return floor_s
        return max(floor_s, kernels * self.launch_s - work_s)

    def floor(self, kind: str, weight_format: str = "") -> float:
        """Fixed seconds of one kernel of ``kind`` (the host launch of an uncaptured one: ``fixed``). A fused MoE
        of a storage format the engine measured apart (``moe_format_floors``) takes that format's floor."""
        own = self.moe_format_floors.get(weight_format) if kind == "moe" and weight_format else None
        if own is not None:
            return self._resolved(own)
        floor = self._floor.get(kind)
        if floor is None:
            floor = self._floor.get(FLOOR_FALLBACK.get(kind, "gemm"))
        if floor is None:
            floor = self._floor.get("gemm", 0.0)
        return floor

    def dynamic_scale_floor(self) -> float:
        """Fixed seconds of one dynamic activation scale: the engine's measured time, else an elementwise floor."""
        return self.floor("elementwise") if self.dynamic_scale_s is None else self._resolved(self.dynamic_scale_s)

    def linear_host_s(self, weight_format: str, tokens: float) -> float:
        """Host seconds of one call of a ``weight_format`` linear layer over ``tokens`` rows where that format runs
        outside the CUDA graphs (``linear_host``), else 0: the call lasts at least this long. A step's aligned time
        applies where the tokens are a multiple of ``SCALE_ALIGNED_ROWS`` (no scale tensor to re-lay out)."""
        steps = self.linear_host.get(weight_format) if not self.ideal else None
        if not steps:
            return 0.0
        step = next((s for s in steps[:-1] if s[0] is not None and tokens <= s[0]), steps[-1])  # the last is open
        aligned = step[2] is not None and float(tokens).is_integer() and int(tokens) % SCALE_ALIGNED_ROWS == 0
        return step[2] if aligned else step[1]

    def as_ideal(self) -> Rates:
        return replace(self, ideal=True)

    def with_efficiency(self, compute: float | None = None, memory: float | None = None) -> Rates:
        """The same GPU with every compute efficiency (GEMM, attention) and/or the memory efficiency replaced."""
        changes: dict[str, object] = {}
        if compute is not None:
            changes.update(gemm_efficiency={k: compute for k in self.gemm_efficiency}, attention_efficiency=compute,
                           gemm_efficiency_by_format={})
        if memory is not None:
            changes.update(memory_efficiency=memory, bandwidth_points=(), gemm_memory_efficiency={},
                           decode_attention_memory=0.0,
                           moe_large_m_memory={}, moe_untuned_large_m_memory={}, moe_memory_efficiency={},
                           moe_weight_stream={})
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


def gemm_work_seconds(t_compute: float, t_memory: float, ideal: bool = False) -> float:
    """A dense GEMM's time without its floor: (t_compute^p + t_memory^p)^(1/p), p = ``GEMM_OVERLAP_P``; the
    larger of the two when ``ideal`` (the pure roofline) or when either is zero."""
    if ideal or not t_compute or not t_memory:
        return t_compute if t_compute > t_memory else t_memory
    return (t_compute ** GEMM_OVERLAP_P + t_memory ** GEMM_OVERLAP_P) ** _INVERSE_OVERLAP_P


def gemm_compute_seconds(work: float, t_memory: float, ideal: bool = False) -> float:
    """The inverse of ``gemm_work_seconds``: the compute time that, with ``t_memory``, takes ``work`` seconds
    (0 when the memory time alone takes that long)."""
    if work <= t_memory:
        return 0.0
    if ideal or not t_memory:
        return work
    return (work ** GEMM_OVERLAP_P - t_memory ** GEMM_OVERLAP_P) ** _INVERSE_OVERLAP_P


def _finish(rates: Rates, kind: str, flops: float, nbytes: float, t_compute: float, t_dequant: float = 0.0,
            kernels: int = 1, weight_bytes: float = 0.0, ideal_bytes: float = 0.0, stream: float = 0.0) -> Cost:
    stream = stream or rates._stream
    t_memory = (nbytes / (stream or rates.bandwidth(nbytes))) if nbytes else 0.0
    work = gemm_work_seconds(t_compute, t_memory, ideal=rates.ideal or kind != "gemm")   # other kernels: the max
    bound = "compute" if t_compute >= t_memory else "memory"
    if t_dequant > work:
        work, bound = t_dequant, "dequant"
    floor = rates._floor.get(kind)
    floor = rates.fixed(kernels * (rates.floor(kind) if floor is None else floor), work, kernels)
    if floor > work:
        bound = "floor"
    return Cost(work + floor, flops, nbytes, bound, kernels, floor, weight_bytes, ideal_bytes)


def gemm(rates: Rates, m: float, n: float, k: float, weight_bits: float, compute: str, act_bytes: float = 2.0,
         out_bytes: float = 2.0, dequant: str = "", weight_format: str = "") -> Cost:
    """[m x k] @ [k x n]: 2mnk FLOPs; weights n k x bits/8 + activations m k + output m n bytes.

    ``dequant`` (a DEQUANT_OPS format) marks a weight-only kernel: 16-bit tensor cores plus dequantisation.
    ``weight_format`` (the storage format's name) streams at its own fraction of the bandwidth where the rates
    have one (``gemm_memory_efficiency``; not when ideal or when a calibrated bandwidth curve replaces them) and,
    in a native kernel, computes at its own fraction of the peak (``gemm_efficiency_by_format``).
    """
    flops = 2.0 * m * n * k
    weights = n * k * weight_bits / 8
    nbytes = weights + m * k * act_bytes + m * n * out_bytes
    t_compute = flops / rates.gemm_flops_per_s(compute, k, weight_format="" if dequant else weight_format) \
        if flops else 0.0
    t_dequant = 0.0
    if dequant and not rates.ideal:
        t_dequant = n * k * DEQUANT_OPS[dequant] / rates.alu_ops_per_s
    own = rates.gemm_memory_efficiency.get(weight_format) if weight_format and rates._stream else None
    stream = rates.memory_bandwidth * own if own and not rates.ideal else 0.0
    return _finish(rates, "gemm", flops, nbytes, t_compute, t_dequant, weight_bytes=weights, ideal_bytes=weights,
                   stream=stream)


def dynamic_scale(rates: Rates, m: float, k: float, act_bytes: float = 2.0) -> Cost:
    """The dynamic scale of a per-tensor fp8 GEMM's [m x k] input: a max reduction reads it once more (m k x
    act_bytes bytes) and lasts at least the engine's measured fixed time (``dynamic_scale_s``), else an
    elementwise kernel's floor. Not compulsory traffic: the pure roofline does not count it."""
    nbytes = m * k * act_bytes
    work = nbytes / (rates._stream or rates.bandwidth(nbytes))
    floor = rates.fixed(rates.dynamic_scale_floor(), work)
    return Cost(work + floor, 0.0, nbytes, "floor" if floor > work else "memory", 1, floor)


def elementwise(rates: Rates, nbytes: float, flops: float = 0.0, kernels: int = 1, ideal_bytes: float = 0.0) -> Cost:
    """A memory-bound kernel (norm, activation, rotary, cache write, quantisation) moving ``nbytes``; of them
    ``ideal_bytes`` are compulsory traffic (hidden states, KV written, logits) the pure roofline counts."""
    return _finish(rates, "elementwise", flops, nbytes, 0.0, kernels=kernels, ideal_bytes=ideal_bytes)


GDN_CHUNK = 64  # the chunk length of flash-linear-attention's chunk_gated_delta_rule (and FlashInfer's)


def gated_delta_rule(rates: Rates, *, seqs: float, tokens: float, heads: int, key_dim: int, value_dim: int,
                     state_bytes: float, io_bytes: float, decode: bool) -> Cost:
    """Gated DeltaNet's recurrence over ``heads`` value heads (arXiv:2412.06464) as engines run it (FlashInfer's
    kernels on vLLM 0.24, flash-linear-attention's on SGLang and TensorRT-LLM). Decode (fused recurrent, one token
    per sequence): 7 dk dv FLOPs per head and token
    (decay, read, delta, write, output), memory-bound on each sequence's state read and written (2 x
    ``state_bytes``). Prefill (chunk_gated_delta_rule over chunks of C = ``GDN_CHUNK``): per token and head
    6 dk dv (inter-chunk state reads and update) + 4 C (dk + dv) (intra-chunk scores, UT transform and values)
    FLOPs on 16-bit tensor cores, at the engine's measured fraction of the peak (``Rates.gdn_efficiency``: its
    kernel's own throughput, intermediates such as per-chunk states included) where it has one, else at the GEMM
    rate; the sequence's state read and written once. ``io_bytes``: q, k, v, gates read and the output written.
    Floors: the ``gdn_prefill`` and ``gdn_decode`` classes (an engine's measured fixed cost at a few tokens)."""
    dkdv = key_dim * value_dim
    if decode:
        flops = 7.0 * dkdv * heads * tokens
        nbytes = 2 * seqs * state_bytes + io_bytes
        return _finish(rates, "gdn_decode", flops, nbytes, 0.0, ideal_bytes=2 * seqs * state_bytes)
    flops = (6.0 * dkdv + 4.0 * GDN_CHUNK * (key_dim + value_dim)) * heads * tokens
    nbytes = 2 * seqs * state_bytes + io_bytes
    if rates.gdn_efficiency and not rates.ideal:
        t_compute = flops / (rates.peak("bf16")[1] * rates.gdn_efficiency)
    else:
        t_compute = flops / rates.gemm_flops_per_s("bf16", key_dim)
    return _finish(rates, "gdn_prefill", flops, nbytes, t_compute, ideal_bytes=2 * seqs * state_bytes)


def mamba2_scan(rates: Rates, *, seqs: float, tokens: float, heads: int, groups: int, state_dim: int, head_dim: int,
                chunk: int, state_bytes: float, io_bytes: float, decode: bool) -> Cost:
    """Mamba-2's selective state-space scan over ``heads`` heads (SSD, Dao & Gu 2024, arXiv:2405.21060 sec. 6; vLLM's
    mamba_chunk_scan_combined / selective_state_update). Decode: per head and token 4 d_state head_dim FLOPs (the
    state's decay and write, the output read from it), memory-bound on each sequence's state read and written.
    Prefill over chunks of Q = ``chunk``: per token 2 Q d_state per B/C group (C B^T inside the chunk, shared by the
    group's heads) and per head 2 Q head_dim (its product with x) + 4 d_state head_dim (the chunk states and the output
    from them), on 16-bit tensor cores at the GEMM rate (Gated DeltaNet's measured kernel fraction where the engine
    has one: ``Rates.gdn_efficiency``). Floors: the ``gdn_prefill`` / ``gdn_decode`` classes (the same chunked-scan
    and recurrent-update kernel shapes)."""
    nd = state_dim * head_dim
    nbytes = 2 * seqs * state_bytes + io_bytes
    if decode:
        return _finish(rates, "gdn_decode", 4.0 * nd * heads * tokens, nbytes, 0.0, ideal_bytes=2 * seqs * state_bytes)
    flops = (2.0 * chunk * state_dim * groups + (2.0 * chunk * head_dim + 4.0 * nd) * heads) * tokens
    if rates.gdn_efficiency and not rates.ideal:
        t_compute = flops / (rates.peak("bf16")[1] * rates.gdn_efficiency)
    else:
        t_compute = flops / rates.gemm_flops_per_s("bf16", state_dim)
    return _finish(rates, "gdn_prefill", flops, nbytes, t_compute, ideal_bytes=2 * seqs * state_bytes)


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


def _chunked_tiles(tokens: int, past: int, chunk: int) -> tuple[float, float, int]:
    """``_tiles`` for chunked local attention, as vLLM runs it (make_local_attention_virtual_batches): each chunk's
    queries a causal attention of their own over that chunk's keys."""
    first = min(tokens, chunk - past % chunk)  # the rest of the chunk the new tokens start in
    whole, last = divmod(tokens - first, chunk)
    pieces = ((first, past % chunk, 1), (chunk, 0, whole), (last, 0, 1))
    total = longest = 0.0
    q_tiles = 0
    for n, p, count in pieces:
        if n and count:
            t, lo, q = _tiles(n, p, None)
            total, longest, q_tiles = total + count * t, max(longest, lo), q_tiles + count * q
    return total, longest, q_tiles


def flash_prefill(rates: Rates, *, seqs: int, tokens: int, past: int, heads: int, qk_dim: int, v_dim: int,
                  window: int | None, kv_bytes_read: float, exact_flops: float, fp8_cache: bool = False,
                  chunked: bool = False, wide_heads: bool = False, efficiency: float = 0.0) -> Cost:
    """Causal flash attention for ``seqs`` sequences of ``tokens`` new tokens after ``past`` cached ones.

    ``exact_flops`` (2 heads (qk + v) per query-key pair actually attended) is reported; the time follows the
    tile work of the module docstring, times ``rates.fp8_kv_prefill_scale`` over an fp8 cache (``fp8_cache``)
    where the engine measured its kernel so. ``chunked``: ``window`` is Llama 4's attention chunk. ``wide_heads``:
    the model's heads exceed FlashAttention's 256, and an engine with ``rates.wide_head_prefill_scale`` runs its
    fallback kernel: that times the whole causal triangle's tiles, a window skipping none. ``efficiency``: the
    kernel's own fraction of the peak where it is not flash attention's (DSA's sparse MLA), else 0.
    """
    wide = wide_heads and rates.wide_head_prefill_scale is not None and not rates.ideal
    if wide:
        window, chunked = None, False
    if seqs == 0 or tokens == 0:
        return Cost(0.0, 0.0, 0.0, "compute", 0)
    dtype, peak = rates.peak("bf16")
    rate = peak if rates.ideal else peak * (efficiency or rates.attention_efficiency)
    if rates.ideal:
        t_compute = exact_flops / rate
    else:
        total, longest, _ = (_chunked_tiles(tokens, past, window) if chunked and window
                             else _tiles(tokens, past, window))
        tile_flops = 2.0 * FLASH_TILE * FLASH_TILE * (qk_dim + v_dim)
        per_sm = rate / rates.sm_count
        work = seqs * heads * (total + (FLASH_PROLOGUE_TILES * -(-tokens // FLASH_TILE)))
        t_compute = tile_flops / per_sm * max(work / rates.sm_count, longest + FLASH_PROLOGUE_TILES)
        if fp8_cache and rates.fp8_kv_prefill_scale is not None:
            t_compute *= rates.fp8_kv_prefill_scale
        if wide and rates.wide_head_prefill_scale is not None:
            t_compute *= rates.wide_head_prefill_scale
    return _finish(rates, "attention", exact_flops, kv_bytes_read, t_compute, ideal_bytes=kv_bytes_read)


def indexer_logits(rates: Rates, *, pairs: float, heads: int, head_dim: int, keys_bytes: float) -> Cost:
    """DSA's lightning indexer over ``pairs`` query-key pairs: an fp8 ReLU dot product of ``heads`` x ``head_dim``
    per pair (2 heads head_dim FLOPs; DeepGEMM fp8_mqa_logits / fp8_paged_mqa_logits), its fp32 logit written and
    read again by the top-k selection (8 B per pair), the cached keys (``keys_bytes``) read once."""
    flops = 2.0 * heads * head_dim * pairs
    _, peak = rates.peak("fp8")
    t_compute = flops / (peak if rates.ideal else peak * rates.attention_efficiency)
    return _finish(rates, "attention", flops, keys_bytes + (0.0 if rates.ideal else 8.0 * pairs), t_compute,
                   ideal_bytes=keys_bytes)


def sparse_attention(rates: Rates, *, flops: float, nbytes: float, efficiency: float = 0.0,
                     ideal_bytes: float = 0.0) -> Cost:
    """An attention over gathered keys (FlashMLA's sparse prefill for DeepSeek-V4: each query its own index list):
    ``flops`` at ``efficiency`` of the bf16 peak (0: ``attention_efficiency``), ``nbytes`` streamed, whichever is
    longer."""
    _, peak = rates.peak("bf16")
    t_compute = flops / (peak if rates.ideal else peak * (efficiency or rates.attention_efficiency))
    return _finish(rates, "attention", flops, nbytes, t_compute, ideal_bytes=ideal_bytes)


# TensorRT-LLM's per-chunk budget for the FP32 copies of its Triton MSA path (sparse/minimax_m3/triton_backend.py
# _DEFAULT_SPARSE_CHUNK_BUDGET_BYTES, 512 MiB): the queries of one chunk share one conversion of the batch's keys
MSA_CHUNK_BUDGET_BYTES = 512 * 1024 * 1024


def msa_fp32_expansion_bytes(*, seqs: int, queries: int, keys: int, kv_heads: int, q_heads: int, head_dim: int,
                             index_heads: int, index_dim: int) -> float:
    """Bytes TensorRT-LLM's Triton MiniMax-M3 sparse attention moves on one GPU for one layer and step
    (sparse/minimax_m3/triton_backend.py: _gather_paged_batched, _index_attention_and_select, _sparse_gqa_masked).
    ``queries`` rows (all sequences' tokens of the step) each attend a padded ``keys`` (the longest sequence's
    length), the selected blocks kept by a mask over all of them. Per (query, key) pair: K and V copied to FP32 for
    the query (index_select written 8 Hkv d, its source read 8 Hkv d, the einsum reading it 8 Hkv d: 24 Hkv d), the
    scores of its q_heads (written, masked, softmaxed, read: 24 q_heads), the index key copied likewise (12 d_i) and
    the index scores (16 index_heads). Per chunk of ``floor(512 MiB / (8 keys Hkv (d + g)))`` queries (index:
    ``/ (4 keys (d_i + index_heads))``) the whole batch's padded K, V (12 Hkv d per sequence and key: bf16 read, FP32
    written) and index keys (6 d_i) are converted again; once per step the paged caches are gathered (8 Hkv d + 4 d_i
    per sequence and key)."""
    pairs = float(queries) * keys
    group = q_heads // kv_heads
    per_pair = 24 * kv_heads * head_dim + 24 * q_heads + 12 * index_dim + 16 * index_heads
    chunk_gqa = max(1, MSA_CHUNK_BUDGET_BYTES // (8 * keys * kv_heads * (head_dim + group)))
    chunk_index = max(1, MSA_CHUNK_BUDGET_BYTES // (4 * keys * (index_dim + index_heads)))
    held = float(seqs) * keys
    return (pairs * per_pair + math.ceil(queries / chunk_gqa) * held * 12 * kv_heads * head_dim
            + math.ceil(queries / chunk_index) * held * 6 * index_dim
            + held * (8 * kv_heads * head_dim + 4 * index_dim))


def msa_fp32_expansion(rates: Rates, *, seqs: int, queries: int, keys: int, kv_heads: int, q_heads: int,
                       head_dim: int, index_heads: int, index_dim: int, efficiency: float) -> Cost:
    """TensorRT-LLM's Triton MSA path for one layer and step: ``msa_fp32_expansion_bytes`` at ``efficiency`` of the
    datasheet bandwidth (aiconfigurator's msa_*_module tables, ``Rates.msa_fp32_expansion``). Its FP32 einsums
    (2 (2 q_heads d + index_heads d_i) FLOPs a pair: scores and weighted values, index scores) run at about one FLOP
    a byte, far below the GPU's ridge, so the bytes bound it."""
    nbytes = msa_fp32_expansion_bytes(seqs=seqs, queries=queries, keys=keys, kv_heads=kv_heads, q_heads=q_heads,
                                      head_dim=head_dim, index_heads=index_heads, index_dim=index_dim)
    flops = 2.0 * float(queries) * keys * (2 * q_heads * head_dim + index_heads * index_dim)
    return Cost(nbytes / (rates.memory_bandwidth * efficiency), flops, nbytes, "memory", 1, 0.0)


def decode_attention(rates: Rates, seqs: int, kv_heads: int, kv_bytes: float, flops: float,
                     compute_rate_dtype: str = "bf16", fp8_cache: bool = False, mla: bool = False,
                     mha: bool = False) -> Cost:
    """One query token per sequence against its cache: streams ``kv_bytes``; ``kv_heads`` per GPU (1 for MLA).
    u = seqs x kv_heads streams: time = max(FLOPs / attention rate, bytes / (bandwidth x u / (u + u_half)))
    + floor + u x stream_s, at the GPU's measured decode kernel (``Rates.decode_attention_memory``, u_half,
    stream_s: FA3 / FlashInfer GQA tables) unless ``mla`` (FlashMLA's kernel: the streaming rate, ``DECODE_STREAMS_
    HALF``, no per-stream time). An fp8 cache (``fp8_cache``) on an engine with a measured fp8 kernel
    (``rates.fp8_kv_attention``: fixed, scale) streams in scale x the bf16 cache's time for the same tokens (twice
    the bytes) and adds fixed (aiconfigurator 0.12 generation_attention tables, decode_attention_fit.py). An MHA
    model (``mha``: as many query heads as KV heads) on a kernel that does not split its KV sequence
    (``Rates.decode_unsplit_cta_bandwidth``: FlashAttention-2, flash_api.cpp mha_varlen_fwd) streams at most
    u x that rate: one CTA per (sequence, head)."""
    if seqs == 0:
        return Cost(0.0, 0.0, 0.0, "memory", 0)
    _, peak = rates.peak(compute_rate_dtype)
    rate = peak if rates.ideal else peak * rates.attention_efficiency
    t_compute = flops / rate
    streams = seqs * max(kv_heads, 1)
    own = not mla and not rates.ideal and rates.decode_attention_memory > 0 and not rates.bandwidth_points
    half = rates.decode_streams_half if own else DECODE_STREAMS_HALF
    util = 1.0 if rates.ideal else streams / (streams + half)
    bandwidth = rates.memory_bandwidth * rates.decode_attention_memory if own else rates.bandwidth(kv_bytes)
    stream_rate = bandwidth * util
    if own and mha and rates.decode_unsplit_cta_bandwidth > 0:
        stream_rate = min(stream_rate, streams * rates.decode_unsplit_cta_bandwidth)
    t_memory = kv_bytes / stream_rate if kv_bytes else 0.0
    extra = streams * rates.decode_stream_s if own else 0.0
    if fp8_cache and rates.fp8_kv_attention is not None and not rates.ideal:
        fixed, scale = rates.fp8_kv_attention
        t_memory *= 2.0 * scale  # the bf16 cache of the same tokens holds twice the bytes
        extra += fixed
    work = max(t_compute, t_memory)
    floor = rates.fixed(rates.floor("attention"), work) + extra
    bound = "floor" if floor > work else ("compute" if t_compute >= t_memory else "memory")
    return Cost(work + floor, flops, kv_bytes, bound, 1, floor, 0.0, kv_bytes)


@dataclass(frozen=True)
class Routing:
    """How tokens pick their top-k experts.

    - ``uniform``: every expert equally likely (the default);
    - ``zipf``: expert i (by popularity rank) picked with probability min(1, k p_i), p_i proportional to
      i^-``value``;
    - ``power-law``: aiconfigurator's MoE workload (its collector's ``power_law_logits_v3``, the default of its
      predictions with ``value`` 1.2, or 1.01 for DeepSeek-family models): each expert's load drawn i.i.d. from a
      power law x^-``value`` on [0.01, 2] when T k <= E and on [1, 0.8 T] above, scaled to T k rows in all and
      rounded, no expert above T rows, the clamped and the lost rows dealt round-robin over the expert-parallel
      ranks, each to its least-loaded expert with room.
    """

    kind: str = "uniform"
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ROUTING_KINDS:
            raise UsageError(f"unknown routing '{self.kind}' (choose {', '.join(ROUTING_KINDS)})")
        if self.kind == "uniform" and self.value:
            raise UsageError("uniform routing takes no exponent")
        if self.kind != "uniform" and not (0 < self.value <= 4):
            raise UsageError(f"{self.kind} routing exponent must be in (0, 4], got {self.value:g}")

    def __str__(self) -> str:
        return self.kind if self.kind == "uniform" else f"{self.kind}:{self.value:g}"


ROUTING_KINDS = ("uniform", "zipf", "power-law")
UNIFORM = Routing()


def parse_routing(text: str) -> Routing:
    """``uniform``, ``zipf:S`` or ``power-law:ALPHA`` (kinds in ``ROUTING_KINDS``) as a ``Routing``."""
    kind, _, value = text.strip().lower().partition(":")
    if kind == "uniform" and not value:
        return UNIFORM
    if kind not in ROUTING_KINDS or kind == "uniform" or not value:
        raise UsageError(f"invalid routing '{text}': use uniform, zipf:S or power-law:ALPHA (e.g. power-law:1.2)")
    return Routing(kind, parse_float(value, f"{kind} routing exponent", 0.0, 4.0))


def _zipf_probabilities(experts: int, top_k: int, skew: float) -> tuple[float, ...]:
    """Probability that one token picks expert i: k/E uniform (skew 0); with skew s, min(1, k p_i), p_i
    proportional to i^-s (Zipf)."""
    if skew <= 0:
        return (top_k / experts,) * experts
    weights = [(i + 1) ** -skew for i in range(experts)]
    total = sum(weights)
    return tuple(min(1.0, top_k * w / total) for w in weights)


class _PowerLawLoads(NamedTuple):
    """One expert's rows under ``power-law`` routing: its load x ~ C x^-a on [lo, hi] and x T k / (E mean) rows
    before rounding (all E loads' sum taken at its mean)."""

    lo: float
    hi: float
    alpha: float
    rows_per_unit: float

    def _integral(self, x: float) -> float:  # integral of t^-a from lo to x
        g = 1 - self.alpha
        return math.log(x / self.lo) if abs(g) < 1e-9 else (x ** g - self.lo ** g) / g

    def _moment(self, x: float) -> float:  # integral of t^(1-a) from lo to x
        g = 2 - self.alpha
        return math.log(x / self.lo) if abs(g) < 1e-9 else (x ** g - self.lo ** g) / g

    def survival(self, rows: float) -> float:
        """P(rows before rounding >= ``rows``)."""
        x = rows / self.rows_per_unit
        if x <= self.lo:
            return 1.0
        if x >= self.hi:
            return 0.0
        return 1 - self._integral(x) / self._integral(self.hi)

    def excess(self, rows: float) -> float:
        """E[max(0, y - ``rows``)] = E[y; y > rows] - rows P(y > rows), in closed form."""
        x = min(max(rows / self.rows_per_unit, self.lo), self.hi)
        above = self.rows_per_unit * (self._moment(self.hi) - self._moment(x)) / self._integral(self.hi)
        return max(0.0, above - rows * self.survival(rows))

    def sum_survival(self, start: float, step: float, terms: int = 64) -> float:
        """sum_{j >= 0} P(y >= start + j step): ``terms`` terms, then the rest as the integral of the survival
        (midpoint rule: the excess over the last term's cell, divided by the step)."""
        head = sum(self.survival(start + j * step) for j in range(terms))
        return head + self.excess(start + (terms - 0.5) * step) / step


@lru_cache(maxsize=4096)
def _power_law_loads(experts: int, top_k: int, tokens: float, alpha: float) -> _PowerLawLoads:
    lo, hi = (1.0, 0.8 * tokens) if tokens * top_k > experts else (0.01, 2.0)
    loads = _PowerLawLoads(lo, hi, alpha, 1.0)
    return loads._replace(rows_per_unit=tokens * top_k * loads._integral(hi) / (experts * loads._moment(hi)))


def _power_law_rows(experts: int, top_k: int, tokens: float, alpha: float, tile: int) -> tuple[float, float]:
    """(distinct experts, rows computed in tiles of ``tile``) expected under ``power-law`` routing, with the sum of
    the loads taken at its mean (``_PowerLawLoads``).

    An expert's count is round(y), y its unrounded rows: touched when y >= 1/2, E[ceil(round(y) / tile)] =
    sum_j P(y >= j tile + 1/2). Each token takes k distinct experts, so an expert holds at most T rows: the rows
    above T (E E[max(0, y - T)]), then the rows rounding loses (T k - E sum_n P(y >= n - 1/2), when positive),
    go one at a time to the expert with the fewest rows (aiconfigurator's collector since 2026-02-10,
    helper.py ``_generate_power_law_distribution``), so each touches a new expert while any is untouched; at
    least k are touched. Sums over counts run 64 terms, then close with the integral."""
    tokens = max(1, round(tokens))  # the sampler draws for whole tokens (and [1, 0.8 T] needs T >= 2)
    loads = _power_law_loads(experts, top_k, tokens, alpha)
    touched = experts * loads.survival(0.5)
    lost = tokens * top_k - experts * loads.sum_survival(0.5, 1.0)
    over = experts * loads.excess(tokens)
    distinct = max(touched + min(experts - touched, over + max(lost, 0.0)), float(top_k))
    tiles = loads.sum_survival(0.5, tile)
    return distinct, tile * (experts * tiles + distinct - touched)


@lru_cache(maxsize=8192)
def distinct_experts(experts: int, top_k: int, tokens: float, routing: Routing = UNIFORM) -> float:
    """Expected distinct experts ``tokens`` tokens touch, each picking ``top_k`` of ``experts``.

    Uniform routing: E (1 - (1 - k/E)^T). Zipf routing: expert i is picked with probability q_i = min(1, k p_i),
    p_i proportional to i^-s, and the count is sum_i 1 - (1 - q_i)^T: hot experts are shared, so fewer distinct
    experts are read than under uniform routing. Power-law routing: ``_power_law_rows``.
    """
    if routing.kind == "uniform":
        return experts * (1 - (1 - top_k / experts) ** tokens)
    if routing.kind == "power-law":
        return _power_law_rows(experts, top_k, tokens, routing.value, MOE_TILE_MIN)[0]
    return sum(1 - (1 - q) ** tokens for q in _zipf_probabilities(experts, top_k, routing.value))


@lru_cache(maxsize=64)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] = integral of x n phi(x) Phi(x)^(n-1) dx (midpoint rule on
    [-8, 8], step 1/256: 1.4236 for n = 8, as tabulated); 0 for n = 1."""
    if n <= 1:
        return 0.0
    step, total = 1 / 256, 0.0
    for i in range(16 * 256):
        x = -8 + (i + 0.5) * step
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += x * n * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * cdf ** (n - 1) * step
    return total


@lru_cache(maxsize=64)
def _power_law_uniforms(experts: int) -> tuple[tuple[float, ...], ...]:
    """``POWER_LAW_DRAWS`` fixed draws of ``experts`` uniforms (seeded by E: every call sees the same ones)."""
    rng = random.Random(1_000_003 * experts)  # noqa: S311 - a fixed quadrature, not security
    return tuple(tuple(rng.random() for _ in range(experts)) for _ in range(POWER_LAW_DRAWS))


@lru_cache(maxsize=8192)
def _power_law_busiest_rank(experts: int, top_k: int, tokens: float, ranks: int, alpha: float) -> float:
    """The mean, over ``POWER_LAW_DRAWS`` draws, of the busiest rank's rows over the mean rank's under
    aiconfigurator's power-law workload (collector helper.py ``_generate_power_law_distribution`` since 2026-04-19):
    E loads i.i.d. by inverse CDF from x^-a on [1, 0.8 T] (T k > E; else [0.01, 2]), scaled to T k rows, each capped
    at T, the capped rows dealt round-robin over the ranks with room (rank r holds experts r n .. r n + n - 1,
    n = E / ranks, at most n T rows); the collector swaps the busiest rank to rank 0 and times it. Rows unrounded."""
    lo, hi = (1.0, 0.8 * tokens) if tokens * top_k > experts else (0.01, 2.0)
    g = 1.0 - alpha
    if abs(g) < 1e-9:  # alpha 1: the inverse CDF of 1/x is lo (hi / lo)^u
        def inverse(u: float) -> float:
            return lo * (hi / lo) ** u
    else:
        base, span, power = lo ** g, hi ** g - lo ** g, 1.0 / g

        def inverse(u: float) -> float:
            return (base + span * u) ** power
    total, per_rank = tokens * top_k, experts // ranks
    rank_cap = per_rank * tokens
    ratio_sum = 0.0
    for draw in _power_law_uniforms(experts):
        loads = [inverse(u) for u in draw]
        scale = total / sum(loads)
        rows = [min(x * scale, tokens) for x in loads]
        sums = [sum(rows[r * per_rank:(r + 1) * per_rank]) for r in range(ranks)]
        spare = total - sum(sums)
        while spare > 1e-9 * total:  # equal shares to the ranks with room, a full rank's leftover to the others
            open_ranks = [r for r in range(ranks) if sums[r] < rank_cap]
            if not open_ranks:
                break
            share = spare / len(open_ranks)
            for r in open_ranks:
                added = min(share, rank_cap - sums[r])
                sums[r] += added
                spare -= added
        ratio_sum += max(sums) * ranks / total
    return ratio_sum / POWER_LAW_DRAWS


@lru_cache(maxsize=8192)
def rank_imbalance(experts: int, top_k: int, tokens: int, ranks: int, routing: Routing = UNIFORM) -> float:
    """The busiest of ``ranks`` expert-parallel ranks' (token, expert) rows over the mean rank's, which the step
    waits for. Each rank holds n = E / ranks experts placed without regard to their popularity. Uniform or Zipf
    routing: one expert's rows have mean m and variance v (Binomial(T, k/E); Zipf: binomial at a random expert's
    q); a rank's sum, the total held fixed, has coefficient of variation sqrt(v / n) / m x sqrt(1 - 1 / ranks), and
    the busiest rank sits ``expected_max_normal(ranks)`` of them above the mean (normal approximation). Power-law:
    the sampled mean of aiconfigurator's own draw (``_power_law_busiest_rank``; its few heavy-tailed loads per rank
    are far from normal: at E 8, k 2 over 8 ranks the approximation gave 5.0, above the bound E / k = 4)."""
    if ranks <= 1 or tokens <= 0:
        return 1.0
    if routing.kind == "power-law":
        return _power_law_busiest_rank(experts, top_k, float(tokens), ranks, routing.value)
    q = _zipf_probabilities(experts, top_k, routing.value if routing.kind == "zipf" else 0.0)
    mean = tokens * sum(q) / len(q)
    var = (sum(tokens * p * (1 - p) for p in q) / len(q)
           + tokens * tokens * (sum(p * p for p in q) / len(q) - (sum(q) / len(q)) ** 2))
    if mean <= 0:
        return 1.0
    n = experts / ranks
    spread = math.sqrt(var / n) / mean * math.sqrt(1 - 1 / ranks)
    return min(1.0 + expected_max_normal(ranks) * spread, float(ranks))


def moe_tile_rows(tokens: float, top_k: int, experts: int) -> tuple[int, int, float]:
    """The tile heights a grouped GEMM runs the experts' rows in, from the mean rows per expert m = T k / E:
    kernels take the next power of two of m within [16, 128] (OpenAI triton_kernels routing, ``block_m``; vLLM's
    tuned fused-MoE configs step BLOCK_SIZE_M from 16 to 128 with the tokens the same way). Returned as (the power
    of two at or below m, the one above, the weight of the upper: log2(m / lower)), so a step blends the two
    around m and stays continuous and monotone in the tokens where the kernels switch."""
    mean = tokens * top_k / experts
    if mean <= MOE_TILE_MIN:
        return MOE_TILE_MIN, MOE_TILE_MIN, 0.0
    if mean >= MOE_TILE_MAX:
        return MOE_TILE_MAX, MOE_TILE_MAX, 0.0
    lower = 1 << (int(mean).bit_length() - 1)
    return lower, 2 * lower, math.log2(mean / lower)


def binomial_tiles(n: int, q: float, tile: int) -> float:
    """E[ceil(X / tile)] for X ~ Binomial(n, q): the row tiles of one expert that each of n tokens picks with
    probability q (top-k routing: the tokens' choices are independent, so an expert's count is binomial).

    = (E[X] + E[R]) / tile with R = (-X) mod tile, the padding of the last tile. Exact either way, by the cheaper:
    the pmf summed out from its mode until it falls below 1e-16 of its peak (about mean +- 8.5 sd: narrow counts),
    or the discrete Fourier series of the residue, E[R] = (tile - 1) / 2 + sum_{j=1}^{tile-1} phi(2 pi j / tile) /
    (w^j - 1), w = exp(2 pi i / tile), with the binomial's characteristic function phi(t) = (1 - q + q e^{it})^n,
    whose terms vanish (|phi| < 1e-13) after about 1.2 tile / sd of them (wide counts).
    """
    if n <= 0 or q <= 0:
        return 0.0
    if q >= 1:
        return float(-(-n // tile))
    mean = n * q
    var = mean * (1 - q)
    if tile == 1:
        return mean
    # terms of the Fourier series before |phi| < 1e-13 (|phi|^2 = (1 - 2 q (1 - q)(1 - cos t))^n ~ exp(-var t^2))
    reach = 2 * _FOURIER_LOG_EPS / var
    fourier_terms = tile / 2 if reach >= 2 else tile * math.acos(1 - reach) / (2 * math.pi)
    if _FOURIER_COST * fourier_terms < 17 * math.sqrt(var) + 3:  # the pmf sum's terms (below)
        residue = (tile - 1) / 2
        spread = 2 * q * (1 - q)
        for j in range(1, tile // 2 + 1):
            angle = 2 * math.pi * j / tile
            loss = spread * (1 - math.cos(angle))  # |phi|^(2 / n) = 1 - loss: 0 at q = 1/2, angle = pi
            if loss >= 1 or n / 2 * math.log1p(-loss) < -_FOURIER_LOG_EPS:
                break
            w = cmath.exp(1j * angle)
            term = (1 - q + q * w) ** n / (w - 1)
            residue += term.real if 2 * j == tile else 2 * term.real  # terms j and tile - j are conjugates
        return (mean + residue) / tile
    mode = int((n + 1) * q)  # the pmf rises to here and falls after it
    log_pmf = (math.lgamma(n + 1) - math.lgamma(mode + 1) - math.lgamma(n - mode + 1) + mode * math.log(q)
               + (n - mode) * math.log1p(-q))
    ratio, top = q / (1 - q), math.exp(log_pmf)
    cutoff = top * _PMF_CUTOFF
    total, mass, pmf, x = 0.0, 0.0, top, mode
    while x <= n and pmf > cutoff:  # upward: pmf(x + 1) = pmf(x) (n - x) / (x + 1) q / (1 - q)
        total += pmf * -(-x // tile)
        mass += pmf
        pmf *= (n - x) / (x + 1) * ratio
        x += 1
    pmf, x = top, mode - 1
    while x >= 0 and pmf > cutoff:  # downward
        pmf *= (x + 1) / (n - x) / ratio
        total += pmf * -(-x // tile)
        mass += pmf
        x -= 1
    return total / mass  # the peak from lgamma is off by up to ~1e-7 relative at n ~ 1e8; every term shares it


@lru_cache(maxsize=16384)
def routed_rows(experts: int, top_k: int, tokens: int, routing: Routing = UNIFORM) -> tuple[float, float, float]:
    """(distinct experts, rows computed, row tiles) expected over all ``experts`` when ``tokens`` tokens each pick
    ``top_k`` (``routing``: uniform, Zipf or power-law). Uniform or Zipf: expert i's count X_i ~ Binomial(T, q_i)
    (tokens choose independently); it is touched with probability P(X_i > 0) and computes E[ceil(X_i / tile)]
    tiles of tile rows each, the tile heights of ``moe_tile_rows`` blended. A deterministic count (the mean,
    rounded up to tiles) would jump by a whole tile per expert where the mean crosses a multiple of the tile;
    random routing spreads the counts. Power-law: ``_power_law_rows``."""
    lower, upper, w = moe_tile_rows(tokens, top_k, experts)
    if routing.kind == "power-law":
        distinct, low = _power_law_rows(experts, top_k, tokens, routing.value, lower)
        if w == 0:
            return distinct, low, low / lower
        high = _power_law_rows(experts, top_k, tokens, routing.value, upper)[1]
        return distinct, (1 - w) * low + w * high, (1 - w) * low / lower + w * high / upper
    skewed = routing.kind == "zipf"
    probabilities = _zipf_probabilities(experts, top_k, routing.value) if skewed else (top_k / experts,)
    scale = 1 if skewed else experts

    def tiles(tile: int) -> float:
        return scale * sum(binomial_tiles(tokens, q, tile) for q in probabilities)

    low = tiles(lower)
    if w == 0:
        padded, count = lower * low, low
    else:
        high = tiles(upper)
        padded, count = (1 - w) * lower * low + w * upper * high, (1 - w) * low + w * high
    return distinct_experts(experts, top_k, tokens, routing), padded, count


def moe_untuned(rates: Rates, weight_format: str, experts_local: int, expert_width: int) -> bool:
    """Whether the engine's fused MoE runs its default tile configuration for this shape: it lists the tuned shapes
    of the format (``Rates.moe_tuned_shapes``, its config files) and (local experts, per-rank width) is not one."""
    tuned = rates.moe_tuned_shapes.get(weight_format)
    return tuned is not None and (experts_local, expert_width) not in tuned


def moe_fused_fp8_rows(rates: Rates, compute: str, weight_format: str) -> bool:
    """Whether an fp8 fused MoE passes 8-bit rows between its GEMMs, the activation fused into the first (an engine's
    ``Rates.moe_fused_rows``: vLLM's per-tensor FP8 experts on FlashInfer's TRT-LLM MoE on a B200)."""
    return compute == "fp8" and weight_format in rates.moe_fused_rows and not rates.ideal


def moe_one_tile_per_expert(tokens: float, top_k: int, experts: int) -> bool:
    """Whether a step's experts get at most one smallest row tile each on average: T k / E <= ``MOE_OWN_STREAM_ROWS``
    (FlashInfer TRT-LLM's 8-row tiles; a Triton fused MoE's 16-row ones hold at least as many)."""
    return tokens * top_k <= MOE_OWN_STREAM_ROWS * experts


def moe_own_stream(rates: Rates, weight_format: str) -> float | None:
    """The fraction of the datasheet bandwidth the GPU's fused MoE streams a format's experts at while each gets at
    most one row tile (``Rates.moe_memory_efficiency``); a format whose kernel the engine prices with a cost per
    touched expert (``Rates.moe_touched_expert``) takes the GPU's bf16 fused-MoE figure: that cost, not a slower
    stream, is what narrow experts lose (benchmarks/validation/sglang_mxfp4_experts.py)."""
    own = rates.moe_memory_efficiency.get(weight_format)
    if own is None and weight_format in rates.moe_touched_expert:
        return rates.moe_memory_efficiency.get("bf16")
    return own


def moe_expert_matrix_bytes(rates: Rates, weight_format: str, hidden: int, in_width: int,
                            weight_bits: float) -> float:
    """Bytes of one expert's per-rank gate/up matrix (``hidden`` x ``in_width``) as the fused MoE holds it: at the
    bits it streams (``Rates.moe_stream_bits``: SGLang upcasts MXFP4 experts on Hopper to bf16), else stored."""
    return hidden * in_width * (rates.moe_stream_bits.get(weight_format) or weight_bits) / 8


def moe_large_expert_slowdown(rates: Rates, weight_format: str, matrix_bytes: float) -> float:
    """How many times longer the fused MoE's grouped GEMMs take for an expert whose per-rank gate/up matrix holds
    ``matrix_bytes``: 1 + s (1 - B / matrix_bytes) above the engine's (B, s) for the format
    (``Rates.moe_large_expert``), else 1."""
    threshold, slowdown = rates.moe_large_expert.get(weight_format, (0.0, 0.0))
    return 1.0 + slowdown * (1.0 - threshold / matrix_bytes) if threshold and matrix_bytes > threshold else 1.0


FP4_ROW_BYTES_PER_ELEMENT = 4.5 / 8  # an NVFP4 activation row: E2M1 values + one E4M3 scale per 16 (NVIDIA)


def moe_experts(rates: Rates, *, tokens: float, experts_local: int, experts_total: int, top_k: int, hidden: int,
                expert_width: int, gated: bool, weight_bits: float, compute: str, dequant: str = "",
                act_bytes: float = 2.0, routing: Routing = UNIFORM, weight_format: str = "",
                replicated: bool = True) -> Cost:
    """Fused MoE (route, permute, grouped gate/up GEMM, activation, grouped down GEMM, combine) on one GPU.

    ``tokens`` enter the layer on this GPU; each picks ``top_k`` of ``experts_total`` experts as ``routing`` has
    it (uniform by default), of which ``experts_local`` live here (each sliced to ``expert_width``). Every
    touched expert's weights are read once; its rows run in tiles of ``moe_tile_rows`` rows, E[ceil(X / tile)] of
    them for its binomial count X, each tile computing whole (``routed_rows``). ``weight_format`` (the experts'
    storage dtype name) picks an engine's entries measured for that format's kernel over its compute dtype's: the
    bits it streams (``Rates.moe_stream_bits``), the GPU's fused-MoE stream for it while the tokens are at most the
    layer's experts (``Rates.moe_memory_efficiency``) and a slower stream once they outnumber the local experts
    (``Rates.moe_large_m_memory``), or one stream whatever the tokens (``Rates.moe_weight_stream``); where the
    engine lists its tuned shapes for the format
    (``Rates.moe_tuned_shapes``), a shape (``experts_local``, ``expert_width``) outside the list runs the kernel's
    default configuration, at ``Rates.moe_untuned_efficiency``, ``Rates.moe_untuned_k0`` and
    ``Rates.moe_untuned_large_m_memory``; an expert larger than the engine's ``Rates.moe_large_expert`` runs its
    grouped GEMMs slower (``moe_large_expert_slowdown``); under expert parallelism the format's
    ``Rates.moe_ep_floors`` adds to the fixed cost, and each local expert the step touches its
    ``Rates.moe_touched_expert`` (``moe_own_stream``).
    ``replicated``: every token reached every expert-parallel rank (no all-to-all), so a kernel with
    ``Rates.moe_ep_every_row`` for ``weight_format`` activates, zero-fills and combines all T k rows.
    NVFP4 experts read each token's 16-bit row once and pass FP4 rows between their GEMMs
    (``FP4_ROW_BYTES_PER_ELEMENT``; the activation fused into the first GEMM), the fp8 formats of
    ``Rates.moe_fused_rows`` 8-bit rows the same way, other formats 16-bit rows through separate activation and
    quantization stages; an engine's ``Rates.moe_row_bytes`` adds its own traffic per routed row and hidden element.
    """
    if tokens <= 0 or experts_local == 0:
        return Cost(0.0, 0.0, 0.0, "memory", 0)
    share = experts_local / experts_total
    pairs = tokens * top_k * share  # (token, expert) pairs computed here
    in_width = (2 if gated else 1) * expert_width
    if rates.ideal:
        distinct, padded, tiles = distinct_experts(experts_total, top_k, tokens, routing), 0.0, 0.0
    else:
        distinct, padded, tiles = routed_rows(experts_total, top_k, max(1, round(tokens)), routing)
    if share < 1 and not rates.ideal:
        # expert parallelism: the busiest rank's rows set the step; they fill its experts' tiles (a step too small
        # to give each expert a tile keeps its padded rows and one tile per expert)
        busiest = rank_imbalance(experts_total, top_k, max(1, round(tokens)), round(1 / share), routing)
        pairs, tiles = pairs * busiest, distinct + (tiles - distinct) * busiest
    distinct, rows, tiles = distinct * share, max(padded * share, pairs), max(tiles * share, distinct * share)
    w8a8 = compute in ("fp8", "int8", "fp4") and not rates.ideal
    quant_in = act_bytes + weight_bits / 8 if w8a8 else 0.0  # activation quantisation before each GEMM
    # rows the elementwise stages touch, and rows of other ranks' experts a GEMM writes zeros for
    every_row = (share < 1 and replicated and not rates.ideal
                 and bool({"*", weight_format} & rates.moe_ep_every_row))
    touched = max(pairs, tokens * top_k) if every_row else pairs
    zeroed = touched - pairs
    # the combine reads each row and writes each token, plus the engine's own traffic per routed row, if measured
    combine = (touched + tokens * share) * hidden * act_bytes + touched * hidden * rates.moe_row_bytes.get(
        weight_format, 0.0)
    fused_fp8 = moe_fused_fp8_rows(rates, compute, weight_format)
    if (compute == "fp4" and weight_format == "nvfp4" and not rates.ideal) or fused_fp8:
        # NVFP4 MoE kernels (FlashInfer's TRT-LLM-gen and CUTLASS W4A4 experts) quantize each token once as it is
        # permuted -- its 16-bit row read once, not once per routed copy --, fuse the gated activation and the second
        # quantization into the first GEMM's epilogue and feed the GEMMs FP4 rows (4 bits + an 8-bit scale per 16):
        # no 16-bit intermediate is written or read again; an engine's fp8 kernel measured to do the same
        # (moe_fused_rows) passes 8-bit rows. MXFP4 experts (gpt-oss) keep 16-bit or MXFP8 rows between their stages
        # (below)
        staged = 1.0 if fused_fp8 else FP4_ROW_BYTES_PER_ELEMENT
        stages = (
            ("up", 2.0 * pairs * hidden * in_width, 2.0 * rows * hidden * in_width, distinct * hidden * in_width,
             min(pairs, tokens) * hidden * act_bytes + pairs * (2 * hidden + expert_width) * staged
             + zeroed * expert_width * staged, hidden),
            ("down", 2.0 * pairs * expert_width * hidden, 2.0 * rows * expert_width * hidden,
             distinct * expert_width * hidden,
             pairs * (expert_width * staged + hidden * act_bytes) + zeroed * hidden * act_bytes, expert_width),
            ("combine", 0.0, 0.0, 0.0, combine, 0),
        )
    else:
        # the kernels in sequence: (name, FLOPs, padded FLOPs, weight bytes, activation bytes, K)
        stages = (
            ("up", 2.0 * pairs * hidden * in_width, 2.0 * rows * hidden * in_width, distinct * hidden * in_width,
             pairs * (hidden * (act_bytes + quant_in) + in_width * act_bytes) + zeroed * in_width * act_bytes,
             hidden),
            ("act", 0.0, 0.0, 0.0, touched * (in_width + expert_width) * act_bytes, 0),
            ("down", 2.0 * pairs * expert_width * hidden, 2.0 * rows * expert_width * hidden,
             distinct * expert_width * hidden,
             pairs * (expert_width * (act_bytes + quant_in) + hidden * act_bytes) + zeroed * hidden * act_bytes,
             expert_width),
            ("combine", 0.0, 0.0, 0.0, combine, 0),
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
    untuned = moe_untuned(rates, weight_format, experts_local, expert_width)  # the kernel's default tiles
    grouped = (rates.moe_untuned_efficiency[weight_format] if untuned
               else rates.grouped_efficiency(compute, dequant, weight_format)) / moe_large_expert_slowdown(
        rates, weight_format, moe_expert_matrix_bytes(rates, weight_format, hidden, in_width, weight_bits))
    stream_bits = rates.moe_stream_bits.get(weight_format) or weight_bits
    dequant_ops = (0.0 if weight_format in rates.moe_stream_bits
                   else rates.moe_dequant_ops.get(dequant) or DEQUANT_OPS.get(dequant, 0.0))
    # the GPU's own fused-MoE stream while each expert gets at most one smallest row tile (the ep-1 rows it was
    # fitted on; under ep the local experts' rows are the same)
    own_stream = (moe_own_stream(rates, weight_format)
                  if moe_one_tile_per_expert(tokens, top_k, experts_total) and rates._stream else None)
    bandwidth = ((rates.memory_bandwidth * own_stream if own_stream else rates._stream)
                 or rates.bandwidth(distinct * hidden * (in_width + expert_width) * stream_bits / 8))
    # the kernel's tile configuration for more tokens than experts streams slower (not under a calibrated curve)
    large_m = ((rates.moe_untuned_large_m_memory if untuned else rates.moe_large_m_memory).get(weight_format)
               if tokens > experts_local and rates._stream else None)
    if large_m:
        bandwidth = min(bandwidth, rates.memory_bandwidth * large_m)
    held = rates.moe_weight_stream.get(weight_format) if rates._stream else None  # one stream at every token count
    if held:
        bandwidth = rates.memory_bandwidth * held
    # a weight-only kernel unpacks each touched expert's weights once, or, where the engine's kernel was measured to
    # (moe_dequant_per_tile), again in every row tile's main loop: hot experts with many rows unpack many times
    unpacks = tiles / distinct if dequant in rates.moe_dequant_per_tile else 1.0
    for _, f, padded, weights, acts, k in stages:
        w_bytes = weights * stream_bits / 8
        t_c = (padded / (rates.gemm_flops_per_s(compute, k, not dequant, weight_format,
                                                rates.moe_untuned_k0 if untuned else 0.0) * grouped) if padded
               else 0.0)
        t_w = w_bytes / bandwidth
        t_d = weights * unpacks * dequant_ops / rates.alu_ops_per_s if dequant and weights else 0.0
        # the gathered / scattered activation rows add to the weight stream or the tensor-core work
        t = max(t_c, t_w, t_d) + acts / bandwidth
        bound = ("compute" if t_c >= max(t_w, t_d) and t_c else "dequant" if t_d > t_w else "memory")
        by_bound[bound] = by_bound.get(bound, 0.0) + t
        seconds, flops, nbytes, weight_total = seconds + t, flops + f, nbytes + w_bytes + acts, weight_total + w_bytes
    per_expert = rates.moe_expert_floors.get(weight_format, rates.moe_expert_floors.get(rates.peak(compute)[0], 0.0))
    ep_floor = rates.moe_ep_floors.get(weight_format, 0.0) if share < 1 else 0.0
    per_touched = distinct * rates.moe_touched_expert.get(weight_format, 0.0)  # the local experts the step touches
    floor = rates.fixed(rates.floor("moe", weight_format) + experts_local * per_expert + ep_floor + per_touched,
                        seconds)
    bound = "floor" if floor > seconds else max(by_bound, key=by_bound.__getitem__)
    return Cost(seconds + floor, flops, nbytes, bound, 1, floor, weight_total, weight_total)
