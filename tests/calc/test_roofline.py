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
