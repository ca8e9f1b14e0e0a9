"""The bundled model presets: they load, their parameter counts match the sourced configs, and every
number in them names its source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tfcalc.calc.params import ParamCounts, count_params
from tfcalc.spec.presets import load_model, load_preset_document, preset_names

MODEL_PRESETS = {
    "llama3-8b", "llama3.1-8b", "llama3-70b", "llama3.1-405b", "llama3.2-1b", "llama3.2-3b",
    "mistral-7b", "mixtral-8x7b", "mixtral-8x22b",
    "qwen2.5-7b", "qwen2.5-72b", "qwen3-30b-a3b", "qwen3-235b-a22b",
    "gemma2-9b", "gemma2-27b", "phi3-mini",
    "gpt-oss-20b", "gpt-oss-120b", "deepseek-v3", "glm-4.6", "glm-4.5-air", "minimax-m2.5", "gemma3-27b",
    "qwen3-next-80b-a3b", "qwen3.5-27b", "qwen3.5-35b-a3b", "qwen3.5-122b-a10b", "qwen3.5-397b-a17b",
    "llama4-scout-17b-16e", "llama4-maverick-17b-128e", "gemma4-31b", "gemma4-26b-a4b", "deepseek-v3.2", "glm-5",
    "nemotron-3-nano-30b-a3b", "nemotron-h-56b", "kimi-k2.5", "mimo-v2-flash", "deepseek-v4-flash", "deepseek-v4-pro",
    "qwen3-8b", "qwen3-32b", "qwen3-coder-480b-a35b", "kimi-k2", "nemotron-3-super-120b-a12b", "mistral-small-3.2-24b",
    "mistral-nemo-12b", "minimax-m2.7", "qwen3-14b", "qwen3-4b", "qwen3-1.7b", "qwen3-0.6b", "phi-4", "qwen2.5-32b",
    "qwen2.5-14b", "minimax-m3", "kimi-linear-48b-a3b", "llama-3.3-nemotron-super-49b", "nemotron-3-ultra-550b-a55b",
    "glm-5.2",
}
# MoE presets without a derived.yaml entry: equal to their config.json and to transformers in every component
# (tests/calc/test_params_hf_parity.py) and within 1 % of their cards' totals (tests/spec/test_hf_config.py).
MOE_FROM_CONFIG = {"glm-4.6", "glm-4.5-air", "minimax-m2.5", "qwen3-next-80b-a3b", "qwen3.5-35b-a3b",
                   "qwen3.5-122b-a10b", "qwen3.5-397b-a17b", "llama4-scout-17b-16e", "llama4-maverick-17b-128e",
                   "gemma4-26b-a4b", "deepseek-v3.2", "glm-5", "nemotron-3-nano-30b-a3b", "kimi-k2.5",
                   "mimo-v2-flash", "deepseek-v4-flash", "deepseek-v4-pro", "qwen3-coder-480b-a35b", "kimi-k2",
                   "nemotron-3-super-120b-a12b", "minimax-m2.7", "minimax-m3",
                   "kimi-linear-48b-a3b", "nemotron-3-ultra-550b-a55b", "glm-5.2"}
# a multimodal preset: its vision encoder is counted, never active for text tokens (tests/spec/test_hf_config.py)
WITH_ENCODER = {"gemma3-27b", "qwen3.5-27b", "qwen3.5-35b-a3b", "qwen3.5-122b-a10b", "qwen3.5-397b-a17b",
                "llama4-scout-17b-16e", "llama4-maverick-17b-128e", "gemma4-31b", "gemma4-26b-a4b", "kimi-k2.5",
                "mistral-small-3.2-24b"}

# Exact counts from docs/research/derived.yaml: recomputed by docs/research/derive.py from the sourced
# configs in docs/research/facts.yaml (every weight incl. norms and biases, a tied embedding counted once). They are not
# published figures. derived.yaml names: llama-3-8b, llama-3.1-70b, llama-3.1-405b, llama-3.2-1b,
# llama-3.2-3b, mistral-7b-v0.1, gemma-2-9b, gemma-2-27b, phi-3-mini-4k; the rest match the preset names.
DERIVED_TOTAL = {
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "llama3.2-1b": 1_235_814_400,
    "llama3.2-3b": 3_212_749_824,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "mixtral-8x22b": 140_620_634_112,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-72b": 72_706_203_648,
    "qwen3-30b-a3b": 30_532_122_624,
    "qwen3-235b-a22b": 235_093_634_560,
    "gemma2-9b": 9_241_705_984,
    "gemma2-27b": 27_227_128_320,
    "deepseek-v3": 671_026_419_200,
    "phi3-mini": 3_821_079_552,
    "gpt-oss-120b": 116_829_156_672,
    "gpt-oss-20b": 20_914_757_184,
}

# derived.yaml active counts: active_params_incl_embed_and_head (Mixtral, Qwen3, DeepSeek cards count
# the embedding) except gpt-oss, whose card excludes the input embedding (active_params_excl_input_embedding).
DERIVED_ACTIVE = {
    "mixtral-8x7b": 12_879_925_248,
    "mixtral-8x22b": 39_152_031_744,
    "qwen3-30b-a3b": 3_353_032_704,
    "qwen3-235b-a22b": 22_190_763_520,
    "deepseek-v3": 37_552_297_472,
    "gpt-oss-120b": 5_132_849_472,  # excl. input embedding
    "gpt-oss-20b": 3_608_307_264,  # excl. input embedding
}

# Raw preset keys whose values are names, not numbers; they need no source entry for test 4.
STRING_FIELDS = {"activation", "ffn_kind", "norm_kind", "native_dtype", "active_params_convention",
                 "rope_scaling.rope_type", "sliding_window_layers", "moe.dense_layers"}
DOC_FIELDS = {"display_name", "sources"}


def test_preset_names_are_exactly_the_bundled_models() -> None:
    assert set(preset_names("model")) == MODEL_PRESETS


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_preset_loads(name: str) -> None:
    spec = load_model(name)
    assert spec.name == name
    assert isinstance(load_preset_document("model", name)["display_name"], str)


@pytest.mark.parametrize("name", sorted(DERIVED_TOTAL))
def test_total_params_match_derived(name: str) -> None:
    assert count_params(load_model(name)).total_params == DERIVED_TOTAL[name]


@pytest.mark.parametrize("name", sorted(DERIVED_ACTIVE))
def test_active_params_match_derived(name: str) -> None:
    assert count_params(load_model(name)).active_params == DERIVED_ACTIVE[name]


def test_dense_models_have_active_equal_total() -> None:
    for name in sorted(MODEL_PRESETS - set(DERIVED_ACTIVE) - MOE_FROM_CONFIG - WITH_ENCODER):
        counts = count_params(load_model(name))
        assert counts.active_params == counts.total_params, name


def _billions(n: int, digits: int) -> float:
    return round(n / 1e9, digits)


def _embedding_tables(counts: ParamCounts) -> int:
    """The input embedding and the output head (one table when tied): what a card's non-embedding count leaves out."""
    return counts.total["embedding"].total + counts.total["lm_head"].total


def test_published_headline_figures() -> None:
    mixtral = count_params(load_model("mixtral-8x7b"))
    # mistral.ai/news/mixtral-of-experts: "46.7B total parameters but only uses 12.9B parameters per token"
    assert _billions(mixtral.total_params, 1) == 46.7
    assert _billions(mixtral.active_params, 1) == 12.9

    deepseek = count_params(load_model("deepseek-v3"))
    # deepseek-ai/DeepSeek-V3 README: "671B total parameters with 37B activated for each token"
    # (README_WEIGHTS.md says 36.7B activated, under a counting convention not spelled out, hence the range)
    assert _billions(deepseek.total_params, 0) == 671
    assert 36.5e9 <= deepseek.active_params <= 38e9

    qwen3 = count_params(load_model("qwen3-235b-a22b"))
    # QwenLM/Qwen3 Qwen3_Technical_Report.pdf: "a total of 235B parameters with 22B activated ones"
    assert _billions(qwen3.total_params, 0) == 235
    assert _billions(qwen3.active_params, 0) == 22

    gpt_oss = count_params(load_model("gpt-oss-120b"))
    # gpt-oss model card arXiv:2508.10925: 116.8B total, 5.1B active (input embedding excluded)
    assert _billions(gpt_oss.total_params, 1) == 116.8
    assert _billions(gpt_oss.active_params, 1) == 5.1

    # Hugging Face Hub safetensors parameter count shown for meta-llama/Meta-Llama-3-8B: 8.03B
    # (docs/research/facts.yaml published_total_params_note; the model card says 8B)
    assert _billions(count_params(load_model("llama3-8b")).total_params, 2) == 8.03

    # Qwen/Qwen3-8B model card: "Number of Parameters: 8.2B", "Number of Paramaters (Non-Embedding): 6.95B"
    qwen3_8b = count_params(load_model("qwen3-8b"))
    assert _billions(qwen3_8b.total_params, 1) == 8.2
    assert _billions(qwen3_8b.total_params - _embedding_tables(qwen3_8b), 2) == 6.95
    # Qwen3-32B: 32.8B parameters (its card's figure as apxml.com and grokipedia.com quote it)
    assert _billions(count_params(load_model("qwen3-32b")).total_params, 1) == 32.8
    # Qwen3-Coder-480B-A35B-Instruct: 480B total, 35B active
    coder = count_params(load_model("qwen3-coder-480b-a35b"))
    assert (_billions(coder.total_params, 0), _billions(coder.active_params, 0)) == (480, 35)
    # moonshotai/Kimi-K2-Instruct card: "Total Parameters 1T", "Activated Parameters 32B" (32.9B with the embedding
    # row and lm_head, 31.7B without the embedding row: the card's figures are whole, hence the truncation)
    kimi = count_params(load_model("kimi-k2"))
    assert round(kimi.total_params / 1e12) == 1 and int(kimi.active_params / 1e9) == 32
    # research.nvidia.com Nemotron-3-Super page: 120B total, 12B active (120.6B and 12.7B as quoted to one decimal)
    super_ = count_params(load_model("nemotron-3-super-120b-a12b"))
    assert (int(super_.total_params / 1e8), int(super_.active_params / 1e8)) == (1206, 127)
    # mistralai Mistral Small 3.1 / 3.2 cards: 24 billion parameters (decoder and Pixtral encoder);
    # mistral.ai/news/mistral-nemo: "a 12B model"
    assert _billions(count_params(load_model("mistral-small-3.2-24b")).total_params, 0) == 24
    assert _billions(count_params(load_model("mistral-nemo-12b")).total_params, 0) == 12
    # Hub safetensors count for MiniMaxAI/MiniMax-M2.7: 229B; the M2 family's 10B activated (without the two tables)
    minimax = count_params(load_model("minimax-m2.7"))
    assert _billions(minimax.total_params, 0) == 229
    assert _billions(minimax.active_params - _embedding_tables(minimax), 0) == 10


@pytest.mark.parametrize(("name", "total", "non_embedding"), [
    # Qwen/Qwen3-* model cards, Model Overview: "Number of Parameters" and "Number of Paramaters (Non-Embedding)"
    ("qwen3-14b", 14.8, 13.2),
    ("qwen3-4b", 4.0, 3.6),
    ("qwen3-1.7b", 1.7, 1.4),
    ("qwen3-0.6b", 0.6, 0.44),
])
def test_qwen3_dense_cards(name: str, total: float, non_embedding: float) -> None:
    counts = count_params(load_model(name))
    assert _billions(counts.total_params, 1) == total
    assert _billions(counts.total_params - _embedding_tables(counts), 2 if non_embedding < 1 else 1) == non_embedding


def test_phi4_qwen25_minimax_m3_and_kimi_linear_cards() -> None:
    # Phi-4 Technical Report arXiv:2412.08905: "phi-4, a 14-billion parameter language model"
    assert int(count_params(load_model("phi-4")).total_params / 1e9) == 14
    # Qwen2.5-14B card "Number of Parameters: 14.7B" (truncated: the count is 14.77B)
    assert int(count_params(load_model("qwen2.5-14b")).total_params / 1e8) == 147
    # Qwen2.5-32B card "Number of Parameters: 32.5B": the exact count of its config (32.76B, equal to transformers')
    # is 0.8 % over it
    assert abs(count_params(load_model("qwen2.5-32b")).total_params / 32.5e9 - 1) < 0.01
    # MiniMaxAI/MiniMax-M3 card: "Total Parameters ~428B", "Activated Parameters ~23B" (without the embedding row and
    # the output head)
    m3 = count_params(load_model("minimax-m3"))
    assert abs(m3.total_params / 428e9 - 1) < 0.01
    assert abs((m3.active_params - _embedding_tables(m3)) / 23e9 - 1) < 0.03
    # moonshotai/Kimi-Linear-48B-A3B-Instruct: its safetensors index totals 49,122,681,728 (the card: 48B, 3B activated)
    kimi_linear = count_params(load_model("kimi-linear-48b-a3b"))
    assert kimi_linear.total_params == 49_122_681_728 and round(kimi_linear.active_params / 1e9) == 3


def test_nemotron_3_ultra_and_glm_5_2_cards() -> None:
    """Nemotron 3 Ultra, arXiv:2606.15007: "550 billion total and 55 billion active" (549.31B and 56.06B with the
    embedding row and lm_head, 53.91B without: the 55B lies between). GLM-5.2's card: 744B-A40B; the Hub's 753B
    safetensors count holds the MTP layer, one more MoE layer of the decoder's own shape."""
    ultra = count_params(load_model("nemotron-3-ultra-550b-a55b"))
    assert round(ultra.total_params / 1e9) == 549 and abs(ultra.total_params / 550e9 - 1) < 0.002
    assert ultra.active_params - _embedding_tables(ultra) < 55e9 < ultra.active_params
    glm = load_model("glm-5.2")
    counts = count_params(glm)
    assert abs(counts.total_params / 744e9 - 1) < 0.001
    assert round((counts.active_params - _embedding_tables(counts)) / 1e9) == 39 and round(
        counts.active_params / 1e9) == 41  # "A40B" lies between
    assert round(count_params(glm.with_overrides(layers=glm.num_layers + 1)).total_params / 1e9) == 753


def test_nemotron_super_49b_card() -> None:
    """The Hub's safetensors count for nvidia/Llama-3_3-Nemotron-Super-49B-v1: 49.87B (the card's text: 49B); dense,
    every weight touched per token."""
    counts = count_params(load_model("llama-3.3-nemotron-super-49b"))
    assert round(counts.total_params / 1e9, 2) == 49.87 and counts.active_params == counts.total_params


@pytest.mark.parametrize(("name", "non_embedding"), [
    # Gemma 2 paper arXiv:2408.00118 Table 2, non-embedding parameters
    ("gemma2-9b", 8_324_201_984),
    ("gemma2-27b", 26_047_480_320),
])
def test_gemma2_non_embedding_params_match_paper(name: str, non_embedding: int) -> None:
    counts = count_params(load_model(name))
    assert counts.total_params - _embedding_tables(counts) == non_embedding


def _walk(mapping: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) for every leaf of a nested mapping."""
    leaves: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            leaves.extend(_walk(value, f"{dotted}."))
        else:
            leaves.append((dotted, value))
    return leaves


def _sourced_keys(sources: dict[str, str]) -> set[str]:
    return {key.strip() for keys in sources for key in keys.split(",")}


def _is_sourced(field: str, sourced: set[str]) -> bool:
    """Named itself, or a parent mapping is named (``rope_scaling`` covers ``rope_scaling.factor``)."""
    parts = field.split(".")
    return any(".".join(parts[:i]) in sourced for i in range(1, len(parts) + 1))


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_every_number_and_flag_names_a_source(name: str) -> None:
    document = load_preset_document("model", name)
    sources = document.get("sources")
    assert isinstance(sources, dict) and sources, f"{name}: no sources mapping"
    assert all(isinstance(text, str) and text.strip() for text in sources.values()), f"{name}: empty source"
    sourced = _sourced_keys(sources)
    body = {k: v for k, v in document.items() if k not in DOC_FIELDS}
    unsourced = [
        field for field, value in _walk(body)
        if field not in STRING_FIELDS and isinstance(value, (bool, int, float))
        and not _is_sourced(field, sourced)
    ]
    assert not unsourced, f"{name}: values without a sources entry: {unsourced}"


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_published_figures_name_a_source(name: str) -> None:
    document = load_preset_document("model", name)
    sourced = _sourced_keys(document["sources"])
    published = [f"published.{key}" for key in document.get("published", {})]
    assert published, f"{name}: no published figures"
    assert [f for f in published if not _is_sourced(f, sourced)] == []


@pytest.mark.parametrize("name", ["gemma2-9b", "gemma2-27b", "qwen3-30b-a3b", "gpt-oss-120b", "qwen3-32b",
                                  "qwen3-coder-480b-a35b", "mistral-nemo-12b", "mistral-small-3.2-24b"])
def test_head_dim_is_not_hidden_over_heads(name: str) -> None:
    spec = load_model(name)
    assert spec.head_dim * spec.num_attention_heads != spec.hidden_size


@pytest.mark.parametrize("name", ["gemma2-9b", "gemma2-27b"])
def test_gemma2_even_layers_slide(name: str) -> None:
    spec = load_model(name)
    assert spec.sliding_window == 4096
    assert spec.sliding_window_layers == tuple(range(0, spec.num_layers, 2))


def test_mistral_slides_on_every_layer() -> None:
    spec = load_model("mistral-7b")
    assert spec.sliding_window == 4096
    assert spec.sliding_window_layers == tuple(range(32))


@pytest.mark.parametrize(("name", "kind"), [
    ("phi3-mini", "MHA"),
    ("llama3-70b", "GQA"),
    ("deepseek-v3", "MLA"),
    ("kimi-k2", "MLA"),
    ("qwen3-32b", "GQA"),
])
def test_attention_kind(name: str, kind: str) -> None:
    assert load_model(name).attention_kind == kind


def test_model_facts() -> None:
    qwen25 = load_model("qwen2.5-7b")
    assert (qwen25.qkv_bias, qwen25.o_bias) == (True, False)
    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-coder-480b-a35b"):
        spec = load_model(name)
        assert spec.moe is not None
        assert spec.qk_norm and spec.moe.normalize_top_k
        assert spec.moe.num_shared_experts == 0 and spec.num_moe_layers == spec.num_layers
    for name in ("gemma2-9b", "gemma2-27b"):
        spec = load_model(name)
        assert spec.tie_word_embeddings and spec.norms_per_layer == 4
        assert (spec.ffn_kind, spec.activation, spec.max_context) == ("gated", "gelu_tanh", 8192)
    for name in ("mixtral-8x7b", "mixtral-8x22b"):
        spec = load_model(name)
        assert spec.moe is not None and spec.sliding_window is None and not spec.moe.router_bias
        assert (spec.moe.num_experts, spec.moe.experts_per_token, spec.moe.num_shared_experts) == (8, 2, 0)
    for name in ("llama3.2-1b", "llama3.2-3b"):
        spec = load_model(name)
        assert spec.tie_word_embeddings and spec.rope_scaling is not None
        assert (spec.rope_scaling.rope_type, spec.rope_scaling.factor) == ("llama3", 32.0)
    llama3 = load_model("llama3-8b")
    assert llama3.max_context == 8192 and llama3.rope_scaling is None
    llama405 = load_model("llama3.1-405b")
    assert llama405.max_context == 131072 and llama405.rope_scaling is not None
    assert (llama405.rope_scaling.rope_type, llama405.rope_scaling.factor) == ("llama3", 8.0)
    phi3 = load_model("phi3-mini")
    assert (phi3.head_dim, phi3.sliding_window, phi3.max_context) == (96, 2047, 4096)
    assert phi3.sliding_window_layers == tuple(range(phi3.num_layers))
    small, large = load_model("gpt-oss-20b"), load_model("gpt-oss-120b")
    assert small.moe is not None and large.moe is not None
    assert (small.num_layers, small.moe.num_experts, small.moe.experts_per_token) == (24, 32, 4)
    assert small.native_dtype == large.native_dtype
    assert small.active_params_convention == large.active_params_convention == "excludes_input_embedding"


def test_every_alias_resolves_uniquely() -> None:
    """Aliases are data in the presets: each names exactly one preset of one kind, in any case, and none is
    another preset's name."""
    from tfcalc.spec.presets import PRESET_KINDS, find_preset, preset_aliases

    owners: dict[str, tuple[str, str]] = {}
    for kind in PRESET_KINDS:
        names = set(preset_names(kind))
        for name in names:
            assert find_preset(kind, name.upper()) == name
            for alias in load_preset_document(kind, name).get("aliases") or []:
                key = alias.lower()
                assert key not in owners and key not in names, f"alias {alias} of {name} is taken: {owners.get(key)}"
                owners[key] = (kind, name)
                assert find_preset(kind, alias) == name and find_preset(kind, alias.upper()) == name
                other = [k for k in PRESET_KINDS if k != kind and find_preset(k, alias) is not None]
                assert other == [], f"alias {alias} also names a {other} preset"
        assert set(preset_aliases(kind).values()) <= names
    assert owners["meta-llama/llama-3.1-70b"] == ("model", "llama3-70b")
    assert len(owners) >= 18


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_the_checkpoint_to_serve_is_one_of_the_aliases_and_sourced(name: str) -> None:
    """hf_repo names the checkpoint a serving engine loads (tfcalc capacity's launch lines): a repository id among
    the preset's aliases (so ``-p HF_REPO`` is this preset), with its reason in the sources."""
    document = load_preset_document("model", name)
    repo = document["hf_repo"]
    assert "/" in repo and repo in document["aliases"], f"{name}: hf_repo {repo} is not one of its aliases"
    assert "hf_repo" in _sourced_keys(document["sources"])
    assert load_model(name).hf_repo == repo
    assert load_model(repo.upper()).hf_repo == repo  # named by it: the id as the preset spells it


def test_a_repository_id_alias_is_the_checkpoint_named() -> None:
    assert load_model("meta-llama/Meta-Llama-3.1-70B").hf_repo == "meta-llama/Meta-Llama-3.1-70B"
    assert load_model("llama-3.1-70b").hf_repo == "meta-llama/Llama-3.3-70B-Instruct"  # a name, not a repository


def test_llama_versions_resolve_to_their_own_presets() -> None:
    """Llama 3.1 8B (128k, llama3 RoPE scaling) and Llama 3 8B (8k, none) share shapes, not presets."""
    from tfcalc.spec.presets import find_preset

    for name in ("llama3.1-8b", "Llama-3.1-8B", "meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"):
        assert find_preset("model", name) == "llama3.1-8b", name
    for name in ("llama3-8b", "llama3.0-8b", "meta-llama/Meta-Llama-3-8B"):
        assert find_preset("model", name) == "llama3-8b", name
    new, old = load_model("llama3.1-8b"), load_model("llama3-8b")
    assert (new.max_context, old.max_context) == (131072, 8192) and old.rope_scaling is None
    assert new.rope_scaling is not None and (new.rope_scaling.rope_type, new.rope_scaling.factor) == ("llama3", 8.0)
    assert new.rope_scaling.original_max_position_embeddings == old.max_context
    assert count_params(new).total_params == count_params(old).total_params == 8_030_261_248  # facts.md


def test_names_are_never_paths() -> None:
    from tfcalc.errors import UsageError
    from tfcalc.spec.presets import find_preset

    for name in ("../models/llama3-8b", "models/llama3-8b", "/etc/passwd", "..", "llama3-8b/../llama3-8b"):
        assert find_preset("model", name) is None
    with pytest.raises(UsageError, match="unknown model preset"):
        load_model("llama3-7b")


def test_an_unknown_repo_id_is_an_unknown_preset_not_a_missing_file() -> None:
    from tfcalc.errors import UsageError

    with pytest.raises(UsageError, match=r"unknown model preset 'meta-llama/Llama-3.1-8B-FP8' and no such file; "
                                         r"did you mean llama3.1-8b"):
        load_model("meta-llama/Llama-3.1-8B-FP8")


def test_a_model_file_may_keep_its_notes_and_source(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("vocab_size: 32\nhidden_size: 64\nnum_layers: 2\nnum_attention_heads: 4\nnum_kv_heads: 4\n"
                    "head_dim: 16\nintermediate_size: 128\nsource: my notes\nnotes: free text\n")
    assert load_model(str(path)).name == "mine"


def test_llama4_scout_text_counts_match_derived() -> None:
    """derived.yaml counts Scout's decoder only (its facts hold no vision tower): the preset without its encoder."""
    counts = count_params(load_model("llama4-scout-17b-16e"))
    assert counts.total_params - counts.total["encoder"].total == 107_769_861_120
    assert counts.active_params == 17_172_894_720


def test_a_model_file_may_keep_some_modules_of_a_layer_apart(tmp_path: Path) -> None:
    """``quantized_weight_exceptions.modules``: Llama 3 8B at fp8 with layer 0's down_proj kept in bf16 weighs one
    4,096 x 14,336 matrix a byte more; a module of no component named is a one-line error."""
    from tfcalc.calc.memory import weights_bytes_by_component
    from tfcalc.dtypes import parse_weight_precision
    from tfcalc.errors import SpecError

    text = (Path(__file__).resolve().parents[2] / "presets" / "models" / "llama3-8b.yaml").read_text()
    path = tmp_path / "mine.yaml"
    path.write_text(text + "quantized_weight_exceptions:\n  - {layers: [0], components: [mlp], modules: [down_proj]}\n")
    spec, fp8 = load_model(str(path)), parse_weight_precision("fp8")
    kept = weights_bytes_by_component(count_params(spec), fp8, spec=spec)["mlp"]
    assert kept - weights_bytes_by_component(count_params(spec), fp8)["mlp"] == 4096 * 14336
    path.write_text(text + "quantized_weight_exceptions:\n  - {layers: [0], components: [mlp], modules: [w2]}\n")
    with pytest.raises(SpecError, match="quantized_weight_exceptions modules name modules of one component"):
        load_model(str(path))


@pytest.mark.parametrize(("widths", "message"), [
    ("[128, 128, 128]", r"field 'layer_intermediate_sizes' must be a list of one MLP width per layer \(2\), got 3"),
    ("128", r"field 'layer_intermediate_sizes' must be a list of one MLP width per layer \(2\), got int"),
    ("[128, x]", r"field 'layer_intermediate_sizes\[1\]' must be an integer"),
    ("[128, -1]", r"field 'layer_intermediate_sizes\[1\]' must be at least 0"),
    ("[128, 256]", r"layer_intermediate_sizes\[1\] \(256\) must be 0 on a layer without an FFN, else "
                   r"1..intermediate_size \(128\)"),
])
def test_bad_layer_widths_are_one_line_errors(tmp_path: Path, widths: str, message: str) -> None:
    """A preset's per-layer MLP widths (Nemotron-Super-49B's): one per layer, each an integer within
    intermediate_size; anything else names the field in one line."""
    from tfcalc.errors import SpecError

    path = tmp_path / "mine.yaml"
    path.write_text("vocab_size: 32\nhidden_size: 64\nnum_layers: 2\nnum_attention_heads: 4\nnum_kv_heads: 4\n"
                    f"head_dim: 16\nintermediate_size: 128\nlayer_intermediate_sizes: {widths}\n")
    with pytest.raises(SpecError, match=message) as info:
        load_model(str(path))
    assert "\n" not in str(info.value)
