"""The fit planner against hand-computed cases and monotonicity properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc.plan import PlanConfig, check_parallelism, min_gpus, plan_fit
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import UsageError
from tfcalc.spec.presets import load_gpu, load_model

GIB = 1 << 30
FP8 = parse_weight_precision("fp8")
BF16 = parse_weight_precision("bf16")


def test_llama3_70b_fp8_on_one_h100() -> None:
    r = plan_fit(load_model("llama3-70b"), load_gpu("h100-sxm"), FP8, get_dtype("fp8"),
                 PlanConfig(num_gpus=1, context=128 * 1024))
    # matrices 70,552,387,584 x 1 byte + 1,318,912 norm weights x 2 bytes
    assert r.weights_bytes_per_gpu == 70_552_387_584 + 2 * 1_318_912
    # 80 GiB x 0.1 + 1 GiB overhead + 8192 x (2 x 8192 + 3 x 28672) x 2 + 128256 x 4
    assert r.reserved_bytes_per_gpu == 8 * GIB + GIB + 8192 * (16384 + 86016) * 2 + 128256 * 4
    assert r.kv_bytes_per_token_per_gpu == 80 * 2 * 8 * 128  # 160 KiB
    assert r.kv_budget_bytes_per_gpu == 80 * GIB - r.weights_bytes_per_gpu - r.reserved_bytes_per_gpu
    assert r.max_concurrent_sequences == 0 and not r.fits
    assert r.max_context_at_batch == r.kv_budget_bytes_per_gpu // (16 * 163840) * 16 == 24_416
    assert "short by 16.27 GiB" in r.reason


def test_deepseek_v3_mla_latent_not_split_by_tp() -> None:
    spec, gpu = load_model("deepseek-v3"), load_gpu("h200")
    r8 = plan_fit(spec, gpu, FP8, get_dtype("fp8"), PlanConfig(num_gpus=8, tp=8, context=128 * 1024))
    r1 = plan_fit(spec, gpu, FP8, get_dtype("fp8"), PlanConfig(num_gpus=1, tp=1, context=4096))
    assert r8.kv_bytes_per_token_per_gpu == r1.kv_bytes_per_token_per_gpu == 61 * (512 + 64)
    assert r8.kv_bytes_per_sequence_per_gpu == 61 * 576 * 128 * 1024
    assert gpu.memory_bytes == 141 * GIB
    # 671 B params at 1 byte over 8 GPUs, plus the replicated q_a / kv_a projections and routers
    assert 83.8e9 < r8.weights_bytes_per_gpu < 85e9
    assert r8.fits and r8.max_concurrent_sequences == r8.kv_budget_bytes_per_gpu // r8.kv_bytes_per_sequence_per_gpu
    assert not r1.fits  # 671 GB of weights on one 141 GiB GPU


def test_gemma2_27b_window_caps() -> None:
    spec = load_model("gemma2-27b")
    r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=8192))
    per_layer_token = 2 * 16 * 128 * 2
    assert r.kv_bytes_per_token_per_gpu == 46 * per_layer_token
    # 23 global layers hold 8192 tokens, 23 sliding layers hold their 4096-token window
    assert r.kv_bytes_per_sequence_per_gpu == (23 * 8192 + 23 * 4096) * per_layer_token


def test_kv_heads_replicated_when_tp_exceeds_kv_heads() -> None:
    spec, gpu = load_model("llama3-70b"), load_gpu("h100-sxm")
    bf16 = get_dtype("bf16")
    per_token = {tp: plan_fit(spec, gpu, BF16, bf16, PlanConfig(num_gpus=tp, tp=tp, context=4096))
                 .kv_bytes_per_token_per_gpu for tp in (1, 2, 8, 16)}
    assert per_token[1] == 80 * 2 * 8 * 128 * 2
    assert per_token[2] == per_token[1] // 2
    assert per_token[8] == per_token[16] == 80 * 2 * 1 * 128 * 2  # one KV head per GPU, replicated


def test_block_rounding() -> None:
    spec = load_model("llama3-8b")
    r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=17))
    assert r.kv_bytes_per_sequence_per_gpu == 32 * r.kv_bytes_per_token_per_gpu  # 17 tokens -> 2 blocks of 16


def test_seed_table_with_weights_included() -> None:
    """The seed's 'max batch on an 80 GB H100' ignores the 141 GB of bf16 weights: nothing fits on one GPU."""
    spec, gpu = load_model("llama3-70b"), load_gpu("h100-sxm")
    from dataclasses import replace

    for variant, kv in ((spec, "bf16"), (spec, "fp8"), (replace(spec, num_kv_heads=1), "bf16")):
        r = plan_fit(variant, gpu, BF16, get_dtype(kv), PlanConfig(num_gpus=1, context=128 * 1024))
        assert r.max_concurrent_sequences == 0 and r.kv_budget_bytes_per_gpu < 0


@pytest.mark.parametrize(("tp", "num_gpus", "message"), [
    (3, 3, "does not divide the 64 attention heads"),
    (4, 6, "does not divide the GPU count 6"),
])
def test_bad_parallelism(tp: int, num_gpus: int, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        check_parallelism(load_model("llama3-70b"), num_gpus, tp)


def test_min_gpus_llama3_70b_bf16() -> None:
    r = min_gpus(load_model("llama3-70b"), load_gpu("h100-sxm"), BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=1, context=8192, batch=8))
    assert r is not None and r.fits
    # 141 GB of bf16 weights do not fit in 2 x (80 GiB - reserved); 3 do, as pp 3 (tp 3 does not divide 64 heads)
    assert (r.parallelism.num_gpus, r.parallelism.tp, r.parallelism.pp) == (3, 1, 3)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["llama3-8b", "mixtral-8x7b", "gemma2-27b", "qwen2.5-7b"]),
       st.sampled_from([1, 2, 4, 8]), st.integers(1, 4), st.sampled_from([4096, 32768, 131072]))
def test_more_gpus_never_fit_less(name: str, tp: int, replicas: int, context: int) -> None:
    spec, gpu = load_model(name), load_gpu("a100-80gb")
    try:
        check_parallelism(spec, tp, tp)
    except UsageError:
        return
    def seqs(n: int, t: int) -> int:
        return plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=n, tp=t, context=context)) \
            .max_concurrent_sequences

    assert seqs(tp * (replicas + 1), tp) >= seqs(tp * replicas, tp)
    if tp > 1:
        assert seqs(tp, tp) >= seqs(tp // 2, tp // 2)
