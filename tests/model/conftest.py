"""Shared fixtures for the bundled decoder's tests: small specs derived from the real presets."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tfcalc.model import scale_spec
from tfcalc.spec.model import MLASpec, ModelSpec
from tfcalc.spec.presets import load_model

# Small but structurally faithful: every preset's head ratio, biases, norms, windows and routing survive.
SMALL = {"layers": 3, "hidden": 64, "head_dim": 16, "intermediate": 96, "vocab": 128}
SMALL_MOE = {"experts": 6, "experts_per_token": 2, "expert_intermediate": 32}
# MLA at a small scale with every width distinct (q rank 24, latent 16, nope 8, rope 8, v 12)
SMALL_MLA = MLASpec(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12)


def small_spec(name: str, window: int | None = 4) -> ModelSpec:
    """Preset ``name`` with 3 layers (the preset's layer pattern kept), hidden 64, 4 query heads of 16 (KV heads
    in the preset's ratio), vocab 128, 6 experts of width 32 (8 in 4 groups for DeepSeek-V3's group routing),
    :data:`SMALL_MLA` for MLA, and a 4-token window where the preset has windows."""
    spec = load_model(name)
    ratio = spec.num_attention_heads // spec.num_kv_heads
    heads = 4 if ratio <= 4 else 8
    extra = SMALL_MOE if spec.moe is not None else {}
    if spec.moe is not None and spec.moe.expert_groups > 1:
        extra = {**extra, "experts": 8}
    small = scale_spec(spec, heads=heads, kv_heads=max(1, heads // ratio), **SMALL, **extra)
    if small.mla is not None:
        small = small.with_overrides(mla=SMALL_MLA, head_dim=SMALL_MLA.qk_head_dim)
    if small.sliding_window is not None and window is not None:
        small = small.with_overrides(sliding_window=window)
    return small


@pytest.fixture
def make_spec() -> Callable[..., ModelSpec]:
    return small_spec
