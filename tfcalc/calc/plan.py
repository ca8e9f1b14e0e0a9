"""Fit planning: what one GPU holds, what the serving engine leaves for the KV cache, and how many sequences fit.

Sharding and layer grouping: ``tfcalc.calc.shard``. Memory per GPU follows the engine (``cfg.engine``, an
``EngineSpec`` from presets/engines; formulas in ``tfcalc.calc.engine``):

- vLLM:    KV budget = capacity x gpu_memory_utilization - weights - activation peak - non-torch [- CUDA graphs];
  blocks of block_size tokens per layer; hybrid sliding-window models in padded layer groups; "GPU KV cache
  size" = blocks // groups x block_size; "Maximum concurrency" = blocks / blocks of one max_model_len request.
- SGLang:  KV pool = (capacity - startup) x mem_fraction_static - weights, in tokens (page size 1).
- TensorRT-LLM: KV = (capacity - peak of the dry run) x free_gpu_memory_fraction, blocks of 32 tokens.
- ``engine=None`` ("ideal"; also an engine preset with ``budget: ideal``, gpt-fast): reserved = capacity x
  (1 - utilization) + runtime overhead + one prefill chunk's activations; KV budget = capacity - weights -
  reserved; a sequence of C tokens takes ceil(held / block) blocks per layer, held = min(C, window) on
  sliding-window layers.

Weights follow the checkpoint as the engine loads it: vocabulary padded, rotary cos/sin cache, MLA's absorbed
kv_b copies, MXFP4 expert padding, per-layer format exceptions. Pure math, no I/O; sentences are built in
``tfcalc.report.plan``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache

from tfcalc.calc import engine as eng
from tfcalc.calc.kv_cache import (
    compressed_entry_bytes,
    compressed_held_bytes,
    compressed_indexer_bytes,
    compressed_rate,
    compressor_state_bytes,
    indexer_key_bytes,
    kv_layer_bytes,
    state_dtypes,
)
from tfcalc.calc.memory import activation_workspace_bytes
from tfcalc.calc.params import Params
from tfcalc.calc.shard import (
    Parallelism,
    Shard,
    StageCensus,
    attention_ranks,
    census_weight_bytes,
    check_parallelism,
    check_weight_blocks,
    exception_counts,
    expert_tp,
    param_bytes,
    shard,
    stage_census,
    stage_layers,
)
from tfcalc.dtypes import DType, WeightPrecision, get_dtype
from tfcalc.errors import UsageError
from tfcalc.spec.engine import EngineSpec, memory_model
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec

__all__ = ["Parallelism", "PlanConfig", "PlanResult", "Shard", "candidate_layouts", "check_parallelism",
           "min_gpus", "param_bytes", "plan_fit", "shard", "stage_layers"]

GIB = 1 << 30
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_SIZE = 16
DEFAULT_RUNTIME_OVERHEAD = 1 << 30
DEFAULT_PREFILL_CHUNK = 8192
MAX_SEARCH_GPUS = 1 << 40


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """One setting to plan. ``None`` means the engine's default (vLLM: --gpu-memory-utilization 0.9,
    --block-size 16, --max-num-seqs / --max-num-batched-tokens by GPU); ``engine=None`` is the ideal arithmetic,
    for which ``runtime_overhead_bytes`` and ``max_num_batched_tokens`` (one prefill chunk) size the reserve."""

    num_gpus: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    redundant_experts: int = 0   # EPLB's expert replicas, spread over ep with the experts (``shard``)
    context: int = 4096
    batch: int = 1
    engine: EngineSpec | None = None
    gpu_memory_utilization: float | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    runtime_overhead_bytes: int = DEFAULT_RUNTIME_OVERHEAD
    cuda_graphs_in_budget: bool | None = None
    kv_cache_memory_bytes: int | None = None   # vLLM --kv-cache-memory-bytes: the KV cache per GPU, set outright


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """One pipeline stage (all GPUs of a stage alike)."""

    layers: range
    census: StageCensus
    weights_bytes: int
    activation_peak_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int        # every layer of the stage holding the token
    kv_page_bytes: int             # one block of one layer
    kv_groups: eng.KVGroups
    kv_pool_blocks: int            # blocks the engine allocates (vLLM num_gpu_blocks)
    kv_tokens: int                 # tokens the engine reports ("GPU KV cache size")
    kv_pool_tokens: int            # tokens its pool holds in each layer group (blocks // groups x block)
    blocks_per_request: int        # blocks one request of `context` tokens needs (engine's definition)
    sequences: int                 # engine's max concurrency at `context`, floored
    sequences_window_aware: int    # sliding layers holding min(context, window) only
    kv_bytes_per_sequence: int     # bytes one sequence of `context` tokens takes, the engine's way
    running_cap: int | None = None  # the engine's own cap on running requests (SGLang's state slots), if any


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    """Every term of one GPU's budget, in bytes, and what fits. Ideal (``engine=None``) figures are beside the
    engine's in the ``*_ideal`` fields when an engine is modelled."""

    parallelism: Parallelism
    engine: EngineSpec | None
    capacity_bytes: int                   # as the engine budgets it: runtime-reported for engines
    capacity_is_runtime: bool
    memory_bytes_per_gpu: int             # nominal capacity
    memory_fraction: float                # gpu_memory_utilization / mem_fraction_static / free fraction
    requested_bytes: int                  # the part of capacity the engine's fraction hands out
    startup_bytes: int
    non_torch_bytes: int
    activation_peak_bytes: int
    cuda_graph_bytes: int
    cuda_graphs_in_budget: bool
    weights_bytes_per_gpu: int
    reserved_bytes_per_gpu: int           # capacity - weights - KV budget
    kv_budget_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_sequence_per_gpu: int
    kv_tokens_per_gpu: int
    kv_pool_tokens_per_gpu: int           # tokens the pool holds in each layer group (the serving model's pool)
    kv_blocks_per_gpu: int                # kv_pool_tokens / block_size
    kv_pool_blocks_per_gpu: int
    kv_blocks_per_request: int            # blocks one request of `context` tokens takes (engine's definition)
    kv_groups: int
    kv_group_size: int
    kv_padding_layers: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_concurrent_sequences: int
    max_concurrent_sequences_window_aware: int
    max_context_at_batch: int
    fits: bool
    shortfall_bytes_per_gpu: int
    stage_layer_counts: tuple[int, ...]
    rotary_cache_bytes: int
    mla_absorbed_bytes: int
    vocab_rows: int
    mxfp4_padded_hidden: int              # 0 unless MXFP4 experts were padded
    mxfp4_padded_intermediate: int
    kv_heads_per_gpu: int
    kv_elements_per_token_per_layer: int
    activation_forward_bytes: int
    activation_sampler_bytes: int
    activation_state_bytes: int = 0       # the sampler's persistent penalty state, within the activation peak
    activation_workspace_bytes: int = 0   # the fused-MoE workspace kept once made, within the activation peak
    kv_budget_bytes_per_gpu_ideal: int | None = None
    max_concurrent_sequences_ideal: int | None = None
    weights_bytes_per_gpu_ideal: int | None = None
    state_bytes_per_layer: int = 0        # one request's state in one Gated DeltaNet layer on one GPU
    state_slot_bytes_per_gpu: int = 0     # max_num_seqs states allocated before the KV cache (kv.state_slots)
    uncounted_state_bytes: int = 0        # the sampler's penalty state held outside every budget term (the slack)
    block_size_asked: int = 0             # the block size before vLLM raised it to hold a state page
    max_running_requests: int | None = None   # per replica, the engine's own cap from its state pool (SGLang)
    # a KV cache set outright (--kv-cache-memory-bytes): the capacity less it and everything else the engine holds
    # (startup, weights, activation peak, non-torch, CUDA graphs, state the budget counts nowhere), on the tightest
    # GPU, negative where they do not fit; None where the engine sizes the cache
    kv_set_headroom_bytes: int | None = None

    @property
    def activation_bytes_per_gpu(self) -> int:
        return self.activation_peak_bytes

    @property
    def kv_budget_set(self) -> bool:
        """The KV budget is --kv-cache-memory-bytes, not the engine's sizing."""
        return self.kv_set_headroom_bytes is not None

    @property
    def overcommit_bytes_per_gpu(self) -> int:
        """What a set KV cache and the rest take beyond the capacity (0 where they fit or nothing is set)."""
        return max(-(self.kv_set_headroom_bytes or 0), 0)

    @property
    def activation_transient_bytes(self) -> int:
        """The activation peak less what stays allocated after it (the sampler's state, the fused-MoE workspace)."""
        return self.activation_peak_bytes - self.activation_state_bytes - self.activation_workspace_bytes

    @property
    def capture_headroom_bytes(self) -> int | None:
        """Memory free when a utilization engine that does not budget its CUDA graphs captures them, after the KV cache
        is allocated (vLLM 0.17-0.19, the V2 runner of 0.22-0.28): capacity - startup - requested + the transient
        peak the allocator gave back - what the budget counts nowhere (the V2 runner's penalty state until 0.27);
        None where the graphs are budgeted or the budget is another kind."""
        e = self.engine
        if (e is None or e.budget != "utilization" or e.overheads is None or e.overheads.startup_in_budget
                or self.cuda_graphs_in_budget or self.kv_budget_set):
            return None
        return (self.capacity_bytes - self.startup_bytes - self.requested_bytes + self.activation_transient_bytes
                - self.uncounted_state_bytes)

    def state_slots_that_fit(self, sequences: int) -> int | None:
        """The most max_num_seqs state slots (``kv.state_slots``) beside which ``sequences`` requests' KV still fit
        on every GPU: the KV budget (X - slots x slot) x fraction, X read back from this plan; None where the
        engine keeps no such slots or sizes its KV otherwise than from the free memory."""
        if not self.state_slot_bytes_per_gpu or self.engine is None or self.engine.budget != "free_fraction":
            return None
        slot = self.state_slot_bytes_per_gpu / self.max_num_seqs
        held = self.kv_budget_bytes_per_gpu / self.memory_fraction + self.state_slot_bytes_per_gpu
        return max(math.floor((held - sequences * self.kv_bytes_per_sequence_per_gpu / self.memory_fraction)
                              / slot), 0)

    @property
    def sizing_margin_bytes(self) -> int:
        """Budget "measured": what the engine keeps free beside the transient peak (0 for other budgets)."""
        m = self.engine.sizing_margin if self.engine is not None else None
        return m.bytes_for(self.activation_transient_bytes) if m is not None else 0


# --- engine-specific weights --------------------------------------------------------------------------------


def _rotary_cache_elements(spec: ModelSpec) -> int:
    """vLLM get_rope: one cos/sin cache [positions, rotary dim] shared by all layers (one per head size: Gemma 4's
    and MiMo-V2-Flash's full layers get their own), the rotary dim the dimensions turned (RotaryEmbedding
    _compute_cos_sin_cache: cos and sin of rotary_dim / 2 frequencies each); positions = max_position x factor for
    linear / dynamic scaling, original x factor for YaRN, max_position otherwise. None where every attention layer
    is NoPE (Nemotron-H's; Kimi Linear's MLA: vLLM MultiHeadLatentAttention use_rope False)."""
    attention = {i for i in range(spec.num_layers) if spec.has_mixer(i) and not spec.is_linear_layer(i)}
    if attention <= set(spec.nope_layers):
        return 0
    rotary = spec.rotary_dim
    if spec.full_attention is not None:
        rotary += spec.full_layer_spec.rotary_dim
    positions = spec.max_context
    s = spec.rope_scaling
    if s is not None:
        if s.rope_type in ("linear", "dynamic"):
            positions = int(spec.max_context * s.factor)
        elif s.rope_type in ("yarn", "deepseek_yarn"):
            positions = int((s.original_max_position_embeddings or spec.max_context) * s.factor)
    return positions * rotary


def _engine_shard(spec: ModelSpec, par: Parallelism, engine: EngineSpec | None, precision: WeightPrecision
                  ) -> tuple[Shard, int, tuple[int, int]]:
    """The shard as the engine loads it: padded vocabulary rows, MXFP4 experts padded to the kernel's layout."""
    if engine is None:
        return shard(spec, par), spec.vocab_size, (0, 0)
    pad = engine.weights.vocab_padding
    rows = -(-spec.vocab_size // pad) * pad
    sh = shard(spec, par, vocab_rows=rows)
    padded = (0, 0)
    if spec.moe is not None and precision.for_component("experts").name == "mxfp4":
        w, moe = engine.weights, spec.moe
        width = moe.latent_size or spec.hidden_size  # a latent MoE's experts run on the latent (Kimi K3)
        h = -(-width // w.mxfp4_pad_hidden) * w.mxfp4_pad_hidden
        inter = -(-(moe.expert_intermediate_size // expert_tp(par)) // w.mxfp4_pad_intermediate) * (
            w.mxfp4_pad_intermediate)
        gated = spec.ffn_kind == "gated"
        matrix = (3 if gated else 2) * h * inter
        vector = ((2 if gated else 1) * inter + h) if moe.expert_bias else 0
        if (h, inter) != (width, moe.expert_intermediate_size // expert_tp(par)):
            padded = (h, inter)
        sh = replace(sh, expert=Params(matrix=matrix, vector=vector))
    return sh, rows, padded


def _extra_weight_bytes(spec: ModelSpec, engine: EngineSpec | None, par: Parallelism, layers: int,
                        model_dtype_bytes: int = 2) -> tuple[int, int]:
    """(rotary cos/sin cache, MLA absorbed W_UK / W_UV copies) bytes one GPU of a stage holds."""
    if engine is None:
        return 0, 0
    rotary = _rotary_cache_elements(spec) * model_dtype_bytes if engine.weights.rotary_cache else 0
    absorbed = 0
    if spec.mla is not None and engine.weights.mla_absorbed_copy:
        m = spec.mla
        absorbed = layers * m.kv_lora_rank * spec.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim) // (
            par.tp) * model_dtype_bytes
    return rotary, absorbed


def _value_slot_bytes(spec: ModelSpec, engine: EngineSpec | None, sh: Shard, precision: WeightPrecision,
                      census: StageCensus) -> int:
    """Gemma 4's k_eq_v layers have no v_proj, but engines fill the V slot of their fused qkv projection with a copy
    of k_proj (vLLM gemma4.py): full layers x one GPU's k_proj, in the attention's format."""
    full = spec.full_layer_spec
    if engine is None or not full.attention_k_eq_v or not census.full_layers:
        return 0
    k_proj = Params(matrix=spec.hidden_size * full.head_dim * sh.full_kv_heads)
    return math.ceil(census.full_layers * param_bytes(k_proj, precision, "attention"))


# --- activation inputs --------------------------------------------------------------------------------------


def _activation_inputs(spec: ModelSpec, sh: Shard, par: Parallelism, census: StageCensus, vocab_rows: int,
                       first: bool, last: bool, precision: WeightPrecision) -> eng.ActivationInputs:
    if spec.mla is not None:
        m = spec.mla
        attention = sh.query_heads * (2 * m.qk_head_dim + 2 * m.v_head_dim)
    else:
        full = spec.full_layer_spec  # q, k, v and the attention output: heads x (head_dim + value_head_dim)
        attention = max((sh.query_heads + sh.kv_heads) * spec.head_kv_elements,
                        (sh.query_heads + sh.full_kv_heads) * full.head_kv_elements
                        if census.full_layers else 0)
    beside = spec.moe is not None and spec.moe.dense_mlp_beside
    mlp = 3 * spec.intermediate_size // par.tp if census.dense_layers or beside else 0
    workspace = output = 0
    if spec.moe is not None and census.moe_layers:
        moe = spec.moe
        inter = moe.expert_intermediate_size // expert_tp(par)
        top_k = moe.experts_per_token
        if precision.for_component("experts").name != "mxfp4":  # OAI Triton matmul_ogs keeps no workspace
            workspace = top_k * (max(2 * inter, spec.hidden_size) + inter)
        shared = moe.num_shared_experts * moe.shared_expert_intermediate_size // par.tp
        output = top_k * spec.hidden_size + 3 * shared
    return eng.ActivationInputs(hidden=spec.hidden_size, attention_width=attention, mlp_width=mlp,
                                moe_workspace=workspace, moe_output=output, vocab=vocab_rows, last_stage=last,
                                receives_activations=not first, model_vocab=spec.vocab_size)


# --- KV allocation ------------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _ceil_bytes(dtype: DType, elements: int) -> int:
    return math.ceil(dtype.bytes_for(elements))


def _ideal_sequences(spec: ModelSpec, census: StageCensus, context: int, block: int, pages: tuple[int, int],
                     budget: int, state: int, indexer_page: int = 0) -> tuple[int, int]:
    """(bytes per sequence, sequences): ceil(held / block) blocks per layer, held = min(C, window) if sliding, and
    ``state`` bytes in each Gated DeltaNet layer; ``pages``: one block of a sliding and of a full layer;
    ``indexer_page``: one block of a DSA indexer's keys, in each indexed layer."""
    window = spec.sliding_window
    full_blocks = -(-context // block)
    sliding_blocks = -(-min(context, window) // block) if window is not None else full_blocks
    per_seq = (census.full_layers * full_blocks * pages[1] + census.sliding_layers * sliding_blocks * pages[0]
               + census.indexer_layers * full_blocks * indexer_page + census.linear_layers * state)
    return per_seq, (max(budget, 0) // per_seq if per_seq else 0)


@dataclass(frozen=True, kw_only=True)
class _Allocation:
    page: int                 # bytes of one block of one layer
    per_token: int            # bytes of one token in every layer of the stage
    groups: eng.KVGroups
    pool: int                 # blocks allocated per layer slot
    tokens: int               # tokens the engine reports
    pool_tokens: int          # tokens the pool holds in each layer group
    per_request: int          # blocks one request of `context` tokens takes (in layer-slot blocks)
    sequences: int
    window_aware: int
    per_seq: int              # bytes one sequence takes
    running_cap: int | None = None  # running requests the engine's state pool admits at most (SGLang)


def _allocate(spec: ModelSpec, engine: EngineSpec | None, census: StageCensus, kv_dtype: DType, kv_elements: int,
              budget: int, context: int, block: int, in_flight: int, state: int = 0,
              full_elements: int | None = None, sparse_record: bool = True) -> _Allocation:
    """The engine's KV pool of one stage and what one request of ``context`` tokens takes from it (its sliding
    groups reserving room for ``in_flight`` tokens, ``engine.in_flight_tokens``); ``state``: one request's state in
    one Gated DeltaNet layer (bytes); ``full_elements``: a full-attention layer's elements per token where they
    differ from ``kv_elements`` (Gemma 4); ``sparse_record``: an 8-bit DSA cache in FlashMLA's record (else the raw
    latent, ``engine.sparse_mla_raw``)."""
    if spec.compressed_attention is not None:
        return _compressed_allocation(spec, engine, census, kv_dtype, max(budget, 0), context, block, in_flight)
    full_elements = kv_elements if full_elements is None else full_elements
    pages = (_ceil_bytes(kv_dtype, block * kv_elements), _ceil_bytes(kv_dtype, block * full_elements))
    per_token = _ceil_bytes(kv_dtype, census.sliding_layers * kv_elements + census.full_layers * full_elements)
    indexer_page = block * indexer_key_bytes(spec)  # DSA: the indexer keys, a page of their own in each layer
    if spec.sparse_indexer is not None:
        record = kv_layer_bytes(spec, kv_dtype, sliding=False, record=sparse_record)  # fp8: FlashMLA's record
        pages = (pages[0], math.ceil(block * record))
        per_token = math.ceil(census.full_layers * record + census.indexer_layers * indexer_key_bytes(spec))
    page = max(pages)
    window = spec.sliding_window
    free = max(budget, 0)
    per_seq_ideal, seqs_ideal = _ideal_sequences(spec, census, context, block, pages, free, state, indexer_page)
    full_blocks = -(-context // block)
    plain = eng.kv_groups(None, census.full_layers, census.sliding_layers)
    if engine is None:  # blocks counted over all layers, sliding layers capped at their window
        blocks = free // (block * per_token) if per_token else 0
        return _Allocation(page=page, per_token=per_token, groups=plain, pool=blocks, tokens=blocks * block,
                           pool_tokens=blocks * block, per_request=census.layers * full_blocks,
                           sequences=seqs_ideal, window_aware=seqs_ideal,
                           per_seq=per_seq_ideal)
    # an engine that does not free a chunked layer's earlier chunks (Llama 4) caches those layers as full ones
    chunks_full = spec.chunked_attention and not engine.kv.chunked_local
    every_layer = (census.sliding_layers * pages[0] + census.full_layers * pages[1]  # one block in each layer
                   + census.indexer_layers * indexer_page)
    if engine.kv.concurrency == "pool":
        ratio = engine.kv.swa_full_tokens_ratio
        if ratio is not None and census.sliding_layers and window is not None and not chunks_full:
            # SGLang's hybrid SWA pool: the sliding layers' pool holds ratio x the full layers' tokens.
            r = Fraction(ratio).limit_denominator(1000)
            full_cell = kv_dtype.bytes_for(census.full_layers * full_elements)
            swa_cell = kv_dtype.bytes_for(census.sliding_layers * kv_elements)
            tokens = int(free / (full_cell + r * swa_cell)) // block * block
            held = min(context, window)
            seqs = min(tokens // context, int(tokens * r) // held)
            return _Allocation(page=page, per_token=per_token, groups=plain, pool=tokens // block, tokens=tokens,
                               pool_tokens=tokens,
                               per_request=full_blocks, sequences=seqs, window_aware=seqs,
                               per_seq=math.ceil(full_cell * context + swa_cell * held))
        rule = engine.kv.state_pool
        if rule is not None and census.linear_layers and state and every_layer:
            # SGLang: a pool of state slots split off the budget first; a running request keeps
            # slots_per_request of them (+ the extra buffer's for Gated DeltaNet)
            per_request = census.linear_layers * state
            slots = eng.state_pool_slots(free, per_request, rule.memory_ratio)
            blocks = max(free - (slots + 1) * per_request, 0) // every_layer
            assert spec.linear_attention is not None
            cap = slots // (rule.slots_per_request + (rule.extra_buffer_slots
                                                      if spec.linear_attention.kind == "gated_deltanet" else 0))
            seqs = min(blocks // full_blocks, cap)
            return _Allocation(page=page, per_token=per_token, groups=plain, pool=blocks, tokens=blocks * block,
                               pool_tokens=blocks * block, per_request=full_blocks, sequences=seqs,
                               window_aware=seqs, per_seq=full_blocks * every_layer, running_cap=cap)
        blocks = free // every_layer if every_layer else 0
        per_seq = full_blocks * every_layer + census.linear_layers * state  # a state per request, beside its KV
        return _Allocation(page=page, per_token=per_token, groups=plain, pool=blocks, tokens=blocks * block,
                           pool_tokens=blocks * block, per_request=full_blocks,
                           sequences=free // per_seq if per_seq else 0,
                           window_aware=seqs_ideal, per_seq=per_seq)
    local = 0 if chunks_full else census.sliding_layers
    groups = eng.kv_groups(engine, census.attention_layers - local, local, census.linear_layers)
    if groups.sliding_groups or groups.state_groups:
        # vLLM unify_kv_cache_spec_page_size: every group's page is the largest layer page; a group of smaller
        # pages holds proportionally more tokens per block
        blocks = eng.unified_block_sizes(block, pages)
        slot = page * groups.group_size  # one block id: a page in each layer slot of a group
    else:  # one group of all layers, each its own page (UniformTypeKVCacheSpecs)
        blocks, slot = (block, block), every_layer
    pool = free // slot if slot else 0
    per_request = eng.blocks_per_request(engine, groups, window, context, in_flight, blocks[0], spec.chunked_attention,
                                         full_block_size=blocks[1], linear_kind=spec.linear_attention.kind
                                         if spec.linear_attention is not None else None)
    if groups.sliding_groups and window is not None:
        aware = (groups.full_groups * -(-context // blocks[1])
                 + groups.sliding_groups * -(-min(context, window) // blocks[0]))
        window_aware = pool // aware
    else:  # sliding layers (if any) cached as full attention by the engine; the window-aware figure is ideal's
        window_aware = seqs_ideal
    per_seq = per_request * slot
    sequences = pool // per_request
    if census.linear_layers and not groups.state_groups:  # states held beside the block pool
        per_seq += census.linear_layers * state
        sequences = free // per_seq
    pool_tokens = pool // groups.num_groups * min(blocks)
    tokens = math.floor(Fraction(pool, per_request) * context) if engine.kv.tokens == "concurrency" else pool_tokens
    return _Allocation(page=page, per_token=per_token, groups=groups, pool=pool, tokens=tokens,
                       pool_tokens=pool_tokens, per_request=per_request, sequences=sequences,
                       window_aware=window_aware, per_seq=per_seq)


def v4_engine_layout(spec: ModelSpec, engine: EngineSpec | None, census: StageCensus,
                     kv_dtype: DType) -> eng.V4Layout | None:
    """The engine's grouping of a DeepSeek-V4 stage's caches (``kv.v4_groups``, ``engine.v4_layout``), None where it
    holds them at their own size: FlashMLA's records and the indexer's keys in pages aligned to 576 bytes where the
    cache is fp8 (fp8_ds_mla), 512 otherwise; fp32 compressor states of 2 x 2 x 512, 2 x 2 x 128 and 2 x 512
    values per token."""
    ca = spec.compressed_attention
    assert ca is not None
    if engine is None or engine.kv.v4_groups is None:
        return None
    fp8 = kv_dtype.bits_per_element == 8
    d, i = spec.head_dim, ca.index_head_dim
    return eng.v4_layout(census.attention_layers, census.csa_layers, census.hca_layers, ca.csa_ratio, ca.hca_ratio,
                         math.ceil(compressed_entry_bytes(spec, kv_dtype)),
                         math.ceil(compressed_indexer_bytes(spec, kv_dtype)),
                         (2 * 2 * d * 4, 2 * 2 * i * 4, 2 * d * 4), 576 if fp8 else 512, engine.kv.v4_groups,
                         engine.kv.v4_concurrency)


def sglang_v4_engine_pool(spec: ModelSpec, engine: EngineSpec | None, census: StageCensus, kv_dtype: DType,
                          budget: int) -> eng.SGLangV4Pool | None:
    """SGLang's DeepSeek-V4 pools for a stage's budget (``kv.v4_pool``, ``engine.sglang_v4_pool``), None where the
    engine holds the cache otherwise: FlashMLA's records (584 B in 8 bits) and the indexer's keys (132 B)."""
    ca = spec.compressed_attention
    if ca is None or engine is None or engine.kv.v4_pool is None:
        return None
    rule = engine.kv.v4_pool
    return eng.sglang_v4_pool(budget, census.attention_layers, census.csa_layers, census.hca_layers, ca.csa_ratio,
                              ca.hca_ratio, math.ceil(compressed_entry_bytes(spec, kv_dtype)),
                              math.ceil(compressed_indexer_bytes(spec, kv_dtype)), spec.head_dim, ca.index_head_dim,
                              rule.swa_ratio, rule.max_running_requests, spec.sliding_window or 0)


def _compressed_allocation(spec: ModelSpec, engine: EngineSpec | None, census: StageCensus, kv_dtype: DType,
                           free: int, context: int, block: int, in_flight: int) -> _Allocation:
    """DeepSeek-V4's cache on one GPU of a stage (its one K=V head whole on every GPU, as MLA's latent). Under an
    engine with vLLM's DeepSeek-V4 groups (``v4_engine_layout``): block ids of ``V4Layout.bytes_per_block``, a
    request of ``context`` tokens reserving each group's pages (its windows by the tokens in flight), vLLM's
    "Maximum concurrency" and tokens, none where the budget is under what it checks one request against. Under
    SGLang's DSV4 pools (``sglang_v4_engine_pool``): its full-token slots, a request holding its context in
    256-token pages. Else each layer's window, the CSA and HCA layers' compressed entries (and indexer keys) and the
    compressors' fp32 states at their own size, the pool counted in tokens of the rate past the window
    (``kv_cache.compressed_rate``)."""
    ca = spec.compressed_attention
    assert ca is not None and spec.sliding_window is not None
    layout = v4_engine_layout(spec, engine, census, kv_dtype)
    if layout is not None:
        blocks = free // layout.bytes_per_block
        per_request = layout.blocks_per_request(context, in_flight)
        needed = layout.needed_bytes(context, in_flight)
        concurrency = Fraction(blocks, per_request)
        return _Allocation(page=layout.bytes_per_block, per_token=math.ceil(layout.bytes_per_block / eng.V4_MLA_BLOCK),
                           groups=eng.kv_groups(None, census.full_layers, census.sliding_layers), pool=blocks,
                           tokens=math.floor(concurrency * context), pool_tokens=blocks * eng.V4_MLA_BLOCK,
                           per_request=per_request,
                           sequences=math.floor(concurrency) if free >= needed else 0,
                           window_aware=math.floor(concurrency) if free >= needed else 0, per_seq=needed)
    pools = sglang_v4_engine_pool(spec, engine, census, kv_dtype, free)
    if pools is not None:
        assert engine is not None and engine.kv.v4_pool is not None
        sequences = pools.sequences(context, engine.kv.v4_pool.max_running_requests)
        pages = -(-context // eng.SGLANG_V4_PAGE) * eng.SGLANG_V4_PAGE
        return _Allocation(page=math.ceil(eng.SGLANG_V4_PAGE * pools.bytes_per_full_token),
                           per_token=math.ceil(pools.bytes_per_full_token),
                           groups=eng.kv_groups(None, census.full_layers, census.sliding_layers),
                           pool=pools.full_tokens // eng.SGLANG_V4_PAGE, tokens=pools.full_tokens,
                           pool_tokens=pools.full_tokens, per_request=pages // eng.SGLANG_V4_PAGE,
                           sequences=sequences, window_aware=sequences,
                           per_seq=math.ceil(pages * pools.bytes_per_full_token))
    counts = (census.attention_layers, census.csa_layers, census.hca_layers)
    per_seq = math.ceil(compressed_held_bytes(spec, kv_dtype, context, counts) + compressor_state_bytes(spec, counts))
    rate = compressed_rate(spec, kv_dtype, counts)
    tokens = math.floor(free / rate) if rate else 0
    sequences = free // per_seq if per_seq else 0
    return _Allocation(page=math.ceil(block * compressed_entry_bytes(spec, kv_dtype)), per_token=math.ceil(rate),
                       groups=eng.kv_groups(None, census.full_layers, census.sliding_layers), pool=tokens // block,
                       tokens=tokens, pool_tokens=tokens, per_request=-(-context // block), sequences=sequences,
                       window_aware=sequences, per_seq=per_seq)


def state_page(spec: ModelSpec, engine: EngineSpec | None, sh: Shard, kv_dtype: DType, block: int) -> tuple[int, int]:
    """(bytes of one request's state in one Gated DeltaNet layer on this GPU, its conv and recurrent parts in their
    formats (``kv_cache.state_dtypes``); the KV block the engine uses: vLLM's hybrid allocator raises ``block``
    until one attention page holds that state, ``engine.hybrid_block_size``)."""
    if spec.linear_attention is None:
        return 0, block
    conv_dtype, recurrent_dtype = state_dtypes(spec, engine.weights.float32_as if engine is not None else None,
                                               eng.recurrent_state_rule(engine))
    state = math.ceil(conv_dtype.bytes_for(sh.state_conv_elements) + recurrent_dtype.bytes_for(
        sh.state_recurrent_elements))
    if engine is not None and engine.kv.hybrid_groups and memory_model(engine) is not None:
        block = eng.hybrid_block_size(block, _ceil_bytes(kv_dtype, sh.kv_elements), state,
                                      engine.kv.checkpoint_align_for(spec.linear_attention.kind))
    return state, block


# --- the plan -----------------------------------------------------------------------------------------------


def _resolved(cfg: PlanConfig, gpu: GPUSpec) -> tuple[float | None, int, int, int]:
    """(memory fraction or None for SGLang's rule, block size, max_num_seqs, max_num_batched_tokens)."""
    e = cfg.engine
    if e is None:
        util = DEFAULT_GPU_MEMORY_UTILIZATION if cfg.gpu_memory_utilization is None else cfg.gpu_memory_utilization
        return (util, cfg.block_size or DEFAULT_BLOCK_SIZE, cfg.max_num_seqs or 1,
                cfg.max_num_batched_tokens or DEFAULT_PREFILL_CHUNK)
    seqs, tokens = eng.scheduler_defaults(e, gpu)
    fraction = cfg.gpu_memory_utilization if cfg.gpu_memory_utilization is not None else e.memory_fraction
    return fraction, cfg.block_size or e.block_size, cfg.max_num_seqs or seqs, cfg.max_num_batched_tokens or tokens


def plan_fit(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, cfg: PlanConfig,
             activation_dtype: DType | None = None, with_ideal: bool = True,
             with_max_context: bool = True) -> PlanResult:
    """Weights, every reserved term and the KV budget per GPU; sequences at ``cfg.context``; context at
    ``cfg.batch``; as ``cfg.engine`` accounts for them (``None``, or an engine with ``budget: ideal``: the ideal
    arithmetic, the result still naming that engine; a release that runs the model on its second model runner: that
    runner's accounting, which the result names). ``with_max_context=False`` skips the search for the longest
    context at the batch (``max_context_at_batch`` is then -1): a capacity search asks only for the KV pool."""
    if cfg.kv_cache_memory_bytes is not None:
        e = cfg.engine
        if e is None or not eng.takes_kv_cache_memory(e):
            raise UsageError(f"--kv-cache-memory-bytes sets vLLM's KV cache (0.11+): "
                             f"{'no engine' if e is None else e.label} has no such setting")
        if cfg.kv_cache_memory_bytes < 1:
            raise UsageError(f"--kv-cache-memory-bytes must be positive, got {cfg.kv_cache_memory_bytes}")
        if e.extensible_off is not None:  # vLLM 0.34+: a set size turns the extensible KV cache off
            return plan_fit(spec, gpu, precision, kv_dtype, replace(cfg, engine=e.extensible_off), activation_dtype,
                            with_ideal, with_max_context)
    if cfg.engine is not None and memory_model(cfg.engine) is None:
        plain = plan_fit(spec, gpu, precision, kv_dtype, replace(cfg, engine=None), activation_dtype, with_ideal,
                         with_max_context)
        return replace(plain, engine=cfg.engine)
    if (runner := eng.runner_for(cfg.engine, spec, precision, gpu)) is not cfg.engine:
        return plan_fit(spec, gpu, precision, kv_dtype, replace(cfg, engine=runner), activation_dtype, with_ideal,
                        with_max_context)
    fraction, block, max_seqs, mnbt = _resolved(cfg, gpu)
    if fraction is not None and not 0 < fraction <= 1:
        raise UsageError(f"gpu memory utilization must be in (0, 1], got {fraction}")
    if block < 1 or max_seqs < 1 or mnbt < 1:
        raise UsageError("block size, max_num_seqs and max_num_batched_tokens must be positive")
    if cfg.context < 1 or cfg.batch < 1:
        raise UsageError("context and batch must be positive")
    par = check_parallelism(spec, cfg.num_gpus, cfg.tp, cfg.pp, cfg.ep, cfg.redundant_experts)
    check_weight_blocks(spec, par, precision)
    e = cfg.engine
    in_flight = eng.in_flight_tokens(e, par.pp, mnbt)
    sparse_record = not eng.sparse_mla_raw(e, gpu)
    if (why := eng.unserved_format(e, precision)) is not None:
        raise UsageError(why)
    act_dtype = activation_dtype or get_dtype("bf16")
    act_bytes = max(1, int(act_dtype.bits_per_element) // 8)
    sh, vocab_rows, padded = _engine_shard(spec, par, e, precision)
    asked = block
    state, block = state_page(spec, e, sh, kv_dtype, block)
    # TensorRT-LLM 1.0-1.2: a state for each of max_num_seqs requests in every linear layer, allocated before the KV
    # cache is sized (``kv.state_slots``); else a running request's state comes out of the pool beside its KV
    slots_bytes = max_seqs * state if e is not None and e.kv is not None and e.kv.state_slots == "max_num_seqs" else 0
    request_state = 0 if slots_bytes else state
    nominal = gpu.memory_bytes
    capacity = eng.capacity_bytes(gpu) if e is not None else nominal
    startup = eng.startup_bytes(e, par.tp, gpu) if e is not None else 0
    non_torch = eng.non_torch_bytes(e, par.tp, par.pp, gpu) if e is not None else 0
    graphs = eng.cuda_graph_bytes(e, max_seqs, par.tp, gpu) if e is not None else 0
    # a cache sized after capture (budget "measured") always holds the graphs back, and a runner without an
    # estimate never does, whatever the estimate's switch
    graphs_in = (e.cuda_graphs.in_budget if cfg.cuda_graphs_in_budget is None or e.budget == "measured"
                 or not e.cuda_graphs.estimated else cfg.cuda_graphs_in_budget) if e is not None else False
    if e is not None and fraction is None:
        fraction = eng.static_fraction(e, gpu, par.tp, par.pp, mnbt, spec, attention_ranks(par.tp, par.ep), max_seqs)
    assert fraction is not None
    ranges = stage_layers(spec.num_layers, par.pp)
    if e is None or e.budget == "free_fraction":
        requested = capacity
    elif e.budget in ("utilization", "measured"):
        requested = math.floor(capacity * fraction)
    else:
        requested = math.floor((capacity - startup) * fraction)
    stages: list[StagePlan] = []
    rotary = absorbed = forward = sampler = sampler_state = sampler_workspace = 0
    headroom: int | None = None
    uncounted = eng.penalty_state_bytes(max_seqs, spec.vocab_size) if (
        e is not None and e.activation is not None and e.activation.penalty_state_uncounted) else 0
    memo: dict[tuple[object, ...], tuple[StagePlan, int, int, eng.ActivationPeak]] = {}
    for s, layers in enumerate(ranges):
        first, last = s == 0, s == len(ranges) - 1
        census = stage_census(spec, layers)
        exceptions = exception_counts(spec, layers)
        key = (census, exceptions, first, last)
        if key not in memo:  # stages alike in their layer counts plan alike: computed once
            rot, absb = _extra_weight_bytes(spec, e, par, len(layers))
            weights = (census_weight_bytes(spec, sh, precision, census, exceptions, first, last) + rot + absb
                       + _value_slot_bytes(spec, e, sh, precision, census))
            if e is None:
                act = activation_workspace_bytes(spec, 1, mnbt, act_dtype, mnbt, par.tp)
                reserved = round(nominal * (1 - fraction)) + cfg.runtime_overhead_bytes + act
                budget = nominal - weights - reserved
                peak = eng.ActivationPeak(forward_bytes=act, sampler_bytes=0, peak_bytes=act)
            else:
                if e.budget == "static_fraction":  # no profiling run: activations live in the reserved slack
                    peak = eng.ActivationPeak(forward_bytes=0, sampler_bytes=0, peak_bytes=0)
                else:
                    inputs = _activation_inputs(spec, sh, par, census, vocab_rows, first, last, precision)
                    peak = eng.activation_peak(e, inputs, mnbt, max_seqs, act_bytes)
                held_back = startup if e.overheads.startup_in_budget else 0
                held = weights + slots_bytes * census.linear_layers  # the state slots: held like the weights
                if e.budget == "utilization":
                    budget = (requested - held - peak.peak_bytes - non_torch - held_back
                              - (graphs if graphs_in else 0))
                elif e.budget == "measured":
                    budget = eng.measured_kv_budget(e, capacity, requested, startup, held + non_torch + (
                        graphs if graphs_in else 0), peak)
                elif e.budget == "static_fraction":
                    budget = requested - held
                else:
                    budget = math.floor((capacity - held - startup - non_torch - peak.peak_bytes) * fraction)
                if cfg.kv_cache_memory_bytes is not None:  # vLLM takes it as the budget; the graphs come after
                    budget = cfg.kv_cache_memory_bytes
                    room = capacity - startup - held - peak.peak_bytes - non_torch - graphs - uncounted - budget
                    headroom = room if headroom is None else min(headroom, room)
            a = _allocate(spec, e, census, kv_dtype, sh.kv_elements, budget, cfg.context, block, in_flight,
                          request_state, sh.full_kv_elements, sparse_record)
            if slots_bytes and census.linear_layers:  # a running request takes one of the max_num_seqs slots
                a = replace(a, sequences=min(a.sequences, max_seqs), window_aware=min(a.window_aware, max_seqs),
                            running_cap=max_seqs)
            plan = StagePlan(
                layers=layers, census=census, weights_bytes=weights, activation_peak_bytes=peak.peak_bytes,
                kv_budget_bytes=budget, kv_bytes_per_token=a.per_token, kv_page_bytes=a.page, kv_groups=a.groups,
                kv_pool_blocks=a.pool, kv_tokens=a.tokens, kv_pool_tokens=a.pool_tokens,
                blocks_per_request=a.per_request,
                sequences=a.sequences, sequences_window_aware=a.window_aware, kv_bytes_per_sequence=a.per_seq,
                running_cap=a.running_cap)
            memo[key] = (plan, rot, absb, peak)
        plan, rot, absb, peak = memo[key]
        stages.append(replace(plan, layers=layers))
        if last:
            rotary, absorbed, forward, sampler = rot, absb, peak.forward_bytes, peak.sampler_bytes
            sampler_state, sampler_workspace = peak.state_bytes, peak.workspace_bytes
    # a stage of a hybrid model may hold no KV (Mamba layers only) or nothing per request at all (MLP layers only,
    # Nemotron-H at a high pp): it bounds neither the tokens nor the sequences, only its own budget
    caching = [st for st in stages if st.kv_bytes_per_token > 0] or stages
    holding = [st for st in stages if st.kv_bytes_per_sequence > 0] or stages
    worst = min(stages, key=lambda st: (st.kv_budget_bytes, st.sequences))
    tightest = min(caching, key=lambda st: (st.kv_tokens, st.kv_budget_bytes))
    per_replica = min(st.sequences for st in holding)
    sequences = per_replica * par.dp
    window_aware = min(st.sequences_window_aware for st in holding) * par.dp
    need = -(-cfg.batch // par.dp)
    cap = max(spec.max_context, cfg.context)
    distinct = [plan for plan, _, _, _ in memo.values()]
    max_context = _max_context(spec, e, distinct, kv_dtype, sh.kv_elements, block, in_flight, need, cap,
                               request_state, sh.full_kv_elements, sparse_record) if with_max_context else -1
    if slots_bytes and need > max_seqs and spec.num_linear_layers:
        max_context = 0  # more requests than state slots: none fits, whatever the context
    per_seq = max(st.kv_bytes_per_sequence for st in stages)
    one_request = worst.kv_budget_bytes > 0 and per_replica >= 1
    overcommit = max(-(headroom or 0), 0)
    fits = one_request and sequences >= cfg.batch and not overcommit
    if worst.kv_budget_bytes <= 0:
        short = -worst.kv_budget_bytes + per_seq * need
    elif fits:
        short = 0
    else:
        short = max(per_seq * need - worst.kv_budget_bytes, overcommit, 0)
    weights_max = max(st.weights_bytes for st in stages)
    activation_max = max(st.activation_peak_bytes for st in stages)
    ideal = None
    if e is not None and with_ideal:
        ideal = plan_fit(spec, gpu, precision, kv_dtype, replace(cfg, engine=None, gpu_memory_utilization=(
            fraction if e.budget == "utilization" else None), block_size=block, max_num_batched_tokens=mnbt,
            kv_cache_memory_bytes=None), activation_dtype)
    return PlanResult(
        parallelism=par, engine=e, capacity_bytes=capacity, capacity_is_runtime=capacity != nominal,
        memory_bytes_per_gpu=nominal, memory_fraction=fraction,
        requested_bytes=requested,
        startup_bytes=startup, non_torch_bytes=non_torch, activation_peak_bytes=activation_max,
        cuda_graph_bytes=graphs, cuda_graphs_in_budget=graphs_in, weights_bytes_per_gpu=weights_max,
        reserved_bytes_per_gpu=capacity - worst.weights_bytes - worst.kv_budget_bytes,
        kv_budget_bytes_per_gpu=worst.kv_budget_bytes,
        kv_bytes_per_token_per_gpu=max(st.kv_bytes_per_token for st in stages),
        kv_bytes_per_sequence_per_gpu=per_seq, kv_tokens_per_gpu=tightest.kv_tokens,
        kv_pool_tokens_per_gpu=min(st.kv_pool_tokens for st in caching),
        kv_blocks_per_gpu=min(st.kv_pool_tokens for st in caching) // block,
        kv_pool_blocks_per_gpu=tightest.kv_pool_blocks,
        kv_blocks_per_request=tightest.blocks_per_request,
        kv_groups=tightest.kv_groups.num_groups, kv_group_size=tightest.kv_groups.group_size,
        kv_padding_layers=tightest.kv_groups.padding_layers, block_size=block, max_num_seqs=max_seqs,
        max_num_batched_tokens=mnbt, max_concurrent_sequences=sequences,
        max_concurrent_sequences_window_aware=window_aware, max_context_at_batch=max_context, fits=fits,
        shortfall_bytes_per_gpu=short, stage_layer_counts=tuple(len(st.layers) for st in stages),
        rotary_cache_bytes=rotary, mla_absorbed_bytes=absorbed, vocab_rows=vocab_rows,
        mxfp4_padded_hidden=padded[0], mxfp4_padded_intermediate=padded[1], kv_heads_per_gpu=sh.kv_heads,
        kv_elements_per_token_per_layer=sh.kv_elements, activation_forward_bytes=forward,
        activation_sampler_bytes=sampler, activation_state_bytes=sampler_state,
        activation_workspace_bytes=sampler_workspace,
        kv_budget_bytes_per_gpu_ideal=None if ideal is None else ideal.kv_budget_bytes_per_gpu,
        max_concurrent_sequences_ideal=None if ideal is None else ideal.max_concurrent_sequences,
        weights_bytes_per_gpu_ideal=None if ideal is None else ideal.weights_bytes_per_gpu,
        state_bytes_per_layer=state, block_size_asked=asked,
        state_slot_bytes_per_gpu=slots_bytes * max(st.census.linear_layers for st in stages),
        uncounted_state_bytes=uncounted,
        max_running_requests=min((st.running_cap for st in holding if st.running_cap is not None), default=None),
        kv_set_headroom_bytes=headroom)


def _max_context(spec: ModelSpec, e: EngineSpec | None, stages: list[StagePlan], kv_dtype: DType,
                 kv_elements: int, block: int, in_flight: int, batch: int, cap: int, state: int = 0,
                 full_elements: int | None = None, sparse_record: bool = True) -> int:
    """Largest context (at most ``cap``) at which ``batch`` sequences fit in every stage that holds something per
    request (``_plan``: a stage of MLP layers only holds nothing); 0 if none."""
    holding = [st for st in stages if st.kv_bytes_per_sequence > 0] or stages

    def ok(c: int) -> bool:
        return all(_allocate(spec, e, st.census, kv_dtype, kv_elements, st.kv_budget_bytes, c, block,
                             in_flight, state, full_elements, sparse_record).sequences >= batch for st in holding)

    if not ok(1):
        return 0
    if ok(cap):
        return cap
    lo, hi = 1, cap  # ok(lo), not ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


# --- searching the GPU count --------------------------------------------------------------------------------


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


def searched_layouts(spec: ModelSpec, precision: WeightPrecision, num_gpus: int, gpus_per_node: int,
                     tps: list[int] | None = None, pps: list[int] | None = None) -> list[tuple[int, int, int]]:
    """(tp, pp, ep) of ``candidate_layouts``, an MoE model's each also with its experts spread over the tp GPUs
    (ep = tp, vLLM's --enable-expert-parallel); a layout whose tensor-parallel slices cut the weights' quantization
    blocks is left out, as engines refuse it (``check_weight_blocks``)."""
    layouts = []
    for tp, pp in candidate_layouts(spec, num_gpus, gpus_per_node, tps, pps):
        for ep in (1, tp) if spec.moe is not None and tp > 1 else (1,):
            try:
                check_weight_blocks(spec, check_parallelism(spec, num_gpus, tp, pp, ep), precision)
            except UsageError:
                continue
            layouts.append((tp, pp, ep))
    return layouts


MAX_LAYOUTS_COMPARED = 2048


def _layout_sizes(spec: ModelSpec, max_gpus: int, gpus_per_node: int, tps: list[int] | None,
                  pps: list[int] | None) -> tuple[list[int], int]:
    """(GPU counts of one replica worth trying, in order, up to the first multi-node size; the largest node
    count) -- with tp / pp lists their products (all listed), else 1..gpus_per_node, then whole nodes
    2..min(max_gpus / gpus_per_node, layers) searched separately."""
    if tps or pps:
        tp_set = tps or list(range(1, gpus_per_node + 1))
        pp_set = pps or list(range(1, spec.num_layers + 1))
        return sorted({t * p for t in tp_set for p in pp_set if t * p <= max_gpus}), 0
    return list(range(1, min(gpus_per_node, max_gpus) + 1)), min(max_gpus // gpus_per_node, spec.num_layers)


def min_gpus(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, cfg: PlanConfig,
             max_gpus: int = 512, gpus_per_node: int = 8, tps: list[int] | None = None,
             pps: list[int] | None = None) -> PlanResult | None:
    """The smallest GPU count where ``cfg.batch`` sequences of ``cfg.context`` tokens fit: one replica of a
    (tp, pp) layout from ``candidate_layouts`` (one request at least; an MoE model's experts also spread over the tp
    GPUs, vLLM's --enable-expert-parallel, ``searched_layouts``), times the data-parallel replicas the batch needs;
    ties go to fewer replicas, then to no expert parallelism. None up to ``max_gpus``.

    Bounded: pp never exceeds the layers, so beyond one node only whole nodes up to gpus_per_node x num_layers
    are candidates; the first that holds one request is found by bisection (more stages leave each GPU fewer
    weights and layers to cache), then larger replicas are compared only while they are smaller than the best
    total, at most ``MAX_LAYOUTS_COMPARED`` of them."""
    if max_gpus < 1 or gpus_per_node < 1:
        raise UsageError("--max-gpus and --gpus-per-node must be at least 1")
    if max_gpus > MAX_SEARCH_GPUS:
        raise UsageError(f"--max-gpus {max_gpus:,} exceeds the search limit of {MAX_SEARCH_GPUS:,}")
    probe = replace(cfg, batch=1, ep=1)
    best: tuple[int, int, int, int, int] | None = None  # (total GPUs, replica GPUs, tp, pp, ep)

    def replica(n: int) -> bool:
        """Try every layout of n GPUs as one replica; True if one holds a request."""
        nonlocal best
        held = False
        for tp, pp, ep in searched_layouts(spec, precision, n, gpus_per_node, tps, pps):
            r = _plan(spec, gpu, precision, kv_dtype, replace(probe, num_gpus=n, tp=tp, pp=pp, ep=ep))
            if r.max_concurrent_sequences < 1:
                continue
            held = True
            total = n * -(-cfg.batch // r.max_concurrent_sequences)
            if total <= max_gpus and (best is None or total < best[0]):
                best = (total, n, tp, pp, ep)
        return held

    sizes, nodes_max = _layout_sizes(spec, max_gpus, gpus_per_node, tps, pps)
    compared = 0
    for n in sizes:
        if best is not None and n >= best[0] or compared >= MAX_LAYOUTS_COMPARED:
            break
        replica(n)
        compared += 1
    if nodes_max >= 2 and (best is None or 2 * gpus_per_node < best[0]):
        def holds(k: int) -> bool:
            return any(_plan(spec, gpu, precision, kv_dtype, replace(probe, num_gpus=k * gpus_per_node, tp=tp,
                                                                       pp=pp, ep=ep)).max_concurrent_sequences >= 1
                       for tp, pp, ep in searched_layouts(spec, precision, k * gpus_per_node, gpus_per_node))
        lo, hi = 1, 2
        while hi < nodes_max and not holds(hi):
            lo, hi = hi, min(hi * 2, nodes_max)
        if holds(hi):
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if holds(mid) else (mid, hi)
            for k in range(hi, nodes_max + 1):
                if best is not None and k * gpus_per_node >= best[0] or compared >= MAX_LAYOUTS_COMPARED:
                    break
                replica(k * gpus_per_node)
                compared += 1
    if best is None:
        return None
    total, _, tp, pp, ep = best
    return plan_fit(spec, gpu, precision, kv_dtype, replace(cfg, num_gpus=total, tp=tp, pp=pp, ep=ep))


def _plan(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, cfg: PlanConfig) -> PlanResult:
    """plan_fit without the ideal figures beside (for searches)."""
    return plan_fit(spec, gpu, precision, kv_dtype, cfg, with_ideal=False)
