"""The bundled decoder on small configs of the dense families read from config.json (Seed-OSS, GLM-4-0414, OLMo 2 /
3, SmolLM3, EXAONE 4.0, Granite 3.x): transformers' ForCausalLM with our weights gives our logits, for each family's
numerics (post-norm, sandwich norms, interleaved partial RoPE, NoPE layers, Granite's multipliers)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from test_transformer import run_in_chunks

from tfcalc.calc.params import count_params
from tfcalc.model import Transformer, build_model
from tfcalc.spec.hf_config import spec_from_hf_config

_SMALL = {"vocab_size": 97, "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 6,
          "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 40, "max_position_embeddings": 64,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "pad_token_id": 0,
          "bos_token_id": 1, "eos_token_id": 2}
SMALL = {
    # q/k/v and o biases set apart
    "seed_oss": {**_SMALL, "attention_bias": True, "attention_out_bias": True},
    # sandwich norms, q/k/v biases, interleaved RoPE on half of each head, fused gate_up
    "glm4": {**_SMALL, "attention_bias": True, "partial_rotary_factor": 0.5},
    # post-norm, QK-norm over all heads at once, every projection biased
    "olmo2": {**_SMALL, "attention_bias": True},
    # layers sliding, sliding, full (a 4-token window), YaRN x2 on the full layer only; rope_theta Olmo3Config's
    # default, which transformers 5.25 gives the sliding layers whatever rope_theta says (its
    # convert_rope_params_to_dict pops rope_theta for the full layers first): the released 7B and 32B use it
    "olmo3": {**_SMALL, "sliding_window": 4, "rope_theta": 500000.0,
              "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32,
                               "beta_fast": 32.0, "beta_slow": 1.0},
              "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
    # layer 1 without RoPE, tied embeddings
    "smollm3": {**_SMALL, "no_rope_layers": [1, 0, 1], "tie_word_embeddings": True},
    # 4 layers: sliding, global (NoPE), sliding, global (NoPE); per-head QK-norm, post-norm
    "exaone4": {**_SMALL, "num_hidden_layers": 4, "sliding_window": 4, "sliding_window_pattern": 2},
    # every multiplier away from 1, the attention scale too (1/8, not 16^-1/2)
    "granite": {**_SMALL, "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.125,
                "logits_scaling": 8.0},
}


def _copy_to_transformers(ours: Transformer, hf: Any) -> None:
    """Our weights under transformers' names: wqkv split into q, k, v (and their biases), wo, QK-norms, the MLP
    (GLM-4's fused gate_up as it is) and each layer's norms by where they sit."""
    spec = ours.spec
    hf.model.embed_tokens.weight.copy_(ours.tok_embeddings.weight)
    hf.model.norm.weight.copy_(ours.norm.weight)
    if not spec.tie_word_embeddings:
        hf.lm_head.weight.copy_(ours.lm_head.weight)
    widths = [spec.num_attention_heads * spec.head_dim] + [spec.num_kv_heads * spec.head_dim] * 2
    for block, layer in zip(ours.layers, hf.model.layers, strict=True):
        a, h = block.attention, layer.self_attn
        for name, w in zip(("q_proj", "k_proj", "v_proj"), a.wqkv.weight.split(widths), strict=True):
            getattr(h, name).weight.copy_(w)
        if a.wqkv.bias is not None:
            for name, b in zip(("q_proj", "k_proj", "v_proj"), a.wqkv.bias.split(widths), strict=True):
                getattr(h, name).bias.copy_(b)
        h.o_proj.weight.copy_(a.wo.weight)
        if a.wo.bias is not None:
            h.o_proj.bias.copy_(a.wo.bias)
        if a.q_norm is not None:
            h.q_norm.weight.copy_(a.q_norm.weight)
            h.k_norm.weight.copy_(a.k_norm.weight)
        mlp = layer.mlp
        if hasattr(mlp, "gate_up_proj"):
            mlp.gate_up_proj.weight.copy_(block.ffn.w_in.weight)
        else:
            gate, up = block.ffn.w_in.weight.chunk(2)
            mlp.gate_proj.weight.copy_(gate)
            mlp.up_proj.weight.copy_(up)
        mlp.down_proj.weight.copy_(block.ffn.w_out.weight)
        if spec.norm_placement == "post":
            pairs = ((layer.post_attention_layernorm, block.post_attention_norm),
                     (layer.post_feedforward_layernorm, block.post_ffn_norm))
        elif spec.norms_per_layer == 4:
            pairs = ((layer.input_layernorm, block.attention_norm), (layer.post_self_attn_layernorm,
                                                                     block.post_attention_norm),
                     (layer.post_attention_layernorm, block.ffn_norm), (layer.post_mlp_layernorm, block.post_ffn_norm))
        else:
            pairs = ((layer.input_layernorm, block.attention_norm), (layer.post_attention_layernorm, block.ffn_norm))
        for dst, src in pairs:
            dst.weight.copy_(src.weight)


@pytest.mark.parametrize("model_type", sorted(SMALL))
def test_bundled_decoder_equals_transformers(model_type: str) -> None:
    """Each family's small config.json, run by the bundled decoder and by transformers' ForCausalLM with the same
    weights (every norm and bias drawn away from its default): the same logits for one prefill of 11 tokens (past
    the 4-token windows) and for a prefill of 5 then cached decode. transformers' norms run in float32 inside a
    float64 model, which bounds the agreement near 1e-7."""
    transformers = pytest.importorskip("transformers")
    config = {**SMALL[model_type], "model_type": model_type}
    torch.manual_seed(0)
    ours = build_model(spec_from_hf_config(config, origin="small", name=model_type), dtype=torch.float64)
    with torch.no_grad():
        for p in ours.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    fields = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = transformers.AutoConfig.for_model(model_type, **fields, attn_implementation="eager")
    hf = transformers.AutoModelForCausalLM.from_config(hf_config).to(torch.float64).eval()
    with torch.no_grad():
        _copy_to_transformers(ours, hf)
    assert sum(p.numel() for p in hf.parameters()) == count_params(ours.spec).total_params
    tokens = torch.randint(1, ours.spec.vocab_size, (2, 11))
    ours.setup_caches(batch=2, max_len=16)
    with torch.inference_mode():
        expected = hf(tokens).logits
    for chunks in ([11], [5] + [1] * 6):
        torch.testing.assert_close(run_in_chunks(ours, tokens, chunks), expected, atol=1e-6, rtol=1e-6)
    assert math.isfinite(float(expected.abs().max()))
