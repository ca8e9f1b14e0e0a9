"""MoE families read from config.json: ERNIE 4.5 (ernie4_5_moe), Hunyuan-A13B (hunyuan_v1_moe), Granite MoE (granitemoe,
granitemoeshared) and dots.llm1 (dots1) against their model cards, their layer layouts and routing, their refusals,
small variants against transformers on the meta device, and ERNIE's router in the bundled decoder."""

from __future__ import annotations

from typing import Any

import pytest
from hf_fixtures import DROP as _DROP
from hf_fixtures import build, fixture

from tfcalc.calc.params import count_params
from tfcalc.errors import SpecError
from tfcalc.spec.hf_config import spec_from_hf_config
from tfcalc.spec.model import ModelSpec


def _non_embedding_active(spec: ModelSpec) -> int:
    """Active parameters without the embedding table (tfcalc's all_weights_touched counts it whole)."""
    counts = count_params(spec)
    return counts.active_params - counts.total["embedding"].total


# --- model cards ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, total, active, card_excludes_embedding", [
    # tencent/Hunyuan-A13B-Instruct card: "80 billion total parameters and 13 billion active" (tied embedding counted)
    ("hunyuan-a13b", 80e9, 13e9, False),
    # rednote-hilab/dots.llm1.inst card: "14B activated and 142B total parameters"
    ("dots.llm1", 142e9, 14e9, False),
    # ibm-granite/granite-3.0-3b-a800m-instruct card: 3.3B parameters, "# Active Parameters 800M" (no embedding)
    ("granite-3.0-3b-a800m", 3.3e9, 0.8e9, True),
])
def test_totals_and_active_within_two_percent_of_the_cards(name: str, total: float, active: float,
                                                           card_excludes_embedding: bool) -> None:
    spec = build(name)
    counts = count_params(spec)
    assert spec.active_params_convention == "all_weights_touched"
    assert counts.total_params == pytest.approx(total, rel=0.02)
    got = _non_embedding_active(spec) if card_excludes_embedding else counts.active_params
    assert got == pytest.approx(active, rel=0.02)


def test_ernie_against_its_card_which_rounds_down_to_whole_billions() -> None:
    """baidu/ERNIE-4.5-21B-A3B-PT card: 21B total, 3B activated, both truncated to whole billions (the checkpoint holds
    21.8B, 21,825,437,888 here as in transformers): the total and the active count without the embedding table
    truncate to the card's figures; with it (all_weights_touched) the active count is 3.35B."""
    spec = build("ernie4.5-21b-a3b")
    counts = count_params(spec)
    assert counts.total_params == 21_825_437_888
    assert int(counts.total_params // 1e9) == 21 and int(_non_embedding_active(spec) // 1e9) == 3
    assert _non_embedding_active(spec) == pytest.approx(3e9, rel=0.03)
    assert 3.3e9 < counts.active_params < 3.4e9


# --- layer layouts and routing ------------------------------------------------------------------------------------

def test_ernie_moe_layers_follow_start_interval_and_end_index() -> None:
    spec = build("ernie4.5-21b-a3b")
    assert spec.moe.dense_layers == (0,) and spec.num_moe_layers == 27  # moe_layer_start_index 1, end -1 (last)
    assert (spec.moe.num_experts, spec.moe.experts_per_token, spec.moe.expert_intermediate_size) == (64, 6, 1536)
    assert (spec.moe.num_shared_experts, spec.moe.shared_expert_intermediate_size) == (2, 1536)
    assert spec.moe.router_scoring == "softmax" and spec.moe.router_score_correction_bias and spec.moe.normalize_top_k
    assert spec.rope_interleaved and spec.rope_theta == 500000 and spec.tie_word_embeddings and spec.num_mtp_layers == 1
    assert not (spec.qkv_bias or spec.o_bias or spec.mlp_bias or spec.qk_norm)
    moe = [i for i in range(28) if build("ernie4.5-21b-a3b", moe_layer_start_index=3, moe_layer_interval=2,
                                            moe_layer_end_index=20).is_moe_layer(i)]
    assert moe == [3, 5, 7, 9, 11, 13, 15, 17, 19]  # (i + 1) % 2 == 0 within 3..20
    assert build("ernie4.5-21b-a3b", moe_layer_end_index=None).num_moe_layers == 27
    assert build("ernie4.5-21b-a3b", moe_layer_start_index=28).moe is None  # no MoE layer: dense MLPs everywhere
    assert build("ernie4.5-21b-a3b", moe_num_shared_experts=0).moe.num_shared_experts == 0


def test_hunyuan_reads_one_shared_mlp_qk_norm_and_ntk_alpha_rope() -> None:
    spec = build("hunyuan-a13b")
    assert spec.num_moe_layers == 32 and spec.moe.dense_layers == ()
    assert (spec.moe.num_experts, spec.moe.experts_per_token, spec.moe.expert_intermediate_size) == (64, 8, 3072)
    assert (spec.moe.num_shared_experts, spec.moe.shared_expert_intermediate_size) == (1, 3072)
    assert spec.moe.router_scoring == "softmax" and spec.moe.normalize_top_k and not spec.moe.router_bias
    assert spec.qk_norm and (spec.num_kv_heads, spec.head_dim) == (8, 128) and spec.tie_word_embeddings
    # rope_scaling {"type": "dynamic", "alpha": 1000}: a fixed base 10000 x 1000^(128 / 126), no scaling left
    assert spec.rope_scaling is None and spec.rope_theta == pytest.approx(10000.0 * 1000.0 ** (128 / 126))
    assert build("hunyuan-a13b", rope_scaling=None).rope_theta == 10000.0


def test_hunyuan_remote_code_config_is_read_by_its_architecture() -> None:
    """Tencent's own release (model_type hunyuan, an auto_map, attention_head_dim but no head_dim) is read as
    hunyuan_v1_moe by its architectures[0], as vLLM picks the class, and sizes the same model."""
    data = fixture("hunyuan-a13b", model_type="hunyuan", head_dim=_DROP)
    spec = spec_from_hf_config(data, origin="hunyuan.json", name="hunyuan")
    assert spec.remote_code and spec.head_dim == 128
    assert count_params(spec).total_params == count_params(build("hunyuan-a13b")).total_params


def test_granite_moe_every_layer_and_its_attention_multiplier() -> None:
    spec = build("granite-3.0-3b-a800m")
    assert spec.num_moe_layers == 32 and spec.moe.num_shared_experts == 0
    assert (spec.moe.num_experts, spec.moe.experts_per_token, spec.moe.expert_intermediate_size) == (40, 8, 512)
    assert spec.moe.router_scoring == "softmax" and spec.moe.normalize_top_k
    assert spec.query_pre_attn_scalar == 4096.0  # attention_multiplier 1/64 = 4096^-1/2 in place of head_dim^-1/2
    assert (spec.head_dim, spec.num_kv_heads) == (64, 8) and spec.tie_word_embeddings
    shared = build("synthetic-granitemoeshared")
    assert (shared.moe.num_shared_experts, shared.moe.shared_expert_intermediate_size) == (1, 1024)
    assert build("synthetic-granitemoeshared", shared_intermediate_size=0).moe.num_shared_experts == 0


def test_dots1_reads_deepseek_v3_routing_with_plain_attention() -> None:
    spec = build("dots.llm1")
    assert spec.mla is None and spec.attention_kind == "MHA" and spec.qk_norm and spec.head_dim == 128
    assert spec.moe.dense_layers == (0,) and spec.num_moe_layers == 61
    assert (spec.moe.num_experts, spec.moe.experts_per_token, spec.moe.expert_intermediate_size) == (128, 6, 1408)
    assert (spec.moe.num_shared_experts, spec.moe.shared_expert_intermediate_size) == (2, 1408)
    assert spec.moe.router_scoring == "sigmoid" and spec.moe.router_score_correction_bias
    assert spec.moe.routed_scaling_factor == 2.5 and spec.moe.normalize_top_k and spec.moe.expert_groups == 1
    assert spec.sliding_window is None and not spec.tie_word_embeddings
    windowed = build("dots.llm1", sliding_window=4096, max_window_layers=60)
    assert windowed.sliding_window == 4096 and windowed.sliding_window_layers == (60, 61)


# --- refusals: one line naming the file and the field ------------------------------------------------------------

@pytest.mark.parametrize("name, changes, message", [
    ("dots.llm1", {"n_routed_experts": _DROP}, r"missing required field 'n_routed_experts' \(model_type dots1\)"),
    ("dots.llm1", {"n_shared_experts": None}, "missing required field 'n_shared_experts'"),
    ("ernie4.5-21b-a3b", {"hidden_size": _DROP}, r"missing required field 'hidden_size' \(model_type ernie4_5_moe\)"),
    ("ernie4.5-21b-a3b", {"use_bias": True}, "'use_bias' true .* lm_head"),
    ("ernie4.5-21b-a3b", {"moe_num_experts": [64, 64]}, "'moe_num_experts' must be an integer"),
    ("hunyuan-a13b", {"intermediate_size": _DROP}, "missing required field 'intermediate_size'"),
    ("hunyuan-a13b", {"use_cla": True}, "'use_cla' true .*cross-layer KV sharing"),
    ("hunyuan-a13b", {"use_mixed_mlp_moe": False}, "'use_mixed_mlp_moe' false"),
    ("hunyuan-a13b", {"moe_topk": [8] * 31 + [4]}, "'moe_topk' must hold one value or the same value"),
    ("hunyuan-a13b", {"moe_intermediate_size": 1536}, r"'moe_intermediate_size' \(1536\) is not supported"),
    ("hunyuan-a13b", {"num_shared_expert": 2}, "'num_shared_expert' is not supported"),
    ("hunyuan-a13b", {"attention_head_dim": 64}, r"'attention_head_dim' \(64\) is not the head_dim \(128\)"),
    ("granite-3.0-3b-a800m", {"num_local_experts": 4, "num_experts_per_tok": 8}, "experts_per_token"),
    ("granite-3.0-3b-a800m", {"attention_multiplier": "x"}, "'attention_multiplier' must be a number"),
])
def test_unsupported_or_missing_fields_are_one_line(name: str, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        build(name, **changes)
    assert str(err.value).startswith(f"{name}.json: ") and "\n" not in str(err.value)


# --- small variants against transformers ---------------------------------------------------------------------------

_SMALL = {"vocab_size": 512, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 96, "num_hidden_layers": 6}
_VARIANTS = {
    "ernie-interval-end-no-shared": ("ernie4.5-21b-a3b", {"moe_layer_start_index": 1, "moe_layer_interval": 2,
                                                          "moe_layer_end_index": 4, "moe_num_shared_experts": 0,
                                                          "moe_intermediate_size": 32, "moe_num_experts": 8}),
    "ernie-untied-three-shared": ("ernie4.5-21b-a3b", {"tie_word_embeddings": False, "moe_num_shared_experts": 3,
                                                       "moe_intermediate_size": 16, "moe_num_experts": 4, "moe_k": 2}),
    "hunyuan-attention-bias": ("hunyuan-a13b", {"attention_bias": True, "num_experts": 4, "moe_topk": 2,
                                                "head_dim": _DROP, "attention_head_dim": 16, "pad_token_id": None,
                                                "moe_intermediate_size": _DROP, "num_shared_expert": _DROP}),
    "granite-attention-bias": ("granite-3.0-3b-a800m", {"attention_bias": True, "tie_word_embeddings": False,
                                                        "num_local_experts": 4, "num_experts_per_tok": 2}),
    "granite-shared": ("synthetic-granitemoeshared", {"shared_intermediate_size": 48, "num_local_experts": 4,
                                                      "num_experts_per_tok": 2}),
    "dots1-two-dense-bias-windows": ("dots.llm1", {"first_k_dense_replace": 2, "attention_bias": True,
                                                   "sliding_window": 16, "max_window_layers": 3,
                                                   "n_routed_experts": 8, "n_shared_experts": 1,
                                                   "moe_intermediate_size": 32}),
}


@pytest.mark.parametrize("case", sorted(_VARIANTS))
def test_small_variants_equal_transformers(case: str) -> None:
    """Shapes no release has (biases, sparser MoE layouts, untied heads): tfcalc's count equals transformers' parameters
    and persistent buffers (DeepSeek-style score-correction biases), and the MoE layers are the ones it builds."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    name, changes = _VARIANTS[case]
    cfg = fixture(name, **_SMALL, **changes)
    spec = spec_from_hf_config(cfg, origin=case, name=case)
    cfg = {k: v for k, v in cfg.items() if k not in ("_comment", "auto_map")}
    if name == "hunyuan-a13b":  # transformers' port needs head_dim (the release's attention_head_dim is legacy)
        cfg["head_dim"] = cfg["attention_head_dim"]
    model_type = cfg.pop("model_type")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **cfg))
    held = sum(t.numel() for n, t in model.state_dict().items()
               if n not in dict(model.named_parameters(remove_duplicate=False)))
    assert sum(p.numel() for p in model.parameters()) + held == count_params(spec).total_params
    layers = model.model.layers
    built = [i for i, layer in enumerate(layers)
             if hasattr(getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None), "experts")]
    assert built == [i for i in range(spec.num_layers) if spec.is_moe_layer(i)]


# --- the bundled decoder -----------------------------------------------------------------------------------------

def test_ernie_router_in_the_bundled_decoder_equals_transformers() -> None:
    """ERNIE's softmax router whose choice adds moe_statics' score-correction bias, renormalised, plus two shared
    experts: the bundled decoder's MoE block gives transformers' Ernie4_5_MoeSparseMoeBlock output with the same
    weights (a bias large enough to change the choice)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeSparseMoeBlock

    from tfcalc.model.layers import MoE

    cfg = fixture("ernie4.5-21b-a3b", **_SMALL, moe_num_experts=8, moe_k=2, moe_intermediate_size=16)
    spec = spec_from_hf_config(cfg, origin="ernie", name="ernie")
    torch.manual_seed(0)
    ours = MoE(spec).float()
    cfg = {k: v for k, v in cfg.items() if k not in ("_comment", "model_type")}
    theirs = Ernie4_5_MoeSparseMoeBlock(transformers.AutoConfig.for_model("ernie4_5_moe", **cfg)).float()
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        ours.score_bias.copy_(torch.linspace(-0.2, 0.2, 8))
        theirs.gate.weight.copy_(ours.router.weight)
        theirs.gate.moe_statics.e_score_correction_bias.copy_(ours.score_bias[None])
        theirs.experts.gate_up_proj.copy_(ours.w_in)
        theirs.experts.down_proj.copy_(ours.w_out)
        gate, up = ours.shared.w_in.weight.chunk(2)
        theirs.shared_experts.gate_proj.weight.copy_(gate)
        theirs.shared_experts.up_proj.weight.copy_(up)
        theirs.shared_experts.down_proj.weight.copy_(ours.shared.w_out.weight)
        x = torch.randn(2, 5, spec.hidden_size)
        assert torch.allclose(ours(x), theirs(x), atol=1e-5)
