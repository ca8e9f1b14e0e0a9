"""The whole decoder: cached decoding equals the full forward, causality, backends, and the calculator's
parameter and KV-cache figures reproduced by the instantiated model."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from small_configs import SMALL_GLM4_MOE, SMALL_MIMO_V2_FLASH, SMALL_MINIMAX_M2, small_config_spec

from tfcalc.calc.kv_cache import kv_cache_bytes
from tfcalc.calc.params import count_params
from tfcalc.dtypes import get_dtype
from tfcalc.errors import UsageError
from tfcalc.model import Transformer, build_model
from tfcalc.model.layers import SDPA_BACKENDS, backend_works
from tfcalc.spec.model import ModelSpec
from tfcalc.spec.presets import load_model, preset_names

# Architectures the decode tests cover, each scaled down (tests/model/conftest.py): dense GQA with Llama 3 rope
# scaling, QKV bias, MHA with sliding windows, Gemma 2 (4 norms, GeGLU, tied, alternating windows, soft-capping),
# Mixtral MoE, Qwen3 MoE (QK-norm), gpt-oss (sinks, biases, clamped SwiGLU, MQA-like ratio, windows, yarn),
# DeepSeek-V3 (MLA, yarn, dense + MoE layers, sigmoid group routing).
DECODE_PRESETS = ["llama3.2-1b", "qwen2.5-7b", "phi3-mini", "gemma2-9b", "mixtral-8x7b", "qwen3-30b-a3b",
                  "gpt-oss-20b", "deepseek-v3"]
FLEX_PRESETS = ("llama3.2-1b", "gemma2-9b", "gpt-oss-20b", "deepseek-v3")  # plain, soft-capped, sinks, MLA
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}


def run_in_chunks(model: Transformer, tokens: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """Prefill the chunks in turn (a chunk of 1 is a decode step); logits for every token [B, T, V]."""
    model.reset()
    out, start = [], 0
    with torch.inference_mode():
        for n in chunks:
            piece = tokens[:, start:start + n]
            out.append(model.decode_step(piece) if n == 1 else model.prefill(piece))
            start += n
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("preset", DECODE_PRESETS)
def test_cached_decode_and_chunked_prefill_equal_full_forward(make_spec, preset: str, dtype: torch.dtype) -> None:
    """Every decode path (live slice, flex live blocks, static mask) and chunked prefill give the logits of one
    full prefill, past the 4-token window of the rolling buffers (13 tokens)."""
    torch.manual_seed(0)
    spec = make_spec(preset)
    model = build_model(spec, dtype=dtype)
    model.setup_caches(batch=2, max_len=16)
    tokens = torch.randint(0, spec.vocab_size, (2, 13))
    full = run_in_chunks(model, tokens, [13])
    assert full.shape == (2, 13, spec.vocab_size)
    modes = ("live",) if dtype != torch.float64 else ("live", "static", "flex") if preset in FLEX_PRESETS else (
        "live", "static")  # eager flex runs through dynamo: ~0.5 s a test, so once per kind of attention
    for mode in modes:
        model.decode_attention = mode
        decoded = run_in_chunks(model, tokens, [6] + [1] * 7)
        assert (decoded - full).abs().max() < TOLERANCE[dtype], mode
    chunked = run_in_chunks(model, tokens, [5, 4, 1, 3])
    assert (chunked - full).abs().max() < TOLERANCE[dtype]
    assert int(model.cache_pos) == 13


@pytest.mark.parametrize("preset", ["llama3.2-1b", "gemma2-9b", "gpt-oss-20b", "qwen3.5-27b"])
def test_perturbing_token_t_changes_no_earlier_output(make_spec, preset: str) -> None:
    torch.manual_seed(0)
    spec = make_spec(preset)
    model = build_model(spec, dtype=torch.float64)
    model.setup_caches(batch=1, max_len=12)
    tokens = torch.randint(0, spec.vocab_size, (1, 12))
    changed = tokens.clone()
    changed[0, 7] = (tokens[0, 7] + 1) % spec.vocab_size
    a, b = run_in_chunks(model, tokens, [12]), run_in_chunks(model, changed, [12])
    # Not bit-equal for MoE: an expert's GEMM over a different set of rows may round differently (~1e-16).
    torch.testing.assert_close(a[:, :7], b[:, :7], atol=1e-12, rtol=0)
    assert (a[:, 7:] - b[:, 7:]).abs().amax(dim=-1).min() > 1e-6


def test_sliding_window_limits_what_a_token_sees(make_spec) -> None:
    """One layer with a 4-token window: a change at token 2 reaches tokens 2..5 and nothing after."""
    torch.manual_seed(0)
    spec = make_spec("mistral-7b").with_overrides(layers=1)
    model = build_model(spec, dtype=torch.float64)
    model.setup_caches(batch=1, max_len=12)
    tokens = torch.randint(0, spec.vocab_size, (1, 12))
    changed = tokens.clone()
    changed[0, 2] = (tokens[0, 2] + 1) % spec.vocab_size
    diff = (run_in_chunks(model, tokens, [12]) - run_in_chunks(model, changed, [12])).abs().amax(dim=-1)[0]
    assert (diff[:2] == 0).all() and (diff[2:6] > 0).all() and (diff[6:] == 0).all()


def test_every_available_backend_gives_the_same_logits(make_spec) -> None:
    torch.manual_seed(0)
    spec = make_spec("llama3.2-1b")
    backends = [b for b in SDPA_BACKENDS
                if backend_works(b, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim, torch.float32,
                                 torch.device("cpu"))]
    assert "math" in backends and len(backends) >= 2, backends  # math and the CPU flash kernel
    tokens = torch.randint(0, spec.vocab_size, (2, 10))
    results = {}
    for backend in backends:
        torch.manual_seed(1)
        model = build_model(spec, attention_backend=backend)
        model.setup_caches(batch=2, max_len=16)
        assert model.attention_backend == backend
        results[backend] = run_in_chunks(model, tokens, [7, 1, 1, 1])
    for backend in backends:
        torch.testing.assert_close(results[backend], results["math"], atol=1e-4, rtol=1e-5)


def test_auto_backend_is_resolved_and_reported(make_spec) -> None:
    model = build_model(make_spec("llama3.2-1b"))
    assert model.attention_backend == "auto"
    model.setup_caches(batch=1, max_len=8)
    assert model.attention_backend in SDPA_BACKENDS


def test_unknown_backend_and_cache_overflow_are_refused(make_spec) -> None:
    with pytest.raises(UsageError, match="unknown attention backend"):
        build_model(make_spec("llama3.2-1b"), attention_backend="fast")
    model = build_model(make_spec("llama3.2-1b"))
    model.setup_caches(batch=1, max_len=8)
    model.prefill(torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(UsageError, match="exceeds the cache"):
        model.prefill(torch.zeros(1, 3, dtype=torch.long))


def test_expert_counts_reported_for_moe_layers_only(make_spec) -> None:
    from dataclasses import replace

    spec = make_spec("qwen3-30b-a3b")
    spec = spec.with_overrides(moe=replace(spec.moe, dense_layers=(0,)))
    model = build_model(spec)
    model.setup_caches(batch=2, max_len=8)
    model.prefill(torch.randint(0, spec.vocab_size, (2, 5)))
    counts = model.expert_token_counts()
    assert sorted(counts) == [1, 2]
    assert all(int(c.sum()) == 2 * 5 * spec.moe.experts_per_token for c in counts.values())
    model.decode_step(torch.zeros(2, 1, dtype=torch.long))
    assert all(int(c.sum()) == 2 * spec.moe.experts_per_token for c in model.expert_token_counts().values())


def _refusal(spec: ModelSpec) -> str | None:
    """The one-line refusal the bundled decoder gives a preset it cannot build, else None."""
    if spec.compressed_attention is not None:
        return "the bundled model does not run DeepSeek-V4's compressed attention"
    if spec.sparse_indexer is not None and spec.sparse_indexer.kind == "minimax_m3":
        return "the bundled model does not run MiniMax-M3's block-sparse attention"
    if spec.linear_attention is not None and spec.linear_attention.kind == "kda":
        return r"the bundled model has no Kimi Delta Attention \(KDA\) layer"
    if spec.value_head_dim != spec.head_dim:
        return "the bundled model runs values as wide as keys"
    return None


@pytest.mark.parametrize("preset", preset_names())
def test_parameter_count_equals_calculator(preset: str) -> None:
    """Every preset at 2 layers with its real widths (meta device: no memory), MoE and MLA included; the bundled
    decoder is the text model, so a multimodal preset's vision encoder (which engines load beside it) is not in it.
    A preset whose values are narrower than its keys (MiMo-V2-Flash) or whose attention is DeepSeek-V4's,
    MiniMax-M3's or Kimi Linear's KDA is refused by it, in one line."""
    spec = load_model(preset)
    refusal = _refusal(spec)
    if refusal is not None:
        from tfcalc.errors import SpecError

        with pytest.raises(SpecError, match=refusal):
            build_model(spec, layers=2, device="meta")
        return
    model = build_model(spec, layers=2, device="meta")
    counts = count_params(model.spec)
    assert sum(p.numel() for p in model.parameters()) == counts.total_params - counts.total["encoder"].total


def test_parameter_count_of_a_real_small_model(make_spec) -> None:
    for preset in ("gemma2-9b", "gpt-oss-20b", "deepseek-v3"):
        model = build_model(make_spec(preset))
        assert sum(p.numel() for p in model.parameters()) == count_params(model.spec).total_params


@pytest.mark.parametrize("dtype,name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_kv_cache_bytes_equal_calculator(dtype: torch.dtype, name: str) -> None:
    spec = load_model("llama3.2-1b")
    model = build_model(spec, layers=2, device="meta", dtype=dtype)
    model.setup_caches(batch=3, max_len=1000)
    assert model.kv_cache_bytes() == kv_cache_bytes(model.spec, get_dtype(name), 1000, 3)


@pytest.mark.parametrize("preset", ["gemma2-9b", "mistral-7b", "gpt-oss-20b", "deepseek-v3"])
def test_cache_bytes_equal_calculator_with_window_caps_and_latents(preset: str) -> None:
    """Sliding layers hold a rolling buffer of min(window, length) tokens and MLA a latent of kv_rank + rope
    dims: the caches' bytes are `tfcalc kv-cache`'s figure, below and above the window."""
    for length in (100, 8192):
        model = build_model(load_model(preset), layers=4, device="meta")
        model.setup_caches(batch=2, max_len=length)
        assert model.kv_cache_bytes() == kv_cache_bytes(model.spec, get_dtype("fp32"), length, 2), length


def test_matches_hugging_face_llama_with_the_same_weights(make_spec) -> None:
    """Same config and weights in transformers' LlamaForCausalLM give the same logits (Llama 3 rope scaling)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    spec = make_spec("llama3.2-1b").with_overrides(tie_word_embeddings=False)
    ours = build_model(spec, dtype=torch.float64)
    hf = transformers.LlamaForCausalLM(hf_llama_config(transformers, spec)).double().eval()
    copy_weights_to_hf(ours, hf)
    tokens = torch.randint(0, spec.vocab_size, (2, 11))
    ours.setup_caches(batch=2, max_len=16)
    with torch.inference_mode():  # HF builds its cos/sin in fp32 even for a float64 model: ~1e-7 apart
        torch.testing.assert_close(ours.prefill(tokens), hf(tokens).logits, atol=1e-6, rtol=1e-6)


def hf_llama_config(transformers: Any, spec: ModelSpec) -> Any:
    s = spec.rope_scaling
    return transformers.LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, rms_norm_eps=1e-5,
        max_position_embeddings=spec.max_context, tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters={"rope_type": s.rope_type, "rope_theta": spec.rope_theta, "factor": s.factor,
                         "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                         "original_max_position_embeddings": s.original_max_position_embeddings},
        attn_implementation="sdpa")


def _copy_ends_to_hf(ours: Transformer, hf: Any) -> None:
    """The embedding, the output head and the final norm."""
    hf.model.embed_tokens.weight.copy_(ours.tok_embeddings.weight)
    hf.lm_head.weight.copy_(ours.lm_head.weight)
    hf.model.norm.weight.copy_(ours.norm.weight)


def _copy_attention_to_hf(ours: Transformer, attention: Any, self_attn: Any) -> None:
    """Our fused wqkv (and its bias) split into q_proj, k_proj, v_proj; wo into o_proj."""
    spec = ours.spec
    widths = [spec.num_attention_heads * spec.head_dim] + [spec.num_kv_heads * spec.head_dim] * 2
    names = ("q_proj", "k_proj", "v_proj")
    for name, w in zip(names, attention.wqkv.weight.split(widths), strict=True):
        getattr(self_attn, name).weight.copy_(w)
    if attention.wqkv.bias is not None:
        for name, b in zip(names, attention.wqkv.bias.split(widths), strict=True):
            getattr(self_attn, name).bias.copy_(b)
    self_attn.o_proj.weight.copy_(attention.wo.weight)


def copy_weights_to_hf(ours: Transformer, hf: Any) -> None:
    with torch.no_grad():
        _copy_ends_to_hf(ours, hf)
        for block, layer in zip(ours.layers, hf.model.layers, strict=True):
            _copy_attention_to_hf(ours, block.attention, layer.self_attn)
            gate, up = block.ffn.w_in.weight.chunk(2)
            layer.mlp.gate_proj.weight.copy_(gate)
            layer.mlp.up_proj.weight.copy_(up)
            layer.mlp.down_proj.weight.copy_(block.ffn.w_out.weight)
            layer.input_layernorm.weight.copy_(block.attention_norm.weight)
            layer.post_attention_layernorm.weight.copy_(block.ffn_norm.weight)


@pytest.mark.parametrize("preset", ["llama3.2-1b", "gemma2-9b", "gpt-oss-20b"])
def test_causal_prefill_equals_the_masked_path(make_spec, preset: str) -> None:
    """The fast prefill (is_causal over the new keys; windowed layers longer than the window keep a mask) gives
    the logits of the all-masked path a backend without a causal GQA kernel takes."""
    torch.manual_seed(0)
    model = build_model(make_spec(preset), dtype=torch.float64)
    model.setup_caches(batch=2, max_len=16)
    tokens = torch.randint(0, model.spec.vocab_size, (2, 13))
    assert model.causal_backend is not None
    fast = run_in_chunks(model, tokens, [11, 1, 1])
    model.causal_backend = None
    masked = run_in_chunks(model, tokens, [11, 1, 1])
    torch.testing.assert_close(fast, masked, atol=1e-10, rtol=1e-10)


def hopper_like(backend: str, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                kind: str = "masked", v_dim: int | None = None) -> bool:
    """What torch 2.11 offers a bf16 GQA model with head_dim 256 on an H100 (by sdp_utils.cpp): cuDNN declines the
    head dim, flash takes no mask, mem-efficient no GQA (so only the folded calls), math runs anything."""
    return {"cudnn": False, "flash": kind in ("causal", "open"), "efficient": kind in ("masked", "open"),
            "math": True}[backend]


def test_auto_resolves_each_call_kind_to_a_fused_kernel_and_reports_both(make_spec, monkeypatch) -> None:
    monkeypatch.setattr("tfcalc.model.transformer.backend_works", hopper_like)
    model = build_model(make_spec("llama3.2-1b"))
    model.setup_caches(batch=1, max_len=16)
    assert (model.causal_backend, model.masked_backend) == ("flash", "efficient")
    assert model.decode_backends == {"open": "flash", "masked": "efficient"}
    assert model.attention_backend == "flash"  # causal prefill, live (unmasked) decode
    model.decode_ran = "static"
    assert model.attention_backend == "flash prefill / efficient decode"
    model.decode_ran = "flex"
    assert model.attention_backend == "flash prefill / flex decode"
    windowed = build_model(make_spec("mistral-7b"))  # window 4 in the small spec
    windowed.setup_caches(batch=1, max_len=16)
    windowed.prefill_ran = windowed._ran(8, "fresh")  # a prompt longer than the window: masked, not causal
    assert windowed.attention_backend == "efficient prefill / flash decode"
    windowed.prefill_ran = windowed._ran(3, "fresh")
    assert windowed.attention_backend == "flash"


@pytest.mark.parametrize("forced,causal,masked,reported", [
    ("flash", "flash", "efficient", "flash"),  # flash has no masked call: chunked prefill falls back
    ("efficient", None, "efficient", "efficient"),  # no causal GQA call: its masked call serves prefill too
    ("math", "math", "math", "math"),
])
def test_a_forced_backend_runs_every_call_it_can(make_spec, monkeypatch, forced, causal, masked, reported) -> None:
    monkeypatch.setattr("tfcalc.model.transformer.backend_works", hopper_like)
    model = build_model(make_spec("llama3.2-1b"), attention_backend=forced)
    model.setup_caches(batch=1, max_len=16)
    assert (model.causal_backend, model.masked_backend, model.attention_backend) == (causal, masked, reported)


def test_sink_layers_report_the_explicit_path(make_spec) -> None:
    model = build_model(make_spec("gpt-oss-20b"))
    model.setup_caches(batch=1, max_len=8)
    assert model.attention_backend == "explicit (sinks)"


# --- against transformers: DeepSeek-V3 (MLA, yarn, group routing) and Gemma 2 ------------------------------------


def _copy_ffn(dst: Any, src: Any) -> None:
    gate, up = src.w_in.weight.chunk(2)
    dst.gate_proj.weight.copy_(gate)
    dst.up_proj.weight.copy_(up)
    dst.down_proj.weight.copy_(src.w_out.weight)


def test_deepseek_v3_equals_transformers_with_the_same_weights(make_spec) -> None:
    """Scaled-down DeepSeek-V3 (3 layers: dense, MoE, MoE; MLA q rank 24, latent 16, nope 8, rope 8, v 12; yarn
    factor 40 with mscale 1/1; 8 experts in 4 groups, top 2 groups, 2 experts, bias, x2.5) in transformers'
    DeepseekV3ForCausalLM with our weights: the same logits for a prefill and for cached absorbed decode.
    transformers computes RMSNorm, softmax, router and cos/sin in float32 even in a float64 model, which bounds
    the agreement at ~2e-7 (measured 1.6e-7 on logits of magnitude 2)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    spec = make_spec("deepseek-v3")
    m, moe, s = spec.mla, spec.moe, spec.rope_scaling
    ours = build_model(spec, dtype=torch.float64)
    config = transformers.DeepseekV3Config(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        moe_intermediate_size=moe.expert_intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_attention_heads,
        n_shared_experts=moe.num_shared_experts, n_routed_experts=moe.num_experts,
        routed_scaling_factor=moe.routed_scaling_factor, kv_lora_rank=m.kv_lora_rank, q_lora_rank=m.q_lora_rank,
        qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim, qk_nope_head_dim=m.qk_nope_head_dim,
        n_group=moe.expert_groups, topk_group=moe.groups_per_token, num_experts_per_tok=moe.experts_per_token,
        first_k_dense_replace=len(moe.dense_layers), norm_topk_prob=True, max_position_embeddings=spec.max_context,
        rms_norm_eps=1e-5, tie_word_embeddings=False, rope_interleave=True, attention_bias=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": spec.rope_theta, "factor": s.factor,
                         "original_max_position_embeddings": s.original_max_position_embeddings,
                         "beta_fast": s.beta_fast, "beta_slow": s.beta_slow, "mscale": s.mscale,
                         "mscale_all_dim": s.mscale_all_dim},
        attn_implementation="eager", experts_implementation="eager")
    hf = transformers.DeepseekV3ForCausalLM(config).double().eval()
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(ours.tok_embeddings.weight)
        hf.lm_head.weight.copy_(ours.lm_head.weight)
        hf.model.norm.weight.copy_(ours.norm.weight)
        for block, layer in zip(ours.layers, hf.model.layers, strict=True):
            copy_mla_to_hf(block.attention, layer.self_attn)
            layer.input_layernorm.weight.copy_(block.attention_norm.weight)
            layer.post_attention_layernorm.weight.copy_(block.ffn_norm.weight)
            if block.ffn.__class__.__name__ == "MoE":
                block.ffn.score_bias.uniform_(-0.1, 0.1)  # a bias that changes the choice
                layer.mlp.gate.weight.copy_(block.ffn.router.weight)
                layer.mlp.gate.e_score_correction_bias.copy_(block.ffn.score_bias)
                layer.mlp.experts.gate_up_proj.copy_(block.ffn.w_in)
                layer.mlp.experts.down_proj.copy_(block.ffn.w_out)
                _copy_ffn(layer.mlp.shared_experts, block.ffn.shared)
            else:
                _copy_ffn(layer.mlp, block.ffn)
    tokens = torch.randint(1, spec.vocab_size, (2, 11))
    ours.setup_caches(batch=2, max_len=16)
    with torch.inference_mode():
        expected = hf(tokens).logits
        torch.testing.assert_close(run_in_chunks(ours, tokens, [11]), expected, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(run_in_chunks(ours, tokens, [5] + [1] * 6), expected, atol=1e-6, rtol=1e-6)


def test_gemma2_equals_transformers_with_the_same_weights(make_spec) -> None:
    """Scaled-down Gemma 2 (3 layers sliding/global/sliding, window 4; query_pre_attn_scalar 24, soft caps 5 and
    3 so that both bite, (1 + w) norms with random w, embeddings x sqrt(64)) in transformers' Gemma2ForCausalLM
    (eager attention: SDPA cannot soft-cap) with our weights: the same logits for a prefill and for decode through
    the rolling buffers past the window. transformers' Gemma 2 computes norms (x.float()), softmax and cos/sin
    in float32 whatever the model dtype: measured 1.7e-6 apart on logits capped at 3 (5e-7 relative)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    spec = make_spec("gemma2-9b").with_overrides(query_pre_attn_scalar=24.0, attn_logit_softcapping=5.0,
                                                 final_logit_softcapping=3.0)
    ours = build_model(spec, dtype=torch.float64)
    with torch.no_grad():
        for p in ours.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.3)  # Gemma's norm weights start at 0, the identity scale: move them
    config = transformers.Gemma2Config(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, rms_norm_eps=1e-5,
        sliding_window=spec.sliding_window, query_pre_attn_scalar=int(spec.query_pre_attn_scalar),
        attn_logit_softcapping=spec.attn_logit_softcapping, final_logit_softcapping=spec.final_logit_softcapping,
        layer_types=["sliding_attention" if spec.is_sliding_layer(i) else "full_attention"
                     for i in range(spec.num_layers)],
        max_position_embeddings=spec.max_context, rope_parameters={"rope_type": "default",
                                                                   "rope_theta": spec.rope_theta},
        attn_implementation="eager")
    hf = transformers.Gemma2ForCausalLM(config).double().eval()
    q, kv = spec.num_attention_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(ours.tok_embeddings.weight)
        hf.model.norm.weight.copy_(ours.norm.weight)
        for block, layer in zip(ours.layers, hf.model.layers, strict=True):
            wq, wk, wv = block.attention.wqkv.weight.split([q, kv, kv])
            for dst, w in ((layer.self_attn.q_proj, wq), (layer.self_attn.k_proj, wk), (layer.self_attn.v_proj, wv),
                           (layer.self_attn.o_proj, block.attention.wo.weight)):
                dst.weight.copy_(w)
            _copy_ffn(layer.mlp, block.ffn)
            for dst, src in ((layer.input_layernorm, block.attention_norm),
                             (layer.post_attention_layernorm, block.post_attention_norm),
                             (layer.pre_feedforward_layernorm, block.ffn_norm),
                             (layer.post_feedforward_layernorm, block.post_ffn_norm)):
                dst.weight.copy_(src.weight)
    tokens = torch.randint(1, spec.vocab_size, (2, 11))
    ours.setup_caches(batch=2, max_len=16)
    with torch.inference_mode():
        expected = hf(tokens).logits
        torch.testing.assert_close(run_in_chunks(ours, tokens, [11]), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(run_in_chunks(ours, tokens, [3] + [1] * 8), expected, atol=1e-5, rtol=1e-5)


# --- decode over the live length ----------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["llama3.2-1b", "gemma2-9b", "deepseek-v3"])
def test_live_decode_reads_only_the_filled_slots(make_spec, preset: str, monkeypatch) -> None:
    """Each live decode step hands attention exactly the keys that exist: position + 1 on a full layer (the
    latent for MLA), min(position + 1, window) on a rolling buffer; never the static cache's 32 slots."""
    import tfcalc.model.layers as layers

    seen: list[int] = []
    real_sdpa, real_explicit = layers.F.scaled_dot_product_attention, layers.attention_explicit

    def sdpa(q, k, v, **kwargs):
        seen.append(k.shape[-2])
        return real_sdpa(q, k, v, **kwargs)

    def explicit(q, k, v, *args, **kwargs):
        seen.append(k.shape[-2])
        return real_explicit(q, k, v, *args, **kwargs)

    spec = make_spec(preset)
    model = build_model(spec)
    model.setup_caches(batch=1, max_len=32)
    tokens = torch.randint(0, spec.vocab_size, (1, 9))
    with torch.inference_mode():
        model.prefill(tokens[:, :3])
        monkeypatch.setattr(layers.F, "scaled_dot_product_attention", sdpa)
        monkeypatch.setattr(layers, "attention_explicit", explicit)
        for i in range(3, 9):
            seen.clear()
            model.decode_step(tokens[:, i:i + 1])
            expected = [min(i + 1, spec.sliding_window) if block.attention.window else i + 1 for block in model.layers]
            assert seen == expected


def test_flex_decode_step_captures_as_one_graph(make_spec) -> None:
    """In a compiled decode step (``auto``), attention runs through flex_attention with the live-block mask built
    on the device: torch.compile(fullgraph=True) traces it with no graph break or host read, for dense GQA,
    soft-capped rolling-buffer layers and MLA (aot_eager here, to stay fast on the CPU)."""
    for preset in ("llama3.2-1b", "gemma2-9b", "deepseek-v3"):
        spec = make_spec(preset)
        if spec.moe is not None:  # MoE dispatch reads expert counts on the host: not capturable
            spec = spec.with_overrides(moe=None)
        assert compiled_decode_error(spec) < 1e-4, preset


def compiled_decode_error(spec: ModelSpec) -> float:
    """Largest |logit| difference between 6 decode steps compiled with torch.compile(fullgraph=True) (aot_eager)
    after a 6-token prefill and one 12-token prefill of the same tokens."""
    torch.manual_seed(0)
    model = build_model(spec)
    model.setup_caches(batch=1, max_len=16)
    tokens = torch.randint(0, spec.vocab_size, (1, 12))
    full = run_in_chunks(model, tokens, [12])
    model.reset()
    step = torch.compile(model.decode_step, fullgraph=True, backend="aot_eager")
    with torch.inference_mode():
        model.prefill(tokens[:, :6])
        decoded = torch.cat([step(tokens[:, i:i + 1]) for i in range(6, 12)], dim=1)
    return float((decoded - full[:, 6:]).abs().max())


def test_build_model_builds_in_the_target_dtype_without_a_cast(make_spec, monkeypatch) -> None:
    """No float32 model first (peak 2x the weights on a GPU): parameters are created in bf16 on the device."""
    def no_cast(self, *args, **kwargs):
        raise AssertionError("build_model cast the model")

    monkeypatch.setattr(torch.nn.Module, "to", no_cast)
    model = build_model(make_spec("deepseek-v3"), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32


# --- Gemma 3: the sliding layers' own RoPE base ---------------------------------------------------------------


def _gemma3(**changes: Any) -> ModelSpec:
    """google/gemma-3-1b's config (tests/fixtures/hf_configs) with the 27B's linear x8 scaling on global layers,
    scaled to 6 layers (5 sliding, 1 global) of hidden 64, vocab 128; head_dim 256 kept."""
    import json
    from pathlib import Path

    from tfcalc.model import scale_spec
    from tfcalc.spec.hf_config import spec_from_hf_config

    data = json.loads((Path(__file__).parents[1] / "fixtures/hf_configs/gemma-3-1b.json").read_text())
    data.update({"rope_scaling": {"rope_type": "linear", "factor": 8.0}, **changes})
    spec = spec_from_hf_config(data, "gemma-3-1b.json", "gemma-3-1b")
    return scale_spec(spec, layers=6, hidden=64, intermediate=96, vocab=128).with_overrides(sliding_window=4)


def test_gemma3_rope_tables_equal_transformers_per_layer_type() -> None:
    """cos and sin of the global (theta 1e6, linear x8) and sliding (theta 1e4, unscaled) layers equal
    transformers' Gemma3RotaryEmbedding for each layer type."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    spec = _gemma3()
    config = transformers.Gemma3TextConfig(head_dim=256, rope_theta=1e6, rope_local_base_freq=1e4,
                                           rope_scaling={"rope_type": "linear", "factor": 8.0})
    reference = Gemma3RotaryEmbedding(config)
    model = build_model(spec, dtype=torch.float32)
    model.setup_caches(batch=1, max_len=64)
    positions = torch.arange(64)[None]
    for table, layer_type in ((model.rope, "full_attention"), (model.rope_local, "sliding_attention")):
        cos, sin = reference(torch.zeros(1, dtype=torch.float32), positions, layer_type)
        assert torch.allclose(table[:, 0], cos[0, :, :128], atol=1e-5)
        assert torch.allclose(table[:, 1], sin[0, :, :128], atol=1e-5)


def test_gemma3_sliding_layers_rotate_by_their_base_and_global_layers_by_theta() -> None:
    """A model whose every layer slides computes, with rope_local_base_freq X, what it computes with rope_theta X
    and no local base: the sliding layers take the local table, unscaled."""
    every_layer_slides = {"sliding_window_pattern": 1_000}  # only layer 999, beyond the 6 kept, would be global
    local = _gemma3(rope_local_base_freq=100.0, **every_layer_slides)
    plain = _gemma3(rope_theta=100.0, rope_scaling=None, rope_local_base_freq=None, **every_layer_slides)
    assert len(local.sliding_window_layers) == 6 and plain.rope_local_theta is None
    tokens = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    out = []
    for spec in (local, plain):
        model = build_model(spec, dtype=torch.float64, seed=0)
        model.setup_caches(batch=1, max_len=12)
        out.append(model.prefill(tokens))
    assert torch.equal(out[0], out[1])
    other = _gemma3(rope_local_base_freq=1e4, **every_layer_slides)
    model = build_model(other, dtype=torch.float64, seed=0)
    model.setup_caches(batch=1, max_len=12)
    assert not torch.allclose(model.prefill(tokens), out[0])


# --- against transformers: GLM-4.5 MoE and MiniMax-M2 (partial RoPE, QK-norm per head and across heads) ----------

def copy_norms_and_ffn_to_hf(block: torch.nn.Module, layer: Any) -> torch.nn.Module | None:
    """One block's pre-norms and FFN into a transformers decoder layer: a dense MLP whole; of a MoE the router and
    the routed experts, returning it for the family's own extras (None for a dense MLP)."""
    layer.input_layernorm.weight.copy_(block.attention_norm.weight)
    layer.post_attention_layernorm.weight.copy_(block.ffn_norm.weight)
    ffn = block.ffn
    if ffn.__class__.__name__ != "MoE":
        _copy_ffn(layer.mlp, ffn)
        return None
    layer.mlp.gate.weight.copy_(ffn.router.weight)
    layer.mlp.experts.gate_up_proj.copy_(ffn.w_in)
    layer.mlp.experts.down_proj.copy_(ffn.w_out)
    return ffn


def copy_mla_to_hf(ours: Any, hf: Any) -> None:
    """One MLA layer's projections and latent norms into transformers' DeepseekV3Attention (q_a, q_a norm, q_b, kv_a,
    kv_a norm, kv_b, o): the same weights under its names."""
    for dst, src in ((hf.q_a_proj, ours.wq_a), (hf.q_a_layernorm, ours.q_norm), (hf.q_b_proj, ours.wq),
                     (hf.kv_a_proj_with_mqa, ours.wkv_a), (hf.kv_a_layernorm, ours.kv_norm), (hf.kv_b_proj, ours.wkv_b),
                     (hf.o_proj, ours.wo)):
        dst.weight.copy_(src.weight)


def spread_vector_weights(model: Transformer) -> None:
    """Draw every 1-D weight (norms, scales) in [0.5, 1.5], away from its default, so that each one matters."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)


def logit_differences(ours: Transformer, hf: Any, tokens: torch.Tensor, runs: dict[str, list[int]],
                      max_len: int) -> dict[str, float]:
    """max |our logits - transformers' full forward over ``tokens``| for each run of chunks (:func:`run_in_chunks`)."""
    ours.setup_caches(batch=tokens.shape[0], max_len=max_len)
    with torch.inference_mode():
        expected = hf(tokens).logits
        return {name: float((run_in_chunks(ours, tokens, chunks) - expected).abs().max())
                for name, chunks in runs.items()}


def twin_models(transformers: Any, config: dict, dtype: torch.dtype) -> tuple[Transformer, Any]:
    """Our decoder read from a small config.json and transformers' model of the same config (eager attention and
    experts), both in ``dtype``, seeded; the weights still to be copied."""
    torch.manual_seed(0)
    ours = build_model(small_config_spec(config), dtype=dtype)
    fields = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = transformers.AutoConfig.for_model(config["model_type"], **fields, attn_implementation="eager",
                                                  experts_implementation="eager")
    return ours, transformers.AutoModelForCausalLM.from_config(hf_config).to(dtype).eval()


def _hf_twin(transformers: Any, config: dict) -> tuple[Transformer, Any]:
    """Our decoder read from a small config.json, and transformers' model of the same config with our weights
    (QK-norm weights and router score biases drawn away from their defaults so that they matter)."""
    ours, hf = twin_models(transformers, config, torch.float64)
    with torch.no_grad():
        _copy_ends_to_hf(ours, hf)
        for block, layer in zip(ours.layers, hf.model.layers, strict=True):
            a, h = block.attention, layer.self_attn
            _copy_attention_to_hf(ours, a, h)
            for ours_norm, hf_norm in ((a.q_norm, h.q_norm), (a.k_norm, h.k_norm)):
                ours_norm.weight.uniform_(0.5, 1.5)
                hf_norm.weight.copy_(ours_norm.weight)
            ffn = copy_norms_and_ffn_to_hf(block, layer)
            if ffn is None:
                continue
            ffn.score_bias.uniform_(-0.1, 0.1)
            score_bias = getattr(layer.mlp.gate, "e_score_correction_bias", None)
            (layer.mlp.e_score_correction_bias if score_bias is None else score_bias).copy_(ffn.score_bias)
            if ffn.shared is not None:
                _copy_ffn(layer.mlp.shared_experts, ffn.shared)
    return ours, hf


@pytest.mark.parametrize("config", [SMALL_GLM4_MOE, SMALL_MINIMAX_M2], ids=["glm4_moe", "minimax_m2"])
def test_partial_rope_and_qk_norm_families_equal_transformers(config: dict) -> None:
    """GLM-4.5 (q/k/v biases, per-head QK-norm, half of each head rotated, a dense layer then MoE layers with
    DeepSeek-V3's grouped sigmoid router, x2.5, and a shared expert) and MiniMax-M2 (QK-norm over all heads at
    once, rotary_dim 8 of 16, sigmoid-routed experts on every layer) read from config.json and run with
    transformers' weights: the same logits for a prefill and for cached decode. transformers' routers and norms
    run in float32 inside a float64 model, which bounds the agreement near 1e-7."""
    transformers = pytest.importorskip("transformers")
    ours, hf = _hf_twin(transformers, config)
    assert ours.spec.rotary_dim == 8
    tokens = torch.randint(1, ours.spec.vocab_size, (2, 11))
    ours.setup_caches(batch=2, max_len=16)
    with torch.inference_mode():
        expected = hf(tokens).logits
        torch.testing.assert_close(run_in_chunks(ours, tokens, [11]), expected, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(run_in_chunks(ours, tokens, [5] + [1] * 6), expected, atol=1e-6, rtol=1e-6)


def test_values_narrower_than_keys_are_refused_by_the_bundled_model() -> None:
    """MiMo-V2-Flash's values (v_head_dim) are narrower than its keys: the calculator counts and times them, the
    bundled decoder does not run them and says so in one line (not a wrong-shaped model)."""
    from tfcalc.errors import SpecError

    spec = small_config_spec(SMALL_MIMO_V2_FLASH)
    assert (spec.head_dim, spec.value_head_dim, spec.full_layer_spec.num_kv_heads, spec.num_kv_heads) == (16, 8, 2, 4)
    with pytest.raises(SpecError, match=r"^mimo_v2_flash: the bundled model runs values as wide as keys, not values "
                                        r"of 8 beside keys of 16 \(v_head_dim\)$"):
        build_model(spec)
