"""ModelSpec: one frozen, validated description of a decoder-only transformer.

Everything the calculator and the bundled PyTorch decoder need to size or build a model lives here;
presets, user YAML files and Hugging Face config.json files are all turned into this one type
(see ``tfcalc.spec.presets`` and ``tfcalc.spec.hf_config``).
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Literal, TypeVar

from tfcalc.errors import SpecError

T = TypeVar("T")

FfnKind = Literal["gated", "plain"]
NormKind = Literal["rmsnorm", "layernorm"]
# Where a layer's norms sit: before its attention and FFN ("pre", Llama), or only on their outputs before the residual
# add ("post": OLMo 2 / 3, EXAONE 4's QK-Reorder-Norm; transformers Olmo2DecoderLayer).
NormPlacement = Literal["pre", "post"]
ActiveConvention = Literal["all_weights_touched", "excludes_input_embedding"]
# The FFN nonlinearities the decoder implements (tfcalc.model.layers.activate); anything else is refused.
Activation = Literal["silu", "gelu", "gelu_tanh", "swiglu_clamped", "relu2", "situ"]
LinearKind = Literal["gated_deltanet", "mamba2", "kda"]
LINEAR_KINDS: tuple[str, ...] = ("gated_deltanet", "mamba2", "kda")
# Nemotron-H's block letters (hybrid_override_pattern): each block holds one mixer or one FFN
HYBRID_BLOCKS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
# RoPE scalings as transformers names them (modeling_rope_utils.ROPE_INIT_FUNCTIONS); "default" means none.
RopeType = Literal["linear", "dynamic", "yarn", "longrope", "llama3"]
# How a MoE router turns logits into expert scores (transformers' DeepseekV3TopkRouter: sigmoid).
RouterScoring = Literal["softmax", "sigmoid", "sqrtsoftplus"]
EncoderKind = Literal["siglip", "pixtral", "qwen2_5_vl", "qwen3_5", "llama4", "gemma4", "moonvit", "minimax_m3",
                      "moonvit2"]
# "dsa": DeepSeek Sparse Attention's lightning indexer on MLA; "minimax_m3": MiniMax Sparse Attention's block indexer
IndexerKind = Literal["dsa", "minimax_m3"]
# How the ``sliding_window_layers`` attend: the last ``sliding_window`` tokens (Mistral, Gemma), or only the tokens
# of their own ``sliding_window``-token chunk (Llama 4's attention_chunk_size; transformers "chunked_attention").
LocalAttention = Literal["sliding", "chunked"]

ACTIVE_CONVENTIONS: dict[str, str] = {
    "all_weights_touched": (
        "active = every weight a token touches: embedding row table, attention, dense MLP, "
        "top-k routed + shared experts, router, norms, lm_head (Mixtral, Qwen3, DeepSeek-V3 cards)"
    ),
    "excludes_input_embedding": (
        "active = every weight a token touches but the input embedding table, a lookup rather than a matmul: "
        "attention, dense MLP, top-k routed + shared experts, router, norms, lm_head (gpt-oss model card)"
    ),
}

# --- field validation: one set of rules for presets, user YAML, config.json and code --------------------
# Inclusive bounds of every integer field (dotted names for nested specs). They sit far above any released
# model (Llama 3.1 405B: 126 layers, hidden 16,384; Gemma 3: vocab 262,144; DeepSeek-V3: 256 experts;
# Llama 4 Scout: 10M context) and keep every computation bounded in time and memory.
INT_LIMITS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 24),
    "hidden_size": (1, 1 << 20),
    "num_layers": (1, 10_000),
    "num_attention_heads": (1, 1 << 16),
    "num_kv_heads": (1, 1 << 16),
    "head_dim": (1, 1 << 16),
    "v_head_dim": (1, 1 << 16),
    "intermediate_size": (1, 1 << 24),
    "max_context": (1, 1 << 34),
    "norms_per_layer": (1, 16),
    "num_mtp_layers": (0, 1_000),
    "sliding_window": (1, 1 << 34),
    "attn_temperature_floor_scale": (1, 1 << 34),
    "mla.q_lora_rank": (1, 1 << 20),
    "mla.kv_lora_rank": (1, 1 << 20),
    "mla.qk_nope_head_dim": (1, 1 << 16),
    "mla.qk_rope_head_dim": (1, 1 << 16),
    "mla.v_head_dim": (1, 1 << 16),
    "moe.num_experts": (1, 1 << 16),
    "moe.experts_per_token": (1, 1 << 16),
    "moe.expert_intermediate_size": (1, 1 << 24),
    "moe.num_shared_experts": (0, 1 << 16),
    "moe.shared_expert_intermediate_size": (0, 1 << 24),
    "moe.expert_groups": (1, 1 << 16),
    "moe.groups_per_token": (1, 1 << 16),
    "moe.latent_size": (0, 1 << 20),
    "moe.hash_layers": (0, 10_000),
    "attention_residual_block": (0, 10_000),
    "compressed_attention.q_lora_rank": (1, 1 << 20),
    "compressed_attention.o_lora_rank": (1, 1 << 20),
    "compressed_attention.o_groups": (1, 1 << 16),
    "compressed_attention.csa_ratio": (2, 1 << 20),
    "compressed_attention.hca_ratio": (2, 1 << 20),
    "compressed_attention.index_heads": (1, 1 << 16),
    "compressed_attention.index_head_dim": (1, 1 << 16),
    "compressed_attention.index_topk": (1, 1 << 34),
    "compressed_attention.hc_mult": (1, 64),
    "rope_scaling.original_max_position_embeddings": (1, 1 << 34),
    "encoder.hidden_size": (1, 1 << 20),
    "encoder.intermediate_size": (1, 1 << 24),
    "encoder.num_layers": (1, 10_000),
    "encoder.patch_size": (1, 1 << 12),
    "encoder.image_size": (1, 1 << 16),
    "encoder.num_channels": (1, 64),
    "encoder.merge_size": (1, 64),
    "encoder.temporal_patch_size": (1, 64),
    "encoder.num_position_embeddings": (0, 1 << 24),
    "encoder.deepstack_mergers": (0, 10_000),
    "linear_attention.num_key_heads": (1, 1 << 16),
    "linear_attention.num_value_heads": (1, 1 << 16),
    "linear_attention.key_head_dim": (1, 1 << 16),
    "linear_attention.value_head_dim": (1, 1 << 16),
    "linear_attention.conv_kernel": (1, 64),
    "linear_attention.chunk_size": (1, 1 << 16),
    "encoder.adapter_hidden_dim": (0, 1 << 20),
    "encoder.adapter_output_dim": (0, 1 << 20),
    "encoder.vision_output_dim": (0, 1 << 20),
    "encoder.head_dim": (0, 1 << 16),
    "encoder.attention_width": (0, 1 << 20),
    "full_attention.head_dim": (1, 1 << 16),
    "full_attention.num_kv_heads": (1, 1 << 16),
    "full_attention.v_head_dim": (1, 1 << 16),
}
# Inclusive bounds of float fields; every float is finite. POSITIVE as a lower bound means "> 0", the bound of a
# field not listed here. Zero is allowed where it means "off" (yarn's mscale and mscale_all_dim, as DeepSeek's and
# transformers' yarn read them) and a norm offset may be 0 (plain RMSNorm) or 1 (Gemma's (1 + w)).
POSITIVE = math.ulp(0.0)
FLOAT_LIMITS: dict[str, tuple[float, float]] = {
    "rope_theta": (POSITIVE, 1e15),
    "rope_local_theta": (POSITIVE, 1e15),
    "attn_logit_softcapping": (POSITIVE, 1e6),
    "final_logit_softcapping": (POSITIVE, 1e6),
    "query_pre_attn_scalar": (POSITIVE, 1 << 20),
    "embedding_multiplier": (POSITIVE, 1e6),
    "residual_multiplier": (POSITIVE, 1e6),
    "logits_scaling": (POSITIVE, 1e6),
    "norm_weight_offset": (-1.0, 1.0),
    "attn_temperature_scale": (0.0, 1e6),
    "partial_rotary_factor": (POSITIVE, 1.0),
    "full_attention.partial_rotary_factor": (POSITIVE, 1.0),
    "moe.routed_scaling_factor": (POSITIVE, 1e6),
    "rope_scaling.factor": (POSITIVE, 1e6),
    "rope_scaling.low_freq_factor": (POSITIVE, 1e6),
    "rope_scaling.high_freq_factor": (POSITIVE, 1e6),
    "rope_scaling.beta_fast": (POSITIVE, 1e6),
    "rope_scaling.beta_slow": (POSITIVE, 1e6),
    "rope_scaling.mscale": (0.0, 1e6),
    "rope_scaling.mscale_all_dim": (0.0, 1e6),
}
_FLOAT_DEFAULT = (POSITIVE, math.inf)
MAX_NAME_CHARS = 255  # a file name's limit: user files are named after their file


def _show(value: object) -> str:
    """A value for an error message, cut to 40 characters (a 401-digit number is not repeated in full)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for str()
        return "a number too long to print"
    return text if len(text) <= 40 else text[:37] + "..."


def key_text(key: object) -> str:
    """A key from a file as a one-line message shows it: control characters escaped, at most 80 characters."""
    text = str(key)
    return (text if text.isprintable() else repr(text)[1:-1])[:80]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)


def check_int(key: str, value: object, limits: tuple[int, int] | None = None) -> int:
    """An integer (not a bool, not a float) within ``INT_LIMITS[key]``; the SpecError names the field."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"field '{key}' must be an integer, got {_show(value)}")
    low, high = limits or INT_LIMITS.get(key, (1, 1 << 62))
    if not low <= value <= high:
        if value < low:
            raise SpecError(f"field '{key}' must be {'positive' if low == 1 else f'at least {low}'}, "
                            f"got {_show(value)}")
        raise SpecError(f"field '{key}' must be at most {high:,} (tfcalc's limit), got {_show(value)}")
    return value


def check_float(key: str, value: object, high: float | None = None, bounds_of: str | None = None,
                low: float | None = None) -> float:
    """A finite number (an integer is accepted) within ``FLOAT_LIMITS[bounds_of or key]`` (positive when not
    listed); ``high`` and ``low`` override the bounds. The error names ``key``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"field '{key}' must be a number, got {_show(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    listed_low, listed_high = FLOAT_LIMITS.get(bounds_of or key, _FLOAT_DEFAULT)
    low = listed_low if low is None else low
    high = listed_high if high is None else high
    if not math.isfinite(number):
        raise SpecError(f"field '{key}' must be a finite number, got {_show(value)}")
    if number < low:
        raise SpecError(f"field '{key}' must be {'positive' if low == POSITIVE else f'at least {low:g}'}, "
                        f"got {_show(value)}")
    if number > high:
        limit = "" if high == 1.0 else " (tfcalc's limit)"  # 1 bounds a fraction, not a limit of tfcalc's choosing
        raise SpecError(f"field '{key}' must be at most {high:g}{limit}, got {_show(value)}")
    return number


def in_file(origin: str, check: Callable[..., T], key: str, value: object, *args: object, **kwargs: object) -> T:
    """``check(key, value, ...)`` with its SpecError prefixed by the file the field is in."""
    try:
        return check(key, value, *args, **kwargs)
    except SpecError as exc:
        raise SpecError(f"{origin}: {exc}") from None


def check_bool(key: str, value: object) -> bool:
    """``true`` or ``false`` only: the string ``"no"`` or the number 1 is not a boolean."""
    if not isinstance(value, bool):
        raise SpecError(f"field '{key}' must be true or false, got {_show(value)}")
    return value


def check_choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise SpecError(f"field '{key}' must be one of {', '.join(choices)}, got {_show(value)}")
    return value


def check_str(key: str, value: object, max_chars: int | None = None) -> str:
    if not isinstance(value, str):
        raise SpecError(f"field '{key}' must be text, got {_show(value)}")
    if max_chars is not None and not 0 < len(value) <= max_chars:
        raise SpecError(f"field '{key}' must be 1 to {max_chars} characters, got {len(value)}")
    return value


Checker = typing.Callable[[str, object], object]


def check_fields(spec: object, prefix: str = "") -> None:
    """Check every field of a spec dataclass against its type: bools, ints within INT_LIMITS, finite floats
    within FLOAT_LIMITS (positive when not listed), Literal choices, text, integer tuples; ``None`` where the
    type allows it. Nested specs check themselves when built. The checks are derived once per class from its
    type hints."""
    for name, key, check in _checkers(type(spec), prefix):
        check(key, getattr(spec, name))


@functools.cache
def _checkers(cls: type, prefix: str) -> tuple[tuple[str, str, Checker], ...]:
    return tuple((f.name, prefix + f.name, _checker(str(f.type), prefix + f.name)) for f in fields(cls))


def _checker(annotation: str, key: str) -> Checker:
    """The check for one declared type, read from its annotation text (this module's annotations are strings:
    builtins, ``X | None``, ``tuple[int, ...]``, its Literal aliases and spec classes). Each check has a fast
    path for the common, valid value."""
    if annotation.endswith(" | None"):
        check = _checker(annotation.removesuffix(" | None"), key)
        return lambda k, v: None if v is None else check(k, v)
    if annotation == "bool":
        return lambda k, v: None if v is True or v is False else check_bool(k, v)
    if annotation == "int":
        low, high = INT_LIMITS.get(key, (1, 1 << 62))
        return lambda k, v: None if type(v) is int and low <= v <= high else check_int(k, v)
    if annotation == "float":
        low_float, high_float = FLOAT_LIMITS.get(key, _FLOAT_DEFAULT)
        return lambda k, v: (None if type(v) is float and low_float <= v <= high_float and v != math.inf
                             else check_float(k, v))
    if annotation == "str":
        limit = {"name": MAX_NAME_CHARS, "hf_repo": 4096, "architecture": MAX_NAME_CHARS}.get(key)
        return lambda k, v: check_str(k, v, limit)
    if annotation == "tuple[int, ...]":
        return _check_index_tuple
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        item_check = _checker(annotation[len("tuple["):-len(", ...]")], key)

        def check_tuple(k: str, v: object) -> None:
            if not isinstance(v, tuple):
                _wrong_type(k, v, "list")
            for item in v:  # type: ignore[union-attr]
                item_check(k, item)

        return check_tuple
    target = globals().get(annotation)
    if typing.get_origin(target) is typing.Literal:
        args = typing.get_args(target)
        choices = frozenset(args)
        return lambda k, v: None if type(v) is str and v in choices else check_choice(k, v, args)
    if isinstance(target, type) and is_dataclass(target):  # a nested spec, checked when it was built
        return lambda k, v: None if isinstance(v, target) else _wrong_type(k, v, target.__name__)
    return lambda k, v: None  # free-form extras (dict[str, object])


def _wrong_type(key: str, value: object, expected: str) -> None:
    raise SpecError(f"field '{key}' must be a {expected}, got {_show(value)}")


def _check_index_tuple(key: str, value: object) -> None:
    if not isinstance(value, tuple):
        raise SpecError(f"field '{key}' must be a list of layer indices, got {_show(value)}")
    for item in value:
        if type(item) is not int:
            raise SpecError(f"field '{key}' must be a list of layer indices, got {_show(item)} in it")


def check_layer_indices(key: str, layers: tuple[int, ...], num_layers: int) -> None:
    """Each index in 0..num_layers-1, none twice."""
    seen: set[int] = set()
    for i in layers:
        _require(0 <= i < num_layers, f"field '{key}': layer {i} is outside 0..{num_layers - 1}")
        _require(i not in seen, f"field '{key}': layer {i} is listed twice")
        seen.add(i)


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """RoPE frequency scaling as in HF ``rope_scaling`` (llama3, yarn, linear, dynamic, longrope)."""

    rope_type: RopeType
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    # yarn (Peng et al. 2023, arXiv:2309.00071) as transformers' _compute_yarn_parameters reads them
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None

    def __post_init__(self) -> None:
        check_fields(self, "rope_scaling.")


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """DeepSeek multi-head latent attention dimensions (DeepSeek-V2 paper, arXiv:2405.04434, sec. 2.1)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        check_fields(self, "mla.")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_elements_per_token_per_layer(self) -> int:
        """What DeepSeek caches per token and layer: the KV latent plus the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, kw_only=True)
class SparseIndexerSpec:
    """DeepSeek Sparse Attention (DSA, DeepSeek-V3.2, arXiv:2512.02556; GLM-5): a lightning indexer on ``layers``
    scores every cached token with ``num_heads`` ReLU dot products of ``head_dim`` (q from MLA's q_lora, one key per
    token from the hidden state, per-head weights from the hidden state) and the MLA attends only the ``topk`` best;
    the other layers reuse the previous indexed layer's choice (GLM-5.2's "shared" layers). Per indexed layer:
    wq_b [q_lora_rank, heads x head_dim], wk [h, head_dim], k_norm (LayerNorm), weights_proj [h, heads]
    (transformers DeepseekV32Indexer), and one key of head_dim cached per token."""

    layers: tuple[int, ...]
    num_heads: int
    head_dim: int
    topk: int
    # MiniMax-M3's MSA (transformers MiniMaxM3VLIndexer; kind "minimax_m3"): q [h, heads x head_dim] and k [h, head_dim]
    # from the hidden state, per-head RMSNorms q_norm and k_norm (head_dim each), no weights_proj; each indexer head
    # (one per KV head) keeps the ``topk`` best blocks of ``block_size`` keys (max-pooled scores, the query's own
    # block always among them); the layers without an indexer attend every key (not the previous choice)
    kind: IndexerKind = "dsa"
    block_size: int = 1

    def __post_init__(self) -> None:
        check_fields(self, "sparse_indexer.")


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec:
    """The full-attention layers of a model whose sliding-window and full layers differ in shape (Gemma 4: heads of
    global_head_dim 512 against 256, num_global_key_value_heads KV heads, values from the k projection, a quarter
    of each head rotated; transformers Gemma4TextConfig per_layer_config, vLLM gemma4.py). The sliding layers keep
    the model's own head_dim, num_kv_heads and partial_rotary_factor."""

    head_dim: int
    num_kv_heads: int
    # attention_k_eq_v: no v_proj; the values are the k projection, v-normed and unrotated (cached apart from K)
    k_eq_v: bool = False
    partial_rotary_factor: float = 1.0
    # transformers' proportional RoPE: frequencies base^(-2i / head_dim) over the whole head, the first
    # head_dim x partial_rotary_factor / 2 of each half turned, the rest left as they are
    proportional_rope: bool = False
    # the values' head size where it differs from the sliding layers' (None: theirs), and whether these layers hold
    # attention sinks where the sliding ones' differ (None: as theirs; MiMo-V2-Flash: sinks on sliding layers only)
    v_head_dim: int | None = None
    attention_sinks: bool | None = None

    def __post_init__(self) -> None:
        check_fields(self, "full_attention.")


@dataclass(frozen=True, kw_only=True)
class CompressedAttentionSpec:
    """DeepSeek-V4's attention (arXiv DeepSeek-V4 sec. 2.3; transformers DeepseekV4Attention): one shared K=V head of
    head_dim over a sliding window of the last ``sliding_window`` tokens on every layer (the model's own fields),
    plus, on ``csa_layers``, one compressed entry per ``csa_ratio`` tokens (overlapping windows of 2 x ratio) of
    which a lightning indexer (``index_heads`` x ``index_head_dim``, its own compressed keys) picks the
    ``index_topk``, and on ``hca_layers`` one entry per ``hca_ratio`` tokens, all attended. Queries come from a q
    LoRA of ``q_lora_rank``; the heads' output is projected in ``o_groups`` groups to ``o_lora_rank`` each, then to
    the hidden size. Every block is wrapped in manifold-constrained hyper-connections of ``hc_mult`` residual
    streams."""

    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    csa_layers: tuple[int, ...] = ()
    hca_layers: tuple[int, ...] = ()
    csa_ratio: int = 4
    hca_ratio: int = 128
    index_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    hc_mult: int = 4

    def __post_init__(self) -> None:
        check_fields(self, "compressed_attention.")
        _require(self.csa_ratio >= 2 and self.hca_ratio >= 2,
                 "compressed_attention.csa_ratio and hca_ratio must be at least 2")
        _require(not set(self.csa_layers) & set(self.hca_layers),
                 "compressed_attention: a layer is listed both as CSA and as HCA")


@dataclass(frozen=True, kw_only=True)
class EncoderSpec:
    """A vision encoder the checkpoint ships beside the decoder and engines load with it: a ViT of ``num_layers``
    pre-norm blocks over patches of ``patch_size`` pixels, and the projector into the decoder's width.
    ``siglip`` (SigLIP, arXiv:2303.15343; transformers SiglipVisionModel): LayerNorms, MHA with biases, a GELU MLP
    of ``intermediate_size``, position table; Gemma 3's projector is an RMSNorm and one matrix.
    ``pixtral`` (transformers PixtralVisionModel): RMSNorms, bias-free MHA and gated MLP, 2-D RoPE; Mistral 3's
    projector an RMSNorm, a patch merger of ``merge_size``^2 patches and two linears (biases per
    ``projector_bias``). ``qwen2_5_vl`` (transformers Qwen2_5_VisionTransformerPretrainedModel): a bias-free 3-D
    patch conv over ``temporal_patch_size`` frames, RMSNorms, fused qkv and proj with biases, a gated MLP with
    biases; its merger an RMSNorm and two linears over ``merge_size``^2 patches. ``qwen3_5`` (transformers
    Qwen3_5VisionModel): a 3-D patch conv with bias, a learned table of ``num_position_embeddings`` positions,
    LayerNorms, fused qkv and proj with biases, a GELU MLP with biases; its merger a LayerNorm and two linears
    (Qwen3-VL's tower the same, with ``deepstack_mergers`` more mergers).
    ``llama4`` (transformers Llama4VisionModel): a bias-free patch linear, a class token and position table,
    LayerNorms before and after, MHA with biases, a GELU MLP with biases; a bias-free pixel-shuffle adapter MLP
    and a bias-free projector into the decoder's width. ``gemma4`` (transformers Gemma4VisionModel): a bias-free
    patch linear, two position tables of ``num_position_embeddings`` rows (x and y), RMSNorms (4 per block, q and k
    norms over ``head_dim``), bias-free MHA and gated MLP; a bias-free projector into the decoder's width.
    ``moonvit`` (Kimi K2.5's MoonViT; transformers Kimi_K25VisionModel): a patch conv with bias, a learned table of
    ``num_position_embeddings`` positions, LayerNorms (one more after the last block), MHA with biases, a GELU MLP
    with biases; its projector a LayerNorm over h and two linears with biases over ``merge_size``^2 patches.
    ``minimax_m3`` (transformers MiniMaxM3VLVisionModel): a bias-free 3-D patch conv over ``temporal_patch_size``
    frames, a LayerNorm before the blocks, MHA and a GELU MLP with biases, 3-D RoPE; its projector a GELU MLP per
    patch to the decoder's width then one over ``merge_size``^2 merged patches, both through ``adapter_hidden_dim``
    (projector_hidden_size), all with biases. ``moonvit2`` (Kimi K3's MoonViT-V2; vLLM kimi_k25_vit.py with
    KimiK3VisionConfig): MoonViT with RMSNorms and no biases anywhere, q, k and v of ``attention_width``; its
    projector (patchmergerv2) two bias-free linears over ``merge_size``^2 patches and an RMSNorm over the decoder's
    width."""

    kind: EncoderKind = "siglip"
    hidden_size: int
    intermediate_size: int
    num_layers: int
    patch_size: int
    image_size: int | None = None  # SigLIP's fixed resolution (its position table); None where it is dynamic
    num_channels: int = 3
    pooling_head: bool = False  # SigLIP's attention-pooling head (vision_use_head; Gemma 3's checkpoints: none)
    merge_size: int = 1         # Mistral 3's and Qwen2.5-VL's spatial_merge_size
    projector_bias: bool = False  # Mistral 3's multimodal_projector_bias
    temporal_patch_size: int = 1  # Qwen2.5-VL's patches span 2 frames
    num_position_embeddings: int = 0  # Qwen3.5's learned position table (resampled to each image's grid)
    # Qwen3-VL's deepstack: a further merger (LayerNorm over the merged width) per deepstack_visual_indexes entry,
    # whose features are added to the decoder's first layers
    deepstack_mergers: int = 0
    # Llama 4's pixel-shuffle adapter MLP: fc1 from intermediate_size to adapter_hidden_dim, fc2 from and to
    # adapter_output_dim (projector_input_dim / projector_output_dim); its projector maps vision_output_dim to the
    # decoder's width
    adapter_hidden_dim: int = 0
    adapter_output_dim: int = 0
    vision_output_dim: int = 0
    head_dim: int = 0  # Gemma 4's per-head q and k norms
    attention_width: int = 0  # MoonViT-V2's q, k and v width where it is not hidden_size (qkv_hidden_size); 0: h

    def __post_init__(self) -> None:
        check_fields(self, "encoder.")
        if self.kind in ("siglip", "llama4"):
            _require(self.image_size is not None, f"encoder.image_size is required for a {self.kind} encoder")
        if self.kind == "llama4":
            _require(min(self.adapter_hidden_dim, self.adapter_output_dim, self.vision_output_dim) > 0,
                     "encoder.adapter_hidden_dim, adapter_output_dim and vision_output_dim are required for a "
                     "llama4 encoder")
        if self.image_size is not None:
            _require(self.image_size % self.patch_size == 0, f"encoder.image_size ({self.image_size}) is not a "
                     f"multiple of encoder.patch_size ({self.patch_size})")

    @property
    def num_patches(self) -> int:
        """Patches of one image at the fixed resolution (SigLIP's position table); 0 where it is dynamic."""
        return 0 if self.image_size is None else (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True, kw_only=True)
class LinearAttentionSpec:
    """Gated DeltaNet token mixing on ``layers`` (Yang et al. 2024, arXiv:2412.06464; transformers
    Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet), the others keeping softmax attention. Per layer: q, k (key heads
    x key_head_dim) and v (value heads x value_head_dim) projections through a depthwise causal conv of
    ``conv_kernel`` taps, an output gate z (value_dim), per-value-head decay a and write strength b, a gated RMSNorm
    over value_head_dim and out_proj. Each sequence holds a fixed state instead of a KV cache: the conv's last
    conv_kernel - 1 input rows and one value_head_dim x key_head_dim matrix per value head (vLLM
    MambaStateShapeCalculator.gated_delta_net_state_shape).

    ``kind`` mamba2 (Nemotron-H; Dao & Gu 2024, arXiv:2405.21060; transformers NemotronHMamba2Mixer) reads the same
    fields as Mamba-2's: key heads = the B/C groups (n_groups), key_head_dim = the state size (d_state), value
    heads x value_head_dim = the SSM heads x their head_dim (d_inner); one in_proj [h, 2 d_inner + 2 groups d_state +
    heads] (z, x, B, C, dt), the conv over x, B and C (``conv_bias``), dt_bias, A_log and D per head, a gated RMSNorm
    over d_inner and out_proj; the same states (vLLM MambaStateShapeCalculator.mamba2_state_shape: conv_dim x
    (conv_kernel - 1) and heads x head_dim x d_state).

    ``kind`` kda (Kimi Delta Attention, arXiv:2510.26692; transformers KimiLinearDeltaAttention, vLLM
    kimi_gdn_linear_attn.py): Gated DeltaNet's states and fields (key heads = value heads, one head_dim), its decay a
    low-rank projection per channel (f_a [h, d], f_b [d, P], dt_bias P, A_log per head) and its output gate g_a [h, d]
    then g_b [d, P], or one g [h, P] where ``full_rank_gate`` (Kimi K3, vLLM KimiK3DeltaAttention); P = heads x d."""

    layers: tuple[int, ...]
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4
    kind: LinearKind = "gated_deltanet"
    conv_bias: bool = False   # Mamba-2's use_conv_bias
    proj_bias: bool = False   # Mamba-2's in_proj / out_proj biases (mamba_proj_bias)
    chunk_size: int = 64      # the chunked scan's chunk (Mamba-2's chunk_size; FLA's 64 for Gated DeltaNet)
    # the recurrent state's format the checkpoint declares (Qwen3.5's mamba_ssm_dtype: float32); None: the model's
    recurrent_state_dtype: str | None = None
    full_rank_gate: bool = False  # KDA's output gate one [h, P] projection (Kimi K3's use_full_rank_gate)

    def __post_init__(self) -> None:
        check_fields(self, "linear_attention.")
        if self.recurrent_state_dtype is not None:
            from tfcalc.dtypes import get_dtype
            from tfcalc.errors import UsageError

            try:
                get_dtype(self.recurrent_state_dtype)
            except UsageError as exc:
                raise SpecError(f"linear_attention.recurrent_state_dtype: {exc}") from None
        _require(self.num_value_heads % self.num_key_heads == 0,
                 f"linear_attention.num_value_heads ({self.num_value_heads}) is not a multiple of "
                 f"linear_attention.num_key_heads ({self.num_key_heads})")

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v side by side, 2 x key_dim + value_dim."""
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_state_elements(self) -> int:
        """One sequence's conv state in one layer: conv_dim x (conv_kernel - 1)."""
        return self.conv_dim * (self.conv_kernel - 1)

    @property
    def recurrent_state_elements(self) -> int:
        """One sequence's delta-rule state in one layer: value heads x key_head_dim x value_head_dim."""
        return self.num_value_heads * self.key_head_dim * self.value_head_dim


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
    # Llama 4: each chosen expert's score multiplies the token before the expert, not the expert's output
    # (vLLM fused_moe apply_router_weight_on_input; transformers Llama4TextMoe)
    router_weights_input: bool = False
    # Gemma 4: every MoE layer also runs the dense MLP of intermediate_size on the same input, the two outputs
    # summed (transformers Gemma4TextDecoderLayer, enable_moe_block); vLLM runs it as its own MLP, reduced apart.
    dense_mlp_beside: bool = False
    # Gemma 4's router scales its input per channel (``scale``, hidden_size) and its weights per expert
    # (``per_expert_scale``, num_experts): two more vectors (transformers Gemma4TextRouter)
    router_scales: bool = False
    # Nemotron 3 Super / Ultra's latent MoE: the routed experts run on a projection of the hidden state to this width
    # (fc1_latent_proj [h, latent] before them, fc2_latent_proj [latent, h] after; router and shared expert on h); 0:
    # none
    latent_size: int = 0
    # an RMSNorm over the latent before fc2 (Kimi K3's latent_moe_use_norm: vLLM KimiMoE routed_expert_norm)
    latent_norm: bool = False
    # the latent projections stay 16-bit whatever the experts' format (Kimi K3's MXFP4 checkpoint stores
    # block_sparse_moe.routed_expert_down_proj.weight in bf16; SGLang kimi_k3.py KimiK3MoE builds both as
    # ReplicatedLinear(quant_config=None)); weights, bytes read and GEMMs take it from ``shard.latent_dtype``
    latent_16_bit: bool = False
    # Routing numerics the bundled decoder reproduces (no size depends on them): DeepSeek-V3 scores experts with a
    # sigmoid, picks the top ``groups_per_token`` of ``expert_groups`` groups first, and scales the routed sum.
    router_scoring: RouterScoring = "softmax"
    expert_groups: int = 1
    groups_per_token: int = 1
    routed_scaling_factor: float = 1.0
    # DeepSeek-V4's hash routing: the first ``hash_layers`` MoE layers pick experts from a fixed token-id table
    # (vocab x experts_per_token, a checkpoint tensor: tid2eid) and hold no score-correction bias
    hash_layers: int = 0

    def __post_init__(self) -> None:
        check_fields(self, "moe.")
        _require(self.experts_per_token <= self.num_experts,
                 f"moe.experts_per_token ({self.experts_per_token}) must be in 1..num_experts ({self.num_experts})")
        if self.num_shared_experts:
            _require(self.shared_expert_intermediate_size > 0,
                     "moe.shared_expert_intermediate_size must be positive when shared experts exist")
        _require(self.num_experts % self.expert_groups == 0,
                 f"moe.expert_groups ({self.expert_groups}) must divide num_experts ({self.num_experts})")
        _require(self.groups_per_token <= self.expert_groups,
                 f"moe.groups_per_token ({self.groups_per_token}) must be in 1..expert_groups ({self.expert_groups})")


# The per-layer components a quantized checkpoint may keep in another format (see ``WeightException``).
LAYER_COMPONENTS = ("attention", "mlp", "experts", "shared_experts", "router", "norms")
# The modules of a layer's component a checkpoint may keep apart (``WeightException.modules``; the names of
# ``tfcalc.calc.params.attention_modules``, ``indexer_modules`` and ``ffn_modules``)
LAYER_MODULES = {"attention": ("q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                               "kv_b_proj", "indexer.wq_b", "indexer.wk", "indexer.weights_proj"),
                 "mlp": ("gate_proj", "up_proj", "down_proj")}


@dataclass(frozen=True, kw_only=True)
class WeightException:
    """Layers whose ``components`` a quantized checkpoint keeps in ``dtype`` (Llama-3.1-405B-FP8 keeps every
    attention and the first and last layers' MLP in bf16), or only some ``modules`` of one component (NVIDIA's
    DeepSeek-V3.2 NVFP4 keeps MLA's q_a, q_b, kv_a, kv_b and the indexer in bf16 beside an nvfp4 o_proj). Applies
    when the component's chosen format is one of ``formats`` (any quantized format when empty)."""

    layers: tuple[int, ...]
    components: tuple[str, ...]
    dtype: str = "bf16"
    formats: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self, "quantized_weight_exceptions.")


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
    activation: Activation = "silu"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    attention_sinks: bool = False
    mlp_bias: bool = False
    norm_kind: NormKind = "rmsnorm"
    # a LayerNorm's bias (Cohere's LayerNorms hold a weight only: transformers CohereLayerNorm); RMSNorm has none
    norm_bias: bool = True
    norms_per_layer: int = 2
    # "post": the layer's two norms apply to its attention and FFN outputs, none to their inputs (OLMo 2, EXAONE 4)
    norm_placement: NormPlacement = "pre"
    # attention and FFN read the same normed input and both outputs join the residual: x + attn(n) + ffn(n), n =
    # norm(x), one norm per layer (Cohere's Command R / R7B / A: transformers CohereDecoderLayer)
    parallel_block: bool = False
    qk_norm: bool = False
    # q_norm / k_norm span all heads' projections at once (MiniMax-M2: RMSNorm over num_heads x head_dim, whose
    # statistics a tensor-parallel engine all-reduces) instead of each head's head_dim (Qwen3).
    qk_norm_across_heads: bool = False
    # q_norm / k_norm normalise each head over head_dim but hold a weight per head, [heads, head_dim] and
    # [kv_heads, head_dim] (Command R+'s use_qk_norm: CohereLayerNorm((heads, head_dim))), split over tp with them
    qk_norm_weights_per_head: bool = False
    sliding_window: int | None = None
    sliding_window_layers: tuple[int, ...] = ()
    local_attention: LocalAttention = "sliding"
    # Layers that apply no RoPE (Llama 4's NoPE layers, every fourth, attending to the whole context); their queries
    # are scaled by 1 + attn_temperature_scale x log(1 + floor((pos + 1) / attn_temperature_floor_scale)) when the
    # floor scale is set (transformers Llama4TextAttention, attn_temperature_tuning).
    nope_layers: tuple[int, ...] = ()
    attn_temperature_floor_scale: int | None = None
    attn_temperature_scale: float = 0.0
    # q and k RMS-normalised per head with no weight, after RoPE, on the RoPE layers only (Llama 4 Scout's
    # use_qk_norm: transformers Llama4TextL2Norm); no parameters, unlike ``qk_norm``.
    qk_l2_norm: bool = False
    # values RMS-normalised per head with no weight before the cache (Gemma 4's v_norm); no parameters
    v_norm: bool = False
    # RoPE rotates adjacent pairs (x_2i, x_2i+1) as complex numbers (Meta's Llama 4 reference, transformers
    # Llama4's apply_rotary_emb) instead of the two halves of each head.
    rope_interleaved: bool = False
    # Gated DeltaNet layers with a fixed per-sequence state (Qwen3-Next, Qwen3.5); the rest are attention layers.
    linear_attention: LinearAttentionSpec | None = None
    # q_proj also yields a sigmoid gate on each attention output channel (Qwen3-Next's gated attention: q_proj of
    # 2 x heads x head_dim); with MLA its own g_proj [h, heads x v_head_dim] (Kimi K3's mla_use_output_gate).
    attention_output_gate: bool = False
    # Kimi K3's attention residuals (attn_res_block_size; vLLM kimi_k3 KimiDecoderLayer): each layer's attention and
    # FFN read a learned mix of the earlier blocks' outputs, through an RMSNorm and a [h, 1] projection each (and one
    # pair before the final norm); 0: none. Only their parameters are counted.
    attention_residual_block: int = 0
    # a g_proj [hidden, heads] yields one sigmoid gate per query head, scaling that head's attention output before
    # o_proj (Step-3.7's per-head gating: transformers Step3p7Attention, gating true)
    attention_head_gate: bool = False
    mla: MLASpec | None = None
    # the full-attention layers' own shape where it differs from the sliding layers' (Gemma 4); None: the same
    full_attention: FullAttentionSpec | None = None
    # each attention layer's values come from its k projection: no v_proj (Gemma 4's full layers; set on
    # ``full_layer_spec``, or on a model whose every layer does it)
    # Nemotron-H's blocks hold one of a token mixer or an FFN: these layers have no FFN, those no mixer
    ffn_free_layers: tuple[int, ...] = ()
    mixer_free_layers: tuple[int, ...] = ()
    # each layer's dense MLP width where the layers differ (DeciLM / Llama-Nemotron NAS block_configs' ffn_mult;
    # vLLM nemotron_nas.py), 0 on the layers without an FFN; empty: intermediate_size on every layer, which is then
    # the widest (the activations' peak)
    layer_intermediate_sizes: tuple[int, ...] = ()
    # DSA's lightning indexer (DeepSeek-V3.2, GLM-5): the MLA attends at most its top-k tokens
    sparse_indexer: SparseIndexerSpec | None = None
    # DeepSeek-V4's sliding window + compressed (CSA / HCA) attention and hyper-connections
    compressed_attention: CompressedAttentionSpec | None = None
    attention_k_eq_v: bool = False
    # the values' head size where it differs from head_dim, the keys' (MiMo-V2-Flash: keys and queries of 192, values
    # of 128; v_proj and o_proj are that narrow and engines cache each at its own width); None: head_dim
    v_head_dim: int | None = None
    moe: MoESpec | None = None
    # the vision encoder and projector of a multimodal checkpoint (Gemma 3, Mistral 3, Qwen2.5-VL): loaded and
    # counted, never run by decode
    encoder: EncoderSpec | None = None
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    # The share of each head's dimensions RoPE rotates (the first head_dim x factor; GLM-4.5 and MiniMax-M2: 0.5).
    partial_rotary_factor: float = 1.0
    # RoPE base of the sliding-window layers where it differs, applied there unscaled (Gemma 3: 10,000 against
    # rope_theta 1,000,000 and the scaling of the global layers; transformers Gemma3RotaryEmbedding, "local").
    rope_local_theta: float | None = None
    # Numerics the bundled decoder reproduces (no size depends on them): Gemma 2 caps attention and final logits
    # with c * tanh(x / c), scales scores by query_pre_attn_scalar^-1/2, norms by (1 + w), embeddings by sqrt(h).
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    query_pre_attn_scalar: float | None = None
    norm_weight_offset: float = 0.0
    embedding_scale_sqrt_hidden: bool = False
    # Granite's multipliers (transformers GraniteModel / GraniteDecoderLayer / GraniteForCausalLM): embeddings times
    # embedding_multiplier, each attention and FFN output times residual_multiplier before its residual add, logits
    # divided by logits_scaling (Cohere's logit_scale s as 1 / s). No size depends on them.
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    max_context: int = 4096
    native_dtype: str = "bf16"
    # The KV cache format the checkpoint declares (ModelOpt's kv_cache_quant_algo or kv_cache_scheme): engines whose
    # --kv-cache-dtype auto follows the checkpoint store the cache in it (``EngineSpec.kv.checkpoint_dtype``);
    # None: the model's float dtype.
    checkpoint_kv_dtype: str | None = None
    # How the checkpoint's per-tensor fp8 linear layers scale their inputs: "static" (calibrated scales shipped in
    # it, as ModelOpt's) or "dynamic" (a max reduction per call); None: not declared, taken as static.
    checkpoint_activation_scale: str | None = None
    # The components whose float checkpoint weights multiply 16-bit activations (ModelOpt W4A16_NVFP4,
    # compressed-tensors NVFP4A16 / FP8 W8A16): a weight-only kernel even on chips with fp4 / fp8 tensor cores.
    checkpoint_weight_only: tuple[str, ...] = ()
    active_params_convention: ActiveConvention = "all_weights_touched"
    quantized_weight_exceptions: tuple[WeightException, ...] = ()
    # DeepSeek-V3's multi-token-prediction module(s) (num_nextn_predict_layers): shipped in the checkpoint for
    # speculative decoding, not part of the main model and not counted in its parameters, memory or work.
    num_mtp_layers: int = 0
    # The checkpoint a serving engine loads for this model (``vllm serve HF_REPO``): a Hugging Face repository id for
    # a preset (one of its aliases, sourced), a config.json's folder or ``_name_or_path``; None when unknown.
    hf_repo: str | None = None
    # The checkpoint's Hugging Face architecture class (config.json ``architectures[0]``, e.g. Qwen3MoeForCausalLM):
    # engines pick some kernels by it (SGLang's fused-MoE runner on Blackwell); None when unknown.
    architecture: str | None = None
    # The checkpoint ships its own model code (a config.json ``model_type`` transformers does not know, with an
    # ``auto_map``: Kimi K2): engines load it only with --trust-remote-code.
    remote_code: bool = False

    def __post_init__(self) -> None:
        n = self.name if isinstance(self.name, str) else "model"
        try:
            check_fields(self)
        except SpecError as exc:
            raise SpecError(f"{n}: {exc}") from None
        _require(self.num_attention_heads % self.num_kv_heads == 0,
                 f"{n}: num_attention_heads ({self.num_attention_heads}) is not divisible by "
                 f"num_kv_heads ({self.num_kv_heads})")
        from tfcalc.dtypes import PARAM_COMPONENTS, get_dtype, parse_weight_precision
        from tfcalc.errors import UsageError

        try:
            parse_weight_precision(self.native_dtype)
        except UsageError as exc:
            raise SpecError(f"{n}: native_dtype: {exc}") from None
        if self.checkpoint_kv_dtype is not None:
            try:
                get_dtype(self.checkpoint_kv_dtype)
            except UsageError as exc:
                raise SpecError(f"{n}: checkpoint_kv_dtype: {exc}") from None
        _require(self.checkpoint_activation_scale in (None, "static", "dynamic"),
                 f"{n}: checkpoint_activation_scale must be static or dynamic, got "
                 f"{self.checkpoint_activation_scale!r:.40}")
        _require(set(self.checkpoint_weight_only) <= set(PARAM_COMPONENTS),
                 f"{n}: checkpoint_weight_only names a component that is not one of {', '.join(PARAM_COMPONENTS)}")
        _require(not self.qk_norm_across_heads or self.qk_norm, f"{n}: qk_norm_across_heads needs qk_norm")
        _require(not self.attention_head_gate or (self.mla is None and self.compressed_attention is None
                                                  and not self.attention_output_gate),
                 f"{n}: attention_head_gate is for GQA / MHA attention without attention_output_gate")
        _require(self.norm_placement == "pre" or self.norms_per_layer == 2,
                 f"{n}: norm_placement post needs norms_per_layer 2 (one norm per output), not {self.norms_per_layer}")
        _require(not self.qk_norm_weights_per_head or (self.qk_norm and not self.qk_norm_across_heads),
                 f"{n}: qk_norm_weights_per_head needs qk_norm, per head (not qk_norm_across_heads)")
        _require(self.norm_bias or self.norm_kind == "layernorm", f"{n}: norm_bias false is for LayerNorms (an "
                 "RMSNorm has no bias)")
        _require(not self.parallel_block or (self.norms_per_layer == 1 and not self.ffn_free_layers
                                             and not self.mixer_free_layers),
                 f"{n}: parallel_block needs one norm per layer (norms_per_layer 1) and a mixer and an FFN in "
                 "every layer")
        rotated = self.head_dim * self.partial_rotary_factor
        _require(self.mla is not None or (rotated == int(rotated) and int(rotated) % 2 == 0),
                 f"{n}: partial_rotary_factor ({self.partial_rotary_factor}) x head_dim ({self.head_dim}) must be "
                 "an even number of dimensions")
        if self.sliding_window is None:
            _require(not self.sliding_window_layers, f"{n}: sliding_window_layers given without sliding_window")
            _require(self.local_attention == "sliding", f"{n}: local_attention chunked needs sliding_window (the "
                     "chunk size)")
        try:
            check_layer_indices("sliding_window_layers", self.sliding_window_layers, self.num_layers)
            check_layer_indices("nope_layers", self.nope_layers, self.num_layers)
            if self.moe is not None:
                check_layer_indices("moe.dense_layers", self.moe.dense_layers, self.num_layers)
        except SpecError as exc:
            raise SpecError(f"{n}: {exc}") from None
        if self.mla is not None:
            _require(not self.sliding_window_layers, f"{n}: MLA with sliding-window layers is not supported")
        if self.ffn_free_layers or self.mixer_free_layers:
            try:
                check_layer_indices("ffn_free_layers", self.ffn_free_layers, self.num_layers)
                check_layer_indices("mixer_free_layers", self.mixer_free_layers, self.num_layers)
            except SpecError as exc:
                raise SpecError(f"{n}: {exc}") from None
            _require(not set(self.ffn_free_layers) & set(self.mixer_free_layers),
                     f"{n}: a layer is listed both without an FFN and without a mixer")
            _require(self.moe is None or set(self.ffn_free_layers) <= set(self.moe.dense_layers),
                     f"{n}: a layer without an FFN must be among moe.dense_layers")
            linear = set(self.linear_attention.layers) if self.linear_attention is not None else set()
            _require(not set(self.mixer_free_layers) & (linear | set(self.sliding_window_layers)),
                     f"{n}: a layer without a mixer is listed as a linear-attention or sliding-window layer")
        widths = self.layer_intermediate_sizes
        if widths:
            _require(len(widths) == self.num_layers and self.moe is None,
                     f"{n}: layer_intermediate_sizes needs one width per layer ({self.num_layers}) and no MoE")
            for i, w in enumerate(widths):
                _require((w == 0) == (i in self._ffn_free_set) and 0 <= w <= self.intermediate_size,
                         f"{n}: layer_intermediate_sizes[{i}] ({w}) must be 0 on a layer without an FFN, else "
                         f"1..intermediate_size ({self.intermediate_size})")
            _require(all(not set(x.components) & {"mlp"} for x in self.quantized_weight_exceptions),
                     f"{n}: quantized_weight_exceptions of the MLP with per-layer MLP widths are not supported")
        si = self.sparse_indexer
        if si is not None:
            try:
                check_layer_indices("sparse_indexer.layers", si.layers, self.num_layers)
            except SpecError as exc:
                raise SpecError(f"{n}: {exc}") from None
        if si is not None and si.kind == "minimax_m3":
            _require(self.mla is None and self.linear_attention is None and self.num_kv_heads == si.num_heads,
                     f"{n}: a minimax_m3 sparse_indexer needs GQA attention with one indexer head per KV head "
                     f"({si.num_heads} indexer heads, {self.num_kv_heads} KV heads)")
        elif si is not None:
            _require(self.mla is not None and self.mla.q_lora_rank is not None,
                     f"{n}: sparse_indexer needs MLA with a q_lora_rank (its queries come from q_lora)")
            _require(si.block_size == 1, f"{n}: a dsa sparse_indexer selects single tokens (block_size 1)")
            _require(0 in si.layers, f"{n}: sparse_indexer.layers must include layer 0 (a later layer reuses the "
                     "choice of an earlier indexed one)")
            _require(si.head_dim >= self.rotary_dim and si.head_dim % 128 == 0,
                     f"{n}: sparse_indexer.head_dim ({si.head_dim}) must be a multiple of 128, at least the rotary "
                     f"dimensions ({self.rotary_dim})")
        ca = self.compressed_attention
        if ca is not None:
            _require(self.mla is None and self.linear_attention is None and self.full_attention is None
                     and self.sparse_indexer is None, f"{n}: compressed_attention is a model's only attention kind")
            _require(self.num_kv_heads == 1 and self.sliding_window is not None
                     and len(self.sliding_window_layers) == self.num_layers,
                     f"{n}: compressed_attention needs one KV head and a sliding window on every layer")
            _require((self.num_attention_heads * self.head_dim) % ca.o_groups == 0
                     and self.num_attention_heads % ca.o_groups == 0,
                     f"{n}: compressed_attention.o_groups ({ca.o_groups}) must divide the attention heads "
                     f"({self.num_attention_heads})")
            try:
                check_layer_indices("compressed_attention.csa_layers", ca.csa_layers, self.num_layers)
                check_layer_indices("compressed_attention.hca_layers", ca.hca_layers, self.num_layers)
            except SpecError as exc:
                raise SpecError(f"{n}: {exc}") from None
        if self.moe is not None and self.moe.hash_layers:
            _require(self.moe.hash_layers <= self.num_moe_layers,
                     f"{n}: moe.hash_layers ({self.moe.hash_layers}) exceeds the {self.num_moe_layers} MoE layers")
        _require(self.v_head_dim is None or (self.mla is None and not self.attention_k_eq_v),
                 f"{n}: v_head_dim is for attention with its own v projection (MLA gives mla.v_head_dim)")
        fa = self.full_attention
        if fa is not None:
            _require(fa.v_head_dim is None or not fa.k_eq_v,
                     f"{n}: full_attention.v_head_dim is for layers with their own v projection")
            _require(self.mla is None and self.linear_attention is None,
                     f"{n}: full_attention is for models of sliding and full softmax-attention layers only")
            _require(self.num_attention_heads % fa.num_kv_heads == 0,
                     f"{n}: num_attention_heads ({self.num_attention_heads}) is not divisible by "
                     f"full_attention.num_kv_heads ({fa.num_kv_heads})")
            rotated_full = fa.head_dim * fa.partial_rotary_factor
            _require(rotated_full == int(rotated_full) and int(rotated_full) % 2 == 0,
                     f"{n}: full_attention.partial_rotary_factor ({fa.partial_rotary_factor}) x head_dim "
                     f"({fa.head_dim}) must be an even number of dimensions")
        if self.moe is not None and self.moe.dense_mlp_beside:
            _require(not self.moe.num_shared_experts, f"{n}: moe.dense_mlp_beside with shared experts is not "
                     "supported")
        if self.linear_attention is not None:
            try:
                check_layer_indices("linear_attention.layers", self.linear_attention.layers, self.num_layers)
            except SpecError as exc:
                raise SpecError(f"{n}: {exc}") from None
            _require(self.mla is None or self.linear_attention.kind == "kda",
                     f"{n}: MLA with linear-attention layers other than KDA (Kimi Linear) is not supported")
            _require(not set(self.linear_attention.layers) & set(self.sliding_window_layers),
                     f"{n}: a layer is both a linear-attention and a sliding-window layer")
        for x in self.quantized_weight_exceptions:
            for c in x.components:
                _require(c in LAYER_COMPONENTS, f"{n}: quantized_weight_exceptions component '{c}' is not one of "
                         f"{', '.join(LAYER_COMPONENTS)}")
            if x.modules:
                (c, *more), known = x.components, LAYER_MODULES.get(x.components[0], ())
                _require(not more and set(x.modules) <= set(known), f"{n}: quantized_weight_exceptions modules "
                         f"name modules of one component: attention or mlp, got {', '.join(x.modules)} of "
                         f"{', '.join(x.components)}")
                _require(c != "attention" or not (self.linear_attention or self.full_attention), f"{n}: "
                         "quantized_weight_exceptions modules of a hybrid or Gemma 4 attention are not supported")
            try:
                check_layer_indices("quantized_weight_exceptions.layers", x.layers, self.num_layers)
                for name in (x.dtype, *x.formats):
                    parse_weight_precision(name)
            except UsageError as exc:
                raise SpecError(f"{n}: quantized_weight_exceptions: {exc}") from None
            except SpecError as exc:
                raise SpecError(f"{n}: {exc}") from None

    # --- derived shape facts -------------------------------------------------------------
    @property
    def attention_kind(self) -> str:
        """MLA, CSA/HCA (DeepSeek-V4), MHA (kv heads == heads), MQA (one kv head) or GQA (in between)."""
        if self.mla is not None:
            return "MLA"
        if self.compressed_attention is not None:
            return "CSA/HCA"
        if self.num_kv_heads == self.num_attention_heads:
            return "MHA"
        if self.num_kv_heads == 1:
            return "MQA"
        return "GQA"

    @functools.cached_property
    def _dense_layer_set(self) -> frozenset[int]:
        return frozenset(self.moe.dense_layers) if self.moe is not None else frozenset()

    @functools.cached_property
    def _sliding_layer_set(self) -> frozenset[int]:
        return frozenset(self.sliding_window_layers)

    @functools.cached_property
    def full_layer_spec(self) -> ModelSpec:
        """The model as its full-attention layers are shaped: itself, or with ``full_attention``'s head_dim, KV heads,
        k_eq_v and rotary share (Gemma 4); per-layer formulas take it for those layers."""
        fa = self.full_attention
        if fa is None:
            return self
        return replace(self, head_dim=fa.head_dim, num_kv_heads=fa.num_kv_heads, attention_k_eq_v=fa.k_eq_v,
                       partial_rotary_factor=fa.partial_rotary_factor, full_attention=None,
                       v_head_dim=fa.v_head_dim if fa.v_head_dim is not None else self.v_head_dim,
                       attention_sinks=self.attention_sinks if fa.attention_sinks is None else fa.attention_sinks)

    @property
    def value_head_dim(self) -> int:
        """The values' head size: ``v_head_dim`` where set, else head_dim (MLA's is ``mla.v_head_dim``)."""
        return self.v_head_dim if self.v_head_dim is not None else self.head_dim

    @property
    def head_kv_elements(self) -> int:
        """One KV head's key and value per token: head_dim + value_head_dim (2 x head_dim where they are as wide)."""
        return self.head_dim + self.value_head_dim

    def layer_kind_spec(self, sliding: bool) -> ModelSpec:
        """The shape of a sliding (``sliding``) or full attention layer: ``full_layer_spec`` for a full one."""
        return self if sliding else self.full_layer_spec

    @property
    def num_full_layers(self) -> int:
        """Softmax-attention layers without a window (or chunk)."""
        return self.num_attention_layers - self.num_sliding_layers

    @property
    def rotary_dim(self) -> int:
        """Dimensions RoPE rotates in each q/k head: MLA's qk_rope_head_dim, else head_dim x partial_rotary_factor."""
        if self.mla is not None:
            return self.mla.qk_rope_head_dim
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self._dense_layer_set

    @property
    def num_moe_layers(self) -> int:
        """Layers with a routed FFN: all but the (distinct, validated) dense ones."""
        return 0 if self.moe is None else self.num_layers - len(self._dense_layer_set)

    def is_sliding_layer(self, layer: int) -> bool:
        """A local-attention layer: a sliding window, or a chunk when ``local_attention`` is chunked."""
        return layer in self._sliding_layer_set

    @property
    def chunked_attention(self) -> bool:
        """The local layers attend within fixed chunks of ``sliding_window`` tokens (Llama 4), not a window."""
        return self.local_attention == "chunked" and self.sliding_window is not None

    @functools.cached_property
    def _linear_layer_set(self) -> frozenset[int]:
        return frozenset(self.linear_attention.layers) if self.linear_attention is not None else frozenset()

    def is_linear_layer(self, layer: int) -> bool:
        """A Gated DeltaNet layer (no KV cache, a fixed state per sequence)."""
        return layer in self._linear_layer_set

    @property
    def num_indexer_layers(self) -> int:
        """Layers that run their own DSA indexer (and cache its keys); 0 without one."""
        return len(self.sparse_indexer.layers) if self.sparse_indexer is not None else 0

    @property
    def num_linear_layers(self) -> int:
        return len(self._linear_layer_set)

    @property
    def num_attention_layers(self) -> int:
        """Layers with softmax attention and a KV cache: all but the linear-attention ones and those without a mixer."""
        return self.num_layers - self.num_linear_layers - len(self.mixer_free_layers)

    @functools.cached_property
    def _ffn_free_set(self) -> frozenset[int]:
        return frozenset(self.ffn_free_layers)

    @functools.cached_property
    def _mixer_free_set(self) -> frozenset[int]:
        return frozenset(self.mixer_free_layers)

    def has_ffn(self, layer: int) -> bool:
        """Whether ``layer`` runs an FFN (a dense MLP or experts): all but Nemotron-H's mixer blocks."""
        return layer not in self._ffn_free_set

    def has_mixer(self, layer: int) -> bool:
        """Whether ``layer`` mixes tokens (attention or a recurrence): all but Nemotron-H's MLP and MoE blocks."""
        return layer not in self._mixer_free_set

    def ffn_width(self, layer: int) -> int:
        """``layer``'s dense MLP width: its ``layer_intermediate_sizes`` entry, else intermediate_size."""
        return self.layer_intermediate_sizes[layer] if self.layer_intermediate_sizes else self.intermediate_size

    @functools.cached_property
    def dense_mlp_widths(self) -> tuple[tuple[int, int], ...]:
        """(width, layers) of the dense MLPs, widest first: one entry, (intermediate_size, num_dense_mlp_layers),
        unless the widths differ per layer (``layer_intermediate_sizes``)."""
        if not self.layer_intermediate_sizes:
            return ((self.intermediate_size, self.num_dense_mlp_layers),) if self.num_dense_mlp_layers else ()
        counts: dict[int, int] = {}
        for w in self.layer_intermediate_sizes:
            if w:
                counts[w] = counts.get(w, 0) + 1
        return tuple(sorted(counts.items(), reverse=True))

    @property
    def num_dense_mlp_layers(self) -> int:
        """Layers that run the dense MLP: every one with an FFN that is not an MoE layer (every layer when the MoE runs
        beside the MLP)."""
        if self.moe is not None and self.moe.dense_mlp_beside:
            return self.num_layers
        return self.num_layers - self.num_moe_layers - len(self.ffn_free_layers)

    @property
    def num_sliding_layers(self) -> int:
        return len(self._sliding_layer_set) if self.sliding_window is not None else 0

    def with_overrides(self, **changes: object) -> ModelSpec:
        """A copy with some fields changed (validated again); ``layers`` trims per-layer patterns."""
        layers = changes.pop("layers", None)
        spec = self
        if layers is not None:
            n = int(layers)  # type: ignore[call-overload]
            moe = spec.moe
            if moe is not None:
                moe = replace(moe, dense_layers=tuple(i for i in moe.dense_layers if i < n))
            exceptions = tuple(replace(x, layers=tuple(i for i in x.layers if i < n))
                               for x in spec.quantized_weight_exceptions)
            linear = spec.linear_attention
            if linear is not None:
                linear = replace(linear, layers=tuple(i for i in linear.layers if i < n))
            indexer = spec.sparse_indexer
            if indexer is not None:
                indexer = replace(indexer, layers=tuple(i for i in indexer.layers if i < n))
            spec = replace(spec, ffn_free_layers=tuple(i for i in spec.ffn_free_layers if i < n),
                           mixer_free_layers=tuple(i for i in spec.mixer_free_layers if i < n),
                           layer_intermediate_sizes=spec.layer_intermediate_sizes[:n])
            spec = replace(spec, num_layers=n, moe=moe, quantized_weight_exceptions=exceptions, linear_attention=linear,
                           sparse_indexer=indexer,
                           sliding_window_layers=tuple(i for i in spec.sliding_window_layers if i < n),
                           nope_layers=tuple(i for i in spec.nope_layers if i < n))
        return replace(spec, **changes) if changes else spec
