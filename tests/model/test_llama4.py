"""Llama 4 (Scout / Maverick): chunked local attention in a chunk-sized ring, NoPE layers with attention temperature
tuning, the weightless QK norm, RoPE on adjacent pairs and experts whose inputs carry the routing weights, against
transformers' Llama4ForCausalLM with our weights; every decode path and chunked prefill against one prefill; the
caches and parameters the calculator counts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from small_configs import SMALL_LLAMA4, SMALL_LLAMA4_INTERLEAVED, small_config_spec
from test_transformer import (
    _copy_attention_to_hf,
    _copy_ends_to_hf,
    _copy_ffn,
    compiled_decode_error,
    logit_differences,
    run_in_chunks,
    spread_vector_weights,
    twin_models,
)

from tfcalc.calc.kv_cache import kv_cache_bytes
from tfcalc.calc.params import count_params
from tfcalc.dtypes import get_dtype
from tfcalc.model import Transformer, build_model
from tfcalc.model.layers import MoE, attention_temperature, causal_mask
from tfcalc.model.scaling import describe_layers, keep_layers, pick_layers
from tfcalc.spec.hf_config import spec_from_hf_config
from tfcalc.spec.model import ModelSpec

CONFIGS = {"scout": SMALL_LLAMA4, "maverick": SMALL_LLAMA4_INTERLEAVED}
FIXTURES = Path(__file__).parents[1] / "fixtures/hf_configs"
# 27 tokens over chunks of 8: the prefill of 19 crosses the boundaries at 8 and 16, its decode steps the one at 24
PROMPT, TOTAL = 19, 27


def test_chunked_mask_and_temperature_follow_transformers_formulas() -> None:
    """Key j is visible to query i iff j <= i and j // 8 == i // 8; the NoPE queries' scale is
    1 + 0.1 log(1 + floor((p + 1) / 4))."""
    pos = torch.arange(20)
    mask = causal_mask(pos, pos, 8, chunked=True)
    assert mask[7].nonzero().flatten().tolist() == list(range(8))
    assert mask[8].nonzero().flatten().tolist() == [8]
    assert mask[19].nonzero().flatten().tolist() == [16, 17, 18, 19]
    expected = [1.0] * 3 + [1 + 0.1 * torch.tensor(2.0).log().item()] * 4 + [1 + 0.1 * torch.tensor(3.0).log().item()]
    torch.testing.assert_close(attention_temperature(pos[:8], 4, 0.1, torch.float64),
                               torch.tensor(expected, dtype=torch.float64))


# --- against transformers ---------------------------------------------------------------------------------------


def _copy_llama4_to_hf(ours: Transformer, hf: Any) -> None:
    """Embedding, head, norms, attention; a dense MLP whole; of a MoE the router, the expert stacks (transformers
    keeps them transposed: gate_up_proj [E, hidden, 2I], down_proj [E, I, hidden]) and the shared expert."""
    _copy_ends_to_hf(ours, hf)
    for block, layer in zip(ours.layers, hf.model.layers, strict=True):
        _copy_attention_to_hf(ours, block.attention, layer.self_attn)
        layer.input_layernorm.weight.copy_(block.attention_norm.weight)
        layer.post_attention_layernorm.weight.copy_(block.ffn_norm.weight)
        ffn, hf_ffn = block.ffn, layer.feed_forward
        if not isinstance(ffn, MoE):
            _copy_ffn(hf_ffn, ffn)
            continue
        hf_ffn.router.weight.copy_(ffn.router.weight)
        hf_ffn.experts.gate_up_proj.copy_(ffn.w_in.transpose(1, 2))
        hf_ffn.experts.down_proj.copy_(ffn.w_out.transpose(1, 2))
        _copy_ffn(hf_ffn.shared_expert, ffn.shared)


def _llama4_twin(transformers: Any, config: dict, **mutation: object) -> tuple[Transformer, Any]:
    """Our float32 decoder from a small config.json and transformers' Llama4ForCausalLM of it with our weights
    (norm weights drawn away from 1 so that they matter). ``mutation`` changes our spec only (same weights), to
    show that the comparison sees each feature."""
    ours, hf = twin_models(transformers, config, torch.float32)
    if mutation:
        torch.manual_seed(0)
        ours = build_model(ours.spec.with_overrides(**mutation), dtype=torch.float32)
    spread_vector_weights(ours)
    with torch.no_grad():
        _copy_llama4_to_hf(ours, hf)
    return ours, hf


def _differences(ours: Transformer, hf: Any, tokens: torch.Tensor) -> dict[str, float]:
    """max |our logits - transformers' full forward| for one prefill, a prefill of 19 then 8 cached decode steps,
    and prefill chunks that start mid-chunk, then decode steps."""
    runs = {"prefill": [TOTAL], "decode": [PROMPT] + [1] * (TOTAL - PROMPT), "chunks": [5, 6, 9, 3, 1, 1, 1, 1]}
    return logit_differences(ours, hf, tokens, runs, max_len=32)


def _tokens(spec: ModelSpec) -> torch.Tensor:
    return torch.randint(1, spec.vocab_size, (2, TOTAL), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", CONFIGS)
def test_llama4_equals_transformers_with_the_same_weights(name: str) -> None:
    """Scout-like (MoE top 1 on every layer, QK norm, llama3 RoPE scaling) and Maverick-like (dense and MoE top 2
    alternating, no QK norm) in float32 with transformers' weights: the same logits (largest ~2) for one 27-token
    prefill, for a 19-token prefill and 8 decode steps (chunk boundaries at 8 and 16 in the prefill, 24 in decode)
    and for prefill chunks straddling the boundaries; bound 5e-6, measured 6-8e-7 (float32 rounding: transformers
    builds cos/sin in float32 and runs every expert on every token, the unchosen ones on zeros)."""
    transformers = pytest.importorskip("transformers")
    ours, hf = _llama4_twin(transformers, CONFIGS[name])
    spec = ours.spec
    assert spec.chunked_attention and spec.rope_interleaved and spec.nope_layers
    assert spec.moe is not None and spec.moe.router_weights_input
    differences = _differences(ours, hf, _tokens(spec))
    assert max(differences.values()) < 5e-6, differences


# Our spec without one of Llama 4's features, the weights the same: (config, changes)
MUTATIONS: dict[str, tuple[str, dict[str, object]]] = {
    "window instead of chunks": ("scout", {"local_attention": "sliding"}),
    "no temperature tuning": ("scout", {"attn_temperature_floor_scale": None}),
    "no qk norm": ("scout", {"qk_l2_norm": False}),
    "rope on halves": ("scout", {"rope_interleaved": False}),
    "rope on every layer": ("scout", {"nope_layers": ()}),
    "no rope scaling": ("scout", {"rope_scaling": None}),
    "router weights on outputs": ("maverick", {"moe": replace(small_config_spec(SMALL_LLAMA4_INTERLEAVED).moe,
                                                              router_weights_input=False)}),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_each_llama4_feature_moves_the_logits(mutation: str) -> None:
    """Our model without one of Llama 4's features, with the same weights, is far from transformers' (more than
    1e-2; measured 0.08-1.4 against 1e-6 with all of them): the equality test sees each."""
    transformers = pytest.importorskip("transformers")
    name, changes = MUTATIONS[mutation]
    ours, hf = _llama4_twin(transformers, CONFIGS[name], **changes)
    differences = _differences(ours, hf, _tokens(ours.spec))
    assert min(differences.values()) > 1e-2, differences


# --- the decoder's own paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_every_decode_path_and_chunked_prefill_equal_one_prefill(name: str) -> None:
    """Live decode (slots 0..p mod 8 of the ring), static decode (the ring under a mask), flex decode (the live-block
    mask at p mod 8) and prefill chunks over the ring give the logits of one prefill (float64)."""
    torch.manual_seed(0)
    spec = small_config_spec(CONFIGS[name])
    model = build_model(spec, dtype=torch.float64)
    model.setup_caches(batch=2, max_len=32)
    tokens = _tokens(spec)
    full = run_in_chunks(model, tokens, [TOTAL])
    for mode in ("live", "static", "flex"):
        model.decode_attention = mode
        decoded = run_in_chunks(model, tokens, [3] + [1] * (TOTAL - 3))
        torch.testing.assert_close(decoded, full, atol=1e-10, rtol=0, msg=mode)
    for chunks in ([8, 8, 8, 3], [7, 2, 10, 1, 7], [20, 7]):
        torch.testing.assert_close(run_in_chunks(model, tokens, chunks), full, atol=1e-10, rtol=0)


def test_live_decode_reads_only_the_current_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live decode step at position p hands attention p mod 8 + 1 keys on a chunked layer (its chunk so far) and
    p + 1 on a NoPE layer."""
    import tfcalc.model.layers as layers

    seen: list[int] = []
    real_sdpa = layers.F.scaled_dot_product_attention

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        seen.append(k.shape[-2])
        return real_sdpa(q, k, v, **kwargs)

    spec = small_config_spec(SMALL_LLAMA4)
    model = build_model(spec)
    model.setup_caches(batch=1, max_len=32)
    tokens = _tokens(spec)[:1]
    with torch.inference_mode():
        model.prefill(tokens[:, :PROMPT])
        monkeypatch.setattr(layers.F, "scaled_dot_product_attention", sdpa)
        for p in range(PROMPT, TOTAL):
            seen.clear()
            model.decode_step(tokens[:, p:p + 1])
            assert seen == [p % 8 + 1] * 3 + [p + 1], p


def test_compiled_decode_step_captures_chunked_and_nope_layers() -> None:
    """The flex decode step, with the chunk rings' live-block mask built from position mod 8 on the device and the
    NoPE layers' temperature from the position tensor, traces with torch.compile(fullgraph=True) (aot_eager; dense
    layers only, MoE dispatch reading counts on the host) and gives the logits of one prefill."""
    assert compiled_decode_error(small_config_spec(SMALL_LLAMA4).with_overrides(moe=None)) < 1e-4


# --- what the calculator counts ---------------------------------------------------------------------------------


def _fixture_spec(name: str) -> ModelSpec:
    return spec_from_hf_config(json.loads((FIXTURES / f"{name}.json").read_text()), name, name)


def _fixture(name: str, layers: int) -> Transformer:
    return build_model(_fixture_spec(name), layers=layers, device="meta")


@pytest.mark.parametrize("fixture", ["llama4-scout-17b-16e", "llama4-maverick-17b-128e"])
def test_parameter_count_equals_calculator_for_llama4(fixture: str) -> None:
    """The released configs at 4 layers with their real widths (meta device): the chunked, NoPE, dense and MoE
    layers kept in proportion, and the decoder's parameters the calculator's (the vision encoder aside, which the
    decoder never runs)."""
    model = _fixture(fixture, 4)
    spec = model.spec
    assert spec.nope_layers and spec.chunked_attention and spec.encoder is not None
    assert all(not block.attention.rotary for i, block in enumerate(model.layers) if i in spec.nope_layers)
    counts = count_params(spec)
    assert sum(p.numel() for p in model.parameters()) == counts.total_params - counts.total["encoder"].total


def test_scaled_llama4_keeps_its_nope_layers() -> None:
    """Scaling by layers keeps Maverick's kinds (dense chunked, MoE chunked, MoE NoPE global) and renumbers the NoPE
    layers; a model scaled to NoPE layers only has no chunks left."""
    maverick = _fixture_spec("llama4-maverick-17b-128e")
    assert describe_layers(maverick, pick_layers(maverick, 3)).startswith(
        "dense chunked 1 of 24, moe chunked 1 of 12, moe global nope 1 of 12")
    kept = keep_layers(maverick, (1, 3, 7))
    assert (kept.nope_layers, kept.sliding_window_layers, kept.chunked_attention) == ((1, 2), (0,), True)
    only_nope = keep_layers(maverick, (3, 7))
    assert (only_nope.nope_layers, only_nope.sliding_window, only_nope.chunked_attention) == ((0, 1), None, False)


@pytest.mark.parametrize("length", [100, 8192, 20_000])
def test_chunked_layers_cache_one_chunk(length: int) -> None:
    """A chunked layer holds a ring of min(chunk, length) tokens, a NoPE layer every token: the caches' bytes are
    `tfcalc kv-cache`'s figure below, at and above Scout's 8192-token chunk."""
    model = _fixture("llama4-scout-17b-16e", 4)
    model.setup_caches(batch=2, max_len=length)
    assert model.kv_cache_bytes() == kv_cache_bytes(model.spec, get_dtype("fp32"), length, 2)
