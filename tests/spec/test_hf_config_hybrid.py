"""Granite 4.0 (granitemoehybrid), Command R7B / A (cohere2) and Command R / R+ (cohere) config.json files: counts
against the model cards, the per-layer Mamba-2 / attention, sliding / global and RoPE / NoPE patterns, the KV cache
and Mamba-2 state against hand counts, and one-line errors (transformers' parity: tests/calc/test_params_hf_parity.py;
the bundled decoder against transformers: tests/model/test_cohere_granite.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hf_fixtures import DROP as _DROP
from hf_fixtures import FIXTURE_DIR, build, fixture

from tfcalc.calc.kv_cache import kv_bytes_per_token, kv_cache_bytes, state_exact_bytes_per_sequence
from tfcalc.calc.params import count_params, norm_params_per_layer, norms_shape
from tfcalc.dtypes import get_dtype
from tfcalc.errors import SpecError
from tfcalc.spec.hf_config import ARCHITECTURE_FAMILIES, FAMILIES, load_hf_config

GRANITE = ("granite-4.0-h-small", "granite-4.0-h-tiny", "granite-4.0-h-micro", "granite-4.0-micro")
COHERE2 = ("command-r7b", "command-a")
COHERE = ("command-r-v01", "command-r-plus")
BF16, FP16 = get_dtype("bf16"), get_dtype("fp16")






def test_families_are_registered_by_type_and_architecture() -> None:
    assert {"granitemoehybrid", "cohere2", "cohere"} <= set(FAMILIES)
    assert ARCHITECTURE_FAMILIES["GraniteMoeHybridForCausalLM"] == "granitemoehybrid"
    assert ARCHITECTURE_FAMILIES["Cohere2ForCausalLM"] == "cohere2"
    assert ARCHITECTURE_FAMILIES["CohereForCausalLM"] == "cohere"
    for name in (*GRANITE, *COHERE2, *COHERE):
        spec = load_hf_config(FIXTURE_DIR / f"{name}.json")
        assert spec.name == name and not spec.remote_code and spec.architecture == fixture(name)["architectures"][0]


# --- counts against the model cards ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, published", [
    # immers.cloud's page of ibm-granite/granite-4.0-h-small: 32.2B parameters (its card: "32B")
    ("granite-4.0-h-small", 32.2e9),
    # CohereLabs/c4ai-command-a-03-2025: 111 billion; CohereForAI/c4ai-command-r-plus: 104 billion;
    # CohereForAI/c4ai-command-r-v01: 35 billion parameters (their model cards)
    ("command-a", 111e9), ("command-r-plus", 104e9), ("command-r-v01", 35e9)])
def test_totals_within_one_percent_of_the_published_figure(name: str, published: float) -> None:
    assert count_params(build(name)).total_params == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("name, total_billions, active_billions", [
    # the Granite 4.0 cards' architecture table: H-Small 32B / 9B active, H-Tiny 7B / 1B active, H-Micro 3B,
    # Micro 3B; whole billions, which tfcalc's counts (32.21 / 8.80, 6.94 / 1.47, 3.19, 3.40) round to
    ("granite-4.0-h-small", 32, 9), ("granite-4.0-h-tiny", 7, 1), ("granite-4.0-h-micro", 3, 3),
    ("granite-4.0-micro", 3, 3)])
def test_granite_counts_round_to_the_card(name: str, total_billions: int, active_billions: int) -> None:
    counts = count_params(build(name))
    assert (round(counts.total_params / 1e9), round(counts.active_params / 1e9)) == (total_billions, active_billions)


def test_exact_granite_and_command_counts() -> None:
    """The counts the parity test checks against transformers, pinned; H-Small's active part by hand: 10 of 72
    experts (3 x 4096 x 768 each) + the shared expert (3 x 4096 x 1536) + the router (72 x 4096) on 40 layers, the
    36 Mamba-2 and 4 attention mixers, norms and the tied embedding."""
    small = count_params(build("granite-4.0-h-small"))
    assert (small.total_params, small.active_params) == (32_207_337_984, 8_803_121_664)
    ffn = 40 * (10 * 3 * 4096 * 768 + 3 * 4096 * 1536 + 72 * 4096)
    mixers = small.active["attention"].total
    assert small.active_params == ffn + mixers + small.active["norms"].total + 100352 * 4096
    assert count_params(build("granite-4.0-h-tiny")).total_params == 6_939_037_248
    # Command R7B: "7 billion parameters" on its card are the 6.98 B outside the 256000 x 4096 embedding
    r7b = count_params(build("command-r7b"))
    assert r7b.total_params == 8_028_033_024
    assert r7b.total_params - 256000 * 4096 == pytest.approx(7e9, rel=0.01)


def test_granite_moe_and_dense_ffns() -> None:
    """H-Small / H-Tiny: an MoE on every layer (softmax over the top-k logits) beside an ungated shared expert of
    shared_intermediate_size; H-Micro / Micro (no experts): the shared MLP is each layer's dense FFN."""
    small = build("granite-4.0-h-small")
    assert small.moe is not None and small.num_moe_layers == 40 and small.moe.dense_layers == ()
    assert (small.moe.num_experts, small.moe.experts_per_token, small.moe.expert_intermediate_size) == (72, 10, 768)
    assert (small.moe.num_shared_experts, small.moe.shared_expert_intermediate_size) == (1, 1536)
    assert small.moe.normalize_top_k and not small.moe.shared_expert_gate and small.moe.router_scoring == "softmax"
    for name in ("granite-4.0-h-micro", "granite-4.0-micro"):
        dense = build(name)
        assert dense.moe is None and dense.intermediate_size == 8192 and dense.num_dense_mlp_layers == 40
    # the dense FFN is shared_intermediate_size wide, whatever intermediate_size says (transformers' shared_mlp)
    assert build("granite-4.0-h-micro", intermediate_size=512).intermediate_size == 8192


# --- per-layer patterns ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", GRANITE[:3])
def test_granite_hybrid_layers_follow_layer_types(name: str) -> None:
    """36 Mamba-2 layers and 4 NoPE attention layers (5, 15, 25, 35), every one of them with its FFN and 2 norms."""
    spec = build(name)
    attention = tuple(i for i, kind in enumerate(fixture(name)["layer_types"]) if kind == "attention")
    assert attention == (5, 15, 25, 35)
    la = spec.linear_attention
    assert la is not None and la.kind == "mamba2"
    assert la.layers == tuple(i for i in range(40) if i not in attention)
    assert spec.nope_layers == attention and spec.num_attention_layers == 4
    assert spec.ffn_free_layers == () and spec.mixer_free_layers == () and spec.norms_per_layer == 2
    assert spec.sliding_window is None and not spec.parallel_block


def test_granite_attention_numerics() -> None:
    """Scores scaled by attention_multiplier (1/128 for heads of 128), not head_dim^-1/2; RoPE only where
    position_embedding_type is "rope" (Granite 4.0 Micro: every layer, rope_theta 1e7)."""
    small = build("granite-4.0-h-small")
    assert small.query_pre_attn_scalar == 128.0 ** 2 and small.head_dim == 128
    micro = build("granite-4.0-micro")
    assert micro.linear_attention is None and micro.nope_layers == () and micro.rope_theta == 1e7
    assert micro.query_pre_attn_scalar == 64.0 ** 2 and micro.head_dim == 64
    assert build("granite-4.0-h-small", position_embedding_type="rope").nope_layers == ()
    assert build("granite-4.0-h-small", position_embedding_type=_DROP).nope_layers == (5, 15, 25, 35)


def test_granite_mamba_shapes() -> None:
    """H-Small's Mamba-2: 128 heads of 64 (= 2 x 4096), one B/C group of state 128, 4 conv taps with a bias, chunks
    of 256; mamba_d_head "auto" is mamba_expand x hidden / heads; transformers' default layer_types: all Mamba-2."""
    la = build("granite-4.0-h-small").linear_attention
    assert la is not None
    assert (la.num_value_heads, la.value_head_dim, la.num_key_heads, la.key_head_dim) == (128, 64, 1, 128)
    assert (la.conv_kernel, la.conv_bias, la.proj_bias, la.chunk_size) == (4, True, False, 256)
    assert la.recurrent_state_dtype is None  # the model's dtype: vLLM's --mamba-ssm-cache-dtype auto
    auto = build("granite-4.0-h-tiny", mamba_d_head="auto").linear_attention
    assert auto is not None and auto.value_head_dim == 2 * 1536 // 48
    everywhere = build("granite-4.0-h-tiny", layer_types=_DROP)
    assert everywhere.num_linear_layers == 40 and everywhere.num_attention_layers == 0
    types = fixture("granite-4.0-h-tiny")["layer_types"]
    alias = build("granite-4.0-h-tiny", layer_types=_DROP, layers_block_type=types)
    assert alias.linear_attention == build("granite-4.0-h-tiny").linear_attention


@pytest.mark.parametrize("name", COHERE2)
def test_cohere2_three_sliding_layers_to_one_global_nope_layer(name: str) -> None:
    spec = build(name)
    layers = spec.num_layers
    assert spec.sliding_window == 4096
    assert spec.sliding_window_layers == tuple(i for i in range(layers) if i % 4 != 3)
    assert spec.nope_layers == tuple(range(3, layers, 4))
    assert spec.norm_kind == "layernorm" and not spec.norm_bias and spec.norms_per_layer == 1
    assert spec.parallel_block and spec.rope_interleaved and spec.tie_word_embeddings and not spec.qk_norm
    # layer_types, where given, outrank sliding_window_pattern; without a window every layer is global and NoPE
    types = ["full_attention" if i % 2 else "sliding_attention" for i in range(layers)]
    alternating = build(name, layer_types=types)
    assert alternating.sliding_window_layers == tuple(range(0, layers, 2))
    assert alternating.nope_layers == tuple(range(1, layers, 2))
    assert build(name, sliding_window_pattern=2).nope_layers == tuple(range(1, layers, 2))
    unwindowed = build(name, sliding_window=None)
    assert unwindowed.sliding_window_layers == () and unwindowed.nope_layers == tuple(range(layers))


def test_command_r_parallel_blocks_and_per_head_qk_norms() -> None:
    """Command R: RoPE on every layer, one bias-free LayerNorm per layer, no QK norm; Command R+ (use_qk_norm):
    a LayerNorm weight per head of q (96 x 128) and k (8 x 128), split over tp with the heads."""
    r = build("command-r-v01")
    assert r.sliding_window is None and r.nope_layers == () and not r.qk_norm and r.attention_kind == "MHA"
    assert r.parallel_block and r.norms_per_layer == 1 and r.norm_kind == "layernorm" and not r.norm_bias
    plus = build("command-r-plus")
    assert plus.qk_norm and plus.qk_norm_weights_per_head and not plus.qk_norm_across_heads
    assert norm_params_per_layer(plus).vector == 12288 + 96 * 128 + 8 * 128
    shape = norms_shape(plus)
    assert (shape.split.vector, shape.per_kv_head.vector, shape.replicated.vector) == (96 * 128, 128, 12288)
    assert norm_params_per_layer(r).vector == 8192  # the weight alone: CohereLayerNorm has no bias


# --- KV cache and Mamba-2 state ------------------------------------------------------------------------------------

def test_granite_kv_cache_and_mamba_state_by_hand() -> None:
    """H-Small in bf16: 4 attention layers x K and V x 8 heads x 128 x 2 B = 16,384 B per token; per sequence 36
    Mamba-2 layers x (conv: (2 x 1 x 128 + 128 x 64) channels x 3 taps + SSM: 128 heads x 64 x 128) x 2 B."""
    spec = build("granite-4.0-h-small")
    assert kv_bytes_per_token(spec, BF16) == 4 * 2 * 8 * 128 * 2 == 16_384
    state = 36 * ((2 * 128 + 128 * 64) * 3 + 128 * 64 * 128) * 2
    assert state_exact_bytes_per_sequence(spec) == state == 77_322_240
    assert kv_cache_bytes(spec, BF16, 32_768, batch=2) == 2 * (32_768 * 16_384 + state)
    micro = build("granite-4.0-micro")
    assert kv_bytes_per_token(micro, BF16) == 40 * 2 * 8 * 64 * 2 and state_exact_bytes_per_sequence(micro) == 0


def test_cohere_kv_cache_by_hand() -> None:
    """Command R7B in bf16 at 32k tokens: 8 global layers hold every token, 24 sliding layers their 4096, each token
    2 x 8 heads x 128 x 2 B = 4096 B a layer; Command R (MHA, fp16): 40 x 2 x 64 x 128 x 2 B a token."""
    r7b = build("command-r7b")
    per_layer = 2 * 8 * 128 * 2
    assert kv_bytes_per_token(r7b, BF16) == 32 * per_layer
    assert kv_cache_bytes(r7b, BF16, 32_768) == (8 * 32_768 + 24 * 4096) * per_layer == 1_476_395_008
    assert kv_bytes_per_token(build("command-r-v01"), FP16) == 40 * 2 * 64 * 128 * 2 == 1_310_720


# --- errors ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, changes, message", [
    ("granite-4.0-h-small", {"num_hidden_layers": _DROP}, "missing required field 'num_hidden_layers'"),
    ("granite-4.0-h-small", {"intermediate_size": _DROP}, "missing required field 'intermediate_size'"),
    ("granite-4.0-h-small", {"layer_types": ["mamba"] * 39}, "field 'layer_types' must give mamba or attention for "
                                                               "each of the 40 layers"),
    ("granite-4.0-h-small", {"layer_types": ["mamba"] * 39 + ["moe"]}, "field 'layer_types' must give mamba"),
    ("granite-4.0-h-small", {"mamba_d_head": 48}, r"mamba_n_heads \(128\) x mamba_d_head \(48\) must be mamba_expand "
                                                  r"x hidden_size \(8192\)"),
    ("granite-4.0-h-small", {"mamba_n_groups": 3}, "num_value_heads .128. is not a multiple"),
    ("granite-4.0-h-small", {"num_experts_per_tok": 100}, "experts_per_token"),
    ("granite-4.0-h-small", {"attention_multiplier": "x"}, "field 'attention_multiplier' must be a number"),
    ("command-r7b", {"head_dim": 64}, r"field 'head_dim' \(64\) is not supported: Cohere2Config sets it to "
                                      r"hidden_size // num_attention_heads \(128\)"),
    ("command-r7b", {"layer_types": ["sliding_attention"] * 31}, "field 'layer_types' must be a list of 32 entries"),
    ("command-r7b", {"sliding_window_pattern": 0}, "field 'sliding_window_pattern' must be positive"),
    ("command-r-plus", {"use_qk_norm": "yes"}, "field 'use_qk_norm' must be true or false"),
    ("command-r-v01", {"vocab_size": _DROP}, "missing required field 'vocab_size'"),
])
def test_a_bad_config_is_one_line_naming_the_file(name: str, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        build(name, **changes)
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{name}.json")


def test_model_spec_refuses_meaningless_combinations() -> None:
    base = build("command-r-v01")
    with pytest.raises(SpecError, match="parallel_block needs one norm per layer"):
        base.with_overrides(norms_per_layer=2)
    with pytest.raises(SpecError, match="norm_bias false is for LayerNorms"):
        base.with_overrides(norm_kind="rmsnorm")
    with pytest.raises(SpecError, match="qk_norm_weights_per_head needs qk_norm"):
        base.with_overrides(qk_norm_weights_per_head=True)
