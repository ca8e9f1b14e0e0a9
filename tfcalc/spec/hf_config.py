"""Hugging Face ``config.json`` -> ModelSpec, following what transformers builds for each ``model_type``.

Each supported family is one ``_Family`` entry: the config-class defaults used when a key is absent (copied
from ``transformers/models/<type>/configuration_<type>.py``; a test compares them with the installed classes),
the keys a real config.json always carries, and small rule functions for the things that differ between
families: attention biases, sliding-window layers and the MoE / MLA layout. A test instantiates every fixture
with transformers on the meta device and checks the parameter count to the single parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, NamedTuple

from tfcalc.dtypes import parse_weight_precision
from tfcalc.errors import SpecError
from tfcalc.spec.hf_quant import (
    checkpoint_activation_scale,
    checkpoint_kv_dtype,
    checkpoint_precision,
    checkpoint_weight_only,
)
from tfcalc.spec.model import (
    FLOAT_LIMITS,
    HYBRID_BLOCKS,
    INT_LIMITS,
    CompressedAttentionSpec,
    EncoderSpec,
    FullAttentionSpec,
    LinearAttentionSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    RopeScaling,
    SparseIndexerSpec,
    check_float,
)
from tfcalc.spec.model import check_int as check_spec_int
from tfcalc.spec.presets import read_data_file

SLIDING, FULL, LINEAR, CHUNKED = "sliding_attention", "full_attention", "linear_attention", "chunked_attention"
MAX_PATH_CHARS = 4096  # PATH_MAX: a repository id or a folder
_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_CORE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
# ``head_dim`` default meaning "hidden_size // num_attention_heads" (transformers' fallback when absent).
DERIVED = None
# config.json keys -> the ModelSpec field whose bounds (tfcalc.spec.model.INT_LIMITS) they share. Layer counts
# and indices share num_layers' bound; any other integer is bounded by 2^62.
_SPEC_FIELD = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_kv_heads", "head_dim": "head_dim",
    "intermediate_size": "intermediate_size", "max_position_embeddings": "max_context",
    "sliding_window": "sliding_window", "num_local_experts": "moe.num_experts", "num_experts": "moe.num_experts",
    "n_routed_experts": "moe.num_experts", "num_experts_per_tok": "moe.experts_per_token",
    "moe_intermediate_size": "moe.expert_intermediate_size",
    "shared_expert_intermediate_size": "moe.shared_expert_intermediate_size",
    "n_shared_experts": "moe.num_shared_experts", "q_lora_rank": "mla.q_lora_rank",
    "kv_lora_rank": "mla.kv_lora_rank", "qk_nope_head_dim": "mla.qk_nope_head_dim",
    "qk_rope_head_dim": "mla.qk_rope_head_dim", "v_head_dim": "mla.v_head_dim",
    "rope_scaling.original_max_position_embeddings": "rope_scaling.original_max_position_embeddings",
    "n_group": "moe.expert_groups", "topk_group": "moe.groups_per_token",
    "intermediate_size_mlp": "intermediate_size", "attention_chunk_size": "sliding_window",
    "floor_scale": "attn_temperature_floor_scale",
    **dict.fromkeys(("first_k_dense_replace", "max_window_layers", "moe_layer_freq", "decoder_sparse_step",
                     "sliding_window_pattern", "mlp_only_layers", "num_nextn_predict_layers", "moe_layers",
                     "interleave_moe_layer_step", "no_rope_layer_interval"), "num_layers"),
}

# config.json number keys -> the ModelSpec field whose bounds (tfcalc.spec.model.FLOAT_LIMITS) they share.
_SPEC_FLOAT_FIELD = {"routed_scaling_factor": "moe.routed_scaling_factor", "attn_scale": "attn_temperature_scale",
                     "moe_router_scaling_factor": "moe.routed_scaling_factor"}


class _Config:
    """A config.json mapping with its family's defaults and one-line errors naming the file and the field."""

    def __init__(self, data: Mapping[str, Any], origin: str, model_type: str, defaults: Mapping[str, Any]):
        self.data, self.origin, self.model_type, self.defaults = data, origin, model_type, defaults

    def error(self, message: str) -> SpecError:
        return SpecError(f"{self.origin}: {message}")

    def get(self, key: str) -> Any:
        """The config value; the config class's default when the key is absent (``null`` is kept)."""
        if key in self.data:
            return self.data[key]
        return self.defaults.get(key)

    def require(self, key: str) -> Any:
        if self.data.get(key) is None:
            raise self.error(f"missing required field '{key}' (model_type {self.model_type})")
        return self.data[key]

    def check_int(self, key: str, value: Any, minimum: int) -> int:
        """An integer >= minimum and within the bound of the ModelSpec field it becomes (``_SPEC_FIELD``)."""
        maximum = INT_LIMITS[_SPEC_FIELD[key]][1] if key in _SPEC_FIELD else 1 << 62
        try:
            return check_spec_int(key, value, (minimum, maximum))
        except SpecError as exc:
            raise self.error(str(exc)) from None

    def req_int(self, key: str, minimum: int = 1) -> int:
        return self.check_int(key, self.require(key), minimum)

    def int_or_default(self, key: str, minimum: int = 0) -> int:
        """An integer that falls back to the family default when absent or null."""
        value = self.get(key)
        if value is None:
            value = self.defaults.get(key)
        if value is None:
            raise self.error(f"missing required field '{key}' (model_type {self.model_type})")
        return self.check_int(key, value, minimum)

    def opt_int(self, key: str, minimum: int = 0) -> int | None:
        value = self.get(key)
        return None if value is None else self.check_int(key, value, minimum)

    def opt_float(self, key: str) -> float | None:
        """A finite number within the FLOAT_LIMITS of the ModelSpec field it becomes (``_SPEC_FLOAT_FIELD``; a
        key not listed there is a field of its own name), or None when absent or null."""
        value = self.get(key)
        if value is None:
            return None
        try:
            return check_float(key, value, bounds_of=_SPEC_FLOAT_FIELD.get(key, key))
        except SpecError as exc:
            raise self.error(str(exc)) from None

    def req_float(self, key: str) -> float:
        value = self.opt_float(key)
        if value is None:
            raise self.error(f"missing required field '{key}' (model_type {self.model_type})")
        return value

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if value is None:
            value = self.defaults.get(key, False)
        if not isinstance(value, bool):
            raise self.error(f"field '{key}' must be true or false, got {value!r}")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(f"field '{key}' must be a list of layer indices, got {value!r}")
        return [self.check_int(key, v, 0) for v in value]

    @property
    def num_layers(self) -> int:
        return self.req_int("num_hidden_layers")

    def layer_types(self, kinds: tuple[str, ...] = (SLIDING, FULL), padding: int = 0) -> list[str] | None:
        """``layer_types`` validated against the layer count and the family's ``kinds``, or None when absent; a list
        ``padding`` entries longer (Step-3.7's, one per MTP layer) is cut to the layer count."""
        value = self.data.get("layer_types")
        if value is None:
            return None
        if padding and isinstance(value, list) and len(value) == self.num_layers + padding:
            value = value[:self.num_layers]
        if not isinstance(value, list) or len(value) != self.num_layers:
            got = f"{len(value)} entries" if isinstance(value, list) else repr(value)
            raise self.error(f"field 'layer_types' must be a list of {self.num_layers} entries, got {got}")
        for entry in value:
            if entry not in kinds:
                raise self.error(f"field 'layer_types' has unsupported entry {entry!r:.40} "
                                 f"(supported: {', '.join(kinds)})")
        return value


# --- attention biases -----------------------------------------------------------------------------------------

def _bias_from_attention_bias(c: _Config) -> dict[str, bool]:
    """Llama, Gemma, Qwen3, DeepSeek, gpt-oss: ``attention_bias`` puts a bias on q, k, v AND o."""
    bias = c.flag("attention_bias")
    return {"qkv_bias": bias, "o_bias": bias}


def _no_bias(c: _Config) -> dict[str, bool]:
    """Mistral, Mixtral, Phi-3: every attention projection is bias-free whatever the config says."""
    return {"qkv_bias": False, "o_bias": False}


def _qkv_bias_from_attention_bias(c: _Config) -> dict[str, bool]:
    """Glm4MoeAttention: ``attention_bias`` puts a bias on q, k and v; o_proj never has one."""
    return {"qkv_bias": c.flag("attention_bias"), "o_bias": False}


def _qwen2_bias(c: _Config) -> dict[str, bool]:
    """Qwen2Attention: q, k, v always carry a bias, o_proj never (no config flag)."""
    return {"qkv_bias": True, "o_bias": False}


def _qwen2_moe_bias(c: _Config) -> dict[str, bool]:
    """Qwen2MoeAttention: q, k, v bias per ``qkv_bias`` (default true), o_proj never."""
    return {"qkv_bias": c.flag("qkv_bias"), "o_bias": False}


# --- sliding-window layers --------------------------------------------------------------------------------------

SlidingRule = Callable[[_Config], tuple[int | None, tuple[int, ...]]]


def _no_sliding(c: _Config) -> tuple[int | None, tuple[int, ...]]:
    return None, ()


def _window_every_layer(enabled_key: str | None = None) -> SlidingRule:
    """Mistral, Mixtral, Phi-3 (and Qwen3-MoE when ``use_sliding_window``): one window on every layer.

    These models pass ``config.sliding_window`` to every attention layer and ignore ``layer_types``.
    """

    def rule(c: _Config) -> tuple[int | None, tuple[int, ...]]:
        if enabled_key is not None and not c.flag(enabled_key):
            return None, ()
        window = c.opt_int("sliding_window")
        return (window, tuple(range(c.num_layers))) if window else (None, ())

    return rule


def _window_by_layer_type(default_sliding: Callable[[_Config, int], bool],
                          enabled_key: str | None = None, mtp_padded: bool = False) -> SlidingRule:
    """Families whose attention reads ``layer_types`` (authoritative when present; else the class's pattern);
    ``mtp_padded``: a list with an entry more per MTP layer is cut to the layer count (Step3p7TextConfig)."""

    def rule(c: _Config) -> tuple[int | None, tuple[int, ...]]:
        if enabled_key is not None and not c.flag(enabled_key):
            return None, ()
        window = c.opt_int("sliding_window")
        if not window:
            return None, ()
        types = c.layer_types(padding=_mtp_layers(c) if mtp_padded else 0)
        if types is None:
            types = [SLIDING if default_sliding(c, i) else FULL for i in range(c.num_layers)]
        layers = tuple(i for i, kind in enumerate(types) if kind == SLIDING)
        return (window, layers) if layers else (None, ())

    return rule


def _mtp_layers(c: _Config) -> int:
    """``num_nextn_predict_layers``: the multi-token-prediction layers a checkpoint ships beside its decoder."""
    return c.opt_int("num_nextn_predict_layers") or 0


def _no_default_sliding(c: _Config, i: int) -> bool:
    """Step3p7TextConfig: without ``layer_types`` every layer is a full-attention one."""
    return False


def _even_layers(c: _Config, i: int) -> bool:
    """Gemma 2, gpt-oss: ``"sliding_attention" if bool((i + 1) % 2)``: layers 0, 2, 4, ... slide."""
    return i % 2 == 0


def _gemma3_pattern(c: _Config, i: int) -> bool:
    """Gemma 3: every ``sliding_window_pattern``-th layer (default 6) is global, the rest slide."""
    pattern = c.int_or_default("sliding_window_pattern", minimum=1)
    return (i + 1) % pattern != 0


# Exaone4Config's sliding_window_pattern default, Cohere2Config's (kwargs.pop) too; not a family default, a key
# the family-defaults test reads as Gemma 3's (6)
_GLOBAL_PATTERN = 4


def _every_fourth_global(c: _Config, i: int) -> bool:
    """Cohere2Config's and Exaone4Config's default ``layer_types``: every ``sliding_window_pattern``-th layer global
    (``_GLOBAL_PATTERN`` where the config names none), the rest slide. A string pattern ("LLLG") without
    ``layer_types`` is refused: transformers cannot read it either."""
    pattern = c.data.get("sliding_window_pattern", _GLOBAL_PATTERN)
    if isinstance(pattern, str):
        raise c.error(f"field 'sliding_window_pattern' {pattern!r:.20} without 'layer_types' is not supported "
                      "(an integer, or layer_types)")
    return (i + 1) % c.check_int("sliding_window_pattern", pattern, 1) != 0


_every_fourth_global_sliding = _window_by_layer_type(_every_fourth_global)


def _global_nope(c: _Config) -> tuple[int, ...]:
    """The layers ``_every_fourth_global_sliding`` leaves global, which apply no RoPE (Cohere2Attention,
    Exaone4Attention: RoPE only ``if self.sliding_window is None or self.is_sliding``)."""
    sliding = set(_every_fourth_global_sliding(c)[1])
    return tuple(i for i in range(c.num_layers) if i not in sliding)


def _qwen_upper_layers(c: _Config, i: int) -> bool:
    """Qwen2/Qwen3: layers from ``max_window_layers`` on use the window."""
    return i >= c.int_or_default("max_window_layers")


def _qwen2_moe_pattern(c: _Config, i: int) -> bool:
    """Qwen2-MoE's class default: even layers below ``max_window_layers``."""
    return (i + 1) % 2 == 1 and i < c.int_or_default("max_window_layers")


# --- mixture of experts ------------------------------------------------------------------------------------------

MoERule = Callable[[_Config], MoESpec | None]


def _mixtral_moe(c: _Config) -> MoESpec:
    """MixtralSparseMoeBlock: every layer, experts of ``intermediate_size``, router without bias."""
    return MoESpec(num_experts=c.req_int("num_local_experts"), experts_per_token=c.req_int("num_experts_per_tok"),
                   expert_intermediate_size=c.req_int("intermediate_size"), normalize_top_k=True)


def _qwen_dense_layers(c: _Config) -> tuple[int, ...]:
    """Qwen MoE decoder layer: MoE unless in ``mlp_only_layers`` or ``(i + 1) % decoder_sparse_step != 0``."""
    step = c.int_or_default("decoder_sparse_step", minimum=1)
    only = set(c.int_list("mlp_only_layers"))
    return tuple(i for i in range(c.num_layers) if i in only or (i + 1) % step != 0)


def _qwen_moe(shared_expert: bool, every_layer: bool = False, renormalised: bool = False) -> MoERule:
    """Qwen2-MoE and Qwen3-Next (one shared expert with a sigmoid gate), Qwen3-MoE (no shared expert); Qwen3.5-MoE
    (``every_layer``): MoE on every layer, top-k scores always renormalised (no mlp_only_layers, no norm_topk_prob);
    Qwen3-VL-MoE (``renormalised``): Qwen3-MoE's layers, its top-k scores always renormalised
    (Qwen3VLMoeTextTopKRouter reads no norm_topk_prob)."""

    def rule(c: _Config) -> MoESpec | None:
        experts = c.req_int("num_experts", minimum=0 if not every_layer else 1)
        if experts == 0:  # transformers builds dense MLPs everywhere
            return None
        shared = {}
        if shared_expert:
            shared = {"num_shared_experts": 1,
                      "shared_expert_intermediate_size": c.int_or_default("shared_expert_intermediate_size", minimum=1),
                      "shared_expert_gate": True}
        return MoESpec(num_experts=experts, experts_per_token=c.req_int("num_experts_per_tok"),
                       expert_intermediate_size=c.req_int("moe_intermediate_size"),
                       dense_layers=() if every_layer else _qwen_dense_layers(c),
                       normalize_top_k=every_layer or renormalised or c.flag("norm_topk_prob"), **shared)

    return rule


def _listed_dense_layers(c: _Config, padding: int = 0) -> tuple[int, ...] | None:
    """The dense layers a config's ``mlp_layer_types`` names ("dense" or "sparse" per layer: transformers'
    GLM-4.7-Flash, MiMo-V2-Flash and Step-3.7 classes; a list ``padding`` entries longer, one per MTP layer, cut to
    the layer count as Step3p7TextConfig does), or None where it gives none."""
    kinds = c.data.get("mlp_layer_types")
    if kinds is None:
        return None
    if padding and isinstance(kinds, list) and len(kinds) == c.num_layers + padding:
        kinds = kinds[:c.num_layers]
    if not isinstance(kinds, list) or len(kinds) != c.num_layers or not all(k in ("dense", "sparse") for k in kinds):
        raise c.error(f"field 'mlp_layer_types' must list 'dense' or 'sparse' for each of the {c.num_layers} layers, "
                      f"got {kinds!r:.60}")
    return tuple(i for i, kind in enumerate(kinds) if kind == "dense")


def _deepseek_moe(score_correction_bias: bool, experts_key: str = "n_routed_experts") -> MoERule:
    """DeepSeek V2/V3: dense MLP before ``first_k_dense_replace``; ``n_shared_experts`` of ``moe_intermediate_size``.

    ``moe_layer_freq`` follows DeepSeek's own modeling code (MoE when ``i % moe_layer_freq == 0``); transformers'
    port ignores it, which agrees for every released checkpoint (all use 1). V3's router also holds
    ``e_score_correction_bias`` (one per expert). A config that lists ``mlp_layer_types`` (GLM-4.7-Flash's
    transformers class: "dense" or "sparse" per layer) is read by it. ``experts_key``: the expert count's key
    (KimiLinearConfig's num_local_experts).
    """

    def rule(c: _Config) -> MoESpec:
        experts = c.int_or_default(experts_key, minimum=1)
        first_dense = c.int_or_default("first_k_dense_replace")
        freq = c.int_or_default("moe_layer_freq", minimum=1)
        dense = _listed_dense_layers(c)
        if dense is None:
            dense = tuple(i for i in range(c.num_layers) if i < first_dense or i % freq != 0)
        shared = c.int_or_default("n_shared_experts")
        moe_size = c.req_int("moe_intermediate_size")
        routing = {}
        if score_correction_bias:  # DeepseekV3TopkRouter: sigmoid scores, group-limited top-k, scaled sum
            routing = {"router_scoring": "sigmoid", "expert_groups": c.int_or_default("n_group", minimum=1),
                       "groups_per_token": c.int_or_default("topk_group", minimum=1),
                       "routed_scaling_factor": c.req_float("routed_scaling_factor")}
        return MoESpec(num_experts=experts, experts_per_token=c.req_int("num_experts_per_tok"),
                       expert_intermediate_size=moe_size, num_shared_experts=shared,
                       shared_expert_intermediate_size=moe_size if shared else 0, dense_layers=dense,
                       router_score_correction_bias=score_correction_bias, normalize_top_k=c.flag("norm_topk_prob"),
                       **routing)

    return rule


def _gpt_oss_moe(c: _Config) -> MoESpec:
    """GptOssMLP: router with bias, experts with gate_up and down biases, every layer MoE."""
    return MoESpec(num_experts=c.req_int("num_local_experts"), experts_per_token=c.req_int("num_experts_per_tok"),
                   expert_intermediate_size=c.req_int("intermediate_size"), router_bias=True, expert_bias=True,
                   normalize_top_k=True)


def _minimax_m2_moe(c: _Config) -> MoESpec:
    """MiniMaxM2SparseMoeBlock: every layer, experts of ``intermediate_size``, sigmoid scores plus a correction
    bias (``e_score_correction_bias``) choose the top k, whose scores are renormalised."""
    return MoESpec(num_experts=c.req_int("num_local_experts"), experts_per_token=c.req_int("num_experts_per_tok"),
                   expert_intermediate_size=c.req_int("intermediate_size"), router_scoring="sigmoid",
                   router_score_correction_bias=True, normalize_top_k=True)


def _gated_deltanet(c: _Config) -> LinearAttentionSpec:
    """Qwen3-Next / Qwen3.5: Gated DeltaNet on the ``layer_types`` marked linear_attention, else on every layer but
    each ``full_attention_interval``-th (default 4: layers 3, 7, 11, ... keep softmax attention)."""
    types = c.layer_types((LINEAR, FULL))
    if types is None:
        every = c.int_or_default("full_attention_interval", minimum=1)
        types = [LINEAR if (i + 1) % every else FULL for i in range(c.num_layers)]
    return LinearAttentionSpec(
        layers=tuple(i for i, kind in enumerate(types) if kind == LINEAR),
        num_key_heads=c.int_or_default("linear_num_key_heads", minimum=1),
        num_value_heads=c.int_or_default("linear_num_value_heads", minimum=1),
        key_head_dim=c.int_or_default("linear_key_head_dim", minimum=1),
        value_head_dim=c.int_or_default("linear_value_head_dim", minimum=1),
        conv_kernel=c.int_or_default("linear_conv_kernel_dim", minimum=1),
        recurrent_state_dtype=_state_dtype(c))


def _state_dtype(c: _Config) -> str | None:
    """``mamba_ssm_dtype`` (Qwen3.5: float32), the recurrent state's format vLLM follows; None when absent."""
    raw = c.data.get("mamba_ssm_dtype")
    if raw is None:
        return None
    if raw not in _TORCH_DTYPES:
        raise c.error(f"field 'mamba_ssm_dtype' must be one of {', '.join(_TORCH_DTYPES)}, got {raw!r:.40}")
    return _TORCH_DTYPES[raw]


def _kda_layers(c: _Config) -> tuple[int, ...]:
    """Kimi Linear's KDA layers (0-based): ``linear_attn_config``'s kda_layers, 1-based beside full_attn_layers and
    together naming every layer once (transformers KimiLinearConfig, vLLM is_kda_layer), else ``layer_types``, else
    every layer but each fourth from layer 4 (KimiLinearConfig's default: full_attention where i % 4 == 0, i > 0)."""
    n = c.num_layers
    la = c.data.get("linear_attn_config") or {}
    if not isinstance(la, dict):
        raise c.error("field 'linear_attn_config' must be a mapping")
    if "kda_layers" in la and "full_attn_layers" in la:
        kda, full = la["kda_layers"], la["full_attn_layers"]
        if (not isinstance(kda, list) or not isinstance(full, list) or any(type(i) is not int for i in kda + full)
                or sorted(kda + full) != list(range(1, n + 1))):
            raise c.error(f"linear_attn_config: kda_layers and full_attn_layers must name each of the layers "
                          f"1..{n} once (1-based)")
        return tuple(sorted(i - 1 for i in kda))
    types = c.layer_types((LINEAR, FULL))
    if types is None:
        types = [FULL if i and i % 4 == 0 else LINEAR for i in range(n)]
    return tuple(i for i, kind in enumerate(types) if kind == LINEAR)


def _kda(c: _Config) -> LinearAttentionSpec:
    """Kimi Delta Attention (transformers KimiLinearDeltaAttention): ``linear_attn_config``'s num_heads x head_dim
    for q, k and v alike, short_conv_kernel_size taps (else the flat linear_* keys, else KimiLinearConfig's
    defaults); the recurrent state in float32 (vLLM MambaStateDtypeCalculator.kda_state_dtype: mamba_ssm_cache_dtype
    auto), the conv state in the model's dtype."""
    layers = _kda_layers(c)  # checks linear_attn_config is a mapping
    la = c.data.get("linear_attn_config") or {}
    nested = _Config({**c.data, **{flat: la[key] for key, flat in _KDA_KEYS.items() if key in la}}, c.origin,
                     c.model_type, c.defaults)
    heads = nested.int_or_default("linear_num_heads", minimum=1)
    dim = nested.int_or_default("linear_head_dim", minimum=1)
    full_rank = la.get("use_full_rank_gate", False)
    if not isinstance(full_rank, bool):
        raise c.error(f"field 'linear_attn_config.use_full_rank_gate' must be true or false, got {full_rank!r:.20}")
    return LinearAttentionSpec(kind="kda", layers=layers, num_key_heads=heads, num_value_heads=heads,
                               key_head_dim=dim, value_head_dim=dim,
                               conv_kernel=nested.int_or_default("linear_conv_kernel_dim", minimum=1),
                               recurrent_state_dtype="fp32", full_rank_gate=full_rank)


# linear_attn_config's keys -> KimiLinearConfig's flat names (its __post_init__ reads them so)
_KDA_KEYS = {"num_heads": "linear_num_heads", "head_dim": "linear_head_dim",
             "short_conv_kernel_size": "linear_conv_kernel_dim"}


def _kimi_moe(c: _Config) -> MoESpec:
    """DeepSeek-V3's router and shared experts (KimiLinearConfig's names), and Kimi K3's latent MoE (vLLM KimiMoE):
    the routed experts on routed_expert_hidden_size, an RMSNorm over it where latent_moe_use_norm; its projections
    in bf16 (SGLang kimi_k3.py KimiK3MoE: routed_expert_down_proj / up_proj ReplicatedLinear(quant_config=None))."""
    moe = _deepseek_moe(score_correction_bias=True, experts_key="num_local_experts")(c)
    latent = c.opt_int("routed_expert_hidden_size", minimum=1)
    return replace(moe, latent_size=latent, latent_norm=c.flag("latent_moe_use_norm"),
                   latent_16_bit=True) if latent else moe


def _kimi_linear(c: _Config) -> dict[str, Any]:
    """Kimi Linear's router (vLLM KimiMoE): sigmoid scores with a correction bias only; its MLA layers are NoPE
    (transformers KimiLinearAttention turns no RoPE). Kimi K3's (vLLM kimi_k3 model.py): an output gate on MLA
    (mla_use_output_gate) and attention residuals (attn_res_block_size); its DSA indexer (dsa_config) is refused."""
    if c.data.get("moe_router_activation_func", "sigmoid") != "sigmoid":
        raise c.error(f"field 'moe_router_activation_func' {c.data['moe_router_activation_func']!r:.20} is not "
                      "supported (sigmoid, as transformers KimiLinearTopkRouter builds)")
    if c.data.get("dsa_config") is not None:
        raise c.error("field 'dsa_config': Kimi K3's sparse (DSA) MLA layers are not supported")
    mla_layers = tuple(sorted(set(range(c.num_layers)) - set(_kda_layers(c))))
    return {"attention_output_gate": c.flag("mla_use_output_gate"), "nope_layers": mla_layers,
            "attention_residual_block": c.opt_int("attn_res_block_size", minimum=1) or 0}


def _rope_layers(c: _Config) -> list[bool]:
    """Llama 4: which layers apply RoPE, ``no_rope_layers`` (1: RoPE, 0: NoPE; at least one entry per layer), else
    every layer but each ``no_rope_layer_interval``-th (transformers Llama4TextConfig)."""
    value = c.data.get("no_rope_layers")
    if not value:
        every = c.int_or_default("no_rope_layer_interval", minimum=1)
        return [(i + 1) % every != 0 for i in range(c.num_layers)]
    if (not isinstance(value, list) or len(value) < c.num_layers
            or any(isinstance(v, bool) or v not in (0, 1) for v in value)):
        raise c.error(f"field 'no_rope_layers' must be a list of at least {c.num_layers} entries 0 or 1, got "
                      f"{value!r:.40}")
    return [v == 1 for v in value[:c.num_layers]]


def _llama4_chunks(c: _Config) -> tuple[int | None, tuple[int, ...]]:
    """Llama 4: the ``layer_types`` marked chunked_attention, else the RoPE layers, attend within chunks of
    ``attention_chunk_size`` tokens (null: every layer attends to the whole context)."""
    chunk = c.opt_int("attention_chunk_size", minimum=1)
    types = c.layer_types((CHUNKED, FULL))
    if types is None:
        types = [CHUNKED if rope else FULL for rope in _rope_layers(c)]
    layers = tuple(i for i, kind in enumerate(types) if kind == CHUNKED)
    return (chunk, layers) if chunk and layers else (None, ())


def _llama4_attention(c: _Config) -> dict[str, Any]:
    """Llama 4's attention numerics: chunked local layers, NoPE layers with attention temperature tuning, the
    weightless QK norm of use_qk_norm, RoPE on adjacent pairs (transformers Llama4TextAttention)."""
    tuning = c.get("attn_temperature_tuning")
    if not isinstance(tuning, (bool, int)):  # released configs wrote true or a number (4): any non-zero turns it on
        raise c.error(f"field 'attn_temperature_tuning' must be true or false, got {tuning!r:.40}")
    chunked = _llama4_chunks(c)[0] is not None
    return {"local_attention": "chunked" if chunked else "sliding", "rope_interleaved": True,
            "qk_l2_norm": c.flag("use_qk_norm"),
            "nope_layers": tuple(i for i, rope in enumerate(_rope_layers(c)) if not rope),
            "attn_temperature_floor_scale": c.int_or_default("floor_scale", minimum=1) if tuning else None,
            "attn_temperature_scale": c.req_float("attn_scale") if tuning else 0.0}


def _llama4_moe(c: _Config) -> MoESpec:
    """Llama4TextMoe on ``moe_layers`` (else every ``interleave_moe_layer_step``-th layer): top-k of sigmoid scores
    that scale each expert's input, one shared expert; experts and shared expert of ``intermediate_size``."""
    if c.data.get("moe_layers") is not None:
        moe = set(c.int_list("moe_layers"))
    else:
        step = c.int_or_default("interleave_moe_layer_step", minimum=1)
        moe = set(range(step - 1, c.num_layers, step))
    width = c.req_int("intermediate_size")
    return MoESpec(num_experts=c.req_int("num_local_experts"), experts_per_token=c.req_int("num_experts_per_tok"),
                   expert_intermediate_size=width, num_shared_experts=1, shared_expert_intermediate_size=width,
                   dense_layers=tuple(i for i in range(c.num_layers) if i not in moe), router_scoring="sigmoid",
                   normalize_top_k=False, router_weights_input=True)


def _mimo_sliding(c: _Config) -> tuple[int | None, tuple[int, ...]]:
    """MiMo-V2-Flash's sliding layers: ``hybrid_layer_pattern`` (1 slides; vLLM reads it), else ``layer_types``, else
    MiMoV2FlashConfig's default (layer 0 and every sixth layer full). Its window is transformers':
    ``sliding_window_size`` + 1 ("previous tokens plus the query", as SGLang attends), else ``sliding_window``."""
    size = c.opt_int("sliding_window_size", minimum=1)
    window = size + 1 if size is not None else c.int_or_default("sliding_window", minimum=1)
    pattern = c.data.get("hybrid_layer_pattern")
    if pattern is not None:
        if not isinstance(pattern, list) or len(pattern) != c.num_layers or not all(v in (0, 1) for v in pattern):
            raise c.error(f"field 'hybrid_layer_pattern' must hold 0 or 1 for each of the {c.num_layers} layers, got "
                          f"{pattern!r:.60}")
        return window, tuple(i for i, v in enumerate(pattern) if v == 1)
    types = c.layer_types() or [FULL if i == 0 or (i + 1) % 6 == 0 else SLIDING for i in range(c.num_layers)]
    return window, tuple(i for i, kind in enumerate(types) if kind == SLIDING)


def _mimo_moe(c: _Config) -> MoESpec:
    """MiMoV2FlashMoE: sigmoid scores plus a correction bias choose the top k of ``n_routed_experts``, renormalised
    and scaled; no shared expert; the MoE layers are ``moe_layer_freq``'s 1s (vLLM) or ``mlp_layer_types``' sparse
    ones (transformers), else every layer but the first."""
    dense = _listed_dense_layers(c)
    freq = c.data.get("moe_layer_freq")
    if dense is None and freq is not None:
        if not isinstance(freq, list) or len(freq) != c.num_layers or not all(v in (0, 1) for v in freq):
            raise c.error(f"field 'moe_layer_freq' must mark each of the {c.num_layers} layers with 0 or 1, got "
                          f"{freq!r:.60}")
        dense = tuple(i for i, v in enumerate(freq) if not v)
    if c.opt_int("n_shared_experts"):  # null in the released config
        raise c.error("field 'n_shared_experts': shared experts are not supported for MiMo-V2-Flash")
    return MoESpec(num_experts=c.req_int("n_routed_experts"), experts_per_token=c.req_int("num_experts_per_tok"),
                   expert_intermediate_size=c.req_int("moe_intermediate_size"), dense_layers=(0,) if dense is None
                   else dense,
                   router_score_correction_bias=True, normalize_top_k=c.flag("norm_topk_prob"),
                   router_scoring="sigmoid", expert_groups=c.int_or_default("n_group", minimum=1),
                   groups_per_token=c.int_or_default("topk_group", minimum=1),
                   routed_scaling_factor=c.opt_float("routed_scaling_factor") or 1.0)


def _mimo_layers(c: _Config) -> dict[str, Any]:
    """MiMo-V2-Flash's two layer kinds (MiMoV2FlashAttention; vLLM mimo_v2_flash.py): sliding layers with
    ``swa_num_key_value_heads`` KV heads (transformers: twice the full layers') and one attention sink per head, full
    layers with ``num_key_value_heads`` and sinks only where ``add_full_attention_sink_bias``; keys of head_dim,
    values of ``v_head_dim``; RoPE on int(head_dim x partial_rotary_factor) dimensions (0.334 of 192: 64), base
    ``swa_rope_theta`` on the sliding layers."""
    head_dim = c.int_or_default("head_dim", minimum=1)
    for key, base in (("swa_head_dim", head_dim), ("swa_num_attention_heads", c.req_int("num_attention_heads"))):
        if c.opt_int(key, minimum=1) not in (None, base):
            raise c.error(f"field '{key}' ({c.data[key]}) is not supported (sliding and full layers of one "
                          f"{key.removeprefix('swa_')}, {base})")
    full_kv = c.int_or_default("num_key_value_heads", minimum=1)
    v_dim = c.int_or_default("v_head_dim", minimum=1)
    swa_v = c.opt_int("swa_v_head_dim", minimum=1) or v_dim
    params = c.data.get("rope_parameters")  # transformers 5 keeps the factor per layer type
    full = params.get(FULL) if isinstance(params, dict) else None
    factor = check_float("partial_rotary_factor", c.data.get("partial_rotary_factor") or (
        full.get("partial_rotary_factor") if isinstance(full, dict) else None) or 0.334)
    rotated = int(head_dim * factor)
    local = c.opt_float("swa_rope_theta")
    fa = FullAttentionSpec(head_dim=head_dim, num_kv_heads=full_kv, v_head_dim=v_dim,
                           attention_sinks=c.flag("add_full_attention_sink_bias"),
                           partial_rotary_factor=rotated / head_dim)
    return {"num_kv_heads": c.opt_int("swa_num_key_value_heads", minimum=1) or 2 * full_kv, "v_head_dim": swa_v,
            "attention_sinks": c.flag("add_swa_attention_sink_bias"), "partial_rotary_factor": rotated / head_dim,
            "full_attention": fa, **({"rope_local_theta": float(local)} if local else {})}


_CSA, _HCA = "compressed_sparse_attention", "heavily_compressed_attention"


def _deepseek_v4_layers(c: _Config) -> dict[str, Any]:
    """DeepSeek-V4's attention (DeepseekV4Config; vLLM deepseek_v4.py): per layer the window alone, CSA or HCA from
    ``layer_types``, else the checkpoints' ``compress_ratios`` (0 / the CSA rate / the HCA rate per layer; the extra
    entry for the MTP layer dropped), else the class default (two HCA layers, then HCA and CSA alternating); the
    rates from ``compress_rates`` or ``compress_rate_csa`` / ``compress_rate_hca`` (4, 128); one shared K=V head
    with a sink per query head; RoPE on ``qk_rope_head_dim`` of head_dim (64 of 512)."""
    rates = c.data.get("compress_rates")
    rates = rates if isinstance(rates, dict) else {}
    csa = c.check_int("compress_rates.compressed_sparse_attention", rates.get(_CSA, c.data.get(
        "compress_rate_csa", 4)), 2)
    hca = c.check_int("compress_rates.heavily_compressed_attention", rates.get(_HCA, c.data.get(
        "compress_rate_hca", 128)), 2)
    n = c.num_layers
    types = c.data.get("layer_types")
    ratios = c.data.get("compress_ratios")
    if types is None and ratios is not None:
        by_rate = {0: SLIDING, csa: _CSA, hca: _HCA}
        if not isinstance(ratios, list) or len(ratios) < n or any(r not in by_rate for r in ratios[:n]):
            raise c.error(f"field 'compress_ratios' must give 0, {csa} or {hca} for each of the {n} layers, got "
                          f"{ratios!r:.60}")
        types = [by_rate[r] for r in ratios[:n]]
    if types is None:
        types = [_HCA] * min(n, 2) + [_CSA if i % 2 else _HCA for i in range(max(n - 2, 0))]
    if not isinstance(types, list) or len(types) < n or any(t not in (SLIDING, _CSA, _HCA) for t in types[:n]):
        raise c.error(f"field 'layer_types' must name sliding_attention, {_CSA} or {_HCA} for each of the {n} "
                      f"layers, got {types!r:.60}")
    head_dim = c.int_or_default("head_dim", minimum=1)
    params = c.data.get("rope_parameters")
    main = params.get("main") if isinstance(params, dict) else None
    factor = c.data.get("partial_rotary_factor") or (main.get("partial_rotary_factor") if isinstance(main, dict)
                                                     else None)
    rotated = (check_float("partial_rotary_factor", factor) * head_dim if factor is not None
               else c.opt_int("qk_rope_head_dim", minimum=1) or 64)
    ca = CompressedAttentionSpec(
        q_lora_rank=c.int_or_default("q_lora_rank", minimum=1), o_groups=c.int_or_default("o_groups", minimum=1),
        o_lora_rank=c.int_or_default("o_lora_rank", minimum=1),
        csa_layers=tuple(i for i, t in enumerate(types[:n]) if t == _CSA),
        hca_layers=tuple(i for i, t in enumerate(types[:n]) if t == _HCA), csa_ratio=csa, hca_ratio=hca,
        index_heads=c.int_or_default("index_n_heads", minimum=1),
        index_head_dim=c.int_or_default("index_head_dim", minimum=1),
        index_topk=c.int_or_default("index_topk", minimum=1), hc_mult=c.int_or_default("hc_mult", minimum=1))
    return {"compressed_attention": ca, "partial_rotary_factor": rotated / head_dim}


def _deepseek_v4_moe(c: _Config) -> MoESpec:
    """DeepSeek-V4's MoE on every layer: sqrt-softplus scores, renormalised top-k and scaled; one shared expert of
    the experts' width; the first layers hash-routed (``mlp_layer_types``' hash_moe, else ``num_hash_layers``, else
    3), each holding a vocab x top-k expert table (tid2eid) and no score-correction bias."""
    n = c.num_layers
    kinds = c.data.get("mlp_layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) < n or any(k not in ("hash_moe", "moe") for k in kinds[:n]):
            raise c.error(f"field 'mlp_layer_types' must name hash_moe or moe for each of the {n} layers, got "
                          f"{kinds!r:.60}")
        hashed = sum(k == "hash_moe" for k in kinds[:n])
        if kinds[:hashed] != ["hash_moe"] * hashed:
            raise c.error("field 'mlp_layer_types': hash-routed layers after a learned-routing one are not supported")
    else:
        hashed = min(n, c.opt_int("num_hash_layers") if c.data.get("num_hash_layers") is not None else 3)
    scoring = c.data.get("scoring_func", "sqrtsoftplus")
    if scoring not in ("sqrtsoftplus", "sigmoid", "softmax"):
        raise c.error(f"field 'scoring_func' {scoring!r:.40} is not supported (sqrtsoftplus, sigmoid, softmax)")
    shared, size = c.int_or_default("n_shared_experts"), c.req_int("moe_intermediate_size")
    return MoESpec(num_experts=c.req_int("n_routed_experts"), experts_per_token=c.req_int("num_experts_per_tok"),
                   expert_intermediate_size=size, num_shared_experts=shared,
                   shared_expert_intermediate_size=size if shared else 0, router_score_correction_bias=True,
                   normalize_top_k=c.flag("norm_topk_prob"), router_scoring=scoring,
                   routed_scaling_factor=c.opt_float("routed_scaling_factor") or 1.0, hash_layers=hashed)


def _first_present(c: _Config, keys: tuple[str, ...]) -> str:
    """The first of ``keys`` the config carries, else the first (whose family default then applies)."""
    return next((key for key in keys if c.data.get(key) is not None), keys[0])


# Step3p7TextConfig's names for the experts (n_routed_experts; attribute_map: moe_num_experts, num_local_experts) and
# aiconfigurator's flat copy's (num_experts)
_STEP_EXPERTS = ("n_routed_experts", "moe_num_experts", "num_local_experts", "num_experts")


def _step3p7_dense_layers(c: _Config) -> tuple[int, ...]:
    """Step-3.7's dense-MLP layers: ``mlp_layer_types``' dense ones, else those missing from ``moe_layers_enum``
    (indices, a list or "3,4,..."), else the first ``first_k_dense_replace`` (aiconfigurator's copy), else 3
    (Step3p7TextConfig: MoE from layer 3 on)."""
    n = c.num_layers
    listed = _listed_dense_layers(c, padding=_mtp_layers(c))
    if listed is not None:
        return listed
    enum = c.data.get("moe_layers_enum")
    if enum is not None:
        items = enum.split(",") if isinstance(enum, str) else enum
        items = [i for i in items if str(i).strip()] if isinstance(items, list) else items
        if not isinstance(items, list) or not all(str(i).strip().isdigit() for i in items):
            raise c.error(f"field 'moe_layers_enum' must list layer indices, got {enum!r:.60}")
        moe = {int(str(i)) for i in items}
        return tuple(i for i in range(n) if i not in moe)
    return tuple(range(min(n, c.int_or_default("first_k_dense_replace"))))


def _step3p7_moe(c: _Config) -> MoESpec:
    """Step3p7SparseMoeBlock: sigmoid scores plus a correction bias choose the top k, whose scores are renormalised
    and scaled by ``moe_router_scaling_factor``; one shared expert of ``share_expert_dim`` beside them, ungated."""
    if c.opt_int("n_shared_experts") not in (None, 1):
        raise c.error(f"field 'n_shared_experts' ({c.data['n_shared_experts']}) is not supported (Step-3.7 builds "
                      "one shared expert)")
    if c.data.get("scoring_func", "sigmoid") != "sigmoid":
        raise c.error(f"field 'scoring_func' {c.data['scoring_func']!r:.40} is not supported (Step-3.7 scores "
                      "experts with a sigmoid)")
    top_k = _first_present(c, ("num_experts_per_tok", "moe_top_k"))
    shared = _first_present(c, ("share_expert_dim", "share_expert_dims"))
    return MoESpec(num_experts=c.int_or_default(_first_present(c, _STEP_EXPERTS), minimum=1),
                   experts_per_token=c.int_or_default(top_k, minimum=1),
                   expert_intermediate_size=c.int_or_default("moe_intermediate_size", minimum=1),
                   num_shared_experts=1, shared_expert_intermediate_size=c.int_or_default(shared, minimum=1),
                   dense_layers=_step3p7_dense_layers(c), router_scoring="sigmoid",
                   router_score_correction_bias=c.get("use_moe_router_bias") is not False, normalize_top_k=True,
                   routed_scaling_factor=c.req_float("moe_router_scaling_factor"))


def _step3p7_attention(c: _Config) -> dict[str, Any]:
    """Step-3.7's attention (transformers Step3p7Attention): a sigmoid gate per query head (g_proj; ``gating`` true
    or "per-head"), scores scaled by ``query_pre_attn_scalar``^-1/2 (head_dim when absent). Refused: sliding layers
    with their own head count (``num_sliding_attention_heads``, ``attention_other_setting``), per-layer RoPE shares
    (``partial_rotary_factors``) and bidirectional attention."""
    heads = c.req_int("num_attention_heads")
    other = c.data.get("attention_other_setting")
    key = "num_sliding_attention_heads" if c.data.get("num_sliding_attention_heads") is not None else None
    sliding_heads = c.data.get(key) if key else other.get("num_attention_heads") if isinstance(other, dict) else None
    if sliding_heads is not None and sliding_heads != heads:
        raise c.error(f"field '{key or 'attention_other_setting'}': sliding layers of {sliding_heads!r:.20} heads "
                      f"beside {heads} on the full layers are not supported")
    gating = c.data.get("gating", True)
    if gating is not True and gating != "per-head":
        raise c.error(f"field 'gating' {gating!r:.40} is not supported (true or per-head: a gate per query head)")
    factors = c.data.get("partial_rotary_factors")
    if factors is not None and (not isinstance(factors, list) or any(f != 1 for f in factors)):
        raise c.error("field 'partial_rotary_factors': RoPE on part of the head per layer is not supported")
    if c.get("use_bidirectional_attention"):
        raise c.error("field 'use_bidirectional_attention': bidirectional attention is not supported")
    scalar = c.opt_float("query_pre_attn_scalar")
    return {"attention_head_gate": True, **({"query_pre_attn_scalar": scalar} if scalar is not None else {})}


def _gemma4_pattern(c: _Config, i: int) -> bool:
    """Gemma 4's class default: every sixth layer global, and the last one always (Gemma4TextConfig)."""
    return (i + 1) % 6 != 0 and i != c.num_layers - 1


def _gemma4_moe(c: _Config) -> MoESpec | None:
    """Gemma4TextDecoderLayer with ``enable_moe_block``: top-k of a softmax over all experts, renormalised and scaled
    per expert, beside the layer's dense MLP on every layer."""
    if not c.flag("enable_moe_block"):
        return None
    width = c.opt_int("moe_intermediate_size", minimum=1) or c.opt_int("expert_intermediate_size", minimum=1)
    if width is None:
        raise c.error("missing required field 'moe_intermediate_size' (enable_moe_block is set)")
    return MoESpec(num_experts=c.req_int("num_experts"), experts_per_token=c.req_int("top_k_experts"),
                   expert_intermediate_size=width, dense_mlp_beside=True, router_scales=True)


def _gemma4_layers(c: _Config) -> dict[str, Any]:
    """Gemma 4's full-attention layers (global_head_dim, num_global_key_value_heads when attention_k_eq_v, a
    quarter of each head turned by proportional RoPE) and its block norms (4, and 3 more beside the experts);
    refuses what tfcalc does not model: per-layer embeddings and KV sharing (the E2B / E4B models) and
    bidirectional text attention."""
    for key, what in (("hidden_size_per_layer_input", "per-layer input embeddings"),
                      ("num_kv_shared_layers", "KV sharing across layers")):
        if c.int_or_default(key):
            raise c.error(f"field '{key}': Gemma 4's {what} (the E2B / E4B models) are not supported")
    if c.get("use_bidirectional_attention") == "all":
        raise c.error("field 'use_bidirectional_attention' all (bidirectional text attention) is not supported")
    k_eq_v = c.flag("attention_k_eq_v")
    global_kv = c.opt_int("num_global_key_value_heads", minimum=1) if k_eq_v else None
    params = c.data.get("rope_parameters")
    full = params.get(FULL) if isinstance(params, dict) else None
    full = full if isinstance(full, dict) else {}
    proportional = full.get("rope_type", "proportional") == "proportional"
    factor = check_float("rope_parameters.full_attention.partial_rotary_factor",
                         full.get("partial_rotary_factor", 0.25 if proportional else 1.0))
    if check_float("rope_parameters.full_attention.factor", full.get("factor", 1.0)) != 1.0:
        raise c.error("field 'rope_parameters.full_attention.factor': scaled RoPE on Gemma 4's global layers is not "
                      "supported")
    fa = FullAttentionSpec(head_dim=c.int_or_default("global_head_dim", minimum=1),
                           num_kv_heads=global_kv or c.opt_int("num_key_value_heads", minimum=1)
                           or c.req_int("num_attention_heads"),
                           k_eq_v=k_eq_v, partial_rotary_factor=factor, proportional_rope=proportional)
    return {"full_attention": fa, "norms_per_layer": 7 if c.flag("enable_moe_block") else 4, "v_norm": True}


def _mla(c: _Config) -> MLASpec:
    q_rank = c.get("q_lora_rank")
    return MLASpec(q_lora_rank=None if q_rank is None else c.int_or_default("q_lora_rank", minimum=1),
                   kv_lora_rank=c.req_int("kv_lora_rank"), qk_nope_head_dim=c.req_int("qk_nope_head_dim"),
                   qk_rope_head_dim=c.req_int("qk_rope_head_dim"), v_head_dim=c.req_int("v_head_dim"))


# Nemotron-H's block letters (hybrid_override_pattern) and names (layers_block_type, transformers 5's and the
# checkpoints' own): each block holds one mixer or one FFN
_NEMOTRON_BLOCKS = {**HYBRID_BLOCKS, "mamba": "mamba",
                    "linear_attention": "mamba", "attention": "attention", "full_attention": "attention", "mlp": "mlp",
                    "moe": "moe"}


def _nemotron_blocks(c: _Config) -> list[str]:
    """Nemotron-H's block per layer (mamba, attention, mlp, moe) from ``hybrid_override_pattern`` or
    ``layers_block_type``, as long as ``num_hidden_layers``."""
    raw = c.data.get("hybrid_override_pattern", c.data.get("layers_block_type"))
    entries = list(raw) if isinstance(raw, str) else raw
    if not isinstance(entries, list) or len(entries) != c.num_layers or any(
            not isinstance(e, str) or e not in _NEMOTRON_BLOCKS for e in entries):
        raise c.error(f"field 'hybrid_override_pattern' must give one of M * - E (or layers_block_type one of mamba, "
                      f"attention, mlp, moe) for each of the {c.num_layers} layers")
    return [_NEMOTRON_BLOCKS[e] for e in entries]


def _nemotron_h(c: _Config) -> dict[str, Any]:
    """Nemotron-H (transformers NemotronHForCausalLM): a block per layer holding one of a Mamba-2 mixer, attention
    without RoPE, a plain relu^2 MLP or an MoE; one RMSNorm before it. The attention and Mamba blocks have no FFN,
    the MLP and MoE blocks no mixer."""
    blocks = _nemotron_blocks(c)
    mamba = tuple(i for i, b in enumerate(blocks) if b == "mamba")
    heads = c.int_or_default("mamba_num_heads", minimum=1)
    state = _TORCH_DTYPES.get(c.data.get("mamba_ssm_cache_dtype", "float32"))
    if state is None:
        raise c.error(f"field 'mamba_ssm_cache_dtype' must be one of {', '.join(_TORCH_DTYPES)}")
    linear = LinearAttentionSpec(
        kind="mamba2", layers=mamba, num_key_heads=c.int_or_default("n_groups", minimum=1),
        num_value_heads=heads, key_head_dim=c.int_or_default("ssm_state_size", minimum=1),
        value_head_dim=c.int_or_default("mamba_head_dim", minimum=1), conv_kernel=c.int_or_default("conv_kernel"),
        conv_bias=c.flag("use_conv_bias"), proj_bias=c.flag("mamba_proj_bias"),
        chunk_size=c.int_or_default("chunk_size", minimum=1), recurrent_state_dtype=state) if mamba else None
    return {"linear_attention": linear, "norms_per_layer": 1, "ffn_kind": "plain",
            "ffn_free_layers": tuple(i for i, b in enumerate(blocks) if b in ("mamba", "attention")),
            "mixer_free_layers": tuple(i for i, b in enumerate(blocks) if b in ("mlp", "moe")),
            "nope_layers": tuple(i for i, b in enumerate(blocks) if b == "attention")}


def _nemotron_nas(c: _Config) -> dict[str, Any]:
    """DeciLM / Llama-Nemotron NAS (vLLM nemotron_nas.py DeciLMDecoderLayer): ``block_configs`` give each layer GQA of
    num_attention_heads / n_heads_in_group KV heads or none (attention no_op, and no input_layernorm), and a SwiGLU
    of its ffn intermediate_size or of _ffn_mult_to_intermediate_size: int(2 x ffn_mult x h / 3) rounded up to a
    multiple of 256. Linear replacements (vLLM builds none), layers without an FFN and attention layers of different
    KV head counts are refused."""
    blocks = c.data.get("block_configs")
    if not isinstance(blocks, list) or len(blocks) != c.num_layers or not all(
            isinstance(b, dict) and isinstance(b.get("attention"), dict) and isinstance(b.get("ffn"), dict)
            for b in blocks):
        raise c.error(f"field 'block_configs' must give an attention and an ffn entry for each of the "
                      f"{c.num_layers} layers")
    heads, hidden = c.req_int("num_attention_heads"), c.req_int("hidden_size")
    kv_heads: set[int] = set()
    widths: list[int] = []
    no_attention: list[int] = []
    for i, block in enumerate(blocks):
        where = f"block_configs[{i}]"
        for part in ("attention", "ffn"):
            if block[part].get("replace_with_linear"):
                raise c.error(f"{where}.{part}.replace_with_linear is not supported (a linear layer in place of the "
                              f"{part}; vLLM's nemotron_nas.py builds none)")
        attention, ffn = block["attention"], block["ffn"]
        if ffn.get("no_op"):
            raise c.error(f"{where}.ffn.no_op is not supported (a layer without an FFN)")
        if attention.get("no_op"):
            no_attention.append(i)
        else:
            group = c.check_int(f"{where}.attention.n_heads_in_group", attention.get("n_heads_in_group"), 1)
            if heads % group:
                raise c.error(f"{where}.attention.n_heads_in_group ({group}) does not divide num_attention_heads "
                              f"({heads})")
            kv_heads.add(heads // group)
        if ffn.get("ffn_mult") is None:
            widths.append(c.check_int(f"{where}.ffn.intermediate_size", ffn.get("intermediate_size"), 1))
        else:
            mult = check_float(f"{where}.ffn.ffn_mult", ffn["ffn_mult"], high=1e6)
            widths.append(-(-int(2 * mult * hidden / 3) // 256) * 256)
    if len(kv_heads) != 1:
        raise c.error(f"block_configs give {'no attention layer' if not kv_heads else 'attention layers of '}"
                      f"{', '.join(map(str, sorted(kv_heads)))}{' KV heads' if kv_heads else ''}; tfcalc models "
                      "one KV head count on every attention layer")
    return {"num_kv_heads": kv_heads.pop(), "intermediate_size": max(widths), "layer_intermediate_sizes": tuple(widths),
            "mixer_free_layers": tuple(no_attention)}


# hybrid and parallel-block families (Granite 4.0, Command R / R7B / A)

# Granite 4.0's layer_types entries: the checkpoints' mamba / attention and transformers 5's names for them
_GRANITE_MIXERS = {"mamba": LINEAR, LINEAR: LINEAR, "attention": FULL, FULL: FULL}


def _granite_layer_types(c: _Config) -> list[str]:
    """Granite 4.0's mixer per layer, linear_attention (Mamba-2) or full_attention, from ``layer_types`` (or its
    alias ``layers_block_type``); GraniteMoeHybridConfig's default without either: Mamba-2 on every layer."""
    key = "layers_block_type" if "layer_types" not in c.data and "layers_block_type" in c.data else "layer_types"
    raw = c.data.get(key)
    if raw is None:
        return [LINEAR] * c.num_layers
    if not isinstance(raw, list) or len(raw) != c.num_layers or any(
            not isinstance(t, str) or t not in _GRANITE_MIXERS for t in raw):
        raise c.error(f"field '{key}' must give mamba or attention for each of the {c.num_layers} layers")
    return [_GRANITE_MIXERS[t] for t in raw]


def _granite_mamba(c: _Config, layers: tuple[int, ...]) -> LinearAttentionSpec | None:
    """GraniteMoeHybridMambaLayer, a Mamba-2 mixer of mamba_n_heads heads of mamba_d_head ("auto": mamba_expand x
    hidden_size / heads), mamba_n_groups B/C groups of mamba_d_state; its state kept in the model's dtype (vLLM's
    --mamba-ssm-cache-dtype auto: these configs name none). None without Mamba-2 layers."""
    if not layers:
        return None
    inner = c.int_or_default("mamba_expand", minimum=1) * c.req_int("hidden_size")
    heads = c.int_or_default("mamba_n_heads", minimum=1)
    raw = c.get("mamba_d_head")
    head_dim = inner // heads if raw == "auto" else c.check_int("mamba_d_head", raw, 1)
    if heads * head_dim != inner:
        raise c.error(f"mamba_n_heads ({heads}) x mamba_d_head ({head_dim}) must be mamba_expand x hidden_size "
                      f"({inner})")
    return LinearAttentionSpec(
        kind="mamba2", layers=layers, num_key_heads=c.int_or_default("mamba_n_groups", minimum=1),
        num_value_heads=heads, key_head_dim=c.int_or_default("mamba_d_state", minimum=1), value_head_dim=head_dim,
        conv_kernel=c.int_or_default("mamba_d_conv", minimum=1), conv_bias=c.flag("mamba_conv_bias"),
        proj_bias=c.flag("mamba_proj_bias"), chunk_size=c.int_or_default("mamba_chunk_size", minimum=1))


def _granite_hybrid(c: _Config) -> dict[str, Any]:
    """Granite 4.0 (transformers GraniteMoeHybridDecoderLayer): a Mamba-2 mixer or attention per ``layer_types``,
    then an FFN on every layer, each behind its own RMSNorm; attention applies RoPE only when
    position_embedding_type is "rope" (else NoPE); Granite's multipliers as ``_granite_numerics`` reads them."""
    types = _granite_layer_types(c)
    attention = tuple(i for i, t in enumerate(types) if t == FULL)
    return {**_granite_numerics(c),
            "linear_attention": _granite_mamba(c, tuple(i for i, t in enumerate(types) if t == LINEAR)),
            "nope_layers": () if c.get("position_embedding_type") == "rope" else attention}


def _granite_hybrid_moe(c: _Config) -> MoESpec | None:
    """GraniteMoeHybridMoE on every layer while num_local_experts > 0: a softmax over the top-k router logits (top-k
    renormalised), experts of intermediate_size, beside the ungated shared MLP of shared_intermediate_size (one
    shared expert); with no experts each layer runs that MLP alone, its dense FFN."""
    experts = c.int_or_default("num_local_experts")
    if experts == 0:
        return None
    return MoESpec(num_experts=experts, experts_per_token=c.int_or_default("num_experts_per_tok", minimum=1),
                   expert_intermediate_size=c.req_int("intermediate_size"), num_shared_experts=1,
                   shared_expert_intermediate_size=c.int_or_default("shared_intermediate_size", minimum=1),
                   normalize_top_k=True)


def _cohere_block(c: _Config) -> dict[str, Any]:
    """Cohere's decoder layer (transformers CohereDecoderLayer, Cohere2DecoderLayer): one LayerNorm with a weight and
    no bias, attention and the gated MLP side by side on its output, RoPE on adjacent pairs (CohereRotaryEmbedding's
    repeat_interleave); the logits times ``logit_scale``, as dividing them by logits_scaling = 1 / logit_scale."""
    scale = c.req_float("logit_scale")
    if scale <= 0:
        raise c.error(f"field 'logit_scale' must be positive, got {scale:g}")
    return {"norm_kind": "layernorm", "norm_bias": False, "norms_per_layer": 1, "parallel_block": True,
            "rope_interleaved": True, "logits_scaling": 1 / scale}


def _cohere(c: _Config) -> dict[str, Any]:
    """Command R / R+ (CohereForCausalLM): ``_cohere_block``; with ``use_qk_norm`` (Command R+) q and k are
    LayerNormed per head over head_dim before RoPE, each head with its own weight (CohereLayerNorm((heads, d)))."""
    return {**_cohere_block(c), "qk_norm_weights_per_head": c.flag("use_qk_norm")}


def _cohere2(c: _Config) -> dict[str, Any]:
    """Command R7B / A (Cohere2ForCausalLM): ``_cohere_block``; only the sliding layers rotate q and k, the global
    ones (and every layer when sliding_window is null) apply no RoPE (Cohere2Attention). head_dim is always
    hidden_size // num_attention_heads (Cohere2Config.__post_init__): a config.json head_dim that differs is
    refused rather than ignored."""
    hidden, heads = c.req_int("hidden_size"), c.req_int("num_attention_heads")
    given = c.opt_int("head_dim", minimum=1)
    if given is not None and given != hidden // heads:
        raise c.error(f"field 'head_dim' ({given}) is not supported: Cohere2Config sets it to hidden_size // "
                      f"num_attention_heads ({hidden // heads})")
    return {**_cohere_block(c), "nope_layers": _global_nope(c)}


def _nemotron_moe(c: _Config) -> MoESpec | None:
    """Nemotron-H's MoE blocks: ``n_routed_experts`` plain relu^2 experts of ``moe_intermediate_size`` and a shared
    expert of ``moe_shared_expert_intermediate_size``, DeepSeek-V3's router (sigmoid scores, a correction bias,
    group-limited top-k, scaled), the routed experts on a ``moe_latent_size`` projection where set (Nemotron 3 Super,
    Ultra); every other block is a "dense" layer (an MLP, or no FFN at all)."""
    blocks = _nemotron_blocks(c)
    if "moe" not in blocks:
        return None
    shared = c.int_or_default("n_shared_experts")
    return MoESpec(num_experts=c.req_int("n_routed_experts"), experts_per_token=c.req_int("num_experts_per_tok"),
                   expert_intermediate_size=c.req_int("moe_intermediate_size"), num_shared_experts=shared,
                   shared_expert_intermediate_size=c.int_or_default("moe_shared_expert_intermediate_size")
                   if shared else 0,
                   dense_layers=tuple(i for i, b in enumerate(blocks) if b != "moe"),
                   router_score_correction_bias=True, normalize_top_k=c.flag("norm_topk_prob"),
                   router_scoring="sigmoid", expert_groups=c.int_or_default("n_group", minimum=1),
                   groups_per_token=c.int_or_default("topk_group", minimum=1),
                   routed_scaling_factor=c.req_float("routed_scaling_factor"),
                   latent_size=c.opt_int("moe_latent_size", minimum=1) or 0)


# MoE families (ERNIE 4.5, Hunyuan-A13B, Granite MoE, dots.llm1)

def _ernie_moe_layers(c: _Config) -> list[int]:
    """Ernie4_5_MoeDecoderLayer: MoE where (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <=
    moe_layer_end_index (-1, as the class default, or null: the last layer)."""
    n = c.num_layers
    start = c.int_or_default("moe_layer_start_index")
    end = c.get("moe_layer_end_index")
    end = n - 1 if end is None or (type(end) is int and end == -1) else c.check_int("moe_layer_end_index", end, 0)
    every = c.int_or_default("moe_layer_interval", minimum=1)
    return [i for i in range(n) if (i + 1) % every == 0 and start <= i <= end]


def _ernie_moe(c: _Config) -> MoESpec | None:
    """Ernie4_5_MoeSparseMoeBlock on ``_ernie_moe_layers`` (dense MLPs of intermediate_size elsewhere): softmax scores
    whose choice adds the score-correction bias (moe_statics, one per expert), the chosen scores renormalised, and
    moe_num_shared_experts shared experts run as one MLP of moe_intermediate_size x that count."""
    moe = set(_ernie_moe_layers(c))
    if not moe:  # transformers builds dense MLPs everywhere
        return None
    shared = c.int_or_default("moe_num_shared_experts")
    size = c.int_or_default("moe_intermediate_size", minimum=1)
    return MoESpec(num_experts=c.int_or_default("moe_num_experts", minimum=1),
                   experts_per_token=c.int_or_default("moe_k", minimum=1), expert_intermediate_size=size,
                   num_shared_experts=shared, shared_expert_intermediate_size=size if shared else 0,
                   dense_layers=tuple(i for i in range(c.num_layers) if i not in moe),
                   router_score_correction_bias=True, normalize_top_k=True)


def _ernie_layers(c: _Config) -> dict[str, Any]:
    """ERNIE 4.5's attention numerics: RoPE on adjacent pairs (transformers Ernie4_5_MoeAttention's rotate_half over
    x[0::2], x[1::2]); refuses ``use_bias``, which also puts a bias on the lm_head (Ernie4_5_MoeForCausalLM)."""
    if c.flag("use_bias"):
        raise c.error("field 'use_bias' true (biases on every projection and on the lm_head) is not supported")
    return {"rope_interleaved": True}


def _hunyuan_per_layer(c: _Config, key: str, minimum: int = 1) -> int | None:
    """A HunYuan key given once or once per layer (moe_topk, moe_intermediate_size, num_shared_expert) as one integer;
    None when absent. A list that varies by layer is refused: tfcalc sizes every MoE layer alike."""
    value = c.get(key)
    if value is None:
        return None
    if isinstance(value, list):
        if len(value) != c.num_layers or len({c.check_int(key, v, minimum) for v in value}) != 1:
            raise c.error(f"field '{key}' must hold one value or the same value for each of the {c.num_layers} "
                          f"layers, got {value!r:.60}")
        value = value[0]
    return c.check_int(key, value, minimum)


def _hunyuan_moe(c: _Config) -> MoESpec:
    """HunYuanMoEV1Moe on every layer: softmax top-``moe_topk`` renormalised, ``num_experts`` experts and one shared
    MLP (shared_mlp) beside them, all of intermediate_size (transformers' port). A checkpoint whose per-layer
    moe_intermediate_size or num_shared_expert (vLLM's reading) says otherwise is refused, as is cross-layer KV
    sharing (use_cla) and a model without the shared MLP (use_mixed_mlp_moe false)."""
    width = c.req_int("intermediate_size")
    if _hunyuan_per_layer(c, "moe_intermediate_size") not in (None, width):
        raise c.error(f"field 'moe_intermediate_size' ({c.data['moe_intermediate_size']!r:.40}) is not supported "
                      f"(experts as wide as intermediate_size, {width})")
    if _hunyuan_per_layer(c, "num_shared_expert", minimum=0) not in (None, 1):
        raise c.error("field 'num_shared_expert' is not supported (one shared MLP per layer)")
    for key, unsupported, what in (("use_cla", True, "cross-layer KV sharing"),
                                   ("use_mixed_mlp_moe", False, "MoE layers without the shared MLP")):
        if c.data.get(key) is unsupported:
            raise c.error(f"field '{key}' {str(unsupported).lower()} ({what}) is not supported")
    return MoESpec(num_experts=c.int_or_default("num_experts", minimum=1),
                   experts_per_token=_hunyuan_per_layer(c, "moe_topk") or c.int_or_default("moe_topk", minimum=1),
                   expert_intermediate_size=width, num_shared_experts=1, shared_expert_intermediate_size=width,
                   normalize_top_k=True)


def _hunyuan_layers(c: _Config) -> dict[str, Any]:
    """Hunyuan's legacy ``attention_head_dim`` must agree with the head_dim tfcalc reads (head_dim, else hidden /
    heads). No further ModelSpec fields: its per-head query/key RMSNorms follow RoPE (HunYuanMoEV1Attention), which
    the bundled decoder runs before it (no size or cost depends on the order)."""
    legacy = c.opt_int("attention_head_dim", minimum=1)
    head_dim = c.opt_int("head_dim", minimum=1) or c.req_int("hidden_size") // c.req_int("num_attention_heads")
    if legacy not in (None, head_dim):
        raise c.error(f"field 'attention_head_dim' ({legacy}) is not the head_dim ({head_dim}) transformers uses")
    return {}


def _granite_moe(shared_expert: bool) -> MoERule:
    """GraniteMoeMoE on every layer: the top k router logits softmaxed among themselves (a softmax top-k, renormalised)
    over experts of intermediate_size; GraniteMoeShared adds a shared MLP of ``shared_intermediate_size`` (none
    when 0) on the same input."""

    def rule(c: _Config) -> MoESpec:
        shared = c.int_or_default("shared_intermediate_size") if shared_expert else 0
        return MoESpec(num_experts=c.int_or_default("num_local_experts", minimum=1),
                       experts_per_token=c.int_or_default("num_experts_per_tok", minimum=1),
                       expert_intermediate_size=c.req_int("intermediate_size"), num_shared_experts=1 if shared else 0,
                       shared_expert_intermediate_size=shared, normalize_top_k=True)

    return rule


def _dsa_indexer(c: _Config) -> dict[str, Any]:
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-5): ``index_n_heads`` x ``index_head_dim``,
    ``index_topk``; the layers that run their own (GLM-5.2's ``indexer_types`` "full", or transformers
    GlmMoeDsaConfig's pattern / freq / offset), every layer otherwise."""
    n = c.num_layers
    types = c.data.get("indexer_types")
    pattern = c.data.get("index_topk_pattern")
    if types is None and isinstance(pattern, str):
        types = [{"F": "full", "S": "shared"}.get(ch, ch) for ch in pattern]
    if types is None and c.data.get("index_topk_freq") is not None:
        freq = c.check_int("index_topk_freq", c.data["index_topk_freq"], 1)
        offset = c.check_int("index_skip_topk_offset", c.data.get("index_skip_topk_offset", 2), 0)
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if types is None:
        layers = tuple(range(n))
    elif isinstance(types, list) and len(types) == n and all(t in ("full", "shared") for t in types):
        layers = tuple(i for i, t in enumerate(types) if t == "full")
    else:
        raise c.error(f"field 'indexer_types' must list 'full' or 'shared' for each of the {n} layers")
    return {"sparse_indexer": SparseIndexerSpec(
        layers=layers, num_heads=c.req_int("index_n_heads"), head_dim=c.req_int("index_head_dim"),
        topk=c.req_int("index_topk"))}



def _minimax_m3_moe(c: _Config) -> MoESpec:
    """MiniMaxM3VLSparseMoeBlock on the layers ``mlp_layer_types`` calls "sparse" (else where ``moe_layer_freq``
    lists 1; transformers MiniMaxM3VLTextConfig reads no first_k_dense_replace): experts of ``intermediate_size``
    chosen by sigmoid scores plus a correction bias, renormalised and scaled by ``routed_scaling_factor``, beside one
    shared expert of ``shared_intermediate_size``; the other layers a dense MLP of ``dense_intermediate_size``."""
    n = c.num_layers
    dense = _listed_dense_layers(c)
    if dense is None:
        freq = c.data.get("moe_layer_freq")
        if freq is None:
            dense = ()
        elif isinstance(freq, list) and len(freq) == n and all(f in (0, 1) and not isinstance(f, bool) for f in freq):
            dense = tuple(i for i, f in enumerate(freq) if not f)
        else:
            raise c.error(f"field 'moe_layer_freq' must list 0 (dense) or 1 (MoE) for each of the {n} layers")
    if c.data.get("n_shared_experts", 1) != 1:
        raise c.error(f"field 'n_shared_experts' {c.data['n_shared_experts']!r:.20} is not supported "
                      "(MiniMaxM3VLSparseMoeBlock builds one shared expert)")
    return MoESpec(num_experts=c.req_int("num_local_experts"), experts_per_token=c.req_int("num_experts_per_tok"),
                   expert_intermediate_size=c.req_int("intermediate_size"), num_shared_experts=1,
                   shared_expert_intermediate_size=c.int_or_default("shared_intermediate_size", minimum=1),
                   dense_layers=dense, router_scoring="sigmoid", router_score_correction_bias=True,
                   normalize_top_k=True, routed_scaling_factor=c.req_float("routed_scaling_factor"))


# MiniMax-M3's legacy sparse_attention_config keys -> transformers MiniMaxM3VLTextConfig's flat names
_MSA_KEYS = {"sparse_num_index_heads": "index_n_heads", "sparse_index_dim": "index_head_dim",
             "sparse_block_size": "index_block_size", "sparse_topk_blocks": "index_topk_blocks",
             "sparse_local_block": "index_local_blocks"}
_MSA_SPARSE = "minimax_m3_sparse"


def _minimax_m3_layers(c: _Config) -> dict[str, Any]:
    """MiniMax-M3's per-head QK-norm and MSA block indexer (transformers MiniMaxM3VLTextConfig.__post_init__): the
    sparse layers are ``layer_types`` "minimax_m3_sparse", else ``sparse_attention_config``'s sparse_attention_freq;
    its sparse_* keys give the indexer's sizes, which the flat index_* keys otherwise do. Variants transformers does
    not build (an index-value path, initial blocks, a score other than max, attention_output_gate) are refused."""
    n = c.num_layers
    if c.get("qk_norm_type") not in (None, "per_head") or c.flag("attention_output_gate"):
        raise c.error("only per-head QK-norm (qk_norm_type per_head) without attention_output_gate is supported "
                      "(MiniMaxM3VLAttention)")
    msa = c.data.get("sparse_attention_config") or {}
    if not isinstance(msa, dict):
        raise c.error("field 'sparse_attention_config' must be a mapping")
    if msa.get("use_sparse_attention", True) is not True:
        raise c.error("field 'sparse_attention_config.use_sparse_attention' false is not supported")
    if msa.get("sparse_init_block", 0) != 0 or msa.get("sparse_score_type", "max") != "max":
        raise c.error("sparse_attention_config: only sparse_init_block 0 and sparse_score_type max are supported "
                      "(MiniMaxM3VLIndexer)")
    types = c.data.get("layer_types")
    if types is None and msa.get("sparse_attention_freq") is not None:
        types = [_MSA_SPARSE if f else FULL for f in msa["sparse_attention_freq"]]
    if types is None:
        return {}
    if not isinstance(types, list) or len(types) != n or not all(t in (_MSA_SPARSE, FULL) for t in types):
        raise c.error(f"field 'layer_types' (or sparse_attention_config.sparse_attention_freq) must give "
                      f"'{_MSA_SPARSE}' or '{FULL}' (1 or 0) for each of the {n} layers")
    layers = tuple(i for i, t in enumerate(types) if t == _MSA_SPARSE)
    no_value = msa.get("sparse_disable_index_value")
    if no_value is not None and (not isinstance(no_value, list) or len(no_value) != n
                                 or any(not no_value[i] for i in layers)):
        raise c.error("sparse_attention_config: an index-value path (sparse_disable_index_value 0 on a sparse layer) "
                      "is not supported (MiniMaxM3VLIndexer has none)")
    if not layers:
        return {}
    sizes = _Config({**c.data, **{flat: msa[key] for key, flat in _MSA_KEYS.items() if key in msa}}, c.origin,
                    c.model_type, c.defaults)
    return {"sparse_indexer": SparseIndexerSpec(
        layers=layers, num_heads=sizes.int_or_default("index_n_heads", minimum=1),
        head_dim=sizes.int_or_default("index_head_dim", minimum=1),
        topk=sizes.int_or_default("index_topk_blocks", minimum=1), kind="minimax_m3",
        block_size=sizes.int_or_default("index_block_size", minimum=1))}

# dense families (Seed-OSS, GLM-4, OLMo 2/3, SmolLM3, EXAONE 4, Granite)

def _seed_oss_bias(c: _Config) -> dict[str, bool]:
    """SeedOssAttention: ``attention_bias`` puts a bias on q, k and v, ``attention_out_bias`` one on o_proj."""
    return {"qkv_bias": c.flag("attention_bias"), "o_bias": c.flag("attention_out_bias")}


def _glm4_numerics(c: _Config) -> dict[str, Any]:
    """Glm4Attention's RoPE turns adjacent pairs (x_2i, x_2i+1) of each head's rotated part (its rotate_half over
    0::2 / 1::2, cos and sin repeat_interleave'd)."""
    return {"rope_interleaved": True}


def _post_norm(c: _Config) -> dict[str, Any]:
    """Olmo2DecoderLayer / Exaone4DecoderLayer: no norm before attention or MLP; post_attention_layernorm and
    post_feedforward_layernorm norm their outputs before the residual add."""
    return {"norm_placement": "post"}


def _every_fourth_full(c: _Config, i: int) -> bool:
    """Olmo3Config's default ``layer_types``: layers 3, 7, 11, ... full, the rest slide."""
    return (i + 1) % 4 != 0


def _olmo3_numerics(c: _Config) -> dict[str, Any]:
    """OLMo 3: post-norm as OLMo 2; a classic ``rope_scaling`` scales the full_attention layers only
    (Olmo3Config.convert_rope_params_to_dict), the sliding ones keep ``rope_theta`` unscaled. YaRN's
    ``attention_factor`` must be its default 0.1 ln(factor) + 1 (what tfcalc applies)."""
    out = _post_norm(c)
    scaling = c.data.get("rope_scaling")
    if not isinstance(scaling, dict) or scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        return out
    given = scaling.get("attention_factor")
    if scaling.get("rope_type", scaling.get("type")) == "yarn" and given is not None:
        factor = check_float("rope_scaling.factor", scaling.get("factor", 1.0))
        expected = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        if abs(check_float("rope_scaling.attention_factor", given) - expected) > 1e-9:
            raise c.error(f"field 'rope_scaling.attention_factor' {given!r:.20} is not supported (yarn's default "
                          f"0.1 ln(factor) + 1 = {expected:.6f})")
    return {**out, "rope_local_theta": float(check_float("rope_theta", c.get("rope_theta")))}


def _smollm3_nope(c: _Config) -> dict[str, Any]:
    """SmolLM3Attention: the layers whose ``no_rope_layers`` entry is 0 (else every ``no_rope_layer_interval``-th)
    apply no RoPE."""
    return {"nope_layers": tuple(i for i, rope in enumerate(_rope_layers(c)) if not rope)}


def _smollm3_nope_slides(c: _Config, i: int) -> bool:
    """SmolLM3Config's default ``layer_types``: with ``use_sliding_window``, the NoPE layers slide."""
    return not _rope_layers(c)[i]


def _exaone4_numerics(c: _Config) -> dict[str, Any]:
    """Exaone4Attention: post-norm as OLMo 2; with a ``sliding_window`` configured its full-attention layers apply
    no RoPE ("global NoPE": ``if self.sliding_window is None or self.is_sliding``)."""
    out = _post_norm(c)
    return out if c.get("sliding_window") is None else {**out, "nope_layers": _global_nope(c)}


def _granite_numerics(c: _Config) -> dict[str, Any]:
    """GraniteModel's multipliers: embeddings x ``embedding_multiplier``, each residual branch x
    ``residual_multiplier``, logits / ``logits_scaling``; scores scaled by ``attention_multiplier`` instead of
    head_dim^-1/2 (query_pre_attn_scalar = attention_multiplier^-2)."""
    scale = c.req_float("attention_multiplier")
    limit = FLOAT_LIMITS["query_pre_attn_scalar"][1]
    if scale ** -2 > limit:
        raise c.error(f"field 'attention_multiplier' must be at least {limit ** -0.5:g}, got {scale:g}")
    return {"embedding_multiplier": c.req_float("embedding_multiplier"),
            "residual_multiplier": c.req_float("residual_multiplier"),
            "logits_scaling": c.req_float("logits_scaling"), "query_pre_attn_scalar": scale ** -2}


# --- families ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Family:
    defaults: Mapping[str, Any]
    required: tuple[str, ...] = ()
    attention: Callable[[_Config], dict[str, bool]] = _bias_from_attention_bias
    sliding: SlidingRule = _no_sliding
    moe: MoERule | None = None
    mla: bool = False
    mlp_bias: bool = False          # reads ``mlp_bias`` (Llama, DeepSeek-V2)
    norms_per_layer: int = 2
    qk_norm: bool = False
    qk_norm_key: str | None = None  # a config flag that turns per-head QK-norm on (GLM-4.5's use_qk_norm)
    qk_norm_across_heads: bool = False
    attention_sinks: bool = False
    rotary_dim_key: str | None = None  # a legacy key giving the rotated dimensions (MiniMax-M2's rotary_dim)
    mtp_key: str | None = None      # the count of multi-token-prediction layers the checkpoint ships
    linear_attention: Callable[[_Config], LinearAttentionSpec] | None = None
    attention_output_gate: bool = False  # q_proj also yields a sigmoid gate on the attention output (Qwen3-Next)
    norm_weight_offset: float = 0.0  # RMSNorm scales by (offset + w): 1 for Qwen3-Next's zero-centred weights
    dense_mlp: bool = True          # has a dense-MLP ``intermediate_size`` (Qwen3.5-MoE's text config has none)
    dense_width_key: str = "intermediate_size"  # the dense MLP's width (Llama 4: intermediate_size_mlp)
    per_layer_ffn: bool = False     # numerics give the MLP widths, layer by layer (DeciLM's block_configs)
    numerics: Callable[[_Config], dict[str, Any]] | None = None  # further ModelSpec fields (Llama 4's attention)
    activation_key: str = "hidden_act"
    activation: str | None = None   # fixed activation name overriding the config's
    convention: str = "all_weights_touched"
    remote_code: bool = False       # transformers has no class for it: engines load its own code (MiMo-7B, DeciLM)
    # a checkpoint's key -> the config class's name for it, read where that name is absent (its attribute_map)
    key_aliases: Mapping[str, str] = dataclass_field(default_factory=dict)


_LLAMA_LIKE = {"head_dim": DERIVED, "tie_word_embeddings": False, "rope_theta": 10000.0, "hidden_act": "silu"}
# Qwen3-Next / Qwen3.5: 3 Gated DeltaNet layers to 1 gated-attention layer (head_dim 256, QK-norm, a quarter of each
# head rotated), zero-centred RMSNorms; transformers Qwen3NextConfig / Qwen3_5TextConfig / Qwen3_5MoeTextConfig.
_QWEN_HYBRID = {**_LLAMA_LIKE, "head_dim": 256, "max_position_embeddings": 32768, "attention_bias": False,
                "partial_rotary_factor": 0.25, "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
                "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                "linear_num_value_heads": 32}
_HYBRID = {"linear_attention": _gated_deltanet, "attention_output_gate": True, "norm_weight_offset": 1.0,
           "qk_norm": True, "mtp_key": "mtp_num_hidden_layers"}

# Qwen2 (Qwen2Config): q/k/v biases, a window from max_window_layers on where use_sliding_window
_QWEN2 = _Family(
    defaults={**_LLAMA_LIKE, "num_key_value_heads": 32, "max_position_embeddings": 32768,
              "sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 28},
    attention=_qwen2_bias,
    sliding=_window_by_layer_type(_qwen_upper_layers, enabled_key="use_sliding_window"))

FAMILIES: dict[str, _Family] = {
    "llama": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": None, "max_position_embeddings": 2048,
                  "attention_bias": False, "mlp_bias": False},
        mlp_bias=True),
    # Llama-3.x-Nemotron Super / Ultra (DeciLMForCausalLM, remote code; vLLM nemotron_nas.py): Llama 3 with each
    # layer's attention and MLP from block_configs
    "nemotron-nas": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": None, "max_position_embeddings": 2048,
                  "attention_bias": False, "mlp_bias": False},
        required=("block_configs",), mlp_bias=True, per_layer_ffn=True, numerics=_nemotron_nas, remote_code=True),
    "mistral": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                  "sliding_window": 4096},
        attention=_no_bias, sliding=_window_every_layer()),
    # Seed-OSS (SeedOssConfig): Llama with q/k/v biases (attention_bias), o_proj's own (attention_out_bias)
    "seed_oss": _Family(
        defaults={**_LLAMA_LIKE, "head_dim": 128, "num_key_value_heads": 8, "max_position_embeddings": 524288,
                  "attention_bias": True, "attention_out_bias": False, "mlp_bias": False},
        attention=_seed_oss_bias, mlp_bias=True),
    # GLM-4-0414 (Glm4Config): q/k/v biases, 4 sandwich norms, interleaved RoPE on half of each head, fused gate_up
    "glm4": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 2, "head_dim": 128, "max_position_embeddings": 131072,
                  "attention_bias": True, "partial_rotary_factor": 0.5},
        attention=_qkv_bias_from_attention_bias, norms_per_layer=4, numerics=_glm4_numerics),
    # OLMo 2 (Olmo2Config): post-norm, QK-norm over all heads at once, biases per attention_bias
    "olmo2": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": None, "max_position_embeddings": 2048,
                  "attention_bias": False},
        qk_norm=True, qk_norm_across_heads=True, numerics=_post_norm),
    # OLMo 3 (Olmo3Config): OLMo 2 with sliding-window layers (3 of every 4 by default), RoPE scaling on full layers
    "olmo3": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": None, "max_position_embeddings": 2048,
                  "attention_bias": False, "rope_theta": 500000.0, "sliding_window": 4096},
        sliding=_window_by_layer_type(_every_fourth_full), qk_norm=True, qk_norm_across_heads=True,
        numerics=_olmo3_numerics),
    # SmolLM3 (SmolLM3Config): Llama with NoPE layers (no_rope_layers; every 4th by default), tied embeddings
    "smollm3": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 4, "max_position_embeddings": 32768,
                  "tie_word_embeddings": True, "rope_theta": 2000000.0, "attention_bias": False, "mlp_bias": False,
                  "use_sliding_window": False, "sliding_window": None, "no_rope_layer_interval": 4},
        sliding=_window_by_layer_type(_smollm3_nope_slides, enabled_key="use_sliding_window"), mlp_bias=True,
        numerics=_smollm3_nope),
    # EXAONE 4.0 (Exaone4Config): post-norm, per-head QK-norm, bias-free; sliding layers and NoPE full layers
    "exaone4": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 32, "max_position_embeddings": 2048, "sliding_window": 4096},
        attention=_no_bias, sliding=_every_fourth_global_sliding, qk_norm=True, numerics=_exaone4_numerics),
    # Granite 3.x (GraniteConfig): Llama with embedding / residual / attention / logits multipliers (numerics only)
    "granite": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": None, "max_position_embeddings": 2048,
                  "attention_bias": False, "mlp_bias": False, "embedding_multiplier": 1.0,
                  "residual_multiplier": 1.0, "attention_multiplier": 1.0, "logits_scaling": 1.0},
        mlp_bias=True, numerics=_granite_numerics),
    "mixtral": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                  "sliding_window": None, "rope_theta": 1000000.0},
        required=("num_local_experts", "num_experts_per_tok"),
        attention=_no_bias, sliding=_window_every_layer(), moe=_mixtral_moe),
    "qwen2": _QWEN2,
    # MiMo-7B (XiaomiMiMo's remote-code MiMoConfig, a Qwen2Config; vLLM mimo.py runs it as Qwen2): Qwen2's decoder,
    # with num_nextn_predict_layers MTP layers shipped for speculative decoding (vLLM mimo_mtp.py), not counted in it
    "mimo": replace(_QWEN2, mtp_key="num_nextn_predict_layers", remote_code=True),
    "qwen2_moe": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 16, "max_position_embeddings": 32768,
                  "sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 28, "qkv_bias": True,
                  "decoder_sparse_step": 1, "norm_topk_prob": False, "mlp_only_layers": None,
                  "shared_expert_intermediate_size": 5632},
        required=("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
        attention=_qwen2_moe_bias,
        sliding=_window_by_layer_type(_qwen2_moe_pattern, enabled_key="use_sliding_window"),
        moe=_qwen_moe(shared_expert=True)),
    "qwen3": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768,
                  "attention_bias": False, "sliding_window": 4096, "use_sliding_window": False,
                  "max_window_layers": 28},
        sliding=_window_by_layer_type(_qwen_upper_layers, enabled_key="use_sliding_window"), qk_norm=True),
    "qwen3_moe": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 4, "max_position_embeddings": 32768,
                  "attention_bias": False, "sliding_window": 4096, "use_sliding_window": False,
                  "decoder_sparse_step": 1, "norm_topk_prob": False, "mlp_only_layers": None},
        required=("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
        sliding=_window_every_layer(enabled_key="use_sliding_window"), moe=_qwen_moe(shared_expert=False),
        qk_norm=True),
    # ERNIE 4.5 MoE (Ernie4_5_MoeConfig): dense first layer(s) by moe_layer_start_index / interval / end index,
    # softmax router with a score-correction bias, shared experts, RoPE on adjacent pairs
    "ernie4_5_moe": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 4, "max_position_embeddings": 131072,
                  "tie_word_embeddings": True, "rope_theta": 500000.0, "use_bias": False, "moe_intermediate_size": 1536,
                  "moe_k": 6, "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
                  "moe_layer_end_index": -1, "moe_layer_interval": 1},
        attention=_no_bias, moe=_ernie_moe, mtp_key="num_nextn_predict_layers", numerics=_ernie_layers),
    # Hunyuan-A13B (HunYuanMoEV1Config): MoE on every layer with one shared MLP, experts and shared MLP of
    # intermediate_size, per-head QK-norm after RoPE, NTK-alpha RoPE (rope_scaling alpha)
    "hunyuan_v1_moe": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": None, "max_position_embeddings": 2048,
                  "attention_bias": False, "num_experts": 1, "moe_topk": 1},
        moe=_hunyuan_moe, qk_norm=True, numerics=_hunyuan_layers),
    # Granite 3.x MoE (GraniteMoeConfig): MoE on every layer, top-k softmax, attention_multiplier scaling
    "granitemoe": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": None, "max_position_embeddings": 2048,
                  "attention_bias": False, "num_local_experts": 8, "num_experts_per_tok": 2,
                  "attention_multiplier": 1.0, "embedding_multiplier": 1.0, "residual_multiplier": 1.0,
                  "logits_scaling": 1.0},
        moe=_granite_moe(shared_expert=False), numerics=_granite_numerics),
    # Granite MoE with a shared expert (GraniteMoeSharedConfig): granitemoe plus shared_mlp of shared_intermediate_size
    "granitemoeshared": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": None, "max_position_embeddings": 2048,
                  "attention_bias": False, "num_local_experts": 8, "num_experts_per_tok": 2,
                  "attention_multiplier": 1.0, "shared_intermediate_size": 0, "embedding_multiplier": 1.0,
                  "residual_multiplier": 1.0, "logits_scaling": 1.0},
        moe=_granite_moe(shared_expert=True), numerics=_granite_numerics),
    # dots.llm1 (Dots1Config): DeepSeek-V3's router and shared experts with plain attention (MHA in the release) and
    # per-head QK-norm, dense MLPs before first_k_dense_replace, sliding layers from max_window_layers on
    "dots1": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 32, "max_position_embeddings": 2048,
                  "attention_bias": False, "sliding_window": 4096, "max_window_layers": 62,
                  "first_k_dense_replace": 0, "moe_layer_freq": 1, "n_shared_experts": None, "norm_topk_prob": False,
                  "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0},
        required=("n_routed_experts", "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size"),
        sliding=_window_by_layer_type(_qwen_upper_layers), moe=_deepseek_moe(score_correction_bias=True),
        qk_norm=True),
    # Qwen3-VL-MoE's decoder (Qwen3VLMoeTextConfig): Qwen3-MoE with renormalised top-k and M-RoPE (a text token's
    # three position ids are equal: plain RoPE)
    "qwen3_vl_moe_text": _Family(
        defaults={**_LLAMA_LIKE, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
                  "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                  "max_position_embeddings": 128000, "rope_theta": 500000.0, "attention_bias": False,
                  "tie_word_embeddings": True, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                  "decoder_sparse_step": 1, "mlp_only_layers": None},
        required=("num_experts",), moe=_qwen_moe(shared_expert=False, renormalised=True), qk_norm=True),
    "qwen3_next": _Family(
        defaults={**_QWEN_HYBRID, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
                  "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
                  "decoder_sparse_step": 1, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                  "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True, "mlp_only_layers": None},
        moe=_qwen_moe(shared_expert=True), **_HYBRID),
    "qwen3_5_text": _Family(
        defaults={**_QWEN_HYBRID, "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
                  "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4},
        **_HYBRID),
    "qwen3_5_moe_text": _Family(
        defaults={**_QWEN_HYBRID, "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
                  "num_attention_heads": 16, "num_key_value_heads": 2, "moe_intermediate_size": 512,
                  "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256},
        moe=_qwen_moe(shared_expert=True, every_layer=True), dense_mlp=False, **_HYBRID),
    "gemma": _Family(
        defaults={"num_key_value_heads": 16, "head_dim": 256, "tie_word_embeddings": True,
                  "max_position_embeddings": 8192, "attention_bias": False, "rope_theta": 10000.0,
                  "hidden_act": "gelu_pytorch_tanh"}),
    "gemma2": _Family(
        defaults={"num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": True,
                  "max_position_embeddings": 8192, "attention_bias": False, "rope_theta": 10000.0,
                  "sliding_window": 4096, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
                  "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
        sliding=_window_by_layer_type(_even_layers), norms_per_layer=4, activation_key="hidden_activation"),
    "gemma3_text": _Family(
        defaults={"num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": True,
                  "max_position_embeddings": 131072, "attention_bias": False, "rope_theta": 1000000.0,
                  "rope_local_base_freq": 10000.0, "sliding_window": 4096, "sliding_window_pattern": 6,
                  "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256},
        sliding=_window_by_layer_type(_gemma3_pattern), norms_per_layer=4, qk_norm=True,
        activation_key="hidden_activation"),
    # Gemma 4 (Gemma4TextConfig): sliding layers of head_dim 256, global ones per ``_gemma4_layers``, QK-norm and a
    # weightless V-norm, no query scaling (Q/K norms instead), an MoE beside the dense MLP when enable_moe_block
    "gemma4_text": _Family(
        defaults={"vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
                  "tie_word_embeddings": True, "max_position_embeddings": 131072, "attention_bias": False,
                  "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window": 512,
                  "hidden_activation": "gelu_pytorch_tanh", "hidden_size_per_layer_input": 256,
                  "num_kv_shared_layers": 0, "attention_k_eq_v": False, "enable_moe_block": False},
        sliding=_window_by_layer_type(_gemma4_pattern), moe=_gemma4_moe, qk_norm=True,
        activation_key="hidden_activation", numerics=_gemma4_layers),
    "phi3": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": None, "max_position_embeddings": 4096,
                  "sliding_window": None},
        attention=_no_bias, sliding=_window_every_layer()),
    "deepseek_v2": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": None, "max_position_embeddings": 2048,
                  "attention_bias": False, "mlp_bias": False, "norm_topk_prob": False, "first_k_dense_replace": 0,
                  "moe_layer_freq": 1, "n_shared_experts": 2, "q_lora_rank": 1536},
        required=("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "kv_lora_rank",
                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
        moe=_deepseek_moe(score_correction_bias=False), mla=True, mlp_bias=True),
    "deepseek_v3": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 128, "max_position_embeddings": 4096,
                  "attention_bias": False, "norm_topk_prob": True, "first_k_dense_replace": 3, "moe_layer_freq": 1,
                  "n_shared_experts": 1, "q_lora_rank": 1536, "n_group": 8, "topk_group": 4,
                  "routed_scaling_factor": 2.5},
        required=("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "kv_lora_rank",
                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
        moe=_deepseek_moe(score_correction_bias=True), mla=True, mtp_key="num_nextn_predict_layers"),
    # DeepSeek-V3.2: V3 with DSA's lightning indexer on every layer (transformers DeepseekV32Config)
    "deepseek_v32": _Family(
        defaults={**_LLAMA_LIKE, "head_dim": 64, "num_key_value_heads": 128, "max_position_embeddings": 163840,
                  "attention_bias": False, "norm_topk_prob": True, "first_k_dense_replace": 3, "moe_layer_freq": 1,
                  "n_shared_experts": 1, "q_lora_rank": 1536, "n_group": 8, "topk_group": 4,
                  "routed_scaling_factor": 2.5, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048},
        required=("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "kv_lora_rank",
                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
        moe=_deepseek_moe(score_correction_bias=True), mla=True, mtp_key="num_nextn_predict_layers",
        numerics=_dsa_indexer),
    # GLM-5 / 5.1 / 5.2: DeepSeek-V3.2's attention and router at GLM's sizes (transformers GlmMoeDsaConfig)
    "glm_moe_dsa": _Family(
        defaults={**_LLAMA_LIKE, "head_dim": 64, "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288,
                  "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64,
                  "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 256,
                  "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 2048, "qk_rope_head_dim": 64,
                  "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1,
                  "num_experts_per_tok": 8, "norm_topk_prob": True, "max_position_embeddings": 202752,
                  "attention_bias": False, "first_k_dense_replace": 3, "moe_layer_freq": 1, "index_n_heads": 32,
                  "index_head_dim": 128, "index_topk": 2048},
        moe=_deepseek_moe(score_correction_bias=True), mla=True, mtp_key="num_nextn_predict_layers",
        numerics=_dsa_indexer),
    # GLM-4.7-Flash: DeepSeek-V3's MLA and router at GLM's sizes, one dense layer first (transformers
    # Glm4MoeLiteConfig, whose mlp_layer_types replaces first_k_dense_replace)
    "glm4_moe_lite": _Family(
        defaults={**_LLAMA_LIKE, "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240,
                  "moe_intermediate_size": 1536, "num_hidden_layers": 47, "num_attention_heads": 20,
                  "num_key_value_heads": 20, "n_shared_experts": 1, "n_routed_experts": 64,
                  "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768, "qk_rope_head_dim": 64,
                  "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1,
                  "num_experts_per_tok": 4, "norm_topk_prob": True, "max_position_embeddings": 202752,
                  "attention_bias": False, "first_k_dense_replace": 1, "moe_layer_freq": 1},
        moe=_deepseek_moe(score_correction_bias=True), mla=True, mtp_key="num_nextn_predict_layers"),
    # MiMo-V2-Flash (MiMoV2FlashConfig): sliding (128 + 1) and full layers of their own KV heads, values narrower
    # than keys, sinks on the sliding layers, 256 sigmoid-routed experts
    "mimo_v2_flash": _Family(
        defaults={**_LLAMA_LIKE, "vocab_size": 152576, "hidden_size": 4096, "intermediate_size": 16384,
                  "num_hidden_layers": 48, "num_attention_heads": 64, "num_key_value_heads": 4,
                  "max_position_embeddings": 131072, "attention_bias": False, "moe_intermediate_size": 2048,
                  "num_experts_per_tok": 8, "n_routed_experts": 256, "n_group": 1, "topk_group": 1,
                  "norm_topk_prob": True, "head_dim": 192, "v_head_dim": 128, "sliding_window": 129,
                  "rope_theta": 5_000_000.0, "rope_local_base_freq": 10_000.0},
        sliding=_mimo_sliding, moe=_mimo_moe, numerics=_mimo_layers),
    # DeepSeek-V4 (DeepseekV4Config): one K=V head of 512 over a 128-token window on every layer, CSA / HCA
    # compressed entries beside it, grouped output projection, hyper-connections, MoE on every layer
    "deepseek_v4": _Family(
        defaults={**_LLAMA_LIKE, "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048,
                  "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
                  "q_lora_rank": 1024, "num_experts_per_tok": 6, "n_routed_experts": 256, "n_shared_experts": 1,
                  "norm_topk_prob": True, "routed_scaling_factor": 1.5, "max_position_embeddings": 1048576,
                  "sliding_window": 128, "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64,
                  "index_head_dim": 128, "index_topk": 512, "hc_mult": 4, "attention_bias": False},
        sliding=_window_every_layer(), moe=_deepseek_v4_moe, dense_mlp=False, attention=_no_bias,
        attention_sinks=True, mtp_key="num_nextn_predict_layers", numerics=_deepseek_v4_layers),
    # Step-3.7-Flash's decoder (transformers Step3p7TextConfig, the text_config of Step3p7Config; aiconfigurator's
    # flat copy of it): full and sliding layers by layer_types, per-head QK-norm and a sigmoid gate per head,
    # zero-centred RMSNorms, sigmoid-routed experts with a correction bias and one shared expert after the first dense
    # layers, num_nextn_predict_layers MTP layers (not counted in the decoder)
    "step3p7": _Family(
        defaults={**_LLAMA_LIKE, "vocab_size": 128815, "hidden_size": 4096, "intermediate_size": 11264,
                  "num_hidden_layers": 45, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                  "max_position_embeddings": 128000, "attention_bias": False, "mlp_bias": False,
                  "sliding_window": None, "num_experts_per_tok": 8, "moe_intermediate_size": 1280,
                  "n_routed_experts": 288, "share_expert_dim": 1280, "moe_router_scaling_factor": 1.0,
                  "first_k_dense_replace": 3},
        sliding=_window_by_layer_type(_no_default_sliding, mtp_padded=True), moe=_step3p7_moe, qk_norm=True,
        norm_weight_offset=1.0, mtp_key="num_nextn_predict_layers", activation="silu", numerics=_step3p7_attention),
    # Nemotron-H / Nemotron 3 (NemotronHConfig): Mamba-2, attention, MLP and MoE blocks per hybrid_override_pattern
    "nemotron_h": _Family(
        defaults={"vocab_size": 131072, "hidden_size": 4096, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096,
                  "intermediate_size": 21504, "mlp_hidden_act": "relu2", "mlp_bias": False, "ssm_state_size": 128,
                  "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4,
                  "use_conv_bias": True, "chunk_size": 128, "mamba_proj_bias": False, "n_routed_experts": 8,
                  "n_shared_experts": 1, "moe_intermediate_size": 7688, "moe_shared_expert_intermediate_size": 7688,
                  "num_experts_per_tok": 2, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
                  "norm_topk_prob": True, "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
                  "attention_bias": False},
        attention=_no_bias, moe=_nemotron_moe, mlp_bias=True, activation_key="mlp_hidden_act",
        mtp_key="num_nextn_predict_layers", numerics=_nemotron_h),
    # Granite 4.0 H-Small / H-Tiny / H-Micro / Micro (GraniteMoeHybridConfig): Mamba-2 or NoPE attention per
    # layer_types, and on every layer an FFN as well (MoE plus a shared expert, or the shared MLP alone), attention
    # scores scaled by attention_multiplier
    "granitemoehybrid": _Family(
        defaults={"num_key_value_heads": None, "head_dim": DERIVED, "hidden_act": "silu",
                  "max_position_embeddings": 2048, "tie_word_embeddings": False, "attention_bias": False,
                  "rope_theta": 10000.0, "num_local_experts": 8, "num_experts_per_tok": 2,
                  "shared_intermediate_size": 1024, "position_embedding_type": None, "attention_multiplier": 1.0,
                  "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_head": "auto",
                  "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True,
                  "mamba_proj_bias": False, "embedding_multiplier": 1.0, "residual_multiplier": 1.0,
                  "logits_scaling": 1.0},
        moe=_granite_hybrid_moe, dense_width_key="shared_intermediate_size", numerics=_granite_hybrid),
    # Command R7B / A (Cohere2Config): parallel attention + MLP behind one bias-free LayerNorm, 3 sliding-window
    # layers (RoPE) to 1 global NoPE layer, tied embeddings
    "cohere2": _Family(
        defaults={"num_key_value_heads": None, "head_dim": DERIVED, "hidden_act": "silu",
                  "max_position_embeddings": 8192, "tie_word_embeddings": True, "attention_bias": False,
                  "rope_theta": 10000.0, "sliding_window": 4096, "logit_scale": 0.0625},
        sliding=_every_fourth_global_sliding, numerics=_cohere2),
    # Command R / R+ (CohereConfig): parallel attention + MLP behind one bias-free LayerNorm, RoPE on every layer,
    # per-head QK LayerNorms where use_qk_norm, tied embeddings
    "cohere": _Family(
        defaults={"num_key_value_heads": None, "head_dim": DERIVED, "hidden_act": "silu",
                  "max_position_embeddings": 8192, "tie_word_embeddings": True, "attention_bias": False,
                  "use_qk_norm": False, "rope_theta": 500000.0, "logit_scale": 0.0625},
        qk_norm_key="use_qk_norm", numerics=_cohere),
    # GLM-4.5 / 4.6 / 4.7: Llama-style GQA (q/k/v biases, optional per-head QK-norm, half the head rotated) with
    # DeepSeek-V3's router and shared expert; transformers Glm4MoeConfig / Glm4MoeForCausalLM.
    "glm4_moe": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                  "attention_bias": False, "use_qk_norm": False, "partial_rotary_factor": 0.5,
                  "norm_topk_prob": True, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_shared_experts": 1,
                  "n_routed_experts": 128, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
                  "num_experts_per_tok": 8, "moe_intermediate_size": 1408},
        attention=_qkv_bias_from_attention_bias, moe=_deepseek_moe(score_correction_bias=True),
        qk_norm_key="use_qk_norm", mtp_key="num_nextn_predict_layers"),
    # MiniMax-M2 / M2.5 / M2.7: GQA whose QK-norm spans all heads, partial RoPE (rotary_dim), 256 sigmoid-routed
    # experts on every layer; transformers MiniMaxM2Config / MiniMaxM2ForCausalLM.
    "minimax_m2": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 196608,
                  "rope_theta": 5000000.0},
        required=("num_local_experts", "num_experts_per_tok"),
        attention=_no_bias, moe=_minimax_m2_moe, qk_norm=True, qk_norm_across_heads=True,
        rotary_dim_key="rotary_dim"),
    # MiniMax-M3 (transformers MiniMaxM3VLTextConfig, model_type minimax_m3_vl_text): GQA with per-head QK-norm and
    # partial RoPE, MSA's block indexer on the sparse layers, dense MLPs of dense_intermediate_size first, then 128
    # sigmoid-routed experts beside one shared expert; Gemma-style (1 + w) RMSNorms, clamped SwiGLU
    "minimax_m3": _Family(
        defaults={**_LLAMA_LIKE, "vocab_size": 200064, "hidden_size": 6144, "intermediate_size": 3072,
                  "num_hidden_layers": 60, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
                  "max_position_embeddings": 524288, "rope_theta": 5000000.0, "num_experts_per_tok": 4,
                  "num_local_experts": 128, "dense_intermediate_size": 12288, "shared_intermediate_size": 3072,
                  "routed_scaling_factor": 2.0, "rotary_dim": 64, "index_n_heads": 4, "index_head_dim": 128,
                  "index_block_size": 128, "index_topk_blocks": 16},
        required=("num_local_experts", "num_experts_per_tok"),
        attention=_no_bias, moe=_minimax_m3_moe, qk_norm=True, rotary_dim_key="rotary_dim",
        mtp_key="num_nextn_predict_layers", norm_weight_offset=1.0, dense_width_key="dense_intermediate_size",
        activation="swiglu_clamped", numerics=_minimax_m3_layers),
    # Llama 4 Scout / Maverick: GQA whose RoPE layers attend within 8192-token chunks and every fourth (NoPE) layer
    # to the whole context, top-1 sigmoid-routed experts plus a shared expert (on every other layer in Maverick, the
    # rest dense MLPs of intermediate_size_mlp); transformers Llama4TextConfig / Llama4ForCausalLM.
    "llama4_text": _Family(
        defaults={**_LLAMA_LIKE, "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
                  "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                  "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
                  "rope_theta": 500000.0, "attention_bias": False, "num_experts_per_tok": 1, "num_local_experts": 16,
                  "interleave_moe_layer_step": 1, "use_qk_norm": True, "no_rope_layer_interval": 4,
                  "attention_chunk_size": 8192, "attn_temperature_tuning": True, "floor_scale": 8192,
                  "attn_scale": 0.1},
        sliding=_llama4_chunks, moe=_llama4_moe, dense_width_key="intermediate_size_mlp",
        numerics=_llama4_attention),
    # Kimi Linear (transformers KimiLinearConfig / KimiLinearForCausalLM): KDA on the linear_attn_config kda_layers,
    # NoPE MLA on the rest, DeepSeek-V3's sigmoid router and shared experts after first_k_dense_replace dense layers;
    # the checkpoints' num_experts, num_experts_per_token, ... are the class's attribute_map names
    "kimi_linear": _Family(
        defaults={"vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024,
                  "num_hidden_layers": 27, "num_attention_heads": 32, "num_key_value_heads": 32,
                  "n_shared_experts": 1, "routed_scaling_factor": 2.446, "kv_lora_rank": 512, "q_lora_rank": None,
                  "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1,
                  "num_experts_per_tok": 8, "norm_topk_prob": True, "hidden_act": "silu",
                  "max_position_embeddings": 1048576, "tie_word_embeddings": False, "attention_bias": False,
                  "num_local_experts": 256, "linear_head_dim": 128, "linear_num_heads": 32,
                  "linear_conv_kernel_dim": 4, "first_k_dense_replace": 1, "moe_layer_freq": 1},
        moe=_kimi_moe, mla=True,
        linear_attention=_kda, mtp_key="num_nextn_predict_layers", numerics=_kimi_linear,
        key_aliases={"num_experts": "num_local_experts", "num_experts_per_token": "num_experts_per_tok",
                     "num_shared_experts": "n_shared_experts", "moe_renormalize": "norm_topk_prob",
                     "num_expert_group": "n_group", "model_max_length": "max_position_embeddings"}),
    "gpt_oss": _Family(
        defaults={**_LLAMA_LIKE, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
                  "attention_bias": True, "sliding_window": 128, "rope_theta": 150000.0},
        required=("num_local_experts", "num_experts_per_tok"),
        sliding=_window_by_layer_type(_even_layers), moe=_gpt_oss_moe, attention_sinks=True,
        activation="swiglu_clamped", convention="excludes_input_embedding"),
}
# A remote-code model type (config.json has an ``auto_map``: Kimi K2's kimi_k2) whose architectures[0] is a supported
# family's class is read as that family: vLLM and SGLang pick the model class by ``architectures``. Keys it leaves
# out take the family's defaults.
ARCHITECTURE_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "SeedOssForCausalLM": "seed_oss", "Glm4ForCausalLM": "glm4", "Olmo2ForCausalLM": "olmo2",
    "Olmo3ForCausalLM": "olmo3", "SmolLM3ForCausalLM": "smollm3", "Exaone4ForCausalLM": "exaone4",
    "GraniteForCausalLM": "granite",
    "Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2",
    "Ernie4_5_MoeForCausalLM": "ernie4_5_moe", "HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe", "Dots1ForCausalLM": "dots1",
    "GraniteMoeForCausalLM": "granitemoe", "GraniteMoeSharedForCausalLM": "granitemoeshared",
    "Gemma3ForCausalLM": "gemma3_text", "Phi3ForCausalLM": "phi3", "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3", "GptOssForCausalLM": "gpt_oss", "Glm4MoeForCausalLM": "glm4_moe",
    "MiniMaxM2ForCausalLM": "minimax_m2", "Qwen3NextForCausalLM": "qwen3_next", "Qwen3_5ForCausalLM": "qwen3_5_text",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text", "Llama4ForCausalLM": "llama4_text",
    "Gemma4ForCausalLM": "gemma4_text", "DeepseekV32ForCausalLM": "deepseek_v32",
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite", "MiMoV2FlashForCausalLM": "mimo_v2_flash",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa", "NemotronHForCausalLM": "nemotron_h",
    "GraniteMoeHybridForCausalLM": "granitemoehybrid", "Cohere2ForCausalLM": "cohere2", "CohereForCausalLM": "cohere",
    "MiniMaxM3ForCausalLM": "minimax_m3", "MiniMaxM3SparseForCausalLM": "minimax_m3",
    "KimiLinearForCausalLM": "kimi_linear",
}


# Model types that name a supported family's config under another name. sgl-project's DeepSeek-V4-Flash-FP8 and
# -Pro-FP8 (SGLang's deepseek_ref) carry DeepseekV4Config's fields field for field (tests/spec/test_hf_config_moe.py
# compares them with deepseek-ai's configs) and its architecture, DeepseekV4ForCausalLM.
MODEL_TYPE_ALIASES: dict[str, str] = {"deepseek_ref": "deepseek_v4"}


# --- shared field mapping ------------------------------------------------------------------------------------------

# Keys a scaled RoPE must carry, by type, that transformers does not fill in itself (it fills rope_theta and
# original_max_position_embeddings from the config): transformers 5.25 modeling_rope_utils.py,
# RotaryEmbeddingConfigMixin._validate_{linear,dynamic,yarn,longrope,llama3}_rope_parameters' required_keys (a KeyError
# when one is absent) less what standardize_rope_params sets
ROPE_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",), "longrope": ("short_factor", "long_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}


def _rope(c: _Config, family: _Family) -> tuple[float, RopeScaling | None]:
    """``rope_theta`` and ``rope_scaling`` from the classic keys or transformers 5's ``rope_parameters``."""
    params = c.data.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get(FULL), dict):  # Gemma 3: one entry per layer type
        params = params[FULL]
    params = params if isinstance(params, dict) else {}
    theta = check_float("rope_theta", c.data.get("rope_theta", params.get(
        "rope_theta", family.defaults.get("rope_theta", 10000.0))))
    scaling = c.data.get("rope_scaling")
    if scaling is None:
        scaling = params
    if not isinstance(scaling, dict):
        raise c.error(f"field 'rope_scaling' must be a mapping or null, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "dynamic" and scaling.get("alpha") is not None:
        return _ntk_alpha_theta(c, float(theta), scaling["alpha"]), None
    if rope_type in (None, "default", "mrope", "proportional"):
        # M-RoPE (Qwen2-VL): a text token's three position ids are equal; Gemma 4's proportional RoPE rotates part
        # of each head unscaled (its share: ``_gemma4_layers``)
        return float(theta), None
    if c.model_type == "phi3" and rope_type in ("su", "yarn"):  # Phi3Config renames both to longrope
        rope_type = "longrope"
    missing = [key for key in ROPE_REQUIRED_KEYS.get(rope_type, ()) if scaling.get(key) is None]
    if missing:
        where = "rope_scaling" if c.data.get("rope_scaling") is not None else "rope_parameters"
        raise c.error(f"field '{where}': rope_type {rope_type} needs '{missing[0]}' (transformers refuses it without)")
    original = scaling.get("original_max_position_embeddings", c.data.get("original_max_position_embeddings"))

    def number(key: str) -> float | None:
        value = scaling.get(key)
        return None if value is None else check_float(f"rope_scaling.{key}", value)

    return theta, RopeScaling(
        rope_type=rope_type, factor=number("factor") or 1.0,
        original_max_position_embeddings=None if original is None else c.check_int(
            "rope_scaling.original_max_position_embeddings", original, 1),
        low_freq_factor=number("low_freq_factor"), high_freq_factor=number("high_freq_factor"),
        beta_fast=number("beta_fast"), beta_slow=number("beta_slow"), mscale=number("mscale"),
        mscale_all_dim=number("mscale_all_dim"))


def _ntk_alpha_theta(c: _Config, theta: float, alpha: Any) -> float:
    """Hunyuan's "dynamic" RoPE with an ``alpha`` (transformers HunYuanMoEV1RotaryEmbedding, ntk_alpha): a fixed base
    theta x alpha^(d / (d - 2)) over head_dim d, unscaled otherwise and independent of the sequence length."""
    dim = c.opt_int("head_dim", minimum=1) or c.req_int("hidden_size") // c.req_int("num_attention_heads")
    if dim <= 2:
        raise c.error(f"rope_scaling alpha needs a head_dim above 2, got {dim}")
    return check_float("rope_theta", theta * check_float("rope_scaling.alpha", alpha) ** (dim / (dim - 2)))


def _partial_rotary_factor(c: _Config, family: _Family, head_dim: int) -> float:
    """The share of head_dim RoPE turns: ``partial_rotary_factor`` (classic or in transformers 5's
    ``rope_parameters``), else the family's legacy rotated-dimension key over head_dim, else its default (1)."""
    params = c.data.get("rope_parameters")
    value = c.data.get("partial_rotary_factor")
    if value is None and isinstance(params, dict):
        value = params.get("partial_rotary_factor")
    if value is None and family.rotary_dim_key is not None and c.data.get(family.rotary_dim_key) is not None:
        return c.check_int(family.rotary_dim_key, c.data[family.rotary_dim_key], 1) / head_dim
    if value is None:
        value = family.defaults.get("partial_rotary_factor", 1.0)
    return check_float("partial_rotary_factor", value)


def _local_rope_theta(c: _Config, family: _Family) -> float | None:
    """The sliding layers' own RoPE base (Gemma 3): transformers 5's ``rope_parameters.sliding_attention`` or the
    classic ``rope_local_base_freq``; None where the family has none (every layer uses rope_theta)."""
    params = c.data.get("rope_parameters")
    local = params.get(SLIDING) if isinstance(params, dict) else None
    if isinstance(local, dict) and local.get("rope_theta") is not None:
        return float(check_float("rope_parameters.sliding_attention.rope_theta", local["rope_theta"]))
    value = c.data.get("rope_local_base_freq", family.defaults.get("rope_local_base_freq"))
    return None if value is None else float(check_float("rope_local_base_freq", value))


def _gemma_numerics(c: _Config) -> dict[str, Any]:
    """Gemma families: (1 + w) RMSNorm (Gemma 4: w), embeddings times sqrt(hidden); Gemma 2/3 add the query
    pre-attention scalar and soft-capping (transformers Gemma2Attention / Gemma2ForCausalLM), Gemma 4 unscaled
    scores (a scalar of 1)."""
    if not c.model_type.startswith("gemma"):
        return {}
    if c.model_type == "gemma4_text":  # plain (w) RMSNorms, scores unscaled (Gemma4TextAttention scaling 1.0)
        out: dict[str, Any] = {"embedding_scale_sqrt_hidden": True, "query_pre_attn_scalar": 1.0}
    else:
        out = {"norm_weight_offset": 1.0, "embedding_scale_sqrt_hidden": True}
    for key in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
        value = c.opt_float(key)
        if value is not None:
            out[key] = value
    return out


def _native_dtype(c: _Config) -> str:
    """torch_dtype/dtype: the format of the unquantized weights (``quantization_config`` refines it later)."""
    raw = c.data.get("torch_dtype", c.data.get("dtype"))
    if raw is None:
        return "bf16"
    if isinstance(raw, str) and raw in _TORCH_DTYPES:
        return _TORCH_DTYPES[raw]
    raise c.error(f"field 'torch_dtype' must be one of {', '.join(_TORCH_DTYPES)}, got {raw!r}")


# HF ``hidden_act`` names -> the names ModelSpec uses (tfcalc.model.layers.activate); others are refused.
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu",
                "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "relu2": "relu2", "situ": "situ"}


def _activation(c: _Config, family: _Family) -> str:
    if family.activation is not None:
        return family.activation
    value = c.get(family.activation_key) or c.get("hidden_act") or "silu"
    if not isinstance(value, str):
        raise c.error(f"field '{family.activation_key}' must be a string, got {value!r}")
    if c.model_type == "gemma" and value == "gelu":  # GemmaConfig: legacy "gelu" means the tanh approximation
        value = "gelu_pytorch_tanh"
    if value not in _ACTIVATIONS:
        raise c.error(f"field '{family.activation_key}' {value[:40]!r} is not supported (supported: "
                      f"{', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[value]


def _name_or_path(c: _Config) -> str | None:
    """``_name_or_path``, the repository id or folder transformers saved the config from (what an engine loads)."""
    value = c.data.get("_name_or_path")
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.isprintable() or len(value) > MAX_PATH_CHARS:
        raise c.error(f"field '_name_or_path' must be a repository id or a path, got {value!r:.60}")
    return value


def _architecture(c: _Config) -> str | None:
    """``architectures[0]``, the transformers class the checkpoint was saved from (Qwen3MoeForCausalLM, ...)."""
    value = c.data.get("architectures")
    if value is None or value == []:
        return None
    if (not isinstance(value, list) or not isinstance(value[0], str) or not value[0].isidentifier()
            or len(value[0]) > 128):
        raise c.error(f"field 'architectures' must be a list of class names, got {value!r:.60}")
    return value[0]


def _family_type(config: Mapping[str, Any]) -> str | None:
    """The supported model type ``config`` is read as: its own, its alias's (``MODEL_TYPE_ALIASES``), else a
    remote-code config's architecture's (``ARCHITECTURE_FAMILIES``)."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in FAMILIES:
        return model_type
    if isinstance(model_type, str) and model_type in MODEL_TYPE_ALIASES:
        return MODEL_TYPE_ALIASES[model_type]
    architectures = config.get("architectures")
    if (isinstance(model_type, str) and isinstance(config.get("auto_map"), dict) and isinstance(architectures, list)
            and architectures):
        return ARCHITECTURE_FAMILIES.get(architectures[0]) if isinstance(architectures[0], str) else None
    return None


class _Multimodal(NamedTuple):
    """How a multimodal config.json is read: its decoder as a tfcalc family, its vision encoder by kind."""

    family: str                       # the tfcalc family its text decoder is read as
    text_type: str                    # transformers' model_type of its text config
    vision_type: str                  # transformers' model_type of its vision config
    text_defaults: Mapping[str, Any]  # that text config class's defaults where they differ from the family's
    vision_aliases: tuple[str, ...] = ()  # other vision model_types checkpoints carry (Qwen3.5's legacy "qwen3_5")
    text_aliases: tuple[str, ...] = ()    # other text model_types checkpoints carry (Kimi K2.5's "kimi_k2")
    # the checkpoint's own code (tokenizer, config) is needed to serve it when its config.json has an auto_map
    remote_code: bool = False


# Multimodal checkpoints tfcalc reads as their text decoder plus a vision encoder (a nested text_config, or the text
# keys at the top level as Qwen2.5-VL's original config.json has them).
MULTIMODAL: dict[str, _Multimodal] = {
    "gemma3": _Multimodal("gemma3_text", "gemma3_text", "siglip_vision_model", {
        "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8}),
    "mistral3": _Multimodal("mistral", "mistral", "pixtral", {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32}),
    "qwen2_5_vl": _Multimodal("qwen2", "qwen2_5_vl_text", "qwen2_5_vl", {
        "vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 32768,
        "max_window_layers": 80, "rope_theta": 1000000.0}),
    "qwen3_vl": _Multimodal("qwen3", "qwen3_vl_text", "qwen3_vl_vision", {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 128000,
        "rope_theta": 500000.0}, ("qwen3_vl",)),
    "qwen3_vl_moe": _Multimodal("qwen3_vl_moe_text", "qwen3_vl_moe_text", "qwen3_vl_moe_vision", {},
                                ("qwen3_vl_moe",)),
    "qwen3_5": _Multimodal("qwen3_5_text", "qwen3_5_text", "qwen3_5_vision", {}, ("qwen3_5",)),
    "qwen3_5_moe": _Multimodal("qwen3_5_moe_text", "qwen3_5_moe_text", "qwen3_5_moe_vision", {}, ("qwen3_5_moe",)),
    "llama4": _Multimodal("llama4_text", "llama4_text", "llama4_vision_model", {}),
    "gemma4": _Multimodal("gemma4_text", "gemma4_text", "gemma4_vision", {}),
    # Kimi K2.5 / K2.6: a DeepSeek-V3 decoder (Moonshot's text_config says kimi_k2, NVIDIA's deepseek_v3) and MoonViT;
    # its tiktoken tokenizer is the checkpoint's own code (its model card serves it with --trust-remote-code)
    # MiniMax-M3 (transformers MiniMaxM3VLConfig): the minimax_m3 decoder and a CLIP-style tower with 3-D RoPE
    "minimax_m3_vl": _Multimodal("minimax_m3", "minimax_m3_vl_text", "minimax_m3_vl_vision", {},
                                 ("clip_vision_model",)),
    "kimi_k25": _Multimodal("deepseek_v3", "deepseek_v3", "kimi_k25_vision", {}, ("",), ("kimi_k2",), True),
    # Kimi K3 (vLLM KimiK3Config, remote code): a kimi_linear decoder (KDA + MLA, latent MoE) and MoonViT-V2
    "kimi_k3": _Multimodal("kimi_linear", "kimi_linear", "kimi_k3_vision", {}, remote_code=True),
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted({*FAMILIES, *MULTIMODAL, *MODEL_TYPE_ALIASES}))
# transformers' vision-config defaults (SiglipVisionConfig, PixtralVisionConfig, Qwen2_5_VLVisionConfig), under
# tfcalc's names (Qwen's depth / in_chans are num_hidden_layers / num_channels here)
SIGLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "patch_size": 16,
                   "image_size": 224, "num_channels": 3, "vision_use_head": True}
PIXTRAL_DEFAULTS = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "patch_size": 16,
                    "image_size": 1024, "num_channels": 3}
QWEN2_5_VL_DEFAULTS = {"hidden_size": 3584, "intermediate_size": 3420, "num_hidden_layers": 32, "patch_size": 14,
                       "num_channels": 3, "spatial_merge_size": 2, "temporal_patch_size": 2}
QWEN3_5_VISION_DEFAULTS = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 16,
                           "num_channels": 3, "spatial_merge_size": 2, "temporal_patch_size": 2,
                           "num_position_embeddings": 2304}
LLAMA4_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 5632, "num_hidden_layers": 34, "patch_size": 14,
                          "image_size": 448, "num_channels": 3, "projector_input_dim": 4096,
                          "projector_output_dim": 4096, "vision_output_dim": 7680}
QWEN3_VL_VISION_DEFAULTS = {**QWEN3_5_VISION_DEFAULTS, "deepstack_visual_indexes": [8, 16, 24]}
# transformers' Kimi_K25VisionConfig (its pos_emb_height / width are init_pos_emb_* in the checkpoints' config.json)
KIMI_K25_VISION_DEFAULTS = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 14,
                            "num_channels": 3, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
                            "merge_kernel_size": [2, 2]}
# transformers MiniMaxM3VLVisionConfig (spatial_merge_size and temporal_patch_size are its own keys; NVIDIA's copy
# nests them in img_token_compression_config, which the class does not read)
MINIMAX_M3_VISION_DEFAULTS = {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
                              "patch_size": 14, "image_size": 2016, "num_channels": 3, "spatial_merge_size": 2,
                              "temporal_patch_size": 2}
GEMMA4_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16, "patch_size": 16,
                          "num_channels": 3, "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 64,
                          "position_embedding_size": 10240}
# Kimi K3's MoonViT-V2 (vLLM KimiK3VisionConfig; kimi_k25_vit.py): vLLM KimiK3VisionConfig's defaults
KIMI_K3_VISION_DEFAULTS = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 27, "patch_size": 14,
                           "num_channels": 3, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
                           "merge_kernel_size": [2, 2], "qkv_hidden_size": 1536, "num_attention_heads": 12}
_VISION = {"siglip_vision_model": ("siglip", SIGLIP_DEFAULTS), "pixtral": ("pixtral", PIXTRAL_DEFAULTS),
           "qwen2_5_vl": ("qwen2_5_vl", QWEN2_5_VL_DEFAULTS), "qwen3_5_vision": ("qwen3_5", QWEN3_5_VISION_DEFAULTS),
           "qwen3_5_moe_vision": ("qwen3_5", QWEN3_5_VISION_DEFAULTS),
           "qwen3_vl_vision": ("qwen3_5", QWEN3_VL_VISION_DEFAULTS),
           "qwen3_vl_moe_vision": ("qwen3_5", QWEN3_VL_VISION_DEFAULTS),
           "llama4_vision_model": ("llama4", LLAMA4_VISION_DEFAULTS),
           "gemma4_vision": ("gemma4", GEMMA4_VISION_DEFAULTS),
           "kimi_k25_vision": ("moonvit", KIMI_K25_VISION_DEFAULTS),
           "minimax_m3_vl_vision": ("minimax_m3", MINIMAX_M3_VISION_DEFAULTS),
           "kimi_k3_vision": ("moonvit2", KIMI_K3_VISION_DEFAULTS)}
# Moonshot's vt_* names are its remote code's (engines read the plain ones, whose defaults the released configs
# repeat); pos_emb_* are transformers' names for init_pos_emb_*
_VISION_ALIASES = {"depth": "num_hidden_layers", "in_chans": "num_channels", "in_channels": "num_channels",
                   "vt_hidden_size": "hidden_size", "vt_intermediate_size": "intermediate_size",
                   "vt_num_hidden_layers": "num_hidden_layers", "vt_num_attention_heads": "num_attention_heads",
                   "pos_emb_height": "init_pos_emb_height", "pos_emb_width": "init_pos_emb_width"}
# the MoonViT layouts tfcalc counts (K2.5's, and K3's MoonViT-V2: RMSNorms, bias-free linears, a wider qkv,
# patchmergerv2); any other value of these keys is refused
_MOONVIT2_FIXED = {"mm_projector_type": "patchmergerv2", "merge_type": "sd2_tpool", "pos_emb_type": "divided_fixed",
                   "norm_type": "rmsnorm", "mlp_type": "mlp2", "attn_bias": False, "linear_bias": False,
                   "patch_embed_proj_bias": False}
_MOONVIT_FIXED = {"mm_projector_type": "patchmerger", "merge_type": "sd2_tpool", "pos_emb_type": "divided_fixed",
                  "norm_type": "layernorm", "mlp_type": "mlp2", "attn_bias": True, "linear_bias": True,
                  "patch_embed_proj_bias": True}
# top-level keys of a multimodal config.json that describe the whole checkpoint, kept beside its text_config
_CHECKPOINT_KEYS = ("torch_dtype", "dtype", "quantization_config", "architectures", "_name_or_path", "auto_map",
                    "tie_word_embeddings")


def _text_and_encoder(config: Mapping[str, Any], origin: str) -> tuple[Mapping[str, Any], EncoderSpec | None]:
    """A multimodal config's text config (with the checkpoint's own keys) and its vision encoder; any other config
    as it is."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in MULTIMODAL:
        return config, None
    m = MULTIMODAL[model_type]
    nested = "text_config" in config
    text = (config.get("text_config") or {}) if nested else {k: v for k, v in config.items()
                                                            if k not in ("vision_config", "model_type")}
    vision = config.get("vision_config") or {}
    for key, value in (("text_config", text), ("vision_config", vision)):
        if not isinstance(value, dict):
            raise SpecError(f"{origin}: field '{key}' must be a mapping, got {value!r:.40}")
    if (text.get("model_type", m.text_type) not in (m.text_type, m.family, *m.text_aliases)
            or vision.get("model_type", m.vision_type) not in (m.vision_type, *m.vision_aliases)):
        raise SpecError(f"{origin}: a {model_type} config reads text_config of model_type {m.text_type} and "
                        f"vision_config of model_type {m.vision_type}")
    kept = {key: config[key] for key in _CHECKPOINT_KEYS if key in config}
    # the checkpoint's class is the top level's (Kimi K2.5's text_config names its decoder's, DeepseekV3ForCausalLM)
    whole = {"architectures": config["architectures"]} if "architectures" in config else {}
    merged = {**m.text_defaults, **kept, **text, "model_type": m.family, **whole}
    kind, defaults = _VISION[m.vision_type]
    named = {_VISION_ALIASES.get(k, k): val for k, val in vision.items() if val is not None}
    c = _Config({**defaults, **named}, f"{origin}: vision_config", m.vision_type, defaults)
    top = _Config(config, origin, model_type, {"spatial_merge_size": 2, "multimodal_projector_bias": False})
    layer = config.get("vision_feature_layer", -1)
    if not isinstance(layer, int) or isinstance(layer, bool):  # several layers concatenated into linear_1
        raise SpecError(f"{origin}: field 'vision_feature_layer' {layer!r:.40} is not supported (one layer)")
    extra: dict[str, Any]
    if kind == "siglip":
        extra = {"image_size": c.req_int("image_size"), "pooling_head": c.flag("vision_use_head")}
    elif kind == "llama4":
        extra = {"image_size": c.req_int("image_size"), "adapter_hidden_dim": c.req_int("projector_input_dim"),
                 "adapter_output_dim": c.req_int("projector_output_dim"),
                 "vision_output_dim": c.req_int("vision_output_dim")}
    elif kind == "gemma4":
        heads, head_dim = c.req_int("num_attention_heads"), c.req_int("head_dim")
        if c.int_or_default("num_key_value_heads", minimum=1) != heads or heads * head_dim != c.req_int("hidden_size"):
            raise c.error("a Gemma 4 vision tower with grouped or resized attention heads is not supported")
        extra = {"num_position_embeddings": c.req_int("position_embedding_size"), "head_dim": head_dim}
    elif kind in ("moonvit", "moonvit2"):
        extra = _moonvit(c, merged.get("hidden_size"), v2=kind == "moonvit2")
    elif kind == "minimax_m3":  # MiniMaxM3VLMultiModalProjector: linear_1 / merge_linear_1 to projector_hidden_size
        extra = {"merge_size": c.req_int("spatial_merge_size"), "temporal_patch_size": c.req_int("temporal_patch_size"),
                 "adapter_hidden_dim": _Config(config, origin, model_type, {"projector_hidden_size": 6144})
                 .int_or_default("projector_hidden_size", minimum=1), "image_size": None}
    elif kind == "pixtral":
        extra = {"merge_size": top.int_or_default("spatial_merge_size", minimum=1),
                 "projector_bias": top.flag("multimodal_projector_bias")}
    else:
        extra = {"merge_size": c.req_int("spatial_merge_size"), "temporal_patch_size": c.req_int("temporal_patch_size")}
        if kind == "qwen3_5":
            extra["num_position_embeddings"] = c.req_int("num_position_embeddings")
            extra["deepstack_mergers"] = len(c.int_list("deepstack_visual_indexes"))  # Qwen3-VL's (none in 3.5's)
        out = c.opt_int("out_hidden_size", minimum=1)
        width = merged.get("hidden_size")
        if out is not None and out != width:
            raise SpecError(f"{origin}: vision_config: out_hidden_size ({out}) is not the decoder's hidden_size "
                            f"({width!r:.20})")
    try:
        encoder = EncoderSpec(kind=kind, hidden_size=c.req_int("hidden_size"),
                              intermediate_size=c.req_int("intermediate_size"),
                              num_layers=c.req_int("num_hidden_layers"), patch_size=c.req_int("patch_size"),
                              num_channels=c.req_int("num_channels"), **extra)
    except SpecError as exc:
        message = str(exc)
        prefix = f"{origin}: vision_config"
        raise SpecError(message if message.startswith(prefix) else f"{prefix}: {message}") from None
    return merged, encoder


def _moonvit(c: _Config, width: Any, v2: bool = False) -> dict[str, Any]:
    """MoonViT's fields beyond a ViT's (vLLM kimi_k25_vit.py; transformers Kimi_K25VisionModel): its learned
    position table of init_pos_emb_height x width entries, a square merge_kernel_size, and a projector into the
    decoder's width (mm_hidden_size, which KimiK25Config sets to the decoder's when it equals the tower's).
    MoonViT-V2 (``v2``, Kimi K3): q, k and v of qkv_hidden_size (attention_width), heads dividing it; its
    patchmergerv2 projector reads no mm_hidden_size (merge^2 x hidden_size in, the decoder's width out)."""
    for key, value in (_MOONVIT2_FIXED if v2 else _MOONVIT_FIXED).items():
        if c.data.get(key, value) != value:
            raise c.error(f"field '{key}' {c.data[key]!r:.40} is not supported (a MoonViT with {key} {value!r})")
    kernel = c.get("merge_kernel_size")
    if not isinstance(kernel, list) or len(kernel) != 2 or kernel[0] != kernel[1]:
        raise c.error(f"field 'merge_kernel_size' {kernel!r:.40} is not supported (a square kernel, [2, 2])")
    hidden = c.req_int("hidden_size")
    qkv = c.opt_int("qkv_hidden_size", minimum=1)
    out = c.opt_int("mm_hidden_size", minimum=1)
    merge = {"merge_size": c.check_int("merge_kernel_size", kernel[0], 1),
             "num_position_embeddings": c.req_int("init_pos_emb_height") * c.req_int("init_pos_emb_width")}
    if v2:
        width = qkv or hidden
        if width % c.req_int("num_attention_heads"):
            raise c.error(f"qkv_hidden_size ({width}) is not a multiple of num_attention_heads")
        return {**merge, "attention_width": width}
    if qkv not in (None, hidden):
        raise c.error(f"field 'qkv_hidden_size' ({qkv}) is not supported (a MoonViT whose qkv width is its "
                      f"hidden_size, {hidden})")
    if out not in (None, hidden, width):
        raise c.error(f"field 'mm_hidden_size' ({out}) is not the decoder's hidden_size ({width!r:.20})")
    return merge


def spec_from_hf_config(config: Mapping[str, Any], origin: str, name: str) -> ModelSpec:
    """Build the ModelSpec that the transformers implementation of ``config['model_type']`` would instantiate.

    Every error is one line that starts with ``origin`` and names the field.
    """
    try:
        return _spec_from_hf_config(config, origin, name)
    except SpecError as exc:
        message = str(exc)
        raise SpecError(message if message.startswith(origin) else f"{origin}: {message}") from None


def _spec_from_hf_config(config: Mapping[str, Any], origin: str, name: str) -> ModelSpec:
    wrapper = MULTIMODAL.get(config["model_type"]) if isinstance(config.get("model_type"), str) else None
    own_code = wrapper is not None and wrapper.remote_code and isinstance(config.get("auto_map"), dict)
    config, encoder = _text_and_encoder(config, origin)
    model_type = _family_type(config)
    if model_type is None:
        given = config.get("model_type")
        what = "no model_type" if given is None else f"unsupported model_type {given!r}"
        raise SpecError(f"{origin}: {what}; supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}")
    family = FAMILIES[model_type]
    if model_type == "step3p7" and isinstance(config.get("text_config"), dict):  # Step3p7Config's multimodal form
        raise SpecError(f"{origin}: field 'text_config': Step-3.7's multimodal config (its vision tower) is not "
                        "supported; read its text_config alone (model_type step3p7)")
    pattern = config.get("hybrid_override_pattern", config.get("layers_block_type"))
    if model_type == "nemotron_h" and "num_hidden_layers" not in config and isinstance(pattern, (str, list)):
        config = {**config, "num_hidden_layers": len(pattern)}  # transformers 5 derives it from the pattern
    config = {**config, **{new: config[old] for old, new in family.key_aliases.items()
                           if old in config and new not in config}}
    c = _Config(config, origin, model_type, family.defaults)
    for key in (*(_CORE_FIELDS if family.dense_mlp and not family.per_layer_ffn else _CORE_FIELDS[:-1]),
                *family.required):
        c.require(key)

    heads = c.req_int("num_attention_heads")
    hidden = c.req_int("hidden_size")
    kv_heads = c.opt_int("num_key_value_heads", minimum=1) or heads
    mla = _mla(c) if family.mla else None
    if mla is not None:
        head_dim = mla.qk_head_dim  # q/k head dim; what MLA caches is described by ``mla``
    else:
        head_dim = c.opt_int("head_dim", minimum=1) or family.defaults.get("head_dim")
        if head_dim is None:   # transformers' fallback, which refuses a hidden size the heads do not divide
            if hidden % heads:
                raise c.error(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} and no "
                              "head_dim is given")
            head_dim = hidden // heads
    window, sliding_layers = family.sliding(c)
    rope_theta, rope_scaling = _rope(c, family)
    numerics = dict(family.numerics(c)) if family.numerics is not None else {}
    kv_heads = numerics.pop("num_kv_heads", kv_heads)  # a family whose sliding layers hold their own (MiMo-V2-Flash)

    spec = ModelSpec(
        name=name,
        vocab_size=c.req_int("vocab_size"),
        hidden_size=hidden,
        num_layers=c.num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        # no dense MLP (Qwen3.5-MoE): the field holds the expert width, used by no layer
        intermediate_size=numerics.pop("intermediate_size") if family.per_layer_ffn else c.req_int(
            "moe_intermediate_size") if not family.dense_mlp else c.int_or_default(family.dense_width_key, minimum=1),
        ffn_kind=numerics.pop("ffn_kind", "gated"),
        activation=_activation(c, family),
        tie_word_embeddings=c.flag("tie_word_embeddings"),
        attention_sinks=numerics.pop("attention_sinks", family.attention_sinks),
        mlp_bias=family.mlp_bias and c.flag("mlp_bias"),
        norm_kind=numerics.pop("norm_kind", "rmsnorm"),
        norms_per_layer=numerics.pop("norms_per_layer", family.norms_per_layer),
        qk_norm=family.qk_norm or (family.qk_norm_key is not None and c.flag(family.qk_norm_key)),
        qk_norm_across_heads=family.qk_norm_across_heads,
        sliding_window=window,
        sliding_window_layers=sliding_layers,
        linear_attention=numerics.pop("linear_attention", None) or (
            family.linear_attention(c) if family.linear_attention is not None else None),
        attention_output_gate=numerics.pop("attention_output_gate", family.attention_output_gate),
        mla=mla,
        moe=family.moe(c) if family.moe is not None else None,
        encoder=encoder,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        partial_rotary_factor=numerics.pop("partial_rotary_factor", None) or (
            _partial_rotary_factor(c, family, head_dim) if mla is None else 1.0),
        rope_local_theta=numerics.pop("rope_local_theta", None) or _local_rope_theta(c, family),
        max_context=c.int_or_default("max_position_embeddings", minimum=1),
        native_dtype=_native_dtype(c),
        active_params_convention=family.convention,  # type: ignore[arg-type]
        num_mtp_layers=(c.opt_int(family.mtp_key) or 0) if family.mtp_key is not None else 0,
        hf_repo=_name_or_path(c),
        architecture=_architecture(c),
        remote_code=own_code or family.remote_code or config.get("model_type") != model_type,
        **family.attention(c),
        **({"norm_weight_offset": family.norm_weight_offset} if family.norm_weight_offset else {}),
        **_gemma_numerics(c),
        **numerics,
    )
    quant = c.data.get("quantization_config")
    native, kept = checkpoint_precision(quant, spec, model_type, spec.native_dtype, c.origin)
    if model_type == "deepseek_v4":
        native = _deepseek_v4_experts(c, quant, native)
    kv, scale = checkpoint_kv_dtype(quant, c.origin), checkpoint_activation_scale(quant, c.origin)
    stored = parse_weight_precision(native)
    weight_only = tuple(part for part in checkpoint_weight_only(quant, spec, model_type, c.origin)
                        if stored.for_component(part).name.startswith(("fp8", "nvfp4", "mxfp4", "mxfp8")))
    if native == spec.native_dtype and kv is None and scale is None:
        return spec
    return replace(spec, native_dtype=native, checkpoint_kv_dtype=kv, checkpoint_activation_scale=scale,
                   checkpoint_weight_only=weight_only, quantized_weight_exceptions=kept)


def _deepseek_v4_experts(c: _Config, quant: Any, native: str) -> str:
    """DeepSeek-V4's fp8 checkpoints whose ``expert_dtype`` is fp4 (top level, or in quantization_config as
    transformers moves it) store the routed experts as MXFP4, FP4 with an E8M0 scale per 32 (vLLM
    DeepseekV4FP8Config: Mxfp4MoEMethod); NVIDIA's, whose ``moe_quant_algo`` is NVFP4, as NVFP4. ``fp8`` or no
    ``expert_dtype``: the experts in the checkpoint's format."""
    expert_dtype = c.data.get("expert_dtype")
    if expert_dtype is None and isinstance(quant, Mapping):
        expert_dtype = quant.get("expert_dtype")
    if expert_dtype is None or expert_dtype == "fp8":
        return native
    if expert_dtype != "fp4":
        raise c.error(f"field 'expert_dtype' {expert_dtype!r:.40} is not supported (fp4, fp8)")
    nvfp4 = isinstance(quant, Mapping) and quant.get("moe_quant_algo") == "NVFP4"
    precision = parse_weight_precision(native)
    others = [(k, d) for k, d in precision.per_component if k != "experts"]
    parts = [f"experts={'nvfp4' if nvfp4 else 'mxfp4'}", *(f"{k}={d.name}" for k, d in others)]
    return parse_weight_precision(",".join([*parts, f"default={precision.default.name}"])).label


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a config.json file (or a folder holding one); errors are one line naming the file.

    The name defaults to the file's stem, or to the folder's name for a file called ``config.json``. A config
    without ``quantization_config`` takes the ``hf_quant_config.json`` beside it, as vLLM and TensorRT-LLM do
    (ModelOpt 0.29 and earlier write the quantization there; vllm/transformers_utils/config.py).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    data = read_data_file(path, as_json=True)
    origin = str(path)
    sidecar = path.parent / "hf_quant_config.json"
    if isinstance(data, dict) and data.get("quantization_config") is None and sidecar.is_file():
        data = {**data, "quantization_config": read_data_file(sidecar, as_json=True)}
        origin = f"{path} (quantization from {sidecar.name})"
    if name is None:
        name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
    spec = spec_from_hf_config(data, origin=origin, name=name)
    if _holds_weights(path.parent):  # a checkpoint folder: the engine loads it, whatever _name_or_path says
        spec = replace(spec, hf_repo=str(path.parent))
    return spec


def _holds_weights(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint's weights (safetensors or PyTorch .bin files) beside its config."""
    try:
        return any(entry.suffix == ".safetensors" or (entry.suffix == ".bin" and entry.name.startswith("pytorch_model"))
                   for entry in folder.iterdir())
    except OSError:
        return False
