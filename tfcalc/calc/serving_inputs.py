"""The seam between capacity planning and the memory and speed models: the one module to change when they do.

Capacity planning needs two facts about a replica (one engine instance on tp x pp GPUs):

(a) memory -> ``replica_memory``: does the model load, and how many tokens of KV cache the replica holds
    (blocks x block size of the fullest pipeline stage). Today it calls ``tfcalc.calc.plan.plan_fit``.
(b) speed -> ``step_work`` + ``StepModel``: the time of one scheduler step that runs a decode batch of B
    sequences (with their contexts) plus a prefill chunk of N tokens. Today it is built from
    ``tfcalc.calc.roofline``'s ``prefill_work`` / ``decode_work`` FLOP and byte counts: the roofline's work
    is linear in tokens (linear layers), in attended keys (attention), and constant in weights, except the
    routed experts a batch touches, E (1 - (1 - k/E)^T). ``step_work`` probes the work functions at a few
    points, solves for those coefficients once per (model, tp, pp, ep, dtypes), and ``StepModel.time`` then
    evaluates any step with a dozen multiplications (the roofline itself takes milliseconds per call; a
    search evaluates millions of steps).

When the engine memory model (issue 8) lands: replace the body of ``replica_memory`` with the engine model's
KV tokens per replica, maximum sequences and its fit verdict (what it needs: weights, reserved memory and
KV budget per GPU for an engine, block size and max_num_batched_tokens, sliding-window groups).
When the per-operation latency model (issue 9) lands: replace ``step_work``/``StepModel.time`` with its
per-scheduler-step time function (what it needs: time of a step given decode batch, summed decode context,
prefill tokens and their attended keys, sampled sequences; for tp/pp/ep with communication and launch floors).
Nothing else in the capacity planner reads plan.py or roofline.py. Pure math: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from tfcalc.calc.memory import activation_workspace_bytes
from tfcalc.calc.plan import PlanConfig, PlanResult, check_parallelism, plan_fit, shard, stage_layers
from tfcalc.calc.roofline import (
    Efficiency,
    _comm_bytes,
    _Model,
    compute_dtype_for,
    decode_work,
    expected_distinct_experts,
    prefill_work,
)
from tfcalc.dtypes import DType, WeightPrecision, get_dtype
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec

ACTIVATION_BYTES = 2  # bf16 hidden state sent between pipeline stages


# --- (a) memory ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KvShape:
    """Which layers hold the whole context and which hold at most a window (per-sequence KV held)."""

    num_layers: int
    windows: tuple[tuple[int, int], ...] = ()  # (layer count, window) for sliding-window layers

    def held(self, context: float) -> float:
        """Layer-tokens one sequence of ``context`` tokens holds: full layers x c + sliding x min(c, window)."""
        if not self.windows:
            return self.num_layers * context
        full = self.num_layers - sum(count for count, _ in self.windows)
        return full * context + sum(count * min(context, window) for count, window in self.windows)

    def units(self, context: float) -> float:
        """KV one sequence holds, in tokens of a layer stack without windows: held(c) / layers (= c without)."""
        return self.held(context) / self.num_layers

    def causal_keys(self, start: int, count: int) -> float:
        """Sum over query positions start..start+count-1 of keys attended, over layers (window-capped)."""
        def full(n: int, window: int | None) -> int:
            if window is None or n <= window:
                return n * (n + 1) // 2
            return window * (window + 1) // 2 + (n - window) * window

        dense = self.num_layers - sum(c for c, _ in self.windows)
        total = dense * (full(start + count, None) - full(start, None))
        for layers, window in self.windows:
            total += layers * (full(start + count, window) - full(start, window))
        return float(total)


def kv_shape(spec: ModelSpec) -> KvShape:
    windows: dict[int, int] = {}
    for layer in range(spec.num_layers):
        if spec.sliding_window is not None and spec.is_sliding_layer(layer):
            windows[spec.sliding_window] = windows.get(spec.sliding_window, 0) + 1
    return KvShape(num_layers=spec.num_layers, windows=tuple((count, w) for w, count in sorted(windows.items())))


@dataclass(frozen=True, kw_only=True)
class ReplicaMemory:
    """Memory of one replica (tp x pp GPUs) as the engine budgets it."""

    fits: bool
    reason: str
    weights_bytes_per_gpu: int
    reserved_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_capacity_tokens: int          # block-rounded tokens of KV (in KvShape.units) the replica holds
    max_sequences_at_max_len: int    # sequences of max_model_len that fit (the engine's "maximum concurrency")
    block_size: int


def replica_memory(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, *, tp: int,
                   pp: int, ep: int, max_model_len: int, max_num_batched_tokens: int,
                   gpu_memory_utilization: float, block_size: int, runtime_overhead_bytes: int) -> ReplicaMemory:
    """plan_fit's budget for one replica at context max_model_len; KV capacity = blocks x block size per GPU.

    plan_fit runs once per (model, layout, weight format) at a reference capacity, chunk and a bf16 cache; other
    KV formats rescale the KV bytes (2 bytes per bf16 element, exact), other capacities and chunk sizes change
    only the reserved memory, capacity x (1 - utilization) + runtime overhead + the activation
    workspace of one chunk (plan.py's formula, re-applied here; tests/calc/test_serving_inputs.py checks the
    result against a direct plan_fit call so that a change to plan.py cannot go unnoticed).
    """
    base = _plan_reference(spec, precision, tp, pp, ep, max_model_len, gpu_memory_utilization, block_size,
                           runtime_overhead_bytes)
    # The reference ran with a bf16 cache (2 bytes per element, so no rounding): other formats rescale it.
    per_token = math.ceil(kv_dtype.bytes_for(base.kv_bytes_per_token_per_gpu // 2))
    per_seq = math.ceil(kv_dtype.bytes_for(base.kv_bytes_per_sequence_per_gpu // 2))
    activations = activation_workspace_bytes(spec, 1, max_num_batched_tokens, get_dtype("bf16"),
                                             max_num_batched_tokens, tp)
    reserved = round(gpu.memory_bytes * (1 - gpu_memory_utilization)) + runtime_overhead_bytes + activations
    budget = gpu.memory_bytes - base.weights_bytes_per_gpu - reserved
    blocks = max(budget, 0) // (block_size * per_token) if per_token else 0
    sequences = max(budget, 0) // per_seq if per_seq else 0
    gib = 1 << 30
    if budget <= 0:
        reason = (f"weights {base.weights_bytes_per_gpu / gib:,.2f} GiB per GPU exceed the "
                  f"{(gpu.memory_bytes - reserved) / gib:,.2f} GiB left after reserved memory")
    elif sequences < 1:
        reason = (f"KV of one sequence of {max_model_len:,} tokens needs {per_seq / gib:,.2f} GiB per GPU, "
                  f"{budget / gib:,.2f} GiB left")
    else:
        reason = f"fits: {sequences:,} sequences of {max_model_len:,} tokens"
    return ReplicaMemory(fits=budget > 0 and sequences >= 1, reason=reason,
                         weights_bytes_per_gpu=base.weights_bytes_per_gpu, reserved_bytes_per_gpu=reserved,
                         kv_budget_bytes_per_gpu=budget, kv_bytes_per_token_per_gpu=per_token,
                         kv_capacity_tokens=blocks * block_size, max_sequences_at_max_len=sequences,
                         block_size=block_size)


_REFERENCE_MEMORY = 80 << 30
_REFERENCE_CHUNK = 2048


@lru_cache(maxsize=1024)
def _plan_reference(spec: ModelSpec, precision: WeightPrecision, tp: int, pp: int, ep: int, max_model_len: int,
                    gpu_memory_utilization: float, block_size: int, runtime_overhead_bytes: int) -> PlanResult:
    gpu = GPUSpec(name="reference", memory_bytes=_REFERENCE_MEMORY, hbm_bandwidth_bytes_per_s=1.0,
                  dense_flops_per_s={"bf16": 1.0}, interconnect_bandwidth_bytes_per_s=1.0)
    cfg = PlanConfig(num_gpus=tp * pp, tp=tp, pp=pp, ep=ep, context=max_model_len, batch=1,
                     gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
                     runtime_overhead_bytes=runtime_overhead_bytes, prefill_chunk_tokens=_REFERENCE_CHUNK)
    return plan_fit(spec, gpu, precision, _BF16, cfg)


# --- (b) speed -------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StepWork:
    """FLOPs and bytes of one scheduler step on one GPU of a pipeline stage, as linear coefficients.

    flops = flops_per_token x T + flops_per_logit x S + flops_per_decode_key x Kd + flops_per_prefill_key x Kp
    bytes = weight_bytes + expert_bytes_per_distinct x E(1 - (1 - k/E)^T) + kv_bytes_per_key x (Kd + Kr)
            + bytes_per_token x T + bytes_per_logit x S
    T tokens in the step, S sequences sampled, Kd keys the decode queries attend and Kp the prefill queries
    (summed over layers), Kr prior-context keys a prefill chunk reads back.
    """

    flops_per_token: float
    flops_per_logit: float
    flops_per_decode_key: float
    flops_per_prefill_key: float
    weight_bytes: float
    expert_bytes_per_distinct: float
    num_experts: int
    experts_per_token: int
    kv_bytes_per_key: float
    bytes_per_token: float
    bytes_per_logit: float
    comm_bytes_per_token: float
    p2p_bytes_per_token: float
    compute_dtype: str
    tp: int
    pp: int
    stage_fraction: float   # layers of the largest pipeline stage / all layers
    kv: KvShape

    def flops_bytes(self, tokens: float, logits: float, decode_keys: float, prefill_keys: float,
                    read_keys: float) -> tuple[float, float]:
        flops = (self.flops_per_token * tokens + self.flops_per_logit * logits
                 + self.flops_per_decode_key * decode_keys + self.flops_per_prefill_key * prefill_keys)
        nbytes = (self.weight_bytes + self.kv_bytes_per_key * (decode_keys + read_keys) + self.bytes_per_token * tokens
                  + self.bytes_per_logit * logits)
        if self.num_experts and tokens > 0:
            nbytes += self.expert_bytes_per_distinct * expected_distinct_experts(self.num_experts,
                                                                                 self.experts_per_token, tokens)
        return flops, nbytes


def _moe_layers(spec: ModelSpec, value: float) -> dict[int, float]:
    return {layer: value for layer in range(spec.num_layers) if spec.is_moe_layer(layer)}


def step_work(spec: ModelSpec, precision: WeightPrecision, kv_dtype: DType, tp: int, pp: int = 1,
              ep: int = 1) -> StepWork:
    """Coefficients of the step-time model for one replica layout and formats (see ``probe_work``).

    The KV format changes only the KV bytes, which are linear in its bits per element: the work probed with
    a bf16 cache is rescaled (tests check this against probing with the format itself).
    """
    base = probe_work(spec, precision, _BF16, tp, pp, ep)
    if kv_dtype == _BF16:
        return base
    ratio = float(kv_dtype.bits_per_element / _BF16.bits_per_element)
    kvb = base.kv_bytes_per_key * ratio
    return replace(base, kv_bytes_per_key=kvb,
                   bytes_per_token=base.bytes_per_token + (kvb - base.kv_bytes_per_key) * spec.num_layers)


_BF16 = get_dtype("bf16")


@lru_cache(maxsize=512)
def probe_work(spec: ModelSpec, precision: WeightPrecision, kv_dtype: DType, tp: int, pp: int = 1,
               ep: int = 1) -> StepWork:
    """Coefficients of the step-time model, solved from the roofline's work functions at a few probe points.

    Decode of one sequence at context c: FLOPs = a + k_d keys(c), bytes = W + y_d + kv keys(c) (keys summed over
    layers, window caps applied), routed experts linear in the distinct count (probed by overriding it with 0
    and 1). Prefill of P tokens (P below every sliding window): FLOPs = a_t P + k_p causal(P) + (a - a_t) (the
    lm_head of its last position), bytes = W + y_t P. Two contexts and two prompt lengths give every term.
    Pipeline stages: per-layer terms scaled by the largest stage's share of the layers (the embedding and
    lm_head are charged to every stage: a small overestimate).
    """
    par = check_parallelism(spec, tp * pp, tp, pp, ep)
    flat = type(par)(tp, 1, ep, 1)
    m = _Model(spec, flat, shard(spec, flat), precision, kv_dtype)
    kv = kv_shape(spec)
    zero, one = _moe_layers(spec, 0.0), _moe_layers(spec, 1.0)
    c1, c2 = 1, 1025
    d1, d2 = decode_work(m, 1, c1, zero), decode_work(m, 1, c2, zero)
    expert_bytes = decode_work(m, 1, c1, one).bytes - d1.bytes if spec.moe is not None else 0.0
    dkeys = kv.held(c2) - kv.held(c1)
    flops_per_decode_key = (d2.flops - d1.flops) / dkeys
    kv_bytes_per_key = (d2.bytes - d1.bytes) / dkeys
    decode_seq_flops = d1.flops - kv.held(c1) * flops_per_decode_key      # linear layers + lm_head
    shortest = min((w for _, w in kv.windows), default=1 << 30)
    p1, p2 = min(16, shortest // 4 or 1), min(64, shortest)
    pre1, pre2 = prefill_work(m, 1, p1, zero), prefill_work(m, 1, p2, zero)
    x = [(float(p1 - 1), kv.causal_keys(0, p1)), (float(p2 - 1), kv.causal_keys(0, p2))]
    rhs = [pre1.flops - decode_seq_flops, pre2.flops - decode_seq_flops]
    det = x[0][0] * x[1][1] - x[0][1] * x[1][0]
    flops_per_token = (rhs[0] * x[1][1] - x[0][1] * rhs[1]) / det
    flops_per_prefill_key = (x[0][0] * rhs[1] - rhs[0] * x[1][0]) / det
    bytes_per_token = (pre2.bytes - pre1.bytes) / (p2 - p1)
    weight_bytes = pre1.bytes - bytes_per_token * p1
    bytes_per_logit = d1.bytes - weight_bytes - kv.held(c1) * kv_bytes_per_key - bytes_per_token
    flops_per_logit = decode_seq_flops - flops_per_token
    stages = stage_layers(spec.num_layers, pp)
    fraction = max(len(s) for s in stages) / spec.num_layers
    scale = fraction if pp > 1 else 1.0
    moe = spec.moe
    return StepWork(
        flops_per_token=flops_per_token * scale, flops_per_logit=flops_per_logit,
        flops_per_decode_key=flops_per_decode_key * scale, flops_per_prefill_key=flops_per_prefill_key * scale,
        weight_bytes=weight_bytes * scale, expert_bytes_per_distinct=expert_bytes * scale,
        num_experts=moe.num_experts if moe else 0, experts_per_token=moe.experts_per_token if moe else 0,
        kv_bytes_per_key=kv_bytes_per_key * scale, bytes_per_token=bytes_per_token * scale,
        bytes_per_logit=bytes_per_logit, comm_bytes_per_token=_comm_bytes(m, 1) * scale,
        p2p_bytes_per_token=float(spec.hidden_size * ACTIVATION_BYTES) if pp > 1 else 0.0,
        compute_dtype=compute_dtype_for(precision), tp=tp, pp=pp, stage_fraction=fraction, kv=kv)


@dataclass(frozen=True, kw_only=True)
class StepModel:
    """Time of one scheduler step of a replica on one GPU type (seconds), the GPU forward pass only.

    stage time = max(FLOPs / (peak x compute efficiency), bytes / (bandwidth x bandwidth efficiency))
                 + tp all-reduce bytes / (link x bandwidth efficiency) + pipeline hand-off bytes / link;
    with pp stages the batch runs as pp micro-batches, one per stage at a time (vLLM's virtual engines):
    step time = pp x stage time of a micro-batch of 1/pp of the step. CPU overheads are the serving model's.
    """

    work: StepWork
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    link_bytes_per_s: float
    compute_efficiency: float
    bandwidth_efficiency: float
    _k: tuple[float, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        w = self.work
        comm = w.comm_bytes_per_token / (self.link_bytes_per_s * self.bandwidth_efficiency) if w.tp > 1 else 0.0
        p2p = w.p2p_bytes_per_token / self.link_bytes_per_s if w.pp > 1 else 0.0
        object.__setattr__(self, "_k", (1 / (self.peak_flops_per_s * self.compute_efficiency),
                                        1 / (self.bandwidth_bytes_per_s * self.bandwidth_efficiency), comm + p2p))

    @property
    def kv(self) -> KvShape:
        return self.work.kv

    def time(self, decode_seqs: float, prefill_tokens: float, decode_keys: float, prefill_keys: float,
             read_keys: float = 0.0, logits: float | None = None, tokens_per_decode: float = 1.0) -> float:
        """Step time for ``decode_seqs`` sequences decoding ``tokens_per_decode`` tokens each (1, or k + 1 when
        verifying k speculative tokens) plus ``prefill_tokens`` prefill tokens; keys summed over layers."""
        w = self.work
        pp = w.pp
        inv_compute, inv_memory, per_token = self._k
        tokens = (decode_seqs * tokens_per_decode + prefill_tokens) / pp
        sampled = (decode_seqs * tokens_per_decode if logits is None else logits) / pp
        decode_keys *= tokens_per_decode / pp
        flops = (w.flops_per_token * tokens + w.flops_per_logit * sampled + w.flops_per_decode_key * decode_keys
                 + w.flops_per_prefill_key * prefill_keys / pp)
        nbytes = (w.weight_bytes + w.kv_bytes_per_key * (decode_keys + read_keys / pp) + w.bytes_per_token * tokens
                  + w.bytes_per_logit * sampled)
        if w.num_experts and tokens > 0:
            nbytes += w.expert_bytes_per_distinct * expected_distinct_experts(w.num_experts, w.experts_per_token,
                                                                              tokens)
        compute, memory = flops * inv_compute, nbytes * inv_memory
        return pp * ((compute if compute > memory else memory) + per_token * tokens)


    def busy_step(self, held_decode: float, keys_per_prefill_token: float, held_prefix: float,
                  tokens_per_decode: float = 1.0, extra_s: float = 0.0) -> Callable[[float, float, float], float]:
        """``time`` specialised to a serving model's steps, as a fast function of (decoding sequences, prefill
        tokens, prompts completing): each decode query attends ``held_decode`` keys, each prefill token
        ``keys_per_prefill_token``, a prefill chunk reads back ``held_prefix`` keys; ``extra_s`` is added to
        every step (a CPU overhead). Same formula as ``time``."""
        w = self.work
        pp = w.pp
        inv_pp = 1 / pp
        inv_compute, inv_memory, per_token = self._k
        fpt, fpl, fdk, fpk = w.flops_per_token, w.flops_per_logit, w.flops_per_decode_key, w.flops_per_prefill_key
        weights, kvb, bpt, bpl = w.weight_bytes, w.kv_bytes_per_key, w.bytes_per_token, w.bytes_per_logit
        experts, per_token_share, expert_bytes = w.num_experts, 0.0, w.expert_bytes_per_distinct
        if experts:
            per_token_share = 1 - w.experts_per_token / experts
        decode_keys = held_decode * tokens_per_decode * inv_pp
        prefill_keys = keys_per_prefill_token * inv_pp
        read_back = held_prefix * inv_pp

        def step(decode_seqs: float, prefill_tokens: float, completing: float) -> float:
            tokens = (decode_seqs * tokens_per_decode + prefill_tokens) * inv_pp
            sampled = (decode_seqs * tokens_per_decode + completing) * inv_pp
            keys = decode_seqs * decode_keys
            flops = fpt * tokens + fpl * sampled + fdk * keys + fpk * prefill_tokens * prefill_keys
            nbytes = weights + kvb * (keys + (read_back if prefill_tokens else 0.0)) + bpt * tokens + bpl * sampled
            if experts and tokens > 0:
                nbytes += expert_bytes * experts * (1 - per_token_share ** tokens)
            compute, memory = flops * inv_compute, nbytes * inv_memory
            return pp * ((compute if compute > memory else memory) + per_token * tokens) + extra_s

        return step


def step_model(work: StepWork, gpu: GPUSpec, efficiency: Efficiency) -> StepModel:
    """The step-time model of ``work`` on ``gpu``: prefill compute efficiency, decode bandwidth efficiency."""
    _, peak = gpu.peak_flops(work.compute_dtype)
    return StepModel(work=work, peak_flops_per_s=peak, bandwidth_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
                     link_bytes_per_s=gpu.interconnect_bandwidth_bytes_per_s,
                     compute_efficiency=efficiency.compute_prefill, bandwidth_efficiency=efficiency.bandwidth_decode)
