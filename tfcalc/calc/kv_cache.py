"""KV-cache sizes for MHA / GQA / MQA, DeepSeek MLA and sliding-window layers.

MHA/GQA/MQA: each layer caches K and V, 2 x kv_heads x head_dim elements per token
(Shazeer 2019 MQA, arXiv:1911.02150; Ainslie et al. 2023 GQA, arXiv:2305.13245); kv_heads x (head_dim +
value_head_dim) where values are narrower than keys (MiMo-V2-Flash).
MLA: each layer caches the compressed latent plus the shared RoPE key, kv_lora_rank + qk_rope_head_dim
elements per token (DeepSeek-V2, arXiv:2405.04434 sec. 2.1.2), as DeepSeek and vLLM serve it.
A sliding-window layer holds at most ``sliding_window`` tokens (Mistral 7B, arXiv:2310.06825 sec. 2); a chunked
local-attention layer (Llama 4) the tokens of its current chunk, at most ``sliding_window`` too (vLLM
ChunkedLocalAttentionManager frees the blocks of earlier chunks).
A Gated DeltaNet layer (Qwen3-Next, Qwen3.5) caches no tokens: each sequence holds a fixed state instead, its conv's
last conv_kernel - 1 rows and one key_head_dim x value_head_dim matrix per value head (arXiv:2412.06464; vLLM
MambaStateShapeCalculator.gated_delta_net_state_shape), whatever the context.
DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) adds its indexer's key to every indexed layer, head_dim fp8 values
and one fp32 scale per 128 (132 B: vLLM DeepseekV32IndexerCache, SGLang NSATokenToKVPool, TensorRT-LLM
DSACacheManager), and an 8-bit cache stores the latent as FlashMLA's sparse record: kv_lora_rank fp8 values, one fp32
scale per 128 of them and the RoPE key in bf16 (656 B for DeepSeek-V3.2's 512 + 64).
DeepSeek-V4 caches one K=V entry of head_dim per token of its 128-token window on every layer, plus one compressed
entry per 4 tokens on a CSA layer (with the indexer's compressed key) and per 128 on an HCA layer (DeepSeek-V4
sec. 2.3); each sequence also keeps its compressors' unfinished windows in fp32 (vLLM CompressorStateCache). An 8-bit
cache stores an entry as FlashMLA's record: the non-RoPE part fp8 with an E8M0 scale per 64, the RoPE part bf16,
one pad byte (584 B for 448 + 64; vLLM DeepseekV4MultiHeadLatentAttentionWrapper head_bytes).
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING

from tfcalc.dtypes import DType, get_dtype, parse_weight_precision
from tfcalc.spec.model import ModelSpec

if TYPE_CHECKING:
    from tfcalc.spec.engine import EngineSpec
    from tfcalc.spec.gpu import GPUSpec


def kv_elements_per_token_per_layer(spec: ModelSpec, sliding: bool = True) -> int:
    """kv_heads x (head_dim + value_head_dim) (2 x kv_heads x head_dim where K and V are as wide; MiMo-V2-Flash's
    values are narrower, cached at their own width: vLLM FlashAttentionDiffKV), or kv_lora_rank + qk_rope_head_dim
    for MLA; a full layer of Gemma 4 (``sliding`` false) with its own KV heads and head_dim (K and V cached apart
    even where V comes from the k projection)."""
    if spec.mla is not None:
        return spec.mla.latent_elements_per_token_per_layer
    shape = spec.layer_kind_spec(sliding)
    return shape.num_kv_heads * shape.head_kv_elements


SCALE_BLOCK = 128  # values per fp32 scale in DSA's fp8 indexer keys and fp8 latent records


MSA_KEY_BYTES = 2  # MiniMax-M3's index keys: bf16, as transformers' MiniMaxM3VLSparseCacheLayer holds idx_keys


def indexer_key_bytes(spec: ModelSpec) -> int:
    """Bytes one token adds to one indexed layer's indexer cache: DSA's head_dim fp8 + 4 per 128 (132); MiniMax-M3's
    head_dim in bf16 (256, whatever the K/V format: no engine's layout for it is known here); 0 without an indexer."""
    si = spec.sparse_indexer
    if si is not None and si.kind == "minimax_m3":
        return si.head_dim * MSA_KEY_BYTES
    return 0 if si is None else si.head_dim + si.head_dim // SCALE_BLOCK * 4


def sparse_mla_record(spec: ModelSpec, kv_dtype: DType) -> Fraction | None:
    """FlashMLA's fp8 sparse record where a DSA model's cache is 8-bit: kv_lora_rank + kv_lora_rank / 128 x 4 +
    2 x qk_rope_head_dim bytes (656; vLLM fp8_ds_mla, SGLang nsa_kv_cache_store_fp8); None otherwise."""
    if spec.sparse_indexer is None or spec.mla is None or kv_dtype.bits_per_element != 8:
        return None
    m = spec.mla
    return Fraction(m.kv_lora_rank + -(-m.kv_lora_rank // SCALE_BLOCK) * 4 + 2 * m.qk_rope_head_dim)


V4_SCALE_BLOCK = 64  # non-RoPE values per E8M0 scale in DeepSeek-V4's fp8 entries


def compressed_entry_bytes(spec: ModelSpec, kv_dtype: DType) -> Fraction:
    """One cached DeepSeek-V4 entry (a window token or a compressed one) of its K=V head: at 8 bits (head_dim - rope)
    fp8 + (head_dim - rope) / 64 scales + rope x 2 bf16 + 1 pad byte (584), else head_dim x bytes/element."""
    if kv_dtype.bits_per_element != 8:
        return kv_dtype.bytes_for(spec.head_dim)
    nope = spec.head_dim - spec.rotary_dim
    return Fraction(nope + -(-nope // V4_SCALE_BLOCK) + 2 * spec.rotary_dim + 1)


def compressed_indexer_bytes(spec: ModelSpec, kv_dtype: DType) -> Fraction:
    """One compressed indexer key of a DeepSeek-V4 CSA layer: at 8 bits index_head_dim fp8 + an fp32 scale per 128
    (132, DSA's layout, which vLLM allocates whether it fills it with fp8 or MXFP4), else index_head_dim x bytes."""
    ca = spec.compressed_attention
    if ca is None:
        return Fraction(0)
    i = ca.index_head_dim
    return Fraction(i + -(-i // SCALE_BLOCK) * 4) if kv_dtype.bits_per_element == 8 else kv_dtype.bytes_for(i)


CompressedCounts = tuple[int, int, int]  # (layers, CSA layers, HCA layers) of a DeepSeek-V4 model or stage


def compressed_counts(spec: ModelSpec) -> CompressedCounts:
    """The whole DeepSeek-V4 model's (layers, CSA layers, HCA layers)."""
    ca = spec.compressed_attention
    assert ca is not None
    return spec.num_layers, len(ca.csa_layers), len(ca.hca_layers)


def compressed_rate(spec: ModelSpec, kv_dtype: DType, counts: CompressedCounts | None = None) -> Fraction:
    """Bytes one more token adds to a DeepSeek-V4 cache once past the window: its CSA layers' (entry + indexer key) /
    csa_ratio + its HCA layers' entry / hca_ratio (``counts``: a stage's; default the whole model's)."""
    ca = spec.compressed_attention
    assert ca is not None
    _, csa, hca = counts or compressed_counts(spec)
    entry = compressed_entry_bytes(spec, kv_dtype)
    return csa * (entry + compressed_indexer_bytes(spec, kv_dtype)) / ca.csa_ratio + hca * entry / ca.hca_ratio


def compressed_held_bytes(spec: ModelSpec, kv_dtype: DType, context: int,
                          counts: CompressedCounts | None = None) -> Fraction:
    """One sequence's DeepSeek-V4 cache at ``context`` tokens: layers x min(context, window) entries + on each CSA
    layer floor(context / csa_ratio) entries and indexer keys + on each HCA layer floor(context / hca_ratio)
    entries (``compressed_entry_bytes``, ``compressed_indexer_bytes``); the compressors' states apart. ``counts``: a
    stage's layers; default the whole model's."""
    ca = spec.compressed_attention
    assert ca is not None and spec.sliding_window is not None
    layers, csa, hca = counts or compressed_counts(spec)
    entry, key = compressed_entry_bytes(spec, kv_dtype), compressed_indexer_bytes(spec, kv_dtype)
    return (layers * min(context, spec.sliding_window) * entry + csa * (context // ca.csa_ratio) * (entry + key)
            + hca * (context // ca.hca_ratio) * entry)


def compressor_state_bytes(spec: ModelSpec, counts: CompressedCounts | None = None) -> Fraction:
    """One sequence's DeepSeek-V4 compressor states in fp32: each compressor keeps its last c x ratio tokens' kv and
    score of c x width (c = 2 on a CSA layer, whose windows overlap; 1 on an HCA layer): 8 x 2,048 x 4 B for a CSA
    layer's 512-wide compressor and 8 x 512 x 4 B for its indexer's, 128 x 1,024 x 4 B for an HCA layer's (vLLM
    CompressorStateCache: window c x ratio, state_dim 2 c width, float32); ``counts``: a stage's layers (default the
    whole model's); 0 for other models."""
    ca = spec.compressed_attention
    if ca is None:
        return Fraction(0)
    _, csa, hca = counts or compressed_counts(spec)
    d, i = spec.head_dim, ca.index_head_dim
    return Fraction(csa * 2 * ca.csa_ratio * 4 * (2 * 2 * d + 2 * 2 * i) + hca * ca.hca_ratio * 4 * 2 * d)


def kv_layer_bytes(spec: ModelSpec, kv_dtype: DType, sliding: bool = True, record: bool = True) -> Fraction:
    """Bytes one token adds to one attention layer's K/V (or latent) cache: elements x bytes/element, or the sparse
    record (``sparse_mla_record``; ``record=False``: an engine that keeps the raw latent instead); the indexer's keys
    apart (``indexer_key_bytes``)."""
    if not record:
        return kv_dtype.bytes_for(kv_elements_per_token_per_layer(spec, sliding))
    record = sparse_mla_record(spec, kv_dtype)
    return record if record is not None else kv_dtype.bytes_for(kv_elements_per_token_per_layer(spec, sliding))


def held_bytes(spec: ModelSpec, kv_dtype: DType, context: int) -> Fraction:
    """One sequence's cache of ``context`` tokens over every layer: ``held_elements`` in bytes, the sparse record
    and the indexer keys included; DeepSeek-V4's per ``compressed_held_bytes``."""
    if spec.compressed_attention is not None:
        return compressed_held_bytes(spec, kv_dtype, context)
    if spec.sparse_indexer is None:
        return kv_dtype.bytes_for(held_elements(spec, context, kv_elements_per_token_per_layer(spec),
                                                kv_elements_per_token_per_layer(spec, sliding=False)))
    return context * (spec.num_full_layers * kv_layer_bytes(spec, kv_dtype, sliding=False)
                      + spec.num_indexer_layers * indexer_key_bytes(spec))


def held_elements(spec: ModelSpec, context: int, sliding_elements: int, full_elements: int) -> int:
    """Cache elements of one sequence of ``context`` tokens over every layer: sliding layers x min(context, window) x
    their elements + full layers x context x theirs (per-layer element counts given: a whole model's or one GPU's)."""
    sliding = spec.num_sliding_layers
    window_tokens = min(context, spec.sliding_window) if sliding and spec.sliding_window is not None else 0
    return sliding * window_tokens * sliding_elements + spec.num_full_layers * context * full_elements


def kv_elements_per_token(spec: ModelSpec) -> int:
    """Elements one token adds over every attention layer: sliding x theirs + full x theirs."""
    return (spec.num_sliding_layers * kv_elements_per_token_per_layer(spec)
            + spec.num_full_layers * kv_elements_per_token_per_layer(spec, sliding=False))


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: DType) -> int:
    """Bytes one token adds to the cache if every attention layer holds it: layers x elements x bytes/element
    (Gated DeltaNet layers hold no tokens), DSA's indexer keys and sparse record included; DeepSeek-V4's: every
    layer's window entry + a CSA layer's (entry + indexer key) / csa_ratio + an HCA layer's entry / hca_ratio."""
    if spec.compressed_attention is not None:
        return math.ceil(spec.num_layers * compressed_entry_bytes(spec, kv_dtype) + compressed_rate(spec, kv_dtype))
    return math.ceil(held_bytes(spec, kv_dtype, 1) if spec.sparse_indexer is not None
                     else kv_dtype.bytes_for(kv_elements_per_token(spec)))


def tokens_held(spec: ModelSpec, layer: int, context: int) -> int:
    """min(context, window) on sliding-window and chunked layers (a chunked layer's bound on the way to
    ``context``), none on Gated DeltaNet / Mamba-2 layers and layers without a mixer, else the whole context."""
    if spec.sliding_window is not None and spec.is_sliding_layer(layer):
        return min(context, spec.sliding_window)
    return 0 if spec.is_linear_layer(layer) or not spec.has_mixer(layer) else context


def keys_attended(window: int | None, start: int | float, count: int | float, chunked: bool = False) -> float:
    """Sum over query positions i = start..start+count-1 of the keys each attends: i + 1 (causal), min(i + 1, window)
    (sliding window), i mod window + 1 (chunked: the keys of its own window-token chunk, Llama 4)."""
    def upto(n: int | float) -> float:  # positions 0..n-1
        if window is None or n <= window:
            return n * (n + 1) / 2
        if chunked:
            whole, rest = divmod(n, window)
            return whole * window * (window + 1) / 2 + rest * (rest + 1) / 2
        return window * (window + 1) / 2 + (n - window) * window

    return upto(start + count) - upto(start)


def mean_keys(window: int | None, context: float, span: float = 0.0, chunked: bool = False) -> float:
    """Keys a decode query reads at ``context`` cached tokens (its own included), averaged over contexts spread evenly
    over context +- span / 2 (``keys_attended`` over their positions; span 0: that one query's)."""
    lo, hi = max(context - span / 2, 1.0), context + span / 2
    if hi <= lo:
        return keys_attended(window, context - 1, 1, chunked) if context >= 1 else 0.0
    return keys_attended(window, lo - 1, hi - lo, chunked) / (hi - lo)


def keys_read(spec: ModelSpec, layer: int, context: int | float) -> int | float:
    """Keys the decode query of a sequence whose cache holds ``context`` tokens (its own included) reads in
    ``layer``: ``tokens_held``, but (context - 1) mod window + 1 on a chunked layer."""
    if spec.chunked_attention and spec.is_sliding_layer(layer) and spec.sliding_window is not None:
        return (context - 1) % spec.sliding_window + 1 if context >= 1 else 0
    return tokens_held(spec, layer, context)  # type: ignore[arg-type]


def linear_name(spec: ModelSpec) -> str:
    """The recurrent layers' name for people: Gated DeltaNet (Qwen3-Next, Qwen3.5), Mamba-2 (Nemotron-H) or KDA
    (Kimi Linear)."""
    la = spec.linear_attention
    return {"mamba2": "Mamba-2", "kda": "KDA"}.get(la.kind if la is not None else "", "Gated DeltaNet")


def state_dtypes(spec: ModelSpec, float32_as: str | None = None,
                 recurrent_rule: str = "checkpoint") -> tuple[DType, DType]:
    """Formats of a Gated DeltaNet layer's conv and recurrent states as vLLM keeps them: the model's float dtype
    (--mamba-cache-dtype auto; a float32 checkpoint's the 16-bit one an engine serves it in, ``float32_as``), the
    recurrent one in the checkpoint's ``mamba_ssm_dtype`` where it names one (Qwen3.5: float32; vLLM
    Qwen3_5ForConditionalGenerationConfig), else the same. ``recurrent_rule`` (an engine's ``kv.state_dtype``):
    "checkpoint" as above; "model": the model's for both (TensorRT-LLM 1.0-1.2's mamba_ssm_cache_dtype auto,
    model_loader validate_and_set_mamba_ssm_cache_dtype); "fp32": the checkpoint's, else float32 (SGLang's
    mamba2_state_dtype default)."""
    native = parse_weight_precision(spec.native_dtype).default
    conv = native if not native.quantized else get_dtype("bf16")
    if float32_as is not None and conv.name == "fp32":
        conv = get_dtype(float32_as)
    la = spec.linear_attention
    recurrent = la.recurrent_state_dtype if la is not None and recurrent_rule != "model" else None
    if recurrent is None and la is not None and recurrent_rule == "fp32":
        recurrent = "fp32"
    return conv, get_dtype(recurrent) if recurrent is not None else conv


def state_exact_bytes_per_sequence(spec: ModelSpec) -> Fraction:
    """One sequence's fixed state over every Gated DeltaNet layer: layers x (conv state x its bytes + recurrent
    state x its bytes), or DeepSeek-V4's compressor states (``compressor_state_bytes``); 0 for a model without
    them."""
    la = spec.linear_attention
    if la is None:
        return compressor_state_bytes(spec)
    conv, recurrent = state_dtypes(spec)
    return spec.num_linear_layers * (conv.bytes_for(la.conv_state_elements)
                                     + recurrent.bytes_for(la.recurrent_state_elements))


def kv_cache_exact_bytes(spec: ModelSpec, kv_dtype: DType, context: int, batch: int = 1) -> Fraction:
    """Unrounded cache bytes for ``batch`` sequences of ``context`` tokens, window caps applied per layer, the fixed
    states of Gated DeltaNet layers included."""
    return batch * (held_bytes(spec, kv_dtype, context) + state_exact_bytes_per_sequence(spec))


def kv_cache_bytes(spec: ModelSpec, kv_dtype: DType, context: int, batch: int = 1) -> int:
    """batch x (sum over layers of tokens_held(layer) x elements x bytes/element + the fixed state), rounded up."""
    return math.ceil(kv_cache_exact_bytes(spec, kv_dtype, context, batch))


def attention_variants(spec: ModelSpec) -> list[tuple[str, ModelSpec]]:
    """The same model as MHA, as configured (``spec`` itself), and as MQA, for ``--compare-attention``:
    (attention kind, variant) pairs, one per kind.

    For an MLA model the MHA variant is the materialised cache (K of qk_head_dim and V of v_head_dim per head, what
    non-absorbed MLA kernels store), then the latent as configured, then a single-head MQA cache.
    """
    if spec.compressed_attention is not None:  # one shared K=V head already: no MHA / MQA counterpart to draw
        return [(spec.attention_kind, spec)]
    if spec.mla is not None:
        m = spec.mla
        heads = spec.num_attention_heads
        mha_elements = heads * (m.qk_head_dim + m.v_head_dim)
        # An MHA cache with head_dim = (qk + v) / 2 holds exactly heads x (qk + v) elements per layer.
        mha = replace(spec, mla=None, sparse_indexer=None, num_kv_heads=heads, head_dim=mha_elements // (2 * heads))
        mqa = replace(spec, mla=None, sparse_indexer=None, num_kv_heads=1, head_dim=(m.qk_head_dim + m.v_head_dim) // 2)
        return [("MHA", mha), ("MLA", spec), ("MQA", mqa)]
    def heads(n: int | None) -> ModelSpec:  # every layer kind with n KV heads (as many as query heads: None)
        fa = spec.full_attention
        full = None if fa is None else replace(fa, num_kv_heads=n or spec.num_attention_heads)
        return replace(spec, num_kv_heads=n or spec.num_attention_heads, full_attention=full)

    variants = {"MHA": heads(None), "GQA": spec, "MQA": heads(1)}
    variants[spec.attention_kind] = spec
    return [(kind, variant) for kind, variant in variants.items() if kind != "GQA" or spec.attention_kind == "GQA"]


def default_kv_dtype(spec: ModelSpec, engine: EngineSpec | None = None, gpu: GPUSpec | None = None) -> DType:
    """The format an engine's ``--kv-cache-dtype auto`` keeps the cache in: the one the checkpoint declares
    (``spec.checkpoint_kv_dtype``) for no engine or one that follows it (``engine.kv.checkpoint_dtype``), fp8 for a
    DSA model on an engine that stores it so (``engine.kv.sparse_mla_fp8``: vLLM's fp8_ds_mla), else the model's
    float dtype (bf16 unless the checkpoint is fp16/fp32), as the engine serves it (``served_precision``: a float32
    checkpoint in 16 bits on vLLM and SGLang); fp8 for DeepSeek-V4 on any engine (its cache is FlashMLA's fp8
    record; vLLM DeepseekV4MLAAttention asserts an fp8 cache). On ``gpu`` where the engine says so
    (``kv.sparse_mla_fp8_gpus``: SGLang on compute capability 10+) a DSA model's cache is fp8 too."""
    if spec.sparse_indexer is not None and spec.sparse_indexer.kind == "dsa" and engine is not None \
            and engine.kv is not None:
        from tfcalc.calc.engine import gpu_listed

        if engine.kv.sparse_mla_fp8 or gpu_listed(engine.kv.sparse_mla_fp8_gpus, gpu):
            return get_dtype("fp8")
    if spec.compressed_attention is not None:  # DeepSeek's FlashMLA record; vLLM serves DeepSeek-V4 in nothing else
        return get_dtype("fp8")
    follows = engine is None or (engine.kv is not None and engine.kv.checkpoint_dtype)
    if spec.checkpoint_kv_dtype is not None and follows:
        return get_dtype(spec.checkpoint_kv_dtype)
    if engine is None:
        native = parse_weight_precision(spec.native_dtype).default
    else:
        from tfcalc.calc.engine import served_precision  # the engine presets' module, only when one is named

        native = served_precision(spec, engine).default
    return native if not native.quantized else get_dtype("bf16")
