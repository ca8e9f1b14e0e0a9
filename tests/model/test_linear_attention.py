"""Gated DeltaNet layers and gated attention (Qwen3-Next, Qwen3.5): the chunked delta rule equals the recurrence,
cached decode and chunked prefill equal one prefill, the fixed states replace the KV cache on linear layers, the
parameter count is the calculator's, and transformers' Qwen3NextForCausalLM / Qwen3_5ForCausalLM with our weights
give our logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from small_configs import SMALL_QWEN3_5, SMALL_QWEN3_NEXT, small_config_spec
from test_transformer import _copy_ffn, compiled_decode_error, copy_norms_and_ffn_to_hf, run_in_chunks, twin_models

from tfcalc.calc.params import count_params
from tfcalc.model import Transformer, build_model
from tfcalc.model.deltanet import GatedDeltaNet, delta_rule_chunked, delta_rule_step
from tfcalc.spec.hf_config import spec_from_hf_config

CONFIGS = {"qwen3_next": SMALL_QWEN3_NEXT, "qwen3_5": SMALL_QWEN3_5}
FIXTURES = Path(__file__).parents[1] / "fixtures/hf_configs"


def _random_inputs(b: int, h: int, t: int, dk: int, dv: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q, k = (torch.nn.functional.normalize(draw(b, h, t, dk), dim=-1) for _ in range(2))
    g = -torch.rand(b, h, t, generator=generator, dtype=torch.float64) * 2  # decays exp(g) in (e^-2, 1]
    beta = torch.rand(b, h, t, generator=generator, dtype=torch.float64)
    return q, k, draw(b, h, t, dv), g, beta, draw(b, h, dk, dv)


@pytest.mark.parametrize("chunk", [64, 8, 1])
def test_chunked_delta_rule_equals_the_recurrence(chunk: int) -> None:
    """70 tokens (two 64-token chunks, the second padded; or 8-token chunks) from a non-zero state: the outputs and
    final state of the chunked form equal the token-by-token gated delta rule in float64."""
    q, k, v, g, beta, state = _random_inputs(2, 3, 70, 8, 12, torch.Generator().manual_seed(0))
    outputs, s = [], state
    for i in range(70):
        o, s = delta_rule_step(q[:, :, i], k[:, :, i], v[:, :, i], g[..., i], beta[..., i], s)
        outputs.append(o)
    out, final = delta_rule_chunked(q, k, v, g, beta, state, chunk=chunk)
    torch.testing.assert_close(out, torch.stack(outputs, dim=2), atol=1e-12, rtol=0)
    torch.testing.assert_close(final, s, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", CONFIGS)
def test_cached_decode_and_chunked_prefill_equal_one_prefill(name: str) -> None:
    """Prefill chunks (conv and recurrent states carried across them, chunks shorter than the conv's 3 rows
    included) and decode steps give the logits of one prefill (float64); reset() starts a new sequence, also when
    it begins with a decode step; a batch smaller than the states' is served by their first rows."""
    torch.manual_seed(0)
    spec = small_config_spec(CONFIGS[name])
    model = build_model(spec, dtype=torch.float64)
    model.setup_caches(batch=3, max_len=16)
    tokens = torch.randint(0, spec.vocab_size, (2, 13))
    full = run_in_chunks(model, tokens, [13])
    for chunks in ([6] + [1] * 7, [5, 2, 1, 3, 2], [1, 1, 4, 1, 6]):
        torch.testing.assert_close(run_in_chunks(model, tokens, chunks), full, atol=1e-10, rtol=0)
    assert run_in_chunks(model, tokens[:1], [13]).sub(full[:1]).abs().max() < 1e-10


def test_compiled_decode_step_captures_linear_layers_as_one_graph() -> None:
    """The recurrent step writes its states in place (module buffers, like the KV cache), so a decode step of
    Qwen3.5 dense traces with torch.compile(fullgraph=True) (aot_eager, to stay fast on the CPU) and gives the
    logits of one prefill."""
    assert compiled_decode_error(small_config_spec(SMALL_QWEN3_5)) < 1e-4


def test_linear_layers_hold_a_fixed_state_and_no_kv_cache() -> None:
    """Only the attention layers get a KV cache (2 x Hkv x D per token); each Gated DeltaNet layer holds conv_dim x
    (K - 1) conv elements in the model dtype and Hv x Dk x Dv recurrent ones in float32, whatever the length."""
    spec = small_config_spec(SMALL_QWEN3_NEXT)
    la = spec.linear_attention
    for length in (8, 64):
        model = build_model(spec, dtype=torch.bfloat16, device="meta")
        model.setup_caches(batch=3, max_len=length)
        mixers = [block.attention for block in model.layers]
        assert [isinstance(m, GatedDeltaNet) for m in mixers] == [True, True, True, False]
        assert [getattr(m, "kv_cache", None) is not None for m in mixers] == [False, False, False, True]
        kv_per_token = 2 * spec.num_kv_heads * spec.head_dim * 2  # K and V in bf16
        assert model.kv_cache_bytes() == spec.num_attention_layers * 3 * length * kv_per_token
        per_sequence = 2 * la.conv_state_elements + 4 * la.recurrent_state_elements
        assert model.state_bytes() == spec.num_linear_layers * 3 * per_sequence


@pytest.mark.parametrize("fixture", ["qwen3-next-80b-a3b", "qwen3.5-27b", "qwen3.5-35b-a3b"])
def test_parameter_count_equals_calculator_for_hybrids(fixture: str) -> None:
    """The released configs (tests/fixtures/hf_configs) at 4 layers (3 linear, 1 attention) with their real widths
    on the meta device: the decoder's parameters are the calculator's (a multimodal checkpoint's encoder aside)."""
    data = json.loads((FIXTURES / f"{fixture}.json").read_text())
    model = build_model(spec_from_hf_config(data, fixture, fixture), layers=4, device="meta")
    assert model.spec.num_linear_layers == 3
    counts = count_params(model.spec)
    assert sum(p.numel() for p in model.parameters()) == counts.total_params - counts.total["encoder"].total


# --- against transformers -----------------------------------------------------------------------------------------


def _interleave_per_key_head(parts: list[torch.Tensor], key_heads: int) -> torch.Tensor:
    """Rows [part 0 | part 1 | ...] -> per key head [part 0 of head j | part 1 of head j | ...] (Qwen3-Next's
    in_proj_qkvz and in_proj_ba, transformers Qwen3NextGatedDeltaNet.fix_query_key_value_ordering)."""
    return torch.cat([p.reshape(key_heads, -1, p.shape[-1]) for p in parts], dim=1).reshape(-1, parts[0].shape[-1])


def _copy_deltanet(ours: GatedDeltaNet, hf: Any, fused: bool, interleave: bool = True) -> None:
    hv, dv = ours.value_heads, ours.value_dim
    kd = ours.key_heads * ours.key_dim
    q, k, v, z = ours.wqkvz.weight.split([kd, kd, hv * dv, hv * dv])
    b, a = ours.wba.weight.chunk(2)
    if fused:
        order = _interleave_per_key_head if interleave else (lambda parts, heads: torch.cat(parts))
        hf.in_proj_qkvz.weight.copy_(order([q, k, v, z], ours.key_heads))
        hf.in_proj_ba.weight.copy_(order([b, a], ours.key_heads))
    else:
        hf.in_proj_qkv.weight.copy_(torch.cat([q, k, v]))
        hf.in_proj_z.weight.copy_(z)
        hf.in_proj_b.weight.copy_(b)
        hf.in_proj_a.weight.copy_(a)
    hf.conv1d.weight.copy_(ours.conv_weight[:, None])
    for name in ("A_log", "dt_bias"):
        getattr(hf, name).copy_(getattr(ours, name))
    hf.norm.weight.copy_(ours.norm.weight)
    hf.out_proj.weight.copy_(ours.wo.weight)


def _copy_gated_attention(ours: Any, hf: Any, swap_gate: bool = False) -> None:
    """wqkv's query rows, per head [query | gate], are q_proj's as transformers lays them out; ``swap_gate`` copies
    them as [gate | query] (a wrong split, for the mutation check)."""
    q_out, kv_out = ours.heads * ours.head_dim, ours.kv_heads * ours.head_dim
    wq, wk, wv = ours.wqkv.weight.split([2 * q_out, kv_out, kv_out])
    if swap_gate:
        wq = wq.view(ours.heads, 2, ours.head_dim, -1).flip(1).reshape(2 * q_out, -1)
    for dst, w in ((hf.q_proj, wq), (hf.k_proj, wk), (hf.v_proj, wv), (hf.o_proj, ours.wo.weight),
                   (hf.q_norm, ours.q_norm.weight), (hf.k_norm, ours.k_norm.weight)):
        dst.weight.copy_(w)


def _hybrid_twin(transformers: Any, config: dict, **mutation: bool) -> tuple[Transformer, Any]:
    """Our float32 decoder from a small config.json and transformers' model of it with our weights; every 1-D
    weight (zero-centred norms, the gated norm, dt_bias) and A_log drawn away from its default so that it matters,
    the embedding scaled to std 0.1.
    ``mutation`` (interleave=False, swap_gate=True) copies a layout wrongly."""
    ours, hf = twin_models(transformers, config, torch.float32)
    fused = config["model_type"] == "qwen3_next"
    with torch.no_grad():
        for p in ours.parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5)
        ours.tok_embeddings.weight.mul_(0.1)  # Qwen3.5's tied head: logits of magnitude ~1, not ~50
        for block in ours.layers:
            if isinstance(block.attention, GatedDeltaNet):
                block.attention.A_log.uniform_(-2.0, 1.0)
                block.attention.norm.weight.uniform_(0.5, 1.5)
        hf.model.embed_tokens.weight.copy_(ours.tok_embeddings.weight)
        hf.lm_head.weight.copy_(ours.lm_head.weight)
        hf.model.norm.weight.copy_(ours.norm.weight)
        for block, layer in zip(ours.layers, hf.model.layers, strict=True):
            if isinstance(block.attention, GatedDeltaNet):
                _copy_deltanet(block.attention, layer.linear_attn, fused, mutation.get("interleave", True))
            else:
                _copy_gated_attention(block.attention, layer.self_attn, mutation.get("swap_gate", False))
            ffn = copy_norms_and_ffn_to_hf(block, layer)
            if ffn is None:
                continue
            _copy_ffn(layer.mlp.shared_expert, ffn.shared)
            layer.mlp.shared_expert_gate.weight.copy_(ffn.shared_gate.weight)
    return ours, hf


def _largest_difference(ours: Transformer, hf: Any, tokens: torch.Tensor) -> tuple[float, float]:
    """max |our logits - transformers'| / max |transformers' logits| for one prefill and for a prefill of 5 then
    cached decode steps."""
    ours.setup_caches(batch=tokens.shape[0], max_len=16)
    with torch.inference_mode():
        expected = hf(tokens).logits
        prefill = run_in_chunks(ours, tokens, [tokens.shape[1]])
        decoded = run_in_chunks(ours, tokens, [5] + [1] * (tokens.shape[1] - 5))
    scale = expected.abs().max()
    return float((prefill - expected).abs().max() / scale), float((decoded - expected).abs().max() / scale)


@pytest.mark.parametrize("name", CONFIGS)
def test_qwen_hybrids_equal_transformers_with_the_same_weights(name: str) -> None:
    """Qwen3-Next (layers linear x3 + gated attention; fused in_proj_qkvz / in_proj_ba interleaved per key head; MoE
    with a sigmoid-gated shared expert, one dense layer) and Qwen3.5 dense (separate in_proj_qkv / z / b / a, linear
    and attention layers alternating, tied embeddings) in float32 with transformers' weights: the same logits for
    a prefill (our chunked delta rule against transformers' chunked one) and for cached decode (the recurrence):
    bound 1e-5 of the largest logit (~2.5), measured 1.0-4.3e-6 (in float64 0.5-1.2e-6: transformers runs its norms
    and router in float32). Copying q_proj with query and gate swapped, or (Qwen3-Next) in_proj without its
    per-key-head interleave, moves the logits by 60-150 % of the largest: the check sees those layouts."""
    transformers = pytest.importorskip("transformers")
    ours, hf = _hybrid_twin(transformers, CONFIGS[name])
    assert ours.spec.attention_output_gate and ours.spec.rotary_dim == 8
    tokens = torch.randint(1, ours.spec.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    prefill, decoded = _largest_difference(ours, hf, tokens)
    assert prefill < 1e-5 and decoded < 1e-5, (prefill, decoded)
    mutations = [{"swap_gate": True}] + ([{"interleave": False}] if name == "qwen3_next" else [])
    for mutation in mutations:
        wrong = _largest_difference(*_hybrid_twin(transformers, CONFIGS[name], **mutation), tokens)
        assert min(wrong) > 1e-2, (mutation, wrong)
