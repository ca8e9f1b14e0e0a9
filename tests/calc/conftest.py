"""Shared helpers for the serving-model tests: a step-time model with a fixed step time."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tfcalc.calc.serving_inputs import KvShape, StepModel, StepWork


def constant_step_model(seconds: float, layers: int = 1) -> StepModel:
    """Every step takes ``seconds``, whatever it carries (a memory-bound step of ``seconds`` worth of bytes)."""
    work = StepWork(flops_per_token=0.0, flops_per_logit=0.0, flops_per_decode_key=0.0, flops_per_prefill_key=0.0,
                    weight_bytes=seconds, expert_bytes_per_distinct=0.0, num_experts=0, experts_per_token=0,
                    kv_bytes_per_key=0.0, bytes_per_token=0.0, bytes_per_logit=0.0, comm_bytes_per_token=0.0,
                    p2p_bytes_per_token=0.0, compute_dtype="bf16", tp=1, pp=1, stage_fraction=1.0,
                    kv=KvShape(num_layers=layers))
    return StepModel(work=work, peak_flops_per_s=1.0, bandwidth_bytes_per_s=1.0, link_bytes_per_s=1.0,
                     compute_efficiency=1.0, bandwidth_efficiency=1.0)


@pytest.fixture
def constant_step() -> Callable[..., StepModel]:
    return constant_step_model
