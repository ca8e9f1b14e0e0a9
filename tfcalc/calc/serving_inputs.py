"""The seam between capacity planning and the memory and speed models: the one module that reads them.

Capacity planning needs two facts about a replica (one engine instance on tp x pp GPUs):

(a) memory -> ``replica_memory``: does the model load, how many tokens of KV cache the replica holds and how many
    sequences of max_model_len fit, as the serving engine counts them: ``tfcalc.calc.plan.plan_fit`` with the
    engine's memory model (issue 8: vLLM's profiling run and CUDA graphs, SGLang's static fraction, TensorRT-LLM's
    free fraction), for the configuration's max_num_seqs and max_num_batched_tokens (both size the engine's
    activation peak, the first its CUDA graphs).
(b) speed -> a ``StepSource``: the time of one scheduler step that runs a decode batch plus prefill chunks, from the
    per-operation latency model of ``estimate`` (issue 9: ``tfcalc.calc.latency``; the engine's kernels, launch
    floors, MoE grouped GEMMs, communication, pp batches in flight). ``LatencyStep`` prices a simulated step
    exactly (``serving_step_seconds``); for the analytic model, whose steps depend on two numbers (the decoding
    sequences and the prefill tokens of a step, at the traffic's mean contexts), it tabulates exact step times on
    a lazily filled grid and interpolates bilinearly (``StepTable``): a search prices millions of steps, the
    latency model 0.1 ms per new shape.

Nothing else in the capacity planner reads plan.py or latency.py. Pure math: no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from tfcalc.calc.engine import V4_MLA_BLOCK, recurrent_state_rule, sparse_mla_raw
from tfcalc.calc.kernels import UNIFORM, Routing
from tfcalc.calc.kv_cache import compressed_entry_bytes, compressed_rate, compressor_state_bytes, default_kv_dtype
from tfcalc.calc.latency import Deployment, StepShape, in_flight_seconds, serving_step_seconds
from tfcalc.calc.plan import DEFAULT_BLOCK_SIZE, PlanConfig, plan_fit, state_page, v4_engine_layout
from tfcalc.calc.shard import Parallelism, attention_ranks, shard, stage_census
from tfcalc.dtypes import DType, WeightPrecision
from tfcalc.spec.engine import EngineSpec, memory_model
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec

# --- (a) memory ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KvShape:
    """Which layers hold the whole context and which at most a window, as the engine's KV pool counts them, and the
    fixed state a sequence holds beside them (Gated DeltaNet layers: ``state_layers`` of them, which hold no tokens,
    their state worth ``state_units`` of the pool per sequence)."""

    num_layers: int
    windows: tuple[tuple[int, int], ...] = ()  # (layer count, window) for sliding-window layers
    state_layers: int = 0
    state_units: float = 0.0
    # where a full layer's token and a sliding layer's differ in size (Gemma 4): their weights, and the weighted
    # layer count one pool token stands for (default: num_layers)
    full_weight: float = 1.0
    window_weight: float = 1.0
    per_pool_token: float | None = None

    def held(self, context: float) -> float:
        """Layer-tokens one sequence of ``context`` tokens holds: full layers x c + sliding x min(c, window), each
        kind times its weight."""
        if not self.windows and not self.state_layers:
            return self.num_layers * context * self.full_weight
        full = self.num_layers - self.state_layers - sum(count for count, _ in self.windows)
        return (full * context * self.full_weight
                + sum(count * min(context, window) for count, window in self.windows) * self.window_weight)

    def units(self, context: float, state: bool = True) -> float:
        """KV one sequence holds, in tokens of the engine's pool: held(c) / layers (= c without windows), plus its
        fixed state (``state``: a cached prefix shared between sequences has none of its own)."""
        return self.held(context) / (self.per_pool_token or self.num_layers) + (self.state_units if state else 0.0)


def kv_shape(spec: ModelSpec, engine: EngineSpec | None = None, *, tp: int = 1, kv_dtype: DType | None = None,
             block_size: int | None = None) -> KvShape:
    """The model's sliding-window layers as the engine's pool holds them: window-capped for the ideal arithmetic and
    vLLM's hybrid allocator; an engine that caches sliding layers like full ones (or keeps a separate sliding pool,
    SGLang) counts its pool in full-layer tokens. Gated DeltaNet layers hold a state per sequence (``plan.state_page``
    at this tp and KV format): ``kv.state_blocks`` blocks per layer where vLLM's state groups page it, none where
    SGLang keeps the states in a pool of their own (``kv.state_pool``: it caps the running requests instead) or
    TensorRT-LLM in max_num_seqs slots (``kv.state_slots``), else
    its bytes counted in tokens of the attention layers' cache."""
    model = memory_model(engine)
    if spec.compressed_attention is not None:
        return _compressed_kv_shape(spec, engine, kv_dtype or default_kv_dtype(spec, engine))
    if spec.linear_attention is not None:
        fmt = kv_dtype or default_kv_dtype(spec, engine)
        block = block_size or (engine.block_size if engine is not None else None) or DEFAULT_BLOCK_SIZE
        sh = shard(spec, Parallelism(tp=tp))
        state, block = state_page(spec, engine, sh, fmt, block)
        layers, attention = spec.num_linear_layers, spec.num_attention_layers
        if model is not None and model.kv.hybrid_groups:
            return KvShape(num_layers=spec.num_layers, state_layers=layers,
                           state_units=layers * block * model.kv.state_blocks_for(spec.linear_attention.kind)
                           / spec.num_layers)
        if model is not None and (model.kv.state_pool is not None or model.kv.state_slots == "max_num_seqs"):
            return KvShape(num_layers=attention)   # the states in a pool or slots of their own: none in the KV pool
        return KvShape(num_layers=attention,   # the pool in tokens of the attention layers' cache
                       state_units=layers * state / float(attention * fmt.bytes_for(sh.kv_elements)))
    if model is not None and (not model.kv.hybrid_groups or (spec.chunked_attention and not model.kv.chunked_local)):
        return KvShape(num_layers=spec.num_attention_layers)
    sliding = len(spec.sliding_window_layers) if spec.sliding_window is not None else 0
    windows = ((sliding, spec.sliding_window),) if sliding else ()
    if spec.full_attention is None:
        return KvShape(num_layers=spec.num_attention_layers, windows=windows)
    sh = shard(spec, Parallelism(tp=tp))  # Gemma 4: a full layer's token and a sliding one's differ in elements
    local, full = sh.kv_elements, sh.full_kv_elements
    if model is None:  # the ideal pool counts tokens of every layer at once
        return KvShape(num_layers=spec.num_attention_layers, windows=windows, full_weight=full, window_weight=local,
                       per_pool_token=sliding * local + spec.num_full_layers * full)
    largest = max(local, full)  # vLLM reports tokens of the group whose page per token is the largest
    return KvShape(num_layers=spec.num_attention_layers, windows=windows, full_weight=full / largest,
                   window_weight=local / largest)


def _compressed_kv_shape(spec: ModelSpec, engine: EngineSpec | None, kv_dtype: DType) -> KvShape:
    """DeepSeek-V4's cache in tokens of its pool. Under vLLM's DeepSeek-V4 groups (``plan.v4_engine_layout``) the pool
    is its block ids x 256 tokens and a running sequence holds cdiv(c, 256) compressed blocks plus its sliding
    groups' blocks over their windows (``V4Layout.sliding_blocks``, a fixed share). Under SGLang's DSV4 pools
    (``kv.v4_pool``) the pool is its full-token slots and a sequence holds its context (its window pool, a tenth of
    them, binds only for short contexts: not counted here). Else in tokens of
    ``kv_cache.compressed_rate`` (bytes per token past the window): one layer's worth weighted by that rate holds the
    context, every layer its window of entries, and the compressors' states a fixed share per sequence (the
    compressed entries counted per token, not per ratio tokens)."""
    assert spec.compressed_attention is not None and spec.sliding_window is not None
    layout = v4_engine_layout(spec, engine, stage_census(spec, range(spec.num_layers)), kv_dtype)
    if layout is not None:
        return KvShape(num_layers=1, state_units=layout.sliding_blocks * V4_MLA_BLOCK)
    if engine is not None and engine.kv.v4_pool is not None:
        return KvShape(num_layers=1)
    rate = float(compressed_rate(spec, kv_dtype))
    return KvShape(num_layers=spec.num_layers + 1, windows=((spec.num_layers, spec.sliding_window),),
                   full_weight=rate, window_weight=float(compressed_entry_bytes(spec, kv_dtype)),
                   per_pool_token=rate, state_units=float(compressor_state_bytes(spec)) / rate)


@dataclass(frozen=True, kw_only=True)
class ReplicaMemory:
    """Memory of one replica (tp x pp GPUs) as the engine budgets it (``plan_fit``)."""

    fits: bool
    reason: str
    weights_bytes_per_gpu: int
    reserved_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_capacity_tokens: int          # tokens the engine's pool holds ("GPU KV cache size"), in KvShape.units
    max_sequences_at_max_len: int    # the engine's "maximum concurrency" at max_model_len
    block_size: int
    engine: str
    state_bytes_per_layer: int = 0   # one sequence's state in one Gated DeltaNet layer on one GPU
    max_running: int | None = None   # running requests the engine admits at most beside max_num_seqs (SGLang's states)


@lru_cache(maxsize=65536)
def replica_memory(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, *, tp: int, pp: int,
                   ep: int, engine: EngineSpec | None, max_model_len: int, max_num_seqs: int,
                   max_num_batched_tokens: int, gpu_memory_utilization: float | None = None,
                   block_size: int | None = None, redundant_experts: int = 0,
                   kv_cache_memory_bytes: int | None = None) -> ReplicaMemory:
    """``plan_fit`` of one replica at context max_model_len for the engine (``None``: the ideal arithmetic) with
    this max_num_seqs and max_num_batched_tokens; ``None`` utilization / block size: the engine's defaults. With ep >
    tp the replica is one of ep / tp data-parallel attention ranks (its KV pool; the experts spread over all).
    ``kv_cache_memory_bytes``: vLLM's KV cache per GPU, set outright; the replica fits if the rest fits beside it."""
    dp = attention_ranks(tp, ep)   # data-parallel attention ranks sharing the experts: per rank below
    cfg = PlanConfig(num_gpus=tp * pp * dp, tp=tp, pp=pp, ep=ep, redundant_experts=redundant_experts,
                     context=max_model_len, batch=1, engine=engine,
                     gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
                     max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                     kv_cache_memory_bytes=kv_cache_memory_bytes)
    r = plan_fit(spec, gpu, precision, kv_dtype, cfg, with_ideal=False, with_max_context=False)
    sequences = r.max_concurrent_sequences // dp   # plan_fit adds them up over the ranks
    gib = 1 << 30
    label = engine.label if engine is not None else "ideal"
    if r.overcommit_bytes_per_gpu > 0:
        reason = (f"the set KV cache of {r.kv_budget_bytes_per_gpu / gib:,.2f} GiB per GPU and the rest exceed the GPU "
                  f"by {r.overcommit_bytes_per_gpu / gib:,.2f} GiB ({label})")
    elif r.kv_budget_bytes_per_gpu <= 0:
        reason = (f"weights {r.weights_bytes_per_gpu / gib:,.2f} GiB per GPU leave no KV budget ({label}: "
                  f"{r.kv_budget_bytes_per_gpu / gib:,.2f} GiB)")
    elif sequences < 1:
        reason = (f"KV of one sequence of {max_model_len:,} tokens needs {r.kv_bytes_per_sequence_per_gpu / gib:,.2f} "
                  f"GiB per GPU, {r.kv_budget_bytes_per_gpu / gib:,.2f} GiB left ({label})")
    else:
        reason = f"fits: {sequences:,} sequences of {max_model_len:,} tokens ({label})"
    fits = r.kv_budget_bytes_per_gpu > 0 and sequences >= 1 and r.overcommit_bytes_per_gpu == 0
    return ReplicaMemory(fits=fits, reason=reason,
                         weights_bytes_per_gpu=r.weights_bytes_per_gpu, reserved_bytes_per_gpu=r.reserved_bytes_per_gpu,
                         kv_budget_bytes_per_gpu=r.kv_budget_bytes_per_gpu,
                         kv_bytes_per_token_per_gpu=r.kv_bytes_per_token_per_gpu,
                         kv_capacity_tokens=max(r.kv_pool_tokens_per_gpu, 0),
                         max_sequences_at_max_len=sequences, block_size=r.block_size, engine=label,
                         state_bytes_per_layer=r.state_bytes_per_layer, max_running=r.max_running_requests)


# --- (b) speed -------------------------------------------------------------------------------------------

StepFunction = Callable[[float, float, float], float]   # (decoding sequences, prefill tokens, prompts completing)


class StepSource:
    """What the serving model and the simulation need from a step-time model.

    ``busy_step(...)``: the step time as a fast function of (decoding sequences, prefill tokens, prompts completing)
    at the traffic's mean contexts (the analytic model); ``time(...)``: one simulated step exactly.
    """

    kv: KvShape
    label: str = ""

    def busy_step(self, decode_context: float, prompt_tokens: float, prefix_tokens: float,
                  tokens_per_decode: float = 1.0, extra_s: float = 0.0) -> StepFunction:
        raise NotImplementedError

    def time(self, decode_seqs: int, decode_context: float, prefill_tokens: int, prefill_past: float,
             prefill_seqs: int, tokens_per_decode: int = 1) -> float:
        raise NotImplementedError


@dataclass(eq=False)
class ConstantStep(StepSource):
    """Every non-empty step takes ``seconds`` whatever it carries (closed-form checks: M/M/1, M/D/1)."""

    seconds: float
    kv: KvShape = field(default_factory=lambda: KvShape(num_layers=1))
    label: str = "constant"

    def busy_step(self, decode_context: float, prompt_tokens: float, prefix_tokens: float,
                  tokens_per_decode: float = 1.0, extra_s: float = 0.0) -> StepFunction:
        seconds = self.seconds + extra_s

        def step(batch: float, prefill: float, completing: float) -> float:
            return seconds

        return step

    def time(self, decode_seqs: int, decode_context: float, prefill_tokens: int, prefill_past: float,
             prefill_seqs: int, tokens_per_decode: int = 1) -> float:
        return self.seconds if decode_seqs or prefill_tokens else 0.0


# Grids of the tabulated step. A step's time is the decode-only step of its batch, F(B, 0), plus what its prefill
# chunk adds, F(B, n) - F(B, 0). The first decides TPOT and is convex and piecewise linear in B (weights read once,
# then compute-bound): a fine grid (ratios 1.5 / 1.33). The second varies slowly with the batch (the chunk's own
# work, and how much of the weight traffic the batch already paid): a coarse batch grid (ratio 4) x prefill tokens
# (1, then 64 and up by ratios 1.5 / 1.33: with ratio 2 alone a chunk of 187 tokens came out 8.6 % off, attention's
# 128-row tiles bending the step between 128 and 256). Bilinear interpolation keeps within about 5 % of the exact
# step (tests/calc/test_serving_inputs.py).
BATCH_GRID = (0.0, 1.0, 2.0, 3.0, 4.0) + tuple(float(round(4 * f * 2 ** k)) for k in range(0, 14) for f in (1.5, 2))
COARSE_GRID = (0.0, 1.0) + tuple(float(4 ** k) for k in range(1, 9))
PREFILL_GRID = (0.0, 1.0) + tuple(float(f << k) for k in range(0, 12) for f in (64, 96))
_LAST_BATCH, _LAST_COARSE, _LAST_PREFILL = len(BATCH_GRID) - 1, len(COARSE_GRID) - 1, len(PREFILL_GRID) - 1
_FINE_OF_COARSE = tuple(BATCH_GRID.index(b) for b in COARSE_GRID)


class StepTable:
    """Exact step times of one deployment on grids, filled on demand, and the interpolation between them: the
    decode-only step on a fine batch grid plus the prefill chunk's increment on a coarse batch x prefill-tokens grid
    (bilinear). Prefill tokens n of a step: one chunk of a mean prompt P at the mean past of its chunks (P - n) / 2
    when n < P, else n / P whole prompts; decoding sequences at the mean context. With pp stages each of the pp
    batches in flight carries 1/pp of the step (``in_flight_seconds``)."""

    def __init__(self, d: Deployment, decode_context: float, prompt_tokens: float, prefix_tokens: float,
                 tokens_per_decode: float, extra_s: float) -> None:
        self.d, self.context, self.prompt, self.prefix = d, decode_context, max(prompt_tokens, 1.0), prefix_tokens
        self.tokens_per_decode, self.extra_s = tokens_per_decode, extra_s
        self.decode: list[float | None] = [None] * len(BATCH_GRID)
        self.delta: list[list[float | None]] = [[None] * len(COARSE_GRID) for _ in PREFILL_GRID]
        self._last_batch: float = -1.0
        self._last: tuple[float, int, float] = (0.0, 0, 0.0)

    def exact(self, batch: float, prefill: float) -> float:
        """The latency model's step time (batch a multiple of pp on the grids)."""
        pp = self.d.pp
        seqs = batch / pp
        tokens = prefill / pp
        if tokens <= 0 and seqs <= 0:
            return 0.0
        if tokens < self.prompt:
            chunks, per, past = 1, round(tokens), self.prefix + (self.prompt - tokens) / 2
        else:
            chunks = max(1, round(tokens / self.prompt))
            per, past = round(tokens / chunks), self.prefix
        decode = round(seqs * self.tokens_per_decode)
        shape = StepShape(decode_seqs=decode, decode_context=self.context if decode else 0.0,
                          decode_span=self.context if decode else 0.0,
                          prefill_seqs=chunks if per else 0, prefill_tokens=per, prefill_past=round(past) if per else 0)
        if not shape.tokens:
            return 0.0
        return in_flight_seconds(self.d, shape) + self.extra_s

    def _decode(self, i: int) -> float:
        value = self.decode[i]
        if value is None:
            value = self.decode[i] = self.exact(BATCH_GRID[i] * self.d.pp, 0.0)
        return value

    def _delta(self, i: int, j: int) -> float:
        value = self.delta[j][i]
        if value is None:
            pp = self.d.pp
            value = self.exact(COARSE_GRID[i] * pp, PREFILL_GRID[j]) - self._decode(_FINE_OF_COARSE[i])
            self.delta[j][i] = value
        return value

    def __call__(self, batch: float, prefill: float, completing: float = 0.0) -> float:
        if batch == self._last_batch:   # the serving model asks for several chunks at one batch in a row
            value, k, w = self._last
        else:
            b = batch / self.d.pp
            i = bisect.bisect_right(BATCH_GRID, b) - 1
            if i >= _LAST_BATCH:
                return self.exact(batch, prefill)
            u = (b - BATCH_GRID[i]) / (BATCH_GRID[i + 1] - BATCH_GRID[i])
            decode = self.decode
            value = decode[i]
            if value is None:
                value = self._decode(i)
            if u > 0:
                top = decode[i + 1]
                if top is None:
                    top = self._decode(i + 1)
                value += u * (top - value)
            k = bisect.bisect_right(COARSE_GRID, b) - 1
            w = (b - COARSE_GRID[k]) / (COARSE_GRID[k + 1] - COARSE_GRID[k]) if k < _LAST_COARSE else 0.0
            self._last_batch, self._last = batch, (value, k, w)
        if prefill <= 0:
            return value
        j = bisect.bisect_right(PREFILL_GRID, prefill) - 1
        if j >= _LAST_PREFILL or k >= _LAST_COARSE:
            return self.exact(batch, prefill)
        if j == 0:   # a step with prompt tokens pays the prefill kernels: never "part of a chunk"
            j, v = 1, 0.0
        else:
            v = (prefill - PREFILL_GRID[j]) / (PREFILL_GRID[j + 1] - PREFILL_GRID[j])
        row = self.delta[j]
        first = row[k]
        if first is None:
            first = self._delta(k, j)
        if w > 0:
            top = row[k + 1]
            if top is None:
                top = self._delta(k + 1, j)
            first += w * (top - first)
        if v > 0:
            row = self.delta[j + 1]
            second = row[k]
            if second is None:
                second = self._delta(k, j + 1)
            if w > 0:
                top = row[k + 1]
                if top is None:
                    top = self._delta(k + 1, j + 1)
                second += w * (top - second)
            first += v * (second - first)
        return value + first

    @property
    def cells(self) -> int:
        return sum(v is not None for v in self.decode) + sum(v is not None for row in self.delta for v in row)


@dataclass(eq=False)
class LatencyStep(StepSource):
    """The per-operation latency model of one deployment (``tfcalc.calc.latency.deployment``) as a step source."""

    deployment: Deployment
    kv: KvShape
    label: str = ""
    _tables: dict[tuple, StepTable] = field(default_factory=dict, repr=False)

    def busy_step(self, decode_context: float, prompt_tokens: float, prefix_tokens: float,
                  tokens_per_decode: float = 1.0, extra_s: float = 0.0) -> StepFunction:
        key = (round(decode_context, 3), round(prompt_tokens, 3), round(prefix_tokens, 3), tokens_per_decode, extra_s)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = StepTable(self.deployment, decode_context, prompt_tokens, prefix_tokens,
                                                  tokens_per_decode, extra_s)
        return table

    def time(self, decode_seqs: int, decode_context: float, prefill_tokens: int, prefill_past: float,
             prefill_seqs: int, tokens_per_decode: int = 1) -> float:
        """``prefill_tokens`` in total over ``prefill_seqs`` chunks (their mean length and mean past are priced)."""
        seqs = max(prefill_seqs, 1)
        return serving_step_seconds(self.deployment, decode_seqs * tokens_per_decode, decode_context,
                                    prefill_tokens / seqs if prefill_tokens else 0.0, prefill_past, seqs)


def cells_priced(step: StepSource) -> int:
    """Exact step times a step source has computed for its tables (a measure of the search's work)."""
    return sum(t.cells for t in getattr(step, "_tables", {}).values())



def latency_step(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, *, tp: int = 1,
                 pp: int = 1, ep: int = 1, engine: EngineSpec | None = None, rates: Callable | None = None,
                 gpus_per_node: int = 8, routing: Routing = UNIFORM, block_size: int | None = None,
                 redundant_experts: int = 0) -> LatencyStep:
    """The step source of one replica: ``deployment`` with the engine's kernels (``None``: the defaults, vLLM's),
    ``rates(gpu, base, phase) -> Rates`` replacing the GPU's rates per phase (calibration, efficiency overrides) and
    the MoE ``routing`` -- as ``tfcalc estimate`` builds it -- and the engine's KV pool shape."""
    from tfcalc.calc.latency import deployment, rates_for
    from tfcalc.spec.engine import EngineKernels

    kernels = engine.kernels if engine is not None else EngineKernels()
    prefill = decode = None
    if rates is not None:
        base = rates_for(gpu, kernels, architecture=spec.architecture, has_experts=spec.moe is not None)
        prefill, decode = rates(gpu, base, "prefill"), rates(gpu, base, "decode")
    d = deployment(spec, gpu, precision, kv_dtype, tp=tp, pp=pp, ep=ep, engine_kernels=kernels,
                   gpus_per_node=gpus_per_node, rates_prefill=prefill, rates_decode=decode, routing=routing,
                   redundant_experts=redundant_experts, raw_sparse_latent=sparse_mla_raw(engine, gpu),
                   recurrent_state_rule=recurrent_state_rule(engine))
    return LatencyStep(deployment=d, kv=kv_shape(spec, engine, tp=tp, kv_dtype=kv_dtype, block_size=block_size),
                       label=engine.label if engine is not None else "ideal")
