"""Roofline estimates against hand-derived values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc.roofline import (
    Efficiency,
    decode_step,
    estimate,
    expected_distinct_experts,
    load_calibration,
    make_model,
    prefill_work,
)
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import SpecError
from tfcalc.spec.presets import load_gpu, load_model

BF16 = parse_weight_precision("bf16")
IDEAL = Efficiency(1, 1, 1, 1)


def test_llama3_8b_bf16_decode_batch1_on_h100() -> None:
    spec, gpu = load_model("llama3-8b"), load_gpu("h100-sxm")
    m = make_model(spec, BF16, get_dtype("bf16"), 1)
    step = decode_step(m, gpu, 1, 1, IDEAL)
    # every weight except the untied 128256 x 4096 embedding table (only one 4096-wide row gathered)
    weights = (8_030_261_248 - 128256 * 4096) * 2
    assert weights == pytest.approx(15.01e9, rel=1e-3)
    assert step.bytes == pytest.approx(weights, rel=1e-3)
    assert step.bound == "memory"
    assert 1 / step.time_s_ideal == pytest.approx(3.35e12 / 15.01e9, rel=2e-3)  # ~223 tokens/s
    e = estimate(spec, gpu, BF16, get_dtype("bf16"), 1, 1, 1024, 256)
    assert 215 < e.decode_tokens_per_s_ideal < 225  # KV of ~1.1k tokens adds ~1 %
    assert e.decode_tokens_per_s == pytest.approx(0.6 * e.decode_tokens_per_s_ideal)
    assert e.prefill.bound == "compute"
    # prefill FLOPs ~ 2 x 6.98e9 non-embedding linear params x 1024 + causal attention + last-position logits
    assert e.prefill.flops == pytest.approx(2 * 6.979e9 * 1024 + 32 * 1024 * 1025 // 2 * 4 * 32 * 128
                                            + 2 * 128256 * 4096, rel=1e-3)


@pytest.mark.parametrize(("batch", "expected"), [(1, 2.0), (4, 8 * (1 - 0.75**4)), (64, 8 * (1 - 0.75**64))])
def test_mixtral_expected_experts(batch: int, expected: float) -> None:
    assert expected_distinct_experts(8, 2, batch) == pytest.approx(expected)


def test_mixtral_decode_reads_expected_experts() -> None:
    spec, gpu = load_model("mixtral-8x7b"), load_gpu("h100-sxm")
    m = make_model(spec, BF16, get_dtype("bf16"), 1)
    expert_bytes = 3 * 4096 * 14336 * 2
    one, many = decode_step(m, gpu, 1, 1, IDEAL), decode_step(m, gpu, 64, 1, IDEAL)
    kv_and_small = (many.bytes - one.bytes) - 32 * (expected_distinct_experts(8, 2, 64) - 2) * expert_bytes
    assert 0 < kv_and_small < 0.01 * one.bytes  # the rest: 63 more rows, KV, logits
    # batch 1 reads the 2 chosen experts per layer, not all 8
    assert one.bytes < 0.35 * 46.7e9 * 2


def test_deepseek_256_choose_8() -> None:
    assert expected_distinct_experts(256, 8, 1) == pytest.approx(8)
    assert expected_distinct_experts(256, 8, 64) == pytest.approx(222, abs=1)


def test_tp_adds_allreduce() -> None:
    spec, gpu = load_model("llama3-70b"), load_gpu("h100-sxm")
    m = make_model(spec, BF16, get_dtype("bf16"), 8)
    step = decode_step(m, gpu, 1, 1024, IDEAL)
    payload = 8192 * 2
    assert step.comm_bytes == pytest.approx(2 * 80 * 2 * 7 / 8 * payload)
    assert step.time_comm_s == pytest.approx(step.comm_bytes / 450e9)


def test_window_caps_decode_kv() -> None:
    spec, gpu = load_model("mistral-7b"), load_gpu("h100-sxm")
    m = make_model(spec, BF16, get_dtype("bf16"), 1)
    assert decode_step(m, gpu, 1, 4096, IDEAL).bytes == pytest.approx(decode_step(m, gpu, 1, 100_000, IDEAL).bytes)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["llama3-8b", "gemma2-9b", "mixtral-8x7b", "deepseek-v3"]), st.integers(1, 64),
       st.integers(1, 200_000), st.integers(1, 50_000))
def test_decode_time_non_decreasing_with_context(name: str, batch: int, context: int, more: int) -> None:
    spec, gpu = load_model(name), load_gpu("h200")
    m = make_model(spec, BF16, get_dtype("bf16"), 1)
    assert decode_step(m, gpu, batch, context + more, IDEAL).time_s >= decode_step(m, gpu, batch, context,
                                                                                   IDEAL).time_s


def test_calibration_schema() -> None:
    good = {"device_name": "NVIDIA H200", "compute_efficiency": {"prefill": 0.7, "decode": 0.5},
            "bandwidth_efficiency": {"prefill": 0.8, "decode": 0.75}, "source": "tfcalc profile"}
    eff = load_calibration(good, "cal.json")
    assert (eff.compute_prefill, eff.bandwidth_decode) == (0.7, 0.75)
    with pytest.raises(SpecError, match="bandwidth_efficiency.decode' must be a number in"):
        load_calibration({**good, "bandwidth_efficiency": {"prefill": 0.8, "decode": 1.5}}, "cal.json")
    with pytest.raises(SpecError, match="unknown calibration field"):
        load_calibration({**good, "compute": 1}, "cal.json")


def test_decode_context_is_mean_of_the_decode_steps() -> None:
    # G = 256: steps j = 1..255 hold P + j tokens, mean P + 128 (was P + 129)
    spec, gpu = load_model("llama3-8b"), load_gpu("h100-sxm")
    assert estimate(spec, gpu, BF16, get_dtype("bf16"), 1, 1, 1024, 256).decode_context == 1024 + 128
    assert estimate(spec, gpu, BF16, get_dtype("bf16"), 1, 1, 1024, 2).decode_context == 1025  # one step, P + 1
    assert estimate(spec, gpu, BF16, get_dtype("bf16"), 1, 1, 1024, 1).decode_context == 1025


def test_llama3_8b_batch64_decode_bytes_by_hand() -> None:
    spec, gpu = load_model("llama3-8b"), load_gpu("h100-sxm")
    e = estimate(spec, gpu, BF16, get_dtype("bf16"), 1, 64, 1024, 256, IDEAL)
    weights = (8_030_261_248 - 128256 * 4096) * 2 + 64 * 4096 * 2  # + 64 gathered embedding rows
    kv_read = 64 * 32 * 1152 * (2 * 8 * 128 * 2)  # 9,663,676,416 B at the mean context 1152
    kv_write = 64 * 32 * 4096
    logits = 64 * 128256 * 4
    hidden = 4 * 64 * 4096 * 2 * 32
    assert e.decode.bytes == weights + kv_read + kv_write + logits + hidden
    assert e.decode.bound == "memory" and e.turning_point_batch is None
    assert e.tpot_s_ideal == pytest.approx(e.decode.bytes / 3.35e12)


def test_mixtral_batch1_decode_bytes_by_hand() -> None:
    spec, gpu = load_model("mixtral-8x7b"), load_gpu("h100-sxm")
    step = decode_step(make_model(spec, BF16, get_dtype("bf16"), 1), gpu, 1, 1, IDEAL)
    # attention 32 x 41,943,040 + 2 of 8 experts 32 x 2 x 176,160,768 + router 32 x 32768 + lm_head 32000 x 4096
    # + norms 32 x 8192 + 4096, all bf16; + 1 embedding row, KV read and written (1 token), fp32 logits, hidden
    weights = 2 * (32 * 41_943_040 + 32 * 2 * 176_160_768 + 32 * 32_768 + 131_072_000 + 266_240)
    assert step.bytes == weights + 8192 + 2 * 32 * 4096 + 32000 * 4 + 4 * 4096 * 2 * 32 == 25_499_153_408


def test_tp2_allreduce_by_hand() -> None:
    spec, gpu = load_model("llama3-8b"), load_gpu("h100-sxm")
    step = decode_step(make_model(spec, BF16, get_dtype("bf16"), 2), gpu, 1, 1024, IDEAL)
    # 2 all-reduces x 32 layers x ring 2 (2 - 1) / 2 x (1 token x 4096 x 2 B) = 524,288 B over 450 GB/s one way
    assert step.comm_bytes == 2 * 32 * 1 * 8192 == 524_288
    assert step.time_comm_s == pytest.approx(524_288 / 450e9)
    assert step.time_s_ideal == pytest.approx(max(step.time_compute_s, step.time_memory_s) + 524_288 / 450e9)


def test_gemma2_window_caps_decode_and_prefill_attention() -> None:
    spec, gpu = load_model("gemma2-27b"), load_gpu("h100-sxm")
    m = make_model(spec, BF16, get_dtype("bf16"), 1)
    # decode: 23 global layers read all c tokens, 23 sliding layers at most 4096; 8192 B per layer-token
    assert decode_step(m, gpu, 1, 8000, IDEAL).bytes - decode_step(m, gpu, 1, 4096, IDEAL).bytes \
        == 23 * (8000 - 4096) * 2 * 16 * 128 * 2
    # prefill 8192: sum over queries of min(i + 1, window) keys: global 8192 x 8193 / 2, sliding
    # 4096 x 4097 / 2 + 4096 x 4096; 4 x 32 heads x 128 FLOPs per key; linear 2 x 26,046,627,840 x 8192;
    # tied lm_head 2 x 256000 x 4608 for the last position
    keys = 23 * (8192 * 8193 // 2) + 23 * (4096 * 4097 // 2 + 4096 * 4096)
    linear = 46 * (4608 * (4096 + 2 * 2048) + 4096 * 4608 + 3 * 4608 * 36864)
    flops = 2 * linear * 8192 + 2 * 256000 * 4608 + keys * 4 * 32 * 128
    assert prefill_work(m, 1, 8192).flops == flops == 448_880_296_591_360
