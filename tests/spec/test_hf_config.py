"""load_hf_config / spec_from_hf_config: errors, defaults and per-family quirks (no transformers needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hf_fixtures import DROP as _DROP
from hf_fixtures import FIXTURE_DIR, fixture

from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.hf_config import SUPPORTED_MODEL_TYPES, load_hf_config, spec_from_hf_config
from tfcalc.spec.model import MLASpec, RopeScaling

FIXTURES = sorted(p.stem for p in FIXTURE_DIR.glob("*.json"))






def build(name: str, **changes: Any):
    return spec_from_hf_config(fixture(name, **changes), origin=f"{name}.json", name=name)


def write(tmp_path: Path, data: dict[str, Any], filename: str = "config.json") -> Path:
    path = tmp_path / filename
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --- errors --------------------------------------------------------------------------------------------------

def test_supported_types() -> None:
    assert SUPPORTED_MODEL_TYPES == tuple(sorted({
        "cohere", "cohere2",
        "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "gemma", "gemma2", "gemma3", "gemma3_text",
        "gemma4", "gemma4_text", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "gpt_oss", "granitemoehybrid", "kimi_k25",
        "minimax_m3", "minimax_m3_vl", "kimi_linear", "kimi_k3",
        "llama", "llama4",
        "llama4_text", "mimo_v2_flash", "minimax_m2", "mistral", "mistral3", "mixtral", "nemotron_h", "nemotron-nas",
        "phi3", "qwen2",
        "qwen2_5_vl",
        "qwen2_moe", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_moe", "qwen3_next",
        "qwen3_vl", "qwen3_vl_moe", "qwen3_vl_moe_text",
        "seed_oss", "glm4", "olmo2", "olmo3", "smollm3", "exaone4", "granite",
        "dots1", "ernie4_5_moe", "granitemoe", "granitemoeshared", "hunyuan_v1_moe", "step3p7", "mimo",
        "deepseek_ref"}))


@pytest.mark.parametrize("model_type", ["falcon", None, 7])
def test_unsupported_model_type_lists_supported_types(tmp_path: Path, model_type: object) -> None:
    data = fixture("llama3-8b", model_type=model_type if model_type is not None else _DROP)
    path = write(tmp_path, data)
    with pytest.raises(SpecError) as info:
        load_hf_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert "model_type" in message
    for supported in SUPPORTED_MODEL_TYPES:
        assert supported in message


def test_remote_code_model_type_reads_as_its_architecture() -> None:
    """Kimi K2 (remote code: model_type kimi_k2 with an auto_map, DeepseekV3ForCausalLM) is read as DeepSeek-V3, as
    vLLM picks the class by its architecture; its model card: 1T total and 32B activated parameters, 384 experts, 8
    per token."""
    from tfcalc.calc.params import count_params

    spec = build("kimi-k2")
    counts = count_params(spec)
    assert spec.mla is not None and spec.moe is not None
    assert (spec.moe.num_experts, spec.moe.experts_per_token, spec.num_attention_heads) == (384, 8, 64)
    assert tuple(spec.moe.dense_layers) == (0,) and spec.num_mtp_layers == 0
    assert 1.00e12 < counts.total_params < 1.06e12 and 32.0e9 < counts.active_params < 33.5e9
    assert spec.native_dtype == "fp8_block"
    assert spec.remote_code and not build("deepseek-v3").remote_code   # engines need --trust-remote-code for it


def test_known_model_type_wins_over_architecture_and_unknown_pairs_fail() -> None:
    assert build("llama3-8b", architectures=["DeepseekV3ForCausalLM"]).moe is None
    with pytest.raises(SpecError, match="unsupported model_type 'kimi_k9'"):
        build("kimi-k2", model_type="kimi_k9", architectures=["KimiK9ForCausalLM"])
    with pytest.raises(SpecError, match="no model_type"):
        build("kimi-k2", model_type=_DROP)
    with pytest.raises(SpecError, match="unsupported model_type 'kimi_k2'"):   # not remote code: no auto_map
        build("kimi-k2", auto_map=_DROP)


@pytest.mark.parametrize(("name", "field"), [
    ("llama3-8b", "hidden_size"),
    ("llama3-8b", "num_hidden_layers"),
    ("llama3-8b", "vocab_size"),
    ("qwen3-30b-a3b", "moe_intermediate_size"),
    ("mixtral-8x7b", "num_local_experts"),
    ("deepseek-v3", "kv_lora_rank"),
    ("deepseek-v3", "n_routed_experts"),
])
def test_missing_field_is_named(tmp_path: Path, name: str, field: str) -> None:
    path = write(tmp_path, fixture(name, **{field: _DROP}))
    with pytest.raises(SpecError, match=rf"^{path}: missing required field '{field}'"):
        load_hf_config(path)


def test_null_required_field_is_missing(tmp_path: Path) -> None:
    path = write(tmp_path, fixture("llama3-8b", intermediate_size=None))
    with pytest.raises(SpecError, match="missing required field 'intermediate_size'"):
        load_hf_config(path)


def test_malformed_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": 4096,,}', encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_hf_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: malformed JSON at line 1")
    assert "\n" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_top_level_list_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(SpecError, match=rf"^{path}: expected a mapping"):
        load_hf_config(path)


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_hf_config(tmp_path / "nope.json")


@pytest.mark.parametrize(("field", "value"), [("hidden_size", "4096"), ("num_attention_heads", 32.0),
                                              ("num_hidden_layers", True), ("num_key_value_heads", 0)])
def test_bad_integer_is_named(field: str, value: object) -> None:
    with pytest.raises(SpecError, match=rf"^llama3-8b.json: field '{field}' must be"):
        build("llama3-8b", **{field: value})


def test_bad_boolean_is_named() -> None:
    with pytest.raises(SpecError, match=r"^llama3-8b.json: field 'tie_word_embeddings' must be true or false"):
        build("llama3-8b", tie_word_embeddings="no")


@pytest.mark.parametrize(("name", "field", "value", "message"), [
    ("gemma2-9b", "attn_logit_softcapping", 0, "must be positive"),
    ("gemma2-9b", "final_logit_softcapping", "30", "must be a number"),
    ("gemma2-9b", "query_pre_attn_scalar", True, "must be a number"),
    ("gemma2-9b", "query_pre_attn_scalar", 1e300, "must be at most"),
    ("deepseek-v3", "routed_scaling_factor", -2.5, "must be positive"),
    ("deepseek-v3", "routed_scaling_factor", None, "missing required field"),
    ("deepseek-v3", "n_group", 0, "must be positive"),
    ("deepseek-v3", "n_group", 7, "moe.expert_groups (7) must divide num_experts (256)"),
    ("deepseek-v3", "topk_group", 9, "moe.groups_per_token (9) must be in 1..expert_groups (8)"),
])
def test_numerics_and_routing_fields_are_read_strictly(name: str, field: str, value: object, message: str) -> None:
    """Issue 14's fields go through the same checks as the spec's (issue 11): one line naming the file and the
    config key."""
    with pytest.raises(SpecError) as info:
        build(name, **{field: value})
    assert str(info.value).startswith(f"{name}.json: ") and message in str(info.value)
    assert field in str(info.value) or "moe." in message


def test_yarn_mscale_zero_means_off_and_is_accepted() -> None:
    """DeepSeek's yarn reads mscale / mscale_all_dim 0 as "no attention scaling" (yarn_get_mscale returns 1)."""
    scaling = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
               "beta_slow": 1, "mscale": 0, "mscale_all_dim": 0}
    s = build("deepseek-v3", rope_scaling=scaling)
    assert (s.rope_scaling.mscale, s.rope_scaling.mscale_all_dim) == (0.0, 0.0)
    with pytest.raises(SpecError, match=r"field 'rope_scaling.beta_fast' must be positive"):
        build("deepseek-v3", rope_scaling={**scaling, "beta_fast": 0})


def test_modelspec_validation_error_is_prefixed_with_the_file() -> None:
    with pytest.raises(SpecError, match=r"^llama3-8b.json: llama3-8b: num_attention_heads \(32\) is not divisible"):
        build("llama3-8b", num_key_value_heads=5)


@pytest.mark.parametrize("layer_types", [["sliding_attention"] * 3, ["chunked_attention"] * 24, "all"])
def test_bad_layer_types(layer_types: object) -> None:
    with pytest.raises(SpecError, match=r"^gpt-oss-20b.json: field 'layer_types'"):
        build("gpt-oss-20b", layer_types=layer_types)


def test_unknown_torch_dtype() -> None:
    with pytest.raises(SpecError, match="field 'torch_dtype' must be one of bfloat16, float16, float32"):
        build("llama3-8b", torch_dtype="float8")


# --- loading ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FIXTURES)
def test_every_fixture_loads(name: str) -> None:
    spec = load_hf_config(FIXTURE_DIR / f"{name}.json")
    assert spec.name == name
    data = fixture(name)
    text = data.get("text_config", data)  # Qwen3.5 names its MTP layers mtp_num_hidden_layers
    assert spec.num_mtp_layers == data.get("num_nextn_predict_layers", text.get("mtp_num_hidden_layers", 0))


def test_architecture_is_the_first_class_and_presets_agree() -> None:
    """``architecture``: config.json's architectures[0], none when the list is absent or empty, a one-line error
    naming the field when it is no class name; each model preset states its checkpoint's own."""
    from tfcalc.spec.presets import load_model, preset_names

    assert build("qwen3-30b-a3b").architecture == "Qwen3MoeForCausalLM"
    assert build("mixtral-8x7b", architectures=["MixtralForCausalLM", "Other"]).architecture == "MixtralForCausalLM"
    assert build("llama3-8b", architectures=_DROP).architecture is None
    assert build("llama3-8b", architectures=[]).architecture is None
    for bad in ("LlamaForCausalLM", [7], ["Llama For"], ["x" * 200]):
        with pytest.raises(SpecError, match="llama3-8b.json: field 'architectures' must be a list of class names"):
            build("llama3-8b", architectures=bad)
    checked = 0
    for name in preset_names("model"):
        if name in FIXTURES:
            assert load_model(name).architecture == build(name).architecture, name
            checked += 1
    assert checked >= 19


def test_name_from_folder_and_folder_path(tmp_path: Path) -> None:
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    write(folder, fixture("llama3-8b"))
    assert load_hf_config(folder / "config.json").name == "Meta-Llama-3-8B"
    assert load_hf_config(folder).name == "Meta-Llama-3-8B"
    assert load_hf_config(folder, name="mine").name == "mine"


def test_checkpoint_to_serve(tmp_path: Path) -> None:
    """hf_repo: the folder when the weights are beside config.json, else ``_name_or_path``, else unknown; a
    ``_name_or_path`` that is no text (or carries control characters) is refused, naming the field."""
    assert build("llama3-8b").hf_repo is None
    assert build("llama3-8b", _name_or_path="meta-llama/Meta-Llama-3-8B").hf_repo == "meta-llama/Meta-Llama-3-8B"
    assert build("llama3-8b", _name_or_path="").hf_repo is None
    for bad in (7, "a\nb"):
        with pytest.raises(SpecError, match="llama3-8b.json: field '_name_or_path' must be a repository id"):
            build("llama3-8b", _name_or_path=bad)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write(folder, fixture("llama3-8b", _name_or_path="/train/run-7"))
    assert load_hf_config(folder).hf_repo == "/train/run-7"
    (folder / "pytorch_model-00001-of-00002.bin").write_bytes(b"")
    assert load_hf_config(folder).hf_repo == str(folder)


def test_llama3_8b_fields() -> None:
    s = build("llama3-8b")
    assert (s.vocab_size, s.hidden_size, s.num_layers, s.num_attention_heads, s.num_kv_heads, s.head_dim,
            s.intermediate_size) == (128256, 4096, 32, 32, 8, 128, 14336)
    assert (s.qkv_bias, s.o_bias, s.mlp_bias, s.tie_word_embeddings, s.norms_per_layer) == (False, False, False,
                                                                                              False, 2)
    assert (s.rope_theta, s.rope_scaling, s.max_context, s.native_dtype) == (500000.0, None, 8192, "bf16")
    assert s.moe is None and s.mla is None and s.sliding_window is None
    assert s.active_params_convention == "all_weights_touched"


# --- head_dim ------------------------------------------------------------------------------------------------------

def test_head_dim_defaults_to_hidden_over_heads() -> None:
    assert "head_dim" not in fixture("llama3-8b")
    assert build("llama3-8b").head_dim == 4096 // 32
    assert build("llama3-8b", head_dim=None).head_dim == 128
    assert build("mistral-7b").head_dim == 128
    assert build("phi3-mini").head_dim == 3072 // 32
    assert build("qwen2.5-7b").head_dim == 3584 // 28


def test_explicit_head_dim_wins() -> None:
    assert build("mistral-nemo-12b").head_dim == 128  # 32 heads x 128 != hidden 5120
    assert build("gemma2-9b").head_dim == 256
    assert build("qwen3-30b-a3b").head_dim == 128
    assert build("llama3.2-3b", head_dim=96).head_dim == 96


def test_head_dim_class_defaults_that_are_constants() -> None:
    """Qwen3Config, GemmaConfig and GptOssConfig default head_dim to a constant, not hidden // heads."""
    assert build("qwen3-8b", head_dim=_DROP).head_dim == 128
    assert build("gemma-7b", head_dim=_DROP).head_dim == 256
    assert build("gpt-oss-20b", head_dim=_DROP).head_dim == 64


# --- biases, norms, embeddings -------------------------------------------------------------------------------------

def test_qwen2_always_has_qkv_bias_and_no_o_bias() -> None:
    for name in ("qwen2.5-7b", "qwen2.5-72b"):
        s = build(name, attention_bias=False)
        assert (s.qkv_bias, s.o_bias) == (True, False)


def test_qwen2_moe_qkv_bias_flag() -> None:
    assert (build("qwen1.5-moe-a2.7b").qkv_bias, build("qwen1.5-moe-a2.7b").o_bias) == (True, False)
    assert build("qwen1.5-moe-a2.7b", qkv_bias=False).qkv_bias is False


def test_llama_attention_and_mlp_bias() -> None:
    s = build("synthetic-llama-bias")
    assert (s.qkv_bias, s.o_bias, s.mlp_bias) == (True, True, True)
    assert s.num_kv_heads == s.num_attention_heads == 8  # no num_key_value_heads key: MHA


def test_mistral_ignores_attention_bias() -> None:
    s = build("mistral-7b", attention_bias=True)
    assert (s.qkv_bias, s.o_bias) == (False, False)


def test_gpt_oss_attention() -> None:
    s = build("gpt-oss-120b")
    assert (s.qkv_bias, s.o_bias, s.attention_sinks) == (True, True, True)
    assert build("gpt-oss-120b", attention_bias=_DROP).qkv_bias is True  # GptOssConfig default


def test_gemma_norms_and_ties() -> None:
    assert "tie_word_embeddings" not in fixture("gemma2-9b")
    for name, norms, qk_norm in (("gemma-7b", 2, False), ("gemma2-9b", 4, False), ("gemma-3-1b", 4, True)):
        s = build(name)
        assert (s.tie_word_embeddings, s.norms_per_layer, s.qk_norm) == (True, norms, qk_norm)
    assert build("gemma2-9b", tie_word_embeddings=False).tie_word_embeddings is False
    assert build("llama3-8b", tie_word_embeddings=_DROP).tie_word_embeddings is False
    assert build("gemma-7b").activation == "gelu_tanh"  # GemmaConfig: legacy "gelu" means the tanh approximation
    assert build("gemma2-9b").activation == "gelu_tanh"
    assert build("gemma-3-1b").activation == "gelu_tanh"
    assert build("llama3-8b").activation == "silu"
    assert build("gpt-oss-20b").activation == "swiglu_clamped"


def test_qk_norm_families() -> None:
    assert build("qwen3-8b").qk_norm and build("qwen3-235b-a22b").qk_norm
    assert not build("qwen2.5-7b").qk_norm and not build("llama3-8b").qk_norm


# --- sliding windows -----------------------------------------------------------------------------------------------

def test_gemma2_even_layers_slide() -> None:
    s = build("gemma2-9b")
    assert s.sliding_window == 4096
    assert s.sliding_window_layers == tuple(range(0, 42, 2))
    assert build("gemma2-27b").sliding_window_layers == tuple(range(0, 46, 2))


def test_gemma3_pattern_and_layer_types() -> None:
    s = build("gemma-3-1b")
    assert s.sliding_window == 512
    assert s.sliding_window_layers == tuple(i for i in range(26) if (i + 1) % 6)
    assert build("synthetic-gemma3-layer-types").sliding_window_layers == (1, 2)
    assert build("gemma-3-1b", sliding_window_pattern=2).sliding_window_layers == tuple(range(0, 26, 2))


def test_layer_types_are_authoritative() -> None:
    layer_types = ["full_attention"] * 20 + ["sliding_attention"] * 4
    assert build("gpt-oss-20b", layer_types=layer_types).sliding_window_layers == (20, 21, 22, 23)
    assert build("gemma2-9b", layer_types=["full_attention"] * 41 + ["sliding_attention"]).sliding_window_layers == (
        41,)
    s = build("gpt-oss-20b", layer_types=["full_attention"] * 24)
    assert (s.sliding_window, s.sliding_window_layers) == (None, ())


def test_gpt_oss_sliding() -> None:
    s = build("gpt-oss-120b")
    assert (s.sliding_window, s.sliding_window_layers) == (128, tuple(range(0, 36, 2)))
    assert build("gpt-oss-120b", layer_types=_DROP).sliding_window_layers == tuple(range(0, 36, 2))


def test_mistral_window_every_layer() -> None:
    s = build("mistral-7b")
    assert (s.sliding_window, s.sliding_window_layers) == (4096, tuple(range(32)))
    assert build("mistral-nemo-12b").sliding_window is None  # explicit null
    assert build("mistral-nemo-12b", sliding_window=_DROP).sliding_window == 4096  # MistralConfig default
    assert build("mixtral-8x7b").sliding_window is None
    assert build("phi3-mini").sliding_window_layers == tuple(range(32))


def test_qwen_window_only_when_enabled() -> None:
    assert "sliding_window" in fixture("qwen2.5-7b")
    s = build("qwen2.5-7b")
    assert (s.sliding_window, s.sliding_window_layers) == (None, ())
    s = build("qwen2.5-7b", use_sliding_window=True, max_window_layers=20)
    assert (s.sliding_window, s.sliding_window_layers) == (131072, tuple(range(20, 28)))
    assert build("synthetic-qwen2-window").sliding_window_layers == (2, 3, 4)
    assert build("qwen3-8b", use_sliding_window=True, sliding_window=4096,
                 max_window_layers=28).sliding_window_layers == tuple(
        range(28, 36))
    s = build("qwen3-30b-a3b", use_sliding_window=True, sliding_window=4096)
    assert s.sliding_window_layers == tuple(range(48))  # Qwen3-MoE: every layer


def test_qwen2_moe_window_pattern() -> None:
    s = build("synthetic-qwen2-moe-sparse-step")
    assert (s.sliding_window, s.sliding_window_layers) == (64, (0, 2))
    assert build("qwen1.5-moe-a2.7b").sliding_window is None


# --- MoE and MLA ---------------------------------------------------------------------------------------------------

def test_deepseek_v3_dense_layers_and_mla() -> None:
    s = build("deepseek-v3")
    assert s.moe is not None and s.mla is not None
    assert s.moe.dense_layers == (0, 1, 2)
    assert s.num_moe_layers == 58
    assert (s.moe.num_experts, s.moe.experts_per_token, s.moe.expert_intermediate_size) == (256, 8, 2048)
    assert (s.moe.num_shared_experts, s.moe.shared_expert_intermediate_size) == (1, 2048)
    assert s.moe.router_score_correction_bias and not s.moe.router_bias and s.moe.normalize_top_k
    assert s.mla == MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                            v_head_dim=128)
    assert (s.head_dim, s.num_kv_heads, s.intermediate_size) == (192, 128, 18432)
    assert s.rope_scaling == RopeScaling(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
                                          beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    assert (s.moe.router_scoring, s.moe.expert_groups, s.moe.groups_per_token) == ("sigmoid", 8, 4)
    assert s.moe.routed_scaling_factor == 2.5
    assert s.native_dtype == "fp8_block"
    assert s.num_mtp_layers == 1


def test_deepseek_moe_layer_freq() -> None:
    s = build("deepseek-v3", moe_layer_freq=2)
    assert s.moe is not None
    assert s.moe.dense_layers == (0, 1, 2, *range(3, 61, 2))


def test_deepseek_v2_lite() -> None:
    s = build("deepseek-v2-lite")
    assert s.mla is not None and s.moe is not None
    assert s.mla.q_lora_rank is None
    assert s.moe.dense_layers == (0,)
    assert (s.moe.num_shared_experts, s.moe.shared_expert_intermediate_size) == (2, 1408)
    assert not s.moe.router_score_correction_bias and not s.moe.normalize_top_k
    assert build("deepseek-v2-lite", q_lora_rank=_DROP).mla.q_lora_rank == 1536  # type: ignore[union-attr]


def test_qwen_moe_dense_layers() -> None:
    s = build("synthetic-qwen2-moe-sparse-step")
    assert s.moe is not None
    assert s.moe.dense_layers == (0, 2, 3, 4)
    assert (s.moe.num_shared_experts, s.moe.shared_expert_intermediate_size, s.moe.shared_expert_gate) == (1, 384,
                                                                                                        True)
    assert build("qwen3-30b-a3b", mlp_only_layers=[0, 47]).moe.dense_layers == (0, 47)  # type: ignore[union-attr]
    assert build("qwen3-30b-a3b", num_experts=0).moe is None
    q3 = build("qwen3-235b-a22b").moe
    assert q3 is not None and q3.num_shared_experts == 0 and q3.dense_layers == () and q3.normalize_top_k


def test_mixtral_moe() -> None:
    s = build("mixtral-8x22b")
    assert s.moe is not None
    assert (s.moe.num_experts, s.moe.experts_per_token, s.moe.expert_intermediate_size) == (8, 2, 16384)
    assert s.moe.dense_layers == () and not s.moe.router_bias and not s.moe.expert_bias


def test_gpt_oss_convention_moe_and_dtype() -> None:
    s = build("gpt-oss-20b")
    assert s.active_params_convention == "excludes_input_embedding"
    assert s.moe is not None
    assert (s.moe.num_experts, s.moe.experts_per_token, s.moe.expert_intermediate_size) == (32, 4, 2880)
    assert s.moe.router_bias and s.moe.expert_bias
    assert s.native_dtype == "experts=mxfp4,default=bf16"
    assert build("gpt-oss-20b", quantization_config=_DROP).native_dtype == "bf16"
    assert build("llama3-8b").active_params_convention == "all_weights_touched"


# --- dtype and rope ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "expected"), [
    ({"torch_dtype": "float16"}, "fp16"),
    ({"torch_dtype": "float32"}, "fp32"),
    ({"torch_dtype": _DROP, "dtype": "float16"}, "fp16"),
    ({"torch_dtype": _DROP}, "bf16"),
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}, "fp8_block"),
])
def test_native_dtype(changes: dict[str, Any], expected: str) -> None:
    assert build("llama3-8b", **changes).native_dtype == expected


def test_rope_scaling_llama3() -> None:
    s = build("llama3.2-1b")
    assert s.rope_scaling == RopeScaling(rope_type="llama3", factor=32.0, original_max_position_embeddings=8192,
                                         low_freq_factor=1.0, high_freq_factor=4.0)
    assert (s.rope_theta, s.max_context) == (500000.0, 131072)


def test_rope_parameters_transformers5_format() -> None:
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    s = build("qwen3-8b", rope_theta=_DROP, rope_scaling=_DROP, rope_parameters=params)
    assert s.rope_theta == 1e6
    assert s.rope_scaling == RopeScaling(rope_type="yarn", factor=4.0, original_max_position_embeddings=32768)
    gemma = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    s = build("gemma-3-1b", rope_theta=_DROP, rope_scaling=_DROP, rope_parameters=gemma,
              rope_local_base_freq=_DROP)
    assert (s.rope_theta, s.rope_scaling) == (1e6, RopeScaling(rope_type="linear", factor=8.0))
    assert s.rope_local_theta == 1e4  # the sliding layers' own base, from their rope_parameters entry


def test_gemma3_sliding_layers_have_their_own_rope_base() -> None:
    assert build("gemma-3-1b").rope_local_theta == 10000.0  # rope_local_base_freq
    assert build("gemma-3-1b", rope_local_base_freq=_DROP).rope_local_theta == 10000.0  # Gemma3TextConfig default
    assert build("gemma2-9b").rope_local_theta is None and build("llama3.2-1b").rope_local_theta is None
    with pytest.raises(SpecError, match="rope_local_base_freq"):
        build("gemma-3-1b", rope_local_base_freq=-1)


def test_rope_theta_family_defaults() -> None:
    assert build("mixtral-8x7b", rope_theta=_DROP).rope_theta == 1e6
    assert build("gpt-oss-20b", rope_theta=_DROP).rope_theta == 150000.0
    assert build("llama3-8b", rope_theta=_DROP).rope_theta == 10000.0


def test_phi3_longrope_rename() -> None:
    s = build("phi3-mini", rope_scaling={"type": "su", "long_factor": [1.0], "short_factor": [1.0]},
              original_max_position_embeddings=4096)
    assert s.rope_scaling == RopeScaling(rope_type="longrope", original_max_position_embeddings=4096)


# --- ModelOpt's hf_quant_config.json ------------------------------------------------------------------------------

SIDECAR = {"producer": {"name": "modelopt", "version": "0.23.0"},
           "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}


def test_a_config_without_quantization_takes_the_hf_quant_config_beside_it(tmp_path: Path) -> None:
    """nvidia/Llama-3.1-70B-Instruct-FP8's layout: config.json names no quantization, hf_quant_config.json does
    (ModelOpt <= 0.29); vLLM and TensorRT-LLM read it, so its weights are fp8 and its KV cache fp8, not bf16."""
    write(tmp_path, fixture("llama3-70b"))
    plain = load_hf_config(tmp_path)
    write(tmp_path, SIDECAR, "hf_quant_config.json")
    quantized = load_hf_config(tmp_path)
    assert (plain.native_dtype, plain.checkpoint_kv_dtype) == ("bf16", None)
    assert (quantized.native_dtype, quantized.checkpoint_kv_dtype) == ("fp8_e4m3", "fp8")


def test_config_json_quantization_outranks_the_sidecar(tmp_path: Path) -> None:
    """vllm/transformers_utils/config.py opens hf_quant_config.json only when config.json has no
    quantization_config (ModelOpt 0.31 and later write it there)."""
    inline = {"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}
    write(tmp_path, {**fixture("llama3-70b"), "quantization_config": inline})
    write(tmp_path, SIDECAR, "hf_quant_config.json")
    spec = load_hf_config(tmp_path / "config.json")
    assert (spec.native_dtype, spec.checkpoint_kv_dtype) == ("nvfp4", None)


def test_an_error_in_the_sidecar_names_it(tmp_path: Path) -> None:
    write(tmp_path, fixture("llama3-70b"))
    write(tmp_path, {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP6"}}, "hf_quant_config.json")
    with pytest.raises(SpecError, match=r"config.json \(quantization from hf_quant_config.json\): .*'FP6'"):
        load_hf_config(tmp_path)


@pytest.mark.parametrize(("algo", "dtype", "scale"), [("FP8", "fp8_e4m3", "static"), ("NVFP4", "nvfp4", None)])
def test_nemotron_3_ultra_quantized_releases_read_their_sidecar(tmp_path: Path, algo: str, dtype: str,
                                                                 scale: str | None) -> None:
    """nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8 and -NVFP4 ship the BF16 release's config.json key for key (as
    aiconfigurator 0.12 bundles all three) and their format in hf_quant_config.json ({"quantization": {"quant_algo":
    algo, "kv_cache_quant_algo": "FP8"}} in aiconfigurator's copies): the preset's shapes, that format, an fp8 KV
    (ModelOpt FP8's static activation scale; NVFP4 scales its blocks as it goes)."""
    import dataclasses

    from tfcalc.spec.presets import load_model

    write(tmp_path, fixture("nemotron-3-ultra-550b-a55b"))
    write(tmp_path, {"quantization": {"quant_algo": algo, "kv_cache_quant_algo": "FP8"}}, "hf_quant_config.json")
    spec = load_hf_config(tmp_path)
    assert (spec.native_dtype, spec.checkpoint_kv_dtype, spec.checkpoint_activation_scale) == (dtype, "fp8", scale)
    preset = load_model("nemotron-3-ultra-550b-a55b")
    assert dataclasses.replace(spec, name=preset.name, native_dtype="bf16", checkpoint_kv_dtype=None,
                               checkpoint_activation_scale=None, hf_repo=preset.hf_repo) == preset


# --- GLM-4.5 / 4.6 (glm4_moe) and MiniMax-M2 (minimax_m2) ------------------------------------------------------

@pytest.mark.parametrize("name, published_total, published_active", [
    # zai-org/GLM-4.6 and GLM-4.5-Air model cards: 355 B / 32 B and 106 B / 12 B (the cards count the MTP layer,
    # about 3.8 B in GLM-4.6, which tfcalc leaves out); MiniMaxAI/MiniMax-M2.5: 230 B total, 10 B active.
    ("glm-4.6", 355e9, 32e9), ("glm-4.5-air", 106e9, 12e9), ("minimax-m2.5", 230e9, 10e9)])
def test_new_families_against_their_model_cards(name: str, published_total: float, published_active: float) -> None:
    from tfcalc.calc.params import count_params

    counts = count_params(build(name))
    assert counts.total_params == pytest.approx(published_total, rel=0.01)
    # the cards' active counts leave out the embedding table (and round down): within 12 %
    assert counts.active_params == pytest.approx(published_active, rel=0.12)


def test_glm4_moe_reads_deepseek_routing_partial_rope_and_its_mtp_layer() -> None:
    spec = build("glm-4.6")
    assert (spec.head_dim, spec.rotary_dim, spec.partial_rotary_factor) == (128, 64, 0.5)
    assert spec.qkv_bias and not spec.o_bias and spec.qk_norm and not spec.qk_norm_across_heads
    assert spec.moe.dense_layers == (0, 1, 2) and spec.moe.router_scoring == "sigmoid"
    assert spec.moe.router_score_correction_bias and spec.moe.routed_scaling_factor == 2.5
    assert (spec.moe.num_shared_experts, spec.moe.shared_expert_intermediate_size) == (1, 1536)
    assert spec.num_mtp_layers == 1 and not spec.remote_code
    air = build("glm-4.5-air")
    assert not air.qk_norm and air.moe.dense_layers == (0,)
    assert build("glm-4.6", partial_rotary_factor=_DROP).rotary_dim == 64  # Glm4MoeConfig's default 0.5


def test_minimax_m2_norms_across_heads_and_rotates_rotary_dim() -> None:
    spec = build("minimax-m2.5")
    assert spec.qk_norm and spec.qk_norm_across_heads and not spec.qkv_bias
    assert (spec.rotary_dim, spec.num_mtp_layers) == (64, 0)
    assert spec.moe.router_scoring == "sigmoid" and spec.moe.router_score_correction_bias
    assert spec.moe.expert_intermediate_size == 1536 and spec.num_moe_layers == 62
    assert spec.native_dtype == "fp8_block"
    assert build("minimax-m2.5", rotary_dim=32).rotary_dim == 32
    # partial_rotary_factor outranks rotary_dim, as MiniMaxM2Config's setdefault does
    assert build("minimax-m2.5", partial_rotary_factor=1.0).rotary_dim == 128
    assert build("minimax-m2.5", rotary_dim=_DROP).rotary_dim == 128


@pytest.mark.parametrize("changes, message", [
    ({"partial_rotary_factor": 0.3}, r"partial_rotary_factor \(0.3\) x head_dim \(128\) must be an even number"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ({"partial_rotary_factor": "half"}, "must be a number"),
])
def test_a_bad_rotary_share_is_one_line(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        build("glm-4.6", **changes)
    assert "\n" not in str(err.value) and str(err.value).startswith("glm-4.6.json")


def test_rope_parameters_carry_the_rotary_share() -> None:
    spec = build("glm-4.6", partial_rotary_factor=_DROP, rope_theta=_DROP,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25})
    assert spec.rotary_dim == 32 and spec.rope_theta == 1e6


# --- multimodal checkpoints: the text decoder plus a vision encoder (Gemma 3) -------------------------------------

def test_gemma3_multimodal_reads_its_text_config_and_counts_the_siglip_encoder() -> None:
    from tfcalc.calc.params import count_params

    spec = build("gemma3-27b")
    text = spec_from_hf_config({"vocab_size": 262208, **fixture("gemma3-27b")["text_config"]}, origin="t.json",
                               name="text")
    # the decoder is the text_config's (62 layers, 32 / 16 heads of 128, query scalar 168, linear rope x8, window
    # 1024 on 5 of 6 layers, the default vocabulary 262,208 of Gemma3TextConfig)
    assert (spec.num_layers, spec.num_attention_heads, spec.num_kv_heads, spec.vocab_size) == (62, 32, 16, 262208)
    assert spec.num_sliding_layers == 52 and spec.rope_scaling.factor == 8.0 and spec.query_pre_attn_scalar == 168
    assert spec.architecture == "Gemma3ForConditionalGeneration" and spec.native_dtype == "bf16"
    e = spec.encoder
    assert (e.hidden_size, e.intermediate_size, e.num_layers, e.patch_size, e.image_size, e.num_patches) == (
        1152, 4304, 27, 14, 896, 4096)
    counts = count_params(spec)
    # SigLIP so400m/14 at 896 px without its pooling head (~0.42 B) and Gemma 3's projector (RMSNorm + 1152 x 5376)
    assert counts.total["encoder"].total == 423_060_336 and counts.active["encoder"].total == 0
    assert counts.total_params - count_params(text).total_params == 423_060_336
    assert counts.active_params == count_params(text).active_params


@pytest.mark.parametrize("changes, message", [
    ({"vision_config": {"model_type": "clip_vision_model"}}, "reads text_config of model_type gemma3_text and "
                                                             "vision_config of model_type siglip_vision_model"),
    ({"vision_config": {"patch_size": 0}}, r"vision_config: .*patch_size"),
    ({"vision_config": {"image_size": 900, "patch_size": 14}}, "not a multiple of encoder.patch_size"),
    ({"text_config": [1]}, "field 'text_config' must be a mapping"),
])
def test_a_bad_multimodal_config_is_one_line(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        build("gemma3-27b", **changes)
    assert "\n" not in str(err.value) and str(err.value).startswith("gemma3-27b.json")


def test_mistral3_multimodal_reads_mistral_and_counts_the_pixtral_encoder() -> None:
    from tfcalc.calc.params import count_params, encoder_shape

    spec = build("mistral-small-3.2-24b")
    assert (spec.num_layers, spec.hidden_size, spec.vocab_size, spec.sliding_window) == (40, 5120, 131072, None)
    assert not spec.tie_word_embeddings and spec.rope_theta == 1e9
    e = spec.encoder
    assert (e.kind, e.hidden_size, e.num_layers, e.patch_size, e.merge_size, e.projector_bias) == (
        "pixtral", 1024, 24, 14, 2, False)
    # Pixtral (24 blocks of 4 x 1024^2 + 3 x 1024 x 4096, two RMSNorms each; conv 3 x 14^2 x 1024; ln_pre) and the
    # projector (RMSNorm, 2 x 2 merger 4096 x 1024, linear_1 1024 x 5120, linear_2 5120 x 5120)
    h, i, big = 1024, 4096, 5120
    by_hand = 24 * (4 * h * h + 3 * h * i + 2 * h) + 3 * 14 * 14 * h + h + h + 4 * h * h + h * big + big * big
    assert count_params(spec).total["encoder"].total == by_hand == 438_958_080
    shape = encoder_shape(spec)  # vLLM: blocks and the projector's two linears split over tp, the rest whole
    assert shape.per_rank(2).total == shape.split.total // 2 + shape.replicated.total
    with_bias = build("mistral-small-3.2-24b", multimodal_projector_bias=True)
    assert count_params(with_bias).total["encoder"].total == by_hand + 2 * big
    with pytest.raises(SpecError, match="vision_feature_layer"):
        build("mistral-small-3.2-24b", vision_feature_layer=[-1, -2])


def test_qwen2_5_vl_reads_its_flat_text_keys_mrope_and_the_vision_transformer() -> None:
    from tfcalc.calc.params import count_params, encoder_shape

    spec = build("qwen2.5-vl-7b")  # Qwen's original config.json: the text keys at the top level
    assert (spec.num_layers, spec.hidden_size, spec.num_kv_heads, spec.vocab_size) == (28, 3584, 4, 152064)
    assert spec.qkv_bias and not spec.o_bias and spec.sliding_window is None and not spec.tie_word_embeddings
    assert spec.rope_scaling is None and spec.rope_theta == 1e6  # M-RoPE: text positions turn as plain RoPE
    e = spec.encoder
    assert (e.kind, e.hidden_size, e.num_layers, e.patch_size, e.temporal_patch_size, e.merge_size) == (
        "qwen2_5_vl", 1280, 32, 14, 2, 2)
    h, i, big = 1280, 3420, 3584
    # 32 blocks: qkv 3h^2 + 3h, proj h^2 + h, gated MLP 3hI + 2I + h, two RMSNorms; conv 3 x 2 x 14^2 x h;
    # merger: RMSNorm h, fc1 (4h)^2 + 4h, fc2 4h x 3584 + 3584 -- Qwen/Qwen2.5-VL-7B-Instruct's card: 8.29 B
    by_hand = (32 * (4 * h * h + 4 * h + 3 * h * i + 2 * i + h + 2 * h) + 3 * 2 * 14 * 14 * h
               + h + 16 * h * h + 4 * h + 4 * h * big + big)
    counts = count_params(spec)
    assert counts.total["encoder"].total == by_hand == 676_550_144
    assert round(counts.total_params / 1e9, 2) == 8.29
    shape = encoder_shape(spec)
    assert shape.total().total == by_hand and shape.per_rank(4).total == shape.split.total // 4 + shape.replicated.total
    nested = fixture("qwen2.5-vl-7b")
    vision = nested.pop("vision_config")
    text = {k: v for k, v in nested.items() if k != "model_type"}
    again = spec_from_hf_config({"model_type": "qwen2_5_vl", "text_config": {**text, "model_type": "qwen2_5_vl_text"},
                                 "vision_config": vision}, origin="n.json", name="n")
    assert count_params(again).total_params == counts.total_params  # transformers 5's nested layout reads the same
    with pytest.raises(SpecError, match="out_hidden_size"):
        build("qwen2.5-vl-7b", vision_config={**vision, "out_hidden_size": 8192})


# --- Llama 4 ----------------------------------------------------------------------------------------------------

def _llama4(name: str = "llama4-scout-17b-16e", **text: Any):
    data = fixture(name)
    data["text_config"] = {**data["text_config"], **text}
    return spec_from_hf_config(data, origin=f"{name}.json", name=name)


def test_llama4_layers_follow_transformers_defaults_and_overrides() -> None:
    scout, maverick = _llama4(), _llama4("llama4-maverick-17b-128e")
    nope = tuple(range(3, 48, 4))
    assert scout.nope_layers == maverick.nope_layers == nope
    assert scout.sliding_window_layers == tuple(i for i in range(48) if i not in nope) and scout.chunked_attention
    assert scout.num_moe_layers == 48 and maverick.moe.dense_layers == tuple(range(0, 48, 2))
    assert (scout.qk_l2_norm, maverick.qk_l2_norm, scout.qk_norm) == (True, False, False)
    assert (scout.attn_temperature_floor_scale, scout.attn_temperature_scale) == (8192, 0.1)
    # explicit lists win: moe_layers over interleave_moe_layer_step, no_rope_layers over the interval
    custom = _llama4(moe_layers=[0, 5], no_rope_layers=[1, 0] * 24, attn_temperature_tuning=False)
    assert custom.num_moe_layers == 2 and custom.nope_layers == tuple(range(1, 48, 2))
    assert custom.attn_temperature_floor_scale is None
    # layer_types is authoritative; no chunk size: every layer attends to the whole context
    assert _llama4(layer_types=["full_attention"] * 47 + ["chunked_attention"]).sliding_window_layers == (47,)
    assert _llama4(attention_chunk_size=None).sliding_window is None
    assert _llama4(layer_types=["full_attention"] * 48).local_attention == "sliding"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("no_rope_layers", [1, 0, 2] * 16, "field 'no_rope_layers' must be a list of at least 48 entries 0 or 1"),
    ("no_rope_layers", [1] * 47, "field 'no_rope_layers' must be a list of at least 48 entries 0 or 1"),
    ("attn_temperature_tuning", "yes", "field 'attn_temperature_tuning' must be true or false"),
    ("attention_chunk_size", 0, "attention_chunk_size"),
    ("interleave_moe_layer_step", 0, "interleave_moe_layer_step"),
    ("layer_types", ["sliding_attention"] * 48, "field 'layer_types' has unsupported entry"),
])
def test_llama4_bad_fields_are_one_line_errors(field: str, value: object, message: str) -> None:
    with pytest.raises(SpecError) as info:
        _llama4(**{field: value})
    assert str(info.value).startswith("llama4-scout-17b-16e.json: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_llama4_vision_config_is_read() -> None:
    e = _llama4().encoder
    assert (e.kind, e.hidden_size, e.num_layers, e.image_size, e.num_patches) == ("llama4", 1408, 34, 336, 576)
    assert (e.adapter_hidden_dim, e.adapter_output_dim, e.vision_output_dim) == (4096, 4096, 4096)
    data = fixture("llama4-scout-17b-16e")
    data["vision_config"] = {**data["vision_config"], "projector_input_dim": 0}
    with pytest.raises(SpecError, match=r"^llama4-scout-17b-16e.json: vision_config: .*projector_input_dim"):
        spec_from_hf_config(data, origin="llama4-scout-17b-16e.json", name="x")


def test_chunked_local_attention_needs_a_chunk() -> None:
    with pytest.raises(SpecError, match="local_attention chunked needs sliding_window"):
        build("llama3-8b").with_overrides(local_attention="chunked")


# --- Gemma 4 (gemma4 / gemma4_text) -----------------------------------------------------------------------------

def _gemma4(name: str = "gemma4-26b-a4b", vision: dict[str, Any] | None = None, **text: Any):
    data = fixture(name)
    data["text_config"] = {k: v for k, v in {**data["text_config"], **text}.items() if v is not _DROP}
    if vision is not None:
        data["vision_config"] = {**data["vision_config"], **vision}
    return spec_from_hf_config(data, origin=f"{name}.json", name=name)


@pytest.mark.parametrize(("name", "decoder", "active"), [
    # the Gemma 4 model card as its listings quote it: 31B "30.7B dense + ~550M vision encoder", 26B-A4B "25.2B
    # total parameters but only 3.8B active"
    ("gemma4-31b", 30.7e9, 30.7e9), ("gemma4-26b-a4b", 25.2e9, 3.8e9)])
def test_gemma4_against_its_model_card(name: str, decoder: float, active: float) -> None:
    from tfcalc.calc.params import count_params

    counts = count_params(_gemma4(name))
    encoder = counts.total["encoder"].total
    assert counts.total_params - encoder == pytest.approx(decoder, rel=0.002)
    assert counts.active_params == pytest.approx(active, rel=0.01)
    assert encoder == pytest.approx(550e6, rel=0.05)


def test_gemma4_full_layers_have_their_own_shape() -> None:
    spec = _gemma4()
    fa = spec.full_attention
    assert (spec.head_dim, spec.num_kv_heads, spec.sliding_window, spec.rope_local_theta) == (256, 8, 1024, 1e4)
    assert (fa.head_dim, fa.num_kv_heads, fa.k_eq_v, fa.partial_rotary_factor, fa.proportional_rope) == (
        512, 2, True, 0.25, True)
    assert spec.num_full_layers == 5 and [i for i in range(30) if not spec.is_sliding_layer(i)] == [5, 11, 17, 23, 29]
    full = spec.full_layer_spec
    assert (full.head_dim, full.num_kv_heads, full.attention_k_eq_v, full.rotary_dim) == (512, 2, True, 128)
    assert spec.rope_theta == 1e6 and spec.rope_scaling is None and spec.rotary_dim == 256
    # numerics: plain-weight RMSNorms, unscaled scores, weightless V-norm, 7 norms beside the experts
    assert (spec.norm_weight_offset, spec.query_pre_attn_scalar, spec.v_norm, spec.norms_per_layer) == (
        0.0, 1.0, True, 7)
    assert spec.moe.dense_mlp_beside and spec.moe.router_scales and spec.moe.normalize_top_k
    dense = _gemma4("gemma4-31b")
    assert dense.moe is None and dense.norms_per_layer == 4 and dense.full_attention.num_kv_heads == 4
    # without attention_k_eq_v the full layers keep num_key_value_heads (Gemma4TextConfig per_layer_config)
    assert _gemma4(attention_k_eq_v=False).full_attention.num_kv_heads == 8


def test_gemma4_default_layer_pattern_ends_on_a_full_layer() -> None:
    spec = _gemma4(layer_types=_DROP, num_hidden_layers=8)
    assert [i for i in range(8) if not spec.is_sliding_layer(i)] == [5, 7]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("hidden_size_per_layer_input", 256, "per-layer input embeddings (the E2B / E4B models) are not supported"),
    ("num_kv_shared_layers", 4, "KV sharing across layers (the E2B / E4B models) are not supported"),
    ("use_bidirectional_attention", "all", "bidirectional text attention"),
    ("rope_parameters", {"full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "factor": 8.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, "scaled RoPE"),
    ("moe_intermediate_size", _DROP, "moe_intermediate_size"),
])
def test_gemma4_what_tfcalc_does_not_model_is_a_one_line_error(field: str, value: object, message: str) -> None:
    with pytest.raises(SpecError) as info:
        _gemma4(**{field: value})
    assert str(info.value).startswith("gemma4-26b-a4b.json: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_gemma4_vision_tower_with_grouped_heads_is_refused() -> None:
    with pytest.raises(SpecError, match=r"^gemma4-31b.json: vision_config: .*grouped or resized attention heads"):
        _gemma4("gemma4-31b", vision={"num_key_value_heads": 4})


def test_glm_4_7_flash_is_deepseek_v3_attention_and_routing_at_glm_sizes() -> None:
    """zai-org/GLM-4.7-Flash (glm4_moe_lite; its card: 30B-A3B): MLA (20 heads, q rank 768, kv rank 512, 192 + 64
    q/k, values of 256), 64 sigmoid-routed experts of 1536 (top 4, one shared, x1.8), one dense layer first, one
    MTP layer not counted. transformers' class lists the dense layers in mlp_layer_types, which wins where given."""
    from tfcalc.calc.params import count_params

    spec = build("glm-4.7-flash")
    counts = count_params(spec)
    assert spec.mla is not None and (spec.mla.q_lora_rank, spec.mla.v_head_dim, spec.num_attention_heads) == (
        768, 256, 20)
    assert spec.moe is not None and (spec.moe.num_experts, spec.moe.experts_per_token) == (64, 4)
    assert spec.moe.dense_layers == (0,) and spec.moe.routed_scaling_factor == 1.8 and spec.num_mtp_layers == 1
    assert 29.5e9 < counts.total_params < 30.5e9 and 3.0e9 < counts.active_params < 4.0e9
    kinds = ["dense", "dense"] + ["sparse"] * 45
    assert build("glm-4.7-flash", mlp_layer_types=kinds).moe.dense_layers == (0, 1)
    with pytest.raises(SpecError, match="^glm-4.7-flash.json: field 'mlp_layer_types' must list 'dense' or 'sparse' "
                                        "for each of the 47 layers"):
        build("glm-4.7-flash", mlp_layer_types=["dense"] * 3)


def test_mimo_v2_flash_layers_of_two_kinds_with_values_narrower_than_keys() -> None:
    """XiaomiMiMo/MiMo-V2-Flash (its card: 309B total, 15B active): 39 sliding layers (window 128 + the query, 8 KV
    heads, a sink per head, RoPE base 10,000) and 9 full ones (4 KV heads, no sinks, base 5,000,000); keys and queries
    of 192 with 64 dimensions turned (0.334 x 192, as int()), values of 128; 256 experts, top 8, the first layer
    dense; its released weights block fp8."""
    from tfcalc.calc.kv_cache import kv_elements_per_token_per_layer
    from tfcalc.calc.params import count_params

    spec = build("mimo-v2-flash")
    full = spec.full_layer_spec
    assert (spec.sliding_window, len(spec.sliding_window_layers), spec.num_full_layers) == (129, 39, 9)
    assert [i for i in range(48) if not spec.is_sliding_layer(i)] == [0, 5, 11, 17, 23, 29, 35, 41, 47]
    assert (spec.num_kv_heads, spec.head_dim, spec.value_head_dim, spec.attention_sinks) == (8, 192, 128, True)
    assert (full.num_kv_heads, full.head_dim, full.value_head_dim, full.attention_sinks) == (4, 192, 128, False)
    assert spec.rotary_dim == full.rotary_dim == 64 and (spec.rope_theta, spec.rope_local_theta) == (5e6, 1e4)
    assert spec.moe is not None and spec.moe.dense_layers == (0,) and spec.moe.num_shared_experts == 0
    assert (kv_elements_per_token_per_layer(spec), kv_elements_per_token_per_layer(spec, sliding=False)) == (
        8 * (192 + 128), 4 * (192 + 128))
    counts = count_params(spec)
    assert 308e9 < counts.total_params < 310e9 and 15.0e9 < counts.active_params < 16.0e9
    assert spec.native_dtype == "fp8_block"


@pytest.mark.parametrize("changes, message", [
    ({"swa_head_dim": 128}, "field 'swa_head_dim' (128) is not supported"),
    ({"swa_num_attention_heads": 32}, "field 'swa_num_attention_heads' (32) is not supported"),
    ({"hybrid_layer_pattern": [0, 1]}, "field 'hybrid_layer_pattern' must hold 0 or 1 for each of the 48 layers"),
    ({"moe_layer_freq": [0, 2]}, "'moe_layer_freq' must mark each of the 48 layers"),
    ({"n_shared_experts": 1}, "shared experts are not supported for MiMo-V2-Flash"),
])
def test_mimo_v2_flash_shapes_tfcalc_does_not_model_are_one_line_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        build("mimo-v2-flash", **changes)
    assert str(info.value).startswith("mimo-v2-flash.json: ") and message in str(info.value)
    assert "\n" not in str(info.value)


# --- Kimi K2.5 / K2.6: a DeepSeek-V3 decoder and MoonViT -----------------------------------------------------------

def _kimi(vision: dict[str, Any] | None = None, **changes: Any):
    data = fixture("kimi-k2.5", **changes)
    if vision is not None:
        data["vision_config"] = {**data["vision_config"], **vision}
    return spec_from_hf_config(data, origin="kimi-k2.5.json", name="kimi-k2.5")


def test_kimi_k25_reads_its_deepseek_v3_decoder_int4_experts_and_moonvit() -> None:
    """moonshotai/Kimi-K2.5: model card 1T total / 32B activated, 384 experts (8 per token, 1 shared), 61 layers, a
    MoonViT encoder; native int4 (QAT) routed experts in symmetric groups of 32 (compressed-tensors, inside
    text_config), attention, shared experts, the dense MLP and the head left bf16 by its ignore list."""
    from tfcalc.calc.params import count_params

    spec = _kimi()
    text = spec_from_hf_config({**fixture("kimi-k2.5")["text_config"], "architectures": ["DeepseekV3ForCausalLM"]},
                               origin="t.json", name="text")
    assert spec.mla is not None and spec.moe is not None and (spec.num_layers, spec.moe.num_experts) == (61, 384)
    assert spec.native_dtype == "experts=int4-g32-sym,default=bf16" and not spec.quantized_weight_exceptions
    assert spec.remote_code and spec.architecture == "KimiK25ForConditionalGeneration"  # --trust-remote-code
    e = spec.encoder
    assert (e.kind, e.hidden_size, e.intermediate_size, e.num_layers, e.patch_size, e.merge_size,
            e.num_position_embeddings) == ("moonvit", 1152, 4304, 27, 14, 2, 64 * 64)
    counts = count_params(spec)
    assert counts.total_params - count_params(text).total_params == counts.total["encoder"].total == 471_143_920
    assert 1.02e12 < counts.total_params < 1.04e12 and 32.0e9 < counts.active_params < 33.5e9


def test_nvidia_kimi_k26_nvfp4_keeps_what_its_exclude_list_names() -> None:
    """nvidia/Kimi-K2.6-NVFP4 (ModelOpt 0.44 config.json): a deepseek_v3 text_config, a vision_config whose
    model_type is empty, and an exclude list naming language_model.model.layers.0*, each layer's self_attn and
    shared_experts, the head, vision_tower* and mm_projector*: the routed experts alone are nvfp4, the cache fp8."""
    text = {k: v for k, v in fixture("kimi-k2.5")["text_config"].items() if k != "quantization_config"}
    layers = [f"language_model.model.layers.{i}.{m}*" for i in range(1, 61)
              for m in ("self_attn", "mlp.shared_experts")]
    quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": {"name": "modelopt", "version": "0.44.0"},
             "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
             "ignore": ["language_model.lm_head", "language_model.model.layers.0*", *layers, "mm_projector*",
                        "vision_tower*"]}
    spec = _kimi(text_config={**text, "model_type": "deepseek_v3"}, quantization_config=quant,
                 vision={"model_type": ""})
    assert (spec.native_dtype, spec.checkpoint_kv_dtype) == ("experts=nvfp4,default=bf16", "fp8")
    assert spec.encoder is not None and spec.encoder.kind == "moonvit"


@pytest.mark.parametrize("vision, message", [
    ({"mm_projector_type": "patchmergerv2"}, "field 'mm_projector_type' 'patchmergerv2' is not supported"),
    ({"norm_type": "rmsnorm"}, "field 'norm_type' 'rmsnorm' is not supported"),
    ({"merge_kernel_size": [2, 1]}, "field 'merge_kernel_size' [2, 1] is not supported"),
    ({"qkv_hidden_size": 1536}, "field 'qkv_hidden_size' (1536) is not supported"),
    ({"mm_hidden_size": 4096}, "field 'mm_hidden_size' (4096) is not the decoder's hidden_size (7168)"),
    ({"model_type": "moonvit"}, "vision_config of model_type kimi_k25_vision"),
])
def test_kimi_k25_towers_tfcalc_does_not_count_are_refused_in_one_line(vision: dict[str, Any], message: str) -> None:
    """Kimi K3's MoonViT (RMSNorms, a 1,536-wide qkv, patchmergerv2) and other variants: refused, not miscounted."""
    with pytest.raises(SpecError) as info:
        _kimi(vision)
    assert str(info.value).startswith("kimi-k2.5.json: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_kimi_k25_text_config_must_be_deepseek_v3() -> None:
    text = fixture("kimi-k2.5")["text_config"]
    with pytest.raises(SpecError, match="reads text_config of model_type deepseek_v3"):
        _kimi(text_config={**text, "model_type": "kimi_linear"})


def test_heads_that_do_not_divide_the_hidden_size_need_a_head_dim(tmp_path: Path) -> None:
    """transformers' head_dim fallback (hidden_size // num_attention_heads) refuses a hidden size the heads do not
    divide ("The hidden size (4100) is not a multiple of the number of attention heads (32)"): so does tfcalc, where
    it floored to 128 and counted a model that cannot be built. A config that gives head_dim is read as written
    (Mistral-Nemo: 32 heads x 128 != 5,120)."""
    data = json.loads((FIXTURE_DIR / "llama3.1-8b.json").read_text())
    with pytest.raises(SpecError, match="hidden_size 4100 is not a multiple of num_attention_heads 32 and no "
                                        "head_dim is given"):
        load_hf_config(write(tmp_path, {**data, "hidden_size": 4100}))
    spec = load_hf_config(write(tmp_path, {**data, "hidden_size": 4100, "head_dim": 128}))
    assert spec.head_dim == 128 and spec.hidden_size == 4100


def test_a_config_of_any_file_name_is_read_as_json(tmp_path: Path) -> None:
    """--config reads JSON whatever the file is called (a pipe, /dev/stdin, a file named "config"): YAML would read a
    JSON number such as 25e-1 as text. Empty and null files say what they hold."""
    data = json.loads((FIXTURE_DIR / "deepseek-v3.json").read_text())
    text = json.dumps({**data, "routed_scaling_factor": 2.5}).replace('"routed_scaling_factor": 2.5',
                                                                       '"routed_scaling_factor": 25e-1')
    bare = tmp_path / "config"
    bare.write_text(text)
    named = tmp_path / "named.json"
    named.write_text(text)
    assert load_hf_config(bare).moe == load_hf_config(named).moe
    assert load_hf_config(bare).moe.routed_scaling_factor == 2.5
    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    with pytest.raises(SpecError, match="empty.json: the file is empty"):
        load_hf_config(empty)
    null = tmp_path / "null.json"
    null.write_text("null")
    with pytest.raises(SpecError, match="got nothing \\(an empty file or null\\)"):
        load_hf_config(null)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(SpecError, match="at the top level, got a list"):
        load_hf_config(listed)


# --- DeepSeek-V4: a window on every layer, CSA / HCA compressed entries, hyper-connections ------------------------

@pytest.mark.parametrize("name, total, active", [("deepseek-v4-flash", "284", "13"), ("deepseek-v4-pro", "1.6", "49")])
def test_deepseek_v4_against_its_model_card(name: str, total: str, active: str) -> None:
    """The card (as featherless.ai and deepseekfr.org quote it): Flash 284B total / 13B activated, Pro 1.6T / 49B.
    The total rounds to the card's figure at its precision (billions for Flash, trillions for Pro); the activated
    figure is the count without the embedding table, rounded."""
    from tfcalc.calc.params import count_params

    counts = count_params(build(name))
    scale = 1e12 if "." in total else 1e9
    assert f"{counts.total_params / scale:.{len(total.partition('.')[2])}f}" == total
    assert f"{(counts.active_params - counts.active['embedding'].total) / 1e9:.0f}" == active


def test_deepseek_v4_flash_layers_experts_and_formats() -> None:
    """deepseek-ai/DeepSeek-V4-Flash's config.json: compress_ratios 0, 0, then 4 / 128 alternating (the 44th entry,
    0, the MTP layer's), MoE on all 43 layers (the first 3 hash-routed), fp8 128 x 128 blocks with expert_dtype fp4:
    MXFP4 experts; RoPE on 64 of 512."""
    spec = build("deepseek-v4-flash")
    ca = spec.compressed_attention
    assert ca is not None and spec.moe is not None
    assert (ca.csa_layers, ca.hca_layers) == (tuple(range(2, 43, 2)), tuple(range(3, 42, 2)))
    assert (spec.num_kv_heads, spec.head_dim, spec.rotary_dim, spec.sliding_window) == (1, 512, 64, 128)
    assert len(spec.sliding_window_layers) == 43 and spec.attention_kind == "CSA/HCA"
    assert (spec.moe.dense_layers, spec.moe.hash_layers, spec.moe.router_scoring) == ((), 3, "sqrtsoftplus")
    assert spec.native_dtype == "experts=mxfp4,default=fp8_block" and spec.num_mtp_layers == 1


def test_deepseek_v4_layer_kinds_follow_transformers() -> None:
    """layer_types as given, else compress_ratios, else DeepseekV4Config's default (2 HCA, then HCA / CSA
    alternating): the same kinds transformers 5.25 derives."""
    from transformers import CONFIG_MAPPING

    for changes in ({"layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                                     "compressed_sparse_attention"]},
                    {"compress_ratios": [128, 0, 4, 128, 0]}, {}):
        data = {k: v for k, v in fixture("deepseek-v4-flash").items() if k != "compress_ratios"}
        data.update(num_hidden_layers=4, **changes)
        spec = spec_from_hf_config(data, origin="v4.json", name="v4")
        hf = CONFIG_MAPPING["deepseek_v4"](**{k: v for k, v in data.items() if k != "model_type"})
        ca = spec.compressed_attention
        assert ca is not None
        kinds = ["compressed_sparse_attention" if i in ca.csa_layers else "heavily_compressed_attention"
                 if i in ca.hca_layers else "sliding_attention" for i in range(4)]
        assert kinds == hf.layer_types, changes


@pytest.mark.parametrize("changes, native", [
    ({"expert_dtype": "fp8"}, "fp8_block"),
    ({"expert_dtype": None}, "fp8_block"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "moe_quant_algo": "NVFP4"}},
     "experts=nvfp4,default=fp8_block"),
])
def test_deepseek_v4_expert_formats(changes: dict[str, Any], native: str) -> None:
    """expert_dtype fp4 (DeepSeek's releases): MXFP4 experts; fp8 or absent (sgl-project's FP8 requantization):
    the checkpoint's format; NVIDIA's moe_quant_algo NVFP4: NVFP4."""
    data = {k: v for k, v in fixture("deepseek-v4-flash", **changes).items() if v is not None}
    assert spec_from_hf_config(data, origin="v4.json", name="v4").native_dtype == native


@pytest.mark.parametrize("changes, message", [
    ({"compress_ratios": [0, 8]}, "field 'compress_ratios' must give 0, 4 or 128 for each of the 43 layers"),
    ({"layer_types": ["full_attention"] * 43}, "field 'layer_types' must name sliding_attention"),
    ({"mlp_layer_types": ["moe", "hash_moe"] + ["moe"] * 41}, "hash-routed layers after a learned-routing one"),
    ({"scoring_func": "tanh"}, "field 'scoring_func' 'tanh' is not supported"),
    ({"expert_dtype": "int4"}, "field 'expert_dtype' 'int4' is not supported"),
    ({"o_groups": 5}, "compressed_attention.o_groups (5) must divide the attention heads (64)"),
])
def test_deepseek_v4_malformed_configs_are_one_line_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        build("deepseek-v4-flash", **changes)
    assert message in str(info.value) and "\n" not in str(info.value)


# A scaled RoPE without a key its type needs: transformers 5.25 refuses the config (KeyError, "Missing required keys in
# `rope_parameters`"), so tfcalc does, in one line naming the key; complete, both accept it.
SMALL_LLAMA = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 4096}
COMPLETE_ROPE = {
    "linear": {"type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [1.0] * 32},
}


@pytest.mark.parametrize("where", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize(("rope_type", "dropped"), [(t, k) for t, scaling in COMPLETE_ROPE.items() for k in scaling
                                                    if k not in ("type", "rope_type")])
def test_scaled_rope_without_a_required_key_is_refused_as_transformers_does(where: str, rope_type: str,
                                                                            dropped: str) -> None:
    transformers = pytest.importorskip("transformers")
    config = {**SMALL_LLAMA, where: COMPLETE_ROPE[rope_type]}
    transformers.LlamaConfig(**json.loads(json.dumps(config)))  # the reference accepts the complete one
    assert spec_from_hf_config(config, origin="config.json", name="small").rope_scaling.rope_type == rope_type
    broken = {**SMALL_LLAMA, where: {k: v for k, v in COMPLETE_ROPE[rope_type].items() if k != dropped}}
    with pytest.raises(KeyError, match=dropped):
        transformers.LlamaConfig(**json.loads(json.dumps(broken)))
    with pytest.raises(SpecError) as caught:
        spec_from_hf_config(broken, origin="config.json", name="small")
    message = str(caught.value)
    assert "\n" not in message and f"'{dropped}'" in message and f"'{where}'" in message and rope_type in message
    with pytest.raises(SpecError, match=f"'{dropped}'"):  # null is no value either
        spec_from_hf_config({**SMALL_LLAMA, where: {**COMPLETE_ROPE[rope_type], dropped: None}},
                            origin="config.json", name="small")
