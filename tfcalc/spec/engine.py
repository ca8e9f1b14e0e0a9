"""EngineSpec: one serving-engine version (vLLM, SGLang, TensorRT-LLM, gpt-fast) as frozen data -- how it budgets
GPU memory (``tfcalc plan``, the ``fits`` column of ``tfcalc estimate``) and how it runs its kernels (the latency
model of ``tfcalc estimate``).

Presets live in ``presets/engines/NAME-VERSION.yaml`` (or ``NAME.yaml`` for an engine without releases), one per
engine version, loaded by ``tfcalc.spec.presets.load_engine``; each names the releases it describes and cites the
engine source for every mechanism.

- Memory (top-level sections): the formulas that use them are in ``tfcalc.calc.engine``; sizes in the YAML are
  in GiB (2^30 bytes) or MiB and converted to bytes here. ``budget: ideal`` says the engine keeps no KV pool of
  its own to model (gpt-fast allocates a static cache): ``plan`` then uses the plain arithmetic (``engine=None``)
  and says so, and the memory sections are left out.
- Kernels (the ``kernels:`` section, ``EngineKernels``): CUDA graphs, custom all-reduce, fused activation
  quantisation, the eager launch cost and measured floors where the engine's kernels differ from the GPU preset's
  (which are vLLM's). Every field has a default (``EngineKernels()``, a CUDA-graph engine with custom all-reduce
  and the GPU preset's floors); a version file without a ``kernels:`` block runs its kernels as the default
  version of the same engine does (the loader shares that block: kernel facts are measured once per engine).
- Requests (the ``requests:`` section, ``RequestCosts``): what serving a request costs outside the forward passes
  (request latency, the API server's serial work per request and per streamed chunk), read by ``tfcalc capacity``
  and the serving simulation; shared by the engine's versions the same way, none where absent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from tfcalc.dtypes import dtype_names
from tfcalc.errors import SpecError, UsageError

if TYPE_CHECKING:
    from tfcalc.spec.interconnect import CustomAllReduce, Interconnect

GIB = 1 << 30
MIB = 1 << 20
BudgetKind = Literal["utilization", "measured", "static_fraction", "free_fraction", "ideal"]
BUDGET_KINDS = ("utilization", "measured", "static_fraction", "free_fraction", "ideal")
CaptureRule = Literal["vllm", "vllm-0.8", "sglang", "none"]
ConcurrencyRule = Literal["vllm", "pool"]

# Names of the budget terms, each engine's own word for it in its log (for --explain).
TERM_KEYS = ("capacity", "requested", "weights", "activation", "non_torch", "cuda_graph", "kv_budget", "kv_tokens",
             "concurrency")
FLOOR_CLASSES = ("gemm", "elementwise", "attention", "moe", "gdn_prefill", "gdn_decode")
BLOCK_CLASSES = ("mla_decode", "mla_prefill")

# Bounds of the YAML's numbers (finite, and at most these): far beyond any real engine, so that a typo or a
# hostile file is refused with one line instead of turning into an absurd plan.
MAX_GIB = float(1 << 20)
MAX_MIB = float(1 << 30)
MAX_COUNT = 1 << 40
MAX_MICROSECONDS = 1e6


@dataclass(frozen=True, kw_only=True)
class SchedulerDefault:
    """Defaults for max_num_seqs / max_num_batched_tokens on GPUs of at least ``min_memory_gib`` whose name holds
    none of ``exclude_gpus``; the first matching row wins."""

    max_num_seqs: int
    max_num_batched_tokens: int
    min_memory_gib: float = 0.0
    exclude_gpus: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SchedulerPolicy:
    """How the engine's scheduler fills a step (``serving_sim.SimConfig.policy``; the analytic
    ``serving.ReplicaServing.policy`` reads all but ``chunked_prefill``): chunks of a prompt or only whole
    prompts; decode beside prefill or, ``prefill_first``, a step of prefill chunks alone whenever a prompt can be
    admitted; ``max_prefill_tokens``: the prefill tokens such a step takes beyond its first prompt (None: the token
    budget alone); ``reserve_output``: admission holds back the running requests' remaining output (SGLang)."""

    chunked_prefill: bool = True
    prefill_first: bool = False
    max_prefill_tokens: int | None = None
    reserve_output: bool = False     # admission reserves output tokens (SGLang's new_token_ratio)


@dataclass(frozen=True, kw_only=True)
class RequestCosts:
    """What serving a request costs outside the GPU's forward passes (seconds), the ``requests:`` block: latencies
    on a request's path (``request_s`` from the client to the engine's queue beyond the API server's own work,
    ``per_input_token_s`` per prompt token on it, ``stream_s`` back to the client, ``step_s`` CPU per engine step not
    overlapped with the GPU) and the API server's serial work (``api_request_s`` per request, ``api_input_token_s``
    per prompt token, ``api_token_s`` per streamed chunk) on each of ``api_servers`` processes. ``tfcalc capacity``
    and the serving simulation queue them (``tfcalc.calc.serving_traffic.Overheads``, which adds their source)."""

    request_s: float = 0.0
    per_input_token_s: float = 0.0
    step_s: float = 0.0
    stream_s: float = 0.0
    api_request_s: float = 0.0
    api_input_token_s: float = 0.0
    api_token_s: float = 0.0
    api_servers: int = 1


# the requests: block's keys and the unit each is given in (units per second)
REQUEST_COST_KEYS = {"latency_ms": ("request_s", 1e3), "per_input_token_us": ("per_input_token_s", 1e6),
                     "step_us": ("step_s", 1e6), "stream_ms": ("stream_s", 1e3),
                     "api_request_ms": ("api_request_s", 1e3), "api_input_token_us": ("api_input_token_s", 1e6),
                     "api_token_us": ("api_token_s", 1e6)}


@dataclass(frozen=True, kw_only=True)
class Overheads:
    """Memory outside the torch allocator, per GPU. ``startup_*``: CUDA context (and NCCL communicators at tp > 1)
    present before the engine's baseline; counted in the budget only if ``startup_in_budget``. ``non_torch_*``: what
    appears during the profiling run (NCCL / custom all-reduce buffers, cuBLAS workspaces), always counted."""

    startup_bytes_tp1: int
    startup_bytes_tp: int
    startup_in_budget: bool
    non_torch_bytes_tp1: int
    non_torch_bytes_tp: int
    non_torch_bytes_pp: int
    # (startup, non-torch) bytes at tp > 1 where the GPUs talk over another fabric than the figures above were
    # logged on, by the GPU preset's interconnect preset (latency.interconnect_preset: pcie4, ...)
    tp_bytes_by_fabric: tuple[tuple[str, int, int], ...] = ()

    def tp_bytes(self, fabric: str | None) -> tuple[int, int]:
        """(startup, non-torch) bytes at tp > 1 over ``fabric``."""
        return next(((start, rest) for name, start, rest in self.tp_bytes_by_fabric if name == fabric),
                    (self.startup_bytes_tp, self.non_torch_bytes_tp))


@dataclass(frozen=True, kw_only=True)
class ActivationModel:
    """The profiling run's torch peak: a forward of max_num_batched_tokens tokens, then (last pipeline stage) a
    dummy sampler pass over min(max_num_seqs, max_num_batched_tokens) rows of logits."""

    sampler_bytes_per_logit: float
    sampler_scratch_rows: int
    hidden_copies: int
    moe_workspace: bool
    # the V2 model runner's penalty statistics, kept from start-up and counted in the budget (vLLM 0.27+): output
    # token counts [max_num_seqs, vocab] int32 and the prompt's bit mask [max_num_seqs, vocab / 32] int32
    penalty_state: bool = False
    # the same statistics allocated after the weights are measured but counted nowhere (YAML penalty_state:
    # uncounted; the V2 runner of 0.22-0.26): they take room in the 1 - utilization slack
    penalty_state_uncounted: bool = False


@dataclass(frozen=True, kw_only=True)
class CudaGraphModel:
    capture: CaptureRule
    first_capture_bytes: int
    per_size_bytes: int
    per_size_bytes_tp: int      # at tp > 1 (custom all-reduce buffers registered per graph)
    in_budget: bool
    # False: the engine has no estimate to subtract (vLLM's V2 runner until 0.29), whatever the switch
    # (--cuda-graph-memory, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS) says
    estimated: bool = True
    # the largest captured batch where the engine raises it on a GPU (vLLM 0.28+: 1024 on SM100 parts), by GPU
    # preset name (or the preset its kernels are read as); 512 elsewhere
    max_size_by_gpu: tuple[tuple[str, int], ...] = ()


# vLLM's groupings of DeepSeek-V4's caches by release (calc.engine.v4_layout)
V4_GROUPINGS = ("tuple", "packed", "outermost")
# tokens in flight a sliding group reserves room for (calc.engine.in_flight_tokens)
IN_FLIGHT_RULES = ("batch", "pipeline", "pipeline_async", "async_v1")
# what a listed architecture must also be for ModelRunnerRule to pick the second runner
RUNNER_REQUIREMENTS = ("dense", "unquantized")
# the sections a second model runner's ``changes`` may lay over its release's
RUNNER_CHANGES = ("display_name", "activation", "cuda_graphs", "kv", "terms")


@dataclass(frozen=True, kw_only=True)
class ModelRunnerRule:
    """Which models a release runs on its second model runner (vLLM 0.22-0.28: the V2 runner by default for some
    models, VllmConfig.use_v2_model_runner / _is_default_v2_model_runner_model): a listed architecture that also
    meets ``listed_requires`` (dense: no routed experts; unquantized: no quantized weights), and with ``dense``
    every model without routed experts; a model with linear-attention layers only when ``hybrid_listed`` and it is
    listed, an attention-free one never. On AMD GPUs (ROCm) the ``amd_unlisted`` architectures are not listed
    (vLLM 0.27-0.28 ROCM_EXCLUDED_V2_MODEL_RUNNER_ARCHITECTURES) and the ``amd_second`` ones take the second runner
    whatever else (0.29-0.31 ROCM_DEFAULT_MRV1_ARCHITECTURES, whose second runner is V1)."""

    architectures: tuple[str, ...]
    runners: tuple[str, str]           # the two runners' names (V1, V2)
    listed_requires: tuple[str, ...] = ()
    dense: bool = False
    hybrid_listed: bool = False
    amd_unlisted: tuple[str, ...] = ()
    amd_second: tuple[str, ...] = ()

    def picks(self, architecture: str | None, *, moe: bool, quantized: bool, hybrid: bool,
              attention_free: bool, amd: bool = False) -> bool:
        """Whether a model of these traits runs on the second runner (``amd``: on an AMD GPU)."""
        if amd and architecture in self.amd_second:
            return True
        listed = architecture in self.architectures and not (amd and architecture in self.amd_unlisted) and not (
            ("dense" in self.listed_requires and moe) or ("unquantized" in self.listed_requires and quantized))
        if attention_free or (hybrid and not (self.hybrid_listed and listed)):
            return False
        return listed or (self.dense and not moe)


@dataclass(frozen=True, kw_only=True)
class StatePoolRule:
    """SGLang's pool of Mamba / Gated DeltaNet states beside the KV pool (kv_cache_configurator
    _handle_max_mamba_cache): ``memory_ratio`` of state to KV memory, state slots a running request keeps
    (``slots_per_request``; ``extra_buffer_slots`` more for Gated DeltaNet models, whose radix cache keeps an extra
    buffer under the overlap scheduler)."""

    memory_ratio: float
    slots_per_request: int
    extra_buffer_slots: int


@dataclass(frozen=True, kw_only=True)
class V4PoolRule:
    """SGLang's DeepSeek-V4 pool defaults (model_overrides/deepseek_v4.py, deepseek_v4_hook.py)."""

    swa_ratio: float
    max_running_requests: int


@dataclass(frozen=True, kw_only=True)
class KVLayout:
    hybrid_groups: bool
    sliding_chunk: bool
    swa_full_tokens_ratio: float | None
    concurrency: ConcurrencyRule
    # --kv-cache-dtype auto stores the cache in the format the checkpoint declares (ModelSpec.checkpoint_kv_dtype)
    checkpoint_dtype: bool = False
    # chunked local-attention layers (Llama 4) hold only their current chunk (vLLM's hybrid allocator with
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1: off by default from #21761 (v0.10.1) until #29627
    # turned it on, between v0.22 and v0.23 per #46553; a v0.12.0 deployment had to set it); else full layers
    chunked_local: bool = False
    # --kv-cache-dtype auto keeps a DSA model's (DeepSeek-V3.2, GLM-5) MLA cache in fp8, FlashMLA's fp8_ds_mla record
    sparse_mla_fp8: bool = False
    # the same on these GPU presets only (SGLang: compute capability 10 and up)
    sparse_mla_fp8_gpus: tuple[str, ...] = ()
    # GPU presets on which an 8-bit DSA cache is the raw latent, kv_lora_rank + rope bytes without scales (SGLang's
    # TensorRT-LLM kernels on SM100), not FlashMLA's record
    sparse_mla_raw_gpus: tuple[str, ...] = ()
    # DeepSeek-V4's caches in vLLM's groups (calc.engine.v4_layout: tuple 0.20-0.22, packed 0.23-0.28, outermost
    # 0.29+), "Maximum concurrency" counting a request as weighted (0.20-0.26) or pages (0.27+); None: at their size
    v4_groups: str | None = None
    v4_concurrency: str = "weighted"
    # DeepSeek-V4 in SGLang's DSV4 pools (calc.engine.sglang_v4_pool): the window pool's ratio to the full-token
    # pool and the request cap the fixed compressor states are sized for; None: not this engine's layout
    v4_pool: V4PoolRule | None = None
    # Mamba / Gated DeltaNet states in a pool of their own split off the KV budget (SGLang); None: beside each
    # request's KV (vLLM pages them in its groups)
    state_pool: StatePoolRule | None = None
    # what its "GPU KV cache size" reports: blocks (num_blocks // groups x block size, vLLM 0.20.0 and before) or
    # concurrency (int(Maximum concurrency x max_model_len), 0.20.1+)
    tokens: str = "blocks"
    # hybrid groups take the largest layer type's count as their size while it is under this times the smallest's
    # (vLLM _get_kv_cache_groups_uniform_page_size: 1.25 until 0.17, 1.5 from 0.18)
    group_size_ratio: float = 1.25
    # tokens a sliding or chunked group reserves room for beside its window: one batch (max_num_batched_tokens,
    # vLLM until 0.25), pipeline (pp batches), pipeline_async (pp + 1: 0.26+ max_in_flight_tokens) or async_v1 (the
    # V1 model runner's: 2 at pp 1, else pp)
    in_flight: str = "batch"
    # blocks a running request keeps in each Mamba / Gated DeltaNet state group: 1, or more where prefix caching keeps
    # aligned checkpoints beside the running state (vLLM's mamba_cache_mode "align": 2, + 1 prefill checkpoint for
    # the layers that export one); by the model's linear-attention kind where they differ
    state_blocks: int = 1
    state_blocks_by_kind: tuple[tuple[str, int], ...] = ()
    # tokens a hybrid model's attention block is also a multiple of where prefix caching keeps prefill checkpoints
    # on block boundaries (vLLM 0.33+: FlashInfer's Gated DeltaNet prefill, 64), by linear-attention kind
    checkpoint_align_by_kind: tuple[tuple[str, int], ...] = ()
    # prefix caching is on by default for a hybrid model (vLLM 0.28+); off, only --enable-prefix-caching keeps the
    # aligned state blocks above (vLLM 0.26-0.27: supported, opt-in)
    hybrid_prefix_caching: bool = True
    # where a Mamba / Gated DeltaNet request's state lives when neither vLLM's groups nor SGLang's pool hold it:
    # beside its KV, taken from the pool per running request ("requests"), or in max_num_seqs slots allocated before
    # the KV cache is sized ("max_num_seqs": TensorRT-LLM 1.0-1.2's MambaHybridCacheManager)
    state_slots: str = "requests"
    # the recurrent state's format: the checkpoint's (its declared SSM dtype, else the model's: vLLM), the model's
    # ("model": TensorRT-LLM 1.0-1.2's mamba_ssm_cache_dtype auto) or the checkpoint's else float32 ("fp32": SGLang)
    state_dtype: str = "checkpoint"
    # --kv-cache-memory-bytes sets each GPU's KV cache outright, utilization and profiling aside (vLLM 0.11+)
    explicit_budget: bool = False

    def state_blocks_for(self, kind: str | None) -> int:
        """State blocks a request keeps in one state group of a model whose linear layers are of ``kind``."""
        return dict(self.state_blocks_by_kind).get(kind or "", self.state_blocks)

    def checkpoint_align_for(self, kind: str | None) -> int:
        """Tokens the hybrid attention block of a model whose linear layers are of ``kind`` is a multiple of."""
        return dict(self.checkpoint_align_by_kind).get(kind or "", 1)


@dataclass(frozen=True, kw_only=True)
class WeightLayout:
    vocab_padding: int
    rotary_cache: bool
    mla_absorbed_copy: bool
    mxfp4_pad_hidden: int
    mxfp4_pad_intermediate: int
    float32_as: str | None = None   # the 16-bit format a float32 checkpoint is served in (--dtype auto); None: fp32
    unsupported: tuple[str, ...] = ()  # weight storage formats the engine cannot serve (tfcalc.dtypes names)


@dataclass(frozen=True, kw_only=True)
class StaticFractionRule:
    """SGLang's automatic mem_fraction_static: (capacity - reserved) / capacity, reserved in MiB =
    base + max(chunked_prefill, 2048) x per_prefill_token + cuda_graph_max_bs x per_graph_bs + tp x pp / 8 x 1024
    (+ the prefill CUDA graphs' reserve, ``per_prefill_graph_mib`` per capture size or ``mla_prefill_graph_mib``),
    at least ``floor_mib`` on GPUs above 60 GiB. ``tiers``: (memory below GiB, chunked_prefill, max bs tp < 4,
    max bs tp >= 4)."""

    base_mib: float
    per_prefill_token_mib: float
    per_graph_bs_mib: float
    floor_mib: float
    tiers: tuple[tuple[float, int, int, int], ...]
    per_prefill_graph_mib: float = 0.0    # 0: no prefill CUDA graphs (before SGLang 0.5.10)
    mla_prefill_graph_mib: float = 0.0
    # data-parallel attention: cuda_graph_max_bs x attention ranks x this, + the second term above 300 sequences
    per_dp_graph_bs_mib: float = 0.0
    per_dp_graph_bs_mib_above_300: float = 0.0
    # cuda_graph_max_bs no larger than --max-running-requests (SGLang 0.5.22+)
    graph_bs_within_running: bool = False


# vLLM csrc/custom_all_reduce.cuh (SGLang sgl-kernel/csrc/allreduce/custom_all_reduce.cuh the same): the one-shot
# kernel on 2 GPUs always, else on at most 4 GPUs below 512 KiB and on at most 8 below 256 KiB; two-shot otherwise
VLLM_ONE_SHOT_BELOW: tuple[tuple[int, float], ...] = ((4, 512 * 1024.0), (8, 256 * 1024.0))
# one linear layer's host seconds by token count: (max tokens, seconds, seconds at a multiple of SCALE_ALIGNED_ROWS
# tokens or None) steps, the last max tokens None (open)
LinearHostSteps = tuple[tuple[int | None, float, float | None], ...]
# the largest CUDA-graph step by GPU memory: (minimum GiB, tokens below tp 4, tokens at tp >= 4), ascending
GraphCaps = tuple[tuple[float, int, int], ...]


@dataclass(frozen=True, kw_only=True)
class ArchitectureMoe:
    """The fused MoE an engine runs for one model architecture on one GPU in place of its default kernel (SGLang on
    a B200: FlashInfer TRT-LLM's for Qwen3-MoE and DeepSeek-V3, Triton's for the rest): its efficiency per compute
    dtype or storage format (those formats run it), its fixed cost in seconds per format where measured, the
    formats for which it touches every token's top-k rows under expert parallelism (the others: its own rows), and
    per format the fraction of the datasheet bandwidth its expert weights stream at whatever the tokens, where that
    differs from the GPU's fused-MoE stream (a kernel held at heuristic tactics), and the fp8 formats whose rows it
    takes and passes in 8 bits (``Rates.moe_fused_rows``), and the weight kinds (DEQUANT_FORMATS) it runs weight-only,
    16-bit activations and the weights unpacked in the kernel, though the GPU has tensor cores for them (vLLM's
    Marlin experts for Kimi K3's MXFP4 on Blackwell). Also the experts' kernel behind DeepEP's all-to-all
    (``EngineKernels.deepep_moe_by_gpu``)."""

    efficiency: dict[str, float] = field(hash=False)
    floors_s: dict[str, float] = field(default_factory=dict, hash=False)
    ep_every_row: frozenset[str] = frozenset()
    memory_efficiency: dict[str, float] = field(default_factory=dict, hash=False)
    fused_rows: frozenset[str] = frozenset()
    weight_only: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True)
class EngineTwoShot:
    """An engine's own two-shot all-reduce on one fabric where it differs from the fabric's kernel: its latency
    (seconds, plus per peer GPU), for messages below ``below_bytes`` as (GPUs, bytes) rows (the fewest GPUs at
    least n apply: vLLM's CUSTOM_ALL_REDUCE_MAX_SIZES); larger messages run the engine's symmetric-memory
    all-reduce, priced as the fabric's kernel."""

    latency_s: float
    latency_s_per_peer: float
    below_bytes: tuple[tuple[int, float], ...]

    def covers(self, nbytes: float, n: int) -> bool:
        """Whether an all-reduce of ``nbytes`` over ``n`` GPUs runs this kernel (none listed that many: no)."""
        return nbytes < limit_for_gpus(self.below_bytes, n)


def limit_for_gpus(rows: tuple[tuple[int, float], ...], n: int) -> float:
    """The byte limit of (GPUs, bytes) ``rows`` that applies to ``n`` GPUs: the row of the fewest GPUs at least n
    (0 where no row holds that many)."""
    return next((below for gpus, below in rows if n <= gpus), 0.0)


@dataclass(frozen=True, kw_only=True)
class EngineKernels:
    """How an engine runs a step, for the latency model (``tfcalc.calc.latency``); times in seconds.

    ``cuda_graphs``: decode steps replay captured graphs (else each kernel waits for its host launch,
    ``eager_launch_s``); ``custom_allreduce``: one-/two-shot kernels for all-reduces below
    ``custom_allreduce_max_bytes`` where the fabric has them, one-shot as ``one_shot_allreduce`` says, with this
    engine's own launch cost per interconnect preset where it differs from the fabric's
    (``custom_allreduce_launch_s``) and its own two-shot kernel's latency where it differs
    (``custom_allreduce_two_shot``, ``EngineTwoShot``); ``fused_activation_quant``: fp8/int8 W8A8 GEMMs quantise
    their input inside the preceding kernel (else a kernel of its own), except, per weight format, after the kinds of
    kernel ``unfused_activation_quant`` names (``QUANT_PLACES``: a norm, attention, an activation); ``floors_s``: per
    kernel class (gemm, elementwise, attention, moe), replacing the GPU preset's floor where this engine's kernels
    were measured to differ; ``block_floors_s``: the fixed cost of a fused block per layer (mla_decode,
    mla_prefill); ``moe_expert_floors_s``: per compute dtype, a fused-MoE kernel's fixed cost per local expert
    (added to its floor); ``moe_dequant_ops_by_gpu``: per GPU preset name and weight-only format, the CUDA-core
    instructions per weight this engine's fused-MoE kernel spends dequantising (replacing ``kernels.DEQUANT_OPS``'
    entry on that GPU); ``moe_efficiency_by_gpu``: per GPU preset name and compute dtype, the grouped expert-GEMM
    efficiency of this engine's fused-MoE kernel, replacing that GPU preset's ``latency.moe_efficiency`` entry
    (other GPUs and dtypes keep the GPU preset's); ``moe_k0_by_gpu``: per GPU preset name and compute dtype, the
    K-loop elements each output tile of that kernel's grouped GEMMs costs (replacing ``kernels.GEMM_K0`` in its
    fused MoE: the tile's fixed work); ``moe_fused_rows_by_gpu``: per GPU preset name, the fp8 formats whose fused
    MoE quantizes each routed row once, fuses the activation and its requantization into the first GEMM's epilogue
    and passes 8-bit rows between its GEMMs (FlashInfer's TRT-LLM per-tensor FP8 MoE), as NVFP4 kernels pass FP4 rows;
    ``moe_dequant_per_tile_by_gpu``: per GPU preset name, the weight-only formats
    whose fused-MoE kernel unpacks an expert's weights again in every row tile's main loop (by default, once per
    expert and step); ``moe_weight_only_by_gpu``: per GPU preset name, the formats this engine's fused MoE runs
    weight-only (16-bit activations, the weights unpacked inside the kernel) although the GPU has tensor cores for
    them (vLLM's code default for MXFP4 experts on Blackwell, bf16 activations; its shipped preset does not set
    it: the measured B200 runs are as fast as MXFP8 activations); ``moe_by_architecture``: per GPU preset name and
    model architecture (``ModelSpec.architecture``), the fused MoE the engine runs for that architecture there
    (``ArchitectureMoe``), looked up before the per-GPU tables for the formats it covers; ``deepep_moe_by_gpu``:
    per GPU preset name, the experts' kernel in decode-only steps where DeepEP's all-to-all brings the tokens
    (data-parallel attention: SGLang's DeepGEMM masked grouped GEMMs), in place of the default fused MoE;
    ``moe_ep_every_row_by_gpu``: per GPU preset name, the expert storage formats ("*": every one; the YAML's list of
    GPU names) for which this engine's fused MoE, under expert parallelism with the tokens on every rank, activates,
    zero-fills and combines every token's top-k rows rather than its own experts' (``Rates.moe_ep_every_row``);
    ``moe_floors_by_gpu``: per GPU preset name and expert storage format, the fused MoE's fixed cost in seconds where
    that kernel's differs from the ``moe`` floor (TensorRT-LLM's MXFP4 backends; SGLang's Triton fused MoE on a
    B200); ``moe_ep_floors_by_gpu``: likewise the seconds the fused MoE adds under expert parallelism (vLLM's MXFP4
    experts on Hopper take a modular path that routes through the expert map in kernels of its own);
    ``moe_touched_expert_s_by_gpu``: likewise the seconds each expert a step touches adds to the fused MoE beyond its
    weights' stream, which then runs at the GPU's fused-MoE stream (SGLang's MXFP4 experts on FlashInfer TRT-LLM);
    ``moe_row_bytes_by_gpu``: likewise the bytes per routed row and hidden element the fused MoE moves beyond the
    staged rows tfcalc counts (TensorRT-LLM's CUTLASS NVFP4 flow on a B200: its permute, quantize and finalize);
    ``gdn_efficiency_by_gpu``: per GPU preset name, the fraction of the dense bf16 peak this engine's chunked Gated
    DeltaNet prefill kernel reaches (``Rates.gdn_efficiency``; default: the GEMM rate);
    ``linear_host_s_by_gpu``: per GPU preset name and weight storage format, the host seconds one linear layer's
    call takes when it runs outside a CUDA graph (its Python path: input quantisation, scale layout, kernel
    dispatch), as (max tokens, seconds, seconds when the tokens are a multiple of ``kernels.SCALE_ALIGNED_ROWS``
    or None) steps, the last open (None); ``uncaptured_linears``: the storage formats
    whose linear layers run outside the CUDA graphs, each costing at least that host time (default none: every
    linear is captured; a fused attention block's projections, MLA's, run inside it); ``graph_prefill``: whether
    steps that carry prefill tokens replay graphs too (vLLM V1's piecewise graphs; else only decode-only steps do);
    ``graph_max_tokens``: the largest step, in tokens, that replays a graph, as rows (minimum GPU memory in GiB,
    below tp 4, at tp >= 4), the last row whose minimum the GPU reaches applying (default none: every size);
    ``gemm_memory_efficiency_by_gpu``: per GPU preset name and weight storage format, the fraction of the datasheet
    bandwidth this engine's small-M GEMMs stream that format's weights at, replacing the GPU preset's
    (``latency.memory_efficiency`` / ``gemm_memory_efficiency``); ``gemm_efficiency_by_gpu``: likewise, the fraction
    of the compute dtype's peak its large dense GEMMs of that format reach, replacing the GPU preset's
    ``latency.gemm_efficiency`` for them; ``online_fp8_scale``: how per-tensor fp8 linears scale their inputs when
    the engine quantises a 16-bit checkpoint itself (``dynamic``: vLLM's and SGLang's ``--quantization fp8``;
    ``static``: an engine that serves calibrated checkpoints only); ``ep_dispatch``: how data-parallel attention
    ranks reach the experts (``all_to_all``: DeepEP's kernels, each token's top-k copies in decode and one copy per
    rank holding any of its experts in steps with prefill; ``per_rank``: one copy per such rank in every step,
    TensorRT-LLM's all-to-all; ``allgather``: within one NVLink domain every rank all-gathers every rank's tokens and
    reduce-scatters the results, vLLM's default ``allgather_reducescatter`` backend, beyond it DeepEP's low-latency
    kernels);
    ``dynamic_scale_s_by_gpu``: per GPU preset name,
    the fixed seconds of one dynamic scale (its max reduction) at small M (default: an elementwise kernel's floor);
    ``moe_stream_bits_by_gpu``: per GPU preset name and expert storage format, the bits per weight this engine's
    fused MoE streams where it upcast the experts at load (SGLang's Triton fallback for MXFP4 on Hopper: 16, run as
    bf16 with no unpacking; the kernel's time only, plan's weights stay the checkpoint's);
    ``moe_large_m_memory_by_gpu``: per GPU preset name and expert storage format, the fraction of the datasheet
    bandwidth that weight stream reaches once a step's tokens outnumber the local experts (SGLang's default Triton
    config switches from 16-row to 64-row tiles there); ``moe_tuned_shapes_by_gpu``: per GPU preset name and expert
    storage format, the (local experts, per-rank expert width) shapes this engine's fused MoE has a tuned kernel
    configuration for (SGLang's and vLLM's Triton config files); a shape outside it runs the default configuration, at
    ``moe_untuned_efficiency_by_gpu`` (required for every listed GPU and format: its grouped efficiency), with the
    grouped-GEMM K0 ``moe_untuned_k0`` (0: the tuned kernel's) and, once a step's tokens outnumber the local
    experts, ``moe_untuned_large_m_memory_by_gpu`` (its weight stream's fraction of the datasheet bandwidth);
    ``moe_large_expert_by_gpu``: per GPU preset name and expert storage format, (bytes, slowdown): an expert whose
    per-rank gate/up matrix holds more than bytes runs the grouped GEMMs 1 + slowdown x (1 - bytes / its bytes) times
    as long (the YAML gives [MiB, slowdown]);
    ``shared_experts_stream_max_tokens`` /
    ``shared_experts_stream_in_graphs``: the steps in which the engine runs a MoE layer's shared experts on a second
    CUDA stream beside the routed ones (vLLM: up to 256 tokens; TensorRT-LLM: steps replayed from CUDA graphs; 0 /
    false: never). The per-dtype tables (expert floors, efficiency, K0) also take a storage format's name
    (``fp8_block``, ``fp8_e4m3``, ...): its kernel's entry, looked up before the compute dtype's. The defaults
    describe an engine whose kernels are those the GPU presets measured (vLLM's). ``dsa_prefill_head_tile_by_gpu``:
    per GPU preset name, the query-head tile the engine's sparse MLA prefill kernel pads each GPU's heads up to for a
    DSA model (FlashMLA's sparse prefill: 64 on Hopper, 128 on Blackwell; vLLM FlashMLASparseImpl.prefill_padding);
    ``dsa_dense_short_prefill``: a prefill whose keys all fit the indexer's top-k runs the dense MLA instead of the
    indexer and the sparse kernel (SGLang's NSA "dense MHA" path); ``dsa_block_floors_by_gpu``: per GPU preset name,
    the fixed seconds of a DSA model's whole attention block per layer and phase (decode, prefill), replacing the MLA
    block floors; ``dsa_prefill_efficiency_by_gpu``: per GPU preset name, the fraction of the dense bf16 peak the
    sparse MLA prefill reaches on its padded heads' FLOPs (replacing the flash-attention fraction);
    ``dsa_prefill_full_topk_by_gpu``: the GPU preset names on which that kernel runs all top-k slots of every query,
    the invalid ones of a query with fewer keys included (TensorRT-LLM on Hopper); ``v4_prefill_efficiency_by_gpu``:
    per GPU preset name, the fraction of the bf16 peak DeepSeek-V4's sparse prefill attention reaches on its padded
    heads' FLOPs; ``msa_fp32_expansion_by_gpu``: per GPU preset name, the fraction of the datasheet bandwidth, per
    phase (decode, prefill), at which the engine's MiniMax-M3 sparse attention moves per-query FP32 copies of every
    key (TensorRT-LLM's Triton path, the one it runs off SM100); a GPU it names runs that path (``msa_decode`` /
    ``msa_prefill`` in ``dsa_block_floors_by_gpu``: the MSA block's fixed seconds; ``mla_decode`` / ``mla_prefill``
    there: the MLA block's on that GPU, where the engine runs another MLA backend, replacing ``block_floors_s``). """

    cuda_graphs: bool = True
    custom_allreduce: bool = True
    custom_allreduce_max_bytes: float = 8 * 1024 * 1024   # vLLM custom_all_reduce.py max_size (SGLang's too)
    one_shot_below_bytes: tuple[tuple[int, float], ...] = VLLM_ONE_SHOT_BELOW
    one_shot_max_tokens: int = 0   # > 0: one-shot up to this many tokens whatever the GPUs (TensorRT-LLM)
    custom_allreduce_launch_s: dict[str, float] = field(default_factory=dict, hash=False)  # by interconnect preset
    custom_allreduce_two_shot: dict[str, EngineTwoShot] = field(default_factory=dict, hash=False)  # likewise
    fused_activation_quant: bool = False
    unfused_activation_quant: dict[str, frozenset[str]] = field(default_factory=dict, hash=False)
    eager_launch_s: float = 8e-6
    floors_s: dict[str, float] = field(default_factory=dict, hash=False)
    block_floors_s: dict[str, float] = field(default_factory=dict, hash=False)
    moe_expert_floors_s: dict[str, float] = field(default_factory=dict, hash=False)
    moe_dequant_ops_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    moe_efficiency_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    moe_k0_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    moe_dequant_per_tile_by_gpu: dict[str, frozenset[str]] = field(default_factory=dict, hash=False)
    moe_fused_rows_by_gpu: dict[str, frozenset[str]] = field(default_factory=dict, hash=False)
    moe_weight_only_by_gpu: dict[str, frozenset[str]] = field(default_factory=dict, hash=False)
    moe_by_architecture: dict[str, dict[str, ArchitectureMoe]] = field(default_factory=dict, hash=False)
    deepep_moe_by_gpu: dict[str, ArchitectureMoe] = field(default_factory=dict, hash=False)
    moe_ep_every_row_by_gpu: dict[str, frozenset[str]] = field(default_factory=dict, hash=False)
    moe_floors_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    moe_ep_floors_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    moe_touched_expert_s_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    moe_row_bytes_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    gdn_efficiency_by_gpu: dict[str, float] = field(default_factory=dict, hash=False)
    linear_host_s_by_gpu: dict[str, dict[str, LinearHostSteps]] = field(default_factory=dict, hash=False)
    fp8_kv_attention_by_gpu: dict[str, tuple[float, float]] = field(default_factory=dict, hash=False)
    # the engine's own decode attention kernel where it differs from the one the GPU preset's
    # latency.decode_attention measured (vLLM's): (fraction, u_half, s per stream, bytes/s per unsplit MHA CTA or 0)
    decode_attention_by_gpu: dict[str, tuple[float, float, float, float]] = field(default_factory=dict, hash=False)
    # its decode kernel is the one the GPU presets measured (vLLM's), unsplit MHA included (their
    # unsplit_mha_cta_gb_s: FlashAttention-2's varlen decode); other engines' kernels split the KV sequence
    decode_unsplit_mha: bool = False
    fp8_kv_prefill_scale_by_gpu: dict[str, float] = field(default_factory=dict, hash=False)
    wide_head_prefill_scale_by_gpu: dict[str, float] = field(default_factory=dict, hash=False)
    dsa_prefill_head_tile_by_gpu: dict[str, int] = field(default_factory=dict, hash=False)
    dsa_dense_short_prefill: bool = False
    dsa_block_floors_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    dsa_prefill_efficiency_by_gpu: dict[str, float] = field(default_factory=dict, hash=False)
    dsa_prefill_full_topk_by_gpu: frozenset[str] = frozenset()
    v4_prefill_efficiency_by_gpu: dict[str, float] = field(default_factory=dict, hash=False)
    msa_fp32_expansion_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    gemm_memory_efficiency_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    gemm_efficiency_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    online_fp8_scale: str = "dynamic"
    ep_dispatch: str = "all_to_all"   # DeepEP; "per_rank": TensorRT-LLM's; "allgather": vLLM's default
    dynamic_scale_s_by_gpu: dict[str, float] = field(default_factory=dict, hash=False)
    moe_stream_bits_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    moe_large_m_memory_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    moe_tuned_shapes_by_gpu: dict[str, dict[str, frozenset[tuple[int, int]]]] = field(default_factory=dict,
                                                                                       hash=False)
    moe_untuned_efficiency_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    moe_untuned_large_m_memory_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    moe_untuned_k0: float = 0.0
    moe_large_expert_by_gpu: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict, hash=False)
    uncaptured_linears: frozenset[str] = frozenset()
    shared_experts_stream_max_tokens: int = 0
    shared_experts_stream_in_graphs: bool = False
    graph_prefill: bool = True
    graph_max_tokens: GraphCaps = ()
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def fuses_input_quant(self, weight_format: str, after: str) -> bool:
        """Whether a W8A8 / W4A4 GEMM of ``weight_format`` weights whose input comes from a kernel of kind ``after``
        (``QUANT_PLACES``) gets that input quantised inside it, rather than by a kernel of its own."""
        return self.fused_activation_quant and after not in self.unfused_activation_quant.get(weight_format, ())

    def graph_token_cap(self, memory_gib: float, tp: int) -> int | None:
        """The largest step (tokens) replayed from a CUDA graph on a GPU of ``memory_gib`` at ``tp``; None: any."""
        rows = [row for row in self.graph_max_tokens if memory_gib >= row[0]]
        if not rows:
            return None
        _, below_tp4, from_tp4 = rows[-1]
        return below_tp4 if tp < 4 else from_tp4

    def custom_allreduce_on(self, fabric: Interconnect, nbytes: float = 0.0, n: int = 2) -> CustomAllReduce | None:
        """The custom all-reduce this engine runs on ``fabric`` for ``nbytes`` over ``n`` GPUs (its own launch cost
        and two-shot latency where it measured them), or None where it runs NCCL only or the fabric has no
        peer-memory kernel."""
        kernel = fabric.custom_allreduce
        if not self.custom_allreduce or kernel is None:
            return None
        launch = self.custom_allreduce_launch_s.get(fabric.name)
        if launch is not None:
            kernel = replace(kernel, launch_s=launch)
        own = self.custom_allreduce_two_shot.get(fabric.name)
        if own is not None and own.covers(nbytes, n):
            kernel = replace(kernel, two_shot_latency_s=own.latency_s,
                             two_shot_latency_s_per_peer=own.latency_s_per_peer)
        return kernel

    def one_shot_allreduce(self, nbytes: float, n: int, tokens: float) -> bool:
        """Whether the custom all-reduce of ``nbytes`` (``tokens`` hidden states) over ``n`` GPUs runs the one-shot
        kernel: up to ``one_shot_max_tokens`` tokens when set, else always on 2 GPUs and below the size
        ``one_shot_below_bytes`` gives for the fewest GPUs at least ``n`` (none: two-shot)."""
        if self.one_shot_max_tokens:
            return tokens <= self.one_shot_max_tokens
        return n <= 2 or nbytes < limit_for_gpus(self.one_shot_below_bytes, n)


@dataclass(frozen=True, kw_only=True)
class SizingMargin:
    """What a KV cache sized from memory measured after warm-up keeps free beyond the transient peak T (vLLM 0.34's
    extensible KV cache, measure_kv_cache_bytes): max(``floor_bytes``, ``fraction`` x T)."""

    floor_bytes: int
    fraction: float

    def bytes_for(self, transient_bytes: int) -> int:
        return max(self.floor_bytes, int(transient_bytes * self.fraction))


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """One engine version's memory accounting and kernel behaviour (see the module docstring). The memory
    sections are None exactly when ``budget`` is ``ideal``."""

    name: str
    version: str = ""
    releases: str = ""
    display_name: str
    budget: BudgetKind
    memory_fraction: float | None = None
    block_size: int | None = None
    scheduler_defaults: tuple[SchedulerDefault, ...] = ()
    scheduler: SchedulerPolicy = field(default_factory=SchedulerPolicy)
    requests: RequestCosts = field(default_factory=RequestCosts)
    overheads: Overheads | None = None
    activation: ActivationModel | None = None
    cuda_graphs: CudaGraphModel | None = None
    kv: KVLayout | None = None
    weights: WeightLayout | None = None
    static_fraction_rule: StaticFractionRule | None = None
    sizing_margin: SizingMargin | None = None   # budget "measured": the margin kept free beside the transient peak
    # the models this release runs on a second model runner, and that runner's accounting (``runner_for``)
    model_runner: ModelRunnerRule | None = None
    second_runner: EngineSpec | None = None
    runner: str = ""                            # the model runner this accounting is for, where a release has two
    runner_forced: bool = False                 # --model-runner chose it (VLLM_USE_V2_MODEL_RUNNER), not the rule
    # vLLM 0.34+: the accounting with its extensible KV cache off (sized from profiling estimates instead)
    extensible_off: EngineSpec | None = None
    extensible_forced_off: bool = False         # --no-enable-extensible-kv-cache chose it
    kernels: EngineKernels = field(default_factory=EngineKernels)
    default: bool = False
    terms: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def label(self) -> str:
        return f"{self.name} {self.releases}" if self.releases else self.name

    @property
    def models_memory(self) -> bool:
        """False for ``budget: ideal``: plan's plain arithmetic stands in for the engine's own accounting."""
        return self.budget != "ideal"


def merged_mapping(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` laid over it: mappings merge key by key, any other value replaces."""
    merged = dict(base)
    for key, value in changes.items():
        old = merged.get(key)
        merged[key] = merged_mapping(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return merged


def with_mixed_chunk(engine: EngineSpec) -> EngineSpec:
    """``engine`` run with SGLang's --enable-mixed-chunk: prefill chunks share the decode batch's step instead of
    running in steps of their own first (an engine that already mixes them is returned as it is)."""
    if not engine.scheduler.prefill_first:
        return engine
    second = with_mixed_chunk(engine.second_runner) if engine.second_runner is not None else None
    return replace(engine, scheduler=replace(engine.scheduler, prefill_first=False), second_runner=second)


def with_prefix_caching(engine: EngineSpec | None, enabled: bool | None) -> EngineSpec | None:
    """``engine`` launched with prefix caching on (--enable-prefix-caching), off (--no-enable-prefix-caching) or as
    it defaults (None: on, for a hybrid model only where ``kv.hybrid_prefix_caching``): off, a Mamba / Gated
    DeltaNet request keeps one state block (vLLM's mamba_cache_mode "none") where ``kv.state_blocks`` counts the
    aligned checkpoints prefix caching keeps, and the attention block needs no checkpoint alignment."""
    if engine is None or engine.kv is None:
        return engine
    second = with_prefix_caching(engine.second_runner, enabled) if engine.second_runner is not None else None
    kv = engine.kv
    if (enabled if enabled is not None else kv.hybrid_prefix_caching) or (
            kv.state_blocks == 1 and not (kv.state_blocks_by_kind or kv.checkpoint_align_by_kind)):
        return engine if second is engine.second_runner else replace(engine, second_runner=second)
    return replace(engine, kv=replace(kv, state_blocks=1, state_blocks_by_kind=(), checkpoint_align_by_kind=()),
                   second_runner=second)


def with_model_runners(engines: list[EngineSpec | None], runner: str | None) -> list[EngineSpec | None]:
    """``engines`` with the model runner forced (vLLM 0.22-0.31's VLLM_USE_V2_MODEL_RUNNER=0 / 1) where a release
    has two; None keeps each release's choice by model. Naming a runner no engine has is an error."""
    if runner is None:
        return engines
    chosen = [_forced_runner(e, runner) for e in engines]
    if all(e is None or e.model_runner is None for e in engines):
        raise UsageError(f"--model-runner {runner}: no engine asked has two model runners (vLLM 0.22-0.31 do)")
    return chosen


def with_extensible_kv_cache(engines: list[EngineSpec | None], enabled: bool | None) -> list[EngineSpec | None]:
    """``engines`` with vLLM's extensible KV cache on (0.34+'s default where supported) or off (its
    ``extensible_off`` accounting: the cache sized from profiling estimates); None keeps each release's default.
    Naming it where no engine asked has one is an error."""
    if enabled is None:
        return engines
    if all(e is None or e.extensible_off is None for e in engines):
        raise UsageError(f"--{'' if enabled else 'no-'}enable-extensible-kv-cache: no engine asked has an extensible "
                         "KV cache (vLLM 0.34+ has)")
    if enabled:
        return engines
    return [replace(e.extensible_off, extensible_forced_off=True) if e is not None and e.extensible_off is not None
            else e for e in engines]


def _forced_runner(engine: EngineSpec | None, runner: str) -> EngineSpec | None:
    rule = engine.model_runner if engine is not None else None
    if engine is None or rule is None:
        return engine
    first, second = (name.lower() for name in rule.runners)
    if runner.lower() == first:
        return replace(engine, model_runner=None, second_runner=None, runner_forced=True)
    if runner.lower() == second:
        return replace(engine.second_runner, runner_forced=True)
    raise UsageError(f"--model-runner must be {rule.runners[0]} or {rule.runners[1]} for {engine.label}, got "
                     f"'{runner}'")


def memory_model(engine: EngineSpec | None) -> EngineSpec | None:
    """The engine whose memory accounting ``plan`` applies: None (the plain arithmetic) for no engine or one
    whose preset says ``budget: ideal``."""
    return engine if engine is not None and engine.budget != "ideal" else None


def _require(condition: bool, origin: str, message: str) -> None:
    if not condition:
        raise SpecError(f"{origin}: {message}")


def _check_keys(value: dict[Any, Any], allowed: set[str] | frozenset[str], origin: str, prefix: str = "") -> None:
    from tfcalc.spec.model import key_text
    from tfcalc.spec.presets import suggest

    unknown = sorted(key_text(k) for k in value if k not in allowed)
    if unknown:
        hints = suggest(unknown[0], sorted(allowed), limit=1)
        hint = f" (did you mean '{prefix}{hints[0]}'?)" if hints else ""
        raise SpecError(f"{origin}: unknown field '{prefix}{unknown[0]}'{hint}")


def _section(data: dict[str, Any], key: str, required: set[str], origin: str,
             optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    value = data.get(key)
    _require(isinstance(value, dict), origin, f"field '{key}' must be a mapping")
    _check_keys(value, required | optional, origin, f"{key}.")
    missing = sorted(k for k in required if k not in value)
    _require(not missing, origin, f"missing required field '{key}.{missing[0]}'" if missing else "")
    return value


def _show(value: Any) -> str:
    from tfcalc.spec.model import _show as show

    return show(value)


def _names(data: Any, origin: str, key: str) -> tuple[str, ...]:
    """A list of GPU preset names."""
    _require(isinstance(data, list) and all(isinstance(n, str) and n for n in data), origin,
             f"field '{key}' must be a list of GPU preset names, got {_show(data)}")
    return tuple(data)


def _by_linear_kind(data: Any, origin: str, key: str, high: int) -> tuple[tuple[str, int], ...]:
    """{linear-attention kind: positive count}, sorted."""
    from tfcalc.spec.model import LINEAR_KINDS

    _require(isinstance(data, dict) and all(kind in LINEAR_KINDS for kind in data), origin,
             f"field '{key}' maps linear-attention kinds ({', '.join(LINEAR_KINDS)}) to counts, got {_show(data)}")
    return tuple(sorted((kind, _int(n, origin, f"{key}.{kind}", 1, high)) for kind, n in data.items()))


def _penalty_state(value: Any, origin: str) -> dict[str, bool]:
    """``activation.penalty_state``: true (counted in the budget), false (none) or uncounted (held in the slack)."""
    if value == "uncounted":
        return {"penalty_state": False, "penalty_state_uncounted": True}
    return {"penalty_state": _bool(value, origin, "activation.penalty_state")}


def _state_blocks(data: Any, origin: str) -> dict[str, Any]:
    """``kv.state_blocks``: a count for every linear-attention kind, or {kind: count} (an unnamed kind keeps 1)."""
    if not isinstance(data, dict):
        return {"state_blocks": _int(data, origin, "kv.state_blocks", 1, 64)}
    return {"state_blocks_by_kind": _by_linear_kind(data, origin, "kv.state_blocks", 64)}


def _state_pool(data: Any, origin: str) -> StatePoolRule | None:
    """``kv.state_pool``: {memory_ratio, slots_per_request, extra_buffer_slots}, or absent."""
    if data is None:
        return None
    keys = {"memory_ratio", "slots_per_request", "extra_buffer_slots"}
    _require(isinstance(data, dict) and set(data) == keys, origin,
             "field 'kv.state_pool' must be a mapping of memory_ratio, slots_per_request and extra_buffer_slots")
    return StatePoolRule(memory_ratio=_num(data["memory_ratio"], origin, "kv.state_pool.memory_ratio", 0.001, 1000.0),
                         slots_per_request=_int(data["slots_per_request"], origin, "kv.state_pool.slots_per_request",
                                                1, 64),
                         extra_buffer_slots=_int(data["extra_buffer_slots"], origin,
                                                 "kv.state_pool.extra_buffer_slots", 0, 64))


def _v4_pool(data: Any, origin: str) -> V4PoolRule | None:
    """``kv.v4_pool``: {swa_ratio, max_running_requests}, or absent."""
    if data is None:
        return None
    _require(isinstance(data, dict) and set(data) == {"swa_ratio", "max_running_requests"}, origin,
             "field 'kv.v4_pool' must be a mapping of swa_ratio and max_running_requests")
    return V4PoolRule(swa_ratio=_num(data["swa_ratio"], origin, "kv.v4_pool.swa_ratio", 0.001, 1.0),
                      max_running_requests=_int(data["max_running_requests"], origin,
                                                "kv.v4_pool.max_running_requests", 1))


def _num(value: Any, origin: str, key: str, low: float = 0.0, high: float = MAX_COUNT) -> float:
    """A finite number in [low, high] (``tfcalc.spec.model.check_float``: an integer is accepted, a bool is not)."""
    from tfcalc.spec.model import check_float, in_file

    return in_file(origin, check_float, key, value, high=high, low=low)


def _int(value: Any, origin: str, key: str, low: int = 0, high: int = MAX_COUNT) -> int:
    """An integer in [low, high] (``tfcalc.spec.model.check_int``)."""
    from tfcalc.spec.model import check_int, in_file

    return in_file(origin, check_int, key, value, (low, int(high)))


def _bool(value: Any, origin: str, key: str) -> bool:
    _require(isinstance(value, bool), origin, f"field '{key}' must be true or false, got {_show(value)}")
    return bool(value)


def _text(value: Any, origin: str, key: str) -> str:
    from tfcalc.spec.model import MAX_NAME_CHARS

    _require(isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS, origin,
             f"field '{key}' must be text of 1 to {MAX_NAME_CHARS} characters, got {_show(value)}")
    return str(value)


def _version_text(value: Any, origin: str, key: str) -> str:
    """A version as YAML may spell it: "0.21" (text) or 1.0 (a number, read back as written)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = repr(value)
    return _text(value, origin, key)


def _texts(value: Any, origin: str, key: str, allowed: tuple[str, ...] | None = None) -> dict[str, str]:
    """A mapping of names to sentences (sources, terms)."""
    from tfcalc.spec.model import key_text

    _require(isinstance(value, dict), origin, f"field '{key}' must be a mapping of names to text")
    out = {}
    for k, v in value.items():
        _require(isinstance(k, str), origin, f"field '{key}' keys must be names, got {_show(k)}")
        _require(allowed is None or k in allowed, origin,
                 f"unknown field '{key}.{key_text(k)}' (known: {', '.join(allowed or ())})")
        _require(isinstance(v, str) and v.strip() != "", origin, f"field '{key}.{key_text(k)}' must be text")
        out[k] = v
    return out


def _gib(value: Any, origin: str, key: str) -> int:
    return round(_num(value, origin, key, high=MAX_GIB) * GIB)


def _mib(value: Any, origin: str, key: str) -> int:
    return round(_num(value, origin, key, high=MAX_MIB) * MIB)


_KERNEL_KEYS = frozenset({"cuda_graphs", "custom_allreduce", "one_shot_allreduce", "custom_allreduce_launch_us",
                          "custom_allreduce_two_shot",
                          "fused_activation_quant", "unfused_activation_quant", "eager_launch_us", "floors_us",
                          "block_floors_us", "moe_expert_floors_us", "moe_dequant_ops", "moe_efficiency", "moe_k0",
                          "moe_by_architecture", "deepep_moe", "moe_ep_every_row",
                          "moe_dequant_per_tile", "moe_weight_only", "moe_floors_us", "moe_ep_floors_us",
                          "moe_touched_expert_us",
                          "moe_fused_rows",
                          "moe_row_bytes", "gdn_efficiency", "linear_host_us",
                          "fp8_kv_attention", "decode_attention", "decode_unsplit_mha", "fp8_kv_prefill_attention",
                          "wide_head_prefill_attention",
                          "dsa_prefill_head_tile", "dsa_dense_short_prefill", "dsa_block_floors_us",
                          "dsa_prefill_efficiency", "dsa_prefill_full_topk", "v4_prefill_efficiency",
                          "msa_fp32_expansion",
                          "uncaptured_linears", "graph_prefill", "graph_max_tokens", "gemm_memory_efficiency",
                          "gemm_efficiency", "online_fp8_scale", "ep_dispatch", "dynamic_scale_us",
                          "moe_stream_bits",
                          "moe_large_m_memory_efficiency", "moe_tuned_shapes", "moe_untuned_efficiency",
                          "moe_untuned_large_m_memory_efficiency", "moe_untuned_k0", "moe_large_expert",
                          "shared_experts_stream", "sources"})
QUANT_PLACES = ("norm", "attention", "activation")  # the kernels a GEMM's input comes from (its quantisation's host)
# MoE weight formats an engine's kernel tables are keyed by: compute kinds, storage formats, and int4 (int4-gN groups,
# a weight-only kind: Marlin's fused MoE)
MOE_EXPERT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4", "fp8_e4m3", "fp8_e5m2", "fp8_block", "mxfp4",
                     "nvfp4")
MAX_MOE_EFFICIENCY = 3.0  # relative to a dense GEMM of the shape at large K; moe_kernel_rates.py's search bound
MAX_MOE_K0 = 65536.0  # K-loop elements per output tile
MAX_MOE_ROW_BYTES = 1024.0  # bytes per routed row and hidden element
DEQUANT_FORMATS = ("int8", "fp8", "int4", "fp4")  # kernels.DEQUANT_OPS' formats
MAX_DEQUANT_OPS = 200.0  # instructions per weight


def _gpu_entries(value: Any, origin: str, key: str, of: str) -> dict[Any, Any]:
    """A per-GPU table's outer mapping, its keys checked against the GPU presets (empty when absent); ``of`` names
    what each GPU maps to, for the error."""
    from tfcalc.spec.presets import preset_names

    if value is None:
        return {}
    _require(isinstance(value, dict), origin, f"field '{key}' must be a mapping of GPU preset names to {of}")
    _check_keys(value, frozenset(preset_names("gpu")), origin, f"{key}.")
    return value


def _by_gpu(value: Any, origin: str, key: str, allowed: tuple[str, ...], low: float,
            high: float) -> dict[str, dict[str, float]]:
    """GPU preset name -> (one of ``allowed``) -> a number in [low, high]."""
    return {str(gpu): _kinds(by_kind, origin, f"{key}.{gpu}", allowed, low, high)
            for gpu, by_kind in _gpu_entries(value, origin, key, f"mappings of {', '.join(allowed)}").items()}


def _moe_efficiency(value: Any, origin: str) -> dict[str, dict[str, float]]:
    """``kernels.moe_efficiency``: GPU preset name -> compute dtype -> efficiency in (0, MAX_MOE_EFFICIENCY]."""
    return _by_gpu(value, origin, "kernels.moe_efficiency", MOE_EXPERT_DTYPES, 1e-3, MAX_MOE_EFFICIENCY)


def _moe_by_architecture(value: Any, origin: str) -> dict[str, dict[str, ArchitectureMoe]]:
    """``kernels.moe_by_architecture``: GPU preset name -> model architecture (a class name) -> {efficiency: {compute
    dtype or storage format: efficiency in (0, MAX_MOE_EFFICIENCY]}, floors_us: {format: microseconds}, ep_every_row:
    [formats], memory_efficiency: {format: fraction of the datasheet bandwidth in (0, 1]}}."""
    key = "kernels.moe_by_architecture"
    out: dict[str, dict[str, ArchitectureMoe]] = {}
    for gpu, by_arch in _gpu_entries(value, origin, key, "mappings of model architectures").items():
        _require(isinstance(by_arch, dict) and by_arch, origin,
                 f"field '{key}.{gpu}' must be a mapping of model architectures (e.g. Qwen3MoeForCausalLM) to their "
                 "fused MoE")
        out[str(gpu)] = {}
        for arch, kernel in by_arch.items():
            _require(isinstance(arch, str) and arch.isidentifier() and len(arch) <= 128, origin,
                     f"field '{key}.{gpu}' has {_show(arch)}, not an architecture class name")
            out[str(gpu)][arch] = _moe_kernel(kernel, origin, f"{key}.{gpu}.{arch}")
    return out


def _deepep_moe(value: Any, origin: str) -> dict[str, ArchitectureMoe]:
    """``kernels.deepep_moe``: GPU preset name -> the experts' kernel behind DeepEP (as one entry of
    ``kernels.moe_by_architecture``)."""
    key = "kernels.deepep_moe"
    return {str(gpu): _moe_kernel(kernel, origin, f"{key}.{gpu}")
            for gpu, kernel in _gpu_entries(value, origin, key, "mappings of the experts' kernel").items()}


def _moe_kernel(kernel: Any, origin: str, where: str) -> ArchitectureMoe:
    """One fused-MoE kernel: {efficiency: {compute dtype or storage format: efficiency in (0,
    MAX_MOE_EFFICIENCY]}, floors_us: {format: microseconds}, ep_every_row: [formats], memory_efficiency: {format:
    fraction of the datasheet bandwidth in (0, 1]}, fused_rows: [fp8 formats], weight_only: [DEQUANT_FORMATS]}."""
    _require(isinstance(kernel, dict) and "efficiency" in kernel, origin,
             f"field '{where}' must be a mapping with efficiency (and optionally floors_us, ep_every_row, "
             "memory_efficiency, fused_rows, weight_only)")
    _check_keys(kernel, frozenset({"efficiency", "floors_us", "ep_every_row", "memory_efficiency", "fused_rows",
                                   "weight_only"}), origin, f"{where}.")
    efficiency = _kinds(kernel["efficiency"], origin, f"{where}.efficiency", MOE_EXPERT_DTYPES, 1e-3,
                        MAX_MOE_EFFICIENCY)
    floors_us = _kinds(kernel.get("floors_us", {}), origin, f"{where}.floors_us", MOE_EXPERT_DTYPES, 0.0,
                       MAX_MICROSECONDS)
    stream = _kinds(kernel.get("memory_efficiency", {}), origin, f"{where}.memory_efficiency", MOE_EXPERT_DTYPES,
                    1e-3, 1.0)
    lists = {}
    for name, allowed, what in (("ep_every_row", tuple(efficiency), "formats its efficiency names"),
                                ("fused_rows", FUSED_ROW_FORMATS, ", ".join(FUSED_ROW_FORMATS)),
                                ("weight_only", DEQUANT_FORMATS, ", ".join(DEQUANT_FORMATS))):
        formats = kernel.get(name, [])
        _require(isinstance(formats, list) and all(f in allowed for f in formats), origin,
                 f"field '{where}.{name}' must be a list of {what}, got {_show(formats)}")
        lists[name] = frozenset(formats)
    return ArchitectureMoe(efficiency=efficiency, floors_s={fmt: us * 1e-6 for fmt, us in floors_us.items()},
                           ep_every_row=lists["ep_every_row"], memory_efficiency=stream,
                           fused_rows=lists["fused_rows"], weight_only=lists["weight_only"])


def _kinds(value: Any, origin: str, key: str, allowed: tuple[str, ...], low: float,
           high: float) -> dict[str, float]:
    """(one of ``allowed``) -> a number in [low, high]."""
    _require(isinstance(value, dict), origin, f"field '{key}' must be a mapping of {', '.join(allowed)}")
    _check_keys(value, frozenset(allowed), origin, f"{key}.")
    return {str(k): _num(v, origin, f"{key}.{k}", low, high) for k, v in value.items()}


def _moe_k0(value: Any, origin: str) -> dict[str, dict[str, float]]:
    """``kernels.moe_k0``: GPU preset name -> compute dtype or storage format -> K-loop elements per output tile in
    [1, MAX_MOE_K0]."""
    return _by_gpu(value, origin, "kernels.moe_k0", MOE_EXPERT_DTYPES, 1.0, MAX_MOE_K0)


def _moe_floors(value: Any, origin: str, key: str = "kernels.moe_floors_us") -> dict[str, dict[str, float]]:
    """``kernels.moe_floors_us`` (or ``key``: ``kernels.moe_ep_floors_us``, ``kernels.moe_touched_expert_us``): GPU
    preset name -> storage format -> microseconds, returned in seconds."""
    us = _by_gpu(value, origin, key, MOE_EXPERT_DTYPES, 0.0, MAX_MICROSECONDS)
    return {gpu: {fmt: v * 1e-6 for fmt, v in by_fmt.items()} for gpu, by_fmt in us.items()}


def _fp8_kv_attention(value: Any, origin: str) -> dict[str, tuple[float, float]]:
    """``kernels.fp8_kv_attention``: GPU preset name -> {fixed_us, scale}: decode attention over an fp8 cache takes
    fixed_us + the same kernel's time over a bf16 cache of the same tokens with its KV streaming time x scale
    (``kernels.decode_attention``); returned as (seconds, scale)."""
    key = "kernels.fp8_kv_attention"
    fits = _by_gpu(value, origin, key, ("fixed_us", "scale"), 0.0, MAX_MICROSECONDS)
    out = {}
    for gpu, fit in fits.items():
        _require(set(fit) == {"fixed_us", "scale"}, origin, f"field '{key}.{gpu}' needs both fixed_us and scale")
        _require(0 < fit["scale"] <= 4, origin, f"field '{key}.{gpu}.scale' must be in (0, 4], got {fit['scale']:g}")
        out[gpu] = (fit["fixed_us"] * 1e-6, fit["scale"])
    return out


def _gpu_parsed(value: Any, origin: str, key: str, what: str, parse: Callable[[Any, str], Any]) -> dict[str, Any]:
    """GPU preset name -> ``parse(entry, "key.gpu")``, a GPU preset's own field parser; its error names this file."""
    out = {}
    for gpu, entry in _gpu_entries(value, origin, key, what).items():
        try:
            out[str(gpu)] = parse(entry, f"{key}.{gpu}")
        except SpecError as err:
            raise SpecError(f"{origin}: {err}") from None
    return out


def _decode_attention(value: Any, origin: str) -> dict[str, tuple[float, float, float, float]]:
    """``kernels.decode_attention``: GPU preset name -> the engine's decode kernel there, in the fields of a GPU
    preset's ``latency.decode_attention`` (``tfcalc.spec.gpu.decode_attention_block``), used in its place."""
    from tfcalc.spec.gpu import decode_attention_block

    return _gpu_parsed(value, origin, "kernels.decode_attention", "decode attention kernels", decode_attention_block)


def _fp8_kv_prefill(value: Any, origin: str) -> dict[str, float]:
    """``kernels.fp8_kv_prefill_attention``: GPU preset name -> scale in (0, 4]: prefill (causal flash) attention
    over an fp8 cache takes scale x its time over a bf16 cache."""
    key = "kernels.fp8_kv_prefill_attention"
    out = {}
    for gpu, scale in _gpu_entries(value, origin, key, "scales").items():
        out[str(gpu)] = _num(scale, origin, f"{key}.{gpu}", 0.0, 4.0)
        _require(out[str(gpu)] > 0, origin, f"field '{key}.{gpu}' must be in (0, 4], got {_show(scale)}")
    return out


# a DSA model's block per phase; DeepSeek-V4's CSA and HCA layers' per phase; MiniMax-M3's MSA block per phase; an
# MLA block's on that GPU (replacing block_floors_us' there)
DSA_FLOOR_KEYS = frozenset({"decode", "prefill", "csa_decode", "csa_prefill", "hca_decode", "hca_prefill",
                            "csa_topk_decode", "csa_decode_seq", "hca_decode_seq", "hc_pre", "hc_post",
                            "msa_decode", "msa_prefill", *BLOCK_CLASSES})
MSA_EXPANSION_PHASES = frozenset({"decode", "prefill"})


def _msa_expansion(value: Any, origin: str) -> dict[str, dict[str, float]]:
    """``kernels.msa_fp32_expansion``: GPU preset name -> {decode, prefill} fractions of the datasheet bandwidth."""
    key = "kernels.msa_fp32_expansion"
    out: dict[str, dict[str, float]] = {}
    for gpu, phases in _gpu_entries(value, origin, key, "mappings of decode and prefill").items():
        _require(isinstance(phases, dict) and set(phases) == MSA_EXPANSION_PHASES, origin,
                 f"field '{key}.{gpu}' must be a mapping of decode and prefill")
        out[str(gpu)] = {phase: _num(eff, origin, f"{key}.{gpu}.{phase}", 0.01, 1.0) for phase, eff in phases.items()}
    return out


def _dsa_floors(value: Any, origin: str) -> dict[str, dict[str, float]]:
    """``kernels.dsa_block_floors_us``: GPU preset name -> {decode, prefill} microseconds (DeepSeek-V3.2's block;
    DeepSeek-V4's layers: csa_decode, csa_prefill, hca_decode, hca_prefill, csa_topk_decode, a CSA layer's extra
    fixed cost in decode once its compressed entries outnumber the top-k, csa_decode_seq / hca_decode_seq, a layer's
    cost per decoding sequence beyond its kernels' work, and hc_pre / hc_post, its hyper-connections' fixed cost
    per layer; MiniMax-M3's MSA block: msa_decode, msa_prefill), returned in seconds."""
    key = "kernels.dsa_block_floors_us"
    out: dict[str, dict[str, float]] = {}
    for gpu, phases in _gpu_entries(value, origin, key, "mappings of decode and prefill").items():
        _require(isinstance(phases, dict), origin, f"field '{key}.{gpu}' must be a mapping of decode and prefill")
        _check_keys(phases, DSA_FLOOR_KEYS, origin, f"{key}.{gpu}.")
        out[str(gpu)] = {phase: _num(us, origin, f"{key}.{gpu}.{phase}", 0.0, MAX_MICROSECONDS) * 1e-6
                         for phase, us in phases.items()}
    return out


def _wide_head_prefill(value: Any, origin: str) -> dict[str, float]:
    """``kernels.wide_head_prefill_attention``: GPU preset name -> scale in [1, 20]: a model with heads wider than
    FlashAttention's 256 (Gemma 4) runs every layer's prefill attention on the engine's fallback kernel, scale x the
    time of a flash attention over the whole causal triangle (no tile outside a window skipped)."""
    key = "kernels.wide_head_prefill_attention"
    return {str(gpu): _num(scale, origin, f"{key}.{gpu}", 1.0, 20.0)
            for gpu, scale in _gpu_entries(value, origin, key, "scales").items()}


def _linear_host(value: Any, origin: str) -> dict[str, dict[str, LinearHostSteps]]:
    """``kernels.linear_host_us``: GPU preset name -> storage format -> [[max tokens, us(, us at aligned tokens)],
    ...] ascending, the last max tokens null (any larger count); returned as (max tokens or None, seconds, seconds at
    a multiple of ``kernels.SCALE_ALIGNED_ROWS`` tokens or None) steps."""
    key, allowed = "kernels.linear_host_us", ", ".join(MOE_EXPERT_DTYPES)
    out: dict[str, dict[str, LinearHostSteps]] = {}
    for gpu, by_fmt in _gpu_entries(value, origin, key, f"mappings of {allowed}").items():
        _require(isinstance(by_fmt, dict), origin, f"field '{key}.{gpu}' must be a mapping of {allowed}")
        _check_keys(by_fmt, frozenset(MOE_EXPERT_DTYPES), origin, f"{key}.{gpu}.")
        out[str(gpu)] = {}
        for fmt, steps in by_fmt.items():
            where = f"{key}.{gpu}.{fmt}"
            shape = (f"field '{where}' must be a list of [max tokens, microseconds(, microseconds at aligned "
                     "tokens)], the last [null, us]")
            _require(isinstance(steps, list) and bool(steps) and all(isinstance(x, list) and len(x) in (2, 3)
                                                                     for x in steps), origin, shape)
            rows: list[tuple[int | None, float, float | None]] = []
            for i, (tokens, us, *aligned) in enumerate(steps):
                _require((tokens is None) == (i == len(steps) - 1), origin, shape)
                if tokens is not None:
                    _require(isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 1
                             and (not rows or tokens > (rows[-1][0] or 0)), origin,
                             f"field '{where}' needs ascending whole token counts >= 1, got {_show(tokens)}")
                rows.append((tokens, _num(us, origin, f"{where}[{i}]", 0.0, MAX_MICROSECONDS) * 1e-6,
                             _num(aligned[0], origin, f"{where}[{i}]", 0.0, MAX_MICROSECONDS) * 1e-6 if aligned
                             else None))
            out[str(gpu)][str(fmt)] = tuple(rows)
    return out


def _formats(value: Any, origin: str, key: str) -> frozenset[str]:
    """A list of weight storage formats (MOE_EXPERT_DTYPES' names)."""
    if value is None:
        return frozenset()
    _require(isinstance(value, list) and all(isinstance(f, str) and f in MOE_EXPERT_DTYPES for f in value), origin,
             f"field '{key}' must be a list of {', '.join(MOE_EXPERT_DTYPES)}, got {_show(value)}")
    return frozenset(value)


def _unfused_quant(value: Any, origin: str) -> dict[str, frozenset[str]]:
    """``kernels.unfused_activation_quant``: weight format (MOE_EXPERT_DTYPES) -> a list of QUANT_PLACES."""
    key, places = "kernels.unfused_activation_quant", ", ".join(QUANT_PLACES)
    if value is None:
        return {}
    _require(isinstance(value, dict), origin, f"field '{key}' must map weight formats to lists of {places}")
    out = {}
    for fmt, where in value.items():
        _require(fmt in MOE_EXPERT_DTYPES, origin, f"field '{key}' has unknown weight format {_show(fmt)} (choose "
                 f"{', '.join(MOE_EXPERT_DTYPES)})")
        _require(isinstance(where, list) and all(w in QUANT_PLACES for w in where), origin,
                 f"field '{key}.{fmt}' must be a list of {places}, got {_show(where)}")
        out[str(fmt)] = frozenset(where)
    return out


def _every_row(value: Any, origin: str) -> dict[str, frozenset[str]]:
    """``kernels.moe_ep_every_row``: a list of GPU preset names (every expert format: "*") or a mapping of GPU preset
    names to lists of expert storage formats ("*": every format)."""
    key = "kernels.moe_ep_every_row"
    if not isinstance(value, dict):
        return {gpu: frozenset({"*"}) for gpu in _gpu_list(value, origin, key)}
    out = {}
    for gpu, formats in _gpu_entries(value, origin, key, "lists of expert formats").items():
        _require(isinstance(formats, list) and formats and all(f in (*MOE_EXPERT_DTYPES, "*") for f in formats),
                 origin, f"field '{key}.{gpu}' must be a list of {', '.join(MOE_EXPERT_DTYPES)} or *, got "
                 f"{_show(formats)}")
        out[str(gpu)] = frozenset(formats)
    return out


def _gpu_list(value: Any, origin: str, key: str) -> frozenset[str]:
    """A list of GPU preset names (empty when absent)."""
    from tfcalc.spec.presets import preset_names

    if value is None:
        return frozenset()
    names = frozenset(preset_names("gpu"))
    _require(isinstance(value, list) and all(isinstance(g, str) for g in value), origin,
             f"field '{key}' must be a list of GPU preset names, got {_show(value)}")
    for gpu in value:
        _require(gpu in names, origin, f"field '{key}' names an unknown GPU preset {_show(gpu)}")
    return frozenset(value)


def _formats_by_gpu(value: Any, origin: str, key: str,
                    formats_allowed: tuple[str, ...] = DEQUANT_FORMATS) -> dict[str, frozenset[str]]:
    """``kernels.moe_dequant_per_tile`` or ``kernels.moe_weight_only`` (``key``): GPU preset name -> a list of
    weight-only formats (DEQUANT_FORMATS); ``kernels.moe_fused_rows``: of fp8 formats (FUSED_ROW_FORMATS)."""
    allowed = ", ".join(formats_allowed)
    out = {}
    for gpu, formats in _gpu_entries(value, origin, key, f"lists of {allowed}").items():
        _require(isinstance(formats, list) and all(f in formats_allowed for f in formats), origin,
                 f"field '{key}.{gpu}' must be a list of {allowed}, got {_show(formats)}")
        out[str(gpu)] = frozenset(str(f) for f in formats)
    return out


FUSED_ROW_FORMATS = ("fp8_e4m3", "fp8_block")


def _dequant_ops(value: Any, origin: str) -> dict[str, dict[str, float]]:
    """``kernels.moe_dequant_ops``: GPU preset name -> weight-only format -> instructions per weight."""
    return _by_gpu(value, origin, "kernels.moe_dequant_ops", DEQUANT_FORMATS, 1e-3, MAX_DEQUANT_OPS)


def _floors(value: Any, origin: str, key: str, allowed: tuple[str, ...]) -> dict[str, float]:
    """Microseconds per class -> seconds; every value finite, non-negative and at most a second."""
    if value is None:
        return {}
    _require(isinstance(value, dict), origin, f"field '{key}' must be a mapping of {', '.join(allowed)}")
    _check_keys(value, frozenset(allowed), origin, f"{key}.")
    return {str(k): _num(v, origin, f"{key}.{k}", 0.0, MAX_MICROSECONDS) * 1e-6 for k, v in value.items()}


def _one_shot(value: Any, origin: str) -> dict[str, Any]:
    """``one_shot_allreduce: {below_kib: {GPUS: KiB, ...}}`` or ``{max_tokens: N}`` -> EngineKernels fields."""
    key = "kernels.one_shot_allreduce"
    if value is None:
        return {}
    _require(isinstance(value, dict) and len(value) == 1, origin,
             f"field '{key}' must be a mapping of one of below_kib, max_tokens")
    _check_keys(value, frozenset({"below_kib", "max_tokens"}), origin, "kernels.one_shot_allreduce.")
    if "max_tokens" in value:
        return {"one_shot_max_tokens": _int(value["max_tokens"], origin, f"{key}.max_tokens", 1, 1 << 20)}
    return {"one_shot_below_bytes": _bytes_by_gpus(value["below_kib"], origin, f"{key}.below_kib", 3)}


def _bytes_by_gpus(below: Any, origin: str, key: str, least: int) -> tuple[tuple[int, float], ...]:
    """``{GPUS: KiB, ...}`` (GPU counts from ``least`` to 1024) -> ((GPUs, bytes), ...) by GPU count."""
    _require(isinstance(below, dict) and below, origin, f"field '{key}' must map GPU counts to KiB")
    rows = []
    for gpus, kib in below.items():
        _require(isinstance(gpus, int) and not isinstance(gpus, bool) and least <= gpus <= 1024, origin,
                 f"field '{key}' needs GPU counts from {least} to 1024 as keys, got {_show(gpus)}")
        rows.append((int(gpus), _num(kib, origin, f"{key}.{gpus}", 0.0, 1 << 30) * 1024))
    return tuple(sorted(rows))


def _shared_experts_stream(value: Any, origin: str) -> dict[str, Any]:
    """``shared_experts_stream: {max_tokens: N}`` and/or ``{in_graphs: true}`` -> EngineKernels fields."""
    key = "kernels.shared_experts_stream"
    if value is None:
        return {}
    _require(isinstance(value, dict) and value, origin, f"field '{key}' must be a mapping of max_tokens, in_graphs")
    _check_keys(value, frozenset({"max_tokens", "in_graphs"}), origin, f"{key}.")
    out = {"shared_experts_stream_max_tokens": _int(value.get("max_tokens", 0), origin, f"{key}.max_tokens", 0,
                                                    1 << 20),
           "shared_experts_stream_in_graphs": _bool(value.get("in_graphs", False), origin, f"{key}.in_graphs")}
    _require(out["shared_experts_stream_max_tokens"] > 0 or out["shared_experts_stream_in_graphs"], origin,
             f"field '{key}' needs max_tokens above 0 or in_graphs: true")
    return out


def _by_fabric(value: Any, origin: str, key: str, what: str, parse: Callable[[Any, str], Any]) -> dict[str, Any]:
    """``{INTERCONNECT: row}`` -> {interconnect preset name: parse(row, its field name)}."""
    if value is None:
        return {}
    _require(isinstance(value, dict), origin, f"field '{key}' must map interconnect presets to {what}")
    out = {}
    for fabric, row in value.items():
        _require(isinstance(fabric, str) and fabric, origin, f"field '{key}' needs interconnect names as keys")
        out[fabric] = parse(row, f"{key}.{fabric}")
    return out


def _launch_by_fabric(value: Any, origin: str) -> dict[str, float]:
    """``custom_allreduce_launch_us: {INTERCONNECT: us}`` -> seconds by interconnect preset name."""
    return _by_fabric(value, origin, "kernels.custom_allreduce_launch_us", "microseconds",
                      lambda us, key: _num(us, origin, key, 0.0, MAX_MICROSECONDS) * 1e-6)


def _two_shot_by_fabric(value: Any, origin: str) -> dict[str, EngineTwoShot]:
    """``custom_allreduce_two_shot: {INTERCONNECT: {latency_us: L, per_peer_us: P, below_kib: {GPUS: KiB}}}``."""
    fields = frozenset({"latency_us", "per_peer_us", "below_kib"})

    def parse(row: Any, key: str) -> EngineTwoShot:
        _require(isinstance(row, dict), origin, f"field '{key}' must be a mapping of {', '.join(sorted(fields))}")
        _check_keys(row, fields, origin, f"{key}.")
        return EngineTwoShot(
            latency_s=_num(row.get("latency_us", 0.0), origin, f"{key}.latency_us", 0.0, MAX_MICROSECONDS) * 1e-6,
            latency_s_per_peer=_num(row.get("per_peer_us", 0.0), origin, f"{key}.per_peer_us", 0.0,
                                    MAX_MICROSECONDS) * 1e-6,
            below_bytes=_bytes_by_gpus(row.get("below_kib"), origin, f"{key}.below_kib", 2))

    return _by_fabric(value, origin, "kernels.custom_allreduce_two_shot", "mappings", parse)


def _graph_caps(value: Any, origin: str) -> GraphCaps:
    """``graph_max_tokens: [[min GiB, tokens below tp 4, tokens at tp >= 4], ...]``, minimums ascending."""
    key = "kernels.graph_max_tokens"
    if value is None:
        return ()
    _require(isinstance(value, list) and value, origin,
             f"field '{key}' must be a list of [minimum GiB, tokens below tp 4, tokens at tp >= 4] rows")
    rows: list[tuple[float, int, int]] = []
    for i, row in enumerate(value):
        _require(isinstance(row, list) and len(row) == 3, origin,
                 f"field '{key}' row {i + 1} must be [minimum GiB, tokens below tp 4, tokens at tp >= 4]")
        gib = _num(row[0], origin, f"{key}[{i + 1}] minimum GiB", 0.0, MAX_GIB)
        _require(not rows or gib > rows[-1][0], origin, f"field '{key}' minimums must ascend")
        rows.append((gib, _int(row[1], origin, f"{key}[{i + 1}] tokens below tp 4", 1, 1 << 20),
                     _int(row[2], origin, f"{key}[{i + 1}] tokens at tp >= 4", 1, 1 << 20)))
    return tuple(rows)


def _gemm_fractions(value: Any, origin: str, key: str) -> dict[str, dict[str, float]]:
    """``kernels.gemm_memory_efficiency`` / ``kernels.gemm_efficiency``: GPU preset name -> weight storage format ->
    fraction in (0, 1]."""
    from tfcalc.spec.gpu import storage_fractions

    return _gpu_parsed(value, origin, key, "mappings of weight formats to fractions", storage_fractions)


def _stream_bits(value: Any, origin: str) -> dict[str, dict[str, float]]:
    """``kernels.moe_stream_bits``: GPU preset name -> expert storage format -> bits per weight in [1, 32]."""
    return _by_gpu(value, origin, "kernels.moe_stream_bits", MOE_EXPERT_DTYPES, 1.0, 32.0)


MAX_EXPERTS = 1 << 16
MAX_EXPERT_WIDTH = 1 << 20


def _by_gpu_format(value: Any, origin: str, key: str, what: str,
                   parse: Callable[[Any, str], Any]) -> dict[str, dict[str, Any]]:
    """GPU preset name -> expert storage format -> ``parse(entry, its field name)``; ``what`` names an entry, for
    the errors."""
    out: dict[str, dict[str, Any]] = {}
    for gpu, by_format in _gpu_entries(value, origin, key, f"mappings of expert formats to {what}").items():
        _require(isinstance(by_format, dict) and by_format, origin,
                 f"field '{key}.{gpu}' must be a mapping of {', '.join(MOE_EXPERT_DTYPES)} to {what}")
        _check_keys(by_format, frozenset(MOE_EXPERT_DTYPES), origin, f"{key}.{gpu}.")
        out[str(gpu)] = {str(fmt): parse(entry, f"{key}.{gpu}.{fmt}") for fmt, entry in by_format.items()}
    return out


def _tuned_shapes(value: Any, origin: str) -> dict[str, dict[str, frozenset[tuple[int, int]]]]:
    """``kernels.moe_tuned_shapes``: GPU preset name -> expert storage format -> a list of 'ExN' shapes (local
    experts x per-rank expert width, as the engine's config files name them)."""
    def shapes(entry: Any, where: str) -> frozenset[tuple[int, int]]:
        _require(isinstance(entry, list), origin, f"field '{where}' must be a list of 'ExN' shapes")
        pairs = set()
        for shape in entry:
            parts = str(shape).split("x")
            ok = (isinstance(shape, str) and len(parts) == 2 and all(p.isdigit() for p in parts)
                  and 1 <= int(parts[0]) <= MAX_EXPERTS and 1 <= int(parts[1]) <= MAX_EXPERT_WIDTH)
            _require(ok, origin, f"field '{where}' has {_show(shape)}, not a shape 'ExN' (local experts "
                     f"1-{MAX_EXPERTS} x per-rank width 1-{MAX_EXPERT_WIDTH})")
            pairs.add((int(parts[0]), int(parts[1])))
        return frozenset(pairs)

    return _by_gpu_format(value, origin, "kernels.moe_tuned_shapes", "lists of 'ExN' shapes", shapes)


def _untuned(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """``moe_tuned_shapes`` with the default configuration's ``moe_untuned_efficiency`` for each listed GPU and
    format (``moe_untuned_large_m_memory_efficiency`` and ``moe_untuned_k0`` only where shapes are listed)."""
    shapes = _tuned_shapes(data.get("moe_tuned_shapes"), origin)
    efficiency = _by_gpu(data.get("moe_untuned_efficiency"), origin, "kernels.moe_untuned_efficiency",
                         MOE_EXPERT_DTYPES, 1e-3, MAX_MOE_EFFICIENCY)
    large_m = _gemm_fractions(data.get("moe_untuned_large_m_memory_efficiency"), origin,
                              "kernels.moe_untuned_large_m_memory_efficiency")
    listed = {(gpu, fmt) for gpu, by_format in shapes.items() for fmt in by_format}
    for table, key in ((efficiency, "moe_untuned_efficiency"), (large_m, "moe_untuned_large_m_memory_efficiency")):
        for gpu, by_format in table.items():
            for fmt in by_format:
                _require((gpu, fmt) in listed, origin, f"field 'kernels.{key}.{gpu}.{fmt}' needs "
                         f"'kernels.moe_tuned_shapes.{gpu}.{fmt}' (the shapes it does not apply to)")
    for gpu, fmt in sorted(listed):
        _require(fmt in efficiency.get(gpu, {}), origin, f"field 'kernels.moe_tuned_shapes.{gpu}.{fmt}' needs "
                 f"'kernels.moe_untuned_efficiency.{gpu}.{fmt}' (the rate of the shapes it does not list)")
    k0 = _num(data.get("moe_untuned_k0", 0), origin, "kernels.moe_untuned_k0", 0.0, MAX_MOE_K0)
    _require(not k0 or listed, origin, "field 'kernels.moe_untuned_k0' needs 'kernels.moe_tuned_shapes' (the shapes "
             "it does not apply to)")
    return {"moe_tuned_shapes_by_gpu": shapes, "moe_untuned_efficiency_by_gpu": efficiency,
            "moe_untuned_large_m_memory_by_gpu": large_m, "moe_untuned_k0": k0}


MAX_LARGE_EXPERT_SLOWDOWN = 10.0


def _large_expert(value: Any, origin: str) -> dict[str, dict[str, tuple[float, float]]]:
    """``kernels.moe_large_expert``: GPU preset name -> expert storage format -> [MiB, slowdown] (stored as bytes)."""
    def pair(entry: Any, where: str) -> tuple[float, float]:
        _require(isinstance(entry, list) and len(entry) == 2, origin,
                 f"field '{where}' must be [MiB, slowdown], got {_show(entry)}")
        mib = _num(entry[0], origin, f"{where}[0]", 1e-3, MAX_MIB)
        return mib * MIB, _num(entry[1], origin, f"{where}[1]", 0.0, MAX_LARGE_EXPERT_SLOWDOWN)

    return _by_gpu_format(value, origin, "kernels.moe_large_expert", "[MiB, slowdown]", pair)


def _choice(value: Any, origin: str, key: str, allowed: tuple[str, ...]) -> str:
    _require(value in allowed, origin, f"field '{key}' must be {' or '.join(allowed)}, got {_show(value)}")
    return str(value)


def _dynamic_scale(value: Any, origin: str) -> dict[str, float]:
    """``kernels.dynamic_scale_us``: GPU preset name -> microseconds, returned in seconds."""
    key = "kernels.dynamic_scale_us"
    return {str(gpu): _num(us, origin, f"{key}.{gpu}", 0.0, MAX_MICROSECONDS) * 1e-6
            for gpu, us in _gpu_entries(value, origin, key, "microseconds").items()}


def _gdn_efficiency(value: Any, origin: str) -> dict[str, float]:
    """``kernels.gdn_efficiency``: GPU preset name -> a fraction of the bf16 peak in (0, 1]."""
    key = "kernels.gdn_efficiency"
    return {str(gpu): _num(x, origin, f"{key}.{gpu}", 1e-4, 1.0)
            for gpu, x in _gpu_entries(value, origin, key, "fractions of the bf16 peak").items()}


def kernels_from_mapping(data: Any, origin: str) -> EngineKernels:
    """Validate an engine preset's ``kernels:`` block (units as printed: microseconds); absent fields keep
    ``EngineKernels``' defaults."""
    _require(isinstance(data, dict), origin, "field 'kernels' must be a mapping")
    _check_keys(data, _KERNEL_KEYS, origin, "kernels.")
    d = EngineKernels()
    k0, efficiency = _moe_k0(data.get("moe_k0"), origin), _moe_efficiency(data.get("moe_efficiency"), origin)
    for gpu, by_dtype in k0.items():
        for dtype in by_dtype:
            _require(dtype in efficiency.get(gpu, {}), origin, f"field 'kernels.moe_k0.{gpu}.{dtype}' needs "
                     f"'kernels.moe_efficiency.{gpu}.{dtype}' (the efficiency is fitted at that K0)")
    return EngineKernels(
        cuda_graphs=_bool(data.get("cuda_graphs", d.cuda_graphs), origin, "kernels.cuda_graphs"),
        custom_allreduce=_bool(data.get("custom_allreduce", d.custom_allreduce), origin, "kernels.custom_allreduce"),
        **_one_shot(data.get("one_shot_allreduce"), origin),
        custom_allreduce_launch_s=_launch_by_fabric(data.get("custom_allreduce_launch_us"), origin),
        custom_allreduce_two_shot=_two_shot_by_fabric(data.get("custom_allreduce_two_shot"), origin),
        fused_activation_quant=_bool(data.get("fused_activation_quant", d.fused_activation_quant), origin,
                                     "kernels.fused_activation_quant"),
        unfused_activation_quant=_unfused_quant(data.get("unfused_activation_quant"), origin),
        eager_launch_s=_num(data.get("eager_launch_us", d.eager_launch_s * 1e6), origin, "kernels.eager_launch_us",
                            0.0, MAX_MICROSECONDS) * 1e-6,
        floors_s=_floors(data.get("floors_us"), origin, "kernels.floors_us", FLOOR_CLASSES),
        block_floors_s=_floors(data.get("block_floors_us"), origin, "kernels.block_floors_us", BLOCK_CLASSES),
        moe_expert_floors_s=_floors(data.get("moe_expert_floors_us"), origin, "kernels.moe_expert_floors_us",
                                    MOE_EXPERT_DTYPES),
        moe_dequant_ops_by_gpu=_dequant_ops(data.get("moe_dequant_ops"), origin),
        moe_efficiency_by_gpu=efficiency,
        moe_by_architecture=_moe_by_architecture(data.get("moe_by_architecture"), origin),
        deepep_moe_by_gpu=_deepep_moe(data.get("deepep_moe"), origin),
        moe_k0_by_gpu=k0,
        moe_dequant_per_tile_by_gpu=_formats_by_gpu(data.get("moe_dequant_per_tile"), origin,
                                                    "kernels.moe_dequant_per_tile"),
        moe_fused_rows_by_gpu=_formats_by_gpu(data.get("moe_fused_rows"), origin, "kernels.moe_fused_rows",
                                              FUSED_ROW_FORMATS),
        moe_weight_only_by_gpu=_formats_by_gpu(data.get("moe_weight_only"), origin, "kernels.moe_weight_only"),
        moe_ep_every_row_by_gpu=_every_row(data.get("moe_ep_every_row"), origin),
        moe_floors_by_gpu=_moe_floors(data.get("moe_floors_us"), origin),
        moe_ep_floors_by_gpu=_moe_floors(data.get("moe_ep_floors_us"), origin, "kernels.moe_ep_floors_us"),
        moe_touched_expert_s_by_gpu=_moe_floors(data.get("moe_touched_expert_us"), origin,
                                                "kernels.moe_touched_expert_us"),
        moe_row_bytes_by_gpu=_by_gpu(data.get("moe_row_bytes"), origin, "kernels.moe_row_bytes", MOE_EXPERT_DTYPES,
                                     0.0, MAX_MOE_ROW_BYTES),
        gdn_efficiency_by_gpu=_gdn_efficiency(data.get("gdn_efficiency"), origin),
        linear_host_s_by_gpu=_linear_host(data.get("linear_host_us"), origin),
        fp8_kv_attention_by_gpu=_fp8_kv_attention(data.get("fp8_kv_attention"), origin),
        decode_attention_by_gpu=_decode_attention(data.get("decode_attention"), origin),
        decode_unsplit_mha=_bool(data.get("decode_unsplit_mha", False), origin, "kernels.decode_unsplit_mha"),
        fp8_kv_prefill_scale_by_gpu=_fp8_kv_prefill(data.get("fp8_kv_prefill_attention"), origin),
        wide_head_prefill_scale_by_gpu=_wide_head_prefill(data.get("wide_head_prefill_attention"), origin),
        dsa_prefill_head_tile_by_gpu={str(gpu): _int(tile, origin, f"kernels.dsa_prefill_head_tile.{gpu}", 1, 1024)
                                      for gpu, tile in _gpu_entries(data.get("dsa_prefill_head_tile"), origin,
                                                                    "kernels.dsa_prefill_head_tile",
                                                                    "head counts").items()},
        dsa_dense_short_prefill=_bool(data.get("dsa_dense_short_prefill", False), origin,
                                      "kernels.dsa_dense_short_prefill"),
        dsa_block_floors_by_gpu=_dsa_floors(data.get("dsa_block_floors_us"), origin),
        dsa_prefill_efficiency_by_gpu={str(gpu): _num(eff, origin, f"kernels.dsa_prefill_efficiency.{gpu}", 0.01, 1.0)
                                       for gpu, eff in _gpu_entries(data.get("dsa_prefill_efficiency"), origin,
                                                                    "kernels.dsa_prefill_efficiency",
                                                                    "fractions").items()},
        dsa_prefill_full_topk_by_gpu=_gpu_list(data.get("dsa_prefill_full_topk"), origin,
                                               "kernels.dsa_prefill_full_topk"),
        v4_prefill_efficiency_by_gpu={str(gpu): _num(eff, origin, f"kernels.v4_prefill_efficiency.{gpu}", 0.01, 1.0)
                                      for gpu, eff in _gpu_entries(data.get("v4_prefill_efficiency"), origin,
                                                                   "kernels.v4_prefill_efficiency",
                                                                   "fractions").items()},
        msa_fp32_expansion_by_gpu=_msa_expansion(data.get("msa_fp32_expansion"), origin),
        gemm_memory_efficiency_by_gpu=_gemm_fractions(data.get("gemm_memory_efficiency"), origin,
                                                      "kernels.gemm_memory_efficiency"),
        gemm_efficiency_by_gpu=_gemm_fractions(data.get("gemm_efficiency"), origin, "kernels.gemm_efficiency"),
        moe_stream_bits_by_gpu=_stream_bits(data.get("moe_stream_bits"), origin),
        moe_large_m_memory_by_gpu=_gemm_fractions(data.get("moe_large_m_memory_efficiency"), origin,
                                                  "kernels.moe_large_m_memory_efficiency"),
        **_untuned(data, origin),
        moe_large_expert_by_gpu=_large_expert(data.get("moe_large_expert"), origin),
        online_fp8_scale=_choice(data.get("online_fp8_scale", d.online_fp8_scale), origin,
                                 "kernels.online_fp8_scale", ("static", "dynamic")),
        ep_dispatch=_choice(data.get("ep_dispatch", d.ep_dispatch), origin, "kernels.ep_dispatch",
                            ("all_to_all", "per_rank", "allgather")),
        dynamic_scale_s_by_gpu=_dynamic_scale(data.get("dynamic_scale_us"), origin),
        uncaptured_linears=_formats(data.get("uncaptured_linears"), origin, "kernels.uncaptured_linears"),
        graph_prefill=_bool(data.get("graph_prefill", d.graph_prefill), origin, "kernels.graph_prefill"),
        **_shared_experts_stream(data.get("shared_experts_stream"), origin),
        graph_max_tokens=_graph_caps(data.get("graph_max_tokens"), origin),
        sources=_texts(data.get("sources", {}), origin, "kernels.sources"))


_MEMORY_KEYS = ("memory_fraction", "block_size", "scheduler_defaults", "scheduler", "requests", "overheads",
                "activation", "cuda_graphs", "kv", "weights", "static_fraction_rule", "sizing_margin", "terms",
                "model_runner")
_TOP = {"name", "version", "releases", "display_name", "default", "budget", "kernels", "sources", *_MEMORY_KEYS}


def engine_from_mapping(data: dict[str, Any], origin: str, default_name: str,
                        inherited_kernels: EngineKernels | None = None,
                        inherited_scheduler: SchedulerPolicy | None = None,
                        inherited_requests: RequestCosts | None = None) -> EngineSpec:
    """Validate an engine preset mapping (see presets/engines/*.yaml) and build the EngineSpec.

    ``inherited_kernels`` / ``inherited_scheduler`` / ``inherited_requests``: the kernel behaviour, step policy and
    request costs to use when the mapping has no ``kernels:`` / ``scheduler:`` / ``requests:`` block (the loader
    passes the engine's default version's); else ``EngineKernels()`` / ``SchedulerPolicy()`` / ``RequestCosts()``.
    """
    _check_keys(data, _TOP, origin)
    _require("budget" in data, origin, "missing required field 'budget'")
    budget = data["budget"]
    _require(budget in BUDGET_KINDS, origin, f"field 'budget' must be one of {', '.join(BUDGET_KINDS)}, got "
             f"{_show(budget)}")
    name = _text(data.get("name", default_name), origin, "name")
    kernels = (kernels_from_mapping(data["kernels"], origin) if data.get("kernels") is not None
               else inherited_kernels or EngineKernels())
    common = dict(
        name=name, version=_version_text(data["version"], origin, "version") if "version" in data else "",
        releases=_version_text(data["releases"], origin, "releases") if "releases" in data else "",
        display_name=_text(data.get("display_name", default_name), origin, "display_name"),
        default=_bool(data.get("default", False), origin, "default"), kernels=kernels,
        sources=_texts(data.get("sources"), origin, "sources"))
    _require(bool(common["sources"]), origin, "field 'sources' must cite the engine source")
    if budget == "ideal":
        extra = [k for k in _MEMORY_KEYS if k in data]
        _require(not extra, origin, f"field '{extra[0] if extra else ''}' has no meaning with budget: ideal (plan "
                 "uses the plain arithmetic); leave it out")
        return EngineSpec(budget=budget, **common)
    for key in ("version", "releases", "block_size", "scheduler_defaults"):
        _require(key in data, origin, f"missing required field '{key}'")
    sections = _memory_sections(data, origin, inherited_scheduler, inherited_requests)
    _require((budget == "measured") == (sections["sizing_margin"] is not None), origin,
             "field 'sizing_margin' goes with budget: measured, and only with it")
    rule, second = None, None
    if data.get("model_runner") is not None:
        rule, changes = _model_runner(data["model_runner"], origin)
        own = {k: v for k, v in data.items() if k != "model_runner"}
        second = replace(engine_from_mapping(merged_mapping(own, changes), origin, default_name, kernels,
                                             inherited_scheduler, inherited_requests), runner=rule.runners[1])
    return EngineSpec(budget=budget, **common, **sections, model_runner=rule, second_runner=second,
                      runner=rule.runners[0] if rule is not None else "")


def _model_runner(data: Any, origin: str) -> tuple[ModelRunnerRule, dict[str, Any]]:
    """``model_runner``: {runners, architectures, listed_requires, dense, hybrid_listed, changes} -> the rule and the
    changes (``RUNNER_CHANGES`` sections) that give the second runner's accounting."""
    _require(isinstance(data, dict), origin, "field 'model_runner' must be a mapping")
    _check_keys(data, {"runners", "architectures", "listed_requires", "dense", "hybrid_listed", "amd_unlisted",
                       "amd_second", "changes"}, origin, "model_runner.")
    runners = data.get("runners")
    _require(isinstance(runners, list) and len(runners) == 2 and all(isinstance(n, str) and n for n in runners),
             origin, f"field 'model_runner.runners' must name the two runners, got {_show(runners)}")
    lists = {}
    for key in ("architectures", "amd_unlisted", "amd_second"):
        names = data.get(key, [])
        _require(isinstance(names, list) and all(isinstance(n, str) and n for n in names), origin,
                 f"field 'model_runner.{key}' must be a list of architecture names, got {_show(names)}")
        lists[key] = tuple(names)
    requires = data.get("listed_requires", [])
    _require(isinstance(requires, list) and all(r in RUNNER_REQUIREMENTS for r in requires), origin,
             f"field 'model_runner.listed_requires' must list some of {', '.join(RUNNER_REQUIREMENTS)}, got "
             f"{_show(requires)}")
    changes = data.get("changes")
    _require(isinstance(changes, dict) and bool(changes), origin,
             "field 'model_runner.changes' must be a mapping of what the second runner changes")
    _check_keys(changes, set(RUNNER_CHANGES), origin, "model_runner.changes.")
    return ModelRunnerRule(**lists, runners=(runners[0], runners[1]),
                           listed_requires=tuple(requires),
                           dense=_bool(data.get("dense", False), origin, "model_runner.dense"),
                           hybrid_listed=_bool(data.get("hybrid_listed", False), origin,
                                               "model_runner.hybrid_listed")), changes


def scheduler_from_mapping(data: Any, origin: str) -> SchedulerPolicy:
    """The ``scheduler`` section (absent: vLLM's policy, chunked prefill beside the decodes)."""
    if data is None:
        return SchedulerPolicy()
    _require(isinstance(data, dict), origin, "field 'scheduler' must be a mapping")
    known = ("chunked_prefill", "prefill_first", "max_prefill_tokens", "reserve_output")
    extra = [k for k in data if k not in known]
    _require(not extra, origin, f"unknown field 'scheduler.{extra[0] if extra else ''}' (known: {', '.join(known)})")
    cap = data.get("max_prefill_tokens")
    return SchedulerPolicy(
        chunked_prefill=_bool(data.get("chunked_prefill", True), origin, "scheduler.chunked_prefill"),
        prefill_first=_bool(data.get("prefill_first", False), origin, "scheduler.prefill_first"),
        max_prefill_tokens=None if cap is None else _int(cap, origin, "scheduler.max_prefill_tokens", 1),
        reserve_output=_bool(data.get("reserve_output", False), origin, "scheduler.reserve_output"))


def requests_from_mapping(data: Any, origin: str) -> RequestCosts:
    """The ``requests`` section (absent: no costs outside the forward passes), each key in its unit
    (``REQUEST_COST_KEYS``) and ``api_servers`` a count."""
    if data is None:
        return RequestCosts()
    _require(isinstance(data, dict), origin, "field 'requests' must be a mapping")
    known = (*REQUEST_COST_KEYS, "api_servers")
    extra = [k for k in data if k not in known]
    _require(not extra, origin, f"unknown field 'requests.{extra[0] if extra else ''}' (known: {', '.join(known)})")
    values = {name: _num(data[key], origin, f"requests.{key}", 0.0, 3600.0 * per_s) / per_s
              for key, (name, per_s) in REQUEST_COST_KEYS.items() if key in data}
    return RequestCosts(**values, api_servers=_int(data.get("api_servers", 1), origin, "requests.api_servers", 1,
                                                   4096))


def _memory_sections(data: dict[str, Any], origin: str, inherited_scheduler: SchedulerPolicy | None = None,
                     inherited_requests: RequestCosts | None = None) -> dict[str, Any]:
    """The memory accounting of a serving engine with a KV pool (every budget but ``ideal``)."""
    fraction = data.get("memory_fraction")
    if fraction is not None:
        fraction = _num(fraction, origin, "memory_fraction", 0.0, 1.0)
        _require(fraction > 0, origin, "field 'memory_fraction' must be positive")
    rows = data["scheduler_defaults"]
    _require(isinstance(rows, list) and rows, origin, "field 'scheduler_defaults' must be a non-empty list")
    defaults = []
    for row in rows:
        _require(isinstance(row, dict), origin, "each scheduler_defaults row must be a mapping")
        _check_keys(row, {"max_num_seqs", "max_num_batched_tokens", "min_memory_gib", "exclude_gpus"}, origin,
                    "scheduler_defaults.")
        exclude = row.get("exclude_gpus", [])
        _require(isinstance(exclude, list) and all(isinstance(g, str) for g in exclude), origin,
                 "field 'scheduler_defaults.exclude_gpus' must be a list of names")
        defaults.append(SchedulerDefault(
            max_num_seqs=_int(row.get("max_num_seqs"), origin, "scheduler_defaults.max_num_seqs", 1),
            max_num_batched_tokens=_int(row.get("max_num_batched_tokens"), origin,
                                        "scheduler_defaults.max_num_batched_tokens", 1),
            min_memory_gib=_num(row.get("min_memory_gib", 0), origin, "scheduler_defaults.min_memory_gib",
                                high=MAX_GIB),
            exclude_gpus=tuple(exclude)))
    o = _section(data, "overheads", {"startup_gib_tp1", "startup_gib_tp", "startup_in_budget", "non_torch_gib_tp1",
                                     "non_torch_gib_tp", "non_torch_gib_pp"}, origin, frozenset({"by_fabric"}))
    fabrics = o.get("by_fabric") or {}
    _require(isinstance(fabrics, dict) and all(isinstance(v, dict) and set(v) == {"startup_gib_tp", "non_torch_gib_tp"}
                                               for v in fabrics.values()), origin,
             "field 'overheads.by_fabric' must map interconnect presets to {startup_gib_tp, non_torch_gib_tp}")
    overheads = Overheads(
        startup_bytes_tp1=_gib(o["startup_gib_tp1"], origin, "overheads.startup_gib_tp1"),
        startup_bytes_tp=_gib(o["startup_gib_tp"], origin, "overheads.startup_gib_tp"),
        startup_in_budget=_bool(o["startup_in_budget"], origin, "overheads.startup_in_budget"),
        non_torch_bytes_tp1=_gib(o["non_torch_gib_tp1"], origin, "overheads.non_torch_gib_tp1"),
        non_torch_bytes_tp=_gib(o["non_torch_gib_tp"], origin, "overheads.non_torch_gib_tp"),
        non_torch_bytes_pp=_gib(o["non_torch_gib_pp"], origin, "overheads.non_torch_gib_pp"),
        tp_bytes_by_fabric=tuple(sorted(
            (str(name), _gib(v["startup_gib_tp"], origin, f"overheads.by_fabric.{name}.startup_gib_tp"),
             _gib(v["non_torch_gib_tp"], origin, f"overheads.by_fabric.{name}.non_torch_gib_tp"))
            for name, v in fabrics.items())))
    a = _section(data, "activation", {"sampler_bytes_per_logit", "sampler_scratch_rows", "hidden_copies",
                                      "moe_workspace"}, origin, frozenset({"penalty_state"}))
    activation = ActivationModel(
        sampler_bytes_per_logit=_num(a["sampler_bytes_per_logit"], origin, "activation.sampler_bytes_per_logit",
                                     high=1024.0),
        sampler_scratch_rows=_int(a["sampler_scratch_rows"], origin, "activation.sampler_scratch_rows"),
        hidden_copies=_int(a["hidden_copies"], origin, "activation.hidden_copies", high=1024),
        moe_workspace=_bool(a["moe_workspace"], origin, "activation.moe_workspace"),
        **_penalty_state(a.get("penalty_state", False), origin))
    g = _section(data, "cuda_graphs", {"capture", "first_capture_mib", "per_size_mib", "in_budget"}, origin,
                 frozenset({"per_size_mib_tp", "max_size_by_gpu", "estimated"}))
    ceilings = g.get("max_size_by_gpu") or {}
    _require(isinstance(ceilings, dict) and all(isinstance(n, str) for n in ceilings), origin,
             "field 'cuda_graphs.max_size_by_gpu' must map GPU preset names to batch sizes")
    _require(g["capture"] in ("vllm", "vllm-0.8", "sglang", "none"), origin,
             f"field 'cuda_graphs.capture' must be vllm, vllm-0.8, sglang or none, got {_show(g['capture'])}")
    graphs = CudaGraphModel(capture=g["capture"], first_capture_bytes=_mib(g["first_capture_mib"], origin,
                                                                           "cuda_graphs.first_capture_mib"),
                            per_size_bytes=_mib(g["per_size_mib"], origin, "cuda_graphs.per_size_mib"),
                            per_size_bytes_tp=_mib(g.get("per_size_mib_tp", g["per_size_mib"]), origin,
                                                   "cuda_graphs.per_size_mib_tp"),
                            in_budget=_bool(g["in_budget"], origin, "cuda_graphs.in_budget"),
                            estimated=_bool(g.get("estimated", True), origin, "cuda_graphs.estimated"),
                            max_size_by_gpu=tuple(sorted(
                                (n, _int(v, origin, f"cuda_graphs.max_size_by_gpu.{n}", 1, 1 << 16))
                                for n, v in ceilings.items())))
    k = _section(data, "kv", {"hybrid_groups", "sliding_chunk", "concurrency"}, origin,
                 frozenset({"swa_full_tokens_ratio", "checkpoint_dtype", "chunked_local", "sparse_mla_fp8",
                            "v4_groups", "v4_concurrency", "tokens", "group_size_ratio", "in_flight",
                            "v4_pool", "state_pool", "state_blocks", "checkpoint_align", "sparse_mla_fp8_gpus",
                            "sparse_mla_raw_gpus", "hybrid_prefix_caching", "state_slots", "state_dtype",
                            "explicit_budget"}))
    _require(k["concurrency"] in ("vllm", "pool"), origin, "field 'kv.concurrency' must be vllm or pool")
    ratio = k.get("swa_full_tokens_ratio")
    v4_groups, v4_concurrency = k.get("v4_groups"), k.get("v4_concurrency", "weighted")
    _require(v4_groups is None or v4_groups in V4_GROUPINGS, origin,
             f"field 'kv.v4_groups' must be one of {', '.join(V4_GROUPINGS)}, got {_show(v4_groups)}")
    _require(v4_concurrency in ("weighted", "pages"), origin,
             f"field 'kv.v4_concurrency' must be weighted or pages, got {_show(v4_concurrency)}")
    _require(k.get("tokens", "blocks") in ("blocks", "concurrency"), origin,
             f"field 'kv.tokens' must be blocks or concurrency, got {_show(k.get('tokens'))}")
    _require(k.get("in_flight", "batch") in IN_FLIGHT_RULES, origin,
             f"field 'kv.in_flight' must be one of {', '.join(IN_FLIGHT_RULES)}, got {_show(k.get('in_flight'))}")
    kv = KVLayout(hybrid_groups=_bool(k["hybrid_groups"], origin, "kv.hybrid_groups"),
                  sliding_chunk=_bool(k["sliding_chunk"], origin, "kv.sliding_chunk"),
                  swa_full_tokens_ratio=None if ratio is None else _num(ratio, origin, "kv.swa_full_tokens_ratio",
                                                                        0.0, 1.0),
                  concurrency=k["concurrency"],
                  checkpoint_dtype=_bool(k.get("checkpoint_dtype", False), origin, "kv.checkpoint_dtype"),
                  chunked_local=_bool(k.get("chunked_local", False), origin, "kv.chunked_local"),
                  sparse_mla_fp8=_bool(k.get("sparse_mla_fp8", False), origin, "kv.sparse_mla_fp8"),
                  sparse_mla_fp8_gpus=_names(k.get("sparse_mla_fp8_gpus", []), origin, "kv.sparse_mla_fp8_gpus"),
                  sparse_mla_raw_gpus=_names(k.get("sparse_mla_raw_gpus", []), origin, "kv.sparse_mla_raw_gpus"),
                  v4_groups=v4_groups, v4_concurrency=v4_concurrency, tokens=k.get("tokens", "blocks"),
                  group_size_ratio=_num(k.get("group_size_ratio", 1.25), origin, "kv.group_size_ratio", 1.0, 16.0),
                  in_flight=k.get("in_flight", "batch"), v4_pool=_v4_pool(k.get("v4_pool"), origin),
                  state_pool=_state_pool(k.get("state_pool"), origin),
                  **_state_blocks(k.get("state_blocks", 1), origin),
                  checkpoint_align_by_kind=_by_linear_kind(k.get("checkpoint_align", {}), origin,
                                                           "kv.checkpoint_align", 1 << 16),
                  hybrid_prefix_caching=_bool(k.get("hybrid_prefix_caching", True), origin,
                                              "kv.hybrid_prefix_caching"),
                  state_slots=_choice(k.get("state_slots", "requests"), origin, "kv.state_slots",
                                      ("requests", "max_num_seqs")),
                  state_dtype=_choice(k.get("state_dtype", "checkpoint"), origin, "kv.state_dtype",
                                      ("checkpoint", "model", "fp32")),
                  explicit_budget=_bool(k.get("explicit_budget", False), origin, "kv.explicit_budget"))
    w = _section(data, "weights", {"vocab_padding", "rotary_cache", "mla_absorbed_copy", "mxfp4_pad_hidden",
                                   "mxfp4_pad_intermediate"}, origin, frozenset({"float32_as", "unsupported"}))
    float32_as = w.get("float32_as")
    unsupported = w.get("unsupported", [])
    formats = dtype_names()  # int4-gN and the like: every group size of the family
    _require(isinstance(unsupported, list) and all(isinstance(f, str) and f in formats for f in unsupported), origin,
             f"field 'weights.unsupported' must be a list of weight formats ({', '.join(formats)}), got "
             f"{_show(unsupported)}")
    _require(float32_as in (None, "bf16", "fp16"), origin,
             f"field 'weights.float32_as' must be bf16 or fp16, got {float32_as!r}")
    weights = WeightLayout(vocab_padding=_int(w["vocab_padding"], origin, "weights.vocab_padding", 1, 1 << 20),
                           rotary_cache=_bool(w["rotary_cache"], origin, "weights.rotary_cache"),
                           mla_absorbed_copy=_bool(w["mla_absorbed_copy"], origin, "weights.mla_absorbed_copy"),
                           mxfp4_pad_hidden=_int(w["mxfp4_pad_hidden"], origin, "weights.mxfp4_pad_hidden", 1, 1 << 20),
                           mxfp4_pad_intermediate=_int(w["mxfp4_pad_intermediate"], origin,
                                                       "weights.mxfp4_pad_intermediate", 1, 1 << 20),
                           float32_as=float32_as, unsupported=tuple(unsupported))
    rule = None
    if data.get("static_fraction_rule") is not None:
        r = _section(data, "static_fraction_rule", {"base_mib", "per_prefill_token_mib", "per_graph_bs_mib",
                                                    "floor_mib", "tiers"}, origin,
                     frozenset({"per_prefill_graph_mib", "mla_prefill_graph_mib", "per_dp_graph_bs_mib",
                                "per_dp_graph_bs_mib_above_300", "graph_bs_within_running"}))
        tiers = r["tiers"]
        _require(isinstance(tiers, list) and all(isinstance(t, list) and len(t) == 4 for t in tiers), origin,
                 "field 'static_fraction_rule.tiers' must be a list of [below_gib, chunked_prefill, bs_tp_lt4, "
                 "bs_tp_ge4]")
        key = "static_fraction_rule.tiers"
        rule = StaticFractionRule(
            base_mib=_num(r["base_mib"], origin, "static_fraction_rule.base_mib", high=MAX_MIB),
            per_prefill_token_mib=_num(r["per_prefill_token_mib"], origin,
                                       "static_fraction_rule.per_prefill_token_mib", high=MAX_MIB),
            per_graph_bs_mib=_num(r["per_graph_bs_mib"], origin, "static_fraction_rule.per_graph_bs_mib",
                                  high=MAX_MIB),
            floor_mib=_num(r["floor_mib"], origin, "static_fraction_rule.floor_mib", high=MAX_MIB),
            tiers=tuple((_num(t[0], origin, key, high=MAX_GIB), _int(t[1], origin, key, 1), _int(t[2], origin, key, 1),
                         _int(t[3], origin, key, 1)) for t in tiers),
            per_prefill_graph_mib=_num(r.get("per_prefill_graph_mib", 0), origin,
                                       "static_fraction_rule.per_prefill_graph_mib", high=MAX_MIB),
            mla_prefill_graph_mib=_num(r.get("mla_prefill_graph_mib", 0), origin,
                                       "static_fraction_rule.mla_prefill_graph_mib", high=MAX_MIB),
            per_dp_graph_bs_mib=_num(r.get("per_dp_graph_bs_mib", 0), origin,
                                     "static_fraction_rule.per_dp_graph_bs_mib", high=MAX_MIB),
            per_dp_graph_bs_mib_above_300=_num(r.get("per_dp_graph_bs_mib_above_300", 0), origin,
                                               "static_fraction_rule.per_dp_graph_bs_mib_above_300", high=MAX_MIB),
            graph_bs_within_running=_bool(r.get("graph_bs_within_running", False), origin,
                                          "static_fraction_rule.graph_bs_within_running"))
    _require(fraction is not None or rule is not None, origin,
             "give memory_fraction, or a static_fraction_rule that computes it")
    margin = None
    if data.get("sizing_margin") is not None:
        m = _section(data, "sizing_margin", {"floor_gib", "fraction"}, origin)
        margin = SizingMargin(floor_bytes=_gib(m["floor_gib"], origin, "sizing_margin.floor_gib"),
                              fraction=_num(m["fraction"], origin, "sizing_margin.fraction", 0.0, 16.0))
    scheduler = (scheduler_from_mapping(data["scheduler"], origin) if data.get("scheduler") is not None
                 else inherited_scheduler or SchedulerPolicy())
    requests = (requests_from_mapping(data["requests"], origin) if data.get("requests") is not None
                else inherited_requests or RequestCosts())
    return dict(memory_fraction=fraction, block_size=_int(data["block_size"], origin, "block_size", 1, 1 << 20),
                scheduler_defaults=tuple(defaults), scheduler=scheduler, requests=requests,
                overheads=overheads, activation=activation, cuda_graphs=graphs, kv=kv, weights=weights,
                static_fraction_rule=rule, sizing_margin=margin,
                terms=_texts(data.get("terms", {}), origin, "terms", TERM_KEYS))
