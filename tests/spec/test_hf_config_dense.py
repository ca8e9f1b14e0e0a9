"""Dense families read from config.json: Seed-OSS, GLM-4-0414, OLMo 2 / 3, SmolLM3, EXAONE 4.0 and Granite 3.x.

Their parameter counts equal transformers' (tests/calc/test_params_hf_parity.py runs every fixture); here: the totals
against what the model cards publish, the per-layer sliding / NoPE patterns against ``layer_types`` and the
transformers config classes, KV bytes per token against a hand count and one-line errors. The bundled decoder runs
each family against transformers in tests/model/test_dense_families.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hf_fixtures import DROP as _DROP
from hf_fixtures import build, fixture

from tfcalc.calc.kv_cache import kv_bytes_per_token, kv_cache_bytes
from tfcalc.calc.params import count_params
from tfcalc.dtypes import get_dtype
from tfcalc.errors import SpecError
from tfcalc.spec.hf_config import ARCHITECTURE_FAMILIES, FAMILIES, load_hf_config, spec_from_hf_config
from tfcalc.spec.model import ModelSpec

DENSE = ("seed-oss-36b", "glm-4-9b-0414", "olmo2-7b", "olmo3-7b", "smollm3-3b", "exaone4-32b", "exaone4-1.2b",
         "granite-3.3-8b")
BF16 = get_dtype("bf16")








def non_embedding(spec: ModelSpec) -> int:
    """Total parameters less the input embedding and an untied output head (the EXAONE cards' "without
    embeddings")."""
    counts = count_params(spec)
    head = 0 if spec.tie_word_embeddings else counts.total["lm_head"].total
    return counts.total_params - counts.total["embedding"].total - head


# --- totals against the model cards ----------------------------------------------------------------------------

def test_seed_oss_total_is_the_checkpoints_own_count() -> None:
    """Seed-OSS-36B: 36,151,104,512 parameters, the count a public snapshot of the Instruct and Base checkpoints'
    config / safetensors index records; the card's "36B" (ByteDance-Seed/Seed-OSS-36B-Instruct, Model Summary)."""
    total = count_params(build("seed-oss-36b")).total_params
    assert total == 36_151_104_512
    assert round(total / 1e9) == 36


@pytest.mark.parametrize(("name", "card"), [("exaone4-32b", 30.95e9), ("exaone4-1.2b", 1.07e9)])
def test_exaone4_non_embedding_count_is_the_cards(name: str, card: float) -> None:
    """The EXAONE 4.0 cards (LGAI-EXAONE/EXAONE-4.0-32B and -1.2B, Model Configuration) publish "Number of Parameters
    (without embeddings)": 30.95B and 1.07B; tfcalc's, without the embedding and untied head, within 0.5 %."""
    assert non_embedding(build(name)) == pytest.approx(card, rel=0.005)


@pytest.mark.parametrize(("name", "nominal", "total"), [
    ("glm-4-9b-0414", 9, 9_400_279_040), ("olmo2-7b", 7, 7_298_617_344), ("olmo3-7b", 7, 7_298_011_136),
    ("smollm3-3b", 3, 3_075_098_624), ("granite-3.3-8b", 8, 8_170_864_640)])
def test_totals_round_to_the_cards_sizes(name: str, nominal: int, total: int) -> None:
    """The cards of GLM-4-9B-0414, OLMo 2 7B, OLMo 3 7B, SmolLM3-3B and Granite 3.3 8B publish only the rounded size
    in the name (9B, 7B, 7B, 3B, 8B): tfcalc's total rounds to it (9.40 / 7.30 / 7.30 / 3.08 / 8.17 B, pinned)."""
    got = count_params(build(name)).total_params
    assert got == total
    assert round(got / 1e9) == nominal


# --- what each family reads ------------------------------------------------------------------------------------

def test_seed_oss_biases_q_k_v_and_o_apart() -> None:
    """SeedOssAttention: attention_bias on q, k and v, attention_out_bias on o_proj (false in the release)."""
    spec = build("seed-oss-36b")
    assert (spec.qkv_bias, spec.o_bias, spec.mlp_bias, spec.head_dim) == (True, False, False, 128)
    assert build("seed-oss-36b", attention_out_bias=True).o_bias
    assert not build("seed-oss-36b", attention_bias=False).qkv_bias


def test_glm4_reads_sandwich_norms_and_interleaved_partial_rope() -> None:
    spec = build("glm-4-9b-0414")
    assert (spec.norms_per_layer, spec.qkv_bias, spec.o_bias, spec.rope_interleaved) == (4, True, False, True)
    assert (spec.partial_rotary_factor, spec.rotary_dim, spec.num_kv_heads) == (0.5, 64, 2)


@pytest.mark.parametrize("name", ["olmo2-7b", "olmo3-7b"])
def test_olmo_is_post_norm_with_qk_norm_across_heads(name: str) -> None:
    spec = build(name)
    assert (spec.norm_placement, spec.norms_per_layer, spec.qk_norm, spec.qk_norm_across_heads) == ("post", 2, True,
                                                                                                  True)
    assert not spec.qkv_bias and not spec.o_bias
    assert build(name, attention_bias=True).o_bias  # Olmo2Attention: attention_bias on q, k, v and o


def test_post_norm_needs_two_norms_per_layer() -> None:
    with pytest.raises(SpecError, match=r"^olmo2-7b: norm_placement post needs norms_per_layer 2 \(one norm per "
                                        r"output\), not 4$"):
        build("olmo2-7b").with_overrides(norms_per_layer=4)


def test_olmo3_windows_follow_layer_types_and_yarn_scales_full_layers_only() -> None:
    data = fixture("olmo3-7b")
    spec = build("olmo3-7b")
    assert spec.sliding_window == 4096
    assert spec.sliding_window_layers == tuple(i for i, t in enumerate(data["layer_types"]) if t == "sliding_attention")
    assert spec.num_sliding_layers == 24 and spec.num_full_layers == 8
    assert spec.rope_scaling is not None and (spec.rope_scaling.rope_type, spec.rope_scaling.factor) == ("yarn", 8.0)
    assert spec.rope_local_theta == spec.rope_theta == 500000.0  # Olmo3Config: sliding layers unscaled
    assert build("olmo3-7b", rope_scaling=None).rope_local_theta is None


def test_olmo3_default_pattern_is_transformers() -> None:
    from transformers import Olmo3Config

    spec = build("olmo3-7b", layer_types=_DROP)
    expected = Olmo3Config(num_hidden_layers=32).layer_types
    assert spec.sliding_window_layers == tuple(i for i, t in enumerate(expected) if t == "sliding_attention")


def test_smollm3_nope_layers_follow_no_rope_layers() -> None:
    data = fixture("smollm3-3b")
    spec = build("smollm3-3b")
    assert spec.nope_layers == tuple(i for i, rope in enumerate(data["no_rope_layers"]) if not rope)
    assert spec.nope_layers == tuple(range(3, 36, 4))
    assert spec.sliding_window is None and spec.tie_word_embeddings
    assert build("smollm3-3b", no_rope_layers=_DROP, no_rope_layer_interval=3).nope_layers == tuple(range(2, 36, 3))


def test_smollm3_sliding_layers_are_transformers() -> None:
    """With use_sliding_window and a window, SmolLM3Config's default layer_types slide the NoPE layers."""
    from transformers import SmolLM3Config

    data = fixture("smollm3-3b", use_sliding_window=True, sliding_window=4096)
    spec = spec_from_hf_config(data, origin="smollm3", name="smollm3")
    fields = {k: v for k, v in data.items() if k not in ("_comment", "model_type")}
    expected = SmolLM3Config(**fields).layer_types
    assert spec.sliding_window == 4096
    assert spec.sliding_window_layers == tuple(i for i, t in enumerate(expected) if t == "sliding_attention")
    assert spec.sliding_window_layers == spec.nope_layers


def test_exaone4_hybrid_layers_and_global_nope_are_transformers() -> None:
    """EXAONE 4.0 32B: sliding_window_pattern 4 gives 3 sliding layers to 1 global, and the global layers apply no
    RoPE (Exaone4Attention: "We use global NoPE for hybrid attention model")."""
    from transformers import Exaone4Config

    data = fixture("exaone4-32b")
    spec = build("exaone4-32b")
    fields = {k: v for k, v in data.items() if k not in ("_comment", "model_type")}
    expected = Exaone4Config(**fields).layer_types
    sliding = tuple(i for i, t in enumerate(expected) if t == "sliding_attention")
    assert spec.sliding_window == 4096 and spec.sliding_window_layers == sliding
    assert spec.nope_layers == tuple(i for i, t in enumerate(expected) if t == "full_attention") == tuple(
        range(3, 64, 4))
    assert (spec.norm_placement, spec.qk_norm, spec.qk_norm_across_heads, spec.qkv_bias) == ("post", True, False,
                                                                                             False)


def test_exaone4_layer_types_rule_and_the_small_model_has_no_window() -> None:
    from transformers import Exaone4Config

    from tfcalc.spec.hf_config import _GLOBAL_PATTERN

    assert _GLOBAL_PATTERN == Exaone4Config().sliding_window_pattern
    types = ["sliding_attention", "full_attention"] * 32
    spec = build("exaone4-32b", layer_types=types, sliding_window_pattern="LG")
    assert spec.sliding_window_layers == tuple(range(0, 64, 2)) and spec.nope_layers == tuple(range(1, 64, 2))
    small = build("exaone4-1.2b")
    assert (small.sliding_window, small.sliding_window_layers, small.nope_layers) == (None, (), ())
    assert small.tie_word_embeddings and small.head_dim == 64


def test_granite_multipliers_are_numerics() -> None:
    spec = build("granite-3.3-8b")
    assert (spec.embedding_multiplier, spec.residual_multiplier, spec.logits_scaling) == (12.0, 0.22, 16.0)
    assert spec.query_pre_attn_scalar == 16384.0  # attention_multiplier 1/128 = query_pre_attn_scalar^-1/2
    plain = build("granite-3.3-8b", embedding_multiplier=1.0, residual_multiplier=1.0, logits_scaling=1.0,
                  attention_multiplier=_DROP)
    assert count_params(plain).total_params == count_params(spec).total_params


def test_dense_architectures_read_remote_code_configs() -> None:
    """A remote-code config naming one of these classes is read as its family (vLLM picks by architectures)."""
    for cls, family in {"SeedOssForCausalLM": "seed_oss", "Glm4ForCausalLM": "glm4", "Olmo2ForCausalLM": "olmo2",
                        "Olmo3ForCausalLM": "olmo3", "SmolLM3ForCausalLM": "smollm3",
                        "Exaone4ForCausalLM": "exaone4", "GraniteForCausalLM": "granite"}.items():
        assert ARCHITECTURE_FAMILIES[cls] == family and family in FAMILIES


# --- KV cache against a hand count -----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "per_token"), [
    ("seed-oss-36b", 64 * 2 * 8 * 128 * 2), ("glm-4-9b-0414", 40 * 2 * 2 * 128 * 2),
    ("olmo2-7b", 32 * 2 * 32 * 128 * 2), ("olmo3-7b", 32 * 2 * 32 * 128 * 2), ("smollm3-3b", 36 * 2 * 4 * 128 * 2),
    ("exaone4-32b", 64 * 2 * 8 * 128 * 2), ("exaone4-1.2b", 30 * 2 * 8 * 64 * 2),
    ("granite-3.3-8b", 40 * 2 * 8 * 128 * 2)])
def test_kv_bytes_per_token_by_hand(name: str, per_token: int) -> None:
    """layers x (K + V) x KV heads x head_dim x 2 bytes (bf16)."""
    assert kv_bytes_per_token(build(name), BF16) == per_token


@pytest.mark.parametrize(("name", "full", "sliding", "kv_heads"), [("olmo3-7b", 8, 24, 32), ("exaone4-32b", 16, 48, 8)])
def test_window_caps_the_sliding_layers_cache(name: str, full: int, sliding: int, kv_heads: int) -> None:
    """At 32k tokens the full layers hold every token, the sliding layers their 4096-token window."""
    per_layer_token = 2 * kv_heads * 128 * 2
    expected = full * 32768 * per_layer_token + sliding * 4096 * per_layer_token
    assert kv_cache_bytes(build(name), BF16, 32768) == expected


# --- one-line errors -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "field"), [
    ("seed-oss-36b", "hidden_size"), ("glm-4-9b-0414", "num_attention_heads"), ("olmo2-7b", "intermediate_size"),
    ("olmo3-7b", "num_hidden_layers"), ("smollm3-3b", "vocab_size"), ("exaone4-32b", "hidden_size"),
    ("granite-3.3-8b", "intermediate_size")])
def test_missing_required_field_is_one_line(tmp_path: Path, name: str, field: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fixture(name, **{field: _DROP})), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_hf_config(path)
    model_type = fixture(name)["model_type"]
    assert str(info.value) == f"{path}: missing required field '{field}' (model_type {model_type})"


@pytest.mark.parametrize(("name", "changes", "message"), [
    ("exaone4-32b", {"sliding_window_pattern": "LLLG"}, "field 'sliding_window_pattern' 'LLLG' without "
                                                        "'layer_types' is not supported"),
    ("exaone4-32b", {"layer_types": ["sliding_attention"] * 3}, "field 'layer_types' must be a list of 64 entries"),
    ("olmo3-7b", {"rope_scaling": {"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.0,
                                   "original_max_position_embeddings": 8192}},
     "field 'rope_scaling.attention_factor' 1.0 is not supported"),
    ("granite-3.3-8b", {"attention_multiplier": 1e-4}, "field 'attention_multiplier' must be at least"),
    ("granite-3.3-8b", {"residual_multiplier": "0.22"}, "field 'residual_multiplier' must be a number"),
    ("smollm3-3b", {"no_rope_layers": [1, 0]}, "field 'no_rope_layers' must be a list of at least 36 entries"),
])
def test_unsupported_values_are_one_line(name: str, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        build(name, **changes)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{name}.json: ") and message in text
