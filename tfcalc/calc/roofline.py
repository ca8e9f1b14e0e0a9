"""Roofline estimates of prefill and decode, per GPU, with the formula trace behind each number.

time = max(FLOPs / peak, bytes / bandwidth) + TP all-reduce time (not overlapped). Two values per time: ideal
(100 % of the datasheet's dense peak and HBM bandwidth) and expected (peaks scaled by efficiency factors).

- prefill of B sequences of P tokens, T = B x P: FLOPs = 2 x active linear params (embedding lookup excluded)
  x T + 2 x h x vocab x B (logits of the last position only, as engines compute them) + attention;
  bytes = weights once (for MoE: the experts the T tokens touch) + hidden-state traffic + KV written.
- attention FLOPs: per query and attended key, 2 x heads x qk_dim (QK^T) + 2 x heads x v_dim (PV); a causal
  query at position i attends min(i + 1, window) keys. Query heads, not KV heads, set the FLOPs (GQA-aware);
  MLA prefill uses the materialised heads (qk 192, v 128), MLA decode the absorbed latent (kv_rank + rope, kv_rank).
- decode step at context c: bytes = every resident weight except the untied input embedding table (only the
  batch's B rows are gathered) with, for MoE, the expected distinct routed experts per layer
  E x (1 - (1 - k/E)^B) instead of all E + KV read (B x sum over layers of min(c, window) tokens) + KV written
  + fp32 logits; FLOPs = 2 x active linear params x B + attention + lm_head.
- TP: each GPU does 1/tp of the sharded work; 2 all-reduces per layer of tokens x h x 2 bytes, ring time
  2 (tp - 1) / tp x bytes / link bandwidth (one direction).
Pure math: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from tfcalc.calc.kv_cache import tokens_held
from tfcalc.calc.plan import Parallelism, Shard, check_parallelism, param_bytes, shard
from tfcalc.dtypes import DType, WeightPrecision
from tfcalc.errors import UsageError
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec

# Defaults, justified in docs/planning.md from research/perf.md:
# prefill compute: TensorRT-LLM LLaMA-7B first-token 69 % of A100 BF16 peak, DeepGEMM grouped FP8 55-66 %,
#   cuBLAS bf16 GEMM 78-81 % on an H200, FA3 75 % -> 0.6 for a whole forward pass with attention and overheads.
# decode bandwidth: vLLM / SGLang Llama-3-8B bs=1 on H100 59-70 % of datasheet HBM, megakernel 78 %,
#   mainstream engines on a 1B model <= 50 % -> 0.6.
DEFAULT_COMPUTE_EFFICIENCY = 0.6
DEFAULT_BANDWIDTH_EFFICIENCY = 0.6
ACTIVATION_BYTES = 2  # bf16 hidden states and all-reduce payloads


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak reached, per phase (1.0 = ideal roofline)."""

    compute_prefill: float = DEFAULT_COMPUTE_EFFICIENCY
    compute_decode: float = DEFAULT_COMPUTE_EFFICIENCY
    bandwidth_prefill: float = DEFAULT_BANDWIDTH_EFFICIENCY
    bandwidth_decode: float = DEFAULT_BANDWIDTH_EFFICIENCY
    source: str = "defaults (docs/planning.md)"

    def __post_init__(self) -> None:
        for name in ("compute_prefill", "compute_decode", "bandwidth_prefill", "bandwidth_decode"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise UsageError(f"efficiency {name} must be in (0, 1], got {value}")


def expected_distinct_experts(num_experts: int, experts_per_token: int, tokens: int) -> float:
    """E x (1 - (1 - k/E)^B): distinct experts a batch of B tokens touches under uniform top-k routing."""
    return num_experts * (1 - (1 - experts_per_token / num_experts) ** tokens)


@dataclass(frozen=True)
class PhaseEstimate:
    """One phase (prefill, or one decode step) on one GPU."""

    phase: str
    flops: float
    bytes: float
    comm_bytes: float
    peak_flops: float
    bandwidth: float
    compute_dtype: str
    time_compute_s: float
    time_memory_s: float
    time_comm_s: float
    time_s_ideal: float
    time_s: float
    bound: str
    trace: tuple[str, ...]

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf


def compute_dtype_for(precision: WeightPrecision) -> str:
    """The tensor-core format the matmuls run in: fp8/int8 weights run W8A8, fp4 on chips with fp4, else bf16."""
    name = precision.default.name
    if name.startswith("fp8"):
        return "fp8"
    if name in ("int8", "fp32", "fp16"):
        return name
    if name in ("mxfp4", "nvfp4"):
        return "fp4"
    return "bf16"  # bf16 and weight-only int4 (dequantised to bf16)


@dataclass(frozen=True)
class _Model:
    spec: ModelSpec
    par: Parallelism
    sh: Shard
    precision: WeightPrecision
    kv_dtype: DType


def _attention_flops_per_key(m: _Model, decode: bool) -> int:
    spec, heads = m.spec, m.sh.query_heads
    if spec.mla is not None:
        mla = spec.mla
        if decode:  # absorbed: scores over kv_rank + rope, values over kv_rank
            return 2 * heads * (mla.kv_lora_rank + mla.qk_rope_head_dim) + 2 * heads * mla.kv_lora_rank
        return 2 * heads * mla.qk_head_dim + 2 * heads * mla.v_head_dim
    return 4 * heads * spec.head_dim


def _causal_keys(window: int | None, start: int, count: int) -> int:
    """Sum over query positions start..start+count-1 of keys attended: min(i + 1, window)."""
    def full(n: int) -> int:  # sum_{i<n} (i+1) capped
        if window is None or n <= window:
            return n * (n + 1) // 2
        return window * (window + 1) // 2 + (n - window) * window

    return full(start + count) - full(start)


def _layer_linear(m: _Model, layer: int, tokens: float, distinct_experts: float | None = None
                  ) -> tuple[Fraction, Fraction]:
    """(weight elements touched per token on this GPU, weight bytes read for ``tokens`` tokens) of one layer.

    ``distinct_experts`` replaces the uniform-routing expectation with a measured count (the profiler's).
    """
    sh, spec, p = m.sh, m.spec, m.precision
    elements = Fraction(sh.attention.matrix)
    read = param_bytes(sh.attention, p, "attention") + param_bytes(sh.norms, p, "norms")
    if spec.is_moe_layer(layer):
        moe = spec.moe
        assert moe is not None
        elements += sh.experts_active * sh.expert.matrix + sh.shared_experts.matrix + sh.router.matrix
        distinct = (expected_distinct_experts(moe.num_experts, moe.experts_per_token, tokens)
                    if distinct_experts is None else distinct_experts)
        resident_share = Fraction(sh.experts_resident, moe.num_experts)
        read += Fraction(distinct).limit_denominator(10**9) * resident_share * param_bytes(sh.expert, p, "experts")
        read += param_bytes(sh.shared_experts, p, "shared_experts") + param_bytes(sh.router, p, "router")
    else:
        elements += sh.mlp.matrix
        read += param_bytes(sh.mlp, p, "mlp")
    return elements, read


def _linear(m: _Model, tokens: float, distinct_experts: dict[int, float] | None = None
            ) -> tuple[Fraction, Fraction, int]:
    """(per-token matmul elements over all layers, weight bytes read, MoE layers) excluding embedding/lm_head."""
    elements, read = Fraction(0), Fraction(0)
    for layer in range(m.spec.num_layers):
        e, r = _layer_linear(m, layer, tokens, (distinct_experts or {}).get(layer))
        elements, read = elements + e, read + r
    return elements, read + param_bytes(m.sh.final_norm, m.precision, "norms"), m.spec.num_moe_layers


def _head(m: _Model, batch: int) -> tuple[int, Fraction, Fraction]:
    """(lm_head elements per GPU, lm_head bytes read, embedding bytes gathered for ``batch`` rows)."""
    sh, p, spec = m.sh, m.precision, m.spec
    head = sh.embedding if spec.tie_word_embeddings else sh.lm_head
    component = "embedding" if spec.tie_word_embeddings else "lm_head"
    gathered = Fraction(0) if spec.tie_word_embeddings else p.for_component("embedding").bytes_for(
        batch * spec.hidden_size)
    return head.matrix, param_bytes(head, p, component), gathered


def _finish(phase: str, gpu: GPUSpec, m: _Model, flops: float, nbytes: float, comm: float, eff_c: float,
            eff_b: float, trace: list[str]) -> PhaseEstimate:
    dtype, peak = gpu.peak_flops(compute_dtype_for(m.precision))
    bw, link = gpu.hbm_bandwidth_bytes_per_s, gpu.interconnect_bandwidth_bytes_per_s
    t_c, t_m = flops / peak, nbytes / bw
    t_comm = comm / link if m.par.tp > 1 else 0.0
    ideal = max(t_c, t_m) + t_comm
    expected = max(t_c / eff_c, t_m / eff_b) + t_comm / eff_b
    bound = "compute" if t_c >= t_m else "memory"
    trace += [
        f"{phase}: compute time = {flops:.4g} FLOP / {peak:.4g} FLOP/s ({dtype} dense) = {t_c:.4g} s; memory time "
        f"= {nbytes:.4g} B / {bw:.4g} B/s = {t_m:.4g} s -> {bound}-bound (intensity {flops / nbytes:.4g} FLOP/B, "
        f"ridge {peak / bw:.4g})",
        f"{phase}: all-reduce = 2 x {m.spec.num_layers} layers x ring 2 (tp - 1)/tp x payload = {comm:.4g} B / "
        f"{link:.4g} B/s = {t_comm:.4g} s" if m.par.tp > 1 else f"{phase}: tp 1, no all-reduce",
        f"{phase}: ideal = max({t_c:.4g}, {t_m:.4g}) + {t_comm:.4g} = {ideal:.4g} s; expected = max({t_c:.4g} / "
        f"{eff_c}, {t_m:.4g} / {eff_b}) + {t_comm:.4g} / {eff_b} = {expected:.4g} s",
    ]
    return PhaseEstimate(phase, flops, nbytes, comm, peak, bw, dtype, t_c, t_m, t_comm, ideal, expected, bound,
                         tuple(trace))


def _comm_bytes(m: _Model, tokens: int) -> float:
    tp = m.par.tp
    if tp == 1:
        return 0.0
    payload = tokens * m.spec.hidden_size * ACTIVATION_BYTES
    return 2 * m.spec.num_layers * 2 * (tp - 1) / tp * payload


def _kv_tokens(m: _Model, context: int) -> int:
    return sum(tokens_held(m.spec, layer, context) for layer in range(m.spec.num_layers))


@dataclass(frozen=True)
class Work:
    """FLOPs and bytes of one phase on one GPU, with the formula trace."""

    flops: float
    bytes: float
    trace: tuple[str, ...]


def prefill_work(m: _Model, batch: int, prompt_len: int, distinct_experts: dict[int, float] | None = None) -> Work:
    """FLOPs and bytes of the prefill of ``batch`` prompts of ``prompt_len`` tokens (see the module docstring)."""
    spec, h = m.spec, m.spec.hidden_size
    tokens = batch * prompt_len
    elements, weights_read, _ = _linear(m, tokens, distinct_experts)
    head_elements, head_read, gathered = _head(m, tokens)
    linear_flops = 2 * float(elements) * tokens
    head_flops = 2 * head_elements * batch
    per_key = _attention_flops_per_key(m, decode=False)
    keys = sum(_causal_keys(spec.sliding_window if spec.is_sliding_layer(i) else None, 0, prompt_len)
               for i in range(spec.num_layers))
    attention_flops = float(batch * keys * per_key)
    flops = linear_flops + head_flops + attention_flops
    kv_written = float(m.kv_dtype.bytes_for(batch * _kv_tokens(m, prompt_len) * m.sh.kv_elements))
    hidden = 4 * tokens * h * ACTIVATION_BYTES * spec.num_layers
    nbytes = float(weights_read + head_read + gathered) + hidden + kv_written
    trace = [
        f"prefill: tokens T = batch {batch} x prompt {prompt_len} = {tokens:,}",
        f"prefill: FLOPs = 2 x {float(elements):.4g} active linear params/GPU x {tokens:,} + 2 x {head_elements:.4g} "
        f"lm_head x {batch} (last position) + attention {batch} x {keys:,} causal keys x {per_key:,} = {flops:.4g}",
        f"prefill: bytes = weights read {float(weights_read + head_read + gathered):.4g} + hidden states 4 x T x h x 2 "
        f"x layers {hidden:.4g} + KV written {kv_written:.4g} = {nbytes:.4g}",
    ]
    return Work(flops, nbytes, tuple(trace))


def prefill(m: _Model, gpu: GPUSpec, batch: int, prompt_len: int, eff: Efficiency) -> PhaseEstimate:
    work = prefill_work(m, batch, prompt_len)
    return _finish("prefill", gpu, m, work.flops, work.bytes, _comm_bytes(m, batch * prompt_len),
                   eff.compute_prefill, eff.bandwidth_prefill, list(work.trace))


def decode_work(m: _Model, batch: int, context: int, distinct_experts: dict[int, float] | None = None) -> Work:
    """FLOPs and bytes of one decode step of ``batch`` sequences whose cache holds ``context`` tokens (the new
    one included); ``distinct_experts`` (MoE layer -> experts touched) replaces the uniform-routing expectation."""
    spec, h = m.spec, m.spec.hidden_size
    elements, weights_read, _ = _linear(m, batch, distinct_experts)
    head_elements, head_read, gathered = _head(m, batch)
    per_key = _attention_flops_per_key(m, decode=True)
    kv_tokens = _kv_tokens(m, context)
    flops = 2 * float(elements) * batch + 2 * head_elements * batch + float(batch * kv_tokens * per_key)
    kv_read = float(m.kv_dtype.bytes_for(batch * kv_tokens * m.sh.kv_elements))
    kv_write = float(m.kv_dtype.bytes_for(batch * spec.num_layers * m.sh.kv_elements))
    logits = batch * head_elements // h * 4
    hidden = 4 * batch * h * ACTIVATION_BYTES * spec.num_layers
    weights = float(weights_read + head_read + gathered)
    nbytes = weights + kv_read + kv_write + logits + hidden
    experts = ""
    if spec.moe is not None and distinct_experts is not None:
        mean = sum(distinct_experts.values()) / max(len(distinct_experts), 1)
        experts = f" (routed experts read per MoE layer: measured, mean {mean:.3f})"
    elif spec.moe is not None:
        moe = spec.moe
        distinct = expected_distinct_experts(moe.num_experts, moe.experts_per_token, batch)
        experts = (f" (routed experts read per MoE layer: E x (1 - (1 - k/E)^B) = {moe.num_experts} x (1 - (1 - "
                   f"{moe.experts_per_token}/{moe.num_experts})^{batch}) = {distinct:.3f})")
    embed = ("tied embedding read once as lm_head" if spec.tie_word_embeddings
             else f"untied embedding: only {batch} rows gathered ({float(gathered):.4g} B)")
    trace = [
        f"decode: batch {batch}, context {context:,} tokens per sequence",
        f"decode: FLOPs = 2 x {float(elements):.4g} active linear params/GPU x {batch} + 2 x {head_elements:.4g} "
        f"lm_head "
        f"x {batch} + attention {batch} x {kv_tokens:,} keys x {per_key:,} = {flops:.4g}",
        f"decode: bytes = weights {weights:.4g}{experts}; {embed} + KV read {kv_read:.4g} + KV written {kv_write:.4g} "
        f"+ fp32 logits {logits:.4g} + hidden states {hidden:.4g} = {nbytes:.4g}",
    ]
    return Work(flops, nbytes, tuple(trace))


def decode_step(m: _Model, gpu: GPUSpec, batch: int, context: int, eff: Efficiency) -> PhaseEstimate:
    """One decode step of ``batch`` sequences whose cache holds ``context`` tokens (the new one included)."""
    work = decode_work(m, batch, context)
    return _finish("decode", gpu, m, work.flops, work.bytes, _comm_bytes(m, batch), eff.compute_decode,
                   eff.bandwidth_decode, list(work.trace))


@dataclass(frozen=True)
class Estimate:
    prefill: PhaseEstimate
    decode: PhaseEstimate
    decode_context: int
    batch: int
    prompt_len: int
    gen_len: int
    tp: int
    ttft_s: float
    ttft_s_ideal: float
    tpot_s: float
    tpot_s_ideal: float
    e2e_s: float
    e2e_s_ideal: float
    decode_tokens_per_s_per_seq: float
    decode_tokens_per_s_per_seq_ideal: float
    decode_tokens_per_s: float
    decode_tokens_per_s_ideal: float
    turning_point_batch: int | None
    efficiency: Efficiency
    trace: tuple[str, ...]


def make_model(spec: ModelSpec, precision: WeightPrecision, kv_dtype: DType, tp: int) -> _Model:
    par = check_parallelism(spec, tp, tp)
    return _Model(spec, par, shard(spec, par), precision, kv_dtype)


def turning_point_batch(m: _Model, gpu: GPUSpec, context: int, limit: int = 1 << 20) -> int | None:
    """Smallest decode batch whose step is compute-bound at ``context`` (ideal roofline); None below ``limit``."""
    ideal = Efficiency(1, 1, 1, 1)

    def compute_bound(b: int) -> bool:
        step = decode_step(m, gpu, b, context, ideal)
        return step.time_compute_s >= step.time_memory_s

    hi = 1
    while not compute_bound(hi):
        if hi >= limit:
            return None
        hi *= 2
    lo = hi // 2
    if lo == 0:
        return 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi


def estimate(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, tp: int, batch: int,
             prompt_len: int, gen_len: int, eff: Efficiency | None = None) -> Estimate:
    """TTFT from prefill; TPOT from a decode step at the mean context P + G/2 of the G - 1 decode steps."""
    eff = eff or Efficiency()
    m = make_model(spec, precision, kv_dtype, tp)
    pre = prefill(m, gpu, batch, prompt_len, eff)
    # Decode step j = 1..G-1 runs with P + j cached tokens (its own included): mean P + G/2 (P + 1 when G < 2).
    context = prompt_len + max(gen_len // 2, 1)
    dec = decode_step(m, gpu, batch, context, eff)
    steps = max(gen_len - 1, 0)
    turning = turning_point_batch(m, gpu, context)
    trace = (*pre.trace, *dec.trace,
             f"TTFT = prefill time; TPOT = decode step at the mean context {context:,} = P + G/2; end-to-end = TTFT + "
             f"{steps} x TPOT; tokens/s per sequence = 1 / TPOT, aggregate = batch x 1 / TPOT",
             f"decode turns compute-bound from batch {turning}" if turning else
             "decode never turns compute-bound: each sequence's KV reads keep its FLOP/byte below the ridge point",
             f"efficiency: {eff.source}")
    return Estimate(pre, dec, context, batch, prompt_len, gen_len, tp, pre.time_s, pre.time_s_ideal, dec.time_s,
                    dec.time_s_ideal, pre.time_s + steps * dec.time_s, pre.time_s_ideal + steps * dec.time_s_ideal,
                    1 / dec.time_s, 1 / dec.time_s_ideal, batch / dec.time_s, batch / dec.time_s_ideal, turning, eff,
                    trace)


def load_calibration(data: dict | list, origin: str) -> Efficiency:
    """Validate a calibration mapping (schema in docs/planning.md), or derive one from the rows of a
    ``tfcalc profile --format json`` file, into an Efficiency; one-line SpecError otherwise."""
    from tfcalc.errors import SpecError

    if isinstance(data, list):
        data = calibration_from_profile_rows(data, origin)

    allowed = {"device_name", "compute_efficiency", "bandwidth_efficiency", "source", "measured_at", "tfcalc_version",
               "notes"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SpecError(f"{origin}: unknown calibration field '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})")
    values: dict[str, float] = {}
    for kind in ("compute_efficiency", "bandwidth_efficiency"):
        block = data.get(kind)
        if not isinstance(block, dict):
            raise SpecError(f"{origin}: field '{kind}' must be a mapping {{\"prefill\": x, \"decode\": y}}")
        extra = sorted(set(block) - {"prefill", "decode"})
        if extra:
            raise SpecError(f"{origin}: unknown phase '{kind}.{extra[0]}' (use prefill and decode)")
        for phase in ("prefill", "decode"):
            value = block.get(phase)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise SpecError(f"{origin}: '{kind}.{phase}' must be a number in (0, 1], got {value!r}")
            values[f"{kind.split('_')[0]}_{phase}"] = float(value)
    device = data.get("device_name", "")
    source = f"calibration {origin}" + (f" ({device})" if device else "")
    return Efficiency(values["compute_prefill"], values["compute_decode"], values["bandwidth_prefill"],
                      values["bandwidth_decode"], source)


def calibration_from_profile_rows(rows: list[dict], origin: str = "profile rows") -> dict[str, object]:
    """Measured efficiencies for ``tfcalc estimate --calibration``: compute from prefill MFU, bandwidth from
    decode MBU (medians over ok rows), against the datasheet when a preset matched, else the measured ceilings.

    Decode is memory-bound and prefill compute-bound, so each phase measures one resource well; both phases
    take the same two factors (a decode 'compute efficiency' taken from a memory-bound step would be tiny and
    would wrongly make the roofline compute-bound).
    """
    import statistics

    from tfcalc.errors import SpecError

    ok = [r for r in rows if str(r.get("status", "")).startswith("ok")]
    if not ok:
        raise SpecError(f"{origin}: no successfully measured profile rows to calibrate from")
    datasheet = all(r.get("mfu") is not None and r.get("mbu_datasheet") is not None for r in ok)
    compute_key, bandwidth_key = ("mfu", "mbu_datasheet") if datasheet else ("mfu_measured", "mbu_measured")
    compute = statistics.median(float(str(r[compute_key])) for r in ok)
    bandwidth = statistics.median(float(str(r[bandwidth_key])) for r in ok)
    clamp = lambda value: min(max(value, 1e-6), 1.0)  # noqa: E731 - efficiencies live in (0, 1]
    return {
        "device_name": str(ok[0]["device_name"]),
        "compute_efficiency": {"prefill": clamp(compute), "decode": clamp(compute)},
        "bandwidth_efficiency": {"prefill": clamp(bandwidth), "decode": clamp(bandwidth)},
        "source": "tfcalc profile: median prefill MFU and decode MBU of "
                  f"{len(ok)} rows, against {'the datasheet peaks' if datasheet else 'the measured ceilings'}",
    }
