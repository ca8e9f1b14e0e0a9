"""Latency of prefill and decode on real silicon: every kernel of a step, its floor, and the communication.

A step (one forward pass of the scheduler) runs, per layer and per GPU, the kernels an engine launches
(tfcalc/calc/kernels.py prices each one):

- attention block: fused residual-add + RMSNorm; QKV GEMM [M x h] @ [h x (q + 2 kv heads/tp) d]; QK-norm (Qwen3);
  rotary + KV-cache write; attention (flash prefill over the new tokens' causal keys, paged decode over each
  sequence's cache, window-capped on sliding layers); O GEMM; tensor-parallel all-reduce of M x h x 2 bytes.
  MLA (DeepSeek-V2/V3): fused q_a/kv_a GEMM, two latent norms, q_b GEMM; decode absorbs W_UK/W_UV into per-head
  batched GEMMs around latent attention over kv_rank + rope (the cache is not split by tp); prefill expands the
  latent with kv_b and runs flash attention with qk 192 / v 128.
  Gemma 4's full-attention layers run with their own head_dim and KV heads (``Deployment.full_dims``).
- dense FFN: norm, gate/up GEMM, activation, down GEMM, all-reduce (Gemma 4: on every layer, beside the MoE,
  reduced on its own before it).
- MoE: norm, router GEMM (replicated), shared-expert FFN, the fused routed-expert kernel (E/ep experts, uniform
  routing, tiles per expert), all-to-all dispatch and combine when experts span data-parallel attention replicas
  (ep > tp), else the tensor-parallel all-reduce. Where the engine runs the shared experts on a second CUDA stream
  (``kernels.shared_experts_stream``), they and the router + routed experts last max(either, their summed work).
- fp8/int8 W8A8 GEMMs quantise their input in a separate kernel unless the engine fuses it.
- once per step: embedding gather (+ all-reduce of the vocab-parallel table), final norm, lm_head GEMM for the
  sequences that sample, logits gather over tp, sampling.

Identical layers are priced once and multiplied: cost does not grow with the number of layers. Pipeline stages
hold contiguous layers (vLLM's split); a microbatch crosses a stage boundary with one point-to-point send of its
hidden state and residual. ``step_time`` is the time of one scheduler step -- the building block of
``estimate`` -- and ``step_seconds`` its vectorised, interpolated form for a serving simulator. Pure math: no I/O.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

from tfcalc.calc import comm, kernels
from tfcalc.calc.engine import capacity_bytes
from tfcalc.calc.kernels import Cost, Rates
from tfcalc.calc.kv_cache import (
    compressed_entry_bytes,
    compressed_indexer_bytes,
    indexer_key_bytes,
    keys_attended,
    kv_layer_bytes,
    mean_keys,
    state_dtypes,
)
from tfcalc.calc.params import attention_modules, ffn_modules, indexer_modules
from tfcalc.calc.plan import check_parallelism, stage_layers
from tfcalc.calc.shard import attention_ranks, check_weight_blocks, exception_applies, latent_dtype
from tfcalc.dtypes import DType, WeightPrecision, get_dtype, parse_weight_precision
from tfcalc.errors import UsageError
from tfcalc.spec.engine import MOE_EXPERT_DTYPES, ArchitectureMoe, EngineKernels
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.interconnect import Interconnect
from tfcalc.spec.model import CompressedAttentionSpec, ModelSpec

ACT_BYTES = 2.0  # bf16 activations, all-reduce payloads and logits
FP8_DISPATCH_BYTES = 1 + 4 / 128  # an fp8 value and its share of one fp32 scale per 128 (DeepEP's fp8 dispatch)
GROUPS = ("attention", "dense_ffn", "moe", "lm_head", "communication")
COMPUTE_CHOICES = ("auto", "bf16", "fp16", "fp8", "int8", "fp4")

# Generic achievable fractions for a GPU preset without a ``latency:`` block (a user's YAML): the medians of the
# measured NVIDIA presets (H100 SXM, H200, A100, L40S), so a new part is priced like a typical one until calibrated.
GENERIC_LATENCY = {"sm_count": 132, "gemm_efficiency": {"bf16": 0.78, "fp16": 0.78, "fp8": 0.48, "int8": 0.48,
                                                        "fp4": 0.46},
                   "attention_efficiency": 0.6, "moe_efficiency": 0.7, "moe_efficiency_by_dtype": {},
                   "memory_efficiency": 0.8,
                   "floors_s": {"gemm": 2.7e-6, "elementwise": 2.0e-6, "attention": 11.5e-6, "moe": 30e-6}}


# --- hardware rates ---------------------------------------------------------------------------------------------


def rates_for(gpu: GPUSpec, engine: EngineKernels, cuda_graphs: bool | None = None,
              architecture: str | None = None, has_experts: bool = True) -> Rates:
    """The GPU's achievable rates (its preset's latency block, or generic values) with the engine's floors and,
    where the engine preset measured its own fused-MoE kernel on this GPU, its grouped-GEMM efficiency -- the one
    of the kernel it runs for the model's ``architecture`` there, where it picks by architecture. ``has_experts``
    False (a dense model): the source names no MoE kernel, whose rates such a model never uses."""
    lat = gpu.latency
    if lat is not None:
        sm, gemm_eff, attn, moe, mem, floors = (lat.sm_count, lat.gemm_efficiency, lat.attention_efficiency,
                                                lat.moe_efficiency, lat.memory_efficiency, lat.floors_s)
        moe_by_dtype = dict(lat.moe_efficiency_by_dtype)
        source = (f"{gpu.name} preset (measured kernels)" if lat.measured_here else
                  f"{gpu.name} preset (not measured: published fractions, borrowed floors)"
                  if lat.measured_on == "none" else f"{gpu.name} preset (kernels measured on {lat.measured_on})")
    else:
        g = GENERIC_LATENCY
        sm, gemm_eff, attn, moe, mem, floors = (g["sm_count"], g["gemm_efficiency"], g["attention_efficiency"],
                                                g["moe_efficiency"], g["memory_efficiency"], g["floors_s"])
        moe_by_dtype = dict(g["moe_efficiency_by_dtype"])
        source = f"{gpu.name}: no latency block in its preset, generic values"
    kernels_gpu = engine_kernels_gpu(gpu, engine)
    engine_moe = engine.moe_efficiency_by_gpu.get(kernels_gpu, {})
    engine_k0 = engine.moe_k0_by_gpu.get(kernels_gpu, {})
    gemm_memory = dict(lat.gemm_memory_efficiency) if lat is not None else {}
    moe_memory = dict(lat.moe_memory_efficiency) if lat is not None else {}
    engine_gemm_memory = engine.gemm_memory_efficiency_by_gpu.get(kernels_gpu, {})
    if engine_gemm_memory:
        gemm_memory.update(engine_gemm_memory)
        source += f", {'/'.join(sorted(engine_gemm_memory))} GEMM streaming from the engine preset"
    engine_gemm = dict(engine.gemm_efficiency_by_gpu.get(kernels_gpu, {}))
    if engine_gemm:
        source += f", {'/'.join(sorted(engine_gemm))} GEMM efficiency from the engine preset"
    arch_kernel = engine.moe_by_architecture.get(kernels_gpu, {}).get(architecture or "")
    arch_moe = arch_kernel.efficiency if arch_kernel is not None else {}
    every_row = engine.moe_ep_every_row_by_gpu.get(kernels_gpu, frozenset())
    if arch_kernel is not None:
        engine_moe = {**engine_moe, **arch_moe}
        # its formats touch every row where that kernel does, whatever the default kernel's set says
        every_row = ((set(MOE_EXPERT_DTYPES) if "*" in every_row else set(every_row)) - set(arch_moe)
                     | arch_kernel.ep_every_row)
    # an architecture served by another kernel there (arch_moe) does not take the Triton kernel's tuned shapes
    tuned = {fmt: shapes for fmt, shapes in engine.moe_tuned_shapes_by_gpu.get(kernels_gpu, {}).items()
             if fmt not in arch_moe}
    if tuned and has_experts:
        source += (f", {'/'.join(sorted(tuned))} fused-MoE shapes without a tuned config at the engine's default "
                   "tiles")
    if engine_moe:
        moe_by_dtype = {**moe_by_dtype, **engine_moe}
    if engine_moe and has_experts:
        source += (f", {'/'.join(sorted(engine_moe))} MoE efficiency from the engine preset"  # the dtypes it covers
                   + (f" ({architecture}'s kernel)" if arch_moe else ""))
        if engine_k0:
            source += f" (grouped-GEMM K0 {', '.join(f'{k} {v:g}' for k, v in sorted(engine_k0.items()))})"
        if kernels_gpu != gpu.name:
            source += f" (its {kernels_gpu} entry: same silicon)"
    # the engine's own decode kernel on this part (its kernels.decode_attention) over the GPU preset's (vLLM's)
    decode = engine.decode_attention_by_gpu.get(gpu.name, engine.decode_attention_by_gpu.get(kernels_gpu))
    if decode is not None:
        source += ", decode attention at the engine preset's kernel"
    else:  # the GPU preset's kernel; its unsplit MHA only for the engine running it (kernels.decode_unsplit_mha)
        decode = lat.decode_attention if lat is not None else None
        if decode is not None and not engine.decode_unsplit_mha:
            decode = (*decode[:3], 0.0)
    decode_rates = ({"decode_attention_memory": decode[0], "decode_streams_half": decode[1],
                     "decode_stream_s": decode[2], "decode_unsplit_cta_bandwidth": decode[3]}
                    if decode is not None else {})
    fp32 = gpu.dense_flops_per_s.get("fp32", gpu.peak_flops("bf16")[1] / 16)
    kernel_peaks = dict(lat.kernel_peak_flops_per_s) if lat is not None else {}
    for dtype, value in sorted(kernel_peaks.items()):
        source += (f", {dtype} at the kernels' {value / 1e12:,.0f} TFLOPS (datasheet "
                   f"{gpu.dense_flops_per_s[dtype] / 1e12:,.0f})")
    return Rates(name=gpu.name, peak_flops={**gpu.dense_flops_per_s, **kernel_peaks},
                 datasheet_peak_flops=dict(gpu.dense_flops_per_s) if kernel_peaks else {},
                 gemm_efficiency=dict(gemm_eff),
                 attention_efficiency=float(attn), moe_efficiency=float(moe), moe_efficiency_by_dtype=moe_by_dtype,
                 memory_bandwidth=gpu.hbm_bandwidth_bytes_per_s,
                 memory_efficiency=float(mem), alu_ops_per_s=fp32 / 2, sm_count=int(sm),
                 floors={**floors, **engine.floors_s}, moe_expert_floors=dict(engine.moe_expert_floors_s),
                 moe_dequant_ops=dict(engine.moe_dequant_ops_by_gpu.get(kernels_gpu, {})), moe_k0=dict(engine_k0),
                 moe_dequant_per_tile=engine.moe_dequant_per_tile_by_gpu.get(kernels_gpu, frozenset()),
                 moe_fused_rows=engine.moe_fused_rows_by_gpu.get(kernels_gpu, frozenset()),
                 moe_stream_bits=dict(engine.moe_stream_bits_by_gpu.get(kernels_gpu, {})),
                 moe_large_m_memory=dict(engine.moe_large_m_memory_by_gpu.get(kernels_gpu, {})),
                 moe_tuned_shapes=tuned,
                 moe_untuned_efficiency={fmt: engine.moe_untuned_efficiency_by_gpu[kernels_gpu][fmt] for fmt in tuned},
                 moe_untuned_large_m_memory={fmt: v for fmt, v in
                                             engine.moe_untuned_large_m_memory_by_gpu.get(kernels_gpu, {}).items()
                                             if fmt in tuned},
                 moe_untuned_k0=engine.moe_untuned_k0 if tuned else 0.0,
                 moe_large_expert=dict(engine.moe_large_expert_by_gpu.get(kernels_gpu, {})),
                 moe_ep_every_row=frozenset(every_row),
                 moe_format_floors={**engine.moe_floors_by_gpu.get(kernels_gpu, {}),
                                    **(arch_kernel.floors_s if arch_kernel is not None else {})},
                 moe_ep_floors=dict(engine.moe_ep_floors_by_gpu.get(kernels_gpu, {})),
                 moe_touched_expert=dict(engine.moe_touched_expert_s_by_gpu.get(kernels_gpu, {})),
                 moe_row_bytes=dict(engine.moe_row_bytes_by_gpu.get(kernels_gpu, {})),
                 gdn_efficiency=engine.gdn_efficiency_by_gpu.get(kernels_gpu, 0.0),
                 linear_host={fmt: steps for fmt, steps in engine.linear_host_s_by_gpu.get(
                     gpu.name, engine.linear_host_s_by_gpu.get(kernels_gpu, {})).items()
                              if fmt in engine.uncaptured_linears},
                 fp8_kv_attention=engine.fp8_kv_attention_by_gpu.get(kernels_gpu),
                 fp8_kv_prefill_scale=engine.fp8_kv_prefill_scale_by_gpu.get(kernels_gpu),
                 wide_head_prefill_scale=engine.wide_head_prefill_scale_by_gpu.get(kernels_gpu),
                 dsa_prefill_head_tile=engine.dsa_prefill_head_tile_by_gpu.get(kernels_gpu, 0),
                 dsa_block_floors={**engine.dsa_block_floors_by_gpu.get(kernels_gpu, {}),
                                   **engine.dsa_block_floors_by_gpu.get(gpu.name, {})},
                 dsa_prefill_efficiency=engine.dsa_prefill_efficiency_by_gpu.get(kernels_gpu, 0.0),
                 dsa_prefill_full_topk=kernels_gpu in engine.dsa_prefill_full_topk_by_gpu,
                 v4_prefill_efficiency=engine.v4_prefill_efficiency_by_gpu.get(kernels_gpu, 0.0),
                 msa_fp32_expansion=dict(engine.msa_fp32_expansion_by_gpu.get(kernels_gpu, {})),
                 gemm_memory_efficiency=gemm_memory, gemm_efficiency_by_format=engine_gemm,
                 moe_memory_efficiency=moe_memory,
                 moe_weight_stream=dict(arch_kernel.memory_efficiency) if arch_kernel is not None else {},
                 dynamic_scale_s=engine.dynamic_scale_s_by_gpu.get(kernels_gpu),
                 launch_s=engine.eager_launch_s,
                 cuda_graphs=engine.cuda_graphs if cuda_graphs is None else cuda_graphs, source=source,
                 **decode_rates)


def engine_kernels_gpu(gpu: GPUSpec, engine: EngineKernels) -> str:
    """The GPU preset whose entries in the engine's per-GPU kernel tables apply: the GPU's own where the engine
    measured it, else the part it shares its silicon with (``latency.kernels_as``: H100 PCIe -> H100 SXM). The
    host path of linears outside the CUDA graphs (``linear_host_s_by_gpu``) is the machine's CPU, not the silicon's:
    a part's own entry there is read beside its silicon's other entries (``rates_for``), as are its own measured
    attention-block floors (``dsa_block_floors_by_gpu``: the B300's FlashInfer MLA block beside the B200's kernels)."""
    tables = (engine.moe_efficiency_by_gpu, engine.moe_dequant_ops_by_gpu, engine.moe_k0_by_gpu,
              engine.moe_dequant_per_tile_by_gpu, engine.moe_fused_rows_by_gpu, engine.moe_floors_by_gpu,
              engine.moe_ep_floors_by_gpu, engine.moe_touched_expert_s_by_gpu,
              engine.moe_row_bytes_by_gpu, engine.gdn_efficiency_by_gpu,
              engine.fp8_kv_attention_by_gpu, engine.gemm_memory_efficiency_by_gpu, engine.dynamic_scale_s_by_gpu,
              engine.gemm_efficiency_by_gpu, engine.moe_stream_bits_by_gpu, engine.moe_large_m_memory_by_gpu,
              engine.fp8_kv_prefill_scale_by_gpu, engine.moe_weight_only_by_gpu, engine.moe_by_architecture,
              engine.deepep_moe_by_gpu,
              engine.wide_head_prefill_scale_by_gpu, engine.dsa_prefill_head_tile_by_gpu,
              engine.dsa_prefill_efficiency_by_gpu,
              engine.dsa_prefill_full_topk_by_gpu, engine.v4_prefill_efficiency_by_gpu,
              engine.msa_fp32_expansion_by_gpu,
              engine.moe_ep_every_row_by_gpu, engine.moe_tuned_shapes_by_gpu)
    shared = gpu.latency.kernels_as if gpu.latency is not None else None
    if shared is None or any(gpu.name in t for t in tables) or not any(shared in t for t in tables):
        return gpu.name
    return shared


# --- the deployment: shapes per GPU, built once -------------------------------------------------------------------


@dataclass(frozen=True)
class _Linear:
    """How one weight component's GEMMs run: weight bits/element, tensor-core dtype, weight-only dequant format."""

    bits: float
    compute: str
    dequant: str  # "" (native), or the kernels.DEQUANT_OPS format dequantised on the CUDA cores
    quantised_input: bool  # W8A8: the input is quantised by a kernel of its own (unless fused)
    weights: str = ""  # the storage format's dtype name (fp8_block, fp8_e4m3, mxfp4, ...)
    dynamic_scale: bool = False  # per-tensor fp8 whose input scale is computed per call (a max reduction first)


def float_kind(name: str) -> str:
    """The tensor cores a float weight format runs on natively: "fp8" (fp8 formats; MXFP8, fp8 MMA with block scales
    on Blackwell's tcgen05), "fp4" (MXFP4, NVFP4), "" for any other (16-bit or integer)."""
    if name.startswith("fp8") or name == "mxfp8":
        return "fp8"
    return "fp4" if name in ("mxfp4", "nvfp4") else ""


def linear_mode(dtype: DType, gpu: GPUSpec, choice: str = "auto",
                weight_only: frozenset[str] = frozenset()) -> _Linear:
    """fp8 weights run W8A8 on fp8 tensor cores; fp4 (mxfp4/nvfp4) W4A4 where the chip has fp4; int8 and int4
    weight-only (16-bit MMA + dequantisation) unless ``choice`` names int8; formats the chip cannot run natively
    are dequantised (fp8 on Ampere, fp4 on Hopper), and so are the kinds in ``weight_only`` (an engine kernel that
    keeps 16-bit activations: ``EngineKernels.moe_weight_only_by_gpu``). 16-bit weights run in their own dtype."""
    bits = float(dtype.bits_per_element)
    name = dtype.name
    if not dtype.quantized:
        native = "fp16" if name == "fp16" else ("fp32" if name == "fp32" else "bf16")
        return _Linear(bits, native, "", False, name)
    kind = float_kind(name) or ("int8" if dtype.element_bits >= 8 else "int4")
    peaks = gpu.dense_flops_per_s
    native = kind not in weight_only
    if kind == "fp8" and native and choice in ("auto", "fp8") and "fp8" in peaks:
        return _Linear(bits, "fp8", "", True, name)
    if kind == "fp4" and native and choice in ("auto", "fp4") and "fp4" in peaks:
        return _Linear(bits, "fp4", "", True, name)
    if name == "int8" and native and choice == "int8" and "int8" in peaks:
        return _Linear(bits, "int8", "", True, name)
    return _Linear(bits, "bf16", kind, False, name)


@dataclass(frozen=True)
class _Dims:
    h: int
    vocab: int
    heads: int  # query heads per GPU
    kv_heads: int  # KV heads per GPU (1 for MLA: one latent stream)
    head_dim: int
    kv_bytes_per_token: float  # KV bytes one token adds to one layer's cache on one GPU
    mla: bool
    q_rank: int
    kv_rank: int
    rope: int
    nope: int
    v_dim: int
    gated: bool
    ffn_width: float  # dense FFN intermediate per GPU
    experts: int
    top_k: int
    experts_local: int
    expert_slots: int  # the routed experts over all GPUs: the model's + EPLB's redundant replicas
    expert_width: float  # routed expert intermediate per GPU
    shared_width: float  # shared experts (summed) per GPU
    moe_group: int  # GPUs one MoE layer's experts span (ep when ep > tp, else tp)
    qk_norm: bool
    qk_norm_across_heads: bool
    attention_gate: bool  # q_proj also yields the output gate (Qwen3-Next)
    head_gate: bool  # a g_proj yields one output gate per query head (Step-3.7)
    # Gated DeltaNet layers per GPU (0 heads: none): key / value heads, their dims, one sequence's conv and
    # recurrent state bytes
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    linear_conv_state_bytes: float
    linear_state_bytes: float
    window: int | None
    chunked: bool  # the local layers attend within chunks of ``window`` tokens (Llama 4), not a sliding window
    attn: _Linear
    mlp: _Linear
    experts_mode: _Linear
    shared: _Linear
    head: _Linear
    embedding_bits: float
    # Mamba-2 layers (Nemotron-H) instead of Gated DeltaNet: their scan's chunk
    mamba_chunk: int = 0
    # a latent MoE's width (Nemotron 3 Super): its experts run on it, projected to and from h on every GPU; 0: none
    moe_latent: int = 0
    # its projections' format where it is not the experts' (Kimi K3: bf16, ``shard.latent_dtype``), and whether
    # an RMSNorm runs over the reduced latent (Kimi K3's routed_expert_norm)
    latent_mode: _Linear | None = None
    latent_norm: bool = False
    # Kimi K3's KDA layers (Gated DeltaNet's fields): a decay projection f_a [h, d] (replicated) then f_b [d, P]
    kda: bool = False
    # Kimi K3's attention residuals: the block outputs (and the current block's partial sum) one aggregation reads, as
    # a mean over the layers; 0: none
    attn_res_inputs: float = 0.0
    # DSA (DeepSeek-V3.2, GLM-5): the indexer's heads and head_dim (whole on every GPU), the keys MLA attends at most,
    # one token's indexer key in bytes; 0: no indexer
    index_heads: int = 0
    index_dim: int = 0
    index_topk: int = 0
    index_key_bytes: float = 0.0
    attn_o: _Linear | None = None  # the O projection where a checkpoint stores it apart (None: as ``attn``)
    # DeepSeek-V4 (CSA / HCA): its attention's spec (q LoRA rank, output groups' rank, hyper-connection streams,
    # compression ratios) and its output groups per GPU (one cached entry's bytes in ``kv_bytes_per_token``, the
    # indexer's in ``index_*``); None / 0: another model
    v4: CompressedAttentionSpec | None = None
    v4_o_groups: float = 0.0
    # MiniMax-M3's MSA: its block indexer's heads and head_dim (whole on every GPU); 0: no MSA
    msa_index_heads: int = 0
    msa_index_dim: int = 0


@dataclass(frozen=True)
class _Stage:
    # (full | sliding | linear | shared | none: no mixer, FFN: True MoE / False dense / None none, layers, formats:
    # 0, or the 1-based index of the layers' own weight formats or MLP width in ``Deployment.variants``)
    counts: tuple[tuple[str, bool | None, int, int], ...]
    first: bool
    last: bool


@dataclass(frozen=True, kw_only=True, eq=False)
class Deployment:
    """A model on GPUs with everything a step's cost needs except the batch: build it with ``deployment()``.

    ``dp`` attention replicas share each MoE layer's experts when ep > tp (expert parallelism over data-parallel
    attention, as SGLang/vLLM run DeepSeek); the GPU count is tp x pp x dp.
    """

    spec: ModelSpec
    gpu: GPUSpec
    precision: WeightPrecision
    kv_dtype: DType
    tp: int
    pp: int
    ep: int
    dp: int
    kernels: EngineKernels
    rates_prefill: Rates
    rates_decode: Rates
    intra: Interconnect
    inter: Interconnect
    gpus_per_node: int
    algorithm: str
    routing: kernels.Routing
    nvlink_domain: int  # GPUs one NVLink fabric joins: the node's, or the rack's (GB200 NVL72: 72)
    dims: _Dims = field(repr=False)
    stages: tuple[_Stage, ...] = field(repr=False)
    full_dims: _Dims | None = field(default=None, repr=False)  # full layers of their own shape (Gemma 4)
    # (dims, full_dims) of layers a checkpoint keeps in other formats (``ModelSpec.quantized_weight_exceptions``) or
    # whose dense MLP has a width of its own (``ModelSpec.layer_intermediate_sizes``)
    variants: tuple[tuple[_Dims, _Dims | None], ...] = field(default=(), repr=False)
    graph_cap_tokens: int | None = None  # the largest step replayed from a CUDA graph here (None: any)
    deepep_moe: ArchitectureMoe | None = None  # the experts' kernel in decode-only steps behind DeepEP, if its own

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @functools.cached_property
    def _variant_deployments(self) -> tuple[Deployment, ...]:
        return tuple(replace(self, dims=dims, full_dims=full, variants=()) for dims, full in self.variants)

    def variant(self, index: int) -> Deployment:
        """This deployment for layers of variant ``index`` (0: the model's own formats and MLP width)."""
        return self if index == 0 else self._variant_deployments[index - 1]

    @property
    def widest_head_dim(self) -> int:
        """The model's widest attention head (Gemma 4's global layers': 512): above FlashAttention's 256, engines
        run every layer on a fallback kernel (vLLM Gemma4Config forces TRITON_ATTN)."""
        return max(self.dims.head_dim, self.full_dims.head_dim if self.full_dims is not None else 0)

    def captured(self, shape: StepShape) -> bool:
        """Whether the engine replays ``shape`` from a CUDA graph: a decode-only step (or any, where the engine's
        graphs take prefill tokens: ``EngineKernels.graph_prefill``) of at most ``graph_cap_tokens`` tokens."""
        if shape.prefill_seqs and not self.kernels.graph_prefill:
            return False
        return self.graph_cap_tokens is None or shape.tokens <= self.graph_cap_tokens

    def fabric(self, group_size: int) -> Interconnect:
        """The fabric a collective over ``group_size`` GPUs crosses: NVLink's within its domain, else the network."""
        return self.intra if group_size <= self.nvlink_domain else self.inter

    def shared_experts_beside_routed(self, shape: StepShape, rates: Rates) -> bool:
        """Whether the engine runs the shared experts on a second CUDA stream beside the routed ones in ``shape``:
        on a CUDA GPU, in steps of at most ``shared_experts_stream_max_tokens`` tokens (vLLM) and/or only in steps
        replayed from a CUDA graph (``shared_experts_stream_in_graphs``: TensorRT-LLM)."""
        k = self.kernels
        if not (k.shared_experts_stream_max_tokens or k.shared_experts_stream_in_graphs) or self.gpu.vendor == "AMD":
            return False
        if k.shared_experts_stream_max_tokens and shape.tokens > k.shared_experts_stream_max_tokens:
            return False
        return not k.shared_experts_stream_in_graphs or (rates.cuda_graphs and self.captured(shape))


def _count_in(sorted_layers: tuple[int, ...], lo: int, hi: int) -> int:
    return bisect.bisect_left(sorted_layers, hi) - bisect.bisect_left(sorted_layers, lo)


def _stages(spec: ModelSpec, pp: int, variant_of: dict[int, int] | None = None) -> tuple[_Stage, ...]:
    """Layer kinds (full / sliding / Gated DeltaNet or Mamba-2 / a DSA layer reusing an earlier indexer's choice /
    DeepSeek-V4's CSA and HCA layers, its window-only ones as sliding / none: no mixer) with their FFN (MoE, dense,
    none), weight-format variant (``variant_of``: layer -> index, the others 0) and their counts per pipeline stage,
    from the layer lists: O(lists), not O(L)."""
    every = range(spec.num_layers)
    no_ffn = set(spec.ffn_free_layers)
    dense = (set(spec.moe.dense_layers) if spec.moe is not None else set(every)) - no_ffn
    moe = set(every) - dense - no_ffn
    si, ca = spec.sparse_indexer, spec.compressed_attention
    msa = set(si.layers) if si is not None and si.kind == "minimax_m3" else set()
    if si is not None and si.kind != "dsa":  # MiniMax-M3's MSA: its own kind, priced as dense GQA attention where
        si = None                            # the engine runs no FP32-expansion path (docs/calculator.md)
    compressed = {"csa": set(ca.csa_layers), "hca": set(ca.hca_layers)} if ca is not None else {}
    kinds = {**compressed,
             "sliding": (set(spec.sliding_window_layers) if spec.sliding_window is not None else set()) - set().union(
                 *compressed.values()),
             "linear": set(spec.linear_attention.layers) if spec.linear_attention is not None else set(),
             "shared": set(every) - set(si.layers) if si is not None else set(),
             "none": set(spec.mixer_free_layers)}
    kinds["full"] = set(every) - set().union(*kinds.values())
    kinds["msa"] = kinds["full"] & msa  # MiniMax-M3's MSA layers: full attention but for an engine's MSA path
    kinds["full"] -= msa
    ffns: dict[bool | None, set[int]] = {False: dense, True: moe, None: no_ffn}
    variant_of = variant_of or {}
    variants: dict[int, set[int]] = {0: set(every) - set(variant_of)}
    for layer, index in variant_of.items():
        variants.setdefault(index, set()).add(layer)
    lists = {(kind, ffn, v): tuple(sorted(layers & of & in_v)) for kind, layers in kinds.items()
             for ffn, of in ffns.items() for v, in_v in variants.items()}
    out = []
    ranges = stage_layers(spec.num_layers, pp)
    for s, r in enumerate(ranges):
        counts = [(kind, ffn, _count_in(layers, r.start, r.stop), v) for (kind, ffn, v), layers in lists.items()]
        out.append(_Stage(tuple(c for c in counts if c[2] > 0), s == 0, s == len(ranges) - 1))
    return tuple(out)


def _format_variants(spec: ModelSpec, precision: WeightPrecision
                     ) -> tuple[dict[int, int], list[tuple[WeightPrecision, WeightPrecision | None]]]:
    """The layers a checkpoint keeps in other formats (``quantized_weight_exceptions`` that apply to
    ``precision``, as ``calc.shard.exception_deltas`` applies them): layer -> 1-based variant, and each variant's
    precision with, where its O projection is stored apart from the other attention projections, the O's. An
    exception naming modules moves the O projection where it names o_proj, and the other projections (or an MLP)
    where the modules it names hold at least half of their parameters."""
    changes: dict[int, dict[str, DType]] = {}
    for x in spec.quantized_weight_exceptions:
        for component in x.components:
            if not exception_applies(x, precision.for_component(component)):
                continue
            moved = [component, "attention.o"] if component == "attention" else [component]
            if x.modules:
                moved = [key for key, held in _module_shares(spec, component, x.modules).items() if held >= 0.5]
            for layer in x.layers:
                changes.setdefault(layer, {}).update(dict.fromkeys(moved, get_dtype(x.dtype)))
    signatures: dict[tuple[tuple[str, str], ...], int] = {}
    variant_of: dict[int, int] = {}
    variants: list[tuple[WeightPrecision, WeightPrecision | None]] = []

    def with_formats(change: dict[str, DType]) -> WeightPrecision:
        kept = tuple((c, d) for c, d in precision.per_component if c not in change)
        return WeightPrecision(precision.default, kept + tuple(sorted(change.items())))

    for layer, change in sorted(changes.items()):
        key = tuple(sorted((c, d.name) for c, d in change.items()))
        if key not in signatures:
            signatures[key] = len(variants) + 1
            rest = {c: d for c, d in change.items() if c != "attention.o"}
            o = change.get("attention.o", precision.for_component("attention"))  # unmoved: the chosen format
            main = with_formats(rest)
            apart = o.name != main.for_component("attention").name
            variants.append((main, with_formats({**rest, "attention": o}) if apart else None))
        variant_of[layer] = signatures[key]
    return variant_of, variants


def _layer_variants(spec: ModelSpec, precision: WeightPrecision
                    ) -> tuple[dict[int, int], list[tuple[WeightPrecision, WeightPrecision | None, int | None]]]:
    """``_format_variants`` split further by dense MLP width where the layers' widths differ (DeciLM's
    ``layer_intermediate_sizes``): layer -> 1-based variant, and each variant's formats and MLP width (None: the
    model's intermediate_size)."""
    variant_of, formats = _format_variants(spec, precision)
    if not spec.layer_intermediate_sizes:
        return variant_of, [(main, o, None) for main, o in formats]
    keys: dict[tuple[int, int], int] = {}
    split: dict[int, int] = {}
    variants: list[tuple[WeightPrecision, WeightPrecision | None, int | None]] = []
    for layer in range(spec.num_layers):
        key = (variant_of.get(layer, 0), spec.ffn_width(layer) or spec.intermediate_size)
        if key == (0, spec.intermediate_size):
            continue
        if key not in keys:
            keys[key] = len(variants) + 1
            main, o = formats[key[0] - 1] if key[0] else (precision, None)
            variants.append((main, o, key[1]))
        split[layer] = keys[key]
    return split, variants


def _module_shares(spec: ModelSpec, component: str, modules: tuple[str, ...]) -> dict[str, float]:
    """The share of a component's parameters (the attention's apart from its O projection, "attention.o": the O
    projection's) that ``modules`` hold."""
    if component != "attention":
        every = ffn_modules(spec, spec.intermediate_size, spec.mlp_bias)
        total = sum(x.total().total for x in every.values())
        return {component: sum(every[m].total().total for m in modules if m in every) / total if total else 0.0}
    every = {**attention_modules(spec), **indexer_modules(spec)}
    kv_heads = spec.num_kv_heads if spec.mla is None else 0
    rest = {m: x.total(kv_heads).total for m, x in every.items() if m not in ("o_proj", "sinks")}
    total = sum(rest.values())
    return {"attention": sum(rest.get(m, 0) for m in modules) / total if total else 0.0,
            "attention.o": 1.0 if "o_proj" in modules else 0.0}


PER_TENSOR_FP8 = ("fp8_e4m3", "fp8_e5m2")
# Formats whose kernels unpack a whole weight matrix to 16 bits before multiplying: bitsandbytes' matmul_4bit
# runs a fused GEMV for one token row only (else F.dequantize_4bit, then a 16-bit GEMM), and vLLM's
# BitsAndBytesMoEMethod unpacks every resident expert each step before its fused-MoE kernel.
DEQUANTISED_FIRST = frozenset({"nf4"})
FLASH_MAX_HEAD_DIM = 256  # FlashAttention 2 / 3's widest head (vLLM Gemma4Config: "head_size <= 256 kernel limit")
FP8_SCALE_CHOICES = ("auto", "static", "dynamic")


def stored_format(spec: ModelSpec, precision: WeightPrecision, component: str) -> bool:
    """Whether ``component`` is served in the format its checkpoint stores (not re-quantised by the engine)."""
    return parse_weight_precision(spec.native_dtype).for_component(component).name == \
        precision.for_component(component).name


def fp8_input_scale(spec: ModelSpec, precision: WeightPrecision, component: str, engine: EngineKernels,
                    choice: str = "auto") -> str:
    """How a component's per-tensor fp8 linears scale their inputs: ``choice`` unless auto; else the checkpoint's
    declaration where the format is the checkpoint's own (undeclared: static), and the engine's online-quantisation
    scheme where the engine quantises a 16-bit checkpoint itself (``EngineKernels.online_fp8_scale``)."""
    if choice != "auto":
        return choice
    if stored_format(spec, precision, component):
        return spec.checkpoint_activation_scale or "static"
    return engine.online_fp8_scale


def _dims(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, tp: int, ep: int,
          compute: str, engine: EngineKernels, fp8_scales: str = "auto", redundant_experts: int = 0,
          raw_sparse_latent: bool = False, recurrent_state_rule: str = "checkpoint") -> _Dims:
    h = spec.hidden_size
    heads = spec.num_attention_heads // tp
    if spec.mla is not None:
        m = spec.mla
        kv_heads, head_dim = 1, m.qk_head_dim
        kv_elements = m.latent_elements_per_token_per_layer
        q_rank, kv_rank, rope, nope, v_dim = (m.q_lora_rank or 0), m.kv_lora_rank, m.qk_rope_head_dim, \
            m.qk_nope_head_dim, m.v_head_dim
    else:
        kv_heads, head_dim = max(spec.num_kv_heads // tp, 1), spec.head_dim
        v_dim = spec.value_head_dim
        kv_elements = kv_heads * spec.head_kv_elements
        q_rank = kv_rank = rope = nope = 0
    experts = top_k = experts_local = 0
    expert_width = shared_width = 0.0
    moe_group = tp
    if spec.moe is not None:
        moe = spec.moe
        experts, top_k = moe.num_experts, moe.experts_per_token
        experts_local = (experts + redundant_experts) // ep
        if ep >= tp:
            expert_width = float(moe.expert_intermediate_size) if ep > 1 else moe.expert_intermediate_size / tp
            moe_group = max(ep, tp)
        else:
            expert_width = moe.expert_intermediate_size * ep / tp
        shared_width = moe.num_shared_experts * moe.shared_expert_intermediate_size / tp
    kernels_gpu = engine_kernels_gpu(gpu, engine)
    weight_only = engine.moe_weight_only_by_gpu.get(kernels_gpu, frozenset())
    arch_kernel = engine.moe_by_architecture.get(kernels_gpu, {}).get(spec.architecture or "")
    if arch_kernel is not None:  # the architecture's own fused MoE there (vLLM's Marlin experts for Kimi K3)
        weight_only = weight_only | arch_kernel.weight_only
    la = spec.linear_attention
    served = precision.default  # a float32 checkpoint served in 16 bits keeps its states in them too
    conv_dtype, state_dtype = state_dtypes(spec, served.name if served.name in ("bf16", "fp16") else None,
                                           recurrent_state_rule)

    def mode(component: str) -> _Linear:
        kinds = weight_only if component == "experts" else frozenset()
        if component in spec.checkpoint_weight_only and stored_format(spec, precision, component):
            kinds = kinds | {"fp8", "fp4"}  # float weights beside 16-bit activations (W4A16 NVFP4, W8A16 FP8)
        linear = linear_mode(precision.for_component(component), gpu, compute, kinds)
        if linear.quantised_input and linear.weights in PER_TENSOR_FP8 and \
                fp8_input_scale(spec, precision, component, engine, fp8_scales) == "dynamic":
            return replace(linear, dynamic_scale=True)
        return linear

    si, ca = spec.sparse_indexer, spec.compressed_attention
    msa = {"msa_index_heads": si.num_heads, "msa_index_dim": si.head_dim} if si is not None and \
        si.kind == "minimax_m3" else {}
    if si is not None and si.kind != "dsa":  # MiniMax-M3's MSA: its K/V read densely, its index keys not priced
        si = None
    # the cache one token adds to a layer and DSA's indexer; DeepSeek-V4's entry, indexer and layer shape instead
    cache: dict[str, float | int | CompressedAttentionSpec] = {
        "index_heads": si.num_heads if si else 0, "index_dim": si.head_dim if si else 0,
        "index_topk": si.topk if si else 0, "index_key_bytes": float(indexer_key_bytes(spec)),
        "kv_bytes_per_token": float(kv_layer_bytes(spec, kv_dtype, sliding=False, record=not raw_sparse_latent))
        if si is not None
        else float(kv_dtype.bits_per_element) * kv_elements / 8}
    if ca is not None:
        cache = {"v4": ca, "v4_o_groups": ca.o_groups / tp,
                 "kv_bytes_per_token": float(compressed_entry_bytes(spec, kv_dtype)), "index_heads": ca.index_heads,
                 "index_dim": ca.index_head_dim, "index_topk": ca.index_topk,
                 "index_key_bytes": float(compressed_indexer_bytes(spec, kv_dtype))}
    return _Dims(h=h, vocab=spec.vocab_size // tp, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                 mla=spec.mla is not None,
                 q_rank=q_rank, kv_rank=kv_rank, rope=rope, nope=nope, v_dim=v_dim, gated=spec.ffn_kind == "gated",
                 ffn_width=spec.intermediate_size / tp, experts=experts, top_k=top_k, experts_local=experts_local,
                 expert_slots=experts + redundant_experts,
                 expert_width=expert_width, shared_width=shared_width, moe_group=moe_group,
                 qk_norm=spec.qk_norm or spec.qk_l2_norm,
                 qk_norm_across_heads=spec.qk_norm_across_heads, attention_gate=spec.attention_output_gate,
                 head_gate=spec.attention_head_gate,
                 linear_key_heads=la.num_key_heads // tp if la else 0,
                 linear_value_heads=la.num_value_heads // tp if la else 0,
                 linear_key_dim=la.key_head_dim if la else 0, linear_value_dim=la.value_head_dim if la else 0,
                 linear_conv_state_bytes=float(conv_dtype.bytes_for(la.conv_state_elements // tp)) if la else 0.0,
                 linear_state_bytes=float(state_dtype.bytes_for(la.recurrent_state_elements // tp)) if la else 0.0,
                 window=spec.sliding_window, chunked=spec.chunked_attention, attn=mode("attention"), mlp=mode("mlp"),
                 experts_mode=mode("experts"),
                 shared=mode("shared_experts"),
                 head=mode("embedding" if spec.tie_word_embeddings else "lm_head"),
                 embedding_bits=float(precision.for_component("embedding").bits_per_element),
                 **cache, **msa,
                 mamba_chunk=la.chunk_size if la is not None and la.kind == "mamba2" else 0,
                 moe_latent=spec.moe.latent_size if spec.moe is not None else 0,
                 latent_mode=linear_mode(latent_dtype(spec, precision), gpu)
                 if spec.moe is not None and spec.moe.latent_16_bit else None,
                 latent_norm=spec.moe is not None and spec.moe.latent_norm and bool(spec.moe.latent_size),
                 kda=la is not None and la.kind == "kda", attn_res_inputs=_attn_res_inputs(spec))


def _attn_res_inputs(spec: ModelSpec) -> float:
    """Inputs one attention-residual aggregation reads, averaged over the layers: the blocks of
    ``attention_residual_block`` layers completed before the layer plus the current block's partial sum (Kimi K3;
    SGLang kimi_k3.py AttnResidual / aggregate_stream); 0 for a model without them."""
    block, n = spec.attention_residual_block, spec.num_layers
    return sum(layer // block + 1 for layer in range(n)) / n if block else 0.0


def deployment(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, *, tp: int = 1,
               pp: int = 1, ep: int = 1, engine_kernels: EngineKernels | None = None,
               interconnect: Interconnect | None = None, inter_node: Interconnect | None = None,
               gpus_per_node: int = 8, algorithm: str | None = None, compute: str = "auto",
               cuda_graphs: bool | None = None, rates_prefill: Rates | None = None,
               rates_decode: Rates | None = None, routing: kernels.Routing = kernels.UNIFORM,
               fp8_scales: str = "auto", redundant_experts: int = 0, raw_sparse_latent: bool = False,
               recurrent_state_rule: str = "checkpoint") -> Deployment:
    """Validate the parallelism and precompute per-GPU shapes. ``ep > tp`` makes ep / tp data-parallel attention
    replicas; ``engine_kernels`` is the engine's kernel behaviour (an ``EngineSpec.kernels``; default
    ``EngineKernels()``); ``interconnect`` defaults to the GPU preset's fabric, ``inter_node`` to InfiniBand NDR;
    ``routing`` is how MoE tokens pick experts (uniform, Zipf or power-law: ``kernels.Routing``); ``fp8_scales``
    how per-tensor fp8 linears scale their inputs (auto, static, dynamic: ``fp8_input_scale``);
    ``redundant_experts``: EPLB's replicas, spread with the experts over ep (``shard``), the tokens over every
    slot; ``raw_sparse_latent``: an 8-bit DSA cache read as the raw latent, not FlashMLA's record
    (``calc.engine.sparse_mla_raw``); ``recurrent_state_rule``: the format of Mamba / Gated DeltaNet states
    (``calc.engine.recurrent_state_rule``)."""
    from tfcalc.spec.interconnect import load_interconnect

    if compute not in COMPUTE_CHOICES:
        raise UsageError(f"unknown compute dtype '{compute}' (choose {', '.join(COMPUTE_CHOICES)})")
    if fp8_scales not in FP8_SCALE_CHOICES:
        raise UsageError(f"unknown fp8 input scaling '{fp8_scales}' (choose {', '.join(FP8_SCALE_CHOICES)})")
    if min(tp, pp, ep) < 1:
        raise UsageError("tp, pp and ep must be positive")
    dp = attention_ranks(tp, ep)
    if ep > tp and ep % tp:
        raise UsageError(f"ep {ep} must divide tp {tp} or be a multiple of it")
    check_weight_blocks(spec, check_parallelism(spec, tp * pp * dp, tp, pp, ep, redundant_experts), precision)
    engine = engine_kernels or EngineKernels()
    if interconnect is None:
        name = gpu.latency.interconnect_preset if gpu.latency is not None else None
        interconnect = load_interconnect(name) if name else _generic_link(gpu)
    inter_node = inter_node or load_interconnect("infiniband-ndr")
    base = rates_for(gpu, engine, cuda_graphs, spec.architecture, has_experts=spec.moe is not None)
    measured = (rates_decode or rates_prefill or base).collectives
    if measured is not None:  # a calibration's measured link replaces the intra-node fabric's NCCL link
        interconnect = replace(interconnect, nccl=comm.calibrated_link(measured, interconnect.nccl),
                               nccl_efficiency_by_gpus=())
    domain = max(gpus_per_node, gpu.nvlink_domain_gpus or 0)  # the GPUs one NVLink fabric joins
    variant_of, variant_precisions = _layer_variants(spec, precision)

    def dims_of(p: WeightPrecision, o: WeightPrecision | None = None, width: int | None = None
                ) -> tuple[_Dims, _Dims | None]:
        formats = (raw_sparse_latent, recurrent_state_rule)
        dims = _dims(spec, gpu, p, kv_dtype, tp, ep, compute, engine, fp8_scales, redundant_experts, *formats)
        if o is not None:  # the O projection stored apart from the other attention projections
            dims = replace(dims, attn_o=_dims(spec, gpu, o, kv_dtype, tp, ep, compute, engine, fp8_scales,
                                              redundant_experts, *formats).attn)
        if width is not None:  # a layer's own dense MLP width (DeciLM)
            dims = replace(dims, ffn_width=width / tp)
        return (dims, _dims(spec.full_layer_spec, gpu, p, kv_dtype, tp, ep, compute, engine, fp8_scales,
                            redundant_experts, *formats) if spec.full_attention is not None else None)

    own = dims_of(precision)
    return Deployment(spec=spec, gpu=gpu, precision=precision, kv_dtype=kv_dtype, tp=tp, pp=pp, ep=ep, dp=dp,
                      kernels=engine, rates_prefill=rates_prefill or base, rates_decode=rates_decode or base,
                      intra=interconnect, inter=inter_node, gpus_per_node=gpus_per_node,
                      nvlink_domain=domain,
                      algorithm=algorithm or interconnect.algorithm, routing=routing,
                      dims=own[0], full_dims=own[1],
                      stages=_stages(spec, pp, variant_of), variants=tuple(dims_of(*v) for v in variant_precisions),
                      graph_cap_tokens=engine.graph_token_cap(capacity_bytes(gpu) / 2**30, tp),
                      deepep_moe=_deepep_kernel(gpu, engine, dp, ep, domain))


def _deepep_kernel(gpu: GPUSpec, engine: EngineKernels, dp: int, ep: int, domain: int) -> ArchitectureMoe | None:
    """The engine's experts' kernel behind DeepEP on this GPU (``EngineKernels.deepep_moe_by_gpu``), where
    DeepEP brings the tokens: data-parallel attention ranks on an ``all_to_all`` engine, or on an ``allgather`` one
    beyond its NVLink domain."""
    deepep = dp > 1 and (engine.ep_dispatch == "all_to_all" or (engine.ep_dispatch == "allgather" and ep > domain))
    return engine.deepep_moe_by_gpu.get(engine_kernels_gpu(gpu, engine)) if deepep else None


@lru_cache(maxsize=256)
def _with_moe_kernel(rates: Rates, kernel: ArchitectureMoe) -> Rates:
    """``rates`` with ``kernel`` as the experts' kernel for the formats it covers: its efficiency, fixed cost,
    weight stream and row width in place of the default fused MoE's, and none of that kernel's tuned shapes,
    per-expert-parallel floors or every-row traffic."""
    own = set(kernel.efficiency)
    return replace(rates, moe_efficiency_by_dtype={**rates.moe_efficiency_by_dtype, **kernel.efficiency},
                   moe_format_floors={**rates.moe_format_floors, **kernel.floors_s},
                   moe_weight_stream={**rates.moe_weight_stream, **kernel.memory_efficiency},
                   moe_fused_rows=rates.moe_fused_rows | kernel.fused_rows,
                   moe_ep_every_row=frozenset(rates.moe_ep_every_row - own) | kernel.ep_every_row,
                   moe_ep_floors={k: v for k, v in rates.moe_ep_floors.items() if k not in own},
                   moe_touched_expert={k: v for k, v in rates.moe_touched_expert.items() if k not in own},
                   moe_tuned_shapes={k: v for k, v in rates.moe_tuned_shapes.items() if k not in own},
                   source=rates.source + f", {'/'.join(sorted(own))} experts behind DeepEP at the engine's kernel")


def _generic_link(gpu: GPUSpec) -> Interconnect:
    """A GPU without an interconnect preset: its datasheet link with NVLink-4's measured NCCL behaviour."""
    from tfcalc.spec.interconnect import Interconnect as _Interconnect
    from tfcalc.spec.interconnect import Link

    link = Link(name=gpu.interconnect or "link", bandwidth_bytes_per_s=gpu.interconnect_bandwidth_bytes_per_s,
                efficiency=0.78, step_latency_s=0.87e-6, launch_s=4.6e-6, source="generic (nvlink4 NCCL fit)")
    return _Interconnect(name="generic", display_name=gpu.interconnect or "generic", nccl=link, algorithm="ring")


# --- one step ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StepShape:
    """The work of one scheduler step on one attention replica.

    ``decode_seqs`` sequences each decode one token with ``decode_context`` cached tokens (the new one included;
    a mean over sequences is exact for the KV traffic); ``prefill_seqs`` sequences each prefill ``prefill_tokens``
    new tokens after ``prefill_past`` already cached ones (a chunk of a longer prompt when past > 0).
    ``decode_span``: the decoding contexts spread evenly over decode_context +- span / 2 (a static batch's whole
    generation; a serving batch's mix). Only chunked layers read it, whose keys fall back to 1 at each chunk's start:
    their keys are averaged over that spread (exact where the step's time is affine in context, as elsewhere).
    """

    decode_seqs: int = 0
    decode_context: float = 0.0
    decode_span: float = 0.0
    prefill_seqs: int = 0
    prefill_tokens: int = 0
    prefill_past: int = 0

    @property
    def tokens(self) -> int:
        return self.decode_seqs + self.prefill_seqs * self.prefill_tokens

    @property
    def sampled(self) -> int:
        return self.decode_seqs + self.prefill_seqs


@dataclass(slots=True)
class _Acc:
    seconds: float = 0.0
    floor_seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    peak_compute_seconds: float = 0.0  # FLOPs / dense peak of their dtype: the pure roofline's compute time
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0
    ideal_bytes: float = 0.0
    comm_bytes: float = 0.0
    comm_ideal_seconds: float = 0.0
    kernels: int = 0
    by_bound: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class GroupTime:
    """One op group of a step (attention, dense_ffn, moe, lm_head, communication)."""

    seconds: float
    floor_seconds: float  # the kernels' fixed costs (and collective latencies) included in ``seconds``
    flops: float
    bytes: float
    kernels: int
    bound: str  # what most of the time was spent bound by: compute | memory | dequant | floor | latency | bandwidth


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """One step of one microbatch through every pipeline stage on one attention replica."""

    seconds: float
    stage_seconds: tuple[float, ...]
    p2p_seconds: float  # per stage boundary
    groups: dict[str, GroupTime]
    flops: float
    bytes: float  # every kernel's traffic
    ideal_bytes: float  # compulsory traffic (weights, KV read and written, hidden states, logits): the roofline's
    weight_bytes: float  # the part of ``bytes`` that is weights
    kv_read_bytes: float  # the part that is the KV cache read by attention
    comm_bytes: float
    ideal_seconds: float  # pure roofline: max(sum FLOPs / peak, sum bytes / HBM) + comm bytes / link bandwidth
    ideal_compute_seconds: float
    ideal_memory_seconds: float
    tp_comm_seconds: float
    ep_comm_seconds: float

    @property
    def bound(self) -> str:
        """The phase-level roofline verdict (compute- or memory-bound), as the pure roofline states it."""
        return "compute" if self.ideal_compute_seconds >= self.ideal_memory_seconds else "memory"


class _Step:
    """Accumulates priced kernels into groups (one instance per step evaluation)."""

    __slots__ = ("rates", "groups", "mult", "tp_comm", "ep_comm", "memo", "inverse_peak")

    def __init__(self, rates: Rates) -> None:
        self.rates = rates
        self.groups = {g: _Acc() for g in GROUPS}
        self.mult = 1
        self.tp_comm = 0.0
        self.ep_comm = 0.0
        self.memo: dict[tuple, tuple] = {}  # identical collectives within the step are priced once
        self.inverse_peak: dict[str, float] = {}

    def add(self, group: str, cost: Cost, compute: str = "bf16") -> None:
        seconds, flops, nbytes, bound, count, floor, weights, ideal = cost
        if count == 0 and seconds == 0:
            return
        acc, k = self.groups[group], self.mult
        acc.seconds += k * seconds
        acc.flops += k * flops
        acc.bytes += k * nbytes
        acc.weight_bytes += k * weights
        acc.ideal_bytes += k * ideal
        if flops:
            inverse = self.inverse_peak.get(compute)
            if inverse is None:
                inverse = self.inverse_peak[compute] = 1 / self.rates.peak(compute)[1]
            acc.peak_compute_seconds += k * flops * inverse
        acc.kernels += k * count
        acc.floor_seconds += k * floor
        by = acc.by_bound
        by[bound] = by.get(bound, 0.0) + k * seconds

    def add_comm(self, t: comm.CommTime, link_bandwidth: float, kind: str) -> None:
        if t.seconds == 0:
            return
        acc, k = self.groups["communication"], self.mult
        acc.seconds += k * t.seconds
        acc.comm_bytes += k * t.bytes_per_gpu
        acc.comm_ideal_seconds += k * t.bytes_per_gpu / link_bandwidth
        latency = t.seconds - t.bytes_per_gpu / link_bandwidth if t.bytes_per_gpu else t.seconds
        acc.floor_seconds += k * max(min(latency, t.seconds), 0.0)
        acc.kernels += k
        bound = "latency" if latency > t.seconds / 2 else "bandwidth"
        acc.by_bound[bound] = acc.by_bound.get(bound, 0.0) + k * t.seconds
        if kind == "tp":
            self.tp_comm += k * t.seconds
        elif kind == "ep":
            self.ep_comm += k * t.seconds


def _all_reduce(d: Deployment, nbytes: float, n: int, ideal: bool,
                memo: dict | None = None) -> tuple[comm.CommTime, float]:
    """(time, the link's datasheet bandwidth) of an all-reduce over ``n`` GPUs inside a forward: NCCL, or the engine's
    one- or two-shot custom kernel below its size limit (vLLM / SGLang: 8 MiB) when that is faster, plus the fabric's
    synchronisation per peer (``Interconnect.forward_sync_s_per_peer``)."""
    if memo is not None:
        key = ("all_reduce", nbytes, n, ideal)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = _all_reduce(d, nbytes, n, ideal)
        return hit
    fabric = d.fabric(n)
    link = fabric.nccl_for(n, ideal)  # the ring's bandwidth over n GPUs (PCIe: falls with n, Interconnect.nccl_for)
    algorithm = d.algorithm if fabric is d.intra else fabric.algorithm
    best = comm.all_reduce(nbytes, n, link, algorithm)
    engine = d.kernels
    kernel = engine.custom_allreduce_on(fabric, nbytes, n)
    if not ideal and kernel is not None and best.seconds > 0 and nbytes < engine.custom_allreduce_max_bytes:
        tokens = nbytes / (d.dims.h * ACT_BYTES)
        custom = comm.custom_all_reduce(nbytes, n, kernel, engine.one_shot_allreduce(nbytes, n, tokens))
        # the pure roofline counts the bytes an all-reduce must move (a ring's), whichever kernel runs
        custom = replace(custom, bytes_per_gpu=2 * (n - 1) / n * nbytes)
        if custom.seconds < best.seconds:
            best = custom
    if not ideal and n > 1 and fabric.forward_sync_s_per_peer:  # the ranks meet: per peer, inside a forward
        best = replace(best, seconds=best.seconds + (n - 1) * fabric.forward_sync_s_per_peer)
    return best, link.bandwidth_bytes_per_s


def _elementwise_group(s: _Step, group: str, nbytes: float, kernels_count: int = 1, ideal_bytes: float = 0.0) -> None:
    s.add(group, kernels.elementwise(s.rates, nbytes, kernels=kernels_count, ideal_bytes=ideal_bytes))


def _gemm(s: _Step, group: str, m: float, n: float, k: float, mode: _Linear, engine: EngineKernels,
          in_block: bool = False, after: str = "norm") -> None:
    """One linear layer (and its input quantisation); ``in_block``: a projection of a fused attention block (MLA),
    which runs as one module with it, never outside the CUDA graphs on its own; ``after``: the kind of kernel its
    input comes from (``QUANT_PLACES``), which may quantise it (``EngineKernels.fuses_input_quant``)."""
    if m <= 0 or n <= 0 or k <= 0:
        return
    r = s.rates
    if mode.weights in DEQUANTISED_FIRST and m > 1 and not r.ideal:  # the whole matrix to 16 bits, then a GEMM
        _elementwise_group(s, group, n * k * (mode.bits / 8 + ACT_BYTES))
        mode = _Linear(16.0, "bf16", "", False, "bf16")
    cost = kernels.gemm(r, m, n, k, mode.bits, mode.compute, dequant=mode.dequant, weight_format=mode.weights)
    s.add(group, cost, mode.compute)
    seconds = cost.seconds
    if mode.quantised_input and (mode.dynamic_scale or not engine.fuses_input_quant(mode.weights, after)):
        # the cast; a dynamic scale is known only after its reduction, so no norm before it can fuse the cast
        quant = kernels.elementwise(r, m * k * (ACT_BYTES + mode.bits / 8))
        s.add(group, quant)
        seconds += quant.seconds
    if mode.dynamic_scale:
        scale = kernels.dynamic_scale(r, m, k, ACT_BYTES)
        s.add(group, scale)
        seconds += scale.seconds
    if r.linear_host and not in_block:  # a linear run outside the CUDA graphs lasts at least its host path
        host = r.linear_host_s(mode.weights, m)
        if host > seconds:
            s.add(group, kernels.Cost(host - seconds, 0.0, 0.0, "floor", 0, host - seconds))


def _attention_layer(s: _Step, d: Deployment, shape: StepShape, sliding: bool, own_indexer: bool = True,
                     msa: bool = False) -> None:
    acc = s.groups["attention"]
    floors_before, seconds_before = acc.floor_seconds, acc.seconds
    _attention_kernels(s, d, shape, sliding, own_indexer, msa)
    floors = s.rates.dsa_block_floors
    if msa and not s.rates.ideal and (floors.get("msa_prefill") or floors.get("msa_decode")):
        # MiniMax-M3's MSA block where the engine measured its fixed cost per layer (TensorRT-LLM's, both paths), as
        # DSA's block floors: a prefill lasts max(fixed cost, its kernels' time), in decode the fixed cost replaces
        # the kernels' floors where larger
        hidden = (acc.seconds - seconds_before) if shape.prefill_seqs else (acc.floor_seconds - floors_before)
        _block_floor(s, acc, shape, floors.get("msa_prefill", 0.0), floors.get("msa_decode", 0.0), hidden)
    if d.dims.mla and not s.rates.ideal and acc.seconds > seconds_before:
        # an engine's measured fixed cost of its fused MLA block replaces the sum of its kernels' floors if larger;
        # a DSA model's whole attention block (indexer included) has its own, per GPU; in a prefill the work hides it,
        # the block lasting max(fixed cost, its kernels' time) (the engines' DSA context tables: flat, then linear
        # from the fixed cost's level), in decode it adds (their generation tables: fixed cost + a slope)
        dsa = floors if d.dims.index_topk and "decode" in floors else {}
        # the GPU's own MLA block where the engine runs another backend there (vLLM: FlashInfer MLA on Blackwell)
        blocks = ({"mla_prefill": dsa["prefill"], "mla_decode": dsa["decode"]} if dsa else
                  {k: floors.get(k, v) for k, v in d.kernels.block_floors_s.items()})
        hidden = (acc.seconds - seconds_before) if dsa and shape.prefill_seqs else (acc.floor_seconds - floors_before)
        _block_floor(s, acc, shape, blocks.get("mla_prefill", 0.0), blocks.get("mla_decode", 0.0), hidden)


def _block_floor(s: _Step, acc: _Acc, shape: StepShape, prefill_s: float, decode_s: float,
                 hidden: float) -> None:
    """A fused block's measured fixed cost per layer (the larger of its phases in the step) in place of ``hidden``,
    the part of its kernels' time it covers, where larger: the difference is added as floor time."""
    block = max(prefill_s if shape.prefill_seqs else 0.0, decode_s if shape.decode_seqs else 0.0)
    extra = s.mult * block - hidden
    if extra > 0:
        acc.seconds += extra
        acc.floor_seconds += extra
        acc.by_bound["floor"] = acc.by_bound.get("floor", 0.0) + extra


def _attention_kernels(s: _Step, d: Deployment, shape: StepShape, sliding: bool, own_indexer: bool = True,
                       msa: bool = False) -> None:
    dm = d.dims if sliding or d.full_dims is None else d.full_dims
    r, eng = s.rates, d.kernels
    m = shape.tokens
    h = dm.h
    window = dm.window if sliding else None
    # fused residual add + RMSNorm: read 2, write 2 (the pure roofline's hidden-state traffic of the layer)
    _elementwise_group(s, "attention", 4 * m * h * ACT_BYTES, ideal_bytes=4 * m * h * ACT_BYTES)
    if not dm.mla:
        q, kv, kv_v = dm.heads * dm.head_dim, dm.kv_heads * dm.head_dim, dm.kv_heads * dm.v_dim
        gates = q if dm.attention_gate else dm.heads if dm.head_gate else 0  # Qwen3-Next: per channel; Step: per head
        _gemm(s, "attention", m, q + gates + kv + kv_v, h, dm.attn, eng)
        if dm.qk_norm:
            _elementwise_group(s, "attention", 2 * m * (q + kv) * ACT_BYTES)
        # rotary on q and k, then the KV-cache write
        _elementwise_group(s, "attention", 2 * m * (q + kv) * ACT_BYTES + m * ((kv + kv_v) * ACT_BYTES)
                           + m * dm.kv_bytes_per_token, kernels_count=2, ideal_bytes=m * dm.kv_bytes_per_token)
        qk_dim, v_dim = dm.head_dim, dm.v_dim
    else:
        q_out = dm.heads * (dm.nope + dm.rope)
        # Kimi K3's output gate g [h, heads x v_dim] rides in the same GEMM, its heads split by tp (vLLM kimi_k3
        # mla.py fused_qkv_a_g_proj, KimiK3MergedQKVGateLinear)
        gate = dm.heads * dm.v_dim if dm.attention_gate else 0
        if dm.q_rank:
            # fused q_a + kv_a
            _gemm(s, "attention", m, dm.q_rank + dm.kv_rank + dm.rope + gate, h, dm.attn, eng, in_block=True)
            _elementwise_group(s, "attention", 2 * m * (dm.q_rank + dm.kv_rank) * ACT_BYTES, kernels_count=2)
            _gemm(s, "attention", m, q_out, dm.q_rank, dm.attn, eng, in_block=True)
        else:
            _gemm(s, "attention", m, q_out + dm.kv_rank + dm.rope + gate, h, dm.attn, eng, in_block=True)
            _elementwise_group(s, "attention", 2 * m * dm.kv_rank * ACT_BYTES)
        _elementwise_group(s, "attention", 2 * m * (q_out + dm.rope) * ACT_BYTES + m * dm.kv_bytes_per_token,
                           kernels_count=2, ideal_bytes=m * dm.kv_bytes_per_token)  # rotary + latent cache write
        qk_dim, v_dim = dm.nope + dm.rope, dm.v_dim
    # attention proper
    kvb = dm.kv_bytes_per_token
    fp8_cache = not dm.mla and d.kv_dtype.name in ("fp8_e4m3", "fp8_e5m2")
    dsa = dm.index_topk > 0
    expand = r.msa_fp32_expansion if msa and not r.ideal else {}
    if dsa:
        _indexer(s, d, shape, own_indexer)
    if shape.prefill_seqs and shape.prefill_tokens and dsa and not _dense_prefill(d, shape):
        _sparse_mla_prefill(s, d, shape)
    elif shape.prefill_seqs and shape.prefill_tokens and expand:
        n, p = shape.prefill_tokens, shape.prefill_past
        s.groups["attention"].kv_bytes += s.mult * shape.prefill_seqs * p * kvb
        s.add("attention", _msa_expansion(r, dm, shape.prefill_seqs, shape.prefill_seqs * n, p + n,
                                          expand["prefill"]))
    elif shape.prefill_seqs and shape.prefill_tokens:
        n, p = shape.prefill_tokens, shape.prefill_past
        keys = keys_attended(window, p, n, dm.chunked)
        exact = shape.prefill_seqs * dm.heads * 2.0 * (qk_dim + v_dim) * keys
        if dm.mla:  # expand the latent of all cached and new tokens into per-head K and V (kv_b GEMM)
            _gemm(s, "attention", shape.prefill_seqs * (p + n), dm.heads * (dm.nope + dm.v_dim), dm.kv_rank,
                  dm.attn, eng, in_block=True)
        held = keys_attended(window, p + n - 1, 1, dm.chunked)  # the last query's keys, cached ones included
        read = shape.prefill_seqs * held * (kvb if p else 0.0)
        s.groups["attention"].kv_bytes += s.mult * read
        s.add("attention", kernels.flash_prefill(r, seqs=shape.prefill_seqs, tokens=n, past=p, heads=dm.heads,
                                                 qk_dim=qk_dim, v_dim=v_dim, window=window, chunked=dm.chunked,
                                                 kv_bytes_read=read,
                                                 exact_flops=exact, fp8_cache=fp8_cache,
                                                 wide_heads=d.widest_head_dim > FLASH_MAX_HEAD_DIM))
    if shape.decode_seqs and expand:
        keys = math.ceil(shape.decode_context)
        s.groups["attention"].kv_bytes += s.mult * shape.decode_seqs * keys * kvb
        s.add("attention", _msa_expansion(r, dm, shape.decode_seqs, shape.decode_seqs, keys, expand["decode"]))
    elif shape.decode_seqs:
        ctx = shape.decode_context
        # the decode query's keys; a chunked layer's averaged over the contexts the step stands for; DSA: its top-k
        held = mean_keys(window, ctx, shape.decode_span if dm.chunked else 0.0, dm.chunked)
        if dsa:
            held = min(held, float(dm.index_topk))
        if dm.mla:  # absorbed: scores over kv_rank + rope, values over kv_rank, per head
            _gemm(s, "attention", shape.decode_seqs, dm.heads * dm.kv_rank, dm.nope, dm.attn, eng,  # W_UK
                  in_block=True)
            flops = shape.decode_seqs * dm.heads * 2.0 * (2 * dm.kv_rank + dm.rope) * held
        else:
            flops = shape.decode_seqs * dm.heads * 2.0 * (qk_dim + v_dim) * held
        s.add("attention", kernels.decode_attention(r, shape.decode_seqs, dm.kv_heads,
                                                    shape.decode_seqs * held * kvb, flops, fp8_cache=fp8_cache,
                                                    mla=dm.mla, mha=not dm.mla and dm.heads == dm.kv_heads))
        s.groups["attention"].kv_bytes += s.mult * shape.decode_seqs * held * kvb
        if dm.mla:
            _gemm(s, "attention", shape.decode_seqs, dm.heads * dm.v_dim, dm.kv_rank, dm.attn, eng,  # W_UV
                  in_block=True)
    if dm.attention_gate or dm.head_gate:  # output x sigmoid(gate): read both (a gate per channel or per head), write
        gate = dm.heads * (v_dim if dm.attention_gate else 1)
        _elementwise_group(s, "attention", (2 * m * dm.heads * v_dim + m * gate) * ACT_BYTES)
    _gemm(s, "attention", m, h, dm.heads * v_dim, dm.attn_o or dm.attn, eng, in_block=dm.mla,
          after="attention")  # O projection


def _msa_expansion(r: Rates, dm: _Dims, seqs: int, queries: int, keys: int, efficiency: float) -> Cost:
    """MiniMax-M3's sparse attention on TensorRT-LLM's Triton path (``kernels.msa_fp32_expansion``): every query of
    the step against the longest sequence's ``keys``, this GPU's heads, the indexer's heads whole."""
    return kernels.msa_fp32_expansion(r, seqs=seqs, queries=queries, keys=keys, kv_heads=dm.kv_heads,
                                      q_heads=dm.heads, head_dim=dm.head_dim, index_heads=dm.msa_index_heads,
                                      index_dim=dm.msa_index_dim, efficiency=efficiency)


def _dense_prefill(d: Deployment, shape: StepShape) -> bool:
    """Whether a DSA prefill runs the dense MLA: on an engine that does so (``dsa_dense_short_prefill``) when every key
    of the chunk fits the indexer's top-k (each query attends all its keys either way)."""
    return d.kernels.dsa_dense_short_prefill and shape.prefill_past + shape.prefill_tokens <= d.dims.index_topk


def _indexer(s: _Step, d: Deployment, shape: StepShape, own: bool) -> None:
    """DSA's lightning indexer on every GPU (vLLM's Indexer: replicated): wq_b on q_lora, wk and weights_proj on the
    hidden state, its key's LayerNorm, RoPE and fp8 cache write; on a layer with its own indexer (``own``) the
    logits of every query against every cached key (``kernels.indexer_logits``) and the top-k, skipped by a dense
    prefill (``_dense_prefill``); a shared layer reuses the previous one's choice."""
    dm, eng = d.dims, d.kernels
    m = shape.tokens
    if not own:
        return
    _gemm(s, "attention", m, dm.index_heads * dm.index_dim, dm.q_rank, dm.attn, eng, in_block=True)  # wq_b
    _gemm(s, "attention", m, dm.index_dim + dm.index_heads, dm.h, dm.attn, eng, in_block=True)  # wk, weights_proj
    _elementwise_group(s, "attention", m * (2 * dm.index_heads * dm.index_dim + 3 * dm.index_dim) * ACT_BYTES
                       + m * dm.index_key_bytes, kernels_count=2, ideal_bytes=m * dm.index_key_bytes)
    pairs = keys_bytes = 0.0
    if shape.prefill_seqs and shape.prefill_tokens and not _dense_prefill(d, shape):
        n, p = shape.prefill_tokens, shape.prefill_past
        pairs += shape.prefill_seqs * keys_attended(None, p, n)
        keys_bytes += shape.prefill_seqs * (p + n) * dm.index_key_bytes
    if shape.decode_seqs:
        pairs += shape.decode_seqs * shape.decode_context
        keys_bytes += shape.decode_seqs * shape.decode_context * dm.index_key_bytes
    if pairs:
        s.groups["attention"].kv_bytes += s.mult * keys_bytes
        s.add("attention", kernels.indexer_logits(s.rates, pairs=pairs, heads=dm.index_heads,
                                                  head_dim=dm.index_dim, keys_bytes=keys_bytes))


def _sparse_mla_prefill(s: _Step, d: Deployment, shape: StepShape) -> None:
    """A DSA prefill on the sparse MLA kernel (vLLM's FLASHMLA_SPARSE, SGLang's flashmla_sparse / flashmla_kv): the
    absorbed form, queries turned into the latent (W_UK), each attending min(position + 1, top-k) latents of
    kv_rank + rope with values of kv_rank, its output mapped back per head (W_UV); the kernel pads each GPU's heads
    to its head tile (``Rates.dsa_prefill_head_tile``), timed as a window of top-k keys at its own efficiency
    (``Rates.dsa_prefill_efficiency``), or as top-k keys for every query where it runs all slots
    (``Rates.dsa_prefill_full_topk``)."""
    dm, eng, r = d.dims, d.kernels, s.rates
    n, p, seqs = shape.prefill_tokens, shape.prefill_past, shape.prefill_seqs
    m = seqs * n
    _gemm(s, "attention", m, dm.heads * dm.kv_rank, dm.nope, dm.attn, eng, in_block=True)  # W_UK
    keys = keys_attended(dm.index_topk, p, n)
    exact = seqs * dm.heads * 2.0 * (2 * dm.kv_rank + dm.rope) * keys
    heads = dm.heads if r.ideal else max(dm.heads, r.dsa_prefill_head_tile)
    read = seqs * min(p + n, dm.index_topk) * dm.kv_bytes_per_token if p else 0.0
    s.groups["attention"].kv_bytes += s.mult * read
    timed = (1, seqs * n, dm.index_topk) if r.dsa_prefill_full_topk and not r.ideal else (seqs, n, p)
    # all slots: each query's top-k keys whatever its sequence (queries gathered, not tiled per sequence)
    s.add("attention", kernels.flash_prefill(r, seqs=timed[0], tokens=timed[1], past=timed[2], heads=heads,
                                             qk_dim=dm.kv_rank + dm.rope, v_dim=dm.kv_rank, window=dm.index_topk,
                                             kv_bytes_read=read, exact_flops=exact,
                                             efficiency=r.dsa_prefill_efficiency))
    _gemm(s, "attention", m, dm.heads * dm.v_dim, dm.kv_rank, dm.attn, eng, in_block=True)  # W_UV


def _compressed_keys(ratio: int, topk: int | None, past: float, tokens: float) -> float:
    """Sum over query positions past..past+tokens-1 of the compressed entries a DeepSeek-V4 query attends (or an
    indexer scores): min(floor((i + 1) / ratio), topk), exactly (a test counts it entry by entry)."""
    def upto(n: float) -> float:  # sum over j = 0..n of floor(j / ratio)
        if n < 0:
            return 0.0
        q, rem = divmod(int(n), ratio)
        return ratio * q * (q - 1) / 2 + q * (rem + 1)

    def capped(n: float) -> float:  # sum over j = 0..n of min(floor(j / ratio), topk)
        if topk is None or n < topk * ratio:
            return upto(n)
        return upto(topk * ratio - 1) + topk * (n - topk * ratio + 1)

    return capped(past + tokens) - capped(past)


def _hyper_connection(s: _Step, d: Deployment, group: str, m: float) -> None:
    """DeepSeek-V4's mHC around one block beyond the residual add and norm every block is priced with: the n streams
    read to mix them ((2 + n) n weights per token from a [n h] projection) and collapse them, the block's output
    expanded back into n streams beside the mixed residual: (3 n + 2) h values per token moved in all, 4 h of them
    already counted (vLLM MHCPreOp / MHCPostOp). Where the engine measured them, a site's fixed cost is half its
    pre and post kernels' per layer (``dsa_block_floors`` ``hc_pre`` / ``hc_post``: 20 Sinkhorn iterations run in
    sequence), replacing the two kernels' floors."""
    dm = d.dims
    assert dm.v4 is not None
    n, h = dm.v4.hc_mult, dm.h
    extra = m * (3 * n - 2) * h * ACT_BYTES
    cost = kernels.elementwise(s.rates, extra, flops=2.0 * m * (2 + n) * n * n * h, kernels=2, ideal_bytes=extra)
    floors = s.rates.dsa_block_floors
    if not s.rates.ideal and "hc_pre" in floors:  # the engine's measured fixed cost of one site replaces the floors
        site = (floors["hc_pre"] + floors.get("hc_post", 0.0)) / 2
        cost = cost._replace(seconds=cost.seconds - cost.floor_seconds + site, floor_seconds=site,
                             bound="floor" if site > cost.seconds - cost.floor_seconds else cost.bound)
    s.add(group, cost)


def _compressed_attention_layer(s: _Step, d: Deployment, shape: StepShape, kind: str) -> None:
    """A DeepSeek-V4 attention layer as vLLM runs it (deepseek_v4_attention.py), ``kind`` csa, hca or sliding (the
    window alone): the fused q_a + kv projection (replicated), q_b (split by head), the shared K=V head's norm, RoPE
    and fp8 cache write; on a compressed layer its compressor's bf16 kv and gate projection (replicated, fp32 out)
    and pooling into one cached entry per ratio tokens; on a CSA layer the lightning indexer (its own compressor,
    q_b on the q latent, weights_proj, and fp8 logits of every query against every compressed key, then the top-k);
    the attention (FlashMLA: heads padded to 64 or 128, qk and v of head_dim over the window's keys plus the
    compressed entries: a CSA query min(floor((i + 1) / 4), top-k) of them, an HCA query every floor((i + 1) / 128);
    a prefill first gathers its sequences' entries into a bf16 workspace); then the inverse RoPE and fp8 cast of
    the output, the grouped o_a (fp8 einsum) and o_b. Where the engine measured a layer's fixed cost per phase
    (``dsa_block_floors`` ``<kind>_decode`` / ``<kind>_prefill``) it replaces the kernels' floors: added to their
    work in decode (on a CSA layer whose entries outnumber the top-k, plus ``csa_topk_decode`` x the excess over
    one more top-k, at most 1: the engines' tables ramp so; plus ``<kind>_decode_seq`` per decoding sequence: the
    tables' cost per sequence beyond the kernels tfcalc prices, about 0.1 us on vLLM and SGLang, its mechanism not
    identified), the layer lasting max(fixed cost, work) in a prefill."""
    dm, eng, r = d.dims, d.kernels, s.rates
    acc = s.groups["attention"]
    floors_before, seconds_before = acc.floor_seconds, acc.seconds
    m, h, d_head = shape.tokens, dm.h, dm.head_dim
    q_width = dm.heads * d_head
    bf16 = _Linear(16.0, "bf16", "", False)
    ca = dm.v4
    assert ca is not None
    ratio = ca.csa_ratio if kind == "csa" else ca.hca_ratio if kind == "hca" else 0
    window = dm.window or 0
    _elementwise_group(s, "attention", 4 * m * h * ACT_BYTES, ideal_bytes=4 * m * h * ACT_BYTES)
    _gemm(s, "attention", m, ca.q_lora_rank + d_head, h, dm.attn, eng, in_block=True)  # fused q_a + kv
    if ratio:  # the compressor's kv and gate (bf16, fp32 out), 2 x head_dim each on a CSA layer's overlapping windows
        _gemm(s, "attention", m, 2 * (2 if kind == "csa" else 1) * d_head, h, bf16, eng, in_block=True)
    _elementwise_group(s, "attention", 2 * m * (ca.q_lora_rank + d_head) * ACT_BYTES)  # q_a and kv norms
    _gemm(s, "attention", m, q_width, ca.q_lora_rank, dm.attn, eng, in_block=True)  # q_b
    # q norm + RoPE, the K=V entry's RoPE, quantisation and cache write
    _elementwise_group(s, "attention", 2 * m * q_width * ACT_BYTES + m * d_head * ACT_BYTES
                       + m * dm.kv_bytes_per_token, ideal_bytes=m * dm.kv_bytes_per_token)
    seqs_prefill, n, p = shape.prefill_seqs, shape.prefill_tokens, shape.prefill_past
    if ratio:  # pooling: the per-token fp32 kv and score state written, each closed window pooled into an entry
        c = 2 if kind == "csa" else 1
        entries = m / ratio
        _elementwise_group(s, "attention", m * 2 * c * d_head * 4 * 2 + entries * dm.kv_bytes_per_token,
                           kernels_count=2, ideal_bytes=entries * dm.kv_bytes_per_token)
    heads = dm.heads if r.ideal else (64 if dm.heads <= 64 else 128)  # FlashMLA's head tile
    if kind == "csa":
        _gemm(s, "attention", m, dm.index_heads + 2 * 2 * dm.index_dim, h, bf16, eng, in_block=True)
        _gemm(s, "attention", m, dm.index_heads * dm.index_dim, ca.q_lora_rank, dm.attn, eng, in_block=True)
        _elementwise_group(s, "attention", m * 2 * 2 * dm.index_dim * 4 * 2 + m / ratio * dm.index_key_bytes
                           + 2 * m * dm.index_heads * dm.index_dim * ACT_BYTES, kernels_count=3,
                           ideal_bytes=m / ratio * dm.index_key_bytes)
        pairs = keys_bytes = 0.0
        if seqs_prefill and n:
            pairs += seqs_prefill * _compressed_keys(ratio, None, p, n)
            keys_bytes += seqs_prefill * (p + n) / ratio * dm.index_key_bytes
        if shape.decode_seqs:
            pairs += shape.decode_seqs * math.floor(shape.decode_context / ratio)
            keys_bytes += shape.decode_seqs * math.floor(shape.decode_context / ratio) * dm.index_key_bytes
        if pairs:
            acc.kv_bytes += s.mult * keys_bytes
            s.add("attention", kernels.indexer_logits(r, pairs=pairs, heads=dm.index_heads, head_dim=dm.index_dim,
                                                      keys_bytes=keys_bytes))
    topk = dm.index_topk if kind == "csa" else None
    if seqs_prefill and n:  # query-key pairs of the prefill over all its sequences
        keys = seqs_prefill * (keys_attended(window, p, n) + (_compressed_keys(ratio, topk, p, n) if ratio else 0.0))
        held = min(p + n, window) + ((p + n) / ratio if ratio else 0.0)  # gathered per sequence into bf16
        gathered = seqs_prefill * held * (dm.kv_bytes_per_token + d_head * ACT_BYTES)
        _elementwise_group(s, "attention", gathered)
        read = seqs_prefill * held * dm.kv_bytes_per_token if p else 0.0
        acc.kv_bytes += s.mult * read
        s.add("attention", kernels.sparse_attention(r, flops=keys * heads * 2.0 * 2 * d_head,
                                                    nbytes=seqs_prefill * held * d_head * ACT_BYTES
                                                    + seqs_prefill * n * heads * d_head * 2 * ACT_BYTES,
                                                    efficiency=r.v4_prefill_efficiency))
    if shape.decode_seqs:
        ctx = shape.decode_context
        per_seq = min(ctx, window) + (min(math.floor(ctx / ratio), topk if topk is not None else math.inf)
                                      if ratio else 0.0)
        kv_read = shape.decode_seqs * per_seq * dm.kv_bytes_per_token
        acc.kv_bytes += s.mult * kv_read
        s.add("attention", kernels.decode_attention(r, shape.decode_seqs, 1, kv_read,
                                                    shape.decode_seqs * heads * 2.0 * 2 * d_head * per_seq,
                                                    mla=True))
    # inverse RoPE on the output and its fp8 cast, the grouped o_a (fp8 einsum) and o_b
    _elementwise_group(s, "attention", m * q_width * (ACT_BYTES + 1))
    _gemm(s, "attention", m, dm.v4_o_groups * ca.o_lora_rank, q_width / dm.v4_o_groups if dm.v4_o_groups else 0,
          dm.attn, eng, in_block=True, after="attention")
    _gemm(s, "attention", m, h, dm.v4_o_groups * ca.o_lora_rank, dm.attn, eng, in_block=True, after="attention")
    floors = r.dsa_block_floors
    decode_block = floors.get(f"{kind}_decode", 0.0) if shape.decode_seqs else 0.0
    if decode_block and kind == "csa":  # the top-k selection runs once the entries outnumber the top-k: its cost
        over = (shape.decode_context / ratio - dm.index_topk) / dm.index_topk  # ramps up over the next top-k entries
        decode_block += floors.get("csa_topk_decode", 0.0) * min(max(over, 0.0), 1.0)
    if decode_block:  # the engine's measured cost per decoding sequence beyond the kernels' work
        decode_block += floors.get(f"{kind}_decode_seq", 0.0) * shape.decode_seqs
    block = max(floors.get(f"{kind}_prefill", 0.0) if shape.prefill_seqs else 0.0, decode_block)
    if r.ideal or not block:
        return
    # the engine's measured fixed cost of the whole layer replaces its kernels' floors: added to their work in a
    # decode step, the layer's time in a prefill until its work outgrows it (the tables: flat, then linear)
    kernel_floors = acc.floor_seconds - floors_before
    work = acc.seconds - seconds_before - kernel_floors
    layer = max(s.mult * block, work) if shape.prefill_seqs else work + s.mult * block
    change = layer - (acc.seconds - seconds_before)
    acc.seconds += change
    acc.floor_seconds += layer - work - kernel_floors
    acc.by_bound["floor"] = acc.by_bound.get("floor", 0.0) + max(layer - work, 0.0) - kernel_floors


class _Snapshot(NamedTuple):
    """An accumulator's time, fixed part and time by bound at one moment (the start of a path of kernels)."""

    seconds: float
    floor_seconds: float
    by_bound: dict[str, float]

    @classmethod
    def of(cls, acc: _Acc) -> _Snapshot:
        return cls(acc.seconds, acc.floor_seconds, dict(acc.by_bound))


def _overlap(acc: _Acc, start: _Snapshot, middle: _Snapshot) -> None:
    """Run the kernels added since ``middle`` beside those added between ``start`` and ``middle`` (two CUDA
    streams): together they last max(t_a, t_b, w_a + w_b), each path's work w = time - fixed part sharing the
    GPU's bandwidth and SMs, its fixed parts (floors, host time) hiding behind the other path."""
    t_a, f_a = middle.seconds - start.seconds, middle.floor_seconds - start.floor_seconds
    t_b, f_b = acc.seconds - middle.seconds, acc.floor_seconds - middle.floor_seconds
    work = max(t_a - f_a, 0.0) + max(t_b - f_b, 0.0)
    together = max(t_a, t_b, work)
    if together >= t_a + t_b or t_a + t_b <= 0:
        return
    scale = together / (t_a + t_b)
    acc.seconds = start.seconds + together
    acc.floor_seconds = start.floor_seconds + together - work
    acc.by_bound = {k: start.by_bound.get(k, 0.0) + (v - start.by_bound.get(k, 0.0)) * scale
                    for k, v in acc.by_bound.items()}


def _ffn_layer(s: _Step, d: Deployment, shape: StepShape, moe: bool, ideal: bool) -> None:
    dm, eng = d.dims, d.kernels
    m, h = shape.tokens, dm.h
    width_in = 2 if dm.gated else 1
    if not moe:
        _elementwise_group(s, "dense_ffn", 4 * m * h * ACT_BYTES)
        _gemm(s, "dense_ffn", m, width_in * dm.ffn_width, h, dm.mlp, eng)
        _elementwise_group(s, "dense_ffn", m * dm.ffn_width * (width_in + 1) * ACT_BYTES)
        _gemm(s, "dense_ffn", m, h, dm.ffn_width, dm.mlp, eng, after="activation")
        return
    _elementwise_group(s, "moe", 4 * m * h * ACT_BYTES)
    acc = s.groups["moe"]
    beside = bool(dm.shared_width) and not ideal and d.shared_experts_beside_routed(shape, s.rates)
    start = _Snapshot.of(acc) if beside else None
    if dm.shared_width:
        _gemm(s, "moe", m, width_in * dm.shared_width, h, dm.shared, eng)
        _elementwise_group(s, "moe", m * dm.shared_width * (width_in + 1) * ACT_BYTES)
        _gemm(s, "moe", m, h, dm.shared_width, dm.shared, eng, after="activation")
    shared = _Snapshot.of(acc) if beside else None
    _gemm(s, "moe", m, dm.experts, h, _Linear(16.0, "bf16", "", False), eng)  # router, replicated, bf16
    routed_tokens = m * d.dp  # every replica's tokens reach the experts of the group
    # vLLM's default within a node: every rank all-gathers every rank's tokens, its experts see them all
    gathered = d.dp > 1 and eng.ep_dispatch == "allgather" and d.ep <= d.nvlink_domain
    mode = dm.experts_mode
    width = dm.moe_latent or h  # the experts' input width: a latent MoE's projection of h (fc1 / fc2, replicated)
    if dm.moe_latent:
        _gemm(s, "moe", m, width, h, dm.latent_mode or mode, eng)
    if mode.weights in DEQUANTISED_FIRST and not ideal:  # every resident expert to 16 bits, each step
        matrices = (3 if dm.gated else 2) * width * dm.expert_width * dm.experts_local
        _elementwise_group(s, "moe", matrices * (mode.bits / 8 + ACT_BYTES))
        mode = _Linear(16.0, "bf16", "", False, "bf16")
    s.add("moe", kernels.moe_experts(s.rates, tokens=routed_tokens, experts_local=dm.experts_local,
                                     experts_total=dm.expert_slots, top_k=dm.top_k, hidden=width,
                                     expert_width=int(dm.expert_width) or 1, gated=dm.gated, weight_bits=mode.bits,
                                     compute=mode.compute, dequant=mode.dequant, routing=d.routing,
                                     weight_format=mode.weights, replicated=d.dp == 1 or gathered), mode.compute)
    if dm.latent_norm:  # RMSNorm over the reduced latent: read, write
        _elementwise_group(s, "moe", 2 * m * width * ACT_BYTES)
    if dm.moe_latent:
        _gemm(s, "moe", m, h, width, dm.latent_mode or mode, eng)
    if start is not None and shared is not None:  # the shared experts' path beside the router's and routed's
        _overlap(acc, start, shared)
    if gathered:  # all-gather of the tokens and router logits, reduce-scatter of the results (the same ring cost)
        link = d.intra.nccl_for(d.dp, ideal)
        for nbytes in (routed_tokens * (width + dm.experts) * ACT_BYTES, routed_tokens * width * ACT_BYTES):
            s.add_comm(comm.all_gather(nbytes, d.dp, link), link.bandwidth_bytes_per_s, "ep")
    elif d.dp > 1:  # dispatch and combine: each GPU sends its share of the tokens' copies and gets them back
        moe = d.spec.moe
        # DeepEP's normal kernels (a step with prefill under SGLang) and TensorRT-LLM's all-to-all send a token once
        # to each rank that holds any of its experts; DeepEP's low-latency kernels send each of its top-k copies
        per_rank = eng.ep_dispatch == "per_rank" or (shape.prefill_seqs > 0 and eng.ep_dispatch == "all_to_all")
        ranks = (comm.remote_domains_touched(dm.expert_slots, dm.top_k, d.ep, moe.expert_groups,
                                             moe.groups_per_token) * d.ep / (d.ep - 1)) if per_rank else dm.top_k
        copies = m / d.tp * ranks * width
        intra, inter = d.intra.expert_link, d.inter.expert_link
        if ideal:
            intra, inter = intra.ideal(), inter.ideal()
        network = None  # DeepEP's normal kernels: one copy per remote domain, spread by NVLink there
        if shape.prefill_seqs and eng.ep_dispatch == "all_to_all" and d.ep > d.nvlink_domain:
            network = m / d.tp * width * comm.remote_domains_touched(
                dm.expert_slots, dm.top_k, math.ceil(d.ep / d.nvlink_domain), moe.expert_groups,
                moe.groups_per_token)
        for value_bytes in (dispatch_bytes(mode), ACT_BYTES):
            s.add_comm(comm.expert_all_to_all(copies * value_bytes, d.ep, d.nvlink_domain, intra, inter,
                                              None if network is None else network * value_bytes),
                       (intra if d.ep <= d.nvlink_domain else inter).bandwidth_bytes_per_s, "ep")


def dispatch_bytes(mode: _Linear) -> float:
    """Bytes per value an MoE dispatch sends: experts on fp8 tensor cores take their input quantised before it
    leaves the GPU (DeepEP's fp8 dispatch in SGLang and vLLM, TensorRT-LLM's fp8 all-to-all), others bf16; the
    combine sends bf16 results."""
    return FP8_DISPATCH_BYTES if mode.compute == "fp8" else ACT_BYTES


def _linear_attention_layer(s: _Step, d: Deployment, shape: StepShape) -> None:
    """A Gated DeltaNet layer as vLLM runs it (qwen3_next.py): the fused q/k/v/z and b/a projections, the causal
    conv (each sequence's conv state read and written), the gated delta rule (``kernels.gated_delta_rule``), the
    gated RMSNorm and out_proj; its per-sequence state counts as cache traffic (``kv_bytes``)."""
    dm, eng = d.dims, d.kernels
    m, h = shape.tokens, dm.h
    keys, values = dm.linear_key_heads * dm.linear_key_dim, dm.linear_value_heads * dm.linear_value_dim
    conv = 2 * keys + values
    mamba = dm.mamba_chunk > 0  # Mamba-2: one in_proj for z, x, B, C and dt (vLLM MambaMixer2)
    _elementwise_group(s, "attention", 4 * m * h * ACT_BYTES, ideal_bytes=4 * m * h * ACT_BYTES)
    if mamba:
        _gemm(s, "attention", m, conv + values + dm.linear_value_heads, h, dm.attn, eng)
    else:
        _gemm(s, "attention", m, conv + values, h, dm.attn, eng)
        if dm.kda:  # beta per head beside f_a [h, d]; then f_b [d, P] (SGLang / vLLM kimi_k3 KDA: f_b_proj)
            _gemm(s, "attention", m, dm.linear_value_heads + dm.linear_key_dim, h, dm.attn, eng)
            _gemm(s, "attention", m, values, dm.linear_key_dim, dm.attn, eng, after="gemm")
        else:
            _gemm(s, "attention", m, 2 * dm.linear_value_heads, h, dm.attn, eng)
    seqs = shape.prefill_seqs + shape.decode_seqs
    _elementwise_group(s, "attention", 2 * m * conv * ACT_BYTES + 2 * seqs * dm.linear_conv_state_bytes,
                       ideal_bytes=2 * seqs * dm.linear_conv_state_bytes)
    io = (conv + values) * ACT_BYTES
    acc = s.groups["attention"]
    acc.kv_bytes += s.mult * 2 * seqs * dm.linear_conv_state_bytes
    def scan(seqs: float, tokens: float, decode: bool) -> Cost:
        if mamba:
            return kernels.mamba2_scan(s.rates, seqs=seqs, tokens=tokens, heads=dm.linear_value_heads,
                                       groups=dm.linear_key_heads, state_dim=dm.linear_key_dim,
                                       head_dim=dm.linear_value_dim, chunk=dm.mamba_chunk,
                                       state_bytes=dm.linear_state_bytes, io_bytes=tokens * io, decode=decode)
        return kernels.gated_delta_rule(s.rates, seqs=seqs, tokens=tokens, heads=dm.linear_value_heads,
                                        key_dim=dm.linear_key_dim, value_dim=dm.linear_value_dim,
                                        state_bytes=dm.linear_state_bytes, io_bytes=tokens * io, decode=decode)

    if shape.prefill_seqs and shape.prefill_tokens:
        s.add("attention", scan(shape.prefill_seqs, shape.prefill_seqs * shape.prefill_tokens, False))
        acc.kv_bytes += s.mult * 2 * shape.prefill_seqs * dm.linear_state_bytes
    if shape.decode_seqs:
        s.add("attention", scan(shape.decode_seqs, shape.decode_seqs, True))
        acc.kv_bytes += s.mult * 2 * shape.decode_seqs * dm.linear_state_bytes
    _elementwise_group(s, "attention", 3 * m * values * ACT_BYTES)  # gated RMSNorm: read core output and z, write
    _gemm(s, "attention", m, h, values, dm.attn, eng, after="norm")  # out_proj


def _layer(s: _Step, d: Deployment, shape: StepShape, kind: str, moe: bool | None, ideal: bool) -> None:
    """One layer: its mixer (none in Nemotron-H's MLP and MoE blocks) and its FFN (``moe`` None: none, Nemotron-H's
    Mamba-2 and attention blocks), each row-parallel output reduced over tp."""
    attn_res = d.dims.attn_res_inputs
    if attn_res and kind != "none":  # Kimi K3: the mixer's input, a learned mix of the block outputs so far
        _attention_residual(s, "attention", shape.tokens, d.dims.h, attn_res)
    if kind == "linear":
        _linear_attention_layer(s, d, shape)
    elif d.dims.v4 is not None:  # DeepSeek-V4: its own attention inside hyper-connections
        _hyper_connection(s, d, "attention", shape.tokens)
        _compressed_attention_layer(s, d, shape, kind)
    elif kind != "none":
        if d.tp > 1 and d.dims.qk_norm_across_heads:  # the q and k norms' mean squares, fp32 [tokens, 2], summed
            t, bw = _all_reduce(d, shape.tokens * 2 * 4, d.tp, ideal, s.memo)  # (vLLM MiniMaxText01RMSNormTP)
            s.add_comm(t, bw, "tp")
        _attention_layer(s, d, shape, kind == "sliding", own_indexer=kind != "shared", msa=kind == "msa")
    if kind != "none" and d.tp > 1:
        t, bw = _all_reduce(d, shape.tokens * d.dims.h * ACT_BYTES, d.tp, ideal, s.memo)
        s.add_comm(t, bw, "tp")
    if moe is None:
        return
    if d.dims.v4 is not None:
        _hyper_connection(s, d, "moe" if moe else "dense_ffn", shape.tokens)
    if attn_res:  # and the FFN's
        _attention_residual(s, "moe" if moe else "dense_ffn", shape.tokens, d.dims.h, attn_res)
    if moe and d.spec.moe is not None and d.spec.moe.dense_mlp_beside:
        # Gemma 4: the dense MLP first, reduced on its own (vLLM Gemma4MLP's row-parallel down_proj), then the MoE
        _ffn_layer(s, d, shape, False, ideal)
        if d.tp > 1:
            t, bw = _all_reduce(d, shape.tokens * d.dims.h * ACT_BYTES, d.tp, ideal, s.memo)
            s.add_comm(t, bw, "tp")
    _ffn_layer(s, d, shape, moe, ideal)
    if d.tp > 1:
        # a normed latent's TP-partial routed sums are reduced before the norm, in the shared experts' collective
        # (SGLang kimi_k3.py KimiK3MoE._forward_fused: one all-reduce of [latent | h]); an all-to-all's combine
        # returns them whole
        latent = d.dims.moe_latent if moe and d.dims.latent_norm and d.dp == 1 else 0
        t, bw = _all_reduce(d, shape.tokens * (d.dims.h + latent) * ACT_BYTES, d.tp, ideal, s.memo)
        s.add_comm(t, bw, "tp")


def _attention_residual(s: _Step, group: str, m: float, h: int, inputs: float) -> None:
    """One attention-residual aggregation (Kimi K3; SGLang kimi_k3.py AttnResidual): RMS-normed keys of ``inputs``
    block outputs scored by a [h, 1] query, their softmax-weighted sum written: (inputs + 1) x m x h values."""
    _elementwise_group(s, group, (inputs + 1) * m * h * ACT_BYTES)


def _head(s: _Step, d: Deployment, shape: StepShape, first: bool, last: bool, ideal: bool) -> None:
    dm, m = d.dims, shape.tokens
    if first:
        gathered = m * dm.h * dm.embedding_bits / 8 * (0 if d.spec.tie_word_embeddings else 1)
        _elementwise_group(s, "lm_head", m * dm.h * (ACT_BYTES + dm.embedding_bits / 8),
                           ideal_bytes=gathered)  # embedding gather
        if d.tp > 1:
            t, bw = _all_reduce(d, m * dm.h * ACT_BYTES, d.tp, ideal)
            s.add_comm(t, bw, "tp")
    if last and shape.sampled:
        rows = shape.sampled
        _elementwise_group(s, "lm_head", 2 * rows * dm.h * ACT_BYTES)  # final norm of the sampled rows
        _gemm(s, "lm_head", rows, dm.vocab, dm.h, dm.head, d.kernels)
        if d.tp > 1:
            fabric = d.fabric(d.tp)
            link = fabric.nccl_for(d.tp, ideal)
            s.add_comm(comm.all_gather(rows * dm.vocab * d.tp * ACT_BYTES, d.tp, link), link.bandwidth_bytes_per_s,
                       "tp")
        _elementwise_group(s, "lm_head", 2 * rows * dm.vocab * d.tp * 4, kernels_count=2,
                           ideal_bytes=rows * dm.vocab * 4)  # fp32 logits: softmax/top-k, sampling


def step_time(d: Deployment, shape: StepShape, phase: str = "decode", ideal: bool = False) -> StepTime:
    """Seconds of one scheduler step of ``shape`` on one attention replica, through all pipeline stages.

    This is the time model of ``tfcalc estimate`` and the function a serving simulator calls per step: a decode
    batch at some context plus an optional prefill chunk (chunked prefill), for a deployment built once with
    ``deployment()`` (model x GPU x tp/pp/ep x dtypes x engine). ``phase`` picks the rates ('prefill' or
    'decode', which differ when a calibration file gives them per phase; a mixed step uses 'decode').
    ``ideal`` prices the same kernels at 100 % of the peaks with no floors or latencies.
    Cost is independent of the number of layers: identical layers are priced once (0.1-0.3 ms per call in CPython,
    microseconds when cached). ``step_seconds`` is the vectorised form over many steps.
    """
    return _step_cached(d, shape, phase, ideal)



CONTEXT_GRID_PER_OCTAVE = 8  # step_seconds interpolates contexts above 64 tokens on a geometric grid of this density


def _grid(x: float) -> tuple[float, float, float]:
    """(lower grid point, upper grid point, weight of the upper): integers up to 64, then 8 points per octave."""
    if x <= 64:
        lo = math.floor(x)
        return lo, lo + 1, x - lo
    k = math.log2(x / 64) * CONTEXT_GRID_PER_OCTAVE
    lo_k = math.floor(k)

    def point(i: int) -> int:
        return round(64 * 2 ** (i / CONTEXT_GRID_PER_OCTAVE))

    lo, hi = point(lo_k), point(lo_k + 1)
    while x > hi:  # grid points are rounded: x can lie past the rounded end of the interval its logarithm names
        lo_k += 1
        lo, hi = hi, point(lo_k + 1)
    while x < lo and lo_k > 0:
        lo_k -= 1
        lo, hi = point(lo_k), lo
    return lo, hi, (x - lo) / (hi - lo) if hi > lo else 0.0


def _corners(x: float, grid: bool) -> tuple[tuple[float, float], ...]:
    """((point, weight), ...) whose weighted sum interpolates at ``x`` (one corner when x is a grid point)."""
    lo, hi, w = _grid(x) if grid else (math.floor(x), math.floor(x) + 1, x - math.floor(x))
    if w <= 1e-12:
        return ((lo, 1.0),)
    if w >= 1 - 1e-12:
        return ((hi, 1.0),)
    return (lo, 1 - w), (hi, w)


def _one_step(d: Deployment, seqs: float, context: float, tokens: float, past: float, phase: str,
              prefill_seqs: int = 1, pipelined: bool = False) -> float:
    tokens = round(tokens)
    if seqs <= 0 and tokens <= 0:
        return 0.0
    total = 0.0
    for b, wb in _corners(max(seqs, 0.0), grid=False):
        for c, wc in (_corners(context, grid=True) if b else ((0.0, 1.0),)):
            for p, wp in (_corners(past, grid=True) if tokens and past > 0 else ((0.0, 1.0),)):
                if not b and not tokens:
                    continue  # an empty step takes no time
                shape = StepShape(decode_seqs=int(b), decode_context=float(c), decode_span=float(c),
                                  prefill_seqs=prefill_seqs if tokens else 0, prefill_tokens=int(tokens),
                                  prefill_past=int(p))
                total += wb * wc * wp * (in_flight_seconds(d, shape, phase) if pipelined else
                                         _step_cached(d, shape, phase, False).seconds)
    return total


def in_flight_seconds(d: Deployment, shape: StepShape, phase: str | None = None) -> float:
    """Seconds per step of an engine that keeps pp batches like ``shape`` in flight, one per pipeline stage: every
    batch comes back once per max(its trip through the stages, pp x the slowest stage) (``_phase``'s decode rule);
    at pp = 1 the step time itself. Exact (``step_time``, cached per shape)."""
    t = _step_cached(d, shape, phase or ("decode" if shape.decode_seqs else "prefill"), False)
    return max(t.seconds, d.pp * max(t.stage_seconds)) if d.pp > 1 else t.seconds


def serving_step_seconds(d: Deployment, decode_seqs: float, decode_context: float = 0.0,
                         prefill_tokens: float = 0.0, prefill_past: float = 0.0, prefill_seqs: int = 1) -> float:
    """Seconds between two scheduler steps of a continuously batching engine (vLLM V1, SGLang) whose steps carry
    ``decode_seqs`` decoding sequences at mean context ``decode_context`` and ``prefill_seqs`` prefill chunks of
    ``prefill_tokens`` tokens each after ``prefill_past`` cached tokens (several short prompts in one step).

    pp = 1: ``step_seconds`` with several chunks (same interpolation). pp > 1: the engine keeps pp batches in
    flight, one per stage (vLLM's batch queue / virtual engines), each with 1/pp of the work; every sequence gets
    its next token once per max(trip of a batch through the stages, pp x its slowest stage) -- the decode phase of
    ``estimate_latency`` -- so that is the step time of the whole (``_phase``'s rule, for any mix).
    """
    phase = "decode" if decode_seqs > 0 or not prefill_tokens else "prefill"
    seqs = max(int(prefill_seqs), 1)
    if d.pp == 1:
        return _one_step(d, float(decode_seqs), float(decode_context), float(prefill_tokens), float(prefill_past),
                         phase, seqs)
    per = d.pp
    if seqs >= per:  # whole chunks per in-flight batch
        return _one_step(d, decode_seqs / per, float(decode_context), float(prefill_tokens), float(prefill_past),
                         phase, max(round(seqs / per), 1), pipelined=True)
    return _one_step(d, decode_seqs / per, float(decode_context), seqs * prefill_tokens / per, float(prefill_past),
                     phase, 1, pipelined=True)


def step_seconds(d: Deployment, decode_seqs: float | Sequence[float], decode_context: float | Sequence[float] = 0.0,
                 prefill_tokens: float | Sequence[float] = 0, prefill_past: float | Sequence[float] = 0,
                 phase: str = "decode") -> float | list[float]:
    """Seconds of scheduler steps -- ``decode_seqs`` sequences decoding one token each at mean context
    ``decode_context``, plus one prefill chunk of ``prefill_tokens`` after ``prefill_past`` cached tokens -- the
    vectorised entry point of a serving simulator (a capacity search prices millions of steps).

    Arguments are numbers or equal-length sequences (scalars broadcast; a list comes back when any is a sequence).
    Fractional ``decode_seqs`` (a mean batch) interpolate linearly between the neighbouring integers; contexts and
    past lengths above 64 tokens interpolate between points of a geometric grid (8 per octave), on which exact
    ``step_time`` results are cached: step time is affine in context between window caps, so the interpolation
    is exact there, and a call costs a few cache look-ups (microseconds) once the grid around it has been priced.
    An empty step is 0 s.
    """
    args = (decode_seqs, decode_context, prefill_tokens, prefill_past)
    lengths = {len(a) for a in args if isinstance(a, Sequence) or hasattr(a, "__len__")}
    if not lengths:
        return _one_step(d, float(decode_seqs), float(decode_context), float(prefill_tokens), float(prefill_past),
                         phase)
    if len(lengths) > 1:
        raise UsageError(f"step_seconds: sequences of different lengths {sorted(lengths)}")
    n = lengths.pop()
    cols = [list(a) if (isinstance(a, Sequence) or hasattr(a, "__len__")) else [a] * n for a in args]
    return [_one_step(d, float(b), float(c), float(t), float(p), phase) for b, c, t, p in zip(*cols, strict=True)]


@lru_cache(maxsize=256)
def _without_graphs(rates: Rates) -> Rates:
    """The same rates for a step the engine runs outside its CUDA graphs (each kernel waits for its launch)."""
    return replace(rates, cuda_graphs=False)


@lru_cache(maxsize=65536)
def _step_cached(d: Deployment, shape: StepShape, phase: str, ideal: bool) -> StepTime:
    rates = d.rates_prefill if phase == "prefill" else d.rates_decode
    if ideal:
        rates = rates.as_ideal()
    elif d.deepep_moe is not None and not shape.prefill_seqs:
        rates = _with_moe_kernel(rates, d.deepep_moe)
    if not ideal and rates.cuda_graphs and not d.captured(shape):
        rates = _without_graphs(rates)
    total = _Step(rates)
    stage_seconds = []
    for st in d.stages:
        s = total if d.pp == 1 else _Step(rates)
        for kind, moe, count, variant in st.counts:
            s.mult = count
            _layer(s, d.variant(variant), shape, kind, moe, ideal)
        s.mult = 1
        _head(s, d, shape, st.first, st.last, ideal)
        stage_seconds.append(sum(a.seconds for a in s.groups.values()))
        if s is total:
            continue
        for g, acc in s.groups.items():
            t = total.groups[g]
            t.seconds += acc.seconds
            t.floor_seconds += acc.floor_seconds
            t.flops += acc.flops
            t.bytes += acc.bytes
            t.peak_compute_seconds += acc.peak_compute_seconds
            t.weight_bytes += acc.weight_bytes
            t.ideal_bytes += acc.ideal_bytes
            t.kv_bytes += acc.kv_bytes
            t.comm_bytes += acc.comm_bytes
            t.comm_ideal_seconds += acc.comm_ideal_seconds
            t.kernels += acc.kernels
            for b, v in acc.by_bound.items():
                t.by_bound[b] = t.by_bound.get(b, 0.0) + v
        total.tp_comm += s.tp_comm
        total.ep_comm += s.ep_comm
    p2p = 0.0
    if d.pp > 1 and shape.tokens:
        fabric = d.fabric(d.num_gpus)
        link = fabric.nccl.ideal() if ideal else fabric.nccl
        p2p = comm.point_to_point(2 * shape.tokens * d.dims.h * ACT_BYTES, link).seconds
    groups = {g: GroupTime(seconds=a.seconds, floor_seconds=a.floor_seconds, flops=a.flops, bytes=a.bytes,
                           kernels=a.kernels, bound=max(a.by_bound, key=a.by_bound.__getitem__) if a.by_bound else "")
              for g, a in total.groups.items()}
    flops = sum(a.flops for a in total.groups.values())
    nbytes = sum(a.bytes for a in total.groups.values())
    t_c = sum(a.peak_compute_seconds for a in total.groups.values())
    ideal_bytes = sum(a.ideal_bytes for a in total.groups.values())
    t_m = ideal_bytes / rates.memory_bandwidth
    comm_bytes = total.groups["communication"].comm_bytes
    comm_ideal = total.groups["communication"].comm_ideal_seconds
    ideal_seconds = max(t_c, t_m) + comm_ideal + (d.pp - 1) * (
        2 * shape.tokens * d.dims.h * ACT_BYTES / d.intra.nccl.bandwidth_bytes_per_s if d.pp > 1 else 0.0)
    return StepTime(seconds=sum(stage_seconds) + (d.pp - 1) * p2p, stage_seconds=tuple(stage_seconds),
                    p2p_seconds=p2p, groups=groups, flops=flops, bytes=nbytes, ideal_bytes=ideal_bytes,
                    weight_bytes=sum(a.weight_bytes for a in total.groups.values()),
                    kv_read_bytes=sum(a.kv_bytes for a in total.groups.values()), comm_bytes=comm_bytes,
                    ideal_seconds=ideal_seconds, ideal_compute_seconds=t_c, ideal_memory_seconds=t_m,
                    tp_comm_seconds=total.tp_comm, ep_comm_seconds=total.ep_comm)


# --- phases and the estimate ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PhaseTime:
    """A phase (the prefill of the batch, or one decode step of it) with pipelining over microbatches."""

    phase: str
    seconds: float  # TTFT (prefill) or TPOT (decode)
    seconds_ideal: float  # the pure roofline of the same work, no pipeline bubble
    microbatches: int
    step: StepTime  # one microbatch through all stages
    bubble_fraction: float  # share of each stage's time spent idle waiting on the pipeline
    pp_seconds: float  # point-to-point sends + pipeline bubble added by pp


def _phase(d: Deployment, phase: str, shape_of: callable, batch: int) -> PhaseTime:
    """Microbatches m = min(batch, pp) of ceil(batch / m) sequences. Prefill (first token of the last
    microbatch): sum of stage times + (m - 1) x slowest stage + (pp - 1) sends. Decode (per token): the longer of
    one microbatch's trip through all stages and the slowest stage serving all m microbatches."""
    m = max(1, min(batch, d.pp))
    per = -(-batch // m)
    step = step_time(d, shape_of(per), phase)
    # the pure roofline of the whole batch (every step carries it; a second evaluation only when microbatched)
    ideal = step if m == 1 else step_time(d, shape_of(batch), phase, ideal=True)
    slowest = max(step.stage_seconds)
    trip = step.seconds
    if phase == "prefill":
        seconds = trip + (m - 1) * slowest
    else:
        seconds = max(trip, m * slowest)
    busy = m * sum(step.stage_seconds) / d.pp
    bubble = max(0.0, 1 - busy / seconds) if d.pp > 1 and seconds else 0.0
    no_pp = sum(step.stage_seconds) * (m if phase == "decode" else 1)
    pp_seconds = max(0.0, seconds - no_pp) if d.pp > 1 else 0.0
    return PhaseTime(phase=phase, seconds=seconds, seconds_ideal=ideal.ideal_seconds, microbatches=m, step=step,
                     bubble_fraction=bubble, pp_seconds=pp_seconds)


@dataclass(frozen=True, kw_only=True)
class LatencyEstimate:
    """TTFT, TPOT and throughput of a static batch: ``batch`` prompts of ``prompt_len`` tokens prefilled together,
    then ``gen_len`` tokens generated (TPOT at the mean decode context prompt + gen/2)."""

    deployment: Deployment
    batch: int
    prompt_len: int
    gen_len: int
    decode_context: int
    prefill: PhaseTime
    decode: PhaseTime
    ttft_s: float
    ttft_s_ideal: float
    tpot_s: float
    tpot_s_ideal: float
    e2e_s: float
    e2e_s_ideal: float
    decode_tokens_per_s: float
    decode_tokens_per_s_ideal: float
    decode_tokens_per_s_per_seq: float
    decode_tokens_per_s_per_seq_ideal: float


def estimate_latency(d: Deployment, batch: int, prompt_len: int, gen_len: int) -> LatencyEstimate:
    """The static-batch estimate (class docstring); ``batch`` counts sequences over all dp replicas."""
    if min(batch, prompt_len) < 1 or gen_len < 1:
        raise UsageError("batch, prompt length and generation length must be positive")
    per_replica = -(-batch // d.dp)
    context = prompt_len + max(gen_len // 2, 1)
    pre = _phase(d, "prefill", lambda b: StepShape(prefill_seqs=b, prefill_tokens=prompt_len), per_replica)
    dec = _phase(d, "decode", lambda b: StepShape(decode_seqs=b, decode_context=context, decode_span=gen_len),
                 per_replica)
    steps = max(gen_len - 1, 0)
    return LatencyEstimate(
        deployment=d, batch=batch, prompt_len=prompt_len, gen_len=gen_len, decode_context=context, prefill=pre,
        decode=dec, ttft_s=pre.seconds, ttft_s_ideal=pre.seconds_ideal, tpot_s=dec.seconds,
        tpot_s_ideal=dec.seconds_ideal, e2e_s=pre.seconds + steps * dec.seconds,
        e2e_s_ideal=pre.seconds_ideal + steps * dec.seconds_ideal, decode_tokens_per_s=batch / dec.seconds,
        decode_tokens_per_s_ideal=batch / dec.seconds_ideal, decode_tokens_per_s_per_seq=1 / dec.seconds,
        decode_tokens_per_s_per_seq_ideal=1 / dec.seconds_ideal)


@lru_cache(maxsize=4096)
def turning_point_batch(d: Deployment, context: int, limit: int = 1 << 20) -> int | None:
    """Smallest decode batch (per replica) whose step is compute-bound on the pure roofline at ``context``.

    gap(b) = compute time - memory time of the ideal step grows with b (FLOPs and KV grow linearly, weights are read
    once; MoE weights saturate): a bracketed secant search finds the sign change in a handful of steps.
    """
    def gap(b: int) -> float:
        step = step_time(d, StepShape(decode_seqs=b, decode_context=context), "decode")
        return step.ideal_compute_seconds - step.ideal_memory_seconds

    lo, g_lo = 1, gap(1)
    if g_lo >= 0:
        return 1
    hi, g_hi = limit, gap(limit)
    if g_hi < 0:
        return None
    while hi - lo > 1:
        guess = lo + (hi - lo) * (-g_lo) / (g_hi - g_lo)  # secant, kept inside the bracket
        mid = min(max(int(guess), lo + 1), hi - 1)
        g_mid = gap(mid)
        if g_mid >= 0:
            hi, g_hi = mid, g_mid
            if mid == lo + 1:
                break
            g_probe = gap(mid - 1)  # linear gaps land on the root: confirm the step below
            if g_probe < 0:
                return mid
            hi, g_hi = mid - 1, g_probe
        else:
            lo, g_lo = mid, g_mid
    return hi


def with_rates(d: Deployment, prefill: Rates, decode: Rates) -> Deployment:
    """The same deployment priced with other rates (calibration, efficiency overrides)."""
    return replace(d, rates_prefill=prefill, rates_decode=decode)

