"""Parameter counts per component, total and active per token.

Counts follow the Hugging Face transformers implementation of each architecture weight by weight (every
matrix, bias, norm weight and attention sink; a tied embedding counted once), which a test checks against
models instantiated on the meta device. ``matrix`` elements are the quantizable weight matrices; ``vector``
elements are biases, norm weights, sinks and router score biases.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from tfcalc.dtypes import PARAM_COMPONENTS
from tfcalc.spec.model import ACTIVE_CONVENTIONS, ModelSpec


@dataclass(frozen=True, kw_only=True)
class Params:
    """Elements in weight matrices and in 1-D tensors (biases, norms, sinks)."""

    matrix: int = 0
    vector: int = 0

    @property
    def total(self) -> int:
        return self.matrix + self.vector

    def __add__(self, other: Params) -> Params:
        return Params(matrix=self.matrix + other.matrix, vector=self.vector + other.vector)

    def __mul__(self, factor: int) -> Params:
        return Params(matrix=self.matrix * factor, vector=self.vector * factor)

    __rmul__ = __mul__


@dataclass(frozen=True, kw_only=True)
class ParamCounts:
    """Per-component totals and the part of each that one token touches."""

    total: dict[str, Params]
    active: dict[str, Params]
    convention: str

    @property
    def total_params(self) -> int:
        return sum(p.total for p in self.total.values())

    @property
    def active_params(self) -> int:
        return sum(p.total for p in self.active.values())


@dataclass(frozen=True, kw_only=True)
class TPShape:
    """One component's parameters as tensor parallelism lays them out (Megatron-LM / vLLM linear layers).

    ``split`` is divided over the tp ranks (column-parallel weights and biases, row-parallel weights, per-head
    sinks, vocab-parallel tables); ``replicated`` is held whole by every rank (row-parallel output biases, norms,
    routers, MLA's q_a / kv_a down-projections); ``per_kv_head`` is one KV head's K and V projections, held for
    max(kv_heads / tp, 1) heads (replicated when tp exceeds the KV heads).
    """

    split: Params = Params()
    replicated: Params = Params()
    per_kv_head: Params = Params()

    def total(self, kv_heads: int = 0) -> Params:
        """Every parameter once: split + replicated + kv_heads x per_kv_head."""
        return self.split + self.replicated + self.per_kv_head * kv_heads

    def per_rank(self, tp: int, kv_heads_per_rank: int = 0) -> Params:
        """What one of ``tp`` ranks holds: split / tp + replicated + its KV heads."""
        return (Params(matrix=self.split.matrix // tp, vector=self.split.vector // tp) + self.replicated
                + self.per_kv_head * kv_heads_per_rank)


def _norm(spec: ModelSpec, size: int) -> Params:
    """RMSNorm has a weight of ``size``; LayerNorm a weight and a bias (a weight only without ``norm_bias``:
    Cohere's)."""
    return Params(vector=size * (2 if spec.norm_kind == "layernorm" and spec.norm_bias else 1))


def attention_modules(spec: ModelSpec) -> dict[str, TPShape]:
    """One layer's attention projections, module by module (``tfcalc.spec.model.ATTENTION_MODULES``' names; gpt-oss's
    sinks under "sinks"; norm weights excluded, see ``norm_params_per_layer``).

    GQA/MHA/MQA: q [h, nh*d] and o [nh*dv, h] split by head, k [h, d] and v [h, dv] per KV head (dv the values'
    head size, ``value_head_dim``; k only with
    ``attention_k_eq_v``; a full layer of Gemma 4: pass ``spec.full_layer_spec``); biases per
    ``qkv_bias``/``o_bias`` (o's bias replicated, it is added after the all-reduce); gpt-oss sinks: one logit per
    head; Step-3.7's per-head gate g [h, nh] (``attention_head_gate``) split by head. MLA (DeepSeek-V2 sec. 2.1):
    q_a [h, q_rank] and kv_a [h, kv_rank+rope] replicated (vLLM
    ReplicatedLinear), q_b [q_rank, nh*(nope+rope)] (or q [h, nh*(nope+rope)] without a q rank), kv_b
    [kv_rank, nh*(nope+v)] and o [nh*v, h] split by head. DeepSeek-V4 (transformers DeepseekV4Attention): q_a
    [h, q_rank] and the shared K=V head's kv [h, d], q_b [q_rank, nh*d], the grouped output projection's o_a
    (o_groups blocks of [nh*d / g, o_rank]: nh*d*o_rank) and o_b [g*o_rank, h], a sink per head; its compressors:
    ``compressor_modules``.
    """
    h, nh = spec.hidden_size, spec.num_attention_heads
    o = TPShape(replicated=Params(vector=h if spec.o_bias else 0))
    ca = spec.compressed_attention
    if ca is not None:
        d = spec.head_dim
        return {"q_a_proj": TPShape(replicated=Params(matrix=h * ca.q_lora_rank)),
                "kv_proj": TPShape(replicated=Params(matrix=h * d)),
                "q_b_proj": TPShape(split=Params(matrix=ca.q_lora_rank * nh * d)),
                "o_a_proj": TPShape(split=Params(matrix=nh * d * ca.o_lora_rank)),
                "o_b_proj": TPShape(split=Params(matrix=ca.o_groups * ca.o_lora_rank * h)),
                "sinks": TPShape(split=Params(vector=nh))}
    if spec.mla is not None:
        m = spec.mla
        q_out, kv_a_out = nh * m.qk_head_dim, m.kv_lora_rank + m.qk_rope_head_dim
        modules = {}
        if m.q_lora_rank is not None:
            modules["q_a_proj"] = TPShape(replicated=Params(matrix=h * m.q_lora_rank,
                                                            vector=m.q_lora_rank if spec.qkv_bias else 0))
            modules["q_b_proj"] = TPShape(split=Params(matrix=m.q_lora_rank * q_out))
        else:  # q_proj has no bias even when attention_bias is set (transformers DeepseekV2Attention)
            modules["q_proj"] = TPShape(split=Params(matrix=h * q_out))
        modules["kv_a_proj_with_mqa"] = TPShape(replicated=Params(matrix=h * kv_a_out,
                                                                  vector=kv_a_out if spec.qkv_bias else 0))
        modules["kv_b_proj"] = TPShape(split=Params(matrix=m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim)))
        modules["o_proj"] = TPShape(split=Params(matrix=nh * m.v_head_dim * h), replicated=o.replicated)
        if spec.attention_output_gate:  # Kimi K3's g_proj (vLLM kimi_k3 mla.py, fused into fused_qkv_a_g_proj)
            modules["g_proj"] = TPShape(split=Params(matrix=h * nh * m.v_head_dim))
        return modules
    d, dv = spec.head_dim, spec.value_head_dim
    q_out = nh * d
    gate = q_out if spec.attention_output_gate else 0  # Qwen3-Next: q_proj's second half gates the output
    per_head = Params(matrix=h * d, vector=d if spec.qkv_bias else 0)
    modules = {"q_proj": TPShape(split=Params(matrix=h * (q_out + gate), vector=q_out + gate if spec.qkv_bias else 0)),
               "k_proj": TPShape(per_kv_head=per_head)}
    if not spec.attention_k_eq_v:  # Gemma 4's full layers: values from the k projection, no v_proj
        modules["v_proj"] = TPShape(per_kv_head=Params(matrix=h * dv, vector=dv if spec.qkv_bias else 0))
    modules["o_proj"] = TPShape(split=Params(matrix=nh * dv * h), replicated=o.replicated)
    if spec.attention_head_gate:  # Step-3.7's g_proj: one gate per query head, split with the heads
        modules["g_proj"] = TPShape(split=Params(matrix=h * nh))
    if spec.attention_sinks:
        modules["sinks"] = TPShape(split=Params(vector=nh))
    return modules


def compressor_modules(spec: ModelSpec, csa: bool) -> dict[str, TPShape]:
    """One DeepSeek-V4 compressor (transformers DeepseekV4HCACompressor / DeepseekV4CSACompressor), module by module:
    kv and gate projections [h, c x d] and a position bias [ratio, c x d] (c = 2 for CSA's overlapping windows, 1
    for HCA); a CSA one's lightning indexer adds its own [h, 2 i] kv and gate, a [ratio, 2 i] bias, q_b [q_rank,
    heads x i] and weights_proj [h, heads] (i = index_head_dim). Each held whole by every rank (vLLM
    DeepseekCompressor: disable_tp); their kv norms: ``compressor_norm_params``. {} without compressed attention."""
    ca = spec.compressed_attention
    if ca is None:
        return {}
    h, d, i = spec.hidden_size, spec.head_dim, ca.index_head_dim
    c, ratio = (2, ca.csa_ratio) if csa else (1, ca.hca_ratio)
    modules = {"compressor.kv_proj": TPShape(replicated=Params(matrix=h * c * d)),
               "compressor.gate_proj": TPShape(replicated=Params(matrix=h * c * d)),
               "compressor.position_bias": TPShape(replicated=Params(vector=ratio * c * d))}
    if csa:
        modules.update({
            "indexer.kv_proj": TPShape(replicated=Params(matrix=h * 2 * i)),
            "indexer.gate_proj": TPShape(replicated=Params(matrix=h * 2 * i)),
            "indexer.position_bias": TPShape(replicated=Params(vector=ratio * 2 * i)),
            "indexer.q_b_proj": TPShape(replicated=Params(matrix=ca.q_lora_rank * ca.index_heads * i)),
            "indexer.weights_proj": TPShape(replicated=Params(matrix=h * ca.index_heads))})
    return modules


def compressor_shape(spec: ModelSpec, csa: bool) -> TPShape:
    """One DeepSeek-V4 compressor (and a CSA one's indexer): its ``compressor_modules`` summed."""
    return _summed(compressor_modules(spec, csa).values())


def compressor_norm_params(spec: ModelSpec, csa: bool) -> Params:
    """A DeepSeek-V4 compressor's RMSNorm over head_dim, and its indexer's over index_head_dim (CSA)."""
    ca = spec.compressed_attention
    if ca is None:
        return Params()
    return _norm(spec, spec.head_dim) + (_norm(spec, ca.index_head_dim) if csa else Params())


def hyper_connection_params(spec: ModelSpec) -> Params:
    """One layer's manifold-constrained hyper-connections (DeepSeek-V4, transformers DeepseekV4HyperConnection), one
    around attention and one around the FFN: each a mixing matrix [(2 + n) n, n h], its bias (2 + n) n and 3 scales
    (n = hc_mult streams). Kimi K3's attention residuals (vLLM kimi_k3 KimiDecoderLayer): the attention's and the
    FFN's RMSNorm over h and [h, 1] projection (ReplicatedLinear, quant_config None: kept 16-bit), 4h. None without
    either."""
    ca = spec.compressed_attention
    if ca is None:
        return Params(vector=4 * spec.hidden_size if spec.attention_residual_block else 0)
    n = ca.hc_mult
    return Params(matrix=(2 + n) * n * n * spec.hidden_size, vector=(2 + n) * n + 3) * 2


def hyper_head_params(spec: ModelSpec) -> Params:
    """DeepSeek-V4's final collapse of the n streams (DeepseekV4HyperHead): [n, n h], n biases and a scale; Kimi K3's
    output attention residual (vLLM KimiLinearModel output_attn_res_norm and output_attn_res_proj [h, 1]), 2h."""
    ca = spec.compressed_attention
    if ca is None:
        return Params(vector=2 * spec.hidden_size if spec.attention_residual_block else 0)
    n = ca.hc_mult
    return Params(matrix=n * n * spec.hidden_size, vector=n + 1)


def _summed(shapes: Iterable[TPShape]) -> TPShape:
    total = TPShape()
    for x in shapes:
        total = TPShape(split=total.split + x.split, replicated=total.replicated + x.replicated,
                        per_kv_head=total.per_kv_head + x.per_kv_head)
    return total


def attention_shape(spec: ModelSpec) -> TPShape:
    """One layer's attention projections (norm weights excluded, see ``norm_params_per_layer``): its
    ``attention_modules`` summed."""
    return _summed(attention_modules(spec).values())


def linear_attention_shape(spec: ModelSpec) -> TPShape:
    """One Gated DeltaNet layer (Qwen3-Next / Qwen3.5) as vLLM lays it out (qwen3_next.py): the q, k, v, z
    projections [h, 2 key_dim + 2 value_dim], the b and a projections [h, 2 x value heads], the conv taps
    (conv_dim x conv_kernel, no bias), A_log and dt_bias (one per value head) split by head; out_proj [value_dim, h]
    row-parallel. The conv taps count as vector elements: per-channel, kept 16-bit. Its gated norm: ``norms_shape``.
    KDA (Kimi Linear): q, k, v [h, 3P], b [h, heads], f_b [d, P], g_b [d, P] (or Kimi K3's g [h, P]) and o_proj
    [P, h] split, f_a and g_a [h, d] replicated; conv taps 3P x kernel, dt_bias P and A_log per head."""
    la = spec.linear_attention
    if la is None:
        return TPShape()
    h = spec.hidden_size
    if la.kind == "mamba2":  # in_proj [h, 2 d_inner + 2 groups d_state + heads]; dt_bias, A_log, D per head
        in_out = h * (2 * la.value_dim + 2 * la.key_dim + la.num_value_heads)
        vector = (la.conv_dim * la.conv_kernel + (la.conv_dim if la.conv_bias else 0) + 3 * la.num_value_heads
                  + (in_out // h if la.proj_bias else 0))
        return TPShape(split=Params(matrix=in_out + la.value_dim * h, vector=vector),
                       replicated=Params(vector=h if la.proj_bias else 0))
    if la.kind == "kda":  # vLLM kimi_gdn_linear_attn.py: f_a and g_a ReplicatedLinear, the rest split by head
        d, p = la.key_head_dim, la.value_dim
        gate = h * p if la.full_rank_gate else d * p  # full-rank g [h, P] (Kimi K3), else g_b [d, P] after g_a
        return TPShape(split=Params(matrix=h * 3 * p + d * p + h * la.num_value_heads + gate + p * h,
                                    vector=la.conv_dim * la.conv_kernel + p + la.num_value_heads),
                       replicated=Params(matrix=h * d * (1 if la.full_rank_gate else 2)))
    matrix = h * (2 * la.key_dim + 2 * la.value_dim) + h * 2 * la.num_value_heads + la.value_dim * h
    return TPShape(split=Params(matrix=matrix, vector=la.conv_dim * la.conv_kernel + 2 * la.num_value_heads))


def indexer_modules(spec: ModelSpec) -> dict[str, TPShape]:
    """One DSA lightning indexer (DeepSeek-V3.2, GLM-5; transformers DeepseekV32Indexer), module by module: wq_b
    [q_rank, heads x head_dim], wk [h, head_dim] and weights_proj [h, heads], each held whole by every rank (vLLM's
    Indexer: ReplicatedLinear); its k_norm: ``indexer_norm_params``. weights_proj is bf16 in the fp8 checkpoints but
    counted as a matrix (under 0.1 % of the attention). MiniMax-M3's MSA indexer (transformers MiniMaxM3VLIndexer):
    q_proj [h, heads x head_dim] and k_proj [h, head_dim] on the hidden state, held whole like DSA's."""
    si, m = spec.sparse_indexer, spec.mla
    h = spec.hidden_size
    if si is not None and si.kind == "minimax_m3":
        return {"index_q_proj": TPShape(replicated=Params(matrix=h * si.num_heads * si.head_dim)),
                "index_k_proj": TPShape(replicated=Params(matrix=h * si.head_dim))}
    if si is None or m is None or m.q_lora_rank is None:
        return {}
    return {"indexer.wq_b": TPShape(replicated=Params(matrix=m.q_lora_rank * si.num_heads * si.head_dim)),
            "indexer.wk": TPShape(replicated=Params(matrix=h * si.head_dim)),
            "indexer.weights_proj": TPShape(replicated=Params(matrix=h * si.num_heads))}


def indexer_shape(spec: ModelSpec) -> TPShape:
    """One DSA lightning indexer: its ``indexer_modules`` summed."""
    return _summed(indexer_modules(spec).values())


def indexer_norm_params(spec: ModelSpec) -> Params:
    """The indexer's norms over head_dim: DSA's k_norm, a LayerNorm (weight and bias); MiniMax-M3's q_norm and
    k_norm, RMSNorms (a weight each); none without an indexer."""
    si = spec.sparse_indexer
    return Params(vector=2 * si.head_dim) if si is not None else Params()


def attention_params(spec: ModelSpec) -> Params:
    """One layer's attention parameters, every tensor once (``attention_shape`` totalled)."""
    return attention_shape(spec).total(0 if spec.mla is not None else spec.num_kv_heads)


def norms_shape(spec: ModelSpec) -> TPShape:
    """Block norms (2 pre-norms; 4 in Gemma 2/3) + QK-norm over head_dim + MLA's q_a/kv_a latent norms (DeepSeek-V4's
    q_a and kv norms), all replicated; MiniMax-M2's QK-norm across all heads splits like q and k (vLLM
    MiniMaxText01RMSNormTP), and so does Command R+'s, a weight per head (vLLM commandr.py LayerNorm((heads, d)))."""
    p = _norm(spec, spec.hidden_size) * spec.norms_per_layer
    if spec.qk_norm and (spec.qk_norm_across_heads or spec.qk_norm_weights_per_head):
        return TPShape(split=_norm(spec, spec.num_attention_heads * spec.head_dim), replicated=p,
                       per_kv_head=_norm(spec, spec.head_dim))
    if spec.qk_norm:
        p = p + _norm(spec, spec.head_dim) * 2
    if spec.mla is not None:
        if spec.mla.q_lora_rank is not None:
            p = p + _norm(spec, spec.mla.q_lora_rank)
        p = p + _norm(spec, spec.mla.kv_lora_rank)
    if spec.compressed_attention is not None:  # q_a's and the K=V head's; the per-head q norm holds no weight
        p = p + _norm(spec, spec.compressed_attention.q_lora_rank) + _norm(spec, spec.head_dim)
    return TPShape(replicated=p)


def linear_norms_shape(spec: ModelSpec) -> TPShape:
    """A Gated DeltaNet layer's norms: the block norms and the gated RMSNorm over value_head_dim (shared by every
    value head, replicated); Mamba-2's gated RMSNorm spans d_inner (split over tp with its heads)."""
    la = spec.linear_attention
    if la is None:
        return TPShape()
    if la.kind == "mamba2":
        return TPShape(split=_norm(spec, la.value_dim), replicated=block_norms(spec))
    return TPShape(replicated=block_norms(spec) + _norm(spec, la.value_head_dim))


def block_norms(spec: ModelSpec) -> Params:
    """A layer's pre-norms over h (``norms_per_layer``), replicated."""
    return _norm(spec, spec.hidden_size) * spec.norms_per_layer


def mixer_free_norms(spec: ModelSpec) -> Params:
    """The norms of a layer that holds an FFN and no mixer, replicated: its FFN's half of the pre-norms over h, one
    of 1 (Nemotron-H's MLP and MoE blocks) or of 2 (DeciLM's no-op attention keeps post_attention_layernorm only:
    vLLM nemotron_nas.py DeciLMDecoderLayer)."""
    return _norm(spec, spec.hidden_size) * max(spec.norms_per_layer // 2, 1)


def norm_params_per_layer(spec: ModelSpec) -> Params:
    """One layer's norm weights, every tensor once (``norms_shape`` totalled)."""
    return norms_shape(spec).total(0 if spec.mla is not None else spec.num_kv_heads)


def ffn_modules(spec: ModelSpec, intermediate: int, bias: bool, hidden: int = 0) -> dict[str, TPShape]:
    """An FFN module by module: gate (gated FFNs) and up [h, I] with their I biases split over tp, down [I, h] split
    by its input, its h bias replicated (added after the all-reduce). ``hidden``: the width the FFN runs on where
    it is not h (a latent MoE's experts)."""
    h = hidden or spec.hidden_size
    column = TPShape(split=Params(matrix=h * intermediate, vector=intermediate if bias else 0))
    up = {"gate_proj": column, "up_proj": column} if spec.ffn_kind == "gated" else {"up_proj": column}
    return {**up, "down_proj": TPShape(split=Params(matrix=intermediate * h), replicated=Params(vector=h if bias
                                                                                                 else 0))}


def ffn_shape(spec: ModelSpec, intermediate: int, bias: bool, hidden: int = 0) -> TPShape:
    """Gated (SwiGLU/GeGLU): gate and up [h, I] + down [I, h]; plain: up + down (``ffn_modules`` summed). The I
    columns split over tp; biases 2I (or I) split + h (down, added after the all-reduce) replicated."""
    return _summed(ffn_modules(spec, intermediate, bias, hidden).values())


def ffn_params(spec: ModelSpec, intermediate: int, bias: bool) -> Params:
    """``ffn_shape`` totalled: matrices 3hI (gated) or 2hI, biases 2I + h or I + h."""
    return ffn_shape(spec, intermediate, bias).total()


def expert_shape(spec: ModelSpec) -> TPShape:
    """One routed expert: an FFN of the expert width on h, or on the latent width of a latent MoE."""
    moe = spec.moe
    if moe is None:
        return TPShape()
    return ffn_shape(spec, moe.expert_intermediate_size, moe.expert_bias, moe.latent_size)


def latent_shape(spec: ModelSpec) -> TPShape:
    """A latent MoE's projections (transformers NemotronHMoE fc1_latent_proj [h, latent], fc2_latent_proj [latent, h],
    biases as the MLP's; Kimi K3's routed_expert_down_proj / up_proj and the RMSNorm between them), whole on every
    rank so that the experts see the whole latent (vLLM NemotronHMoE, KimiMoE and TensorRT-LLM: ReplicatedLinear)."""
    moe = spec.moe
    if moe is None or not moe.latent_size:
        return TPShape()
    plain = ffn_shape(replace(spec, ffn_kind="plain"), moe.latent_size, spec.mlp_bias)
    norm = _norm(spec, moe.latent_size) if moe.latent_norm else Params()  # Kimi K3's routed_expert_norm
    return TPShape(replicated=plain.split + plain.replicated + norm)


def shared_experts_shape(spec: ModelSpec) -> TPShape:
    """Shared experts run as one FFN of the summed width (DeepSeek, Qwen2-MoE), split like a dense FFN; Qwen2-MoE's
    sigmoid gate [h, 1] is replicated."""
    moe = spec.moe
    if moe is None or not moe.num_shared_experts:
        return TPShape()
    shared = ffn_shape(spec, moe.num_shared_experts * moe.shared_expert_intermediate_size, spec.mlp_bias)
    gate = Params(matrix=spec.hidden_size if moe.shared_expert_gate else 0)
    return TPShape(split=shared.split, replicated=shared.replicated + gate)


def router_params(spec: ModelSpec, hashed: bool = False) -> Params:
    """Router [h, E] + its bias, DeepSeek-V3's score-correction bias and Gemma 4's input scale (h) and per-expert
    scale (E); replicated on every rank. A DeepSeek-V4 hash-routed layer's (``hashed``): [h, E] and its token-id
    table [vocab, top-k] (a checkpoint tensor, tid2eid), no score-correction bias."""
    moe = spec.moe
    if moe is None:
        return Params()
    if hashed:
        return Params(matrix=spec.hidden_size * moe.num_experts + spec.vocab_size * moe.experts_per_token)
    vector = (moe.num_experts if moe.router_bias else 0) + (moe.num_experts if moe.router_score_correction_bias
                                                            else 0) + (spec.hidden_size + moe.num_experts
                                                                       if moe.router_scales else 0)
    return Params(matrix=spec.hidden_size * moe.num_experts, vector=vector)


def encoder_shape(spec: ModelSpec) -> TPShape:
    """A vision encoder and its projector as vLLM lays them out over tp. SigLIP with Gemma 3's projector
    (siglip.py, gemma3_mm.py): per block q, k, v, fc1 column-parallel and out, fc2 row-parallel (weights and column
    biases split; row biases and both LayerNorms replicated); the patch embedding (conv c p^2 h + h), position
    table (patches x h), post-norm and the projector (RMSNorm over h, an h x decoder-hidden matrix) replicated.
    Pixtral with Mistral 3's projector (pixtral.py, mistral3.py): per block q, k, v, o (4h^2) and the gated MLP
    (3hI) split, its two RMSNorms replicated; the bias-free patch conv (c p^2 h), ln_pre, the projector's norm and
    patch merger (m^2 h^2) replicated; linear_1 (h x H) column- and linear_2 (H x H) row-parallel. Qwen2.5-VL
    (qwen2_5_vl.py): per block qkv (3h^2 + 3h) and the gated MLP's gate/up (2hI + 2I) column-, proj (h^2 + h) and
    down (Ih + h) row-parallel, two RMSNorms; the merger's RMSNorm, fc1 (m^2 h squared) and fc2 (m^2 h x H); the
    bias-free conv (c t p^2 h). Qwen3.5 (qwen3_vl.py's vision transformer): per block qkv (3h^2 + 3h) and fc1
    (hI + I) column-, proj (h^2 + h) and fc2 (Ih + h) row-parallel, two LayerNorms; the merger's LayerNorm over h,
    fc1 (m^2 h squared + m^2 h) and fc2 (m^2 h x H + H); the conv with bias (c t p^2 h + h) and the position table
    (positions x h) replicated; Qwen3-VL's deepstack mergers (qwen3_vl.py, use_postshuffle_norm) each a LayerNorm
    over m^2 h (replicated) and the same fc1 and fc2. Llama 4 (mllama4.py): per block q, k, v (3h^2 + 3h) and fc1
    (hI + I) column-, o (h^2 + h) and fc2 (Ih + h) row-parallel, two LayerNorms; the bias-free patch linear
    (c p^2 h), the pixel-shuffle adapter's fc1 (I x adapter_hidden) and fc2 (adapter_output^2) and the projector
    (vision_output x H) split; the class token (h), position table ((patches + 1) x h) and the LayerNorms before
    and after replicated. Gemma 4 (gemma4_mm.py runs transformers' tower): every tensor replicated: per block q, k,
    v, o (4h^2), the gated MLP (3hI), four RMSNorms and the q / k norms; the patch linear (c p^2 h), the x and y
    position tables (2 x positions x h) and the projector (h x H). MoonViT (kimi_k25_vit.py): per block qkv
    (3h^2 + 3h) and fc0 (hI + I) column-, wo (h^2 + h) and fc1 (Ih + h) row-parallel, two LayerNorms; the conv with
    bias (c p^2 h + h), the position table (positions x h), the final LayerNorm and the projector (ReplicatedLinear:
    a LayerNorm over h, m^2 h squared + m^2 h, m^2 h x H + H) replicated; MoonViT-V2 (Kimi K3, the same code with
    KimiK3VisionConfig) the same without biases, RMSNorms, wqkv 3ha and wo ah (a: attention_width), its
    patchmergerv2 projector m^2 h squared + m^2 h x H and an RMSNorm over H. MiniMax-M3 (transformers
    MiniMaxM3VLVisionModel, laid out as SigLIP's): per block q, k, v, out (4h^2 + 4h), fc1 and fc2 (2hI + I + h) split
    as SigLIP's, two LayerNorms; the bias-free 3-D conv (c t p^2 h) and the LayerNorm before the blocks replicated,
    the projector's linear_1 (h x P + P), linear_2 (P x H + H), merge_linear_1 (m^2 H x P + P) and merge_linear_2
    (P x H + H) replicated (P: ``adapter_hidden_dim``, the config's projector_hidden_size)."""
    e = spec.encoder
    if e is None:
        return TPShape()
    h, i = e.hidden_size, e.intermediate_size
    if e.kind == "minimax_m3":
        big, p = spec.hidden_size, e.adapter_hidden_dim
        split = Params(matrix=(4 * h * h + 2 * h * i) * e.num_layers, vector=(3 * h + i) * e.num_layers)
        replicated = Params(matrix=e.num_channels * e.temporal_patch_size * e.patch_size ** 2 * h + h * p + p * big
                            + e.merge_size ** 2 * big * p + p * big,
                            vector=(2 * h + 4 * h) * e.num_layers + 2 * h + 2 * p + 2 * big)
        return TPShape(split=split, replicated=replicated)
    if e.kind == "gemma4":  # vLLM gemma4_mm.py loads the tower through transformers, whole on every rank
        return TPShape(replicated=Params(
            matrix=(4 * h * h + 3 * h * i) * e.num_layers + e.num_channels * e.patch_size ** 2 * h
            + 2 * e.num_position_embeddings * h + h * spec.hidden_size,
            vector=(4 * h + 2 * e.head_dim) * e.num_layers))
    if e.kind == "llama4":
        split = Params(matrix=(4 * h * h + 2 * h * i) * e.num_layers + e.num_channels * e.patch_size ** 2 * h
                       + i * e.adapter_hidden_dim + e.adapter_output_dim ** 2 + e.vision_output_dim * spec.hidden_size,
                       vector=(3 * h + i) * e.num_layers)
        replicated = Params(matrix=(e.num_patches + 1) * h, vector=(2 * h + 4 * h) * e.num_layers + h + 4 * h)
        return TPShape(split=split, replicated=replicated)
    if e.kind == "moonvit2":
        big, wide, a = spec.hidden_size, e.merge_size ** 2 * h, e.attention_width or h
        split = Params(matrix=(3 * h * a + a * h + 2 * h * i) * e.num_layers)
        replicated = Params(matrix=e.num_channels * e.patch_size ** 2 * h + e.num_position_embeddings * h
                            + wide * wide + wide * big, vector=2 * h * e.num_layers + h + big)
        return TPShape(split=split, replicated=replicated)
    if e.kind == "moonvit":
        big, wide = spec.hidden_size, e.merge_size ** 2 * h
        split = Params(matrix=(4 * h * h + 2 * h * i) * e.num_layers, vector=(3 * h + i) * e.num_layers)
        replicated = Params(matrix=e.num_channels * e.patch_size ** 2 * h + e.num_position_embeddings * h
                            + wide * wide + wide * big,
                            vector=h + 6 * h * e.num_layers + 2 * h + 2 * h + wide + big)
        return TPShape(split=split, replicated=replicated)
    if e.kind == "qwen3_5":
        big, wide = spec.hidden_size, e.merge_size ** 2 * h
        mergers = 1 + e.deepstack_mergers
        split = Params(matrix=(4 * h * h + 2 * h * i) * e.num_layers + (wide * wide + wide * big) * mergers,
                       vector=(3 * h + i) * e.num_layers + wide * mergers)
        replicated = Params(matrix=e.num_channels * e.temporal_patch_size * e.patch_size ** 2 * h
                            + e.num_position_embeddings * h,
                            vector=h + 6 * h * e.num_layers + 2 * h + big + (2 * wide + big) * e.deepstack_mergers)
        return TPShape(split=split, replicated=replicated)
    if e.kind == "qwen2_5_vl":  # qwen2_5_vl.py: qkv, gate_up, merger fc1 column-; proj, down, merger fc2 row-parallel
        big, wide = spec.hidden_size, e.merge_size ** 2 * h
        split = Params(matrix=(4 * h * h + 3 * h * i) * e.num_layers + wide * wide + wide * big,
                       vector=(3 * h + 2 * i) * e.num_layers + wide)
        replicated = Params(matrix=e.num_channels * e.temporal_patch_size * e.patch_size ** 2 * h,
                            vector=4 * h * e.num_layers + h + big)
        return TPShape(split=split, replicated=replicated)
    if e.kind == "pixtral":
        big = spec.hidden_size
        bias = Params(vector=big) if e.projector_bias else Params()
        return TPShape(split=Params(matrix=(4 * h * h + 3 * h * i) * e.num_layers + h * big + big * big) + bias,
                       replicated=Params(matrix=e.num_channels * e.patch_size ** 2 * h + e.merge_size ** 2 * h * h,
                                         vector=2 * h * e.num_layers + h + h) + bias)
    split = Params(matrix=(4 * h * h + 2 * h * i) * e.num_layers, vector=(3 * h + i) * e.num_layers)
    replicated = Params(matrix=e.num_channels * e.patch_size ** 2 * h + e.num_patches * h + h * spec.hidden_size,
                        vector=(2 * h + 4 * h) * e.num_layers + h + 2 * h + h)
    if e.pooling_head:  # probe h, attention in/out 4h^2 + 4h, LayerNorm 2h, MLP 2hI + I + h
        replicated = replicated + Params(matrix=4 * h * h + 2 * h * i, vector=h + 4 * h + 2 * h + i + h)
    return TPShape(split=split, replicated=replicated)


def final_norm_params(spec: ModelSpec) -> Params:
    return _norm(spec, spec.hidden_size)


def count_params(spec: ModelSpec) -> ParamCounts:
    """Total and active parameters by component; active follows ``spec.active_params_convention``.

    Identical layers are counted once and multiplied (dense layers, MoE layers), so the cost does not grow with
    the layer count."""
    h, v = spec.hidden_size, spec.vocab_size
    total = {name: Params() for name in PARAM_COMPONENTS}
    active = {name: Params() for name in PARAM_COMPONENTS}

    def add(component: str, p: Params, active_part: Params | None = None) -> None:
        total[component] = total[component] + p
        active[component] = active[component] + (p if active_part is None else active_part)

    embedding = Params(matrix=v * h)
    add("embedding", embedding, Params() if spec.active_params_convention == "excludes_input_embedding" else None)
    if not spec.tie_word_embeddings:
        add("lm_head", Params(matrix=v * h))
    add("norms", final_norm_params(spec))
    moe = spec.moe
    moe_layers = spec.num_moe_layers
    linear_layers = spec.num_linear_layers
    full, sliding = spec.full_layer_spec, spec.num_attention_layers - spec.num_full_layers
    add("attention", attention_params(spec) * sliding + attention_params(full) * spec.num_full_layers
        + linear_attention_shape(spec).total() * linear_layers + indexer_shape(spec).total() * spec.num_indexer_layers)
    add("norms", norm_params_per_layer(spec) * sliding + norm_params_per_layer(full) * spec.num_full_layers
        + linear_norms_shape(spec).total() * linear_layers + indexer_norm_params(spec) * spec.num_indexer_layers
        + mixer_free_norms(spec) * len(spec.mixer_free_layers))
    add("mlp", sum((ffn_params(spec, width, spec.mlp_bias) * layers for width, layers in spec.dense_mlp_widths),
                   Params()))
    if moe is not None and moe_layers:
        expert = expert_shape(spec).total()
        latent = latent_shape(spec).total() * moe_layers  # every token's, beside the routed experts
        add("experts", expert * (moe.num_experts * moe_layers) + latent,
            expert * (moe.experts_per_token * moe_layers) + latent)
        add("shared_experts", shared_experts_shape(spec).total() * moe_layers)
        hashed = moe.hash_layers
        add("router", router_params(spec) * (moe_layers - hashed) + router_params(spec, hashed=True) * hashed)
    ca = spec.compressed_attention
    if ca is not None:  # DeepSeek-V4: each CSA / HCA layer's compressor, every layer's hyper-connections
        for csa, layers in ((True, len(ca.csa_layers)), (False, len(ca.hca_layers))):
            add("attention", compressor_shape(spec, csa).total() * layers)
            add("norms", compressor_norm_params(spec, csa) * layers)
    add("norms", hyper_connection_params(spec) * spec.num_layers + hyper_head_params(spec))
    add("encoder", encoder_shape(spec).total(), Params())  # text tokens never pass through it
    return ParamCounts(total=total, active=active, convention=ACTIVE_CONVENTIONS[spec.active_params_convention])
