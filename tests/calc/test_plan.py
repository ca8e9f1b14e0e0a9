"""The fit planner's ideal arithmetic (engine=None) against hand-computed cases and monotonicity properties.

Engine memory models (vLLM, SGLang, TensorRT-LLM) are tested in test_plan_engines.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc.plan import PlanConfig, candidate_layouts, check_parallelism, min_gpus, plan_fit, stage_layers
from tfcalc.calc.shard import Parallelism, check_weight_blocks
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import UsageError
from tfcalc.report.plan import plan_reason
from tfcalc.spec.presets import load_engine, load_gpu, load_model

GIB = 1 << 30
FP8 = parse_weight_precision("fp8")
BF16 = parse_weight_precision("bf16")


def test_llama3_70b_fp8_on_one_h100() -> None:
    r = plan_fit(load_model("llama3-70b"), load_gpu("h100-sxm"), FP8, get_dtype("fp8"),
                 PlanConfig(num_gpus=1, context=128 * 1024))
    # matrices 70,552,387,584 x 1 byte, but the embedding and lm_head (2 x 128256 x 8192) stay bf16 as FP8
    # checkpoints ship them, + 1,318,912 norm weights x 2 bytes
    tables = 2 * 128256 * 8192
    assert r.weights_bytes_per_gpu == 70_552_387_584 + tables + 2 * 1_318_912 == 72_656_371_712
    # 80 GiB x 0.1 + 1 GiB overhead + 8192 x (2 x 8192 + 3 x 28672) x 2 + 128256 x 4
    assert r.reserved_bytes_per_gpu == 8 * GIB + GIB + 8192 * (16384 + 86016) * 2 + 128256 * 4
    assert r.kv_bytes_per_token_per_gpu == 80 * 2 * 8 * 128  # 160 KiB
    assert r.kv_budget_bytes_per_gpu == 80 * GIB - r.weights_bytes_per_gpu - r.reserved_bytes_per_gpu
    assert r.max_concurrent_sequences == 0 and not r.fits
    assert r.max_context_at_batch == r.kv_budget_bytes_per_gpu // (16 * 163840) * 16 == 11_600
    assert "short by 18.23 GiB" in plan_reason(load_model("llama3-70b"), PlanConfig(num_gpus=1, context=128 * 1024),
                                               r)


def test_deepseek_v3_mla_latent_not_split_by_tp() -> None:
    spec, gpu = load_model("deepseek-v3"), load_gpu("h200")
    r8 = plan_fit(spec, gpu, FP8, get_dtype("fp8"), PlanConfig(num_gpus=8, tp=8, context=128 * 1024))
    r1 = plan_fit(spec, gpu, FP8, get_dtype("fp8"), PlanConfig(num_gpus=1, tp=1, context=4096))
    assert r8.kv_bytes_per_token_per_gpu == r1.kv_bytes_per_token_per_gpu == 61 * (512 + 64)
    assert r8.kv_bytes_per_sequence_per_gpu == 61 * 576 * 128 * 1024
    assert gpu.memory_bytes == 141 * GIB
    # 671 B params at 1 byte over 8 GPUs, plus the replicated q_a / kv_a projections, and the routers and
    # vocab-parallel embedding / lm_head kept in bf16 as the FP8 checkpoint ships them
    assert 84.5e9 < r8.weights_bytes_per_gpu < 85.5e9
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
    spec, gpu, kv = load_model("llama3-70b"), load_gpu("h100-sxm"), get_dtype("bf16")
    cfg = PlanConfig(num_gpus=1, context=8192, batch=8)
    # 2 GPUs (tp 2): 70.55e9 B weights + 10.0 GiB reserved leave ~4.3 GiB, 3 x 1.25 GiB sequences < 8.
    # 3 GPUs: tp 3 divides neither 64 heads nor is a node layout; pp 3 is pipeline inside a node -> skipped.
    # 4 GPUs tp 4: 32.86 GiB weights, 9.58 GiB reserved, 37.57 GiB budget / 0.625 GiB per 8k sequence = 60 >= 8.
    r = min_gpus(spec, gpu, BF16, kv, cfg)
    assert r is not None and r.fits
    assert (r.parallelism.num_gpus, r.parallelism.tp, r.parallelism.pp) == (4, 4, 1)
    assert r.max_concurrent_sequences == 60
    # Allowing pipeline stages inside the node finds the true minimum: 3 GPUs as pp 3 (27/27/26 layers).
    r3 = min_gpus(spec, gpu, BF16, kv, cfg, pps=[1, 2, 3])
    assert r3 is not None and (r3.parallelism.num_gpus, r3.parallelism.tp, r3.parallelism.pp) == (3, 1, 3)
    assert r3.stage_layer_counts == (27, 27, 26)
    assert candidate_layouts(spec, 16, 8)[0] == (8, 2)  # across two nodes: tp 8 in each, pp 2 tried first
    assert candidate_layouts(spec, 12, 8) == []  # 1.5 nodes: no pp within a node by default
    assert candidate_layouts(spec, 12, 8, pps=[3]) == [(4, 3)]


def test_llama3_70b_bf16_tp4_32k_batch8() -> None:
    """Case 1 by hand (h = 8192, 80 layers, 64 heads / 8 KV heads of 128, FFN 28672, vocab 128256)."""
    r = plan_fit(load_model("llama3-70b"), load_gpu("h100-sxm"), BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=4, tp=4, context=32768, batch=8))
    # per layer: q + o 2 x 8192 x 8192 / 4 = 33,554,432; k + v with 8 / 4 = 2 KV heads: 2 x 8192 x 2 x 128
    # = 4,194,304; FFN 3 x 8192 x 28672 / 4 = 176,160,768 -> 213,909,504 x 80 = 17,112,760,320
    # embedding + lm_head vocab-parallel: 2 x 128256 x 8192 / 4 = 525,336,576
    # norms replicated: 80 x 2 x 8192 + 8192 (final) = 1,318,912; all at 2 bytes
    assert r.weights_bytes_per_gpu == 2 * (17_112_760_320 + 525_336_576 + 1_318_912) == 35_278_831_616
    assert r.kv_bytes_per_token_per_gpu == 80 * 2 * 2 * 128 * 2 == 81_920
    # 8 GiB headroom + 1 GiB + 8192 x (2 x 8192 + 86016 / 4) x 2 + 128256 x 4 / 4
    assert r.activation_bytes_per_gpu == 8192 * (16384 + 21504) * 2 + 128256 == 620_885_248
    assert r.reserved_bytes_per_gpu == 9 * GIB + 620_885_248 == 10_284_561_664
    assert r.kv_budget_bytes_per_gpu == 80 * GIB - 35_278_831_616 - 10_284_561_664 == 40_335_952_640
    assert r.kv_bytes_per_sequence_per_gpu == 32768 * 81_920  # 2048 whole blocks of 16
    assert r.max_concurrent_sequences == 40_335_952_640 // 2_684_354_560 == 15
    # batch 8: floor(40,335,952,640 / (8 x 16 x 81,920)) = 3846 blocks = 61,536 tokens
    assert r.max_context_at_batch == 3846 * 16 == 61_536
    assert r.kv_blocks_per_gpu == 40_335_952_640 // (16 * 81_920) == 30_773
    assert r.fits


def test_expert_placement_mixtral_fp8() -> None:
    """Case 2: 32 layers, 8 experts of 3 x 4096 x 14336 = 176,160,768; attention 4096/32 heads/8 KV heads."""
    spec, gpu, fp8 = load_model("mixtral-8x7b"), load_gpu("h100-sxm"), get_dtype("fp8")

    def weights(n: int, tp: int, ep: int) -> int:
        return plan_fit(spec, gpu, FP8, fp8, PlanConfig(num_gpus=n, tp=tp, ep=ep, context=4096)).weights_bytes_per_gpu

    vectors = 2 * (32 * 2 * 4096 + 4096)  # norms, 16-bit
    # tp 2: attention (2 x 4096^2 + 2 x 4096 x 8 x 128) / 2 = 20,971,520; experts 8 x 176,160,768 / 2 at 1 byte;
    # router 4096 x 8 replicated and embedding + lm_head 2 x 32000 x 4096 / 2 at 2 bytes (kept bf16 by FP8
    # checkpoints)
    tp2 = 32 * (20_971_520 + 4 * 176_160_768 + 2 * 32_768) + 2 * 131_072_000 + vectors
    assert weights(2, 2, 1) == tp2 == 23_484_440_576
    assert weights(2, 2, 2) == tp2  # ep 2 = tp 2: 4 whole experts per GPU, the same bytes
    # ep 2 over 2 data-parallel replicas (tp 1): full attention, 4 whole experts per GPU
    assert weights(2, 1, 2) == 32 * (41_943_040 + 4 * 176_160_768 + 2 * 32_768) + 2 * 262_144_000 + vectors
    # tp 4, ep 2 (moe_tp 2 x moe_ep 2): 4 experts per GPU, each sliced in 2 -- not 4 whole experts per GPU
    tp4 = 32 * (10_485_760 + 4 * 176_160_768 // 2 + 2 * 32_768) + 2 * 65_536_000 + vectors
    assert weights(4, 4, 2) == tp4 == weights(4, 4, 1)
    with pytest.raises(UsageError, match="ep 3"):
        check_parallelism(load_model("qwen3-235b-a22b"), 6, 2, ep=3)


@pytest.mark.parametrize(("model", "weights", "tp", "ep", "refused"), [
    # Qwen3-235B-A22B-FP8 (128x128 blocks): 1,536-wide experts sliced 8 ways are 192 wide; aiconfigurator's MoE
    # check and vLLM's fused-MoE loader ("not divisible by weight quantization block_n") both refuse it
    ("qwen3-235b-a22b", "fp8_block", 8, 1, "each expert .* 192 wide"),
    ("qwen3-235b-a22b", "fp8_block", 4, 1, None),
    ("qwen3-235b-a22b", "fp8_block", 8, 8, None),       # whole experts per GPU
    ("qwen3-235b-a22b", "fp8_block", 8, 2, None),       # moe_tp 4: 384 wide
    # Qwen3-30B-A3B-GPTQ-Int4 runs at tp 1-2 only: 768 / 128 = 6 groups (vLLM PR #28829)
    ("qwen3-30b-a3b", "int4", 4, 1, "each expert .* 192 wide"),
    ("qwen3-30b-a3b", "int4", 2, 1, None),
    # Qwen2.5-72B's 29,568-wide MLP holds 231 groups of 128: no int4 split (Qwen docs, GPTQ: pad to 29,696)
    ("qwen2.5-72b", "int4", 2, 1, "the MLP .* 14784 wide"),
    ("qwen2.5-72b", "fp8", 8, 1, None),                 # per-tensor scales: any split
    ("qwen2.5-72b", "bf16", 8, 1, None),
    # DeepSeek-V3 as released (fp8 128x128) at tp 8: experts 256, dense MLP 2,304, heads 16 x 192 / 16 x 128
    ("deepseek-v3", "fp8_block", 8, 1, None),
    ("deepseek-v3", "fp8_block", 16, 1, None),
])
def test_block_scaled_weights_split_into_whole_blocks(model: str, weights: str, tp: int, ep: int,
                                                     refused: str | None) -> None:
    """Engines load a block-scaled checkpoint only where every tensor-parallel slice holds whole blocks; the plan
    refuses the rest with the reason (and the search skips them)."""
    spec, precision = load_model(model), parse_weight_precision(weights)
    config = PlanConfig(num_gpus=tp, tp=tp, ep=ep, context=4096)
    if refused is None:
        check_weight_blocks(spec, Parallelism(tp=tp, ep=ep), precision)
        plan_fit(spec, load_gpu("b200"), precision, get_dtype("bf16"), config)
        return
    with pytest.raises(UsageError, match=refused):
        plan_fit(spec, load_gpu("b200"), precision, get_dtype("bf16"), config)


def test_pipeline_split_llama3_70b_pp2() -> None:
    """Case 3: 40 + 40 layers; embedding on stage 0, final norm + lm_head on stage 1 (the larger by 8192 norm)."""
    r = plan_fit(load_model("llama3-70b"), load_gpu("h100-sxm"), BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=2, tp=1, pp=2, context=8192, batch=2))
    layer = 2 * 8192 * 8192 + 2 * 8192 * 8 * 128 + 3 * 8192 * 28672  # 855,638,016
    assert r.weights_bytes_per_gpu == 2 * (40 * layer + 128256 * 8192 + 40 * 16384 + 8192) == 70_553_714_688
    assert r.kv_bytes_per_token_per_gpu == 40 * 4096
    # reserved 9 GiB + 8192 x 102400 x 2 + 128256 x 4 = 11,341,911,040; budget 4,003,720,192
    assert r.kv_budget_bytes_per_gpu == 80 * GIB - 70_553_714_688 - 11_341_911_040 == 4_003_720_192
    assert r.max_concurrent_sequences == 4_003_720_192 // (8192 * 40 * 4096) == 2
    assert r.max_context_at_batch == 4_003_720_192 // (2 * 40 * 4096 * 16) * 16 == 12_208


def test_stage_layers_follow_vllm() -> None:
    # vLLM get_pp_indices: the extra layers go to the stages before the last, from the second-to-last back
    assert [len(s) for s in stage_layers(80, 3)] == [27, 27, 26]
    assert [len(s) for s in stage_layers(61, 4)] == [15, 15, 16, 15]
    assert [len(s) for s in stage_layers(22, 4)] == [5, 6, 6, 5]
    assert [len(s) for s in stage_layers(81, 2)] == [41, 40]
    assert stage_layers(61, 4)[2] == range(30, 46)


def test_qwen3_235b_tp8_replicates_kv_heads() -> None:
    """Case 4a: 4 KV heads < tp 8, one per GPU; 94 layers, 128 experts of 3 x 4096 x 1536, qk-norm."""
    r = plan_fit(load_model("qwen3-235b-a22b"), load_gpu("h100-sxm"), BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=8, tp=8, context=32768, batch=8))
    # attention: q + o 2 x 4096 x 8192 / 8 = 8,388,608 + k, v with 1 KV head 2 x 4096 x 128 = 1,048,576
    # experts 128 x 18,874,368 / 8 = 301,989,888; router 4096 x 128 = 524,288 replicated
    layer = 8_388_608 + 1_048_576 + 301_989_888 + 524_288
    vectors = 94 * (2 * 4096 + 2 * 128) + 4096
    assert r.weights_bytes_per_gpu == 2 * (94 * layer + 2 * 151936 * 4096 // 8 + vectors) == 58_959_617_024
    assert r.kv_bytes_per_token_per_gpu == 94 * 2 * 1 * 128 * 2 == 48_128
    # budget 17,066,261,312 / (8 x 94 x 512 x 16) = 2770 blocks = 44,320 > the model's 40,960: capped
    assert r.max_concurrent_sequences == 10 and r.max_context_at_batch == 40_960


def test_deepseek_v3_tp8_exact() -> None:
    """Case 4b: MLA q_a [7168, 1536] and kv_a [7168, 576] replicated, q_b / kv_b / o split, latent unsplit."""
    r = plan_fit(load_model("deepseek-v3"), load_gpu("h200"), FP8, get_dtype("fp8"),
                 PlanConfig(num_gpus=8, tp=8, context=32768, batch=8))
    attention = 7168 * 576 + 7168 * 1536 + (1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168) // 8
    moe = 256 * 3 * 7168 * 2048 // 8 + 3 * 7168 * 2048 // 8 + 7168 * 256
    matrices = 61 * attention + 3 * (3 * 7168 * 18432 // 8) + 58 * moe + 2 * 129280 * 7168 // 8
    vectors = 61 * (2 * 7168 + 1536 + 512) + 58 * 256 + 7168  # norms, router score bias: 2 bytes
    # the FP8 checkpoint keeps the routers (58 x 7168 x 256) and embedding / lm_head in bf16: one more byte each
    kept = 58 * 7168 * 256 + 2 * 129280 * 7168 // 8
    assert r.weights_bytes_per_gpu == matrices + kept + 2 * vectors == 85_119_478_784
    assert r.kv_bytes_per_token_per_gpu == 61 * 576


def test_context_beyond_model_maximum_is_noted() -> None:
    spec = load_model("llama3-8b")
    cfg = PlanConfig(num_gpus=1, context=16384)
    r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"), cfg)
    assert "exceeds llama3-8b's maximum 8,192" in plan_reason(spec, cfg, r)
    cfg = PlanConfig(num_gpus=1, context=8192)
    r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"), cfg)
    assert "exceeds" not in plan_reason(spec, cfg, r) and r.max_context_at_batch == 8192


def test_gpu_units() -> None:
    gpu = load_gpu("h100-sxm")
    assert gpu.memory_bytes == 80 * GIB == 85_899_345_920  # vendor "80GB" = 80 GiB
    assert gpu.hbm_bandwidth_bytes_per_s == 3.35e12  # TB/s = 10^12 B/s
    assert gpu.peak_flops("bf16") == ("bf16", 989.5e12)  # dense, not the 1,979 sparse figure
    assert gpu.peak_flops("fp8") == ("fp8", 1979e12)
    assert gpu.interconnect_bandwidth_bytes_per_s == 450e9  # 900 GB/s bidirectional / 2
    assert load_gpu("a100-80gb").peak_flops("fp8") == ("bf16", 312e12)  # no fp8 on Ampere: bf16


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


def test_a_vision_encoder_sits_on_the_first_stage_split_like_siglip() -> None:
    """Gemma 3 27B's SigLIP tower and projector (423,060,336 parameters, 16-bit even under fp8 weights): whole at
    tp 1; at tp 2 its blocks' q/k/v/out/fc1/fc2 matrices and column biases halve, embeddings, norms, row biases and
    the projector stay whole; under pipeline parallelism only the first stage holds it."""
    from pathlib import Path

    from tfcalc.calc.shard import shard, stage_weight_bytes
    from tfcalc.spec.hf_config import load_hf_config

    spec = load_hf_config(Path(__file__).parents[1] / "fixtures" / "hf_configs" / "gemma3-27b.json")
    text = spec.with_overrides(encoder=None)
    h, i, layers = 1152, 4304, 27
    split = (4 * h * h + 2 * h * i + 3 * h + i) * layers
    whole = 423_060_336
    for weights in ("bf16", "fp8"):
        precision = parse_weight_precision(weights)
        for tp, encoder in ((1, whole), (2, whole - split // 2)):
            par = Parallelism(tp=tp)
            first = [stage_weight_bytes(s, shard(s, par), precision, range(0, 31), first=True, last=False)
                     for s in (spec, text)]
            assert first[0] - first[1] == 2 * encoder, (weights, tp)
            last = [stage_weight_bytes(s, shard(s, par), precision, range(31, 62), first=False, last=True)
                    for s in (spec, text)]
            assert last[0] == last[1]


def test_redundant_experts_spread_with_the_experts() -> None:
    """EPLB's replicas: DeepSeek-V3's 256 experts + 32 redundant = 288 over ep 72 put 4 on each GPU (the LMSYS
    large-scale-EP deployment's layout), the 4 that ep 64 puts there without them: the same expert bytes per GPU by
    hand (58 MoE layers x 4 experts x 3 x 7168 x 2048 fp8 values and their 128 x 128 block scales)."""
    from tfcalc.calc.shard import shard

    spec, gpu, fp8 = load_model("deepseek-v3"), load_gpu("h200"), parse_weight_precision("fp8_block")
    eplb = check_parallelism(spec, 72, 1, 1, 72, redundant_experts=32)
    assert (eplb.redundant_experts, shard(spec, eplb).experts_resident, shard(spec, eplb).expert_slots) == (32, 4, 288)
    plain = PlanConfig(num_gpus=64, tp=1, ep=64, context=4096)
    wide = PlanConfig(num_gpus=72, tp=1, ep=72, redundant_experts=32, context=4096)
    r64, r72 = (plan_fit(spec, gpu, fp8, get_dtype("fp8"), cfg) for cfg in (plain, wide))
    assert r72.weights_bytes_per_gpu == r64.weights_bytes_per_gpu
    one_expert = 3 * 7168 * 2048 * (1 + 4 / 128 ** 2)
    sixty_three = plan_fit(spec, gpu, fp8, get_dtype("fp8"), PlanConfig(num_gpus=8, tp=1, ep=8, context=4096,
                                                                         redundant_experts=32))
    assert sixty_three.weights_bytes_per_gpu - r64.weights_bytes_per_gpu == pytest.approx(
        58 * (36 - 4) * one_expert, rel=1e-9)   # 288 / 8 = 36 experts a GPU against 4
    for args, message in (((72, 1, 1, 72), "does not divide the 256 experts of deepseek-v3 \\(redundant"),
                          ((72, 1, 1, 72, 16), "does not divide the 256 \\+ 16 redundant experts"),
                          ((8, 8, 1, 8, 32), None), ((8, 8, 1, 1, 32), "need an MoE model and whole experts"),
                          ((16, 8, 1, 4, 32), "need an MoE model and whole experts")):
        if message is None:
            assert check_parallelism(spec, *args[:4], redundant_experts=args[4]).redundant_experts == 32
            continue
        with pytest.raises(UsageError, match=message):
            check_parallelism(spec, *args[:4], **({"redundant_experts": args[4]} if len(args) > 4 else {}))
    with pytest.raises(UsageError, match="need an MoE model"):
        check_parallelism(load_model("llama3-8b"), 8, 1, 1, 8, redundant_experts=8)


def test_hybrid_stages_without_attention_bound_nothing() -> None:
    """Nemotron-H-56B at pp 60 (118 layers: about 2 a stage) has stages of MLP layers only (nothing kept per
    request) and of Mamba layers only (a state, no KV): the pool and the sequences are the stages' that hold them,
    so more stages never fit fewer sequences (pp 30: 1,039 at 8K; before, pp 60 showed 0 KV tokens and no fit)."""
    from tfcalc.calc.plan import stage_census
    from tfcalc.spec.presets import load_engine

    spec, gpu, vllm = load_model("nemotron-h-56b"), load_gpu("h100-sxm"), load_engine("vllm")
    precision, bf16 = parse_weight_precision(spec.native_dtype), get_dtype("bf16")
    censuses = [stage_census(spec, layers) for layers in stage_layers(spec.num_layers, 60)]
    assert any(c.attention_layers == 0 and c.linear_layers == 0 for c in censuses)   # MLP layers only
    assert any(c.attention_layers == 0 and c.linear_layers > 0 for c in censuses)    # Mamba layers only
    plans = {pp: plan_fit(spec, gpu, precision, bf16, PlanConfig(num_gpus=pp, tp=1, pp=pp, context=8192,
                                                                  engine=vllm), with_ideal=False)
             for pp in (30, 60)}
    for plan in plans.values():
        assert plan.fits and plan.kv_tokens_per_gpu > 0 and plan.max_context_at_batch == 8192
        assert plan.shortfall_bytes_per_gpu == 0
    assert plans[60].max_concurrent_sequences >= plans[30].max_concurrent_sequences


def test_min_gpus_tries_expert_parallelism_and_skips_layouts_that_cut_weight_blocks() -> None:
    """MiniMax-M2.7 in fp8 blocks of 128: at tp 8 each expert (1,536 wide) is cut into 192-wide slices, which engines
    refuse; with the experts whole on their GPUs (ep 8) the 8-GPU layout is served. The search skips the refused
    layout instead of stopping at it, and a dense model is never given an ep."""
    from tfcalc.calc.plan import searched_layouts
    from tfcalc.dtypes import parse_weight_precision

    spec, gpu = load_model("minimax-m2.7"), load_gpu("h100-sxm")
    fp8 = parse_weight_precision("fp8_block")
    assert spec.moe is not None and spec.moe.expert_intermediate_size // 8 % 128
    layouts = searched_layouts(spec, fp8, 8, 8)
    assert (8, 1, 8) in layouts and (8, 1, 1) not in layouts and (4, 2, 1) in layouts
    assert all(ep in (1, tp) for tp, _, ep in layouts)
    with pytest.raises(UsageError, match="not a whole number"):
        plan_fit(spec, gpu, fp8, get_dtype("bf16"), PlanConfig(num_gpus=8, tp=8, context=204800, batch=1))
    vllm = PlanConfig(num_gpus=1, context=204800, batch=1, engine=load_engine("vllm@0.21"))
    r = min_gpus(spec, gpu, fp8, get_dtype("bf16"), vllm)   # vLLM's 4 GPUs fall 0.24 GiB short of a sequence
    assert r is not None and r.fits
    assert (r.parallelism.num_gpus, r.parallelism.tp, r.parallelism.ep) == (8, 8, 8)
    dense = searched_layouts(load_model("llama3-70b"), BF16, 8, 8)
    assert [(tp, ep) for tp, _, ep in dense] == [(8, 1), (4, 1), (2, 1), (1, 1)][:len(dense)]
