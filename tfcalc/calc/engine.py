"""Serving-engine memory accounting: the small formulas that turn an ``EngineSpec`` (presets/engines/*.yaml) into
the terms of one GPU's budget. Pure math, no I/O; every rule cites the engine source in the preset it reads.

    vLLM (budget "utilization"):   KV = capacity x gpu_memory_utilization - weights - activation peak - non-torch
                                        [- CUDA graphs from 0.20] [- startup memory before 0.11]
    vLLM 0.34 ("measured"):        KV = min(requested - used, capacity - startup - used - margin) - transient peak
    SGLang ("static_fraction"):    KV = (capacity - startup) x mem_fraction_static - weights
    TensorRT-LLM ("free_fraction"): KV = (capacity - weights - startup - non-torch - activation peak)
                                         x free_gpu_memory_fraction
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tfcalc.dtypes import WeightPrecision, generic_name, get_dtype, parse_weight_precision
from tfcalc.errors import UsageError
from tfcalc.spec.engine import EngineSpec
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec

MIB = 1 << 20


def served_precision(spec: ModelSpec, engine: EngineSpec | None) -> WeightPrecision:
    """The weight format an engine serves ``spec``'s checkpoint in by default (--dtype auto): the checkpoint's own,
    except that a float32 checkpoint is loaded in 16 bits where the engine says so (``weights.float32_as``: vLLM's
    "Downcast for float32 models" to bf16 where the GPU has it, SGLang's float16)."""
    native = parse_weight_precision(spec.native_dtype)
    layout = engine.weights if engine is not None else None
    if layout is None or layout.float32_as is None or native.per_component or native.default.name != "fp32":
        return native
    return WeightPrecision(get_dtype(layout.float32_as))


def runner_for(engine: EngineSpec | None, spec: ModelSpec, precision: WeightPrecision,
               gpu: GPUSpec | None = None) -> EngineSpec | None:
    """``engine`` as it runs ``spec`` at ``precision`` on ``gpu``: its second model runner's accounting where the
    release's rule picks that runner for the model (vLLM 0.22-0.28's V2 runner, by architecture and traits; V1 on
    AMD GPUs for some architectures in 0.29-0.31), else itself."""
    if engine is None or engine.model_runner is None or engine.second_runner is None:
        return engine
    hybrid = spec.num_linear_layers > 0
    picked = engine.model_runner.picks(spec.architecture, moe=spec.moe is not None, quantized=precision.quantized,
                                       hybrid=hybrid, attention_free=hybrid and spec.num_attention_layers == 0,
                                       amd=gpu is not None and gpu.vendor.upper() == "AMD")
    return engine.second_runner if picked else engine


def unserved_format(engine: EngineSpec | None, precision: WeightPrecision) -> str | None:
    """Why ``engine`` cannot serve weights stored as ``precision`` (a format its preset lists as unsupported), or
    None where it can."""
    if engine is None:
        return None
    formats = {precision.default.name, *(d.name for _, d in precision.per_component)}
    bad = sorted(f for f in formats if {f, generic_name(f)} & set(engine.weights.unsupported))
    return f"{engine.name} does not serve {', '.join(bad)} weights" if bad else None


def capacity_bytes(gpu: GPUSpec) -> int:
    """What the CUDA runtime reports (``runtime_memory_gib``) when the preset knows it, else the nominal capacity."""
    return gpu.runtime_memory_bytes or gpu.memory_bytes


def scheduler_defaults(engine: EngineSpec, gpu: GPUSpec) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) the engine picks for this GPU: first row whose memory floor the GPU
    meets and whose excluded names it does not carry."""
    memory_gib = capacity_bytes(gpu) / (1 << 30)
    label = f"{gpu.name} {gpu.display_name}".lower()
    for row in engine.scheduler_defaults:
        if memory_gib >= row.min_memory_gib and not any(x.lower() in label for x in row.exclude_gpus):
            return row.max_num_seqs, row.max_num_batched_tokens
    last = engine.scheduler_defaults[-1]
    return last.max_num_seqs, last.max_num_batched_tokens


def prefill_graph_sizes(max_tokens: int) -> list[int]:
    """SGLang's prefill CUDA-graph capture sizes up to ``max_tokens`` (the chunked prefill size): 4..32 by 4,
    48..256 by 16, 288..512 by 32, 576..1024 by 64, 1280..4096 by 256, then by 512 (cuda_graph_hook.py
    generate_prefill_cuda_graph_batch_sizes)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return [s for s in sizes if s <= max_tokens]


def static_fraction(engine: EngineSpec, gpu: GPUSpec, tp: int, pp: int, chunked_prefill: int,
                    spec: ModelSpec | None = None, attention_dp: int = 1, max_running: int | None = None) -> float:
    """SGLang's default mem_fraction_static: round((gpu_mem - reserved) / gpu_mem, 3), gpu_mem in MiB, T = its
    --tp (tp x the data-parallel attention ranks), reserved = base + max(chunked_prefill, 2048) x 1.5 +
    cuda_graph_max_bs (by tier and T) x 2 + T x pp / 8 x 1024 MiB + under data-parallel attention cuda_graph_max_bs
    x ranks x 3 (+ x 1.5 above 300) + its prefill CUDA graphs' reserve where it captures them (0.5.10+: 8 MiB per
    capture size, 1.5 GiB for an MLA model; none at pp > 1, for DeepSeek-V4 or a model with a vision encoder:
    memory_hook.reserve_for_graph_mb) (at least the floor above 60 GiB); cuda_graph_max_bs no larger than
    ``max_running`` (--max-running-requests) where the rule says so (0.5.22+). Falls back to ``memory_fraction``
    without a rule."""
    rule = engine.static_fraction_rule
    if rule is None:
        assert engine.memory_fraction is not None
        return engine.memory_fraction
    gpu_mib = capacity_bytes(gpu) / MIB
    tier = next((t for t in rule.tiers if gpu_mib < t[0] * 1024), rule.tiers[-1])
    total_tp = tp * attention_dp
    max_bs = tier[2] if total_tp < 4 else tier[3]
    if rule.graph_bs_within_running and max_running is not None:
        max_bs = min(max_bs, max_running)
    reserved = (rule.base_mib + max(chunked_prefill, 2048) * rule.per_prefill_token_mib + max_bs * rule.per_graph_bs_mib
                + total_tp * pp / 8 * 1024)
    if attention_dp > 1:
        reserved += max_bs * attention_dp * (rule.per_dp_graph_bs_mib
                                             + (rule.per_dp_graph_bs_mib_above_300 if max_bs > 300 else 0.0))
    if (rule.per_prefill_graph_mib > 0 and pp == 1 and spec is not None and spec.compressed_attention is None
            and spec.encoder is None):   # the prefill graphs it captures
        reserved += (rule.mla_prefill_graph_mib if spec.mla is not None
                     else rule.per_prefill_graph_mib * len(prefill_graph_sizes(chunked_prefill)))
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, rule.floor_mib)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def _fabric(gpu: GPUSpec | None) -> str | None:
    """The interconnect preset the GPU's peers talk over (``latency.interconnect_preset``), where it names one."""
    return gpu.latency.interconnect_preset if gpu is not None and gpu.latency is not None else None


def startup_bytes(engine: EngineSpec, tp: int, gpu: GPUSpec | None = None) -> int:
    """CUDA context (and NCCL communicators at tp > 1, by the GPU's fabric: ``overheads.by_fabric``) already
    allocated when the engine takes its baseline."""
    o = engine.overheads
    return o.tp_bytes(_fabric(gpu))[0] if tp > 1 else o.startup_bytes_tp1


def non_torch_bytes(engine: EngineSpec, tp: int, pp: int, gpu: GPUSpec | None = None) -> int:
    """Non-torch memory the profiling run adds: NCCL / custom all-reduce buffers at tp > 1 (by the GPU's fabric),
    P2P at pp > 1."""
    o = engine.overheads
    if tp > 1:
        return o.tp_bytes(_fabric(gpu))[1]
    return o.non_torch_bytes_pp if pp > 1 else o.non_torch_bytes_tp1


def capture_sizes(rule: str, max_num_seqs: int, ceiling: int = 512) -> list[int]:
    """CUDA-graph batch sizes: vLLM [1, 2, 4] + 8..248 step 8 + 256..max step 16, max = min(2 x max_num_seqs,
    ``ceiling``) (512; 1024 on SM100 parts from 0.28: config/vllm.py _set_cudagraph_sizes); vLLM 0.8 [1, 2, 4] +
    8..512 step 8; SGLang [1, 2, 4, 8, 12] + 16..256 step 8 + 272..496 step 16 + 512.. step 32 up to
    cuda_graph_max_bs (server_args._generate_cuda_graph_batch_sizes)."""
    if rule == "vllm":
        top = min(2 * max_num_seqs, ceiling)
        sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
        return [s for s in sizes if s <= top]
    if rule == "vllm-0.8":
        return [1, 2, 4, *range(8, 513, 8)]
    if rule == "sglang":
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_num_seqs + 1, 32)]
        return [s for s in sizes if s <= max_num_seqs]
    return []


def _gpu_names(gpu: GPUSpec | None) -> tuple[str, ...]:
    """The names an engine preset's per-GPU entry may list ``gpu`` under: its own, then the preset whose kernels it
    shares (``latency.kernels_as``: a B300 or a user's B200 file as the B200)."""
    if gpu is None:
        return ()
    shared = gpu.latency.kernels_as if gpu.latency is not None else None
    return (gpu.name,) if shared is None else (gpu.name, shared)


def gpu_listed(names: tuple[str, ...], gpu: GPUSpec | None) -> bool:
    """Whether an engine preset's list of GPU presets names ``gpu`` (``_gpu_names``)."""
    return any(name in names for name in _gpu_names(gpu))


def takes_kv_cache_memory(engine: EngineSpec | None) -> bool:
    """Whether ``engine`` takes a KV cache size outright (``kv.explicit_budget``: vLLM 0.11+'s
    --kv-cache-memory-bytes)."""
    return engine is not None and engine.kv is not None and engine.kv.explicit_budget


def recurrent_state_rule(engine: EngineSpec | None) -> str:
    """The format ``engine`` keeps Mamba / Gated DeltaNet recurrent states in (``kv.state_dtype``, read by
    ``kv_cache.state_dtypes``): the checkpoint's (vLLM, the plain arithmetic), the model's (TensorRT-LLM 1.0-1.2) or
    the checkpoint's else float32 (SGLang)."""
    return engine.kv.state_dtype if engine is not None and engine.kv is not None else "checkpoint"


def sparse_mla_raw(engine: EngineSpec | None, gpu: GPUSpec | None) -> bool:
    """Whether the engine stores an 8-bit DSA cache on ``gpu`` as the raw latent (kv_lora_rank + rope bytes, no
    scales: SGLang's TensorRT-LLM DSA kernels on SM100) rather than FlashMLA's record."""
    return engine is not None and engine.kv is not None and gpu_listed(engine.kv.sparse_mla_raw_gpus, gpu)


def capture_ceiling(engine: EngineSpec, gpu: GPUSpec | None) -> int:
    """The largest batch the engine captures by default on ``gpu``: its ``cuda_graphs.max_size_by_gpu`` entry for the
    GPU (``_gpu_names``), else 512."""
    ceilings = dict(engine.cuda_graphs.max_size_by_gpu)
    return next((ceilings[name] for name in _gpu_names(gpu) if name in ceilings), 512)


def cuda_graph_bytes(engine: EngineSpec, max_num_seqs: int, tp: int = 1, gpu: GPUSpec | None = None) -> int:
    """vLLM's estimate: first capture + (sizes - 1) x per-size memory (gpu_model_runner.profile_cudagraph_memory);
    more per size at tp > 1."""
    sizes = capture_sizes(engine.cuda_graphs.capture, max_num_seqs, capture_ceiling(engine, gpu))
    if not sizes:
        return 0
    g = engine.cuda_graphs
    return g.first_capture_bytes + (len(sizes) - 1) * (g.per_size_bytes_tp if tp > 1 else g.per_size_bytes)


@dataclass(frozen=True, kw_only=True)
class ActivationInputs:
    """Per-GPU widths of one stage for the profiling-run estimate (elements; bytes via ``activation_bytes``)."""

    hidden: int
    attention_width: int        # q + k + v + attention output columns on this GPU
    mlp_width: int              # widest dense FFN transient on this GPU: gate_up + activation output (3 I / tp)
    moe_workspace: int          # fused-MoE workspaces per token: top_k x (max(2 I, h) + I) on this GPU, 0 if none
    moe_output: int             # top_k x h per token, the expert outputs before the weighted sum
    vocab: int                  # logits columns after the all-gather (padded vocabulary)
    last_stage: bool
    receives_activations: bool  # a pipeline stage after the first holds the received hidden + residual
    model_vocab: int = 0        # the model's own vocabulary (the sampler's per-request state is this wide)


@dataclass(frozen=True, kw_only=True)
class ActivationPeak:
    forward_bytes: int
    sampler_bytes: int
    peak_bytes: int
    state_bytes: int = 0        # the sampler's persistent per-request state, within peak_bytes
    workspace_bytes: int = 0    # the fused-MoE workspace the workspace manager keeps, within peak_bytes

    @property
    def transient_bytes(self) -> int:
        """The peak less what stays allocated after it (allocated peak - current)."""
        return self.peak_bytes - self.state_bytes - self.workspace_bytes


def penalty_state_bytes(max_num_seqs: int, vocab: int) -> int:
    """vLLM's V2-runner penalty statistics (v1/worker/gpu/sample/penalties.py PenaltiesState): output token counts
    [max_num_seqs, vocab] int32 + the prompt's bit mask [max_num_seqs, cdiv(vocab, 32)] int32."""
    return max_num_seqs * (vocab + -(-vocab // 32)) * 4


def activation_peak(engine: EngineSpec, a: ActivationInputs, tokens: int, sequences: int,
                    activation_bytes: int = 2) -> ActivationPeak:
    """The profiling run's torch peak above the weights (vLLM gpu_model_runner.profile_run):

    forward  = T x bytes x (copies x h + max(attention width, FFN transient, MoE workspace + outputs)),
    sampler  = persistent (copies x T x h, MoE workspace) + R x V x bytes_per_logit + min(rows, R) x V x 4,
    peak     = max(forward, sampler) on the last pipeline stage (the only one that samples), forward elsewhere;
    T = max_num_batched_tokens, R = min(max_num_seqs, T); a later pipeline stage also holds the received
    hidden + residual [T, h]; the last stage adds the sampler's persistent penalty state where the engine counts
    it (``penalty_state_bytes``, ``sequences`` = max_num_seqs)."""
    m = engine.activation
    received = 2 * tokens * a.hidden * activation_bytes if a.receives_activations else 0
    moe_ws = tokens * a.moe_workspace * activation_bytes if m.moe_workspace else 0
    widest = max(a.attention_width, a.mlp_width, a.moe_workspace + a.moe_output)
    forward = tokens * activation_bytes * (m.hidden_copies * a.hidden + widest) + received
    sampler = 0
    if a.last_stage and m.sampler_bytes_per_logit:
        rows = min(sequences, tokens)
        sampler = (math.ceil(rows * a.vocab * m.sampler_bytes_per_logit) + min(m.sampler_scratch_rows, rows) * a.vocab
                   * 4 + m.hidden_copies * tokens * a.hidden * activation_bytes + moe_ws + received)
    state = penalty_state_bytes(sequences, a.model_vocab or a.vocab) if a.last_stage and m.penalty_state else 0
    # the fused-MoE workspace stays allocated once made: in the peak where the sampler's pass or the MoE rows bind
    kept = moe_ws if sampler >= forward or widest == a.moe_workspace + a.moe_output else 0
    return ActivationPeak(forward_bytes=forward, sampler_bytes=sampler, peak_bytes=max(forward, sampler) + state,
                          state_bytes=state, workspace_bytes=kept)


def measured_kv_budget(e: EngineSpec, capacity: int, requested: int, startup: int, used: int,
                       peak: ActivationPeak) -> int:
    """KV bytes of a cache sized from memory measured after warm-up (vLLM 0.34 measure_kv_cache_bytes):
    min(requested - used, capacity - startup - used - margin) - T, ``used`` what the engine holds since its baseline
    (weights, non-torch, CUDA graphs; + the sampler's state and the fused-MoE workspace it keeps), T the transient
    peak kept free (allocated peak - current), margin max(floor, fraction x T)."""
    assert e.sizing_margin is not None
    transient = peak.transient_bytes
    used += peak.peak_bytes - transient
    return min(requested - used, capacity - startup - used - e.sizing_margin.bytes_for(transient)) - transient


@dataclass(frozen=True, kw_only=True)
class KVGroups:
    """How the engine lays one GPU's layers into KV-cache groups that share the block pool (vLLM hybrid
    allocator): ``group_size`` layer slots per group; ``full_groups`` + ``sliding_groups`` + ``state_groups``
    (Gated DeltaNet layers, one block of state per request) groups; ``padding_layers`` empty slots. One group of
    all attention layers when the engine (or the model) is not hybrid."""

    group_size: int
    full_groups: int
    sliding_groups: int
    padding_layers: int
    state_groups: int = 0

    @property
    def num_groups(self) -> int:
        return self.full_groups + self.sliding_groups + self.state_groups


def kv_groups(engine: EngineSpec | None, full_layers: int, sliding_layers: int, state_layers: int = 0) -> KVGroups:
    """vLLM kv_cache_utils._get_kv_cache_groups_uniform_page_size: each layer type's layers (full, sliding, Gated
    DeltaNet state) split into groups of the smallest type's count (the largest type's while it is under
    ``kv.group_size_ratio`` times the smallest), the last group of each type padded."""
    counts = [n for n in (full_layers, sliding_layers, state_layers) if n]
    if engine is None or not engine.kv.hybrid_groups or len(counts) < 2:
        return KVGroups(group_size=full_layers + sliding_layers, full_groups=1, sliding_groups=0, padding_layers=0)
    small, large = min(counts), max(counts)
    size = large if large < small * engine.kv.group_size_ratio else small
    full, sliding, state = (-(-n // size) for n in (full_layers, sliding_layers, state_layers))
    return KVGroups(group_size=size, full_groups=full, sliding_groups=sliding, state_groups=state,
                    padding_layers=(full + sliding + state) * size - full_layers - sliding_layers - state_layers)


def state_pool_slots(budget: int, per_request: int, memory_ratio: float) -> int:
    """State slots SGLang sizes beside the KV pool (kv_cache_configurator._handle_max_mamba_cache, 0.5.23): the
    states take ratio / (1 + ratio) of the budget, less one padding slot: int((budget x r / (1 + r) - per_request) //
    per_request); the KV pool keeps the budget less (slots + 1) states."""
    if per_request <= 0:
        return 0
    return max(0, int((budget * memory_ratio / (1 + memory_ratio) - per_request) // per_request))


def hybrid_block_size(block_size: int, attention_page_bytes_per_token: int, state_bytes: int,
                      checkpoint_align: int = 1) -> int:
    """The attention block vLLM sets for a model with Gated DeltaNet (Mamba-like) layers so that one attention page
    holds one layer's state for one request: a x cdiv(state, a x one token's page), a = lcm(max(16, block), the
    prefill checkpoints' alignment), the block when larger; the state page is then padded to the attention page
    (platforms/interface.py _align_hybrid_block_size; 16 the attention kernels' smallest block)."""
    if not state_bytes or not attention_page_bytes_per_token:
        return block_size
    a = math.lcm(max(16, block_size), checkpoint_align)
    return max(block_size, a * -(-state_bytes // (a * attention_page_bytes_per_token)))


def unified_block_sizes(block_size: int, pages: tuple[int, int]) -> tuple[int, int]:
    """(sliding, full) groups' tokens per block once vLLM gives every group the largest page
    (kv_cache_utils.unify_kv_cache_spec_page_size): block_size x largest / own page; UsageError where a page does
    not divide the largest, as vLLM refuses ("not divisible by the maximum page size")."""
    largest = max(pages)
    if any(p and largest % p for p in pages):
        raise UsageError(f"KV pages of {pages[0]:,} and {pages[1]:,} bytes per block: vLLM cannot unify them (the "
                         "larger is not a multiple of the smaller); try another block size")
    return tuple(block_size * largest // p if p else block_size for p in pages)  # type: ignore[return-value]


def in_flight_tokens(engine: EngineSpec | None, pp: int, max_num_batched_tokens: int) -> int:
    """Tokens scheduled but not yet settled, which a sliding or chunked group reserves room for beside its window
    (``kv.in_flight``): one batch of max_num_batched_tokens (vLLM until 0.25), or one per concurrent batch, pp of
    them, + 1 under async scheduling (0.26+ VllmConfig.max_in_flight_tokens), which the V1 model runner gives only
    a single stage (``async_v1``: 2 at pp 1, else pp; max_concurrent_batches)."""
    rule = engine.kv.in_flight if engine is not None else "batch"
    batches = {"batch": 1, "pipeline": pp, "pipeline_async": pp + 1, "async_v1": max(2, pp)}[rule]
    return batches * max_num_batched_tokens


def blocks_per_request(engine: EngineSpec, groups: KVGroups, window: int | None, max_model_len: int,
                       in_flight: int, block_size: int, chunked: bool = False,
                       full_block_size: int | None = None, linear_kind: str | None = None) -> int:
    """Blocks one request of max_model_len tokens needs (vLLM get_max_concurrency_for_kv_cache_config): a full
    group cdiv(L, block); a sliding group cdiv(min(window - 1 + in_flight, L), block) + 1, a chunked one
    (``window`` the chunk) cdiv(min(window + in_flight, L), block) (ChunkedLocalAttentionSpec
    max_admission_blocks_per_request), ``in_flight`` the tokens in flight (``in_flight_tokens``); a state group
    ``kv.state_blocks`` blocks for the model's ``linear_kind`` (MambaSpec: 1, or 2-3 in its "align" prefix-caching
    mode). ``full_block_size``: the full groups' block where it differs (``unified_block_sizes``)."""
    full = -(-max_model_len // (full_block_size or block_size))
    states = groups.state_groups * engine.kv.state_blocks_for(linear_kind)
    if not groups.sliding_groups or window is None:
        return (groups.full_groups + groups.sliding_groups) * full + states
    if chunked:
        local = -(-min(window + in_flight, max_model_len) // block_size)
        return groups.full_groups * full + groups.sliding_groups * local + states
    held = min(window - 1 + in_flight, max_model_len) if engine.kv.sliding_chunk else min(
        window, max_model_len)
    return groups.full_groups * full + groups.sliding_groups * (-(-held // block_size) + 1) + states


# --- DeepSeek-V4 under vLLM's DeepSeek-V4 groupings (0.20+) -------------------------------------------------------

V4_MLA_BLOCK = 256   # tokens per block of its compressed caches: the only size its FlashMLA backends take
V4_SWA_BLOCK = 64    # DeepseekV4SWACache's fixed block


@dataclass(frozen=True, kw_only=True)
class V4Group:
    """One KV-cache group of DeepSeek-V4's layout: its bytes per block (its layers' pages, padded), tokens per block
    and sliding window (None: the compressed caches, which hold the whole context)."""

    bytes: int
    block: int
    window: int | None


@dataclass(frozen=True, kw_only=True)
class V4Layout:
    """vLLM's DeepSeek-V4 cache layout on one GPU: its groups (the compressed one first), the bytes one block id
    costs, and how its "Maximum concurrency" counts a request (``weighted``: 0.20-0.26's group bytes over the
    compressed group's; ``pages``: 0.27+'s sum of every group's blocks)."""

    groups: tuple[V4Group, ...]
    bytes_per_block: int
    concurrency: str = "weighted"

    def pages(self, max_model_len: int, in_flight_tokens: int) -> tuple[int, ...]:
        """Blocks each group reserves for one request of max_model_len tokens (vLLM max_memory_usage_bytes): a
        compressed group cdiv(L, 256); a sliding one cdiv(min(window - 1 + tokens in flight, L), block) + 1."""
        return tuple(-(-max_model_len // g.block) if g.window is None
                     else -(-min(g.window - 1 + in_flight_tokens, max_model_len) // g.block) + 1 for g in self.groups)

    def needed_bytes(self, max_model_len: int, in_flight_tokens: int) -> int:
        """The KV memory vLLM checks a request of max_model_len against at startup: bytes per block x every
        group's reserved blocks ("... KV cache is needed, which is larger than the available KV cache memory")."""
        return self.bytes_per_block * sum(self.pages(max_model_len, in_flight_tokens))

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """The "Maximum concurrency" denominator: the sum of every group's reserved blocks (``pages``), or
        cdiv(sum of each group's blocks x its bytes, the compressed group's bytes) (``weighted``)."""
        pages = self.pages(max_model_len, in_flight_tokens)
        if self.concurrency == "pages":
            return sum(pages)
        reserved = sum(p * g.bytes for p, g in zip(pages, self.groups, strict=True))
        return -(-reserved // self.groups[0].bytes)

    @property
    def sliding_blocks(self) -> int:
        """Blocks a running request past its windows holds in the sliding groups: in each, the blocks over its last
        window - 1 tokens, + 1 (its compressed group adds cdiv(c, 256))."""
        return sum(-(-(g.window - 1) // g.block) + 1 for g in self.groups if g.window is not None)


def _approximate_gcd(values: list[int], lower_bound: int) -> int:
    """vLLM's repeat count for hybrid groups: the d in [lower_bound, max(values)] with the fewest padding slots
    (sum of -x mod d), the larger on ties."""
    best, best_pad = lower_bound, None
    for d in range(lower_bound, max(values) + 1):
        pad = sum(-x % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best):
            best, best_pad = d, pad
    return best


# one bucket of same-kind caches: (tokens per block, sliding window or None, {page bytes: layers})
_Bucket = tuple[int, int | None, dict[int, int]]


def _v4_buckets(layers: int, csa_layers: int, hca_layers: int, csa_ratio: int, hca_ratio: int, entry_bytes: int,
                key_bytes: int, state_bytes: tuple[int, int, int], alignment: int) -> list[_Bucket]:
    """DeepSeek-V4's caches by kind, each page rounded up to ``alignment``: the compressed caches first (a CSA
    layer's entries and indexer keys, 256 / 4 per block; an HCA layer's entries, 256 / 128), then every layer's
    window (64 tokens per block over 128), a CSA layer's compressor and indexer-compressor states (4 per block
    over 8) and an HCA layer's compressor state (8 per block over 128)."""
    def page(n: int, size: int) -> int:
        return -(-n * size // alignment) * alignment

    kinds = [(V4_MLA_BLOCK, None, [(csa_layers, page(V4_MLA_BLOCK // csa_ratio, entry_bytes)),
                                   (csa_layers, page(V4_MLA_BLOCK // csa_ratio, key_bytes)),
                                   (hca_layers, page(V4_MLA_BLOCK // hca_ratio, entry_bytes))]),
             (V4_SWA_BLOCK, 128, [(layers, page(V4_SWA_BLOCK, entry_bytes))]),
             (4, 2 * csa_ratio, [(csa_layers, page(4, state_bytes[0])), (csa_layers, page(4, state_bytes[1]))]),
             (8, hca_ratio, [(hca_layers, page(8, state_bytes[2]))])]
    buckets: list[_Bucket] = []
    for block, window, pages in kinds:
        by_page: dict[int, int] = {}
        for n, p in pages:
            if n:
                by_page[p] = by_page.get(p, 0) + n
        if by_page:
            buckets.append((block, window, by_page))
    return buckets


def _split(count: int, parts: int) -> list[int]:
    """Repeats of a layer pattern in each of ``parts`` groups dealt round-robin ([i::parts])."""
    return [len(range(i, count, parts)) for i in range(parts)]


def v4_layout(layers: int, csa_layers: int, hca_layers: int, csa_ratio: int, hca_ratio: int, entry_bytes: int,
              key_bytes: int, state_bytes: tuple[int, int, int], alignment: int, grouping: str = "tuple",
              concurrency: str = "weighted") -> V4Layout:
    """vLLM's grouping of DeepSeek-V4's caches (``_v4_buckets``; ``state_bytes``: one token's CSA compressor, CSA
    indexer-compressor and HCA compressor state). ``tuple`` (0.20-0.22, kv_cache_utils
    _get_kv_cache_config_deepseek_v4) and ``packed`` (0.23-0.28, _get_kv_cache_config_packed): the compressed
    caches one group; each sliding kind split into groups of a repeat count (``_approximate_gcd`` of the layer
    counts, at least the compressed group's), its pages padded to the smallest compressed page at least as large;
    a block id costs the compressed pages once per repeat (tuple), or each page size times the most layers of it in
    one group (packed). ``outermost`` (0.29+, kv_cache_planning _get_packed_kv_cache_groups): no padding; a kind
    whose page sizes have equal layer counts splits into groups of the repeat count (``_approximate_gcd`` of those
    kinds' counts, at least the largest count of one holding several page sizes), others stay whole; a block id
    costs the largest group."""
    buckets = _v4_buckets(layers, csa_layers, hca_layers, csa_ratio, hca_ratio, entry_bytes, key_bytes,
                          state_bytes, alignment)
    if grouping == "outermost":
        even = [len(set(by_page.values())) == 1 for _, _, by_page in buckets]
        floor = max((max(b[2].values()) for b, e in zip(buckets, even, strict=True) if e and len(b[2]) > 1),
                    default=0)
        repeats = (_approximate_gcd([max(b[2].values()) for b, e in zip(buckets, even, strict=True) if e], floor)
                   if floor else 0)
        groups = []
        for (block, window, by_page), e in zip(buckets, even, strict=True):
            count = max(by_page.values())
            parts = -(-count // repeats) if e and repeats else 1
            shares = ([sum(p * n for p, n in by_page.items())] if parts == 1
                      else [k * sum(by_page) for k in _split(count, parts)])
            groups += [V4Group(bytes=b, block=block, window=window) for b in shares]
        return V4Layout(groups=tuple(groups), bytes_per_block=max(g.bytes for g in groups), concurrency=concurrency)
    (_, _, full), sliding = buckets[0], buckets[1:]
    groups = [V4Group(bytes=sum(p * n for p, n in full.items()), block=V4_MLA_BLOCK, window=None)]
    pages = sorted(full)
    repeats = _approximate_gcd([max(full.values())] + [max(b[2].values()) for b in sliding], max(full.values()))
    slots = dict(full)   # per page size, the most layers of it in one group
    for block, window, by_page in sliding:
        count = max(by_page.values())
        for share in _split(count, -(-count // repeats)):
            padded: dict[int, int] = {}
            for p in by_page:
                q = min((x for x in pages if x >= p), default=p)
                padded[q] = padded.get(q, 0) + share
            groups.append(V4Group(bytes=sum(q * n for q, n in padded.items()), block=block, window=window))
            for q, n in padded.items():
                slots[q] = max(slots.get(q, 0), n)
    if grouping == "packed":
        per_block = sum(q * n for q, n in slots.items())
    else:
        per_block = sum(pages) * max(slots.values())
    return V4Layout(groups=tuple(groups), bytes_per_block=per_block, concurrency=concurrency)


# --- DeepSeek-V4 under SGLang's DSV4 pools ------------------------------------------------------------------------

SGLANG_V4_PAGE = 256          # its DeepSeek-V4 page size (model_overrides/deepseek_v4.py)
SGLANG_SWA_EVICTION = 128     # SGLANG_SWA_EVICTION_INTERVAL: window tokens freed this many at a time


@dataclass(frozen=True, kw_only=True)
class SGLangV4Pool:
    """SGLang's DeepSeek-V4 pools on one GPU (pool_configurator.DSV4PoolConfigurator, ratio mode): full-token slots
    (``full_tokens``: what it logs as max_total_num_tokens), a window pool of ``swa_ratio`` x them, the bytes one
    full-token slot costs and the fixed HCA compressor-state pool taken first."""

    full_tokens: int
    swa_tokens: int
    bytes_per_full_token: float
    fixed_bytes: int
    window: int = 128

    def sequences(self, context: int, max_running_requests: int) -> int:
        """Requests of ``context`` tokens held at once: the full pool in whole pages, the window pool at its worst
        case per request (window + eviction interval + a page of alignment + a decode page:
        compute_swa_request_cap), and the request cap."""
        pages = -(-context // SGLANG_V4_PAGE) * SGLANG_V4_PAGE
        return max(0, min(self.full_tokens // pages, self.swa_tokens // self.window_tokens_per_request,
                          max_running_requests))

    @property
    def window_tokens_per_request(self) -> int:
        """Window-pool slots one request may hold (compute_swa_request_cap): its window, the eviction interval, a
        page of alignment and a decode page."""
        return self.window + SGLANG_SWA_EVICTION + 2 * SGLANG_V4_PAGE


def sglang_v4_pool(budget: int, layers: int, csa_layers: int, hca_layers: int, csa_ratio: int, hca_ratio: int,
                   entry_bytes: int, key_bytes: int, head_dim: int, index_head_dim: int, swa_ratio: float,
                   max_running_requests: int, window: int = 128, alignment: int = 576) -> SGLangV4Pool:
    """SGLang 0.5.21+'s sizing: a page of n entries costs cdiv(n x entry, 576) x 576 B (KVLayout.V4.page_bytes), so
    per full-token slot: swa_ratio x (every layer's window entry + a CSA layer's 8 fp32 compressor and
    indexer-compressor state rows per 256-token window page) + a CSA layer's (entry + indexer key) / 4 + an HCA layer's
    entry / 128; first the HCA compressor states, (slots x 128 + 129 rows, to a multiple of 128) x 2 x head_dim fp32
    per HCA layer for max_running_requests + 1 slots; full tokens and window tokens in whole 256-token pages."""
    def per_entry(n: int) -> float:
        return -(-n * entry_bytes // alignment) * alignment / n

    state = 2 * 2 * (head_dim + index_head_dim) * 4                 # one CSA compressor + indexer-compressor row
    per_swa = per_entry(SGLANG_V4_PAGE) * layers + 8 / SGLANG_V4_PAGE * state * csa_layers
    per_full = (swa_ratio * per_swa + csa_layers * (per_entry(SGLANG_V4_PAGE // csa_ratio) + key_bytes) / csa_ratio
                + hca_layers * per_entry(SGLANG_V4_PAGE // hca_ratio) / hca_ratio)
    rows = -(-((max_running_requests + 1) * hca_ratio + hca_ratio + 1) // 128) * 128
    fixed = rows * 2 * head_dim * 4 * hca_layers if hca_layers else 0
    full = int(max(budget - fixed, 0) / per_full) // SGLANG_V4_PAGE * SGLANG_V4_PAGE
    swa = int(full * swa_ratio) // SGLANG_V4_PAGE * SGLANG_V4_PAGE
    return SGLangV4Pool(full_tokens=full, swa_tokens=swa, bytes_per_full_token=per_full, fixed_bytes=fixed,
                        window=window)
