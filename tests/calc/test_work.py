"""FLOP and byte counts of prefill and decode (tfcalc.calc.work) against hand-derived values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc.kernels import distinct_experts
from tfcalc.calc.work import decode_work, make_model, prefill_work
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.presets import load_model

BF16 = parse_weight_precision("bf16")
KV = get_dtype("bf16")


def test_llama3_8b_decode_batch1_reads_every_weight_but_the_embedding_table() -> None:
    m = make_model(load_model("llama3-8b"), BF16, KV)
    step = decode_work(m, 1, 1)
    # every weight except the untied 128256 x 4096 embedding table (only one 4096-wide row gathered)
    weights = (8_030_261_248 - 128256 * 4096) * 2
    assert step.bytes == pytest.approx(weights, rel=1e-3)
    # prefill FLOPs ~ 2 x 6.98e9 non-embedding linear params x 1024 + causal attention + last-position logits
    assert prefill_work(m, 1, 1024).flops == pytest.approx(2 * 6.979e9 * 1024 + 32 * 1024 * 1025 // 2 * 4 * 32 * 128
                                                           + 2 * 128256 * 4096, rel=1e-3)


@pytest.mark.parametrize(("batch", "expected"), [(1, 2.0), (4, 8 * (1 - 0.75**4)), (64, 8 * (1 - 0.75**64))])
def test_mixtral_expected_experts(batch: int, expected: float) -> None:
    assert distinct_experts(8, 2, batch) == pytest.approx(expected)


def test_mixtral_decode_reads_expected_experts() -> None:
    m = make_model(load_model("mixtral-8x7b"), BF16, KV)
    expert_bytes = 3 * 4096 * 14336 * 2
    one, many = decode_work(m, 1, 1), decode_work(m, 64, 1)
    kv_and_small = (many.bytes - one.bytes) - 32 * (distinct_experts(8, 2, 64) - 2) * expert_bytes
    assert 0 < kv_and_small < 0.01 * one.bytes  # the rest: 63 more rows, KV, logits
    # batch 1 reads the 2 chosen experts per layer, not all 8
    assert one.bytes < 0.35 * 46.7e9 * 2


def test_deepseek_256_choose_8() -> None:
    assert distinct_experts(256, 8, 1) == pytest.approx(8)
    assert distinct_experts(256, 8, 64) == pytest.approx(222, abs=1)


def test_window_caps_decode_kv() -> None:
    m = make_model(load_model("mistral-7b"), BF16, KV)
    assert decode_work(m, 1, 4096).bytes == pytest.approx(decode_work(m, 1, 100_000).bytes)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["llama3-8b", "gemma2-9b", "mixtral-8x7b", "deepseek-v3"]), st.integers(1, 64),
       st.integers(1, 200_000), st.integers(1, 50_000))
def test_decode_work_non_decreasing_with_context(name: str, batch: int, context: int, more: int) -> None:
    m = make_model(load_model(name), BF16, KV)
    longer, shorter = decode_work(m, batch, context + more), decode_work(m, batch, context)
    assert longer.bytes >= shorter.bytes and longer.flops >= shorter.flops


def test_llama3_8b_batch64_decode_bytes_by_hand() -> None:
    step = decode_work(make_model(load_model("llama3-8b"), BF16, KV), 64, 1152)
    weights = (8_030_261_248 - 128256 * 4096) * 2 + 64 * 4096 * 2  # + 64 gathered embedding rows
    kv_read = 64 * 32 * 1152 * (2 * 8 * 128 * 2)  # 9,663,676,416 B at context 1152
    kv_write = 64 * 32 * 4096
    logits = 64 * 128256 * 4
    hidden = 4 * 64 * 4096 * 2 * 32
    assert step.bytes == weights + kv_read + kv_write + logits + hidden


def test_mixtral_batch1_decode_bytes_by_hand() -> None:
    step = decode_work(make_model(load_model("mixtral-8x7b"), BF16, KV), 1, 1)
    # attention 32 x 41,943,040 + 2 of 8 experts 32 x 2 x 176,160,768 + router 32 x 32768 + lm_head 32000 x 4096
    # + norms 32 x 8192 + 4096, all bf16; + 1 embedding row, KV read and written (1 token), fp32 logits, hidden
    weights = 2 * (32 * 41_943_040 + 32 * 2 * 176_160_768 + 32 * 32_768 + 131_072_000 + 266_240)
    assert step.bytes == weights + 8192 + 2 * 32 * 4096 + 32000 * 4 + 4 * 4096 * 2 * 32 == 25_499_153_408


def test_tp_shards_the_work() -> None:
    spec = load_model("llama3-70b")
    one, eight = make_model(spec, BF16, KV), make_model(spec, BF16, KV, 8)
    # each of 8 GPUs holds 1/8 of every matrix and of the KV heads
    assert decode_work(eight, 1, 1024).bytes == pytest.approx(decode_work(one, 1, 1024).bytes / 8, rel=2e-3)


def test_gemma2_window_caps_decode_and_prefill_attention() -> None:
    m = make_model(load_model("gemma2-27b"), BF16, KV)
    # decode: 23 global layers read all c tokens, 23 sliding layers at most 4096; 8192 B per layer-token
    assert decode_work(m, 1, 8000).bytes - decode_work(m, 1, 4096).bytes == 23 * (8000 - 4096) * 2 * 16 * 128 * 2
    # prefill 8192: sum over queries of min(i + 1, window) keys: global 8192 x 8193 / 2, sliding
    # 4096 x 4097 / 2 + 4096 x 4096; 4 x 32 heads x 128 FLOPs per key; linear 2 x 26,046,627,840 x 8192;
    # tied lm_head 2 x 256000 x 4608 for the last position
    keys = 23 * (8192 * 8193 // 2) + 23 * (4096 * 4097 // 2 + 4096 * 4096)
    linear = 46 * (4608 * (4096 + 2 * 2048) + 4096 * 4608 + 3 * 4608 * 36864)
    flops = 2 * linear * 8192 + 2 * 256000 * 4608 + keys * 4 * 32 * 128
    assert prefill_work(m, 1, 8192).flops == flops == 448_880_296_591_360


def test_llama4_chunked_layers_attend_within_their_chunk() -> None:
    spec = load_model("llama4-scout-17b-16e")
    m = make_model(spec, BF16, KV)
    # prefill 16384: 12 NoPE layers 16384 x 16385 / 2 keys, 36 chunked layers two chunks of 8192 x 8193 / 2
    whole = spec.with_overrides(sliding_window=None, sliding_window_layers=(), local_attention="sliding")
    full_only = make_model(whole, BF16, KV)
    per_key = 4 * 40 * 128
    saved = 36 * (16384 * 16385 // 2 - 2 * (8192 * 8193 // 2)) * per_key
    assert prefill_work(full_only, 1, 16384).flops - prefill_work(m, 1, 16384).flops == saved
    # decode at 16385 tokens: a chunked layer's query reads only the 1 token of its new chunk
    kv_per_layer_token = 8 * 128 * 2 * 2
    assert decode_work(full_only, 1, 16385).bytes - decode_work(m, 1, 16385).bytes == 36 * (16385 - 1) * (
        kv_per_layer_token)


def test_dsa_decode_reads_top_k_latents_and_every_indexer_key() -> None:
    """DeepSeek-V3.2, one sequence: past the top-k a decode step's cache read grows by the indexer's 132-byte key per
    layer and token only (the latents it attends stay 2,048 of 1,152 B), and its FLOPs by 2 x 64 x 128 per layer."""
    m = make_model(load_model("deepseek-v3.2"), parse_weight_precision("fp8_block"), KV, tp=8)
    far, near = decode_work(m, 1, 10000), decode_work(m, 1, 4000)
    assert far.bytes - near.bytes == 61 * 6000 * 132
    assert far.flops - near.flops == 61 * 6000 * 2 * 64 * 128
    below, at = decode_work(m, 1, 1000), decode_work(m, 1, 2048)
    # below the top-k every latent is read: 1,048 more of them and their indexer keys, and the absorbed MLA's
    # 2 x 16 heads x (2 x 512 + 64) FLOPs per latent
    assert at.bytes - below.bytes == 61 * 1048 * (1152 + 132)
    assert at.flops - below.flops == 61 * 1048 * (2 * 16 * (2 * 512 + 64) + 2 * 64 * 128)


def test_dsa_prefill_attends_top_k_and_scores_every_pair() -> None:
    """DeepSeek-V3.2 prefill of 4,096 tokens at tp 8: the MLA's keys are min(i + 1, 2,048) per query (materialised
    heads: 4 x 16 x (192 + 128) / 2 FLOPs per key), the indexer's every causal pair."""
    m = make_model(load_model("deepseek-v3.2"), parse_weight_precision("fp8_block"), KV, tp=8)
    v3 = make_model(load_model("deepseek-v3"), parse_weight_precision("fp8_block"), KV, tp=8)
    dsa, plain = prefill_work(m, 1, 4096), prefill_work(v3, 1, 4096)
    sparse_keys = 2048 * 2049 // 2 + 2048 * 2048
    dense_keys = 4096 * 4097 // 2
    per_key = 2 * 16 * (192 + 128)
    indexer_weights = 2 * 4096 * 61 * (1536 * 64 * 128 + 7168 * (128 + 64))
    expected = (61 * (sparse_keys - dense_keys) * per_key + 61 * dense_keys * 2 * 64 * 128 + indexer_weights)
    assert dsa.flops - plain.flops == expected


def test_values_narrower_than_keys_count_at_their_own_width() -> None:
    """MiMo-V2-Flash: keys of 192, values of 128. Q.K costs 2 x 192 and P.V 2 x 128 FLOPs per head and key, and a
    token caches kv_heads x (192 + 128) elements (8 KV heads on sliding layers, 4 on full ones), each at its width."""
    from pathlib import Path

    from tfcalc.calc.work import _attention_flops_per_key
    from tfcalc.spec.hf_config import load_hf_config

    spec = load_hf_config(Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "mimo-v2-flash.json")
    m = make_model(spec, parse_weight_precision("bf16"), BF16, tp=4)
    assert m.sh.query_heads == 16 and (m.sh.kv_heads, m.sh.full_kv_heads) == (2, 1)
    assert (m.sh.kv_elements, m.sh.full_kv_elements) == (2 * (192 + 128), 1 * (192 + 128))
    for decode in (True, False):
        for sliding in (True, False):
            assert _attention_flops_per_key(m, decode, sliding) == 2 * 16 * (192 + 128)
