"""Weight bytes by precision (with scale overhead) and the activation estimate."""

from __future__ import annotations

import pytest

from tfcalc.calc.memory import activation_workspace_bytes, weights_bytes, weights_bytes_by_component
from tfcalc.calc.params import count_params
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import UsageError
from tfcalc.spec.presets import load_model

GIB = 2**30


def test_gpt_oss_120b_checkpoint_is_about_60_8_gib() -> None:
    # gpt-oss model card (arXiv:2508.10925): the 120b checkpoint, MoE weights in MXFP4, is about 60.8 GiB.
    counts = count_params(load_model("gpt-oss-120b"))
    size = weights_bytes(counts, parse_weight_precision("experts=mxfp4,default=bf16"))
    assert round(size / GIB, 1) == 60.8
    # Hand count: expert matrices 36 x 128 x (2880 x 5760 + 2880 x 2880) at 4.25 bits, the rest at 16 bits.
    expert_matrix = 36 * 128 * (2880 * 5760 + 2880 * 2880)
    rest = counts.total_params - expert_matrix
    assert size == expert_matrix * 17 // 32 + rest * 2


def test_bf16_is_two_bytes_per_param() -> None:
    counts = count_params(load_model("llama3-8b"))
    assert weights_bytes(counts, parse_weight_precision("bf16")) == 2 * 8_030_261_248


def test_block_formats_include_scale_overhead() -> None:
    counts = count_params(load_model("llama3-8b"))
    tables = counts.total["embedding"].matrix + counts.total["lm_head"].matrix
    matrices = sum(p.matrix for p in counts.total.values()) - tables
    vectors = sum(p.vector for p in counts.total.values())
    # int4, group 128: 4 bits + (fp16 scale + 4-bit zero) / 128 = 4.15625 bits; vectors, embedding and lm_head
    # stay bf16, as quantized checkpoints ship them.
    kept = (tables + vectors) * 2
    assert weights_bytes(counts, parse_weight_precision("int4-g128")) == matrices * 133 // 256 + kept
    # nvfp4: 4.5 bits; mxfp4: 4.25 bits; fp8 with 128x128 fp32 block scales: 8 + 32/16384 bits.
    assert weights_bytes(counts, parse_weight_precision("nvfp4")) == matrices * 9 // 16 + kept
    assert weights_bytes(counts, parse_weight_precision("mxfp4")) == matrices * 17 // 32 + kept
    fp8_block = weights_bytes(counts, parse_weight_precision("fp8_block"))
    assert fp8_block - (matrices + kept) == pytest.approx(matrices * 32 / 16384 / 8, abs=1)
    # Asked for by name, the tables are quantized too.
    everything = parse_weight_precision("default=int4-g128,embedding=int4-g128,lm_head=int4-g128")
    assert weights_bytes(counts, everything) == (matrices + tables) * 133 // 256 + vectors * 2


def test_mixed_precision_applies_per_component() -> None:
    counts = count_params(load_model("mixtral-8x7b"))
    mixed = weights_bytes_by_component(counts, parse_weight_precision("experts=fp8,default=bf16"))
    plain = weights_bytes_by_component(counts, parse_weight_precision("bf16"))
    assert mixed["experts"] * 2 == plain["experts"]
    assert mixed["attention"] == plain["attention"]


@pytest.mark.parametrize("text, message", [
    ("experts=mxfp4", "name a default"),
    ("expert=mxfp4,default=bf16", "unknown component 'expert'"),
    ("bf17", "unknown dtype"),
    ("fp4", "ambiguous"),
    ("experts=,default=bf16", "component=dtype"),
])
def test_bad_weight_precisions(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_weight_precision(text)


def test_activation_workspace_formula_by_hand() -> None:
    # llama3-8b, batch 1, 4096 tokens (< 8192 chunk), bf16: attention width (2x32 + 2x8) x 128 = 10,240;
    # FFN width 3 x 14,336 = 43,008 wins; per token (2 x 4096 + 43,008) x 2 bytes; logits 128,256 x 4.
    spec = load_model("llama3-8b")
    got = activation_workspace_bytes(spec, 1, 4096, get_dtype("bf16"), 8192)
    assert got == 4096 * (2 * 4096 + 43_008) * 2 + 128_256 * 4
    # The chunk caps the tokens of one pass: batch 8 x 4096 = 32k tokens still run as 8192 at a time.
    capped = activation_workspace_bytes(spec, 8, 4096, get_dtype("bf16"), 8192)
    assert capped == 8192 * (2 * 4096 + 43_008) * 2 + 8 * 128_256 * 4
