"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the indexer's cache and FlashMLA's fp8 record, the plan's pool,
and the latency model's indexer, top-k decode and sparse prefill, against hand counts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc.kv_cache import (
    default_kv_dtype,
    indexer_key_bytes,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_layer_bytes,
    sparse_mla_record,
)
from tfcalc.calc.latency import StepShape, deployment, step_time
from tfcalc.calc.plan import PlanConfig, plan_fit
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import SpecError
from tfcalc.spec.hf_config import load_hf_config, spec_from_hf_config
from tfcalc.spec.model import SparseIndexerSpec
from tfcalc.spec.presets import load_engine, load_gpu, load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
BF16, FP8 = get_dtype("bf16"), get_dtype("fp8")


def test_cache_bytes_per_token_by_hand() -> None:
    """DeepSeek-V3.2, 61 layers: bf16 latent 2 x (512 + 64) = 1,152 B + the indexer key 128 + 4 = 132 B; fp8: the
    sparse record 512 + 4 x 4 + 2 x 64 = 656 B + 132 B."""
    spec = load_model("deepseek-v3.2")
    assert indexer_key_bytes(spec) == 132 and sparse_mla_record(spec, FP8) == 656
    assert sparse_mla_record(spec, BF16) is None and kv_layer_bytes(spec, BF16) == 1152
    assert kv_bytes_per_token(spec, BF16) == 61 * (1152 + 132) == 78_324
    assert kv_bytes_per_token(spec, FP8) == 61 * (656 + 132) == 48_068
    assert kv_cache_bytes(spec, FP8, 131072, 2) == 2 * 131072 * 48_068
    # DeepSeek-V3 (no indexer): the plain fp8 latent, 576 B
    assert kv_bytes_per_token(load_model("deepseek-v3"), FP8) == 61 * 576


def test_shared_indexer_layers_cache_no_keys() -> None:
    """GLM-5.2: 21 of its 78 layers run their own indexer (indexer_types "full"), the others reuse its choice."""
    spec = load_hf_config(FIXTURES / "glm-5.2.json")
    assert spec.num_indexer_layers == 21 and spec.sparse_indexer is not None
    assert spec.sparse_indexer.layers[:4] == (0, 1, 2, 6)
    assert kv_bytes_per_token(spec, BF16) == 78 * 1152 + 21 * 132


def test_indexer_layer_pattern_from_freq_offset_and_string() -> None:
    base = {**_config("glm-5.json"), "num_hidden_layers": 8}
    by_freq = spec_from_hf_config({**base, "index_topk_freq": 4, "index_skip_topk_offset": 3}, "t", "t")
    assert by_freq.sparse_indexer.layers == (0, 1, 2, 6)
    by_string = spec_from_hf_config({**base, "index_topk_pattern": "FSSFFSSS"}, "t", "t")
    assert by_string.sparse_indexer.layers == (0, 3, 4)
    with pytest.raises(SpecError, match="indexer_types"):
        spec_from_hf_config({**base, "indexer_types": ["full"] * 3}, "t", "t")


def test_indexer_needs_mla_and_layer_zero() -> None:
    spec = load_model("deepseek-v3.2")
    with pytest.raises(SpecError, match="layer 0"):
        replace(spec, sparse_indexer=SparseIndexerSpec(layers=(1, 2), num_heads=64, head_dim=128, topk=2048))
    with pytest.raises(SpecError, match="needs MLA"):
        replace(load_model("llama3-8b"), sparse_indexer=SparseIndexerSpec(layers=(0,), num_heads=4, head_dim=128,
                                                                           topk=64))


def test_only_vllm_011_keeps_a_dsa_cache_in_fp8_by_default() -> None:
    """vLLM 0.11.x turned --kv-cache-dtype auto into fp8_ds_mla for a DSA model (``kv.sparse_mla_fp8``); from 0.12
    auto stays the model dtype, as in every vLLM preset (their releases' wheels) and SGLang."""
    spec = load_model("deepseek-v3.2")
    vllm = load_engine("vllm-0.21")
    assert default_kv_dtype(spec, replace(vllm, kv=replace(vllm.kv, sparse_mla_fp8=True))).name == "fp8_e4m3"
    for engine in ("vllm-0.21", "vllm-0.17", "vllm-0.11", "sglang-0.5"):
        assert default_kv_dtype(spec, load_engine(engine)).name == "bf16"
    assert default_kv_dtype(load_model("deepseek-v3"), replace(vllm, kv=replace(vllm.kv, sparse_mla_fp8=True))
                            ).name == "bf16"


def test_plan_pool_holds_the_record_and_the_indexer_keys() -> None:
    """vLLM's pool on 8 H200s: KV tokens = budget // (61 x (656 + 132)) to the block."""
    spec, gpu = load_model("deepseek-v3.2"), load_gpu("h200")
    cfg = PlanConfig(num_gpus=8, tp=8, context=32768, engine=load_engine("vllm-0.21"))
    r = plan_fit(spec, gpu, parse_weight_precision("fp8_block"), FP8, cfg, with_ideal=False, with_max_context=False)
    per_token = 61 * (656 + 132)
    assert r.kv_bytes_per_token_per_gpu == per_token
    assert r.kv_budget_bytes_per_gpu // per_token - 64 < r.kv_tokens_per_gpu <= r.kv_budget_bytes_per_gpu // per_token


def _deployment(model: str = "deepseek-v3.2", engine: str = "vllm-0.21", gpu: str = "h200", **kernel_changes):
    spec = load_model(model) if not model.endswith(".json") else load_hf_config(FIXTURES / model)
    kernels = replace(load_engine(engine).kernels, **kernel_changes)
    return spec, deployment(spec, load_gpu(gpu), parse_weight_precision("fp8_block"), BF16, tp=8,
                            engine_kernels=kernels)


def test_decode_reads_top_k_latents_and_every_indexer_key() -> None:
    """One sequence decoding at context C reads min(C, 2048) latents of 1,152 B and C indexer keys of 132 B per
    layer (the attention group's cache traffic)."""
    spec, d = _deployment()
    for context in (1000, 2048, 8192, 65536):
        step = step_time(d, StepShape(decode_seqs=1, decode_context=context))
        assert step.kv_read_bytes == pytest.approx(61 * (min(context, 2048) * 1152 + context * 132))


def test_an_fp8_cache_read_as_the_engine_stores_it() -> None:
    """fp8: FlashMLA's 656-byte record per latent (512 fp8 values, 4 fp32 scales, 64 bf16 RoPE values), or the raw
    576 bytes where the engine keeps them (SGLang 0.5.10+ on SM100: ``calc.engine.sparse_mla_raw``); what a decode
    step reads follows, as the plan's pool does."""
    from tfcalc.calc.engine import sparse_mla_raw

    spec, gpu, fp8 = load_model("deepseek-v3.2"), load_gpu("b200"), get_dtype("fp8")
    bf16 = parse_weight_precision("bf16")
    record, raw = (deployment(spec, gpu, bf16, fp8, tp=8, raw_sparse_latent=r) for r in (False, True))
    assert sparse_mla_raw(load_engine("sglang"), gpu) and not sparse_mla_raw(load_engine("sglang"), load_gpu("h200"))
    assert not sparse_mla_raw(load_engine("vllm"), gpu)
    shape = StepShape(decode_seqs=1, decode_context=65536)
    layers, keys = spec.num_layers, spec.sparse_indexer.topk
    read = {name: step_time(d, shape).kv_read_bytes for name, d in (("record", record), ("raw", raw))}
    assert read["record"] - read["raw"] == pytest.approx(layers * keys * (656 - 576))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 60000), st.integers(1, 60000))
def test_decode_step_monotonic_in_context(c1: int, c2: int) -> None:
    _, d = _deployment()
    lo, hi = sorted((c1, c2))
    t = [step_time(d, StepShape(decode_seqs=4, decode_context=c)).seconds for c in (lo, hi)]
    assert t[0] <= t[1] + 1e-12


def test_shared_layers_skip_the_indexer() -> None:
    """GLM-5.2's decode step runs the indexer on 21 layers, GLM-5's on 78: per layer its projections (wq_b 2,048 x
    32 x 128, wk and weights_proj 6,144 x (128 + 32)) and 2 x 32 x 128 FLOPs per cached token."""
    context = 16384
    flops = {}
    for model in ("glm-5.json", "glm-5.2.json"):
        _, d = _deployment(model)
        flops[model] = step_time(d, StepShape(decode_seqs=1, decode_context=context)).flops
    per_layer = 2 * 32 * 128 * context + 2 * (2048 * 32 * 128 + 6144 * (128 + 32))
    assert flops["glm-5.json"] - flops["glm-5.2.json"] == pytest.approx((78 - 21) * per_layer, rel=1e-9)


def test_sparse_prefill_pads_heads_to_the_kernel_tile() -> None:
    """16 query heads per GPU run as 64 on FlashMLA's sparse prefill (vLLM on Hopper): the attention group of an
    8,192-token prefill takes longer than with no tile, and the ideal (FLOPs at peak) is the same for both."""
    shape = StepShape(prefill_seqs=1, prefill_tokens=8192)
    _, padded = _deployment()
    _, unpadded = _deployment(dsa_prefill_head_tile_by_gpu={})
    t_padded = step_time(padded, shape, "prefill").groups["attention"].seconds
    t_unpadded = step_time(unpadded, shape, "prefill").groups["attention"].seconds
    assert t_padded > 2 * t_unpadded
    assert step_time(padded, shape, "prefill", ideal=True).seconds == step_time(unpadded, shape, "prefill",
                                                                                 ideal=True).seconds


def test_dense_short_prefill_skips_the_indexer_logits() -> None:
    """SGLang runs a prompt within the top-k as dense MLA: no indexer logits (2 x 64 x 128 per causal pair); a longer
    prompt takes the sparse path with them."""
    pairs = 1500 * 1501 / 2
    flops = {}
    for dense in (True, False):
        _, d = _deployment(engine="sglang-0.5", dsa_dense_short_prefill=dense)
        flops[dense] = step_time(d, StepShape(prefill_seqs=1, prefill_tokens=1500), "prefill").flops
    assert flops[False] > flops[True] + 61 * 2 * 64 * 128 * pairs * 0.99
    _, sglang = _deployment(engine="sglang-0.5")
    _, sparse = _deployment(engine="sglang-0.5", dsa_dense_short_prefill=False)
    long = StepShape(prefill_seqs=1, prefill_tokens=4096)
    assert step_time(sglang, long, "prefill").flops == step_time(sparse, long, "prefill").flops


def test_full_topk_slots_make_prefill_linear_in_tokens() -> None:
    """TensorRT-LLM on Hopper runs every query's 2,048 slots: 8 prompts of 512 tokens cost as much sparse attention
    as one of 4,096 (to 10 %), where a kernel skipping invalid slots does about a quarter of the work."""
    def attention(d, seqs: int, tokens: int) -> float:
        return step_time(d, StepShape(prefill_seqs=seqs, prefill_tokens=tokens), "prefill").groups["attention"].seconds

    _, trt = _deployment(engine="trtllm-1.0", dsa_block_floors_by_gpu={})
    assert attention(trt, 8, 512) == pytest.approx(attention(trt, 1, 4096), rel=0.1)
    _, vllm = _deployment(dsa_block_floors_by_gpu={})
    assert attention(vllm, 8, 512) < 0.6 * attention(vllm, 1, 4096)


def _config(name: str) -> dict:
    import json

    return json.loads((FIXTURES / name).read_text())
