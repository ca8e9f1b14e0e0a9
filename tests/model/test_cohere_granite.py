"""The bundled decoder on small Command R / R7B (cohere, cohere2) and Granite 4.0 (granitemoehybrid) configs:
transformers' CohereForCausalLM, Cohere2ForCausalLM and GraniteMoeHybridForCausalLM with our weights give our logits
(prefill, cached decode, chunked prefill), each modelled feature matters, and 2 CPU ranks compute the one-rank model
holding what ``tfcalc plan`` counts per GPU.

Cohere's logit_scale (as logits_scaling = 1 / logit_scale) and Granite's embedding, residual, logit and attention
multipliers are modelled: the configs set them away from 1."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from shard_jobs import Case
from small_configs import small_config_spec
from test_nemotron_h import _copy_mamba
from test_parallel import _check, _run
from test_transformer import _copy_attention_to_hf, logit_differences, twin_models

from tfcalc.calc.params import count_params
from tfcalc.model import Transformer
from tfcalc.model.layers import Attention, HeadNorm, MoE
from tfcalc.model.mamba import Mamba2Mixer

# Command R+-like: 3 layers of hidden 48, 6 query heads of 8 over 2 KV heads with a LayerNorm weight per head on q
# and k, a gated MLP of 64 beside the attention, tied embeddings
SMALL_COHERE = {"model_type": "cohere", "architectures": ["CohereForCausalLM"], "vocab_size": 97, "hidden_size": 48,
                "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 64,
                "max_position_embeddings": 64, "layer_norm_eps": 1e-5, "rope_theta": 10000.0, "logit_scale": 0.5,
                "use_qk_norm": True, "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 1,
                "eos_token_id": 2}
# Command R7B-like: 4 layers, 3 sliding (window 4, RoPE) then 1 global without RoPE
SMALL_COHERE2 = {**SMALL_COHERE, "model_type": "cohere2", "architectures": ["Cohere2ForCausalLM"],
                 "num_hidden_layers": 4, "use_qk_norm": False, "sliding_window": 4, "logit_scale": 0.25}
# Granite 4.0 H-Tiny-like: Mamba-2 (6 heads of 16 = 2 x 48, 2 B/C groups of state 8, chunks of 8) on layers 0, 2, 3
# and NoPE attention scaled by 0.2 on layer 1; on every layer 4 experts of 24 (top 2) beside a shared MLP of 32
SMALL_GRANITE = {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "vocab_size": 97,
                 "hidden_size": 48, "num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 2,
                 "intermediate_size": 24, "shared_intermediate_size": 32, "num_local_experts": 4,
                 "num_experts_per_tok": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
                 "layer_types": ["mamba", "attention", "mamba", "mamba"], "mamba_n_heads": 6, "mamba_d_head": 16,
                 "mamba_n_groups": 2, "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_chunk_size": 8,
                 "attention_multiplier": 0.2, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                 "logits_scaling": 8.0, "position_embedding_type": "nope", "tie_word_embeddings": False}
# Granite 4.0 H-Micro-like: no experts, the shared MLP (32) each layer's dense FFN
SMALL_GRANITE_DENSE = {**SMALL_GRANITE, "num_local_experts": 0, "num_experts_per_tok": 0}
CONFIGS = {"cohere": SMALL_COHERE, "cohere2": SMALL_COHERE2, "granite": SMALL_GRANITE,
           "granite dense": SMALL_GRANITE_DENSE}
TOTAL = 21  # tokens: past the 4-token window, over two 8-token Mamba-2 chunks and a padded third
RUNS = {"prefill": [TOTAL], "decode": [10] + [1] * (TOTAL - 10), "chunks": [9, 2, 7, 1, 2]}


def _copy_cohere(ours: Transformer, hf: Any) -> None:
    """Embedding (tied head), final norm; per layer its one input LayerNorm, q/k/v/o, the per-head q and k norms and
    the gated MLP."""
    hf.model.embed_tokens.weight.copy_(ours.tok_embeddings.weight)
    hf.model.norm.weight.copy_(ours.norm.weight)
    for block, layer in zip(ours.layers, hf.model.layers, strict=True):
        layer.input_layernorm.weight.copy_(block.attention_norm.weight)
        _copy_attention_to_hf(ours, block.attention, layer.self_attn)
        if block.attention.q_norm is not None:
            layer.self_attn.q_norm.weight.copy_(block.attention.q_norm.weight)
            layer.self_attn.k_norm.weight.copy_(block.attention.k_norm.weight)
        gate, up = block.ffn.w_in.weight.chunk(2)
        layer.mlp.gate_proj.weight.copy_(gate)
        layer.mlp.up_proj.weight.copy_(up)
        layer.mlp.down_proj.weight.copy_(block.ffn.w_out.weight)


def _copy_granite(ours: Transformer, hf: Any) -> None:
    """Embedding, head, final norm; per layer its two RMSNorms, Mamba-2 or q/k/v/o, the shared MLP (input_linear =
    [gate | up]) and the MoE's router and expert stacks."""
    hf.model.embed_tokens.weight.copy_(ours.tok_embeddings.weight)
    hf.lm_head.weight.copy_(ours.lm_head.weight)
    hf.model.norm.weight.copy_(ours.norm.weight)
    for block, layer in zip(ours.layers, hf.model.layers, strict=True):
        layer.input_layernorm.weight.copy_(block.attention_norm.weight)
        layer.post_attention_layernorm.weight.copy_(block.ffn_norm.weight)
        if isinstance(block.attention, Mamba2Mixer):
            _copy_mamba(block.attention, layer.mamba)
        else:
            _copy_attention_to_hf(ours, block.attention, layer.self_attn)
        ffn = block.ffn
        shared = ffn.shared if isinstance(ffn, MoE) else ffn
        layer.shared_mlp.input_linear.weight.copy_(shared.w_in.weight)
        layer.shared_mlp.output_linear.weight.copy_(shared.w_out.weight)
        if isinstance(ffn, MoE):
            layer.block_sparse_moe.router.weight.copy_(ffn.router.weight)
            layer.block_sparse_moe.experts.gate_up_proj.copy_(ffn.w_in)
            layer.block_sparse_moe.experts.down_proj.copy_(ffn.w_out)


def _twin(transformers: Any, name: str) -> tuple[Transformer, Any]:
    """Our decoder and transformers' of CONFIGS[name] with our weights, every norm weight (and Mamba-2's D and gated
    norm) drawn in [0.5, 1.5], dt_bias in [-1, 1] and A_log in [-2, 1], so that each matters: float64 for Cohere
    (transformers' LayerNorms run in float32), float32 for Granite (its Mamba-2 reference scan)."""
    config = CONFIGS[name]
    ours, hf = twin_models(transformers, config, torch.float32 if name.startswith("granite") else torch.float64)
    with torch.no_grad():
        for key, p in ours.named_parameters():
            if p.dim() == 1 or "norm" in key:
                p.uniform_(0.5, 1.5)
        for block in ours.layers:
            if isinstance(block.attention, Mamba2Mixer):
                block.attention.dt_bias.uniform_(-1.0, 1.0)
                block.attention.A_log.uniform_(-2.0, 1.0)
        (_copy_granite if name.startswith("granite") else _copy_cohere)(ours, hf)
    return ours, hf


def _relative_differences(ours: Transformer, hf: Any) -> dict[str, float]:
    """max |our logits - transformers'| / max |transformers' logits| per run of :data:`RUNS`."""
    tokens = torch.randint(1, ours.spec.vocab_size, (2, TOTAL), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        biggest = float(hf(tokens).logits.abs().max())
    return {run: d / biggest for run, d in logit_differences(ours, hf, tokens, RUNS, max_len=24).items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_equals_transformers_with_the_same_weights(name: str) -> None:
    """Same logits for a 21-token prefill, a 10-token prefill then 11 decode steps, and prefill chunks carrying the
    caches and states; bound 1e-5 of the largest logit (measured 1e-7 for Cohere: transformers' LayerNorms in float32;
    4-5e-7 for Granite in float32). The decoder holds as many parameters as transformers and ``count_params``."""
    transformers = pytest.importorskip("transformers")
    ours, hf = _twin(transformers, name)
    held = sum(p.numel() for p in ours.parameters())
    assert held == sum(p.numel() for p in hf.parameters()) == count_params(ours.spec).total_params
    differences = _relative_differences(ours, hf)
    assert max(differences.values()) < 1e-5, differences


def _sequential(block: torch.nn.Module) -> None:
    """A Cohere block run as a pre-norm pair with one shared norm: x + attn(n(x)), then + ffn(n(x'))."""
    block.parallel, block.ffn_norm = False, block.attention_norm


def _mutate(ours: Transformer, change: str) -> None:
    if change == "no logit scale":
        ours.logits_scale = None
    elif change == "no embedding multiplier":
        ours.embed_scale = None
    for block in ours.layers:
        if change == "no residual multiplier":
            block.residual = None
        mixer = block.attention
        if change == "sequential block":
            _sequential(block)
        elif not isinstance(mixer, Attention):
            continue
        elif change == "rope on halves":
            mixer.interleaved = False
        elif change == "one q-norm weight for every head":
            assert isinstance(mixer.q_norm, HeadNorm)
            mixer.q_norm.weight.copy_(mixer.q_norm.weight[:1].expand_as(mixer.q_norm.weight))
        elif change == "rope on the global layers":
            mixer.rotary = True
        elif change == "scores scaled by head_dim^-1/2":
            mixer.scale = mixer.head_dim ** -0.5


@pytest.mark.parametrize("name, change", [
    ("cohere", "sequential block"), ("cohere", "rope on halves"), ("cohere", "one q-norm weight for every head"),
    ("cohere", "no logit scale"), ("cohere2", "sequential block"), ("cohere2", "rope on the global layers"),
    ("granite", "scores scaled by head_dim^-1/2"), ("granite", "no logit scale"),
    ("granite", "no embedding multiplier"), ("granite", "no residual multiplier")])
def test_each_feature_moves_the_logits(name: str, change: str) -> None:
    """Without one of its features (attention and MLP side by side, RoPE on adjacent pairs, a q-norm weight per head,
    no RoPE on Cohere2's global layers, the logit scale, Granite's attention, embedding and residual multipliers) our
    model is far from transformers' (more than 1e-4 of the largest logit in every run, the attention scale's 7e-4
    the least), against 1e-5 with all of them."""
    transformers = pytest.importorskip("transformers")
    ours, hf = _twin(transformers, name)
    with torch.no_grad():
        _mutate(ours, change)
    differences = _relative_differences(ours, hf)
    assert min(differences.values()) > 1e-4, differences


def test_two_ranks_compute_the_one_rank_model() -> None:
    """tp 2: Cohere's per-head q and k norm weights kept with their heads (3 query heads and 1 KV head a rank), the
    attention and the MLP beside it each reduced once; Granite's Mamba-2 (3 heads and one B/C group a rank), NoPE
    attention and experts sliced by tp beside the shared expert, and the same experts placed by ep 2."""
    cases = [Case("cohere tp 2", small_config_spec(SMALL_COHERE), 2, 1),
             Case("cohere2 tp 2", small_config_spec(SMALL_COHERE2), 2, 1),
             Case("granite tp 2", small_config_spec(SMALL_GRANITE), 2, 1),
             Case("granite ep 2", small_config_spec(SMALL_GRANITE), 1, 2)]
    _check(cases, _run(cases, 2))
