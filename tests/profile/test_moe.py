"""``tfcalc bench moe`` on the CPU: parameter matching against the modules, expert load by hand, rows, sizes."""

from __future__ import annotations

import math

import pytest
import torch

from tfcalc.errors import UsageError
from tfcalc.model.layers import FeedForward, MoE
from tfcalc.model.transformer import scale_spec
from tfcalc.profile.moe import dense_intermediate, expert_load, moe_bench_spec, moe_layer_params, moe_rows
from tfcalc.spec.presets import load_model

CPU = torch.device("cpu")
FAST = {"warmup": 1, "repeats": 2}


def _finite_positive(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_expert_load_by_hand() -> None:
    load = expert_load([3, 0, 1, 0], experts_per_token=1, tokens=4)
    assert load == {"max_tokens_per_expert": 3, "mean_tokens_per_expert": 1.0, "load_imbalance": 3.0,
                    "distinct_experts": 2, "expected_distinct_experts": pytest.approx(4 * (1 - 0.75**4))}
    assert load["expected_distinct_experts"] == pytest.approx(2.734375)


# --- MoE ---------------------------------------------------------------------------------------------------------

SMALL_MOE = {"hidden": 64, "experts": 8, "experts_per_token": 2, "expert_intermediate": 32}


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v3"])
def test_moe_param_counts_match_the_modules(preset: str) -> None:
    """The counts come from tfcalc.calc.params and equal the module's parameters (DeepSeek-V3: a shared expert
    and the router's score-correction bias too)."""
    spec = scale_spec(load_model(preset), **SMALL_MOE)
    params = moe_layer_params(spec)
    assert params["total"] == sum(p.numel() for p in MoE(spec).parameters())
    dense = FeedForward(spec, dense_intermediate(spec), bias=False)
    assert params["dense"] == sum(p.numel() for p in dense.parameters())
    shared = spec.moe.num_shared_experts * spec.moe.shared_expert_intermediate_size
    assert dense_intermediate(spec) == 2 * 32 + shared  # K x I + the shared width
    shared_params = sum(p.numel() for p in MoE(spec).shared.parameters()) if shared else 0
    assert params["active"] == params["router"] + 2 * params["per_expert"] + shared_params


def test_moe_rows_cpu() -> None:
    spec = scale_spec(load_model("mixtral-8x7b"), **SMALL_MOE)
    rows = moe_rows(CPU, torch.float32, spec, [1, 16, 64], **FAST)
    assert [r["tokens"] for r in rows] == [1, 16, 64]
    for r in rows:
        n = r["tokens"]
        assert r["status"] == "ok"
        for key in ("moe_time_s", "dense_time_s", "moe_tokens_per_s", "dense_tokens_per_s", "moe_over_dense"):
            assert _finite_positive(float(r[key])), key
        assert r["moe_tokens_per_s"] == pytest.approx(n / r["moe_time_s"])
        assert r["moe_over_dense"] == pytest.approx(r["moe_tokens_per_s"] / r["dense_tokens_per_s"])
        assert r["expected_distinct_experts"] == pytest.approx(8 * (1 - (1 - 2 / 8) ** n))
        assert r["mean_tokens_per_expert"] == n * 2 / 8
        assert r["max_tokens_per_expert"] >= r["mean_tokens_per_expert"]
        assert 1 <= r["distinct_experts"] <= min(8, 2 * n)
        assert r["dense_intermediate"] == 64 and r["experts"] == 8
    assert rows[0]["distinct_experts"] == 2  # one token picks K distinct experts


def test_moe_bench_spec_sizes() -> None:
    mixtral = load_model("mixtral-8x7b")
    cpu = moe_bench_spec(mixtral, CPU)
    assert (cpu.hidden_size, cpu.moe.expert_intermediate_size, cpu.moe.num_experts, cpu.moe.experts_per_token) == (
        512, 1792, 8, 2)  # 14336 x 512 / 4096, experts and top-k kept
    explicit = moe_bench_spec(mixtral, CPU, hidden=128, experts=4, experts_per_token=1, expert_intermediate=48)
    assert (explicit.hidden_size, explicit.moe.num_experts, explicit.moe.experts_per_token,
            explicit.moe.expert_intermediate_size) == (128, 4, 1, 48)
    assert moe_bench_spec(mixtral, torch.device("meta")).hidden_size == 4096  # a GPU-like device keeps sizes
    half = moe_bench_spec(mixtral, torch.device("meta"), hidden=2048)  # the expert width follows hidden
    assert (half.hidden_size, half.moe.expert_intermediate_size) == (2048, 7168)
    with pytest.raises(UsageError, match="no MoE layers"):
        moe_bench_spec(load_model("llama3-8b"), CPU)
