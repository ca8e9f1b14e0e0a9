"""``estimate`` results as rows (exact numbers) and the sentences that explain them (``--explain``, notes). No I/O."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache

from tfcalc.calc.engine import recurrent_state_rule, served_precision, sparse_mla_raw
from tfcalc.calc.kernels import (
    UNIFORM,
    Rates,
    Routing,
    distinct_experts,
    moe_expert_matrix_bytes,
    moe_fused_fp8_rows,
    moe_large_expert_slowdown,
    moe_untuned,
)
from tfcalc.calc.kv_cache import mean_keys
from tfcalc.calc.latency import (
    FLASH_MAX_HEAD_DIM,
    GROUPS,
    Deployment,
    LatencyEstimate,
    PhaseTime,
    StepShape,
    deployment,
    dispatch_bytes,
    estimate_latency,
    float_kind,
    turning_point_batch,
)
from tfcalc.calc.plan import PlanConfig, PlanResult, plan_fit
from tfcalc.calc.shard import layout_redundant_experts
from tfcalc.dtypes import DType, WeightPrecision
from tfcalc.report.plan import engine_label
from tfcalc.spec.engine import EngineKernels, EngineSpec, limit_for_gpus
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.interconnect import Interconnect
from tfcalc.spec.model import ModelSpec
from tfcalc.units import format_count, format_seconds

Row = dict[str, object]
GROUP_LABELS = {"attention": "attention", "dense_ffn": "dense FFN", "moe": "MoE", "lm_head": "embedding + lm_head",
                "communication": "communication"}


@dataclass(frozen=True, kw_only=True)
class EstimateOptions:
    """Everything besides the swept lists: engine, fabric, dtype choices and rate overrides per GPU.

    ``engine``: the engine version (None: ``--engine ideal``, the plain memory arithmetic and ``EngineKernels()``);
    its ``kernels`` time the steps and its memory model decides ``fits``, with ``memory`` holding plan's flags
    (gpu_memory_utilization, block_size, max_num_seqs, max_num_batched_tokens, ...; the parallelism, context
    and batch are filled in per row) -- the same verdict ``tfcalc plan`` gives for the same flags.
    """

    engine: EngineSpec | None
    memory: PlanConfig = PlanConfig(num_gpus=1)
    interconnect: Interconnect | None = None
    inter_node: Interconnect | None = None
    gpus_per_node: int = 8
    algorithm: str | None = None
    compute: str = "auto"
    cuda_graphs: bool | None = None
    routing: Routing = UNIFORM
    fp8_scales: str = "auto"  # per-tensor fp8 input scaling: auto, static, dynamic (latency.fp8_input_scale)
    ideal: bool = False
    fit: bool = True
    rates: Callable[[GPUSpec, Rates, str], Rates] | None = None  # (gpu, preset rates, phase) -> rates used
    rates_source: str = ""


@dataclass(frozen=True, kw_only=True)
class EstimateSweep:
    """The lists an estimate sweeps over per model and GPU (empty formats: the model's own); every combination is
    one row."""

    tps: list[int]
    pps: list[int]
    eps: list[int]
    batches: list[int]
    prompt_lens: list[int]
    gen_lens: list[int]
    precisions: list[WeightPrecision] = field(default_factory=list)
    kv_dtypes: list[DType] = field(default_factory=list)


@lru_cache(maxsize=4096)
def _fit(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, memory: PlanConfig, tp: int,
         pp: int, ep: int, dp: int, context: int, batch: int) -> PlanResult:
    """``plan``'s verdict for ``batch`` sequences of ``context`` tokens (read-only use of its API)."""
    return plan_fit(spec, gpu, precision, kv_dtype, replace(memory, num_gpus=tp * pp * dp, tp=tp, pp=pp, ep=ep,
                                                            context=context, batch=batch), with_ideal=False)


def fit_columns(d: Deployment, memory: PlanConfig, batch: int, context: int, longest: int) -> Row:
    """Does ``batch`` at ``context`` fit? ``plan`` at the sweep's longest context answers most rows at once: the
    sequences that fit only grow as the context shrinks, so a batch within that count fits at every shorter context
    too, and weights that overflow overflow everywhere. Only the rest ask ``plan`` at their own context."""
    memory = replace(memory, redundant_experts=d.dims.expert_slots - d.dims.experts)
    key = (d.spec, d.gpu, d.precision, d.kv_dtype, memory, d.tp, d.pp, d.ep, d.dp)
    fit = _fit(*key, longest, 1)
    exact = context == longest or fit.kv_budget_bytes_per_gpu <= 0
    if not exact and batch > fit.max_concurrent_sequences:
        fit, exact = _fit(*key, context, 1), True
    fits = fit.kv_budget_bytes_per_gpu > 0 and fit.max_concurrent_sequences >= batch
    return {"fits": fits, "max_concurrent_sequences": fit.max_concurrent_sequences if exact else None,
            "kv_budget_bytes_per_gpu": fit.kv_budget_bytes_per_gpu,
            "weights_bytes_per_gpu": fit.weights_bytes_per_gpu}


# The swept choices a sentence about one row names when they differ between the rows (else the table says them once)
_LABELS = {"engine": "engine", "weights_dtype": "weights", "kv_dtype": "KV", "compute_dtype": "compute"}


def varying_keys(rows: list[Row]) -> tuple[str, ...]:
    """The keys of ``_LABELS`` whose values differ between ``rows``."""
    return tuple(k for k in _LABELS if len({str(row.get(k)) for row in rows}) > 1)


def row_choices(row: Row, keys: tuple[str, ...]) -> str:
    """", weights nvfp4, KV fp8_e4m3" for ``keys``: what tells this row apart from the others of its sweep."""
    return "".join(f", {_LABELS[k]} {row.get(k)}" for k in keys)


def fit_sentence(row: Row, keys: tuple[str, ...] = ()) -> str:
    """Why a row does not fit (the numbers come from ``plan``); ``keys``: the swept choices that tell it apart."""
    where = (f"{row['model']} on {row['num_gpus']} x {row['gpu']} (tp {row['tp']}, pp {row['pp']}, ep {row['ep']}"
             f"{row_choices(row, keys)}), batch {row['batch']:,} at context {row['context']:,}")
    budget = int(str(row["kv_budget_bytes_per_gpu"]))
    if budget <= 0:
        return (f"{where}: does not fit -- the weights alone leave no room for the KV cache "
                f"(short by {-budget / (1 << 30):,.2f} GiB per GPU); the times assume it did")
    return (f"{where}: does not fit -- only {row['max_concurrent_sequences']:,} sequences of this context do; "
            "the times assume the whole batch did")


def dequant_sentence(row: Row, gpu: GPUSpec) -> str:
    """Why fp8 / fp4 weights compute in bf16 here: the GPU has no tensor cores of that kind (fp8 before Ada and
    Hopper, fp4 before Blackwell), so its GEMMs read the small weights and dequantise them (weight-only, W8A16 /
    W4A16); "" where the row runs natively or the format is mixed (one label per component)."""
    weights = str(row.get("weights_dtype", ""))
    kind = float_kind(weights)
    if not kind or row.get("compute_dtype") != "bf16" or kind in gpu.dense_flops_per_s:
        return ""
    return (f"note: {weights} weights on {gpu.name}: it has no {kind} tensor cores, so the GEMMs run in bf16 on "
            f"weights dequantised as they load (W{kind[-1]}A16): the memory saving stays, the {kind} compute peak "
            "does not apply")


def _groups(prefix: str, phase: PhaseTime) -> Row:
    row: Row = {}
    for g in GROUPS:
        row[f"{prefix}_{g}_s"] = phase.step.groups[g].seconds
    row[f"{prefix}_floors_s"] = sum(v.floor_seconds for v in phase.step.groups.values())
    return row


def limiter(phase: PhaseTime) -> str:
    """What the latency model says most of the phase's time goes to: 'kernel floors', or a group's bound."""
    groups = phase.step.groups
    floors = sum(v.floor_seconds for v in groups.values())
    total = phase.step.seconds or 1.0
    if floors >= total / 2:
        return "kernel floors"
    top = max(GROUPS, key=lambda g: groups[g].seconds - groups[g].floor_seconds)
    return f"{groups[top].bound} ({GROUP_LABELS[top]})"


def estimate_row(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, e: LatencyEstimate,
                 d: Deployment, options: EstimateOptions, fit: Row | None = None) -> Row:
    pre, dec = e.prefill, e.decode
    ideal = options.ideal
    ttft, tpot = (e.ttft_s_ideal, e.tpot_s_ideal) if ideal else (e.ttft_s, e.tpot_s)
    e2e = e.e2e_s_ideal if ideal else e.e2e_s
    r = d.rates_prefill
    compute = d.dims.attn.compute
    peak = r.peak(compute)[1]
    row: Row = {
        "model": spec.name, "gpu": gpu.name, "tp": d.tp, "batch": e.batch, "prompt_len": e.prompt_len,
        "gen_len": e.gen_len, "prefill_flops": round(pre.step.flops * pre.microbatches),
        "ttft_s": ttft, "ttft_s_ideal": e.ttft_s_ideal, "decode_bytes_per_step": round(dec.step.ideal_bytes),
        "tpot_s": tpot, "tpot_s_ideal": e.tpot_s_ideal, "decode_tokens_per_s": e.batch / tpot,
        "decode_tokens_per_s_ideal": e.decode_tokens_per_s_ideal,
        "prefill_bound": pre.step.bound, "decode_bound": dec.step.bound,
        "pp": d.pp, "ep": d.ep, "dp": d.dp, "num_gpus": d.num_gpus, "engine": engine_label(options.engine),
        **({"redundant_experts": d.dims.expert_slots - d.dims.experts} if options.memory.redundant_experts else {}),
        "weights_dtype": precision.label, "kv_dtype": kv_dtype.name, "compute_dtype": compute,
        "e2e_s": e2e, "e2e_s_ideal": e.e2e_s_ideal, "decode_tokens_per_s_per_seq": 1 / tpot,
        "decode_tokens_per_s_per_seq_ideal": e.decode_tokens_per_s_per_seq_ideal,
        "prefill_limited_by": "pure roofline" if ideal else limiter(pre),
        "decode_limited_by": "pure roofline" if ideal else limiter(dec),
        "prefill_bytes": round(pre.step.ideal_bytes * pre.microbatches),
        "decode_flops_per_step": round(dec.step.flops), "decode_traffic_bytes_per_step": round(dec.step.bytes),
        "decode_weight_bytes_per_step": round(dec.step.weight_bytes),
        "decode_kv_bytes_per_step": round(dec.step.kv_read_bytes), "decode_context": e.decode_context,
        "prefill_arithmetic_intensity": pre.step.flops / pre.step.ideal_bytes if pre.step.ideal_bytes else None,
        "decode_arithmetic_intensity": dec.step.flops / dec.step.ideal_bytes if dec.step.ideal_bytes else None,
        "ridge_flops_per_byte": peak / r.memory_bandwidth,
        **_groups("prefill", pre), **_groups("decode", dec),
        "prefill_tp_comm_s": pre.step.tp_comm_seconds, "prefill_ep_comm_s": pre.step.ep_comm_seconds,
        "prefill_pp_s": pre.pp_seconds, "decode_tp_comm_s": dec.step.tp_comm_seconds,
        "decode_ep_comm_s": dec.step.ep_comm_seconds, "decode_pp_s": dec.pp_seconds,
        "pipeline_microbatches": dec.microbatches, "decode_bubble_fraction": dec.bubble_fraction,
        "prefill_allreduce_s": pre.step.tp_comm_seconds, "decode_allreduce_s": dec.step.tp_comm_seconds,
        "peak_flops_per_s": peak, "hbm_bandwidth_bytes_per_s": r.memory_bandwidth,
        "gemm_efficiency": r.gemm_efficiency.get(compute), "memory_efficiency": r.memory_efficiency,
        "efficiency_source": options.rates_source or r.source,
        "context": e.prompt_len + e.gen_len, "fits": None,
    }
    if fit is not None:
        row.update(fit)
    return row


def _gemm_streaming(r: Rates) -> str:
    """The per-format GEMM streaming fractions the rates apply (none when ideal or calibrated), for the rates line."""
    if r.ideal or r.bandwidth_points or not r.gemm_memory_efficiency:
        return ""
    return " (GEMM weights " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(r.gemm_memory_efficiency.items())) + ")"


def estimate_rows(specs: list[ModelSpec], gpus: list[GPUSpec], sweep: EstimateSweep, options: EstimateOptions
                  ) -> tuple[list[Row], list[tuple[LatencyEstimate, Deployment]]]:
    """One row per combination, and the estimate behind each (``explain_lines`` turns one into text on demand)."""
    pairs = list(iter_estimate_rows(specs, gpus, sweep, options))
    return [row for row, _ in pairs], [handle for _, handle in pairs]


def iter_estimate_rows(specs: list[ModelSpec], gpus: list[GPUSpec], sweep: EstimateSweep, options: EstimateOptions
                       ) -> Iterator[tuple[Row, tuple[LatencyEstimate, Deployment]]]:
    """``estimate_rows``' (row, estimate) pairs one at a time (a sweep stopped part-way keeps the rows made)."""
    from tfcalc.calc.kv_cache import default_kv_dtype
    from tfcalc.calc.latency import rates_for

    memory = replace(options.memory, engine=options.engine)
    for spec, gpu in itertools.product(specs, gpus):
        for precision, kv_dtype, tp, pp, ep in itertools.product(
                sweep.precisions or [served_precision(spec, options.engine)],
                sweep.kv_dtypes or [default_kv_dtype(spec, options.engine, gpu)], sweep.tps, sweep.pps, sweep.eps):
            kernels = options.engine.kernels if options.engine is not None else EngineKernels()
            base = rates_for(gpu, kernels, options.cuda_graphs, spec.architecture, has_experts=spec.moe is not None)
            prefill_rates = options.rates(gpu, base, "prefill") if options.rates else None
            decode_rates = options.rates(gpu, base, "decode") if options.rates else None
            redundant = layout_redundant_experts(options.memory.redundant_experts, tp, ep)
            d = deployment(spec, gpu, precision, kv_dtype, tp=tp, pp=pp, ep=ep, engine_kernels=kernels,
                           interconnect=options.interconnect, inter_node=options.inter_node,
                           gpus_per_node=options.gpus_per_node, algorithm=options.algorithm,
                           compute=options.compute, cuda_graphs=options.cuda_graphs, rates_prefill=prefill_rates,
                           rates_decode=decode_rates, routing=options.routing, fp8_scales=options.fp8_scales,
                           redundant_experts=redundant, raw_sparse_latent=sparse_mla_raw(options.engine, gpu),
                           recurrent_state_rule=recurrent_state_rule(options.engine))
            longest = max(sweep.prompt_lens) + max(sweep.gen_lens)
            for batch, prompt, gen in itertools.product(sweep.batches, sweep.prompt_lens, sweep.gen_lens):
                e = estimate_latency(d, batch, prompt, gen)
                fit = fit_columns(d, memory, batch, prompt + gen, longest) if options.fit else None
                row = estimate_row(spec, gpu, precision, kv_dtype, e, d, options, fit)
                row["decode_turning_point_batch"] = turning_point_batch(d, e.decode_context)
                yield row, (e, d)


def _graphs_text(d: Deployment, r: Rates) -> str:
    """Which steps replay CUDA graphs (``Deployment.captured``'s rule) and what the others pay."""
    eager = f"eager launches >= {format_seconds(r.launch_s)}"
    if not r.cuda_graphs:
        return eager
    if d.kernels.graph_prefill and d.graph_cap_tokens is None:
        return "CUDA graphs"
    scope = "steps" if d.kernels.graph_prefill else "decode-only steps"
    cap = f" of <= {d.graph_cap_tokens:,} tokens" if d.graph_cap_tokens is not None else ""
    return f"CUDA graphs for {scope}{cap}, other steps {eager}"


def _phase_lines(name: str, label: str, phase: PhaseTime, d: Deployment) -> list[str]:
    step = phase.step
    total = sum(g.seconds for g in step.groups.values()) or 1.0
    lines = [f"{name}: {label} {format_seconds(phase.seconds)} (pure roofline {format_seconds(phase.seconds_ideal)}); "
             f"per microbatch through {d.pp} stage(s): {format_seconds(step.seconds)}, {phase.microbatches} "
             "microbatch(es)",
             f"  {'op group':<22}{'time':>11}{'share':>7}{'fixed':>11}  bound"]
    for g in GROUPS:
        t = step.groups[g]
        if t.seconds == 0:
            continue
        lines.append(f"  {GROUP_LABELS[g]:<22}{format_seconds(t.seconds):>11}{t.seconds / total:>7.0%}"
                     f"{format_seconds(t.floor_seconds):>11}  {t.bound}")
    floors = sum(t.floor_seconds for t in step.groups.values())
    lines.append(f"  {'floors (in the above)':<22}{format_seconds(floors):>11}{floors / total:>7.0%}"
                 "             fixed costs, counted above")
    return lines


def explain_lines(e: LatencyEstimate, d: Deployment) -> tuple[str, ...]:
    """The op-group breakdown of both phases, each parallelism's cost, and the work accounting."""
    spec, dm = d.spec, d.dims
    pre, dec = e.prefill, e.decode
    lines = [f"prefill: batch {e.batch} x prompt {e.prompt_len:,} tokens; decode: batch {e.batch} at the mean "
             f"context {e.decode_context:,} = prompt + gen/2 (TPOT averaged over the {max(e.gen_len - 1, 0)} steps)"]
    lines += _phase_lines("prefill", "TTFT", pre, d)
    lines += _phase_lines("decode", "TPOT", dec, d)
    step = dec.step
    lines.append(f"decode: bytes per GPU per step = weights {step.weight_bytes:.4g} + KV read {step.kv_read_bytes:.4g}"
                 f" + activations, logits, cache writes {step.bytes - step.weight_bytes - step.kv_read_bytes:.4g} "
                 f"= {step.bytes:.4g}; FLOPs {step.flops:.4g}")
    if spec.chunked_attention and spec.sliding_window is not None:
        chunk = spec.sliding_window
        keys = mean_keys(chunk, e.decode_context, e.gen_len, True)  # as the estimate's decode step prices them
        lines.append(f"chunked local attention: {spec.num_sliding_layers} of {spec.num_layers} layers attend within "
                     f"{chunk:,}-token chunks (each prefill chunk a causal attention of its own); their decode query "
                     f"reads {keys:,.0f} keys on average over the generation, the other layers "
                     f"{e.decode_context:,}")
    if spec.mla is None and spec.value_head_dim != spec.head_dim:
        lines.append(f"values: heads of {spec.value_head_dim} beside keys of {spec.head_dim} (v_head_dim), "
                     "cached and multiplied at their own width")
    if spec.full_attention is not None:
        fa, rates = spec.full_attention, d.rates_prefill
        lines.append(f"global layers: {spec.num_full_layers} of {spec.num_layers} with heads of {fa.head_dim} over "
                     f"{fa.num_kv_heads} KV heads (the others {spec.head_dim} over {spec.num_kv_heads}), each priced "
                     "with its own shape")
        if d.widest_head_dim > FLASH_MAX_HEAD_DIM and rates.wide_head_prefill_scale is not None:
            lines.append(f"prefill attention: heads of {d.widest_head_dim} exceed FlashAttention's "
                         f"{FLASH_MAX_HEAD_DIM}: the engine's fallback (Triton) kernel, "
                         f"{rates.wide_head_prefill_scale:g} x the flash time of the whole causal triangle")
    if spec.moe is not None:
        moe = spec.moe
        tokens = -(-e.batch // d.dp) * d.dp
        slots, k = dm.expert_slots, moe.experts_per_token   # E: the experts and EPLB's redundant replicas
        uniform = slots * (1 - (1 - k / slots) ** tokens)
        other = ""
        if d.routing != UNIFORM:
            routed = distinct_experts(slots, k, tokens, d.routing)
            other = f" under uniform routing; {routed:.3f} under {d.routing} routing"
        replicas = f" ({moe.num_experts} + {slots - moe.num_experts} redundant)" if slots > moe.num_experts else ""
        lines.append(f"decode: routed experts read per MoE layer (all GPUs of the group): E x (1 - (1 - k/E)^B) = "
                     f"{slots}{replicas} x (1 - (1 - {k}/{slots})^{tokens}) = {uniform:.3f}{other}"
                     + f"; each GPU holds {format_count(dm.experts_local, 'expert')} of width "
                     f"{dm.expert_width:g}")
        rates, fmt, width = d.rates_decode, dm.experts_mode.weights, int(dm.expert_width) or 1
        if fmt in rates.moe_tuned_shapes:
            shape = f"{dm.experts_local} x {width} ({fmt}, local experts x per-rank width)"
            if moe_untuned(rates, fmt, dm.experts_local, width):
                k0 = f", K0 {rates.moe_untuned_k0:g}" if rates.moe_untuned_k0 else ""
                lines.append(f"fused MoE: the engine ships no tuned kernel config for {shape} on {rates.name}: its "
                             f"default tiles, {rates.moe_untuned_efficiency[fmt]:.2f} of a dense GEMM{k0}")
            else:
                lines.append(f"fused MoE: the engine ships a tuned kernel config for {shape} on {rates.name}")
        if fmt in rates.moe_weight_stream:
            lines.append(f"fused MoE: the engine's kernel for {spec.architecture or 'this model'} on {rates.name} "
                         f"streams its experts' weights at {rates.moe_weight_stream[fmt]:.2f} of the datasheet "
                         f"bandwidth whatever the tokens ({fmt}; its tactics untuned)")
        if moe_fused_fp8_rows(rates, dm.experts_mode.compute, fmt):
            lines.append(f"fused MoE: the engine's {fmt} kernel on {rates.name} passes 8-bit rows between its GEMMs, "
                         "the activation fused into the first")
        if fmt in rates.moe_large_expert:
            matrix = moe_expert_matrix_bytes(rates, fmt, spec.hidden_size, (2 if dm.gated else 1) * width,
                                             dm.experts_mode.bits)
            slowdown = moe_large_expert_slowdown(rates, fmt, matrix)
            limit = rates.moe_large_expert[fmt][0] / 2**20
            held = (f", held at {rates.moe_stream_bits[fmt]:g} bits" if fmt in rates.moe_stream_bits else "")
            lines.append(f"fused MoE: one expert's gate/up matrix holds {matrix / 2**20:,.0f} MiB per GPU "
                         f"({fmt}{held}); the engine's kernel on {rates.name} slows down past {limit:g} MiB: "
                         + (f"its grouped GEMMs take {slowdown:.2f}x as long" if slowdown > 1 else "not here"))
    k = d.kernels
    if dm.shared_width and (k.shared_experts_stream_max_tokens or k.shared_experts_stream_in_graphs):
        rule = " and ".join(([f"steps of <= {k.shared_experts_stream_max_tokens:,} tokens"]
                             if k.shared_experts_stream_max_tokens else [])
                            + (["steps replayed from CUDA graphs"] if k.shared_experts_stream_in_graphs else []))
        shape = StepShape(decode_seqs=-(-e.batch // d.dp), decode_context=e.decode_context)
        here = "decode here: yes" if d.shared_experts_beside_routed(shape, d.rates_decode) else "decode here: no"
        lines.append(f"shared experts on a second CUDA stream beside the router and routed experts in {rule} "
                     f"({here}): the two paths last max(either, their summed work)")
    scaled = sorted({m.weights for m in (dm.attn, dm.mlp, dm.shared, dm.head) if m.dynamic_scale})
    if scaled:
        lines.append(f"{'/'.join(scaled)} linears scale their inputs dynamically (a max reduction before each GEMM, "
                     f">= {format_seconds(d.rates_decode.dynamic_scale_floor())}; --fp8-scales static for a "
                     "calibrated checkpoint)")
    domain = f" across {d.nvlink_domain} GPUs" if d.nvlink_domain > d.gpus_per_node else ""
    lines.append(f"parallelism: tp {d.tp} x pp {d.pp} x dp {d.dp} = {format_count(d.num_gpus, 'GPU')}, "
                 f"ep {d.ep}; "
                 f"fabric {d.intra.display_name}{domain}, {d.algorithm} all-reduce"
                 + (", engine one-/two-shot custom all-reduce below 8 MiB" if d.kernels.custom_allreduce
                    and d.intra.custom_allreduce is not None else ""))
    own = d.kernels.custom_allreduce_two_shot.get(d.intra.name) if d.intra.custom_allreduce is not None else None
    below = limit_for_gpus(own.below_bytes, d.tp) if own is not None else 0.0
    if own is not None and below and d.kernels.custom_allreduce and d.tp > 1:
        lines.append(f"the engine's own two-shot kernel on {d.intra.name} below {below / 2 ** 20:g} MiB at tp "
                     f"{d.tp} ({format_seconds(own.latency_s)} + {format_seconds(own.latency_s_per_peer)} per peer), "
                     "symmetric memory above")
    if d.tp > 1:
        sync = d.fabric(d.tp).forward_sync_s_per_peer
        norms = " + one of tokens x 2 x 4 B (the q and k norms' statistics)" if dm.qk_norm_across_heads else ""
        lines.append(f"tp: 2 all-reduces per layer of tokens x {dm.h} x 2 B{norms} (+ the embedding's, logits "
                     "gathered): "
                     f"prefill {format_seconds(pre.step.tp_comm_seconds)}, decode "
                     f"{format_seconds(dec.step.tp_comm_seconds)} per step"
                     + (f"; each pays {format_seconds(sync)} x {d.tp - 1} peers for the ranks meeting inside the "
                        "forward" if sync else ""))
    else:
        lines.append("tp 1: no all-reduce")
    if d.dp > 1:
        fabric = (d.intra.display_name if d.ep <= d.nvlink_domain else
                  f"{d.intra.display_name} within {d.nvlink_domain} GPUs, {d.inter.display_name} beyond")
        lines.append(f"ep {d.ep} over {d.dp} attention replicas: dispatch ({dispatch_bytes(dm.experts_mode):g} B a "
                     f"value) + combine (2 B) of tokens x top-k x {dm.moe_latent or dm.h} per MoE layer over "
                     f"{fabric}: prefill {format_seconds(pre.step.ep_comm_seconds)}, decode "
                     f"{format_seconds(dec.step.ep_comm_seconds)} per step")
    elif d.ep > 1:
        lines.append(f"ep {d.ep} <= tp {d.tp}: experts split over the tp group, combined by its all-reduce")
    if d.pp > 1:
        lines.append(f"pp {d.pp}: {pre.microbatches} prefill / {dec.microbatches} decode microbatch(es); "
                     f"send per stage boundary {format_seconds(dec.step.p2p_seconds)}; sends + bubble add "
                     f"{format_seconds(pre.pp_seconds)} to TTFT and {format_seconds(dec.pp_seconds)} to TPOT; decode "
                     f"stages idle {dec.bubble_fraction:.0%} of the time")
    r = d.rates_decode
    floors = ", ".join(f"{k} {format_seconds(v)}" for k, v in sorted(r.floors.items()))
    floors += "".join(f", moe {v * 1e9:.0f} ns per local {k} expert" for k, v in sorted(r.moe_expert_floors.items()))
    floors += "".join(f", moe ({k} experts) {format_seconds(v)}" for k, v in sorted(r.moe_format_floors.items()))
    if d.ep > 1:
        floors += "".join(f", moe ({k} experts) under ep +{format_seconds(v)}"
                          for k, v in sorted(r.moe_ep_floors.items()))
    graphs = _graphs_text(d, r)
    moe = (", ".join(f"{k} {v:.2f}" for k, v in sorted(r.moe_efficiency_by_dtype.items()))
           or f"{r.moe_efficiency:.2f}")
    gemm = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.gemm_efficiency.items()))
    if r.gemm_efficiency_by_format and not r.ideal:
        gemm += " (by weight format: " + ", ".join(f"{k} {v:.2f}"
                                                   for k, v in sorted(r.gemm_efficiency_by_format.items())) + ")"
    lines.append(f"rates: {r.source}; GEMM {gemm} of peak x K/(K + K0); attention {r.attention_efficiency:.2f}; "
                 f"MoE {moe} of dense; HBM {r.memory_efficiency:.2f}{_gemm_streaming(r)}; floors {floors}; {graphs}")
    if d.deepep_moe is not None and not r.ideal:
        k = d.deepep_moe
        lines.append("decode-only steps: the experts behind DeepEP run the engine's own kernel there (" + "; ".join(
            f"{fmt}: MoE {eff:.2f} of dense"
            + (f", weights at {k.memory_efficiency[fmt]:.2f} of HBM" if fmt in k.memory_efficiency else "")
            + (f", fixed {format_seconds(k.floors_s[fmt])}" if fmt in k.floors_s else "")
            for fmt, eff in sorted(k.efficiency.items())) + ")")
    return tuple(lines)
