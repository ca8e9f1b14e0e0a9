"""Gemma 4 (31B-like dense, 26B-A4B-like MoE): global layers of their own head size and KV heads whose values are
the key projection, the weightless V-norm, proportional RoPE, unscaled scores and an MoE beside the dense MLP with
its scaled router, against transformers' Gemma4ForCausalLM with our weights; the caches and parameters the
calculator counts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from small_configs import SMALL_GEMMA4, SMALL_GEMMA4_MOE, small_config_spec
from test_transformer import (
    _copy_ends_to_hf,
    _copy_ffn,
    logit_differences,
    run_in_chunks,
    spread_vector_weights,
    twin_models,
)

from tfcalc.calc.kv_cache import kv_cache_bytes
from tfcalc.calc.params import count_params
from tfcalc.dtypes import get_dtype
from tfcalc.model import Transformer, build_model
from tfcalc.model.layers import MoE

CONFIGS = {"dense": SMALL_GEMMA4, "moe": SMALL_GEMMA4_MOE}
# 21 tokens over an 8-token window: the prefill of 14 slides past it, its decode steps too
PROMPT, TOTAL = 14, 21


def _copy_gemma4_to_hf(ours: Transformer, hf: Any) -> None:
    """Embedding, head, norms; attention (a global layer's k_proj only: it has no v_proj); the dense MLP; of an MoE
    the router (proj, scale, per_expert_scale), the expert stacks (transformers: gate_up_proj [E, 2I, hidden],
    down_proj [E, hidden, I]) and the norms around it."""
    _copy_ends_to_hf(ours, hf)
    for block, layer in zip(ours.layers, hf.model.layers, strict=True):
        a, h = block.attention, layer.self_attn
        q_out, kv_out = a.heads * a.head_dim, a.kv_heads * a.head_dim
        pieces = a.wqkv.weight.split([q_out, kv_out] if a.k_eq_v else [q_out, kv_out, kv_out])
        for name, w in zip(("q_proj", "k_proj", "v_proj"), pieces, strict=False):
            getattr(h, name).weight.copy_(w)
        assert (h.v_proj is None) == a.k_eq_v
        h.o_proj.weight.copy_(a.wo.weight)
        h.q_norm.weight.copy_(a.q_norm.weight)
        h.k_norm.weight.copy_(a.k_norm.weight)
        for ours_norm, hf_norm in ((block.attention_norm, layer.input_layernorm),
                                   (block.post_attention_norm, layer.post_attention_layernorm),
                                   (block.ffn_norm, layer.pre_feedforward_layernorm),
                                   (block.post_ffn_norm, layer.post_feedforward_layernorm)):
            hf_norm.weight.copy_(ours_norm.weight)
        moe = block.ffn
        if not isinstance(moe, MoE):
            _copy_ffn(layer.mlp, moe)
            continue
        _copy_ffn(layer.mlp, block.mlp)
        layer.router.proj.weight.copy_(moe.router.weight)
        layer.router.scale.copy_(moe.router_scale)
        layer.router.per_expert_scale.copy_(moe.per_expert_scale)
        layer.experts.gate_up_proj.copy_(moe.w_in)
        layer.experts.down_proj.copy_(moe.w_out)
        for ours_norm, hf_norm in ((block.post_mlp_norm, layer.post_feedforward_layernorm_1),
                                   (block.post_moe_norm, layer.post_feedforward_layernorm_2),
                                   (moe.input_norm, layer.pre_feedforward_layernorm_2)):
            hf_norm.weight.copy_(ours_norm.weight)


def _gemma4_twin(transformers: Any, config: dict) -> tuple[Transformer, Any]:
    """Our float32 decoder from a small config.json and transformers' Gemma4ForCausalLM of it with our weights
    (1-D weights drawn away from 1 so that every norm, scale and per-expert scale matters)."""
    ours, hf = twin_models(transformers, config, torch.float32)
    assert all(bool((layer.layer_scalar == 1).all()) for layer in hf.model.layers)  # ones at init: we leave it out
    spread_vector_weights(ours)
    with torch.no_grad():
        _copy_gemma4_to_hf(ours, hf)
    return ours, hf


def _differences(ours: Transformer, hf: Any, tokens: torch.Tensor) -> dict[str, float]:
    """max |our logits - transformers' full forward| for one prefill, a prefill of 14 then 7 cached decode steps, and
    prefill chunks, then decode steps."""
    runs = {"prefill": [TOTAL], "decode": [PROMPT] + [1] * (TOTAL - PROMPT), "chunks": [5, 6, 3, 1, 1, 1, 1, 1, 1, 1]}
    return logit_differences(ours, hf, tokens, runs, max_len=24)


def _tokens(vocab: int) -> torch.Tensor:
    return torch.randint(1, vocab, (2, TOTAL), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", CONFIGS)
def test_gemma4_equals_transformers_with_the_same_weights(name: str) -> None:
    """Dense and MoE in float32 with transformers' weights: the same logits (largest ~29, under the cap of 30) for
    one 21-token prefill, for a 14-token prefill and 7 decode steps, and for prefill chunks, all past the 8-token
    window; bound 5e-5, measured 0.8-1.4e-5 (float32 rounding of unscaled scores)."""
    transformers = pytest.importorskip("transformers")
    ours, hf = _gemma4_twin(transformers, CONFIGS[name])
    spec = ours.spec
    assert spec.full_attention is not None and spec.full_attention.k_eq_v and spec.v_norm
    assert (spec.moe is not None) == (name == "moe")
    differences = _differences(ours, hf, _tokens(spec.vocab_size))
    assert max(differences.values()) < 5e-5, differences


def _mutated(ours: Transformer, change: str) -> Transformer:
    """Our model without one Gemma 4 feature, the weights the same (or the feature's weights reset); without k_eq_v
    the global layers' V rows of wqkv are their own, as drawn."""
    spec, fa = ours.spec, ours.spec.full_attention
    assert fa is not None
    specs = {"no v norm": {"v_norm": False}, "scaled scores": {"query_pre_attn_scalar": None},
             "plain partial rope": {"full_attention": replace(fa, proportional_rope=False)},
             "values of their own": {"full_attention": replace(fa, k_eq_v=False)}}
    model = build_model(spec.with_overrides(**specs.get(change, {})), dtype=torch.float32)
    state = ours.state_dict()
    with torch.no_grad():
        for name, weight in model.state_dict().items():  # [q | k] rows, then (without k_eq_v) V rows as drawn
            weight[:len(state[name])] = state[name]
        for block in model.layers:
            if change == "router scales at 1" and isinstance(block.ffn, MoE):
                block.ffn.router_scale.fill_(1.0)
                block.ffn.per_expert_scale.fill_(1.0)
            if change == "no mlp beside the experts" and block.mlp is not None:
                block.mlp.w_out.weight.zero_()
            if change == "no experts beside the mlp" and isinstance(block.ffn, MoE):
                block.ffn.w_out.zero_()
    return model


@pytest.mark.parametrize("config, change", [
    ("dense", "values of their own"), ("dense", "no v norm"), ("dense", "scaled scores"),
    ("dense", "plain partial rope"), ("moe", "router scales at 1"), ("moe", "no mlp beside the experts"),
    ("moe", "no experts beside the mlp")])
def test_each_gemma4_feature_moves_the_logits(config: str, change: str) -> None:
    """Our model without one of Gemma 4's features is far from transformers' (more than 1e-2; measured 1.6-8.9
    against 1e-5 with all of them)."""
    transformers = pytest.importorskip("transformers")
    ours, hf = _gemma4_twin(transformers, CONFIGS[config])
    differences = _differences(_mutated(ours, change), hf, _tokens(ours.spec.vocab_size))
    assert min(differences.values()) > 1e-2, differences


@pytest.mark.parametrize("name", CONFIGS)
def test_every_decode_path_and_chunked_prefill_equal_one_prefill(name: str) -> None:
    """Live, static and flex decode over the sliding layers' rings and the global layers' caches, and prefill chunks,
    give the logits of one prefill (float64)."""
    torch.manual_seed(0)
    spec = small_config_spec(CONFIGS[name])
    model = build_model(spec, dtype=torch.float64)
    model.setup_caches(batch=2, max_len=24)
    tokens = _tokens(spec.vocab_size)
    full = run_in_chunks(model, tokens, [TOTAL])
    for mode in ("live", "static", "flex"):
        model.decode_attention = mode
        decoded = run_in_chunks(model, tokens, [3] + [1] * (TOTAL - 3))
        torch.testing.assert_close(decoded, full, atol=1e-10, rtol=0, msg=mode)
    for chunks in ([8, 8, 5], [7, 2, 10, 1, 1]):
        torch.testing.assert_close(run_in_chunks(model, tokens, chunks), full, atol=1e-10, rtol=0)


def test_sliding_layers_without_a_local_base_turn_their_own_heads() -> None:
    """A Gemma 4 spec without rope_local_theta (a user's YAML) turns its sliding layers' heads of 16 (not the global
    layers' 32) at rope_theta: the logits of the same weights with the local base set to rope_theta (float64)."""
    spec = small_config_spec(SMALL_GEMMA4)
    torch.manual_seed(0)
    without = build_model(spec.with_overrides(rope_local_theta=None), dtype=torch.float64)
    with_base = build_model(spec.with_overrides(rope_local_theta=spec.rope_theta), dtype=torch.float64)
    with_base.load_state_dict(without.state_dict())
    tokens = _tokens(spec.vocab_size)
    for model in (without, with_base):
        model.setup_caches(batch=2, max_len=24)
    torch.testing.assert_close(run_in_chunks(without, tokens, [PROMPT] + [1] * (TOTAL - PROMPT)),
                               run_in_chunks(with_base, tokens, [PROMPT] + [1] * (TOTAL - PROMPT)), atol=1e-10, rtol=0)


@pytest.mark.parametrize("preset", ["gemma4-31b", "gemma4-26b-a4b"])
@pytest.mark.parametrize("length", [100, 5000])
def test_presets_scaled_down_count_and_cache_as_the_calculator(preset: str, length: int) -> None:
    """The presets at 6 layers with their real widths (meta device): a global layer kept among the sliding ones, the
    decoder's parameters the calculator's (the vision encoder aside), each layer's cache its own head size and KV
    heads, a sliding layer's ring at most 1,024 tokens: `tfcalc kv-cache`'s bytes."""
    from tfcalc.spec.presets import load_model

    model = build_model(load_model(preset), layers=6, device="meta")
    spec = model.spec
    assert spec.num_full_layers >= 1 and spec.num_sliding_layers >= 1
    counts = count_params(spec)
    assert sum(p.numel() for p in model.parameters()) == counts.total_params - counts.total["encoder"].total
    model.setup_caches(batch=2, max_len=length)
    assert model.kv_cache_bytes() == kv_cache_bytes(spec, get_dtype("fp32"), length, 2)
