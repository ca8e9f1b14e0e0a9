"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5.2): the lightning indexer's top-k choice, the shared layers that
reuse it and the indexer keys' cache, against transformers' DeepseekV32ForCausalLM and GlmMoeDsaForCausalLM with our
weights over prompts three times the top-k (24 tokens, top 8); every decode path and chunked prefill; tp and ep on
gloo against one rank; the parameters the calculator counts.

Random weights make the index scores of a query's 8th and 9th best keys at least 3.8e-4 apart (measured, seed 0),
three orders above float32's error in the scores, so our choice and transformers' are the same keys."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from shard_jobs import Case, CompareWithOneRank
from small_configs import SMALL_DEEPSEEK_V32, SMALL_GLM_DSA, small_config_spec
from test_parallel import _check
from test_transformer import (
    _copy_ends_to_hf,
    _copy_ffn,
    compiled_decode_error,
    copy_mla_to_hf,
    copy_norms_and_ffn_to_hf,
    run_in_chunks,
    spread_vector_weights,
    twin_models,
)

from tfcalc.calc.params import count_params
from tfcalc.model import Transformer, build_model
from tfcalc.model.layers import backend_works
from tfcalc.model.mla import LightningIndexer, MLAttention
from tfcalc.profile.distributed import launch
from tfcalc.spec.hf_config import load_hf_config

CONFIGS = {"deepseek_v32": SMALL_DEEPSEEK_V32, "glm_moe_dsa": SMALL_GLM_DSA}
PROMPT, TOTAL, TOPK = 14, 24, 8
# one prefill; a prefill of 14 and 10 decode steps; prefill chunks then decode steps
RUNS = {"prefill": [TOTAL], "decode": [PROMPT] + [1] * (TOTAL - PROMPT), "chunks": [5, 9, 3] + [1] * 7}


def _copy_dsa_to_hf(ours: Transformer, hf: Any) -> None:
    """Embedding, head, norms; MLA's projections and latent norms; an indexed layer's indexer (the same parameter
    names: wq_b, wk, k_norm weight and bias, weights_proj); the dense MLP, or the router, its score bias, the
    experts and the shared expert."""
    _copy_ends_to_hf(ours, hf)
    for block, layer in zip(ours.layers, hf.model.layers, strict=True):
        a, h = block.attention, layer.self_attn
        copy_mla_to_hf(a, h)
        assert (h.indexer is None) == (a.indexer is None)
        if a.indexer is not None:
            h.indexer.load_state_dict(a.indexer.state_dict())
        ffn = copy_norms_and_ffn_to_hf(block, layer)
        if ffn is not None:
            layer.mlp.gate.e_score_correction_bias.copy_(ffn.score_bias)
            _copy_ffn(layer.mlp.shared_experts, ffn.shared)


def _dsa_twin(transformers: Any, config: dict) -> tuple[Transformer, Any]:
    """Our float32 decoder from a small config.json and transformers' model of it with our weights (1-D weights,
    the indexer's LayerNorm bias and the router's score bias among them, drawn in [0.5, 1.5])."""
    ours, hf = twin_models(transformers, config, torch.float32)
    spread_vector_weights(ours)
    with torch.no_grad():
        _copy_dsa_to_hf(ours, hf)
    return ours, hf


def _tokens(vocab: int) -> torch.Tensor:
    return torch.randint(1, vocab, (2, TOTAL), generator=torch.Generator().manual_seed(1))


def _indexers(model: Transformer) -> list[LightningIndexer | None]:
    attentions = [block.attention for block in model.layers]
    assert all(isinstance(a, MLAttention) and a.sparse for a in attentions)
    return [a.indexer for a in attentions if isinstance(a, MLAttention)]


@pytest.mark.parametrize("name", CONFIGS)
def test_dsa_equals_transformers_with_the_same_weights(name: str) -> None:
    """DeepSeek-V3.2 (an indexer on every layer, its RoPE on halves, yarn) and GLM-5.2 (indexers on layers 0 and 2,
    layers 1 and 3 shared, RoPE on adjacent pairs) in float32: the same logits as transformers' full forward for one
    24-token prefill, a 14-token prefill and 10 decode steps (live, static and flex), and prefill chunks then decode
    steps, 2 sequences; bound 5e-6, measured 4.8-7.2e-7 on logits up to 2.1."""
    transformers = pytest.importorskip("transformers")
    ours, hf = _dsa_twin(transformers, CONFIGS[name])
    indexers = _indexers(ours)
    assert [i is not None for i in indexers] == ([True] * 3 if name == "deepseek_v32" else [True, False, True, False])
    assert {i.interleaved for i in indexers if i is not None} == {name == "glm_moe_dsa"}
    assert {i.topk for i in indexers if i is not None} == {TOPK}
    tokens = _tokens(ours.spec.vocab_size)
    ours.setup_caches(batch=2, max_len=32)
    differences = {}
    with torch.inference_mode():
        expected = hf(tokens).logits
        for mode in ("live", "static", "flex"):
            ours.decode_attention = mode
            for run, chunks in RUNS.items():
                differences[f"{run} {mode}"] = float((run_in_chunks(ours, tokens, chunks) - expected).abs().max())
    assert max(differences.values()) < 5e-6, differences


def test_attending_every_key_changes_the_logits() -> None:
    """The same weights with a top-k above the prompt (every key kept) are MLA without the indexer (to 1e-6), and
    differ from the top-8 model only where a query sees more than 8 keys: the first 8 positions agree, the later
    ones move by far more than rounding (measured 0.6 on logits up to 2)."""
    for config in CONFIGS.values():
        torch.manual_seed(0)
        spec = small_config_spec(config)
        assert spec.sparse_indexer is not None
        sparse = build_model(spec)
        spread_vector_weights(sparse)
        every = build_model(spec.with_overrides(sparse_indexer=replace(spec.sparse_indexer, topk=TOTAL)))
        every.load_state_dict(sparse.state_dict())
        plain = build_model(spec.with_overrides(sparse_indexer=None))
        missing, unexpected = plain.load_state_dict(sparse.state_dict(), strict=False)
        assert not missing and unexpected and all(".indexer." in key for key in unexpected)
        tokens = _tokens(spec.vocab_size)
        logits = {}
        for label, model in (("sparse", sparse), ("every", every), ("plain", plain)):
            model.setup_caches(batch=2, max_len=TOTAL)
            logits[label] = run_in_chunks(model, tokens, [TOTAL])
        assert (logits["every"] - logits["plain"]).abs().max() < 1e-6
        assert (logits["sparse"][:, :TOPK] - logits["plain"][:, :TOPK]).abs().max() < 1e-6
        assert (logits["sparse"][:, TOPK:] - logits["plain"][:, TOPK:]).abs().max() > 0.1


def test_shared_layers_attend_the_previous_indexed_layers_choice() -> None:
    """GLM-5.2's layers 1 and 3 run no indexer: in a prefill and in a decode step each attends the very keys its
    previous indexed layer chose (layer 1 layer 0's, layer 3 layer 2's), and the two indexed layers choose differently,
    so reusing the first choice, or choosing anew, would be seen."""
    torch.manual_seed(0)
    model = build_model(small_config_spec(SMALL_GLM_DSA))
    chosen: list[tuple[torch.Tensor, torch.Tensor]] = []
    for block in model.layers:
        block.attention.register_forward_hook(lambda module, args, output: chosen.append(args[1].topk))
    model.setup_caches(batch=2, max_len=TOTAL)
    tokens = _tokens(model.spec.vocab_size)
    with torch.inference_mode():
        for call in (lambda: model.prefill(tokens[:, :-1]), lambda: model.decode_step(tokens[:, -1:])):
            chosen.clear()
            call()
            assert chosen[1] is chosen[0] and chosen[3] is chosen[2]
            assert not torch.equal(chosen[0][0], chosen[2][0])
            assert chosen[0][0].shape[-1] == TOPK


def test_live_decode_attends_only_the_top_k_latents(monkeypatch) -> None:
    """Each live decode step gathers and attends min(position + 1, 8) latents on every layer (FlashMLA's sparse
    decode reads k entries), never the 24 live ones."""
    import tfcalc.model.layers as layers

    seen: list[int] = []
    real_sdpa = layers.F.scaled_dot_product_attention

    def sdpa(q, k, v, **kwargs):  # noqa: ANN001, ANN202
        seen.append(k.shape[-2])
        return real_sdpa(q, k, v, **kwargs)

    torch.manual_seed(0)
    model = build_model(small_config_spec(SMALL_GLM_DSA))
    model.setup_caches(batch=2, max_len=32)
    tokens = _tokens(model.spec.vocab_size)
    with torch.inference_mode():
        model.prefill(tokens[:, :3])
        monkeypatch.setattr(layers.F, "scaled_dot_product_attention", sdpa)
        for i in range(3, TOTAL):
            seen.clear()
            model.decode_step(tokens[:, i:i + 1])
            assert seen == [min(i + 1, TOPK)] * model.spec.num_layers


def test_backends_are_probed_with_per_sequence_masks(monkeypatch) -> None:
    """The top-k masks differ by sequence ([B, 1, T, L]), which not every fused kernel takes: a DSA model probes each
    backend's masked calls with such masks (two sequences, masks of their own), so that a GPU picks one that runs
    them (on this CPU math runs every MLA call)."""
    import tfcalc.model.layers as layers
    import tfcalc.model.transformer as transformer

    asked: list[bool] = []
    real_probe = transformer.backend_works

    def probe(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        asked.append(kwargs["per_sequence"])
        return real_probe(*args, **kwargs)

    monkeypatch.setattr(transformer, "backend_works", probe)
    build_model(small_config_spec(SMALL_GLM_DSA)).setup_caches(batch=1, max_len=8)
    assert asked and all(asked)
    masks: list[torch.Tensor] = []
    real_attend = layers.attend

    def attend(q, k, v, mask, **kwargs):  # noqa: ANN001, ANN003, ANN202
        masks.append(mask)
        return real_attend(q, k, v, mask, **kwargs)

    monkeypatch.setattr(layers, "attend", attend)
    assert backend_works("math", 3, 1, 24, torch.float32, torch.device("cpu"), v_dim=16, per_sequence=True)
    assert [tuple(m.shape) for m in masks] == [(2, 1, 1, 4), (2, 1, 2, 4)]
    assert all(not torch.equal(m[0], m[1]) for m in masks)


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["fp32", "fp8"])
def test_indexer_keys_are_cached_on_indexed_layers_in_the_model_dtype(kv_dtype: torch.dtype | None) -> None:
    """Every layer caches its latent (kv_lora_rank + rope dims, in the KV dtype) and each indexed layer its indexer's
    keys (index_head_dim, in the model's dtype, fp8 latent or not); live decode, gathering the chosen latents, equals
    static decode over them."""
    torch.manual_seed(0)
    spec = small_config_spec(SMALL_GLM_DSA)
    assert spec.mla is not None and spec.sparse_indexer is not None
    model = build_model(spec)
    batch, length = 2, 32
    model.setup_caches(batch=batch, max_len=length, kv_dtype=kv_dtype)
    latent = spec.num_layers * spec.mla.latent_elements_per_token_per_layer * (1 if kv_dtype else 4)
    keys = spec.num_indexer_layers * spec.sparse_indexer.head_dim * 4
    assert model.kv_cache_bytes() == batch * length * (latent + keys)
    caches = [block.attention.kv_cache for block in model.layers]
    assert [c.index_keys is not None for c in caches] == [True, False, True, False]
    assert {c.index_keys.dtype for c in caches if c.index_keys is not None} == {torch.float32}
    tokens = _tokens(spec.vocab_size)
    model.decode_attention = "static"
    static = run_in_chunks(model, tokens, [PROMPT] + [1] * (TOTAL - PROMPT))
    model.decode_attention = "live"
    torch.testing.assert_close(run_in_chunks(model, tokens, [PROMPT] + [1] * (TOTAL - PROMPT)), static,
                               atol=1e-6, rtol=0)


def test_parameter_count_equals_calculator() -> None:
    """The small configs, and DeepSeek-V3.2, GLM-5 and GLM-5.2 at 8 layers with their real widths (meta device):
    the indexers' parameters (wq_b, wk, k_norm, weights_proj, on the indexed layers only) are what the calculator
    counts."""
    fixtures = Path(__file__).parents[1] / "fixtures/hf_configs"
    specs = [small_config_spec(config) for config in CONFIGS.values()]
    specs += [load_hf_config(fixtures / f"{name}.json").with_overrides(layers=8)
              for name in ("deepseek-v3.2", "glm-5", "glm-5.2")]
    for spec in specs:
        model = build_model(spec, device="meta")
        assert sum(p.numel() for p in model.parameters()) == count_params(spec).total_params, spec.name
        assert sum(i is not None for i in _indexers(model)) == spec.num_indexer_layers


def test_dsa_decode_step_captures_as_one_graph() -> None:
    """A compiled decode step (auto: flex mode) of GLM-5.2 with its shared layers, the experts left out (their
    dispatch reads counts on the host): torch.compile(fullgraph=True) traces the indexer's top-k and the gathered
    latents with no graph break, and its logits are the eager prefill's."""
    spec = small_config_spec(SMALL_GLM_DSA).with_overrides(moe=None)
    assert compiled_decode_error(spec) < 1e-4


def _sharded_cases() -> list[Case]:
    """DeepSeek-V3.2 and GLM-5.2 with a 16-token prompt and 6 decode steps: heads and experts split by tp, experts
    placed by ep (ep = tp) and dispatched by all-to-all (ep > tp: two attention replicas)."""
    v32, glm = small_config_spec(SMALL_DEEPSEEK_V32), small_config_spec(SMALL_GLM_DSA)
    return [Case("deepseek_v32 tp 2", v32, 2, 1, prompt=16, decode=6),
            Case("glm_moe_dsa tp 2", glm, 2, 1, prompt=16, decode=6),
            Case("deepseek_v32 tp 2 ep 2", v32, 2, 2, prompt=16, decode=6),
            Case("glm_moe_dsa ep 2", glm, 1, 2, prompt=16, decode=6)]


def test_two_ranks_compute_the_one_rank_model() -> None:
    """On 2 gloo ranks each rank's logits equal the one-rank model's (tolerance 1e-5 of the largest logit, measured
    2-4e-7) with the indexer replicated: every rank picks the same top-k for its own heads; each rank holds what
    ``tfcalc plan`` counts per GPU (the indexer whole)."""
    cases = _sharded_cases()
    got: list = []
    launch(CompareWithOneRank(tuple(cases)), 2, "cpu", lambda kind, payload: got.append(payload))
    by_case: dict[str, list[dict]] = {}
    for result in got[0]:
        by_case.setdefault(result["case"], []).append(result)
    _check(cases, by_case)
