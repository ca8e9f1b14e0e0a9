"""Fit planning: how a model is sharded over GPUs, what is left for the KV cache, and how many sequences fit.

Sharding follows what serving engines (vLLM, SGLang, TensorRT-LLM) do:

- tensor parallel (tp) splits query heads, the attention output and the FFN columns/rows, and the vocabulary of
  the embedding and lm_head (vocab-parallel); norms, biases and the MoE router are replicated;
- KV heads are split over tp ranks; when tp > kv_heads each rank keeps one KV head (K/V projections and cache
  replicated tp / kv_heads times), so tp must be a multiple or a divisor of kv_heads;
- DeepSeek MLA: q_b, kv_b and o are split by head; q_a and kv_a (ReplicatedLinear in vLLM) and the latent KV
  cache (kv_lora_rank + rope dims, shared by all heads) are *not* split: every tp rank caches the full latent;
- pipeline parallel (pp) gives each stage a contiguous run of layers; the num_layers % pp extra layers go to
  the stages just before the last, never to the last (vLLM ``get_pp_indices``: 61 layers over 4 stages are
  15/15/16/15); the embedding sits on the first stage, the final norm and lm_head on the last (a tied
  embedding is held on both);
- expert parallel (ep) places num_experts / ep routed experts per GPU; when ep < tp each of them is still
  sliced tp / ep ways (TensorRT-LLM's moe_tp x moe_ep = tp), when ep >= tp they are whole (vLLM's EP over
  tp x dp ranks), so ep must divide tp or be a multiple of it;
- data parallel replicas: num_gpus / (tp x pp) copies of the model; concurrent sequences add up over them.

Memory per GPU, as vLLM budgets it (``gpu_memory_utilization``, default 0.9):
    reserved  = capacity x (1 - utilization) + runtime overhead (CUDA context, NCCL, cuBLAS workspace, CUDA graphs)
                + activation workspace of one prefill chunk
    KV budget = capacity - weights - reserved
The KV cache is allocated in blocks of ``block_size`` tokens per layer (PagedAttention): a sequence of C tokens
takes ceil(held / block_size) blocks in each layer, held = min(C, window) on sliding-window layers.
Pure math: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from tfcalc.calc.kv_cache import tokens_held
from tfcalc.calc.memory import activation_workspace_bytes
from tfcalc.calc.params import Params, attention_params, ffn_params, norm_params_per_layer
from tfcalc.dtypes import DType, WeightPrecision, vector_dtype
from tfcalc.errors import UsageError
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec

GIB = 1 << 30
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_SIZE = 16
DEFAULT_RUNTIME_OVERHEAD = 1 << 30
DEFAULT_PREFILL_CHUNK = 8192


def _gib(value: float) -> str:
    return f"{value / GIB:,.2f} GiB"


# --- sharding --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp


def check_parallelism(spec: ModelSpec, num_gpus: int, tp: int, pp: int = 1, ep: int = 1) -> Parallelism:
    """Validate tp / pp / ep against the model and the GPU count; UsageError with the reason otherwise."""
    n = spec.name
    if min(num_gpus, tp, pp, ep) < 1:
        raise UsageError("num_gpus, tp, pp and ep must be positive")
    if spec.num_attention_heads % tp:
        raise UsageError(f"tp {tp} does not divide the {spec.num_attention_heads} attention heads of {n}")
    if spec.mla is None and tp % spec.num_kv_heads and spec.num_kv_heads % tp:
        raise UsageError(f"tp {tp} is neither a multiple nor a divisor of the {spec.num_kv_heads} KV heads of {n}")
    if num_gpus % (tp * pp):
        raise UsageError(f"tp x pp = {tp * pp} does not divide the GPU count {num_gpus}")
    if pp > spec.num_layers:
        raise UsageError(f"pp {pp} exceeds the {spec.num_layers} layers of {n}")
    if ep > 1:
        if spec.moe is None:
            raise UsageError(f"ep {ep} given but {n} has no experts")
        if ep % tp and tp % ep:
            raise UsageError(f"ep {ep} must divide tp {tp} or be a multiple of it")
        if spec.moe.num_experts % ep:
            raise UsageError(f"ep {ep} does not divide the {spec.moe.num_experts} experts of {n}")
        if (num_gpus // pp) % ep:
            raise UsageError(f"ep {ep} does not divide the {num_gpus // pp} GPUs of one pipeline stage")
    return Parallelism(tp, pp, ep, num_gpus // (tp * pp))


def _div(p: Params, k: int) -> Params:
    return Params(p.matrix // k, p.vector)


@dataclass(frozen=True)
class Shard:
    """Weight elements one GPU holds (per layer where marked) and its KV elements per token per layer."""

    embedding: Params
    lm_head: Params
    final_norm: Params
    attention: Params            # per layer
    norms: Params                # per layer
    mlp: Params                  # per dense layer
    expert: Params               # one routed expert's part on this GPU
    experts_resident: int        # routed experts per MoE layer on this GPU
    experts_active: Fraction     # routed experts one token uses on this GPU, on average
    shared_experts: Params       # per MoE layer
    router: Params               # per MoE layer
    kv_elements: int             # per token per layer
    kv_heads: int                # KV heads per GPU (0 for MLA)
    query_heads: int


def shard(spec: ModelSpec, par: Parallelism) -> Shard:
    tp, h, v = par.tp, spec.hidden_size, spec.vocab_size
    if spec.mla is not None:
        m = spec.mla
        q_out = spec.num_attention_heads * m.qk_head_dim
        replicated = h * (m.kv_lora_rank + m.qk_rope_head_dim) + (h * m.q_lora_rank if m.q_lora_rank else 0)
        split = (m.q_lora_rank or h) * q_out + m.kv_lora_rank * spec.num_attention_heads * (
            m.qk_nope_head_dim + m.v_head_dim) + spec.num_attention_heads * m.v_head_dim * h
        attention = Params(replicated + split // tp, attention_params(spec).vector)
        kv_elements, kv_heads = m.latent_elements_per_token_per_layer, 0
    else:
        d = spec.head_dim
        kv_heads = max(spec.num_kv_heads // tp, 1)
        q_out = spec.num_attention_heads * d
        attention = Params(2 * h * q_out // tp + 2 * h * kv_heads * d, attention_params(spec).vector)
        kv_elements = 2 * kv_heads * d
    final_norm = Params(vector=h * (2 if spec.norm_kind == "layernorm" else 1))
    expert = Params()
    resident, active = 0, Fraction(0)
    shared = router = Params()
    if spec.moe is not None:
        moe = spec.moe
        full = ffn_params(spec, moe.expert_intermediate_size, moe.expert_bias)
        if par.ep > 1:
            expert, resident = _div(full, max(tp // par.ep, 1)), moe.num_experts // par.ep
            active = Fraction(moe.experts_per_token, par.ep)
        else:
            expert, resident, active = _div(full, tp), moe.num_experts, Fraction(moe.experts_per_token)
        if moe.num_shared_experts:
            shared = _div(ffn_params(spec, moe.shared_expert_intermediate_size, False) * moe.num_shared_experts, tp)
            shared = shared + Params(matrix=h if moe.shared_expert_gate else 0)
        router = Params(h * moe.num_experts, (moe.num_experts if moe.router_bias else 0)
                        + (moe.num_experts if moe.router_score_correction_bias else 0))
    return Shard(
        embedding=Params(matrix=v * h // tp),
        lm_head=Params() if spec.tie_word_embeddings else Params(matrix=v * h // tp),
        final_norm=final_norm, attention=attention, norms=norm_params_per_layer(spec),
        mlp=_div(ffn_params(spec, spec.intermediate_size, spec.mlp_bias), tp), expert=expert,
        experts_resident=resident, experts_active=active, shared_experts=shared, router=router,
        kv_elements=kv_elements, kv_heads=kv_heads, query_heads=spec.num_attention_heads // tp)


def param_bytes(p: Params, precision: WeightPrecision, component: str) -> Fraction:
    """Matrices in the component's format (scales included), 1-D tensors 16-bit when matrices are quantized."""
    dtype = precision.for_component(component)
    return dtype.bytes_for(p.matrix) + vector_dtype(dtype).bytes_for(p.vector)


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Contiguous layer runs as vLLM splits them: the num_layers % pp extra layers go one each to the stages
    before the last, counting back from the second-to-last (the last stage also runs the lm_head)."""
    base, extra = divmod(num_layers, pp)
    sizes = [base + (1 if pp - 1 - extra <= s < pp - 1 else 0) for s in range(pp)]
    starts = [sum(sizes[:s]) for s in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def layer_weight_bytes(spec: ModelSpec, sh: Shard, precision: WeightPrecision, layer: int) -> Fraction:
    total = param_bytes(sh.attention, precision, "attention") + param_bytes(sh.norms, precision, "norms")
    if spec.is_moe_layer(layer):
        total += param_bytes(sh.expert * sh.experts_resident, precision, "experts")
        total += param_bytes(sh.shared_experts, precision, "shared_experts")
        total += param_bytes(sh.router, precision, "router")
    else:
        total += param_bytes(sh.mlp, precision, "mlp")
    return total


def stage_weight_bytes(spec: ModelSpec, sh: Shard, precision: WeightPrecision, layers: range, first: bool,
                       last: bool) -> int:
    total = sum((layer_weight_bytes(spec, sh, precision, i) for i in layers), Fraction(0))
    if first:
        total += param_bytes(sh.embedding, precision, "embedding")
    if last:
        total += param_bytes(sh.final_norm, precision, "norms")
        if spec.tie_word_embeddings:
            if not first:
                total += param_bytes(sh.embedding, precision, "embedding")
        else:
            total += param_bytes(sh.lm_head, precision, "lm_head")
    return math.ceil(total)


def paged_tokens(spec: ModelSpec, layer: int, context: int, block_size: int) -> int:
    """Tokens of cache one sequence occupies in ``layer``: held tokens rounded up to whole blocks."""
    held = tokens_held(spec, layer, context)
    return -(-held // block_size) * block_size


def stage_kv_bytes_per_sequence(spec: ModelSpec, sh: Shard, kv_dtype: DType, layers: range, context: int,
                                block_size: int) -> int:
    tokens = sum(paged_tokens(spec, i, context, block_size) for i in layers)
    return math.ceil(kv_dtype.bytes_for(tokens * sh.kv_elements))


# --- the plan --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanConfig:
    num_gpus: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    context: int = 4096
    batch: int = 1
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    block_size: int = DEFAULT_BLOCK_SIZE
    runtime_overhead_bytes: int = DEFAULT_RUNTIME_OVERHEAD
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK


@dataclass(frozen=True)
class PlanResult:
    parallelism: Parallelism
    memory_bytes_per_gpu: int
    weights_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_sequence_per_gpu: int
    reserved_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    kv_blocks_per_gpu: int
    max_concurrent_sequences: int
    max_context_at_batch: int
    fits: bool
    reason: str
    shortfall_bytes_per_gpu: int
    trace: tuple[str, ...]


@dataclass(frozen=True)
class _Stage:
    layers: range
    weights: int
    budget: int
    kv_per_token: int


def _stages(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, cfg: PlanConfig,
            par: Parallelism, sh: Shard, reserved: int) -> list[_Stage]:
    ranges = stage_layers(spec.num_layers, par.pp)
    stages = []
    for s, layers in enumerate(ranges):
        weights = stage_weight_bytes(spec, sh, precision, layers, s == 0, s == len(ranges) - 1)
        per_token = math.ceil(kv_dtype.bytes_for(len(layers) * sh.kv_elements))
        stages.append(_Stage(layers, weights, gpu.memory_bytes - weights - reserved, per_token))
    return stages


def _sequences(spec: ModelSpec, sh: Shard, kv_dtype: DType, stages: list[_Stage], context: int,
               block_size: int) -> int:
    """Sequences of ``context`` tokens one replica holds: min over stages of budget // per-sequence bytes."""
    fits = []
    for st in stages:
        per_seq = stage_kv_bytes_per_sequence(spec, sh, kv_dtype, st.layers, context, block_size)
        fits.append(max(st.budget, 0) // per_seq if per_seq else 0)
    return min(fits)


def plan_fit(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, cfg: PlanConfig,
             activation_dtype: DType | None = None) -> PlanResult:
    """Weights, reserved memory and KV budget per GPU; sequences at ``cfg.context``; context at ``cfg.batch``."""
    from tfcalc.dtypes import get_dtype

    if not 0 < cfg.gpu_memory_utilization <= 1:
        raise UsageError(f"gpu memory utilization must be in (0, 1], got {cfg.gpu_memory_utilization}")
    if cfg.block_size < 1:
        raise UsageError("block size must be positive")
    par = check_parallelism(spec, cfg.num_gpus, cfg.tp, cfg.pp, cfg.ep)
    sh = shard(spec, par)
    act_dtype = activation_dtype or get_dtype("bf16")
    # One prefill chunk of one sequence (its last position's logits), per GPU.
    activations = activation_workspace_bytes(spec, 1, cfg.prefill_chunk_tokens, act_dtype, cfg.prefill_chunk_tokens,
                                             par.tp)
    headroom = round(gpu.memory_bytes * (1 - cfg.gpu_memory_utilization))
    reserved = headroom + cfg.runtime_overhead_bytes + activations
    stages = _stages(spec, gpu, precision, kv_dtype, cfg, par, sh, reserved)
    worst = min(stages, key=lambda st: st.budget)
    per_replica = _sequences(spec, sh, kv_dtype, stages, cfg.context, cfg.block_size)
    sequences = per_replica * par.dp
    need_per_replica = -(-cfg.batch // par.dp)
    max_context = _max_context(spec, sh, kv_dtype, stages, need_per_replica, cfg.block_size,
                               max(spec.max_context, cfg.context))
    per_seq = max(stage_kv_bytes_per_sequence(spec, sh, kv_dtype, st.layers, cfg.context, cfg.block_size)
                  for st in stages)
    weights = max(st.weights for st in stages)
    per_token = max(st.kv_per_token for st in stages)
    blocks = max(worst.budget, 0) // (cfg.block_size * worst.kv_per_token) if worst.kv_per_token else 0
    usable = gpu.memory_bytes - reserved
    if worst.budget <= 0:
        short = -worst.budget + per_seq * need_per_replica
        reason = (f"weights {_gib(worst.weights)} per GPU exceed the {_gib(usable)} left after reserved memory: "
                  f"short by {_gib(-worst.budget)} before any KV cache, {_gib(short)} for batch {cfg.batch} at "
                  f"context {cfg.context:,}")
    elif sequences >= cfg.batch:
        short = 0
        noun = "sequence" if sequences == 1 else "sequences"
        reason = f"fits: {sequences:,} {noun} of {cfg.context:,} tokens, batch {cfg.batch:,} asked"
    else:
        short = per_seq * need_per_replica - worst.budget
        reason = (f"KV for batch {cfg.batch:,} at context {cfg.context:,} needs {_gib(per_seq * need_per_replica)} "
                  f"per GPU, {_gib(worst.budget)} left: short by {_gib(short)}; "
                  f"{sequences:,} sequences fit, or context {max_context:,} at this batch")
    if cfg.context > spec.max_context:
        reason += (f"; note: context {cfg.context:,} exceeds {spec.name}'s maximum {spec.max_context:,} (the memory "
                   "figures assume the engine allows it)")
    kv_w = " (window caps applied)" if spec.sliding_window is not None else ""
    mla = " (MLA latent, not split by TP)" if spec.mla is not None else ""
    rep = (f" (KV heads replicated: {sh.kv_heads} per GPU, tp {par.tp} > {spec.num_kv_heads} KV heads)"
           if spec.mla is None and par.tp > spec.num_kv_heads else "")
    trace = (
        f"parallelism: tp {par.tp} x pp {par.pp} x dp {par.dp} = {par.num_gpus} GPUs, ep {par.ep}"
        + (f"; layers per stage {'/'.join(str(len(st.layers)) for st in stages)}" if par.pp > 1 else ""),
        f"weights per GPU (largest stage) = {weights:,} B = {_gib(weights)} [{precision.label}]",
        f"reserved = capacity {gpu.memory_bytes:,} x (1 - {cfg.gpu_memory_utilization}) = {headroom:,} + runtime "
        f"overhead {cfg.runtime_overhead_bytes:,} + activations {activations:,} (chunk {cfg.prefill_chunk_tokens:,} "
        f"tokens) = {reserved:,} B = {_gib(reserved)}",
        f"KV budget = {gpu.memory_bytes:,} - {worst.weights:,} - {reserved:,} = {worst.budget:,} B "
        f"= {_gib(worst.budget)}",
        f"KV per token per GPU = {len(worst.layers)} layers x {sh.kv_elements} elements x "
        f"{kv_dtype.bits_per_element} bits / 8 = {per_token:,} B{mla}{rep}",
        f"KV per sequence at {cfg.context:,} tokens, blocks of {cfg.block_size}{kv_w} = {per_seq:,} B",
        f"max sequences = {par.dp} replica(s) x floor({max(worst.budget, 0):,} / {per_seq:,}) = {sequences:,}",
        f"max context at batch {cfg.batch:,} = {max_context:,} (capped at {max(spec.max_context, cfg.context):,})",
        reason,
    )
    return PlanResult(par, gpu.memory_bytes, weights, per_token, per_seq, reserved, activations, worst.budget,
                      blocks, sequences, max_context, worst.budget > 0 and sequences >= cfg.batch, reason, short,
                      trace)


def _max_context(spec: ModelSpec, sh: Shard, kv_dtype: DType, stages: list[_Stage], batch: int, block_size: int,
                 cap: int) -> int:
    """Largest context (a multiple of 1 token, at most ``cap``) at which ``batch`` sequences fit; 0 if none."""
    def ok(c: int) -> bool:
        return _sequences(spec, sh, kv_dtype, stages, c, block_size) >= batch

    if not ok(1):
        return 0
    if ok(cap):
        return cap
    lo, hi = 1, cap  # ok(lo), not ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def candidate_layouts(spec: ModelSpec, num_gpus: int, gpus_per_node: int, tps: list[int] | None = None,
                      pps: list[int] | None = None) -> list[tuple[int, int]]:
    """Valid (tp, pp) for ``num_gpus``, largest tp first.

    Default: tensor parallel inside a node, pipeline parallel only across whole nodes, as vLLM recommends
    (tp = GPUs per node, pp = nodes): pp 1 up to ``gpus_per_node`` GPUs, then multiples of a node. ``tps`` /
    ``pps`` replace that rule with the degrees a user allows (``pps=[1, 2, 3]`` admits 3 stages in one node).
    """
    layouts = []
    for tp in sorted(tps, reverse=True) if tps else range(min(num_gpus, gpus_per_node), 0, -1):
        if num_gpus % tp:
            continue
        pp = num_gpus // tp
        if pps and pp not in pps:
            continue
        if not tps and not pps and pp > 1 and num_gpus % gpus_per_node:
            continue
        try:
            check_parallelism(spec, num_gpus, tp, pp)
        except UsageError:
            continue
        layouts.append((tp, pp))
    return layouts


def min_gpus(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, cfg: PlanConfig,
             max_gpus: int = 512, gpus_per_node: int = 8, tps: list[int] | None = None,
             pps: list[int] | None = None) -> PlanResult | None:
    """The smallest GPU count (and its first layout from ``candidate_layouts``) where ``cfg.batch`` sequences of
    ``cfg.context`` tokens fit; None up to ``max_gpus``."""
    from dataclasses import replace

    rule = (f"tp in {tps or 'any'}, pp in {pps or 'any'}" if tps or pps else
            f"tp within a node of {gpus_per_node}, pp only across whole nodes")
    for n in range(1, max_gpus + 1):
        for tp, pp in candidate_layouts(spec, n, gpus_per_node, tps, pps):
            result = plan_fit(spec, gpu, precision, kv_dtype, replace(cfg, num_gpus=n, tp=tp, pp=pp, ep=1))
            if result.fits:
                line = f"--min-gpus: {n} is the smallest GPU count that fits with {rule}"
                return replace(result, trace=(line, *result.trace))
    return None
