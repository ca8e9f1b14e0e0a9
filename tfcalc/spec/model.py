"""ModelSpec: one frozen, validated description of a decoder-only transformer.

Everything the calculator and the bundled PyTorch decoder need to size or build a model lives here;
presets, user YAML files and Hugging Face config.json files are all turned into this one type
(see ``tfcalc.spec.presets`` and ``tfcalc.spec.hf_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from tfcalc.errors import SpecError

FfnKind = Literal["gated", "plain"]
NormKind = Literal["rmsnorm", "layernorm"]
ActiveConvention = Literal["all_weights_touched", "excludes_input_embedding"]

# The parts a parameter count is broken into; weight formats may be chosen per part.
PARAM_COMPONENTS = ("embedding", "attention", "mlp", "experts", "shared_experts", "router", "norms", "lm_head")

ACTIVE_CONVENTIONS: dict[str, str] = {
    "all_weights_touched": (
        "active = every weight a token touches: embedding row table, attention, dense MLP, "
        "top-k routed + shared experts, router, norms, lm_head (Mixtral, Qwen3, DeepSeek-V3 cards)"
    ),
    "excludes_input_embedding": (
        "active = as above but without the input embedding table, which is a lookup, not a matmul "
        "(gpt-oss model card)"
    ),
}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """RoPE frequency scaling as in HF ``rope_scaling`` (llama3, yarn, linear, dynamic, longrope)."""

    rope_type: str
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    # yarn (Peng et al. 2023, arXiv:2309.00071) as transformers' _compute_yarn_parameters reads them
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """DeepSeek multi-head latent attention dimensions (DeepSeek-V2 paper, arXiv:2405.04434, sec. 2.1)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_elements_per_token_per_layer(self) -> int:
        """What DeepSeek caches per token and layer: the KV latent plus the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """Mixture-of-Experts feed-forward layers.

    ``dense_layers`` lists the layer indices that keep a dense MLP (DeepSeek's first_k_dense_replace,
    Qwen's mlp_only_layers); every other layer is MoE.
    """

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    router_bias: bool = False
    router_score_correction_bias: bool = False
    expert_bias: bool = False
    normalize_top_k: bool = True
    # Routing numerics the bundled decoder reproduces (no size depends on them): DeepSeek-V3 scores experts with a
    # sigmoid, picks the top ``groups_per_token`` of ``expert_groups`` groups first, and scales the routed sum.
    router_scoring: Literal["softmax", "sigmoid"] = "softmax"
    expert_groups: int = 1
    groups_per_token: int = 1
    routed_scaling_factor: float = 1.0


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer; sizes in elements, counts in units, context in tokens."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    ffn_kind: FfnKind = "gated"
    activation: str = "silu"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    attention_sinks: bool = False
    mlp_bias: bool = False
    norm_kind: NormKind = "rmsnorm"
    norms_per_layer: int = 2
    qk_norm: bool = False
    sliding_window: int | None = None
    sliding_window_layers: tuple[int, ...] = ()
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    # Numerics the bundled decoder reproduces (no size depends on them): Gemma 2 caps attention and final logits
    # with c * tanh(x / c), scales scores by query_pre_attn_scalar^-1/2, norms by (1 + w), embeddings by sqrt(h).
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    query_pre_attn_scalar: float | None = None
    norm_weight_offset: float = 0.0
    embedding_scale_sqrt_hidden: bool = False
    max_context: int = 4096
    native_dtype: str = "bf16"
    active_params_convention: ActiveConvention = "all_weights_touched"
    source: str = ""
    notes: str = ""
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        n = self.name
        for attr in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "max_context", "norms_per_layer"):
            value = getattr(self, attr)
            _require(isinstance(value, int) and not isinstance(value, bool),
                     f"{n}: {attr} must be an integer, got {value!r}")
            _require(value > 0, f"{n}: {attr} must be positive, got {value}")
        _require(self.num_attention_heads % self.num_kv_heads == 0,
                 f"{n}: num_attention_heads ({self.num_attention_heads}) is not divisible by "
                 f"num_kv_heads ({self.num_kv_heads})")
        _require(self.ffn_kind in ("gated", "plain"), f"{n}: ffn_kind must be 'gated' or 'plain'")
        _require(self.norm_kind in ("rmsnorm", "layernorm"), f"{n}: norm_kind must be 'rmsnorm' or 'layernorm'")
        _require(self.active_params_convention in ACTIVE_CONVENTIONS,
                 f"{n}: active_params_convention must be one of {sorted(ACTIVE_CONVENTIONS)}")
        _require(self.rope_theta > 0, f"{n}: rope_theta must be positive")
        from tfcalc.dtypes import parse_weight_precision  # lazy: dtypes imports this module
        from tfcalc.errors import UsageError

        try:
            parse_weight_precision(self.native_dtype)
        except UsageError as exc:
            raise SpecError(f"{n}: native_dtype: {exc}") from None
        if self.sliding_window is not None:
            _require(self.sliding_window > 0, f"{n}: sliding_window must be positive, got {self.sliding_window}")
        else:
            _require(not self.sliding_window_layers, f"{n}: sliding_window_layers given without sliding_window")
        for i in self.sliding_window_layers:
            _require(0 <= i < self.num_layers, f"{n}: sliding-window layer {i} is outside 0..{self.num_layers - 1}")
        if self.mla is not None:
            m = self.mla
            for attr in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                _require(getattr(m, attr) > 0, f"{n}: mla.{attr} must be positive")
            _require(m.q_lora_rank is None or m.q_lora_rank > 0, f"{n}: mla.q_lora_rank must be positive or null")
            _require(not self.sliding_window_layers, f"{n}: MLA with sliding-window layers is not supported")
        if self.moe is not None:
            e = self.moe
            _require(e.num_experts > 0, f"{n}: moe.num_experts must be positive")
            _require(0 < e.experts_per_token <= e.num_experts,
                     f"{n}: moe.experts_per_token ({e.experts_per_token}) must be in 1..num_experts ({e.num_experts})")
            _require(e.expert_intermediate_size > 0, f"{n}: moe.expert_intermediate_size must be positive")
            _require(e.num_shared_experts >= 0, f"{n}: moe.num_shared_experts must be >= 0")
            if e.num_shared_experts:
                _require(e.shared_expert_intermediate_size > 0,
                         f"{n}: moe.shared_expert_intermediate_size must be positive when shared experts exist")
            for i in e.dense_layers:
                _require(0 <= i < self.num_layers, f"{n}: moe dense layer {i} is outside 0..{self.num_layers - 1}")
            _require(e.router_scoring in ("softmax", "sigmoid"), f"{n}: moe.router_scoring must be softmax or sigmoid")
            _require(e.expert_groups > 0 and e.num_experts % e.expert_groups == 0,
                     f"{n}: moe.expert_groups ({e.expert_groups}) must divide num_experts ({e.num_experts})")
            _require(0 < e.groups_per_token <= e.expert_groups,
                     f"{n}: moe.groups_per_token must be in 1..expert_groups ({e.expert_groups})")
        for attr in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
            value = getattr(self, attr)
            _require(value is None or value > 0, f"{n}: {attr} must be positive or null, got {value!r}")

    # --- derived shape facts -------------------------------------------------------------
    @property
    def attention_kind(self) -> str:
        """MLA, MHA (kv heads == heads), MQA (one kv head) or GQA (in between)."""
        if self.mla is not None:
            return "MLA"
        if self.num_kv_heads == self.num_attention_heads:
            return "MHA"
        if self.num_kv_heads == 1:
            return "MQA"
        return "GQA"

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self.moe.dense_layers

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def is_sliding_layer(self, layer: int) -> bool:
        return layer in self.sliding_window_layers

    def with_overrides(self, **changes: object) -> ModelSpec:
        """A copy with some fields changed (validated again); ``layers`` trims per-layer patterns."""
        layers = changes.pop("layers", None)
        spec = self
        if layers is not None:
            n = int(layers)  # type: ignore[call-overload]
            moe = spec.moe
            if moe is not None:
                moe = replace(moe, dense_layers=tuple(i for i in moe.dense_layers if i < n))
            spec = replace(spec, num_layers=n, moe=moe,
                           sliding_window_layers=tuple(i for i in spec.sliding_window_layers if i < n))
        return replace(spec, **changes) if changes else spec
