"""Parameter counts per component, total and active per token.

Counts follow the Hugging Face transformers implementation of each architecture weight by weight (every
matrix, bias, norm weight and attention sink; a tied embedding counted once), which a test checks against
models instantiated on the meta device. ``matrix`` elements are the quantizable weight matrices; ``vector``
elements are biases, norm weights, sinks and router score biases.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcalc.spec.model import ACTIVE_CONVENTIONS, PARAM_COMPONENTS, ModelSpec

COMPONENTS = PARAM_COMPONENTS


@dataclass(frozen=True)
class Params:
    """Elements in weight matrices and in 1-D tensors (biases, norms, sinks)."""

    matrix: int = 0
    vector: int = 0

    @property
    def total(self) -> int:
        return self.matrix + self.vector

    def __add__(self, other: Params) -> Params:
        return Params(self.matrix + other.matrix, self.vector + other.vector)

    def __mul__(self, factor: int) -> Params:
        return Params(self.matrix * factor, self.vector * factor)

    __rmul__ = __mul__


@dataclass(frozen=True)
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


def _norm(spec: ModelSpec, size: int) -> Params:
    """RMSNorm has a weight of ``size``; LayerNorm a weight and a bias."""
    return Params(vector=size * (2 if spec.norm_kind == "layernorm" else 1))


def attention_params(spec: ModelSpec) -> Params:
    """One layer's attention projections (norm weights excluded, see ``norm_params_per_layer``).

    GQA/MHA/MQA: q [h, nh*d], k and v [h, nkv*d], o [nh*d, h]; biases per ``qkv_bias``/``o_bias``;
    gpt-oss sinks: one logit per head. MLA (DeepSeek-V2 sec. 2.1): q_a [h, q_rank], q_b [q_rank, nh*(nope+rope)]
    (or q [h, nh*(nope+rope)] without a q rank), kv_a [h, kv_rank+rope], kv_b [kv_rank, nh*(nope+v)], o [nh*v, h].
    """
    h, nh = spec.hidden_size, spec.num_attention_heads
    if spec.mla is not None:
        m = spec.mla
        q_out = nh * m.qk_head_dim
        if m.q_lora_rank is not None:
            q = Params(h * m.q_lora_rank + m.q_lora_rank * q_out, m.q_lora_rank if spec.qkv_bias else 0)
        else:  # q_proj has no bias even when attention_bias is set (transformers DeepseekV2Attention)
            q = Params(h * q_out)
        kv_a_out = m.kv_lora_rank + m.qk_rope_head_dim
        kv = Params(h * kv_a_out + m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim),
                    kv_a_out if spec.qkv_bias else 0)
        o = Params(nh * m.v_head_dim * h, h if spec.o_bias else 0)
        return q + kv + o
    d, nkv = spec.head_dim, spec.num_kv_heads
    q_out, kv_out = nh * d, nkv * d
    qkv = Params(h * (q_out + 2 * kv_out), (q_out + 2 * kv_out) if spec.qkv_bias else 0)
    o = Params(q_out * h, h if spec.o_bias else 0)
    sinks = Params(vector=nh if spec.attention_sinks else 0)
    return qkv + o + sinks


def norm_params_per_layer(spec: ModelSpec) -> Params:
    """Block norms (2 pre-norms; 4 in Gemma 2/3) + QK-norm over head_dim + MLA's q_a/kv_a latent norms."""
    p = _norm(spec, spec.hidden_size) * spec.norms_per_layer
    if spec.qk_norm:
        p = p + _norm(spec, spec.head_dim) * 2
    if spec.mla is not None:
        if spec.mla.q_lora_rank is not None:
            p = p + _norm(spec, spec.mla.q_lora_rank)
        p = p + _norm(spec, spec.mla.kv_lora_rank)
    return p


def ffn_params(spec: ModelSpec, intermediate: int, bias: bool) -> Params:
    """Gated (SwiGLU/GeGLU): gate and up [h, I] + down [I, h]; plain: up + down. Biases 2I + h or I + h."""
    h = spec.hidden_size
    gated = spec.ffn_kind == "gated"
    matrix = (3 if gated else 2) * h * intermediate
    vector = ((2 if gated else 1) * intermediate + h) if bias else 0
    return Params(matrix, vector)


def count_params(spec: ModelSpec) -> ParamCounts:
    """Total and active parameters by component; active follows ``spec.active_params_convention``."""
    h, v = spec.hidden_size, spec.vocab_size
    total = {name: Params() for name in COMPONENTS}
    active = {name: Params() for name in COMPONENTS}

    def add(component: str, p: Params, active_part: Params | None = None) -> None:
        total[component] = total[component] + p
        active[component] = active[component] + (p if active_part is None else active_part)

    embedding = Params(matrix=v * h)
    add("embedding", embedding, Params() if spec.active_params_convention == "excludes_input_embedding" else None)
    if not spec.tie_word_embeddings:
        add("lm_head", Params(matrix=v * h))
    add("norms", _norm(spec, h))  # final norm
    attention, norms = attention_params(spec), norm_params_per_layer(spec)
    # Identical layers grouped: cost does not grow with the layer count.
    moe_layers = spec.num_moe_layers
    dense_layers = spec.num_layers - moe_layers
    add("attention", attention * spec.num_layers)
    add("norms", norms * spec.num_layers)
    if dense_layers:
        add("mlp", ffn_params(spec, spec.intermediate_size, spec.mlp_bias) * dense_layers)
    moe = spec.moe
    if moe is not None and moe_layers:
        expert = ffn_params(spec, moe.expert_intermediate_size, moe.expert_bias)
        add("experts", expert * (moe.num_experts * moe_layers), expert * (moe.experts_per_token * moe_layers))
        if moe.num_shared_experts:
            # Shared experts run as one FFN of the summed width (DeepSeek, Qwen2-MoE): one down-projection bias.
            shared = ffn_params(spec, moe.num_shared_experts * moe.shared_expert_intermediate_size, spec.mlp_bias)
            add("shared_experts", (shared + Params(matrix=h if moe.shared_expert_gate else 0)) * moe_layers)
        router_vector = (moe.num_experts if moe.router_bias else 0) + (
            moe.num_experts if moe.router_score_correction_bias else 0)
        add("router", Params(h * moe.num_experts, router_vector) * moe_layers)
    return ParamCounts(total, active, ACTIVE_CONVENTIONS[spec.active_params_convention])
