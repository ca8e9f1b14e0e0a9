"""The work of prefill and of one decode step: FLOPs and bytes, counted explicitly.

This is what ``tfcalc profile`` divides its measured times by (achieved FLOP/s, achieved bandwidth, MFU, MBU);
the time *estimate* is ``tfcalc.calc.latency`` (whose pure-roofline columns count the same compulsory traffic,
a test checks it). Counted per GPU of a tensor-parallel group (``make_model(..., tp)``; the profiler uses one):

- prefill of B sequences of P tokens, T = B x P: FLOPs = 2 x active linear params (embedding lookup excluded)
  x T + 2 x h x vocab x B (logits of the last position only, as engines compute them) + attention;
  bytes = weights once (for MoE: the experts the T tokens touch) + hidden-state traffic + KV written.
- attention FLOPs: per query and attended key, 2 x heads x qk_dim (QK^T) + 2 x heads x v_dim (PV); a causal
  query at position i attends min(i + 1, window) keys (i mod window + 1 on Llama 4's chunked layers). Query heads,
  not KV heads, set the FLOPs (GQA-aware); MLA prefill uses the materialised heads (qk 192, v 128), MLA decode the
  absorbed latent (kv_rank + rope, kv_rank).
- decode step at context c: bytes = every resident weight except the untied input embedding table (only the
  batch's B rows are gathered) with, for MoE, the distinct routed experts per layer (measured, or under uniform
  routing E x (1 - (1 - k/E)^B)) instead of all E + KV read (B x sum over layers of the c, min(c, window) or
  (c - 1) mod chunk + 1 tokens its query attends) + KV
  written + fp32 logits + hidden states; FLOPs = 2 x active linear params x B + attention + lm_head.
- DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): a query's MLA attends min(i + 1, top-k) keys (decode:
  min(c, top-k) latents read, in FlashMLA's fp8 record where the cache is 8-bit); each layer with its own indexer
  adds 2 x indexer heads x its head_dim FLOPs per query and cached key (every causal pair) and reads, writes its keys
  as the engines store them (``kv_cache.indexer_key_bytes``; the bundled decoder keeps them in the model dtype).
- Gated DeltaNet layers (Qwen3-Next, Qwen3.5) attend nothing and cache no tokens: their recurrence costs
  ``kernels.gated_delta_rule``'s FLOPs, and each sequence's conv and recurrent states are read and written once per
  step (prefill or decode).
Pure math: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from tfcalc.calc import kernels
from tfcalc.calc.kv_cache import indexer_key_bytes, keys_attended, keys_read, kv_layer_bytes, state_dtypes, tokens_held
from tfcalc.calc.params import mixer_free_norms
from tfcalc.calc.plan import Shard, check_parallelism, param_bytes, shard
from tfcalc.calc.shard import attention_ranks, check_weight_blocks, dtype_bytes, latent_dtype
from tfcalc.dtypes import DType, WeightPrecision
from tfcalc.errors import SpecError
from tfcalc.spec.model import ModelSpec

ACTIVATION_BYTES = 2  # bf16 hidden states


@dataclass(frozen=True, kw_only=True)
class Model:
    """A model in some weight and KV formats, with its per-component shapes (``tfcalc.calc.plan.shard``)."""

    spec: ModelSpec
    sh: Shard
    precision: WeightPrecision
    kv_dtype: DType


def _attention_flops_per_key(m: Model, decode: bool, sliding: bool = True) -> int:
    """Q.K and P.V FLOPs per key on this GPU: 2 x heads x (head_dim + value_head_dim), that layer kind's (Gemma 4's
    full layers' own; MiMo-V2-Flash's values narrower than its keys); MLA's absorbed or expanded dims."""
    spec, heads = m.spec, m.sh.query_heads
    if spec.mla is not None:
        mla = spec.mla
        if decode:  # absorbed: scores over kv_rank + rope, values over kv_rank
            return 2 * heads * (mla.kv_lora_rank + mla.qk_rope_head_dim) + 2 * heads * mla.kv_lora_rank
        return 2 * heads * mla.qk_head_dim + 2 * heads * mla.v_head_dim
    shape = spec.layer_kind_spec(sliding)
    return 2 * heads * shape.head_kv_elements


def _kv_elements(m: Model, layer: int) -> int:
    """One token's cache elements in ``layer`` on this GPU (a full layer of Gemma 4: its own)."""
    return m.sh.kv_elements if m.spec.is_sliding_layer(layer) else m.sh.full_kv_elements


def _layer_linear(m: Model, layer: int, tokens: float, distinct_experts: float | None = None
                  ) -> tuple[Fraction, Fraction]:
    """(weight elements touched per token on this GPU, weight bytes read for ``tokens`` tokens) of one layer.

    ``distinct_experts`` replaces the uniform-routing expectation with a measured count (the profiler's).
    """
    sh, spec, p = m.sh, m.spec, m.precision
    if not spec.has_mixer(layer):  # Nemotron-H's MLP and MoE blocks: their norm only
        elements, read = Fraction(0), param_bytes(mixer_free_norms(spec), p, "norms")
    elif spec.is_linear_layer(layer):
        elements = Fraction(sh.linear_attention.matrix)
        read = param_bytes(sh.linear_attention, p, "attention") + param_bytes(sh.linear_norms, p, "norms")
    else:
        attention, norms = (sh.attention, sh.norms) if spec.is_sliding_layer(layer) else (sh.full_attention,
                                                                                          sh.full_norms)
        elements = Fraction(attention.matrix)
        read = param_bytes(attention, p, "attention") + param_bytes(norms, p, "norms")
        if spec.sparse_indexer is not None and layer in spec.sparse_indexer.layers:  # DSA: its own indexer
            elements += sh.indexer.matrix
            read += param_bytes(sh.indexer, p, "attention")
    if spec.is_moe_layer(layer):
        moe = spec.moe
        assert moe is not None
        elements += (sh.experts_active * sh.expert.matrix + sh.shared_experts.matrix + sh.router.matrix
                     + sh.latent.matrix)
        slots = sh.expert_slots or moe.num_experts  # EPLB's replicas: the picks spread over every slot
        distinct = (kernels.distinct_experts(slots, moe.experts_per_token, tokens)
                    if distinct_experts is None else distinct_experts)
        resident_share = Fraction(sh.experts_resident, slots)
        read += Fraction(distinct).limit_denominator(10**9) * resident_share * param_bytes(sh.expert, p, "experts")
        read += param_bytes(sh.shared_experts, p, "shared_experts") + param_bytes(sh.router, p, "router")
        read += dtype_bytes(sh.latent, latent_dtype(spec, p))
    if not spec.has_ffn(layer):  # Nemotron-H's Mamba-2 and attention blocks
        return elements, read
    if not spec.is_moe_layer(layer) or (spec.moe is not None and spec.moe.dense_mlp_beside):
        mlp = sh.mlp_of(spec.ffn_width(layer))
        elements += mlp.matrix
        read += param_bytes(mlp, p, "mlp")
    return elements, read


def _linear(m: Model, tokens: float, distinct_experts: dict[int, float] | None = None
            ) -> tuple[Fraction, Fraction]:
    """(per-token matmul elements over all layers, weight bytes read) excluding the embedding and lm_head."""
    elements, read = Fraction(0), Fraction(0)
    for layer in range(m.spec.num_layers):
        e, r = _layer_linear(m, layer, tokens, (distinct_experts or {}).get(layer))
        elements, read = elements + e, read + r
    return elements, read + param_bytes(m.sh.final_norm, m.precision, "norms")


def _head(m: Model, batch: int) -> tuple[int, Fraction, Fraction]:
    """(lm_head elements per GPU, lm_head bytes read, embedding bytes gathered for ``batch`` rows)."""
    sh, p, spec = m.sh, m.precision, m.spec
    head = sh.embedding if spec.tie_word_embeddings else sh.lm_head
    component = "embedding" if spec.tie_word_embeddings else "lm_head"
    gathered = Fraction(0) if spec.tie_word_embeddings else p.for_component("embedding").bytes_for(
        batch * spec.hidden_size)
    return head.matrix, param_bytes(head, p, component), gathered


def _indexer_flops_per_key(m: Model) -> float:
    """A DSA indexer's logits per query and cached key, summed over the layers that run one: 2 x heads x head_dim."""
    si = m.spec.sparse_indexer
    return 0.0 if si is None else 2.0 * si.num_heads * si.head_dim * m.spec.num_indexer_layers


def _kv_elements_held(m: Model, context: int) -> int:
    """Cache elements one sequence of ``context`` tokens holds over every layer on this GPU."""
    return sum(tokens_held(m.spec, layer, context) * _kv_elements(m, layer) for layer in range(m.spec.num_layers))


@dataclass(frozen=True, kw_only=True)
class Work:
    """FLOPs and bytes of one phase on one GPU."""

    flops: float
    bytes: float


def _recurrence(m: Model, seqs: int, tokens: int, decode: bool) -> tuple[float, float]:
    """(FLOPs, state bytes read and written) of every Gated DeltaNet layer on this GPU for ``seqs`` sequences and
    ``tokens`` tokens (``kernels.gated_delta_rule``)."""
    la, sh = m.spec.linear_attention, m.sh
    if la is None:
        return 0.0, 0.0
    heads = la.num_value_heads * sh.state_recurrent_elements // la.recurrent_state_elements
    dkdv = la.key_head_dim * la.value_head_dim
    if la.kind == "mamba2":  # kernels.mamba2_scan: per head, plus C B^T per B/C group in prefill
        groups = max(la.num_key_heads * heads // la.num_value_heads, 1)
        per_token = 4.0 * dkdv if decode else (4.0 * dkdv + 2.0 * la.chunk_size * la.value_head_dim
                                               + 2.0 * la.chunk_size * la.key_head_dim * groups / heads)
    else:
        per_token = (7.0 * dkdv if decode
                     else 6.0 * dkdv + 4.0 * kernels.GDN_CHUNK * (la.key_head_dim + la.value_head_dim))
    conv, recurrent = state_dtypes(m.spec)
    state = conv.bytes_for(sh.state_conv_elements) + recurrent.bytes_for(sh.state_recurrent_elements)
    layers = m.spec.num_linear_layers
    return layers * per_token * heads * tokens, float(layers * 2 * seqs * state)


def prefill_work(m: Model, batch: int, prompt_len: int, distinct_experts: dict[int, float] | None = None) -> Work:
    """FLOPs and bytes of the prefill of ``batch`` prompts of ``prompt_len`` tokens (see the module docstring)."""
    spec, h = m.spec, m.spec.hidden_size
    tokens = batch * prompt_len
    elements, weights_read = _linear(m, tokens, distinct_experts)
    head_elements, head_read, gathered = _head(m, tokens)
    linear_flops = 2 * float(elements) * tokens
    head_flops = 2 * head_elements * batch
    si = spec.sparse_indexer
    attention_flops = float(batch * sum(
        keys_attended(spec.sliding_window if spec.is_sliding_layer(i) else si.topk if si else None, 0, prompt_len,
                      spec.chunked_attention)
        * _attention_flops_per_key(m, False, spec.is_sliding_layer(i))
        for i in range(spec.num_layers) if not spec.is_linear_layer(i) and spec.has_mixer(i)))
    attention_flops += batch * keys_attended(None, 0, prompt_len) * _indexer_flops_per_key(m)
    recurrence_flops, states = _recurrence(m, batch, tokens, decode=False)
    flops = linear_flops + head_flops + attention_flops + recurrence_flops
    kv_written = float(m.kv_dtype.bytes_for(batch * _kv_elements_held(m, prompt_len)) if si is None
                       else tokens * (spec.num_layers * kv_layer_bytes(spec, m.kv_dtype, sliding=False)
                                      + spec.num_indexer_layers * indexer_key_bytes(spec)))
    hidden = 4 * tokens * h * ACTIVATION_BYTES * spec.num_layers
    nbytes = float(weights_read + head_read + gathered) + hidden + kv_written + states
    return Work(flops=flops, bytes=nbytes)


def decode_work(m: Model, batch: int, context: int, distinct_experts: dict[int, float] | None = None) -> Work:
    """FLOPs and bytes of one decode step of ``batch`` sequences whose cache holds ``context`` tokens (the new
    one included); ``distinct_experts`` (MoE layer -> experts touched) replaces the uniform-routing expectation."""
    spec, h = m.spec, m.spec.hidden_size
    elements, weights_read = _linear(m, batch, distinct_experts)
    head_elements, head_read, gathered = _head(m, batch)
    attention = [layer for layer in range(spec.num_layers) if not spec.is_linear_layer(layer) and spec.has_mixer(layer)]
    si = spec.sparse_indexer
    keys = {layer: min(int(keys_read(spec, layer, context)), si.topk if si else context) for layer in attention}
    attention_flops = sum(keys[i] * _attention_flops_per_key(m, True, spec.is_sliding_layer(i)) for i in attention)
    attention_flops += context * _indexer_flops_per_key(m)
    recurrence_flops, states = _recurrence(m, batch, batch, decode=True)
    flops = (2 * float(elements) * batch + 2 * head_elements * batch + float(batch * attention_flops)
             + recurrence_flops)
    if si is None:
        kv_read = float(m.kv_dtype.bytes_for(batch * sum(keys[i] * _kv_elements(m, i) for i in attention))) + states
        kv_write = float(m.kv_dtype.bytes_for(batch * sum(_kv_elements(m, i) for i in attention)))
    else:  # the latents a query attends and every indexer key, as the engines store them
        latent, key = kv_layer_bytes(spec, m.kv_dtype, sliding=False), indexer_key_bytes(spec)
        kv_read = float(batch * (sum(keys.values()) * latent + context * spec.num_indexer_layers * key))
        kv_write = float(batch * (len(attention) * latent + spec.num_indexer_layers * key))
    logits = batch * head_elements // h * 4
    hidden = 4 * batch * h * ACTIVATION_BYTES * spec.num_layers
    weights = float(weights_read + head_read + gathered)
    nbytes = weights + kv_read + kv_write + logits + hidden
    return Work(flops=flops, bytes=nbytes)


def make_model(spec: ModelSpec, precision: WeightPrecision, kv_dtype: DType, tp: int = 1, ep: int = 1) -> Model:
    """``spec`` on one GPU of a ``tp``-way tensor-parallel group (its experts over ``ep`` GPUs: ep / tp attention
    replicas when ep > tp), in the given weight and KV formats. DeepSeek-V4 is refused: the bundled decoder, whose
    work this counts, does not run its attention."""
    if spec.compressed_attention is not None:
        raise SpecError(f"{spec.name}: the profiler's work counts follow the bundled decoder, which does not run "
                        "DeepSeek-V4's compressed attention (CSA/HCA)")
    if spec.sparse_indexer is not None and spec.sparse_indexer.kind != "dsa":
        raise SpecError(f"{spec.name}: the profiler's work counts follow the bundled decoder, which does not run "
                        "MiniMax-M3's block-sparse attention (MSA)")
    par = check_parallelism(spec, tp * attention_ranks(tp, ep), tp, 1, ep)
    check_weight_blocks(spec, par, precision)
    return Model(spec=spec, sh=shard(spec, par), precision=precision, kv_dtype=kv_dtype)
