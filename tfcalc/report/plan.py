"""Plan and estimate results as rows (required columns first, exact integers for bytes), and the sentences
that explain them: the verdict, the row's note and the --explain trace, each budget term under the engine's
own name so it lines up with the engine's log. No I/O."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from tfcalc.calc.engine import (
    SGLANG_V4_PAGE,
    in_flight_tokens,
    served_precision,
    sparse_mla_raw,
    takes_kv_cache_memory,
)
from tfcalc.calc.kv_cache import (
    compressed_entry_bytes,
    compressed_indexer_bytes,
    compressor_state_bytes,
    indexer_key_bytes,
    kv_layer_bytes,
    linear_name,
    sparse_mla_record,
)
from tfcalc.calc.plan import PlanConfig, PlanResult, min_gpus, plan_fit, sglang_v4_engine_pool, v4_engine_layout
from tfcalc.calc.shard import exception_applies, layout_redundant_experts, stage_census, stage_layers
from tfcalc.dtypes import DType, WeightPrecision, get_dtype
from tfcalc.report import sweep_rows
from tfcalc.report.memory import exception_phrase
from tfcalc.spec.engine import EngineSpec, memory_model
from tfcalc.spec.gpu import GPUSpec
from tfcalc.spec.model import ModelSpec
from tfcalc.units import format_count

Row = dict[str, object]
GIB = 1 << 30
# the vLLM releases each DeepSeek-V4 grouping (kv.v4_groups) belongs to
_V4_RELEASES = {"tuple": "0.20-0.22", "packed": "0.23-0.28", "outermost": "0.29+"}


def _gib(value: float) -> str:
    return f"{value / GIB:,.2f} GiB"


def engine_label(engine: EngineSpec | None) -> str:
    return "ideal" if engine is None else engine.label


def plan_reason(spec: ModelSpec, cfg: PlanConfig, r: PlanResult) -> str:
    """One sentence: fits, or by how much and why not."""
    need = -(-cfg.batch // r.parallelism.dp)
    if r.kv_budget_bytes_per_gpu <= 0:
        text = (f"weights {_gib(r.weights_bytes_per_gpu)} and {_gib(r.reserved_bytes_per_gpu)} reserved exceed the "
                f"{_gib(r.capacity_bytes)} per GPU: short by {_gib(-r.kv_budget_bytes_per_gpu)} before any KV "
                f"cache, {_gib(r.shortfall_bytes_per_gpu)} for batch {cfg.batch:,} at context {cfg.context:,}")
    elif r.overcommit_bytes_per_gpu > 0:
        text = (f"the KV cache set ({_gib(r.kv_budget_bytes_per_gpu)}) and what the engine holds besides exceed the "
                f"{_gib(r.capacity_bytes)} per GPU by {_gib(r.overcommit_bytes_per_gpu)}: it runs out of memory "
                f"(at most {_gib(r.kv_budget_bytes_per_gpu - r.overcommit_bytes_per_gpu)} of KV cache fits)")
    elif r.fits:
        noun = "sequence" if r.max_concurrent_sequences == 1 else "sequences"
        text = f"fits: {r.max_concurrent_sequences:,} {noun} of {cfg.context:,} tokens, batch {cfg.batch:,} asked"
    elif r.max_concurrent_sequences == 0:
        text = (f"one request of {cfg.context:,} tokens needs {_gib(r.kv_bytes_per_sequence_per_gpu)} of KV per GPU, "
                f"{_gib(r.kv_budget_bytes_per_gpu)} available: short by {_gib(r.shortfall_bytes_per_gpu)} (an "
                f"engine refuses to start); context {r.max_context_at_batch:,} fits at batch {cfg.batch:,}")
    else:
        text = (f"KV for batch {cfg.batch:,} at context {cfg.context:,} needs "
                f"{_gib(r.kv_bytes_per_sequence_per_gpu * need)} per GPU, {_gib(r.kv_budget_bytes_per_gpu)} "
                f"available: short by {_gib(r.shortfall_bytes_per_gpu)}; {r.max_concurrent_sequences:,} sequences "
                f"fit, or context {r.max_context_at_batch:,} at this batch")
    if cfg.context > spec.max_context:
        text += (f"; note: context {cfg.context:,} exceeds {spec.name}'s maximum {spec.max_context:,} (the memory "
                 "figures assume the engine allows it)")
    return text


def plan_note(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, r: PlanResult) -> str:
    """What the row assumed that a reader would not guess: checkpoint formats, padding, capacity, KV layout."""
    parts = []
    if r.engine is not None and r.engine.runner:
        parts.append(f"{engine_label(r.engine)} runs {spec.architecture or 'this model'} on its {r.engine.runner} "
                     "model runner")
    if spec.checkpoint_kv_dtype is not None:
        declared = get_dtype(spec.checkpoint_kv_dtype).name
        parts.append(f"KV cache {declared} as the checkpoint declares" if kv_dtype.name == declared else
                     f"the checkpoint declares {declared} for the KV cache; this row holds {kv_dtype.name}")
    kept = [c for c in precision.kept_16_bit if not (c == "router" and spec.moe is None)
            and not (c == "lm_head" and spec.tie_word_embeddings) and not (c == "encoder" and spec.encoder is None)]
    if kept:
        parts.append(f"{', '.join(kept)} kept in bf16 as quantized checkpoints ship them")
    applied = [exception_phrase(spec, x) for x in spec.quantized_weight_exceptions
               if any(exception_applies(x, precision.for_component(c)) for c in x.components)]
    if applied:  # the preset's per-layer exceptions, counted in the weights (shard.exception_deltas)
        parts.append(f"the checkpoint also keeps {', '.join(applied)} (counted in the weights)")
    if r.mxfp4_padded_hidden:
        parts.append(f"MXFP4 experts padded to hidden {r.mxfp4_padded_hidden:,} and intermediate/GPU "
                     f"{r.mxfp4_padded_intermediate:,} (the engine's MoE kernel layout; GPUs with native FP4 pad "
                     "too in vLLM's FlashInfer path)")
    if r.state_slot_bytes_per_gpu:
        parts.append(f"{r.state_slot_bytes_per_gpu / GIB:,.2f} GiB per GPU of recurrent states allocated first, one "
                     f"for each of max_num_seqs {r.max_num_seqs:,} requests (TensorRT-LLM's MambaHybridCacheManager; "
                     "--max-num-seqs sets it)")
        most = r.state_slots_that_fit(1)
        if most is not None and r.max_concurrent_sequences == 0 and 0 < most < r.max_num_seqs:
            parts.append(f"--max-num-seqs {most:,} or fewer leaves room for one request at this context")
    headroom = r.capture_headroom_bytes
    if headroom is not None and r.cuda_graph_bytes > headroom:
        parts.append(f"the CUDA graphs ({_gib(r.cuda_graph_bytes)}, captured after the KV cache) need more than the "
                     f"{_gib(max(headroom, 0))} then free (capacity x (1 - {r.memory_fraction:g}) - startup + the "
                     "freed activation peak" + (" - the uncounted penalty state" if r.uncounted_state_bytes else "")
                     + "): capture may run out of memory; lower --gpu-memory-utilization")
    if memory_model(r.engine) is not None and not r.capacity_is_runtime:
        parts.append(f"runtime capacity of {gpu.name} unknown: nominal {_gib(r.capacity_bytes)} used")
    if r.kv_padding_layers:
        parts.append(f"KV in {r.kv_groups} groups of {r.kv_group_size} layers, {r.kv_padding_layers} padding layer(s)")
    if spec.compressed_attention is not None and r.engine is not None and r.engine.kv.v4_groups is not None:
        parts.append(f"DeepSeek-V4's caches in vLLM {_V4_RELEASES[r.engine.kv.v4_groups]}'s groups, whole on every "
                     f"GPU: {r.kv_pool_blocks_per_gpu:,} block ids, {r.kv_blocks_per_request:,} per request (its "
                     "windows reserved by the tokens in flight)")
    elif spec.compressed_attention is not None and r.engine is not None and r.engine.kv.v4_pool is not None:
        parts.append(f"DeepSeek-V4's cache in SGLang's DSV4 pools, whole on every GPU: {r.kv_tokens_per_gpu:,} "
                     f"full-token slots at {r.kv_bytes_per_token_per_gpu:,} B each (a window pool of "
                     f"{r.engine.kv.v4_pool.swa_ratio:g} x them and the compressor states included) after the fixed "
                     "HCA compressor states")
    elif spec.compressed_attention is not None:
        parts.append("DeepSeek-V4's cache at its own size on every GPU (window, compressed entries, indexer keys, "
                     "compressor states); KV tokens: at its rate past the window")
    elif r.kv_heads_per_gpu and r.kv_heads_per_gpu * r.parallelism.tp > spec.num_kv_heads:
        parts.append(f"KV heads replicated: {r.kv_heads_per_gpu} per GPU at tp {r.parallelism.tp}")
    return "; ".join(parts)


def _compressed_lines(spec: ModelSpec, kv_dtype: DType, cfg: PlanConfig, r: PlanResult) -> list[str]:
    """DeepSeek-V4's cache per GPU: one sequence's bytes at the context (its own size), the rate past the window, and
    under vLLM's groups the block ids and what a request reserves."""
    ca = spec.compressed_attention
    assert ca is not None and spec.sliding_window is not None
    entry, key = compressed_entry_bytes(spec, kv_dtype), compressed_indexer_bytes(spec, kv_dtype)
    widest = max((stage_census(spec, layers) for layers in stage_layers(spec.num_layers, r.parallelism.pp)),
                 key=lambda c: c.attention_layers)  # the stage with the most layers: its GPUs hold the most
    counts = (widest.attention_layers, widest.csa_layers, widest.hca_layers)
    lines = [f"one sequence of {cfg.context:,} tokens per GPU (DeepSeek-V4, not split by tp) = {counts[0]} "
             f"layers x {min(cfg.context, spec.sliding_window)} window entries x {float(entry):,.0f} B + "
             f"{counts[1]} CSA layers x {cfg.context // ca.csa_ratio:,} x ({float(entry):,.0f} + "
             f"{float(key):,.0f}) B + {counts[2]} HCA layers x {cfg.context // ca.hca_ratio:,} x "
             f"{float(entry):,.0f} B + compressor states {float(compressor_state_bytes(spec, counts)):,.0f} B"]
    layout = v4_engine_layout(spec, r.engine, widest, kv_dtype)
    pools = sglang_v4_engine_pool(spec, r.engine, widest, kv_dtype, r.kv_budget_bytes_per_gpu)
    if pools is not None:
        lines.append(f"SGLang's DSV4 pools: (KV budget - {_gib(pools.fixed_bytes)} of HCA compressor states) / "
                     f"{pools.bytes_per_full_token:,.2f} B per full-token slot = {pools.full_tokens:,} slots "
                     f"({SGLANG_V4_PAGE}-token pages), a window pool of {pools.swa_tokens:,} "
                     f"({pools.window_tokens_per_request} "
                     "per request at most)")
    elif layout is not None:
        lines.append(f"vLLM's groups: block ids of {layout.bytes_per_block:,} B, a request of "
                     f"{cfg.context:,} tokens checked against {r.kv_bytes_per_sequence_per_gpu:,} B "
                     f"({_gib(r.kv_bytes_per_sequence_per_gpu)}) with its windows reserved by "
                     f"{in_flight_tokens(r.engine, r.parallelism.pp, r.max_num_batched_tokens):,} tokens in flight")
    else:
        lines.append(f"KV tokens = KV budget / {r.kv_bytes_per_token_per_gpu:,} B per token past the window = "
                     f"{r.kv_tokens_per_gpu:,}")
    return lines


def plan_explain(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, cfg: PlanConfig,
                 r: PlanResult) -> tuple[str, ...]:
    """Every budget term with the engine's name for it, then the KV layout and the verdict."""
    p = r.parallelism
    e = memory_model(r.engine)  # None: the plain arithmetic (no engine, or one whose preset says budget: ideal)
    term = (e.terms if e is not None else {}).get
    if e is not None:
        described = f" ({e.display_name})"
    elif r.engine is not None:
        described = f", {r.engine.display_name}: memory by the ideal arithmetic (its preset says budget: ideal)"
    else:
        described = " (today's arithmetic)"
    lines = [f"engine: {engine_label(r.engine)}" + described
             + f"; max_num_seqs {r.max_num_seqs:,}, max_num_batched_tokens {r.max_num_batched_tokens:,}, "
             f"block_size {r.block_size}",
             f"parallelism: tp {p.tp} x pp {p.pp} x dp {p.dp} = {format_count(p.num_gpus, 'GPU')}, "
             f"ep {p.ep}"
             + (f"; layers per stage {'/'.join(map(str, r.stage_layer_counts))}" if p.pp > 1 else "")]
    cap = term("capacity", "capacity")
    lines.append(f"{cap} = {r.capacity_bytes:,} B = {_gib(r.capacity_bytes)}"
                 + (f" (runtime-reported; nominal {_gib(r.memory_bytes_per_gpu)})" if r.capacity_is_runtime else ""))
    extras = []
    if r.rotary_cache_bytes:
        extras.append(f"rotary cache {r.rotary_cache_bytes / (1 << 20):,.0f} MiB")
    if r.mla_absorbed_bytes:
        extras.append(f"MLA W_UK/W_UV {r.mla_absorbed_bytes / (1 << 20):,.0f} MiB")
    if r.vocab_rows != spec.vocab_size:
        extras.append(f"vocab padded to {r.vocab_rows:,} rows")
    weights = (f"{term('weights', 'weights')} = {r.weights_bytes_per_gpu:,} B = {_gib(r.weights_bytes_per_gpu)} "
               f"[{precision.label}" + ("; " + ", ".join(extras) if extras else "") + "]")
    if e is None:
        headroom = round(r.memory_bytes_per_gpu * (1 - r.memory_fraction))
        lines += [weights,
                  f"reserved = capacity x (1 - {r.memory_fraction}) = {headroom:,} + runtime overhead "
                  f"{cfg.runtime_overhead_bytes:,} + activations {r.activation_peak_bytes:,} (chunk "
                  f"{r.max_num_batched_tokens:,} tokens) = {r.reserved_bytes_per_gpu:,} B = "
                  f"{_gib(r.reserved_bytes_per_gpu)}",
                  f"KV budget = {r.capacity_bytes:,} - {r.weights_bytes_per_gpu:,} - {r.reserved_bytes_per_gpu:,} = "
                  f"{r.kv_budget_bytes_per_gpu:,} B = {_gib(r.kv_budget_bytes_per_gpu)}"]
    else:
        lines.append(f"{term('requested', 'requested')}: {_gib(r.requested_bytes)} (fraction {r.memory_fraction})")
        lines.append("- " + weights)
        if e.budget != "static_fraction":
            act = (f"- {term('activation', 'activation peak')} = {_gib(r.activation_peak_bytes)} = max(forward "
                   f"{_gib(r.activation_forward_bytes)}")
            act += (f", sampler {_gib(r.activation_sampler_bytes)}: {min(r.max_num_seqs, r.max_num_batched_tokens):,} "
                    f"rows x {r.vocab_rows:,} logits x {e.activation.sampler_bytes_per_logit:g} B + hidden states)"
                    if r.activation_sampler_bytes else ")")
            if r.activation_state_bytes:
                act += (f" + penalty state {_gib(r.activation_state_bytes)} ({r.max_num_seqs:,} sequences x "
                        f"{spec.vocab_size:,} x 4 B + bit mask)")
            if r.uncounted_state_bytes:
                act += (f"; the sampler's penalty state ({_gib(r.uncounted_state_bytes)}) is counted nowhere: "
                        "it takes room in the slack")
            lines += [act, f"- {term('non_torch', 'non-torch')} = {_gib(r.non_torch_bytes)} "
                           f"({'tp > 1: NCCL and all-reduce buffers' if p.tp > 1 else 'tp 1'})"]
        if r.startup_bytes and e.overheads.startup_in_budget:
            lines.append(f"- startup (CUDA context{', NCCL' if p.tp > 1 else ''}) = {_gib(r.startup_bytes)}")
        if r.state_slot_bytes_per_gpu:
            lines.append(f"- {linear_name(spec)} states for max_num_seqs {r.max_num_seqs:,} requests, allocated "
                         f"first = {_gib(r.state_slot_bytes_per_gpu)}")
        if r.cuda_graph_bytes:
            verb = "subtracted" if r.cuda_graphs_in_budget else "not subtracted (captured in the slack)"
            lines.append(f"- {term('cuda_graph', 'CUDA graphs')} = {_gib(r.cuda_graph_bytes)}, {verb}")
        if e.budget == "measured":
            m = e.sizing_margin
            assert m is not None
            lines.append(f"- sizing margin = max({_gib(m.floor_bytes)}, {m.fraction:g} x transient peak) = "
                         f"{_gib(r.sizing_margin_bytes)}, and the transient peak "
                         f"{_gib(r.activation_transient_bytes)} kept free"
                         + (f" (the peak less the {_gib(r.activation_workspace_bytes)} fused-MoE workspace kept)"
                            if r.activation_workspace_bytes else ""))
            lines.append(f"  (capacity {_gib(r.capacity_bytes)} - startup {_gib(r.startup_bytes)} - the terms above; "
                         "or requested - the terms but startup, margin and peak, if smaller)")
        if e.budget == "utilization":
            lines.append(f"  (vLLM's 'Total non KV cache memory' = weights + torch peak + non-torch = "
                         f"{_gib(r.weights_bytes_per_gpu + r.activation_peak_bytes + r.non_torch_bytes)})")
        if r.kv_set_headroom_bytes is not None:
            held = r.capacity_bytes - r.kv_budget_bytes_per_gpu - r.kv_set_headroom_bytes
            lines.append(f"= {term('kv_budget', 'KV budget')} = {r.kv_budget_bytes_per_gpu:,} B = "
                         f"{_gib(r.kv_budget_bytes_per_gpu)}, as --kv-cache-memory-bytes sets it (the terms above "
                         "do not size it)")
            lines.append(f"  held besides: startup + the terms above, CUDA graphs included = {_gib(held)}; with the KV "
                         f"cache {_gib(held + r.kv_budget_bytes_per_gpu)} of {_gib(r.capacity_bytes)}"
                         + (f": over by {_gib(r.overcommit_bytes_per_gpu)}" if r.overcommit_bytes_per_gpu else
                            f": {_gib(r.kv_set_headroom_bytes)} free"))
        else:
            lines.append(f"= {term('kv_budget', 'KV budget')} = {r.kv_budget_bytes_per_gpu:,} B = "
                         f"{_gib(r.kv_budget_bytes_per_gpu)}")
    mla = " (MLA latent, not split by tp)" if spec.mla is not None else ""
    ranges = stage_layers(spec.num_layers, p.pp)
    attention_layers = max(stage_census(spec, layers).attention_layers for layers in ranges)
    kind = "attention " if spec.linear_attention is not None else ""
    if spec.compressed_attention is not None:
        lines += _compressed_lines(spec, kv_dtype, cfg, r)
    elif spec.sparse_indexer is not None:  # DSA: the latent (or FlashMLA's fp8 record) + the indexer's keys
        in_record = not sparse_mla_raw(e, gpu)
        record = kv_layer_bytes(spec, kv_dtype, sliding=False, record=in_record)
        indexed = max(stage_census(spec, layers).indexer_layers for layers in ranges)
        lines.append(f"KV per token per GPU = {attention_layers} layers x {float(record):,.0f} B "
                     f"({'sparse fp8 record' if in_record and sparse_mla_record(spec, kv_dtype) else 'latent'}) + "
                     f"{indexed} "
                     f"indexer layers x {indexer_key_bytes(spec)} B (indexer key) = {r.kv_bytes_per_token_per_gpu:,} B"
                     f"{mla}")
    else:
        lines.append(f"KV per token per GPU = {attention_layers} {kind}layers x "
                     f"{r.kv_elements_per_token_per_layer} elements x {kv_dtype.bits_per_element} bits / 8 = "
                     f"{r.kv_bytes_per_token_per_gpu:,} B{mla}")
    if r.state_bytes_per_layer:
        linear = max(stage_census(spec, layers).linear_layers for layers in ranges)
        lines.append(f"{linear_name(spec)} state per request per GPU = {linear} layers x {r.state_bytes_per_layer:,} B "
                     "(conv + recurrent state)")
        if e is not None and e.kv.state_pool is not None and r.max_running_requests is not None:
            lines.append(f"  {e.name}'s state pool takes {e.kv.state_pool.memory_ratio:g} / "
                         f"{1 + e.kv.state_pool.memory_ratio:g} of the KV budget first: running requests at most "
                         f"{r.max_running_requests:,} (its state slots // slots per request)")
        if r.state_slot_bytes_per_gpu:
            lines.append(f"  the states of max_num_seqs {r.max_num_seqs:,} requests come first (above), none from "
                         f"the KV pool: running requests at most {r.max_num_seqs:,}")
        if r.block_size != r.block_size_asked:
            lines.append(f"  block_size raised from {r.block_size_asked} to {r.block_size}: one attention page "
                         "holds one layer's state, one page per request in each state group (vLLM)")
    groups = (f" ({r.kv_groups} groups of {r.kv_group_size} layer slots, {r.kv_padding_layers} padding)"
              if r.kv_groups > 1 else "")
    v4_groups = spec.compressed_attention is not None and e is not None and e.kv.v4_groups is not None
    logged = e is not None and e.kv.concurrency == "vllm" and e.kv.tokens == "concurrency"
    if spec.compressed_attention is None:
        lines.append(f"{'pool' if logged else term('kv_tokens', 'KV tokens')} = {r.kv_pool_blocks_per_gpu:,} blocks"
                     + (f" // {r.kv_groups} groups" if r.kv_groups > 1 else "")
                     + f" x {r.block_size} = {r.kv_pool_tokens_per_gpu:,} tokens{groups}")
    per_replica = r.max_concurrent_sequences // p.dp
    if v4_groups:
        lines.append(f"{term('concurrency', 'max sequences')} for {cfg.context:,} tokens per request = "
                     f"{r.kv_pool_blocks_per_gpu:,} block ids / {r.kv_blocks_per_request:,} per request = "
                     f"{r.kv_pool_blocks_per_gpu / r.kv_blocks_per_request:,.2f}x -> {per_replica:,} sequences; "
                     f"{term('kv_tokens', 'KV tokens')} = that x {cfg.context:,} = {r.kv_tokens_per_gpu:,}")
    elif spec.compressed_attention is not None and e is not None and e.kv.v4_pool is not None:
        pages = -(-cfg.context // SGLANG_V4_PAGE) * SGLANG_V4_PAGE
        lines.append(f"{term('concurrency', 'max sequences')} at {cfg.context:,} tokens = min({r.kv_tokens_per_gpu:,} "
                     f"slots // {pages:,}, the window pool's, {e.kv.v4_pool.max_running_requests} requests) = "
                     f"{per_replica:,} sequences")
    elif spec.compressed_attention is not None:
        lines.append(f"{term('concurrency', 'max sequences')} at {cfg.context:,} tokens = KV budget // "
                     f"{r.kv_bytes_per_sequence_per_gpu:,} B = {per_replica:,} sequences")
    elif e is not None and e.kv.concurrency == "vllm":
        lines.append(f"{term('concurrency', 'max sequences')} for {cfg.context:,} tokens per request = "
                     f"{r.kv_pool_blocks_per_gpu:,} blocks / {r.kv_blocks_per_request:,} per request = "
                     f"{r.kv_pool_blocks_per_gpu / r.kv_blocks_per_request:,.2f}x -> {per_replica:,} sequences")
        if logged:
            lines.append(f"{term('kv_tokens', 'KV tokens')} = that x {cfg.context:,} = {r.kv_tokens_per_gpu:,}")
    else:
        lines.append(f"{term('concurrency', 'max sequences')} at {cfg.context:,} tokens = {per_replica:,} sequences")
    lines.append(f"max sequences = {p.dp} replica(s) x {per_replica:,} = {r.max_concurrent_sequences:,} "
                 f"(window-aware: {r.max_concurrent_sequences_window_aware:,})")
    if r.kv_budget_bytes_per_gpu_ideal is not None:
        lines.append(f"ideal arithmetic beside it: KV budget {_gib(r.kv_budget_bytes_per_gpu_ideal)}, "
                     f"{r.max_concurrent_sequences_ideal:,} sequences")
    lines.append(f"max context at batch {cfg.batch:,} = {r.max_context_at_batch:,} "
                 f"(capped at {max(spec.max_context, cfg.context):,})")
    note = plan_note(spec, gpu, precision, kv_dtype, r)
    if note:
        lines.append(f"note: {note}")
    lines.append(plan_reason(spec, cfg, r))
    return tuple(lines)


def _plan_row(spec: ModelSpec, gpu: GPUSpec, precision: WeightPrecision, kv_dtype: DType, cfg: PlanConfig,
              r: PlanResult) -> Row:
    p = r.parallelism
    return {
        "model": spec.name, "gpu": gpu.name, "engine": engine_label(r.engine), "num_gpus": p.num_gpus, "tp": p.tp,
        "pp": p.pp, "context": cfg.context, "batch": cfg.batch, "weights_dtype": precision.label,
        "kv_dtype": kv_dtype.name, "weights_bytes_per_gpu": r.weights_bytes_per_gpu,
        "kv_budget_bytes_per_gpu": r.kv_budget_bytes_per_gpu, "kv_tokens_per_gpu": r.kv_tokens_per_gpu,
        "max_concurrent_sequences": r.max_concurrent_sequences, "max_context_at_batch": r.max_context_at_batch,
        "fits": r.fits,
        "capacity_bytes": r.capacity_bytes, "non_torch_bytes": r.non_torch_bytes,
        "activation_peak_bytes": r.activation_peak_bytes, "cuda_graph_bytes": r.cuda_graph_bytes,
        "cuda_graphs_in_budget": r.cuda_graphs_in_budget, "startup_bytes": r.startup_bytes,
        "reserved_bytes_per_gpu": r.reserved_bytes_per_gpu, "kv_bytes_per_token_per_gpu": r.kv_bytes_per_token_per_gpu,
        "kv_bytes_per_sequence_per_gpu": r.kv_bytes_per_sequence_per_gpu, "kv_blocks_per_gpu": r.kv_blocks_per_gpu,
        "kv_pool_blocks_per_gpu": r.kv_pool_blocks_per_gpu, "kv_groups": r.kv_groups,
        "max_concurrent_sequences_window_aware": r.max_concurrent_sequences_window_aware,
        "kv_budget_bytes_per_gpu_ideal": r.kv_budget_bytes_per_gpu_ideal,
        "max_concurrent_sequences_ideal": r.max_concurrent_sequences_ideal,
        "weights_bytes_per_gpu_ideal": r.weights_bytes_per_gpu_ideal,
        "engine_display_name": r.engine.display_name if r.engine is not None else "ideal arithmetic",
        "model_runner": r.engine.runner if r.engine is not None and r.engine.runner else None,
        "ep": p.ep, "dp": p.dp, **({"redundant_experts": p.redundant_experts} if p.redundant_experts else {}),
        "gpu_memory_bytes": r.memory_bytes_per_gpu, "memory_fraction": r.memory_fraction,
        "block_size": r.block_size, "max_num_seqs": r.max_num_seqs, "max_num_batched_tokens": r.max_num_batched_tokens,
        "runtime_overhead_bytes_per_gpu": cfg.runtime_overhead_bytes if memory_model(r.engine) is None else None,
        "shortfall_bytes_per_gpu": r.shortfall_bytes_per_gpu, "note": plan_note(spec, gpu, precision, kv_dtype, r),
        "reason": plan_reason(spec, cfg, r),
    }


@dataclass(frozen=True, kw_only=True)
class PlanSweep:
    """The lists a plan sweeps over (empty: the default); every combination is one row."""

    num_gpus: list[int]
    tps: list[int]
    pps: list[int]
    eps: list[int]
    contexts: list[int]
    batches: list[int]
    precisions: list[WeightPrecision]
    kv_dtypes: list[DType]
    engines: list[EngineSpec | None]
    utilizations: list[float]
    block_sizes: list[int]
    max_num_seqs: list[int]
    max_num_batched_tokens: list[int]
    runtime_overheads: list[int]
    cuda_graphs_in_budget: bool | None = None
    kv_cache_memory_bytes: int | None = None   # vLLM's set KV cache, for the engines that take one
    find_min_gpus: bool = False
    max_gpus: int = 512
    gpus_per_node: int = 8
    redundant_experts: int = 0   # EPLB's replicas, on the layouts with whole experts per GPU


def plan_rows(specs: list[ModelSpec], gpus: list[GPUSpec], sweep: PlanSweep
              ) -> tuple[list[Row], list[tuple[str, ...]]]:
    """One row per combination (sweeps multiply) and its --explain trace; with ``find_min_gpus`` the GPU count
    is searched over the layouts ``candidate_layouts`` allows (``tps`` / ``pps``, when given, restrict them)."""
    pairs = list(iter_plan_rows(specs, gpus, sweep))
    return [row for row, _ in pairs], [trace for _, trace in pairs]


def plan_row_count(specs: list[ModelSpec], gpus: list[GPUSpec], sweep: PlanSweep) -> int:
    """How many rows ``plan_rows`` makes: every list multiplies (an empty one counts 1), but ``find_min_gpus``
    makes one row per configuration whatever ``tps`` / ``pps`` allow."""
    w = sweep
    lists = [specs, gpus, w.precisions, w.kv_dtypes, w.contexts, w.batches, w.engines, w.utilizations, w.block_sizes,
             w.max_num_seqs, w.max_num_batched_tokens, w.runtime_overheads]
    if not w.find_min_gpus:
        lists += [w.num_gpus, w.tps, w.pps, w.eps]
    return sweep_rows(*lists)


def iter_plan_rows(specs: list[ModelSpec], gpus: list[GPUSpec], sweep: PlanSweep
                   ) -> Iterator[tuple[Row, tuple[str, ...]]]:
    """``plan_rows``' (row, trace) pairs one at a time (a sweep stopped part-way keeps the rows made)."""
    from tfcalc.calc.kv_cache import default_kv_dtype
    from tfcalc.errors import UsageError

    w = sweep
    if w.find_min_gpus and (w.num_gpus or any(ep != 1 for ep in w.eps)):
        raise UsageError("--min-gpus searches the GPU count: drop --num-gpus (and --ep: an MoE model's layouts are "
                         "tried with ep 1 and ep = tp)")
    for spec, gpu in itertools.product(specs, gpus):
        for precision, kv, context, batch, engine, util, block, seqs, mnbt, overhead in itertools.product(
                w.precisions or [None], w.kv_dtypes or [None],
                w.contexts or [spec.max_context], w.batches or [1], w.engines or [None], w.utilizations or [None],
                w.block_sizes or [None], w.max_num_seqs or [None], w.max_num_batched_tokens or [None],
                w.runtime_overheads or [None]):
            precision = precision or served_precision(spec, engine)
            kv_dtype = kv or default_kv_dtype(spec, engine, gpu)
            base = PlanConfig(num_gpus=1, context=context, batch=batch, engine=engine, gpu_memory_utilization=util,
                              block_size=block, max_num_seqs=seqs, max_num_batched_tokens=mnbt,
                              cuda_graphs_in_budget=w.cuda_graphs_in_budget,
                              kv_cache_memory_bytes=w.kv_cache_memory_bytes if takes_kv_cache_memory(engine) else None,
                              **({} if overhead is None else {"runtime_overhead_bytes": overhead}))
            if w.find_min_gpus:
                r = min_gpus(spec, gpu, precision, kv_dtype, base, w.max_gpus, w.gpus_per_node, w.tps or None,
                             w.pps or None)
                if r is None:
                    raise UsageError(f"{spec.name} batch {batch:,} at context {context:,} does not fit on up to "
                                     f"{w.max_gpus:,} x {gpu.name} ({precision.label}, KV {kv_dtype.name}, "
                                     f"{engine_label(engine)})")
                cfg = replace(base, num_gpus=r.parallelism.num_gpus, tp=r.parallelism.tp, pp=r.parallelism.pp,
                              ep=r.parallelism.ep)
                line = f"--min-gpus: {r.parallelism.num_gpus} is the smallest GPU count that fits with " + (
                    f"tp in {w.tps or 'any'}, pp in {w.pps or 'any'}" if w.tps or w.pps else
                    f"tp within a node of {w.gpus_per_node}, pp only across whole nodes")
                yield (_plan_row(spec, gpu, precision, kv_dtype, cfg, r),
                       (line, *plan_explain(spec, gpu, precision, kv_dtype, cfg, r)))
                continue
            for n, tp, pp, ep in itertools.product(w.num_gpus or [0], w.tps or [0], w.pps or [1], w.eps or [1]):
                if not n:
                    n = (tp or 1) * pp
                if not tp and n % pp:
                    raise UsageError(f"pp {pp} does not divide the GPU count {n}")
                cfg = replace(base, num_gpus=n, tp=tp or n // pp, pp=pp, ep=ep,
                              redundant_experts=layout_redundant_experts(w.redundant_experts, tp or n // pp, ep))
                try:
                    r = plan_fit(spec, gpu, precision, kv_dtype, cfg)
                except UsageError as exc:  # the tp the user never typed: say where it came from
                    if tp or not w.num_gpus:
                        raise
                    raise UsageError(f"--num-gpus {n} means tp {cfg.tp} x pp {pp} (tp = GPUs / pp when --tp is not "
                                     f"given): {exc}; give --tp and --pp") from None
                yield _plan_row(spec, gpu, precision, kv_dtype, cfg, r), plan_explain(spec, gpu, precision, kv_dtype,
                                                                                      cfg, r)


def memory_by_context(specs: list[ModelSpec], gpus: list[GPUSpec], row: Row, precisions: list[WeightPrecision],
                      kv_dtypes: list[DType], engines: list[EngineSpec | None]
                      ) -> tuple[str, list[tuple[str, list[int], list[int]]], list[tuple[str, int]]]:
    """What ``plan --plot`` draws for the layout of ``row`` (the first row): (title, one series of (label,
    contexts, bytes per GPU = weights + reserved + the batch's KV) per weight and KV format, each GPU's
    (name, capacity bytes))."""
    from tfcalc.calc.kv_cache import default_kv_dtype

    spec = next(s for s in specs if s.name == row["model"])
    gpu = next(g for g in gpus if g.name == row["gpu"])
    batch = int(str(row["batch"]))
    engine = next((e for e in engines or [] if engine_label(e) == row["engine"]), None)
    contexts = sorted({int(2 ** (i / 2)) for i in range(20, 2 * max(spec.max_context, 1 << 10).bit_length() - 1)})
    number = {key: int(str(row[key])) for key in ("num_gpus", "tp", "pp", "ep", "block_size", "max_num_seqs",
                                                  "max_num_batched_tokens")}
    overhead = ({} if memory_model(engine) is not None else
                {"runtime_overhead_bytes": int(str(row["runtime_overhead_bytes_per_gpu"]))})
    series = []
    for precision in precisions or [served_precision(spec, engine)]:
        for kv in kv_dtypes or [default_kv_dtype(spec, engine, gpu)]:
            values = []
            for context in contexts:
                cfg = PlanConfig(num_gpus=number["num_gpus"], tp=number["tp"], pp=number["pp"], ep=number["ep"],
                                 context=context, batch=batch, engine=engine,
                                 gpu_memory_utilization=float(str(row["memory_fraction"])),
                                 block_size=number["block_size"], max_num_seqs=number["max_num_seqs"],
                                 max_num_batched_tokens=number["max_num_batched_tokens"], **overhead)
                r = plan_fit(spec, gpu, precision, kv, cfg)
                values.append(r.weights_bytes_per_gpu + r.reserved_bytes_per_gpu
                              + -(-batch // r.parallelism.dp) * r.kv_bytes_per_sequence_per_gpu)
            series.append((f"weights {precision.label}, KV {kv.name}", contexts, values))
    title = (f"{spec.name} on {row['num_gpus']} x {gpu.name} (tp {row['tp']}, pp {row['pp']}), batch {batch}")
    return title, series, [(g.name, g.memory_bytes) for g in gpus]
