"""The bundled decoder on a small Llama-Nemotron NAS config (DeciLM: per-layer MLP widths, layers without attention):
transformers has no DeciLM class, so the reference is its LlamaForCausalLM with each layer rebuilt as the block
config says (vLLM nemotron_nas.py DeciLMDecoderLayer): the MLP at the layer's width, a no-op attention contributing
nothing and holding no norm."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_dense_families import _copy_to_transformers
from test_transformer import run_in_chunks

from tfcalc.calc.params import count_params
from tfcalc.model import build_model
from tfcalc.spec.hf_config import spec_from_hf_config


def _block(no_op: bool, ffn_mult: float) -> dict[str, Any]:
    return {"attention": {"no_op": no_op, "replace_with_linear": False, "n_heads_in_group": None if no_op else 3},
            "ffn": {"no_op": False, "replace_with_linear": False, "ffn_mult": ffn_mult}}


# hidden 48: widths int(2 x mult x 48 / 3) rounded up to 256 -> 256 for 1.0 and 2.0, 512 for 10.0
SMALL = {"model_type": "nemotron-nas", "vocab_size": 97, "hidden_size": 48, "num_hidden_layers": 4,
         "num_attention_heads": 6, "num_key_value_heads": None, "intermediate_size": None, "hidden_act": "silu",
         "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
         "attention_bias": False, "mlp_bias": False,
         "block_configs": [_block(False, 10.0), _block(True, 1.0), _block(False, 2.0), _block(True, 10.0)]}


class _NoAttention(torch.nn.Module):
    """A DeciLM no-op attention: the residual stream passes unchanged."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return torch.zeros_like(hidden_states), None


def test_bundled_decoder_equals_llama_rebuilt_per_block_config() -> None:
    """Prefill of 11 tokens, and 5 then cached decode, give the rebuilt Llama's logits; parameter counts agree once
    the rebuilt model's unused input norms of the no-op layers are left out."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    spec = spec_from_hf_config(SMALL, origin="small", name="nas-small")
    assert spec.mixer_free_layers == (1, 3) and spec.layer_intermediate_sizes == (512, 256, 256, 512)
    ours = build_model(spec, dtype=torch.float64)
    with torch.no_grad():
        for p in ours.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    hf_config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=48, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
        intermediate_size=512, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, attn_implementation="eager")
    hf = transformers.LlamaForCausalLM(hf_config).to(torch.float64).eval()
    for i, layer in enumerate(hf.model.layers):
        width = spec.layer_intermediate_sizes[i]
        narrow = transformers.LlamaConfig(**{**hf_config.to_dict(), "intermediate_size": width})
        layer.mlp = transformers.models.llama.modeling_llama.LlamaMLP(narrow).to(torch.float64)
        if i in spec.mixer_free_layers:
            layer.self_attn = _NoAttention()
    with torch.no_grad():
        _copy_attention_free(ours, hf)
    unused = sum(hf.model.layers[i].input_layernorm.weight.numel() for i in spec.mixer_free_layers)
    assert sum(p.numel() for p in hf.parameters()) - unused == count_params(spec).total_params
    tokens = torch.randint(1, spec.vocab_size, (2, 11))
    ours.setup_caches(batch=2, max_len=16)
    with torch.inference_mode():
        expected = hf(tokens).logits
    for chunks in ([11], [5] + [1] * 6):
        torch.testing.assert_close(run_in_chunks(ours, tokens, chunks), expected, atol=1e-6, rtol=1e-6)


def _copy_attention_free(ours: Any, hf: Any) -> None:
    """_copy_to_transformers, with the no-op layers' attention left out: their FFN norm is Llama's
    post_attention_layernorm and their MLP the layer's."""
    blocks = list(ours.layers)
    full = [i for i, b in enumerate(blocks) if b.attention is not None]
    skipped = [i for i in range(len(blocks)) if i not in full]
    kept, moved = hf.model.layers, torch.nn.ModuleList([hf.model.layers[i] for i in full])
    ours_kept = torch.nn.ModuleList([blocks[i] for i in full])
    ours.layers, hf.model.layers = ours_kept, moved
    try:
        _copy_to_transformers(ours, hf)
    finally:
        ours.layers, hf.model.layers = torch.nn.ModuleList(blocks), kept
    for i in skipped:
        block, layer = blocks[i], hf.model.layers[i]
        gate, up = block.ffn.w_in.weight.chunk(2)
        layer.mlp.gate_proj.weight.copy_(gate)
        layer.mlp.up_proj.weight.copy_(up)
        layer.mlp.down_proj.weight.copy_(block.ffn.w_out.weight)
        layer.post_attention_layernorm.weight.copy_(block.ffn_norm.weight)
