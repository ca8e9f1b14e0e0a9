"""Building blocks against naive references: attention on every SDPA backend, GQA/MQA, RoPE, sinks, MoE."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tfcalc.dtypes import get_dtype
from tfcalc.errors import UsageError
from tfcalc.model import build_model
from tfcalc.model.layers import (
    CHUNK,
    FRESH,
    SDPA_BACKENDS,
    STATIC,
    Attention,
    MoE,
    RMSNorm,
    Step,
    apply_rope,
    attend,
    attention_explicit,
    attention_with_sinks,
    backend_works,
    check_kv_dtype,
    flex_attend,
    live_block_mask,
    rope_table,
    sdpa_context,
)
from tfcalc.spec.model import RopeScaling

CPU = torch.device("cpu")


def attach_cache(attn: Attention, batch: int, max_len: int, dtype: torch.dtype) -> None:
    attn.kv_cache = attn.make_cache(batch, max_len, dtype, dtype, CPU)


def step(table: torch.Tensor, lo: int, hi: int, mode: str | None = None) -> Step:
    """Tokens lo..hi-1 as one forward call: FRESH from position 0, else CHUNK (or the given mode)."""
    pos = torch.arange(lo, hi)
    return Step(pos, lo, mode or (FRESH if lo == 0 else CHUNK), table[pos])


def naive_attention(attn: Attention, x: torch.Tensor, rope: torch.Tensor, window: int | None) -> torch.Tensor:
    """softmax(QK^T/sqrt(D) + mask)V with K/V heads repeated, over the whole sequence x [B, T, hidden]."""
    b, t, _ = x.shape
    h, hkv, d = attn.heads, attn.kv_heads, attn.head_dim
    q, k, v = attn.wqkv(x).split([h * d, hkv * d, hkv * d], dim=-1)
    q = apply_rope(q.view(b, t, h, d), rope).transpose(1, 2)
    k = apply_rope(k.view(b, t, hkv, d), rope).transpose(1, 2).repeat_interleave(h // hkv, dim=1)
    v = v.view(b, t, hkv, d).transpose(1, 2).repeat_interleave(h // hkv, dim=1)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (j <= i) & (j > i - (window or t))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d) + torch.where(allowed, 0.0, float("-inf")).to(x.dtype)
    y = scores.softmax(-1) @ v  # [B, H, T, D]
    return attn.wo(y.transpose(1, 2).reshape(b, t, h * d))


def available_backends(attn: Attention, dtype: torch.dtype) -> list[str]:
    return [b for b in SDPA_BACKENDS if backend_works(b, attn.heads, attn.kv_heads, attn.head_dim, dtype, CPU)]


def test_math_and_flash_backends_run_on_this_cpu() -> None:
    works = [b for b in SDPA_BACKENDS if backend_works(b, 4, 2, 16, torch.float32, CPU)]
    assert "math" in works
    if hasattr(torch.backends, "mkldnn"):  # the CPU flash kernel ships with x86/arm builds of torch >= 2.3
        assert "flash" in works, works


@pytest.mark.parametrize("backend", ["math", "flash", "efficient", "cudnn"])
@pytest.mark.parametrize("window", [None, 3])
def test_attention_on_a_cache_matches_naive_reference(make_spec, backend: str, window: int | None) -> None:
    """Prefill 5 tokens, then a 4-token chunk on top of the cache: the chunk's output equals the naive
    reference over all 9 tokens (causal, and windowed when the layer slides)."""
    torch.manual_seed(0)
    dtype = torch.float64
    spec = make_spec("llama3.2-1b").with_overrides(sliding_window=window)
    attn = Attention(spec, sliding=window is not None).to(dtype)
    if not backend_works(backend, attn.heads, attn.kv_heads, attn.head_dim, dtype, CPU):
        pytest.skip(f"SDPA backend {backend} does not run on this machine")
    attach_cache(attn, 2, 16, dtype)
    table = rope_table(spec, 16, dtype, CPU)
    x = torch.randn(2, 9, spec.hidden_size, dtype=dtype)
    with sdpa_context(backend):
        outs = [attn(x[:, lo:hi], step(table, lo, hi)) for lo, hi in ((0, 5), (5, 9))]
    expected = naive_attention(attn, x, table[:9], window)
    torch.testing.assert_close(torch.cat(outs, dim=1), expected, atol=1e-10, rtol=1e-10)
    if window is not None:  # the rolling buffer holds the last `window` positions, slot p mod window
        assert attn.kv_cache.k.shape[2] == window


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["GQA", "MQA"])
def test_gqa_equals_mha_with_repeated_kv_heads(make_spec, kv_heads: int) -> None:
    torch.manual_seed(0)
    spec = make_spec("llama3.2-1b").with_overrides(num_attention_heads=4, num_kv_heads=kv_heads)
    mha_spec = spec.with_overrides(num_kv_heads=4)
    gqa, mha = Attention(spec).double(), Attention(mha_spec).double()
    h, d, rep = 4, spec.head_dim, 4 // kv_heads
    wq, wk, wv = gqa.wqkv.weight.split([h * d, kv_heads * d, kv_heads * d])

    def repeat(w: torch.Tensor) -> torch.Tensor:  # [Hkv*D, hidden] -> [H*D, hidden], each KV head rep times
        return w.view(kv_heads, d, -1).repeat_interleave(rep, dim=0).reshape(h * d, -1)

    with torch.no_grad():
        mha.wqkv.weight.copy_(torch.cat([wq, repeat(wk), repeat(wv)]))
        mha.wo.weight.copy_(gqa.wo.weight)
    for attn in (gqa, mha):
        attach_cache(attn, 1, 8, torch.float64)
    table = rope_table(spec, 8, torch.float64, CPU)
    x = torch.randn(1, 8, spec.hidden_size, dtype=torch.float64)
    torch.testing.assert_close(gqa(x, step(table, 0, 8)), mha(x, step(table, 0, 8)), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("scaling", [None, RopeScaling(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                       high_freq_factor=4.0, original_max_position_embeddings=64)])
def test_rope_dot_product_depends_only_on_relative_position(make_spec, scaling: RopeScaling | None) -> None:
    spec = make_spec("llama3.2-1b").with_overrides(rope_scaling=scaling, rope_theta=500000.0)
    table = rope_table(spec, 4096, torch.float64, CPU)
    q, k = torch.randn(1, 1, 1, spec.head_dim, dtype=torch.float64), torch.randn(1, 1, 1, spec.head_dim,
                                                                                 dtype=torch.float64)

    def dot(m: int, n: int) -> float:
        return float((apply_rope(q, table[m:m + 1]) * apply_rope(k, table[n:n + 1])).sum())

    assert dot(0, 0) == pytest.approx(float((q * k).sum()), rel=1e-12)  # position 0 is the identity
    for m, n, shift in ((7, 3, 100), (3, 7, 1000), (50, 50, 3000)):
        assert dot(m + shift, n + shift) == pytest.approx(dot(m, n), rel=1e-9, abs=1e-9)
    assert dot(7, 3) != pytest.approx(dot(3, 7), rel=1e-6)


def test_llama3_rope_scaling_keeps_high_and_divides_low_frequencies(make_spec) -> None:
    from tfcalc.model.layers import rope_frequencies

    plain = make_spec("llama3.2-1b").with_overrides(rope_scaling=None)
    scaled = make_spec("llama3.2-1b")  # factor 32 from 8192
    f0, f1 = rope_frequencies(plain), rope_frequencies(scaled)
    wavelen = 2 * math.pi / f0
    assert torch.equal(f1[wavelen < 8192 / 4], f0[wavelen < 8192 / 4])
    torch.testing.assert_close(f1[wavelen > 8192], f0[wavelen > 8192] / 32)


def test_sinks_path_matches_explicit_formula_and_sdpa_without_sinks() -> None:
    torch.manual_seed(0)
    b, h, hkv, t, s, d = 2, 4, 2, 3, 6, 8
    q = torch.randn(b, h, t, d, dtype=torch.float64)
    k, v = torch.randn(b, hkv, s, d, dtype=torch.float64), torch.randn(b, hkv, s, d, dtype=torch.float64)
    mask = torch.arange(s)[None, :] <= torch.arange(3, 6)[:, None]
    sinks = torch.randn(h, dtype=torch.float64)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    logits = (q @ kr.transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask, float("-inf"))
    e = logits.exp()
    expected = (e / (e.sum(-1, keepdim=True) + sinks.exp().view(1, h, 1, 1))) @ vr
    torch.testing.assert_close(attention_with_sinks(q, k, v, mask, sinks), expected)
    no_sink = torch.full((h,), float("-inf"), dtype=torch.float64)
    torch.testing.assert_close(attention_with_sinks(q, k, v, mask, no_sink),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))


def test_rmsnorm_computes_in_fp32_and_casts_back() -> None:
    x = torch.randn(3, 64).to(torch.bfloat16)
    norm = RMSNorm(64).to(torch.bfloat16)
    y = norm(x)
    assert y.dtype == torch.bfloat16
    xf = x.float()
    torch.testing.assert_close(y.float(), (xf / (xf.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()).bfloat16().float())


def brute_force_moe(moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: softmax over all experts, top-k, renormalise, sum the chosen experts' outputs."""
    out, counts = torch.zeros_like(x), torch.zeros(moe.w_in.shape[0], dtype=torch.long)
    for n in range(x.shape[0]):
        probs = moe.router(x[n]).softmax(-1)
        top = probs.topk(moe.top_k).indices
        weights = probs[top] / probs[top].sum() if moe.normalize else probs[top]
        for w, e in zip(weights, top.tolist(), strict=True):
            out[n] += w * moe.expert(e, x[n:n + 1])[0]
            counts[e] += 1
        if moe.shared is not None:
            gate = 1.0 if moe.shared_gate is None else torch.sigmoid(moe.shared_gate(x[n]))
            out[n] += gate * moe.shared(x[n])
    return out, counts


@pytest.mark.parametrize("preset,shared", [("mixtral-8x7b", False), ("qwen3-30b-a3b", False),
                                           ("gpt-oss-20b", False), ("qwen3-30b-a3b", True)],
                         ids=["mixtral", "qwen3", "gpt-oss-biases", "shared-gated"])
def test_moe_matches_per_token_loop_and_conserves_tokens(make_spec, preset: str, shared: bool) -> None:
    from dataclasses import replace

    torch.manual_seed(0)
    spec = make_spec(preset)
    if shared:
        spec = spec.with_overrides(moe=replace(spec.moe, num_shared_experts=2, shared_expert_intermediate_size=16,
                                               shared_expert_gate=True, normalize_top_k=False))
    moe = MoE(spec).double()
    x = torch.randn(2, 7, spec.hidden_size, dtype=torch.float64)
    y = moe(x)
    expected, counts = brute_force_moe(moe, x.reshape(14, -1))
    torch.testing.assert_close(y.reshape(14, -1), expected, atol=1e-12, rtol=1e-10)
    assert torch.equal(moe.expert_counts, counts)
    assert int(moe.expert_counts.sum()) == 14 * moe.top_k  # every (token, choice) pair dispatched once
    weights, experts = moe.route(x.reshape(14, -1))
    assert weights.shape == experts.shape == (14, moe.top_k)
    if moe.normalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(14, dtype=torch.float64))


def test_fp8_kv_cache_where_supported(make_spec) -> None:
    spec = make_spec("llama3.2-1b")
    model = build_model(spec)
    try:
        check_kv_dtype(torch.float8_e4m3fn, CPU)
    except UsageError as exc:
        with pytest.raises(UsageError, match="not supported"):
            model.setup_caches(1, 16, kv_dtype=torch.float8_e4m3fn)
        pytest.skip(str(exc))
    tokens = torch.randint(0, spec.vocab_size, (1, 12))
    model.setup_caches(1, 16)
    reference = model.prefill(tokens)
    model.setup_caches(1, 16, kv_dtype=torch.float8_e4m3fn)
    assert model.kv_cache_bytes() == get_dtype("fp8_e4m3").bytes_for(spec.num_layers * 2 * spec.num_kv_heads
                                                                    * spec.head_dim * 16)
    logits = torch.cat([model.prefill(tokens[:, :8]), *(model.decode_step(tokens[:, i:i + 1]) for i in range(8, 12))],
                       dim=1)
    assert (logits - reference).abs().max() < 0.1 * reference.abs().max()  # e4m3 keeps ~2 significant digits


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("backend", ["math", "flash"])
def test_attend_causal_and_folded_masked_calls_equal_the_gqa_reference(kv_heads: int, backend: str) -> None:
    """The causal call (no mask, is_causal) and the masked call (GQA folded into the query length) both equal
    SDPA with enable_gqa and an explicit mask, for a fresh prefill (S == T), a chunk on a cache and decode."""
    if not backend_works(backend, 4, kv_heads, 16, torch.float64, CPU):
        pytest.skip(f"SDPA backend {backend} does not run on this machine")
    torch.manual_seed(0)
    q = torch.randn(2, 4, 5, 16, dtype=torch.float64)
    k, v = torch.randn(2, kv_heads, 9, 16, dtype=torch.float64), torch.randn(2, kv_heads, 9, 16, dtype=torch.float64)
    positions = torch.arange(9)

    def reference(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    with sdpa_context(backend):
        fresh_mask = positions[None, :5] <= positions[:5, None]
        expected = reference(q, k[:, :, :5], v[:, :, :5], fresh_mask)
        torch.testing.assert_close(attend(q, k[:, :, :5], v[:, :, :5], None), expected)
        torch.testing.assert_close(attend(q, k[:, :, :5], v[:, :, :5], fresh_mask), expected)
        chunk = positions[None, :] <= positions[4:9, None]  # tokens 4..8 on a 9-slot cache, with a 3-token window
        windowed = chunk & (positions[None, :] > positions[4:9, None] - 3)
        torch.testing.assert_close(attend(q, k, v, windowed), reference(q, k, v, windowed))
        step = positions[None, :] <= 6  # one token at position 6
        torch.testing.assert_close(attend(q[:, :, :1], k, v, step), reference(q[:, :, :1], k, v, step))


def test_fresh_prefill_attends_over_the_new_keys_and_still_fills_the_cache(make_spec) -> None:
    """A fresh prefill (causal call over the new K/V) gives the same output as attending over the cache with a
    mask, and leaves the same cache behind."""
    torch.manual_seed(0)
    spec = make_spec("llama3.2-1b")
    attn = Attention(spec).double()
    attach_cache(attn, 2, 12, torch.float64)
    table = rope_table(spec, 12, torch.float64, CPU)
    x = torch.randn(2, 7, spec.hidden_size, dtype=torch.float64)
    fresh = attn(x, step(table, 0, 7))
    k_fresh = attn.kv_cache.k.clone()
    cached = attn(x, step(table, 0, 7, STATIC))
    torch.testing.assert_close(fresh, cached, atol=1e-12, rtol=1e-12)
    assert torch.equal(attn.kv_cache.k, k_fresh) and k_fresh[:, :, 7:].eq(0).all()


# --- yarn, interleaved RoPE, Gemma norms ----------------------------------------------------------------------


@pytest.mark.parametrize("mscale", [(1.0, 1.0), (None, None), (0.707, 1.0)], ids=["deepseek", "plain", "mixed"])
def test_yarn_frequencies_and_factor_match_transformers(mscale: tuple[float | None, float | None]) -> None:
    """The yarn inverse frequencies and cos/sin factor equal transformers' _compute_yarn_parameters (computed
    there in float32) for DeepSeek-V3's rope dims."""
    from dataclasses import replace

    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tfcalc.model.layers import rope_attention_factor, rope_frequencies
    from tfcalc.spec.presets import load_model

    spec = load_model("deepseek-v3")
    spec = spec.with_overrides(rope_scaling=replace(spec.rope_scaling, mscale=mscale[0], mscale_all_dim=mscale[1]))
    s = spec.rope_scaling
    params = {"rope_type": "yarn", "rope_theta": spec.rope_theta, "factor": s.factor, "beta_fast": s.beta_fast,
              "beta_slow": s.beta_slow, "original_max_position_embeddings": s.original_max_position_embeddings,
              **({"mscale": s.mscale, "mscale_all_dim": s.mscale_all_dim} if s.mscale else {})}
    config = transformers.DeepseekV3Config(rope_parameters=params, max_position_embeddings=spec.max_context)
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](config, torch.device("cpu"))
    ours = rope_frequencies(spec, spec.mla.qk_rope_head_dim)
    torch.testing.assert_close(ours.float(), inv_freq, rtol=1e-6, atol=0)
    assert rope_attention_factor(spec) == pytest.approx(factor, rel=1e-12)
    assert ours[0] == 1.0 and ours[-1] == pytest.approx(10000 ** (-62 / 64) / 40)  # kept / interpolated ends


def test_interleaved_rope_is_deepseeks_complex_rotation(make_spec) -> None:
    """DeepSeek rotates adjacent pairs as complex numbers, (x_2i + i x_2i+1) e^{i p theta_i}; the interleaved
    layout returns [real parts, imaginary parts] of that product."""
    spec = make_spec("deepseek-v3")
    table = rope_table(spec, 32, torch.float64, CPU, dim=8)
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64)
    pos = torch.tensor([0, 3, 7, 19, 31])
    angles = torch.atan2(table[pos, 1], table[pos, 0])  # [T, 4]
    turn = torch.polar(torch.ones_like(angles), angles)[:, None]  # [T, 1, 4]
    z = torch.view_as_complex(x.view(2, 5, 3, 4, 2).contiguous()) * turn
    torch.testing.assert_close(apply_rope(x, table[pos], interleaved=True), torch.cat([z.real, z.imag], dim=-1))


def test_gemma_norm_scales_by_one_plus_weight_in_fp32() -> None:
    norm = RMSNorm(64, eps=1e-6, offset=1.0).to(torch.bfloat16)
    assert norm.weight.eq(0).all()  # (1 + 0): an untrained Gemma norm is the identity scale
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 64).to(torch.bfloat16)
    xf = x.float()
    expected = (xf / (xf.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * (1 + norm.weight.float())).bfloat16()
    torch.testing.assert_close(norm(x), expected, atol=0, rtol=0)


# --- explicit and flex attention ------------------------------------------------------------------------------


def naive_scores_attention(q, k, v, mask, scale, softcap=None, sinks=None):
    """Heads repeated, scores capped, masked, softmax with an extra sink column, all in float64."""
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ kr.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    e = (s - s.amax(-1, keepdim=True)).exp()
    denominator = e.sum(-1, keepdim=True)
    if sinks is not None:
        denominator = denominator + (sinks.view(1, -1, 1, 1) - s.amax(-1, keepdim=True)).exp()
    return (e / denominator) @ vr


@pytest.mark.parametrize("softcap,sinks", [(5.0, False), (None, True), (3.0, True)])
def test_explicit_and_flex_paths_match_the_naive_formula(softcap: float | None, sinks: bool) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 1, 16, dtype=torch.float64) * 3
    k, v = torch.randn(2, 2, 300, 16, dtype=torch.float64), torch.randn(2, 2, 300, 16, dtype=torch.float64)
    sink = torch.randn(4, dtype=torch.float64) if sinks else None
    live = 133  # of 300 slots: two of three 128-key blocks listed, the second cut at 133
    visible = torch.arange(300)[None, :] < live
    expected = naive_scores_attention(q, k[:, :, :live], v[:, :, :live], None, 0.2, softcap, sink)
    torch.testing.assert_close(attention_explicit(q, k, v, visible, 0.2, softcap, sink), expected)
    torch.testing.assert_close(attention_explicit(q, k[:, :, :live], v[:, :, :live], None, 0.2, softcap, sink),
                               expected)
    block_mask = live_block_mask(torch.tensor(live - 1), 300, CPU)  # the query at position 132
    assert block_mask.kv_num_blocks.flatten().tolist() == [2]  # ceil(133 / 128): the third block is never listed
    torch.testing.assert_close(flex_attend(q, k, v, block_mask, 0.2, softcap, sink), expected)


def test_flex_attend_runs_mla_shaped_calls() -> None:
    """One KV 'head' of 24 dims for 4 query heads, values 16 wide (the absorbed MLA decode), through flex."""
    torch.manual_seed(0)
    q, lat = torch.randn(1, 4, 1, 24, dtype=torch.float64), torch.randn(1, 1, 40, 24, dtype=torch.float64)
    expected = naive_scores_attention(q, lat[:, :, :17], lat[:, :, :17, :16], None, 0.3)
    got = flex_attend(q, lat, lat[..., :16], live_block_mask(torch.tensor(16), 40, CPU), 0.3)
    torch.testing.assert_close(got, expected)


# --- DeepSeek-V3 routing ----------------------------------------------------------------------------------------


def test_sigmoid_group_limited_routing_matches_a_per_token_loop(make_spec) -> None:
    """Per token: sigmoid scores; choice = score + bias, only in the best 2 of 4 groups (a group scores the sum
    of its top two choices); weights = the chosen unbiased scores, renormalised, times 2.5."""
    torch.manual_seed(0)
    moe = MoE(make_spec("deepseek-v3")).double()
    with torch.no_grad():
        moe.score_bias.uniform_(-0.2, 0.2)
    x = torch.randn(12, moe.w_in.shape[-1], dtype=torch.float64)
    with torch.no_grad():
        weights, experts = moe.route(x)
        scores_all, bias = torch.sigmoid(moe.router(x)), moe.score_bias.detach()
    for n in range(12):
        scores = scores_all[n]
        choice = scores + bias
        groups = choice.view(4, 2)
        best = groups.topk(2, dim=-1).values.sum(-1).topk(2).indices.tolist()
        allowed = [e for e in range(8) if e // 2 in best]
        top = sorted(allowed, key=lambda e: -float(choice[e]))[:2]
        assert sorted(experts[n].tolist()) == sorted(top)
        w = scores[top] / scores[top].sum() * 2.5
        got = dict(zip(experts[n].tolist(), weights[n].tolist(), strict=True))
        assert [got[e] for e in top] == pytest.approx(w.tolist(), rel=1e-12)
