"""Step-3.7-Flash (step3p7), MiMo-7B (mimo) and sgl-project's DeepSeek-V4 FP8 copies (deepseek_ref) read from
config.json.

Their parameter counts equal transformers' (tests/calc/test_params_hf_parity.py runs every fixture: Step3p7TextModel,
Qwen2ForCausalLM for MiMo, DeepseekV4ForCausalLM for the sgl-project copies); here: the totals against what the cards
publish, the layer layouts against the configs, KV bytes against a hand count, the sgl-project copies against
deepseek-ai's, and one-line refusals. The bundled decoder runs Step-3.7 against transformers in
tests/model/test_step3p7.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hf_fixtures import build, fixture

from tfcalc.calc.kv_cache import held_bytes, kv_bytes_per_token, kv_cache_bytes
from tfcalc.calc.memory import weights_bytes
from tfcalc.calc.params import count_params
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import SpecError
from tfcalc.spec.hf_config import spec_from_hf_config

BF16 = get_dtype("bf16")
STEP_LAYERS, STEP_SLIDING_WINDOW = 45, 512  # stepfun-ai--Step-3.7-Flash_config.json: num_hidden_layers, sliding_window


# --- Step-3.7-Flash ------------------------------------------------------------------------------------------------

def test_step_total_and_active_within_two_percent_of_the_card() -> None:
    """stepfun-ai/Step-3.7-Flash's card as quoted by https://aiunpacker.com/blog/step-3-7-flash-pricing-features-use-cases
    and https://www.creeta.com/en/stepfun-step-3-7-flash-api-quickstart-2026/: 198B in all, 196B of them the language
    backbone (the rest the 1.8B vision encoder, not in this text-only config), about 11B active per token."""
    counts = count_params(build("step-3.7-flash"))
    assert counts.total_params == pytest.approx(196e9, rel=0.02)
    assert counts.active_params == pytest.approx(11e9, rel=0.02)


def test_step_layers_follow_layer_types_and_the_dense_prefix() -> None:
    """layer_types: full on every fourth layer from 0, the rest sliding (512); the first first_k_dense_replace (3)
    layers dense; per-head QK-norm, a gate per query head, (1 + w) norms; 288 sigmoid-routed experts with a
    correction bias, top 8 renormalised and scaled by moe_router_scaling_factor (3.0), one shared expert of
    share_expert_dim (1280); the 3 MTP layers apart."""
    s, cfg = build("step-3.7-flash"), fixture("step-3.7-flash")
    assert s.sliding_window == cfg["sliding_window"] == STEP_SLIDING_WINDOW
    assert s.sliding_window_layers == tuple(i for i, t in enumerate(cfg["layer_types"]) if t == "sliding_attention")
    assert s.sliding_window_layers == tuple(i for i in range(STEP_LAYERS) if i % 4)
    assert s.moe is not None and s.moe.dense_layers == (0, 1, 2)
    assert (s.moe.num_experts, s.moe.experts_per_token, s.moe.expert_intermediate_size) == (288, 8, 1280)
    assert (s.moe.num_shared_experts, s.moe.shared_expert_intermediate_size, s.moe.shared_expert_gate) == (1, 1280,
                                                                                                          False)
    assert (s.moe.router_scoring, s.moe.router_score_correction_bias, s.moe.normalize_top_k) == ("sigmoid", True, True)
    assert s.moe.routed_scaling_factor == cfg["moe_router_scaling_factor"]
    assert s.attention_head_gate and not s.attention_output_gate and s.qk_norm and not s.qk_norm_across_heads
    assert s.norm_weight_offset == 1.0 and s.num_mtp_layers == 3 and not s.tie_word_embeddings


def test_step_kv_cache_against_a_hand_count() -> None:
    """2 (K, V) x 8 KV heads x 128 x 2 bytes a layer and token; at 64K tokens the 34 sliding layers hold 512 tokens,
    the 11 full layers all of them."""
    s = build("step-3.7-flash")
    per_layer = 2 * 8 * 128 * 2
    assert kv_bytes_per_token(s, BF16) == STEP_LAYERS * per_layer
    full = len(range(0, STEP_LAYERS, 4))
    context = 65_536
    assert kv_cache_bytes(s, BF16, context) == per_layer * (full * context
                                                            + (STEP_LAYERS - full) * STEP_SLIDING_WINDOW)


def test_step_fp8_copy_counts_the_same_in_fp8_blocks() -> None:
    """The -FP8 config differs only by its quantization_config (fp8, 128 x 128 blocks): the same parameters, the
    matrices in fp8 blocks (about half the bf16 bytes)."""
    bf16, fp8 = build("step-3.7-flash"), build("step-3.7-flash-fp8")
    assert count_params(fp8).total == count_params(bf16).total
    assert parse_weight_precision(fp8.native_dtype).for_component("experts").name == "fp8_block"
    ratio = weights_bytes(count_params(fp8), parse_weight_precision(fp8.native_dtype)) / weights_bytes(
        count_params(bf16), parse_weight_precision(bf16.native_dtype))
    assert 0.5 < ratio < 0.52


def test_step_legacy_lists_padded_for_the_mtp_layers_read_the_same() -> None:
    """Step's released configs list layer_types and mlp_layer_types for the MTP layers too (num_hidden_layers +
    num_nextn_predict_layers entries; Step3p7TextConfig cuts them), or the MoE layers as moe_layers_enum."""
    cfg = fixture("step-3.7-flash")
    base = build("step-3.7-flash")
    padded = build("step-3.7-flash", layer_types=cfg["layer_types"] + ["full_attention"] * 3,
                   mlp_layer_types=["dense"] * 3 + ["sparse"] * 45)
    listed = build("step-3.7-flash", first_k_dense_replace=7, moe_layers_enum=",".join(map(str, range(3, 45))))
    assert padded == base
    assert listed == base


@pytest.mark.parametrize("changes, message", [
    ({"num_sliding_attention_heads": 96}, "'num_sliding_attention_heads': sliding layers of 96 heads"),
    ({"attention_other_setting": {"num_attention_heads": 96}}, "'attention_other_setting': sliding layers of 96"),
    ({"gating": False}, "'gating' False is not supported"),
    ({"partial_rotary_factors": [0.5] * 45}, "'partial_rotary_factors'"),
    ({"n_shared_experts": 2}, r"'n_shared_experts' \(2\) is not supported"),
    ({"scoring_func": "softmax"}, "'scoring_func' 'softmax' is not supported"),
    ({"rope_theta": [10000.0] * 45}, "rope_theta"),
    ({"layer_types": ["full_attention"] * 44}, "'layer_types' must be a list of 45 entries"),
    ({"moe_layers_enum": "3,x"}, "'moe_layers_enum' must list layer indices"),
    ({"use_bidirectional_attention": True}, "'use_bidirectional_attention'"),
    ({"text_config": {"hidden_size": 4096}, "vision_config": {}}, "'text_config': Step-3.7's multimodal config"),
])
def test_step_unsupported_fields_are_one_line(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        build("step-3.7-flash", **changes)
    assert str(err.value).startswith("step-3.7-flash.json: ") and "\n" not in str(err.value)


# --- MiMo-7B ---------------------------------------------------------------------------------------------------------

def test_mimo_is_qwen2_with_its_mtp_layer_apart() -> None:
    """MiMo-7B-Base reads as the Qwen2 decoder of the same fields (q/k/v biases, no o bias, untied head), its one
    MTP layer not counted; a remote-code model type (no transformers class). Its card names it 7B."""
    mimo = build("mimo-7b-base")
    qwen2 = spec_from_hf_config({**fixture("mimo-7b-base"), "model_type": "qwen2"}, origin="qwen2",
                                name="mimo-7b-base")
    assert (mimo.num_mtp_layers, qwen2.num_mtp_layers, mimo.remote_code, qwen2.remote_code) == (1, 0, True, False)
    assert dataclasses.replace(mimo, num_mtp_layers=0, remote_code=False) == qwen2
    assert mimo.qkv_bias and not mimo.o_bias and mimo.sliding_window is None
    assert 7e9 <= count_params(mimo).total_params < 8e9


# --- sgl-project's DeepSeek-V4 FP8 copies ------------------------------------------------------------------------

@pytest.mark.parametrize("size", ["flash", "pro"])
def test_sgl_copies_count_and_cache_as_deepseek_ai_configs(size: str) -> None:
    """sgl-project/DeepSeek-V4-{Flash,Pro}-FP8 (model_type deepseek_ref) carry deepseek-ai's structural fields with
    the same values: the same parameters per component and the same KV cache (per token, and held at 4K and 1M
    tokens). They differ where the checkpoints do: no expert_dtype (fp4 in deepseek-ai's), so the routed experts are
    fp8 blocks, not MXFP4, and the sgl copies weigh more; Pro's copy drops routed_scaling_factor (2.5), read as
    DeepseekV4Config's 1.5, which no size depends on."""
    sgl, official = build(f"deepseek-v4-{size}-fp8-sgl"), build(f"deepseek-v4-{size}")
    assert count_params(sgl).total == count_params(official).total
    kv = get_dtype("fp8_e4m3")
    assert kv_bytes_per_token(sgl, kv) == kv_bytes_per_token(official, kv)
    for context in (4096, 1 << 20):
        assert held_bytes(sgl, kv, context) == held_bytes(official, kv, context)
    skip = {"name", "native_dtype", "remote_code", "hf_repo", "moe"}
    assert {f.name: getattr(sgl, f.name) for f in dataclasses.fields(sgl) if f.name not in skip} == {
        f.name: getattr(official, f.name) for f in dataclasses.fields(official) if f.name not in skip}
    assert sgl.moe is not None and official.moe is not None
    assert dataclasses.replace(sgl.moe, routed_scaling_factor=official.moe.routed_scaling_factor) == official.moe
    stored = parse_weight_precision(sgl.native_dtype), parse_weight_precision(official.native_dtype)
    assert (stored[0].for_component("experts").name, stored[1].for_component("experts").name) == ("fp8_block",
                                                                                                   "mxfp4")
    assert stored[0].for_component("attention") == stored[1].for_component("attention")
    assert weights_bytes(count_params(sgl), stored[0]) > weights_bytes(count_params(official), stored[1])
    assert sgl.remote_code and not official.remote_code
