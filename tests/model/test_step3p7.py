"""The bundled decoder on a small Step-3.7 config (step3p7, aiconfigurator's flat form): transformers' Step3p7TextModel
with an untied head and our weights gives our logits (prefill, cached decode, chunked prefill) with its per-head
attention gate, (1 + w) norms, sliding layers and sigmoid-routed experts with a correction bias and a shared expert;
2 CPU ranks compute the one-rank model holding what ``tfcalc plan`` counts per GPU.

Not modelled by the decoder (no size depends on them): ``swiglu_limits`` / ``swiglu_limits_shared``, the clamps
Step-3.7-Flash's released checkpoint sets on its last layers; the small config sets none."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from shard_jobs import Case
from small_configs import small_config_spec
from test_parallel import _check, _run
from test_transformer import logit_differences

from tfcalc.calc.params import count_params
from tfcalc.model import Transformer, build_model
from tfcalc.model.layers import MoE

# 4 layers of hidden 48: full, sliding, sliding, sliding (window 4), 6 query heads of 8 over 2 KV heads; layer 0 a
# dense MLP of 64, layers 1-3 four experts of 16 (top 2, scaled by 2) beside a shared expert of 24; one MTP layer
SMALL_STEP = {"model_type": "step3p7", "architectures": ["Step3p7FlashForCausalLM"], "vocab_size": 97,
              "hidden_size": 48, "num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 2,
              "head_dim": 8, "intermediate_size": 64, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
              "sliding_window": 4, "layer_types": ["full_attention"] + ["sliding_attention"] * 3,
              "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "share_expert_dim": 24,
              "moe_layers_enum": "1,2,3", "moe_router_scaling_factor": 2.0, "num_nextn_predict_layers": 1,
              "pad_token_id": 0}
TOTAL = 13  # tokens: past the 4-token window
RUNS = {"prefill": [TOTAL], "decode": [6] + [1] * (TOTAL - 6), "chunks": [5, 2, 4, 1, 1]}


class _StepLM(torch.nn.Module):
    """Step3p7TextModel and an lm_head: logits = head(model(tokens)) as Step3p7ForConditionalGeneration's text path."""

    def __init__(self, transformers: Any, config: dict) -> None:
        super().__init__()
        from transformers.models.step3p7.modeling_step3p7 import Step3p7TextModel

        fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
        text = transformers.AutoConfig.for_model("step3p5", **fields, attn_implementation="eager",
                                                 experts_implementation="eager")
        self.model = Step3p7TextModel(text)
        self.lm_head = torch.nn.Linear(text.hidden_size, text.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.lm_head(self.model(tokens).last_hidden_state))


def _copy_step(ours: Transformer, hf: _StepLM) -> None:
    """Embedding, head, final norm; per layer its two norms, wqkv split into q, k, v and the per-head gate g, o, the
    q and k norms, and the dense MLP or the router (and its score bias), the expert stacks and the shared expert."""
    spec = ours.spec
    hf.model.embed_tokens.weight.copy_(ours.tok_embeddings.weight)
    hf.lm_head.weight.copy_(ours.lm_head.weight)
    hf.model.norm.weight.copy_(ours.norm.weight)
    widths = [spec.num_attention_heads * spec.head_dim] + [spec.num_kv_heads * spec.head_dim] * 2 + [
        spec.num_attention_heads]
    for block, layer in zip(ours.layers, hf.model.layers, strict=True):
        layer.input_layernorm.weight.copy_(block.attention_norm.weight)
        layer.post_attention_layernorm.weight.copy_(block.ffn_norm.weight)
        a, h = block.attention, layer.self_attn
        for name, w in zip(("q_proj", "k_proj", "v_proj", "g_proj"), a.wqkv.weight.split(widths), strict=True):
            getattr(h, name).weight.copy_(w)
        h.o_proj.weight.copy_(a.wo.weight)
        h.q_norm.weight.copy_(a.q_norm.weight)
        h.k_norm.weight.copy_(a.k_norm.weight)
        ffn = block.ffn
        dense = ffn.shared if isinstance(ffn, MoE) else ffn
        mlp = layer.mlp.shared_experts if isinstance(ffn, MoE) else layer.mlp
        gate, up = dense.w_in.weight.chunk(2)
        mlp.gate_proj.weight.copy_(gate)
        mlp.up_proj.weight.copy_(up)
        mlp.down_proj.weight.copy_(dense.w_out.weight)
        if isinstance(ffn, MoE):
            layer.mlp.gate.weight.copy_(ffn.router.weight)
            layer.mlp.gate.e_score_correction_bias.copy_(ffn.score_bias)
            layer.mlp.experts.gate_up_proj.copy_(ffn.w_in)
            layer.mlp.experts.down_proj.copy_(ffn.w_out)


def test_equals_transformers_with_the_same_weights() -> None:
    """Same logits for a 13-token prefill, a 6-token prefill then 7 decode steps, and prefill chunks carrying the
    caches, in float64 with every norm weight drawn in [-0.5, 0.5] (the norms scale by 1 + w) and the router's score
    bias in [-0.1, 0.1]; bound 1e-6 of the largest logit (transformers' norms and router run in float32). The decoder
    holds as many parameters as transformers (its score bias a buffer there) and ``count_params``."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = build_model(small_config_spec(SMALL_STEP), dtype=torch.float64)
    hf = _StepLM(transformers, SMALL_STEP).to(torch.float64).eval()
    with torch.no_grad():
        for key, p in ours.named_parameters():
            if p.dim() == 1 and "norm" in key:
                p.uniform_(-0.5, 0.5)
        for block in ours.layers:
            if isinstance(block.ffn, MoE):
                block.ffn.score_bias.uniform_(-0.1, 0.1)
        _copy_step(ours, hf)
    held = sum(p.numel() for p in ours.parameters())
    buffers = sum(b.numel() for n, b in hf.state_dict().items() if n.endswith("e_score_correction_bias"))
    assert held == sum(p.numel() for p in hf.parameters()) + buffers == count_params(ours.spec).total_params
    tokens = torch.randint(1, ours.spec.vocab_size, (2, TOTAL), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        biggest = float(hf(tokens).logits.abs().max())
    differences = {run: d / biggest for run, d in logit_differences(ours, hf, tokens, RUNS, max_len=16).items()}
    assert max(differences.values()) < 1e-6, differences


def test_two_ranks_compute_the_one_rank_model() -> None:
    """tp 2: 3 query heads, their 3 gate rows and 1 KV head a rank, the experts and shared expert sliced; ep 2: the
    experts placed two a rank."""
    cases = [Case("step3p7 tp 2", small_config_spec(SMALL_STEP), 2, 1),
             Case("step3p7 ep 2", small_config_spec(SMALL_STEP), 1, 2)]
    _check(cases, _run(cases, 2))
