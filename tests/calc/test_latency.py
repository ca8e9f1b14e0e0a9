"""The step / phase latency model: hand counts, the pure roofline it keeps, parallelism, and invariants."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc import kernels, work
from tfcalc.calc.kv_cache import default_kv_dtype
from tfcalc.calc.latency import (
    StepShape,
    deployment,
    estimate_latency,
    fp8_input_scale,
    linear_mode,
    serving_step_seconds,
    step_seconds,
    step_time,
    turning_point_batch,
)
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import UsageError
from tfcalc.spec.engine import EngineKernels
from tfcalc.spec.model import INT_LIMITS
from tfcalc.spec.presets import load_engine, load_gpu, load_model

BF16 = parse_weight_precision("bf16")
KV = get_dtype("bf16")


def _d(name: str, gpu: str = "h100-sxm", weights: str | None = None, **kwargs):  # noqa: ANN202 - Deployment
    spec = load_model(name)
    precision = parse_weight_precision(weights or spec.native_dtype)
    return deployment(spec, load_gpu(gpu), precision, default_kv_dtype(spec), **kwargs)


def test_llama3_8b_decode_bytes_by_hand() -> None:
    d = _d("llama3-8b")
    step = step_time(d, StepShape(decode_seqs=1, decode_context=1024))
    per_layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 4096 * 2 * 14336 + 14336 * 4096
    assert step.weight_bytes == (32 * per_layer + 128256 * 4096) * 2  # + lm_head; the embedding is gathered
    assert step.kv_read_bytes == 32 * 1024 * 2 * 8 * 128 * 2
    assert step.seconds == pytest.approx(sum(g.seconds for g in step.groups.values()))


def _pure_roofline(d, batch: int, prompt: int, gen: int, attention_flops: float = 0.0) -> tuple[float, float]:  # noqa: ANN001
    """(TTFT, TPOT) of the pure roofline from tfcalc.calc.work's independent FLOP and byte counts: max(FLOPs /
    peak, bytes / HBM) + two ring all-reduces per layer of tokens x h x 2 bytes over the link, by hand.
    ``attention_flops`` of prefill run at the 16-bit peak, the rest at the weights' tensor-core format."""
    m = work.make_model(d.spec, d.precision, d.kv_dtype, d.tp)
    gpu = d.gpu
    compute = "fp8" if d.precision.default.name.startswith("fp8") else "bf16"
    peak, peak16, bandwidth = gpu.peak_flops(compute)[1], gpu.peak_flops("bf16")[1], gpu.hbm_bandwidth_bytes_per_s

    def comm(tokens: int) -> float:
        if d.tp == 1:
            return 0.0
        return 2 * d.spec.num_layers * 2 * (d.tp - 1) / d.tp * tokens * d.spec.hidden_size * 2 / \
            gpu.interconnect_bandwidth_bytes_per_s

    pre = work.prefill_work(m, batch, prompt)
    ttft = max((pre.flops - attention_flops) / peak + attention_flops / peak16, pre.bytes / bandwidth)
    dec = work.decode_work(m, batch, prompt + max(gen // 2, 1))
    return ttft + comm(batch * prompt), max(dec.flops / peak, dec.bytes / bandwidth) + comm(batch)


@pytest.mark.parametrize(("name", "tp", "weights"), [
    ("llama3-8b", 1, "bf16"), ("llama3-70b", 4, "bf16"), ("mixtral-8x7b", 2, "bf16"), ("gemma2-27b", 2, "bf16"),
    ("gpt-oss-120b", 1, None), ("qwen3-30b-a3b", 1, "bf16"), ("qwen3-next-80b-a3b", 2, "bf16"),
    ("qwen3.5-27b", 1, "bf16"),
])
@pytest.mark.parametrize(("batch", "prompt", "gen"), [(1, 1024, 256), (32, 4096, 64)])
def test_ideal_columns_are_the_pure_roofline_of_the_counted_work(name: str, tp: int, weights: str | None,
                                                                   batch: int, prompt: int, gen: int) -> None:
    d = _d(name, "h200", weights, tp=tp)
    e = estimate_latency(d, batch, prompt, gen)
    ttft, tpot = _pure_roofline(d, batch, prompt, gen)
    assert e.tpot_s_ideal == pytest.approx(tpot, rel=6e-3)
    assert e.ttft_s_ideal == pytest.approx(ttft, rel=6e-3)


def test_engine_moe_efficiency_prices_the_experts_and_leaves_ideal_alone() -> None:
    """An engine's fused-MoE efficiency on this GPU replaces the GPU preset's: halving it doubles the
    compute-bound expert GEMMs of a long prefill (TTFT up), and the ideal columns do not move; on another GPU
    the entry does not apply."""
    spec = load_model("qwen3-235b-a22b")
    fp8 = parse_weight_precision("fp8_block")

    def run(gpu: str, kernels: EngineKernels):  # noqa: ANN202 - LatencyEstimate
        d = deployment(spec, load_gpu(gpu), fp8, default_kv_dtype(spec), tp=4, engine_kernels=kernels)
        return estimate_latency(d, 8, 4096, 64)

    slow = EngineKernels(moe_efficiency_by_gpu={"h200": {"fp8": 0.32}})
    base, halved = run("h200", EngineKernels()), run("h200", slow)
    assert halved.ttft_s > 1.2 * base.ttft_s
    assert halved.ttft_s_ideal == base.ttft_s_ideal and halved.tpot_s_ideal == base.tpot_s_ideal
    assert run("h100-sxm", slow).ttft_s == run("h100-sxm", EngineKernels()).ttft_s


def test_gemm_streaming_by_weight_format_reaches_decode_not_prefill() -> None:
    """An engine's per-format GEMM streaming on this GPU: per-tensor fp8 weights streamed at half the fraction make
    a batch-1 decode of Llama 3 70B (weight-bound) about that much slower, leave a long prefill (compute-bound)
    and the ideal columns alone, and do not touch bf16 weights."""
    spec = load_model("llama3-70b")

    def run(weights: str, kernels: EngineKernels):  # noqa: ANN202 - LatencyEstimate
        d = deployment(spec, load_gpu("h200"), parse_weight_precision(weights), KV, engine_kernels=kernels)
        return estimate_latency(d, 1, 8192, 64)

    slow = EngineKernels(gemm_memory_efficiency_by_gpu={"h200": {"fp8_e4m3": 0.41}})
    base, halved = run("fp8", EngineKernels()), run("fp8", slow)
    assert 1.5 < halved.tpot_s / base.tpot_s < 1.9  # weights ~85 % of the step, streamed at 0.41 vs 0.755
    assert halved.ttft_s == pytest.approx(base.ttft_s, rel=0.01)
    assert halved.tpot_s_ideal == base.tpot_s_ideal and halved.ttft_s_ideal == base.ttft_s_ideal
    assert run("bf16", slow).tpot_s == run("bf16", EngineKernels()).tpot_s


def test_fp8_cache_prefill_attention_scale_reaches_prefill_with_an_fp8_cache_only() -> None:
    """The engine's prefill-attention scale over an fp8 cache slows a long prefill of Llama 3.1 8B (attention
    about a fifth of it at 8k tokens), leaves its decode, a bf16 cache and the ideal columns alone."""
    spec = load_model("llama3.1-8b")

    def run(kv: str, kernels: EngineKernels):  # noqa: ANN202 - LatencyEstimate
        d = deployment(spec, load_gpu("h200"), BF16, get_dtype(kv), engine_kernels=kernels)
        return estimate_latency(d, 1, 8192, 64)

    slow = EngineKernels(fp8_kv_prefill_scale_by_gpu={"h200": 2.0})
    base, doubled = run("fp8", EngineKernels()), run("fp8", slow)
    assert 1.1 < doubled.ttft_s / base.ttft_s < 1.4
    assert doubled.tpot_s == base.tpot_s and doubled.ttft_s_ideal == base.ttft_s_ideal
    assert run("bf16", slow).ttft_s == run("bf16", EngineKernels()).ttft_s


def test_engine_gemm_compute_efficiency_reaches_prefill_not_decode() -> None:
    """An engine's large-GEMM efficiency for a weight format on this GPU: per-tensor fp8 GEMMs at 1.5x the GPU
    preset's fraction make a long fp8 prefill of Llama 3 70B (compute-bound GEMMs) markedly faster, leave a batch-1
    decode (weight-bound) and the ideal columns alone, and do not touch bf16 weights."""
    spec = load_model("llama3-70b")
    fast = EngineKernels(gemm_efficiency_by_gpu={"h200": {"fp8_e4m3": 1.5 * load_gpu("h200").latency.gemm_efficiency[
        "fp8"]}})

    def run(weights: str, kernels: EngineKernels):  # noqa: ANN202 - LatencyEstimate
        d = deployment(spec, load_gpu("h200"), parse_weight_precision(weights), KV, engine_kernels=kernels)
        return estimate_latency(d, 1, 8192, 64)

    base, quick = run("fp8", EngineKernels()), run("fp8", fast)
    assert 0.67 < quick.ttft_s / base.ttft_s < 0.85  # GEMMs most of the prefill, the rest (attention) unchanged
    assert quick.tpot_s == pytest.approx(base.tpot_s, rel=0.01)
    assert quick.ttft_s_ideal == base.ttft_s_ideal and quick.tpot_s_ideal == base.tpot_s_ideal
    assert run("bf16", fast).ttft_s == run("bf16", EngineKernels()).ttft_s


def test_fp8_input_scale_follows_the_checkpoint_or_the_engines_online_quantisation() -> None:
    """auto: a checkpoint's own per-tensor fp8 takes its declared scheme (undeclared: static); fp8 of a 16-bit
    checkpoint is the engine's online quantisation (vLLM, SGLang: dynamic; TensorRT-LLM serves calibrated
    checkpoints: static); an explicit choice wins; anything else is refused."""
    llama, fp8 = load_model("llama3-70b"), parse_weight_precision("fp8")
    vllm, sglang, trtllm = (load_engine(e).kernels for e in ("vllm", "sglang", "trtllm"))
    assert [fp8_input_scale(llama, fp8, "mlp", k) for k in (vllm, sglang, trtllm)] == ["dynamic", "dynamic", "static"]
    shipped = replace(llama, native_dtype="fp8")
    assert fp8_input_scale(shipped, fp8, "mlp", vllm) == "static"
    assert fp8_input_scale(replace(shipped, checkpoint_activation_scale="dynamic"), fp8, "mlp", trtllm) == "dynamic"
    assert fp8_input_scale(llama, fp8, "mlp", vllm, "static") == "static"
    with pytest.raises(UsageError, match="unknown fp8 input scaling 'sometimes'"):
        deployment(llama, load_gpu("h100-sxm"), fp8, KV, tp=8, fp8_scales="sometimes")


def test_dynamic_fp8_scales_cost_a_reduction_per_linear_by_hand() -> None:
    """Llama 3 70B fp8 at tp 8, batch 1, TensorRT-LLM on an H100: dynamic scales add to each of 4 linears x 80
    layers of a decode step its 7.4 us reduction (+ a few bytes), and to the O and down projections the cast that
    attention and SwiGLU fuse under static scales (an elementwise kernel at its floor: a dynamic scale is known
    only after the reduction; the QKV and gate/up projections cast their input themselves either way); bf16
    weights and the ideal columns do not move."""
    llama, trtllm = load_model("llama3-70b"), load_engine("trtllm").kernels

    def run(weights: str, scales: str):  # noqa: ANN202 - (Deployment, LatencyEstimate)
        d = deployment(llama, load_gpu("h100-sxm"), parse_weight_precision(weights), KV, tp=8,
                       engine_kernels=trtllm, fp8_scales=scales)
        return d, estimate_latency(d, 1, 2048, 256)

    d, dynamic = run("fp8", "dynamic")
    cast = kernels.elementwise(d.rates_decode, 8192 * 3).seconds  # [1 x K] bf16 in, fp8 out: the floor
    assert dynamic.tpot_s - run("fp8", "static")[1].tpot_s == pytest.approx(80 * (4 * 7.4e-6 + 2 * cast), rel=0.03)
    assert dynamic.tpot_s_ideal == run("fp8", "static")[1].tpot_s_ideal
    assert run("bf16", "dynamic")[1].tpot_s == run("bf16", "static")[1].tpot_s


def test_an_unfused_input_cast_is_a_kernel_after_the_norm_only() -> None:
    """TensorRT-LLM's RMSNorm quantises NVFP4 only: a static per-tensor fp8 QKV and gate/up projection casts its own
    input (one elementwise kernel each, [M x 8192] bf16 in, fp8 out), while attention and SwiGLU write the O and
    down projections' inputs in fp8. Llama 3 70B at tp 8 on an H100: per decode step at batch 1, 2 x 80 casts at
    their floor against the same engine with every cast fused; at a 2,048-token prefill, each cast's bytes."""
    llama, gpu, trtllm = load_model("llama3-70b"), load_gpu("h100-sxm"), load_engine("trtllm").kernels
    assert [trtllm.fuses_input_quant("fp8_e4m3", at) for at in ("norm", "attention", "activation")] == \
        [False, True, True]
    assert trtllm.fuses_input_quant("nvfp4", "norm") and trtllm.fuses_input_quant("fp8_block", "norm")
    fused = replace(trtllm, unfused_activation_quant={})

    def run(engine: EngineKernels):  # noqa: ANN202 - (Deployment, LatencyEstimate)
        d = deployment(llama, gpu, parse_weight_precision("fp8"), KV, tp=8, engine_kernels=engine,
                       fp8_scales="static")
        return d, estimate_latency(d, 1, 2048, 256)

    d, unfused = run(trtllm)
    both = run(fused)[1]
    decode_cast = kernels.elementwise(d.rates_decode, 8192 * 3).seconds
    assert unfused.tpot_s - both.tpot_s == pytest.approx(2 * 80 * decode_cast, rel=0.02)
    prefill_cast = kernels.elementwise(d.rates_prefill, 2048 * 8192 * 3).seconds
    assert unfused.ttft_s - both.ttft_s == pytest.approx(2 * 80 * prefill_cast, rel=0.02)
    assert unfused.tpot_s_ideal == both.tpot_s_ideal


def test_fp8_pure_roofline_prices_attention_at_the_16bit_peak() -> None:
    # Flash attention runs in bf16 (FA3 in vLLM) while the fp8 GEMMs run at the fp8 peak: the attention FLOPs,
    # counted by hand, at the bf16 peak.
    d = _d("llama3.2-1b", "h200", "fp8")
    e = estimate_latency(d, 8, 4096, 64)
    attention_flops = 8 * 16 * (4096 * 4097 / 2) * 4 * 32 * 64
    ttft, tpot = _pure_roofline(d, 8, 4096, 64, attention_flops)
    assert e.ttft_s_ideal == pytest.approx(ttft, rel=2e-3)
    assert e.tpot_s_ideal == pytest.approx(tpot, rel=2e-3)


def test_ideal_is_faster_than_expected_and_floors_dominate_small_models() -> None:
    d = _d("llama3.2-1b", "h200")
    e = estimate_latency(d, 1, 128, 128)
    assert e.tpot_s > 1.3 * e.tpot_s_ideal  # 1B model at batch 1: ~130 kernels of a few us each
    floors = sum(g.floor_seconds for g in e.decode.step.groups.values())
    assert floors > 0.25 * e.tpot_s


def test_the_most_layers_cost_one_layer_each() -> None:
    # layers of one kind are priced once and multiplied: the time is affine in the layer count (up to the spec's
    # limit on num_layers, issue 11)
    base = load_model("llama3-8b")
    most = INT_LIMITS["num_layers"][1]
    shape = StepShape(decode_seqs=4, decode_context=2048)

    def t(layers: int) -> float:
        spec = base.with_overrides(layers=layers)
        return step_time(deployment(spec, load_gpu("h100-sxm"), BF16, KV), shape).seconds

    one, two, many = t(1), t(2), t(most)
    assert many == pytest.approx(one + (most - 1) * (two - one), rel=1e-9)


def test_pipeline_microbatches_by_hand() -> None:
    d = _d("llama3-70b", "h100-sxm", "bf16", tp=4, pp=2)
    e1 = estimate_latency(d, 1, 2048, 128)
    step = e1.decode.step
    assert len(step.stage_seconds) == 2 and e1.decode.microbatches == 1
    assert e1.tpot_s == pytest.approx(sum(step.stage_seconds) + step.p2p_seconds)
    assert e1.decode.bubble_fraction == pytest.approx(0.5, abs=0.02)  # one microbatch: each stage idles half
    e8 = estimate_latency(d, 8, 2048, 128)
    s8 = e8.decode.step  # 2 microbatches of 4
    assert e8.decode.microbatches == 2
    assert e8.tpot_s == pytest.approx(max(sum(s8.stage_seconds) + s8.p2p_seconds, 2 * max(s8.stage_seconds)))
    p8 = e8.prefill.step
    assert e8.ttft_s == pytest.approx(sum(p8.stage_seconds) + p8.p2p_seconds + max(p8.stage_seconds))


def test_expert_parallel_over_attention_replicas() -> None:
    d = _d("deepseek-v3", "h200", tp=1, ep=8)
    assert (d.dp, d.num_gpus, d.dims.experts_local, d.dims.expert_width) == (8, 8, 32, 2048)
    e = estimate_latency(d, 64, 1024, 128)
    step = e.decode.step  # each replica decodes 8 sequences; the experts see all 64 tokens
    assert step.tp_comm_seconds == 0 and step.ep_comm_seconds > 0
    tp8 = estimate_latency(_d("deepseek-v3", "h200", tp=8), 64, 1024, 128)
    assert tp8.decode.step.ep_comm_seconds == 0 and tp8.decode.step.tp_comm_seconds > 0


def test_wide_expert_parallelism_fabrics_by_hand() -> None:
    """ep beyond a node: the all-to-all crosses InfiniBand on HGX H100s (8 GPUs per NVLink domain) but stays on
    NVLink across a GB200 NVL72's 72. A decode step sends each token's top-k copies (DeepEP's low-latency kernels; fp8
    for fp8 experts, bf16 back), a prefill step one copy per other node its experts reach and per GPU of a node (its
    normal kernels; under DeepSeek-V3's group-limited routing)."""
    from tfcalc.calc import comm
    from tfcalc.calc.latency import FP8_DISPATCH_BYTES

    h100, gb200 = _d("deepseek-v3", "h100-sxm", tp=1, ep=32), _d("deepseek-v3", "gb200", tp=1, ep=64)
    assert (h100.nvlink_domain, gb200.nvlink_domain) == (8, 72)
    assert h100.fabric(32) is h100.inter and h100.fabric(8) is h100.intra and gb200.fabric(64) is gb200.intra
    moe_layers = 61 - 3
    intra, inter = h100.intra.expert_link, h100.inter.expert_link
    copies = 128 * 8 * 7168
    decode = step_time(h100, StepShape(decode_seqs=128, decode_context=2048))
    one_layer = sum(comm.expert_all_to_all(copies * b, 32, 8, intra, inter).seconds for b in (FP8_DISPATCH_BYTES, 2))
    assert decode.ep_comm_seconds == pytest.approx(moe_layers * one_layer)
    prefill = step_time(h100, StepShape(prefill_seqs=1, prefill_tokens=4096))
    nodes = comm.remote_domains_touched(256, 8, 4, 8, 4)  # its experts among the top 4 of 8 groups
    assert 2.1 < nodes < 2.3  # of 6 remote copies (8 x 24 / 32) per token
    ranks = comm.remote_domains_touched(256, 8, 32, 8, 4) * 32 / 31   # and one copy per rank over NVLink
    assert 6.5 < ranks < 6.7  # of 8 (group-limited: 7.27 without)
    one_layer = sum(comm.expert_all_to_all(4096 * ranks * 7168 * b, 32, 8, intra, inter,
                                           network_bytes=4096 * nodes * 7168 * b).seconds
                    for b in (FP8_DISPATCH_BYTES, 2))
    assert prefill.ep_comm_seconds == pytest.approx(moe_layers * one_layer)
    nvl = step_time(gb200, StepShape(decode_seqs=128, decode_context=2048))
    link = gb200.intra.expert_link
    assert nvl.ep_comm_seconds == pytest.approx(moe_layers * sum(
        comm.expert_all_to_all(copies * b, 64, 72, link, link).seconds for b in (FP8_DISPATCH_BYTES, 2)))


def test_vllm_data_parallel_ranks_gather_every_token_by_hand() -> None:
    """vLLM's default expert-parallel backend within a node (allgather_reducescatter): each MoE layer all-gathers
    every rank's tokens and router logits over the dp ranks and reduce-scatters the results (NCCL's ring, the same
    cost), and each rank's experts run every gathered token; SGLang (DeepEP) sends the top-k copies instead."""
    from tfcalc.calc import comm

    vllm = _d("deepseek-v3", "h200", tp=1, ep=8, engine_kernels=load_engine("vllm").kernels)
    sglang = _d("deepseek-v3", "h200", tp=1, ep=8, engine_kernels=load_engine("sglang").kernels)
    assert vllm.kernels.ep_dispatch == "allgather" and sglang.kernels.ep_dispatch == "all_to_all"
    link, tokens = vllm.intra.nccl, 16 * 8
    step = step_time(vllm, StepShape(decode_seqs=16, decode_context=2048))
    per_layer = (comm.all_gather(tokens * (7168 + 256) * 2, 8, link).seconds
                 + comm.all_gather(tokens * 7168 * 2, 8, link).seconds)
    assert step.ep_comm_seconds == pytest.approx(58 * per_layer)
    beyond = _d("deepseek-v3", "h200", tp=1, ep=16, engine_kernels=load_engine("vllm").kernels)
    copies = 16 * 8 * 7168   # across nodes the plans launch DeepEP: the top-k copies again
    one = sum(comm.expert_all_to_all(copies * b, 16, 8, beyond.intra.expert_link, beyond.inter.expert_link).seconds
              for b in (1 + 4 / 128, 2))
    assert step_time(beyond, StepShape(decode_seqs=16, decode_context=2048)).ep_comm_seconds == pytest.approx(58 * one)


def test_tensorrt_llm_all_to_all_sends_one_copy_per_rank_by_hand() -> None:
    """TensorRT-LLM's MoE all-to-all sends a token once to each rank holding any of its experts, in every step:
    Qwen3-235B-A22B (128 experts, top 8) at ep 8 reaches 8 (1 - C(112, 8) / C(128, 8)) = 5.34 ranks, not 8 copies;
    DeepEP's low-latency decode (SGLang) sends the 8."""
    from tfcalc.calc import comm

    trtllm = _d("qwen3-235b-a22b", "h200", tp=1, ep=8, engine_kernels=load_engine("trtllm").kernels)
    sglang = _d("qwen3-235b-a22b", "h200", tp=1, ep=8, engine_kernels=load_engine("sglang").kernels)
    assert trtllm.kernels.ep_dispatch == "per_rank"
    ranks = 8 * (1 - math.comb(112, 8) / math.comb(128, 8))
    assert ranks == pytest.approx(5.339, abs=1e-3)
    link, layers = trtllm.intra.expert_link, 94
    shape = StepShape(decode_seqs=64, decode_context=2048)
    for d, copies in ((trtllm, ranks), (sglang, 8)):
        value = 1 + 4 / 128 if d.dims.experts_mode.compute == "fp8" else 2
        one = sum(comm.expert_all_to_all(64 * copies * 4096 * b, 8, 8, link, link).seconds for b in (value, 2))
        assert step_time(d, shape).ep_comm_seconds == pytest.approx(layers * one)


def test_experts_behind_deepep_run_the_engines_own_kernel_by_hand() -> None:
    """SGLang's data-parallel ranks (DeepEP) run DeepSeek-V3's experts on DeepGEMM's masked grouped GEMMs in
    decode-only steps: the routed experts' cost is kernels.moe_experts at the preset's deepep_moe entry over the
    fused MoE's rates; prefill steps, ranks without DeepEP (vLLM within a node gathers tokens) and the ideal roofline
    keep the fused MoE."""
    from tfcalc.calc.latency import _with_moe_kernel, linear_mode, rates_for

    sglang = load_engine("sglang").kernels
    gpu = load_gpu("h200")
    d = _d("deepseek-v3", "h200", weights="fp8_block", tp=1, ep=64, engine_kernels=sglang)
    assert d.deepep_moe is sglang.deepep_moe_by_gpu["h200"]
    assert _d("deepseek-v3", "h200", weights="fp8_block", tp=1, ep=8,
              engine_kernels=load_engine("vllm").kernels).deepep_moe is None
    assert _d("deepseek-v3", "h200", weights="fp8_block", tp=8, ep=8, engine_kernels=sglang).deepep_moe is None
    mode = linear_mode(get_dtype("fp8_block"), gpu)

    def experts(rates, tokens: int) -> float:  # noqa: ANN001 - one layer's routed experts, all ranks' tokens
        return kernels.moe_experts(rates, tokens=tokens, experts_local=4, experts_total=256, top_k=8, hidden=7168,
                                   expert_width=2048, gated=True, weight_bits=mode.bits, compute=mode.compute,
                                   dequant=mode.dequant, weight_format=mode.weights, replicated=False).seconds

    fused = rates_for(gpu, sglang, architecture="DeepseekV3ForCausalLM")
    deepgemm = _with_moe_kernel(fused, d.deepep_moe)
    assert deepgemm.grouped_efficiency("fp8", "", "fp8_block") == 1.2 and "fp8_block" in deepgemm.moe_fused_rows
    decode = StepShape(decode_seqs=128, decode_context=2048)  # 256 rows an expert
    assert d.captured(decode)
    base = _d("deepseek-v3", "h200", weights="fp8_block", tp=1, ep=64,
              engine_kernels=replace(sglang, deepep_moe_by_gpu={}))
    gap = step_time(base, decode).groups["moe"].seconds - step_time(d, decode).groups["moe"].seconds
    assert gap == pytest.approx(58 * (experts(fused, 128 * 64) - experts(deepgemm, 128 * 64)), rel=1e-9)
    assert gap > 0.2 * 58 * experts(fused, 128 * 64)  # compute-bound rows: DeepGEMM is the faster kernel
    prefill = StepShape(prefill_seqs=1, prefill_tokens=2048)
    assert step_time(d, prefill).seconds == step_time(base, prefill).seconds
    assert step_time(d, decode, ideal=True).seconds == step_time(base, decode, ideal=True).seconds


def test_redundant_experts_by_hand() -> None:
    """EPLB's 32 replicas of DeepSeek-V3 over ep 72: 4 experts a GPU, the tokens spread over all 288 slots, so each
    GPU's experts see what ep 64's do at the same tokens a rank (128 x 72 x 8 / 288 = 128 x 64 x 8 / 256); the
    router still scores the model's 256."""
    eplb = _d("deepseek-v3", "gb200", tp=1, ep=72, redundant_experts=32)
    plain = _d("deepseek-v3", "gb200", tp=1, ep=64)
    assert (eplb.dims.experts_local, eplb.dims.expert_slots, eplb.dims.experts) == (4, 288, 256)
    shape = StepShape(decode_seqs=128, decode_context=2048)
    moe = step_time(eplb, shape).groups["moe"].seconds
    assert moe == pytest.approx(step_time(plain, shape).groups["moe"].seconds, rel=1e-3)  # rows per slot alike


def test_mixtral_batch1_reads_two_experts() -> None:
    d = _d("mixtral-8x7b", "h100-sxm", tp=1)
    step = step_time(d, StepShape(decode_seqs=1, decode_context=1))
    attention = 4096 * (4096 + 2 * 1024) + 4096 * 4096
    experts = 2 * 3 * 4096 * 14336
    router = 4096 * 8
    assert step.weight_bytes == (32 * (attention + experts + router) + 32000 * 4096) * 2


def test_quantised_paths() -> None:
    h100, a100, b200 = load_gpu("h100-sxm"), load_gpu("a100-80gb"), load_gpu("b200")
    assert linear_mode(get_dtype("fp8"), h100).compute == "fp8"
    assert linear_mode(get_dtype("fp8"), a100).dequant == "fp8"  # no fp8 tensor cores on Ampere
    assert linear_mode(get_dtype("nvfp4"), b200).compute == "fp4"
    assert linear_mode(get_dtype("nvfp4"), h100).dequant == "fp4"
    assert linear_mode(get_dtype("int8"), h100).dequant == "int8"
    assert linear_mode(get_dtype("int4-g32"), h100).dequant == "int4"
    assert linear_mode(get_dtype("int8"), h100, "int8").compute == "int8"
    # fp8 W8A8 prefill beats bf16 (fp8 tensor cores) but by less than 2x; int4 decode beats bf16 by less than 4x
    bf16 = estimate_latency(_d("llama3-8b", "h100-sxm", "bf16"), 1, 4096, 64)
    fp8 = estimate_latency(_d("llama3-8b", "h100-sxm", "fp8"), 1, 4096, 64)
    int4 = estimate_latency(_d("llama3-8b", "h100-sxm", "int4"), 1, 4096, 64)
    assert bf16.ttft_s / 2 < fp8.ttft_s < 0.85 * bf16.ttft_s
    assert bf16.tpot_s / 4 < int4.tpot_s < bf16.tpot_s / 2
    lm_head = 128256 * 4096 * 2  # an int4 checkpoint keeps lm_head in bf16 (issue 8: as quantized checkpoints ship)
    assert int4.decode.step.weight_bytes - lm_head < 0.3 * (bf16.decode.step.weight_bytes - lm_head)


def test_an_engine_may_run_a_native_format_weight_only() -> None:
    """``weight_only`` names the kinds an engine's kernel keeps 16-bit activations for although the chip has tensor
    cores for them: MXFP4 on a B200 then runs as bf16 MMA with the weights unpacked (as on Hopper)."""
    b200, h200 = load_gpu("b200"), load_gpu("h200")
    native = linear_mode(get_dtype("mxfp4"), b200)
    assert (native.compute, native.dequant, native.quantised_input) == ("fp4", "", True)
    weight_only = linear_mode(get_dtype("mxfp4"), b200, weight_only=frozenset({"fp4"}))
    assert (weight_only.compute, weight_only.dequant, weight_only.quantised_input) == ("bf16", "fp4", False)
    assert weight_only.bits == native.bits  # the same 4.25 bits streamed either way
    assert linear_mode(get_dtype("mxfp4"), h200, weight_only=frozenset({"fp4"})) == linear_mode(get_dtype("mxfp4"),
                                                                                                h200)
    assert linear_mode(get_dtype("fp8"), b200, weight_only=frozenset({"fp4"})).compute == "fp8"  # other kinds stay


def test_sglang_prices_each_architecture_with_its_moe_runner_on_b200() -> None:
    """SGLang's B200 MoE runner depends on the architecture: Mixtral (Triton) prefills slower than the same
    model declared a Qwen3-MoE (FlashInfer TRT-LLM); on an H200 the declaration changes nothing; the deployment
    takes the spec's architecture."""
    sglang = load_engine("sglang").kernels
    spec = load_model("mixtral-8x7b")

    def ttft(architecture: str | None, gpu: str = "b200") -> float:
        d = deployment(replace(spec, architecture=architecture), load_gpu(gpu), BF16, KV, engine_kernels=sglang)
        return estimate_latency(d, 8, 2048, 64).ttft_s

    assert ttft("MixtralForCausalLM") > 1.5 * ttft("Qwen3MoeForCausalLM")
    assert ttft("MixtralForCausalLM") == ttft(None)  # unknown: the engine's default runner
    assert ttft("MixtralForCausalLM", "h200") == ttft("Qwen3MoeForCausalLM", "h200")


def test_an_engine_running_mxfp4_experts_weight_only_on_b200() -> None:
    """An engine whose MXFP4 experts keep bf16 activations on Blackwell (moe_weight_only, vLLM's code default) runs
    them as bf16 MMA with unpacking; only the experts change, and a compute-bound prefill is slower for it. The
    shipped presets price the fp4 path (SGLang's and TensorRT-LLM's MXFP8 activations, vLLM's measured runs)."""
    vllm = load_engine("vllm").kernels
    bf16_acts = replace(vllm, moe_weight_only_by_gpu={"b200": frozenset({"fp4"})})

    def experts(kernels: EngineKernels, gpu: str = "b200"):  # noqa: ANN202 - _Dims
        return _d("gpt-oss-120b", gpu, engine_kernels=kernels).dims

    dims = experts(bf16_acts)
    assert (dims.experts_mode.compute, dims.experts_mode.dequant) == ("bf16", "fp4")
    assert dims.attn == experts(vllm).attn
    for engine in ("vllm", "sglang", "trtllm"):
        assert experts(load_engine(engine).kernels).experts_mode.compute == "fp4"
    assert experts(bf16_acts, "h200").experts_mode == experts(vllm, "h200").experts_mode  # Hopper: no fp4 cores
    slow = estimate_latency(_d("gpt-oss-120b", "b200", engine_kernels=bf16_acts), 8, 2048, 64)
    fast = estimate_latency(_d("gpt-oss-120b", "b200", engine_kernels=vllm), 8, 2048, 64)
    assert slow.ttft_s > 1.5 * fast.ttft_s


def test_vllm_runs_kimi_k3_mxfp4_experts_on_marlin_sglang_on_fp4_cores() -> None:
    """Kimi K3's MXFP4 experts (compressed-tensors without input_activations, SiTU activation) on a B300: vLLM's
    compressed-tensors MXFP4 MoE has no CUTLASS kernel for SiTU and falls to Marlin (weight-only: bf16 MMA, the
    weights unpacked; its own rate and floor; every token's rows touched under ep), SGLang quantises the inputs to
    MXFP8 (the fp4 path); attention and shared experts stay bf16 (the checkpoint ignores them). Another MXFP4 model
    (gpt-oss) keeps vLLM's default kernel, and a long prefill, compute-bound, is slower on Marlin."""
    from tfcalc.spec.hf_config import load_hf_config

    spec = load_hf_config(Path(__file__).parents[1] / "fixtures" / "hf_configs" / "kimi-k3.json", name="kimi-k3")
    # the experts' kernels alone: the bf16 latent projections, alike on both engines, priced in the experts' format
    spec = replace(spec, moe=replace(spec.moe, latent_16_bit=False))
    b300, precision = load_gpu("b300"), parse_weight_precision("experts=mxfp4,default=bf16")

    def dep(engine: str):  # noqa: ANN202 - Deployment
        return deployment(spec, b300, precision, KV, tp=8, engine_kernels=load_engine(engine).kernels)

    vllm, sglang = dep("vllm"), dep("sglang")
    assert (vllm.dims.experts_mode.compute, vllm.dims.experts_mode.dequant) == ("bf16", "fp4")
    assert (sglang.dims.experts_mode.compute, sglang.dims.experts_mode.dequant) == ("fp4", "")
    assert vllm.dims.attn.compute == vllm.dims.shared.compute == "bf16"
    rates = vllm.rates_prefill
    assert rates.grouped_efficiency("bf16", "fp4", "mxfp4") == 0.19
    assert rates.moe_format_floors["mxfp4"] == pytest.approx(55.7e-6) and "mxfp4" in rates.moe_ep_every_row
    assert "mxfp4" not in sglang.rates_prefill.moe_ep_every_row
    assert _d("gpt-oss-120b", "b300", engine_kernels=load_engine("vllm").kernels).dims.experts_mode.compute == "fp4"
    marlin, fp4 = (estimate_latency(d, 4, 8192, 2).prefill.step for d in (vllm, sglang))
    assert marlin.groups["moe"].seconds > 3 * fp4.groups["moe"].seconds


def test_engine_block_floor_for_mla() -> None:
    vllm = _d("deepseek-v3", "h200", tp=8, engine_kernels=load_engine("vllm").kernels)
    trt = _d("deepseek-v3", "h200", tp=8, engine_kernels=load_engine("trtllm").kernels)
    shape = StepShape(decode_seqs=1, decode_context=1024)
    per_layer = step_time(vllm, shape).groups["attention"].seconds / 61
    assert per_layer > 79e-6  # the measured fixed cost of vLLM's MLA block, plus its weights
    assert step_time(trt, shape).groups["attention"].seconds < step_time(vllm, shape).groups["attention"].seconds


def test_uncaptured_linears_last_their_host_time() -> None:
    """A block-fp8 linear outside the CUDA graphs lasts max(its kernels, its host path): Qwen3-235B at tp 4 on an
    H200, batch 1, has qkv and o projections per layer (94 layers) under vLLM's 59 us host time at <= 17 tokens, and
    the MoE router stays bf16; MLA projections run inside their attention block, so DeepSeek-V3's attention keeps
    its time while its shared experts pay."""
    vllm = load_engine("vllm").kernels
    shape = StepShape(decode_seqs=1, decode_context=2048)
    uncaptured = replace(vllm, uncaptured_linears=frozenset({"fp8_block"}))
    base = _d("qwen3-235b-a22b", "h200", "fp8_block", tp=4, engine_kernels=vllm)
    eager = _d("qwen3-235b-a22b", "h200", "fp8_block", tp=4, engine_kernels=uncaptured)
    before, after = step_time(base, shape).groups["attention"], step_time(eager, shape).groups["attention"]
    assert after.seconds == pytest.approx(before.seconds + 94 * 2 * 59e-6, rel=0.1)
    assert after.seconds >= 94 * 2 * 59e-6
    assert step_time(eager, shape).groups["moe"].seconds == pytest.approx(step_time(base, shape).groups["moe"].seconds)
    big = StepShape(prefill_seqs=1, prefill_tokens=8192)  # GPU-bound linears: no host time left to add
    assert step_time(eager, big).groups["attention"].seconds == pytest.approx(
        step_time(base, big).groups["attention"].seconds, rel=1e-3)
    inline = replace(vllm, shared_experts_stream_max_tokens=0)  # shared experts in line with the routed ones
    engines = {"base": inline, "eager": replace(inline, uncaptured_linears=frozenset({"fp8_block"})),
               "beside": vllm, "beside eager": uncaptured}
    ds = {k: step_time(_d("deepseek-v3", "h200", tp=8, engine_kernels=e), shape) for k, e in engines.items()}
    assert ds["eager"].groups["attention"].seconds == pytest.approx(ds["base"].groups["attention"].seconds)
    paid = ds["eager"].groups["moe"].seconds - ds["base"].groups["moe"].seconds
    assert paid > 58 * 2 * 40e-6  # 2 shared linears
    # on vLLM's second stream the routed experts hide part of that host time
    assert 0 < ds["beside eager"].groups["moe"].seconds - ds["beside"].groups["moe"].seconds < paid


def test_steps_outside_the_cuda_graphs_pay_the_host_launches() -> None:
    """A step the engine does not replay from a graph costs what the same step costs with graphs off: steps with
    prefill tokens where graphs take decode batches only (TensorRT-LLM, SGLang), steps above the largest captured
    size (SGLang's cuda_graph_max_bs 256 below tp 4 on an H100, vLLM's 512); the rest keep the graph price."""
    llama = load_model("llama3.1-8b")
    kv = default_kv_dtype(llama)

    def pair(engine: str) -> tuple:  # noqa: ANN202 - (graphs as the engine runs them, every step eager)
        k = load_engine(engine).kernels
        return tuple(deployment(llama, load_gpu("h100-sxm"), parse_weight_precision("bf16"), kv, engine_kernels=k,
                                cuda_graphs=g) for g in (None, False))

    mixed = StepShape(decode_seqs=8, decode_context=1024, prefill_seqs=1, prefill_tokens=128)
    decode = StepShape(decode_seqs=8, decode_context=1024)
    for engine in ("trtllm", "sglang"):
        graphs, eager = pair(engine)
        assert not graphs.captured(mixed) and graphs.captured(decode)
        assert step_time(graphs, mixed).seconds == pytest.approx(step_time(eager, mixed).seconds)
        assert step_time(graphs, decode).seconds < step_time(eager, decode).seconds  # ~8 us per short kernel
    vllm, vllm_eager = pair("vllm")
    assert vllm.captured(mixed) and step_time(vllm, mixed).seconds < step_time(vllm_eager, mixed).seconds
    sglang, _ = pair("sglang")
    assert (sglang.graph_cap_tokens, vllm.graph_cap_tokens) == (256, 512)
    assert sglang.captured(StepShape(decode_seqs=256, decode_context=1024))
    assert not sglang.captured(StepShape(decode_seqs=257, decode_context=1024))
    assert vllm.captured(StepShape(decode_seqs=512, decode_context=1024))
    assert not vllm.captured(StepShape(decode_seqs=300, decode_context=1024, prefill_seqs=1, prefill_tokens=300))
    # above the cap the step jumps by the launches of its short kernels, and only by them: its GEMMs hide theirs
    below, above = (step_time(sglang, StepShape(decode_seqs=b, decode_context=1024)) for b in (256, 257))
    jump = above.seconds - below.seconds
    assert 0 < jump < above.groups["attention"].kernels * 8e-6 + above.groups["dense_ffn"].kernels * 8e-6
    big = StepShape(prefill_seqs=1, prefill_tokens=8192)  # long kernels hide every launch
    trt, _ = pair("trtllm")
    assert step_time(trt, big).seconds == pytest.approx(
        step_time(replace(trt, kernels=replace(trt.kernels, graph_prefill=True)), big).seconds, rel=1e-3)


def test_nccl_engines_pay_more_for_small_all_reduces() -> None:
    from tfcalc.spec.interconnect import load_interconnect

    shape = StepShape(decode_seqs=1, decode_context=1024)
    kernel_only = replace(load_interconnect("nvlink4"), forward_sync_s_per_peer=0.0)  # the kernels, without the ranks
    vllm = step_time(_d("llama3-70b", tp=8, engine_kernels=load_engine("vllm").kernels, interconnect=kernel_only),
                     shape)
    nccl = step_time(_d("llama3-70b", tp=8, engine_kernels=EngineKernels(custom_allreduce=False),
                        interconnect=kernel_only), shape)
    assert nccl.tp_comm_seconds > 2 * vllm.tp_comm_seconds  # NCCL ring ~17 us vs custom ~5 us per call


def test_each_engine_runs_its_own_all_reduce_kernel() -> None:
    """Llama 3 70B at tp 8 (hidden 8192, two all-reduces a layer): 16 tokens are 256 KiB, vLLM's two-shot size on
    8 GPUs, while TensorRT-LLM stays one-shot up to 128 tokens; each call priced as comm.custom_all_reduce."""
    from tfcalc.calc import comm
    from tfcalc.spec.interconnect import load_interconnect

    fabric = load_interconnect("nvlink4")
    assert fabric.custom_allreduce is not None
    shape = StepShape(decode_seqs=16, decode_context=1024)
    size, calls = 16 * 8192 * 2, 2 * 80 + 1   # two a layer and the embedding's; the logits gather is NCCL's in both
    vllm = step_time(_d("llama3-70b", tp=8, engine_kernels=load_engine("vllm").kernels), shape)
    trt = step_time(_d("llama3-70b", tp=8, engine_kernels=load_engine("trtllm").kernels), shape)
    two = comm.custom_all_reduce(size, 8, fabric.custom_allreduce, one_shot=False).seconds
    one = comm.custom_all_reduce(size, 8, replace(fabric.custom_allreduce, launch_s=3.0e-6), one_shot=True).seconds
    assert trt.tp_comm_seconds - vllm.tp_comm_seconds == pytest.approx(calls * (one - two))
    assert one > two   # reading 7 peers' whole buffers costs more than the two-shot's second stage here


def test_every_all_reduce_of_a_forward_pays_the_fabrics_sync_per_peer() -> None:
    """Llama 3 70B decode: each of the step's all-reduces (two a layer and the embedding's) costs the fabric's
    forward_sync_us_per_peer x (tp - 1) more than the kernel alone; the pure roofline and tp 1 pay nothing."""
    from tfcalc.spec.interconnect import load_interconnect

    fabric = load_interconnect("nvlink4")
    assert fabric.forward_sync_s_per_peer > 0
    shape = StepShape(decode_seqs=4, decode_context=1024)
    calls = 2 * 80 + 1
    for tp in (2, 8):
        synced = step_time(_d("llama3-70b", tp=tp, interconnect=fabric), shape)
        bare = step_time(_d("llama3-70b", tp=tp, interconnect=replace(fabric, forward_sync_s_per_peer=0.0)), shape)
        assert synced.tp_comm_seconds - bare.tp_comm_seconds == pytest.approx(
            calls * (tp - 1) * fabric.forward_sync_s_per_peer)
        assert synced.seconds - bare.seconds == pytest.approx(calls * (tp - 1) * fabric.forward_sync_s_per_peer)
        with_sync = estimate_latency(_d("llama3-70b", tp=tp, interconnect=fabric), 4, 1024, 8)
        without = estimate_latency(_d("llama3-70b", tp=tp, interconnect=replace(fabric, forward_sync_s_per_peer=0.0)),
                                   4, 1024, 8)
        assert with_sync.tpot_s_ideal == without.tpot_s_ideal and with_sync.tpot_s > without.tpot_s
    assert step_time(_d("llama3-70b", tp=1, interconnect=fabric), shape).tp_comm_seconds == 0


def test_mixed_step_for_a_scheduler() -> None:
    d = _d("llama3-8b", "h100-sxm")
    decode = StepShape(decode_seqs=32, decode_context=2000)
    chunk = StepShape(prefill_seqs=1, prefill_tokens=512, prefill_past=1024)
    both = StepShape(decode_seqs=32, decode_context=2000, prefill_seqs=1, prefill_tokens=512, prefill_past=1024)
    t_decode, t_chunk, t_both = (step_time(d, s).seconds for s in (decode, chunk, both))
    assert max(t_decode, t_chunk) < t_both < t_decode + t_chunk  # weights are read once for both



def test_step_seconds_is_step_time_on_the_grid_and_vectorises() -> None:
    d = _d("llama3-8b", "h100-sxm")
    exact = step_time(d, StepShape(decode_seqs=32, decode_context=2048, prefill_seqs=1, prefill_tokens=512,
                                   prefill_past=1024)).seconds
    assert step_seconds(d, 32, 2048, 512, 1024) == pytest.approx(exact, rel=1e-12)  # 2048, 1024: grid points
    assert step_seconds(d, 0, 0, 0) == 0.0
    lo, hi = (step_time(d, StepShape(decode_seqs=b, decode_context=2048)).seconds for b in (7, 8))
    assert step_seconds(d, 7.25, 2048) == pytest.approx(0.75 * lo + 0.25 * hi, rel=1e-12)  # a mean batch
    many = step_seconds(d, [1, 7.25, 64], [100.0, 2048, 5000], 256)
    assert many == [step_seconds(d, b, c, 256) for b, c in ((1, 100.0), (7.25, 2048), (64, 5000))]
    with pytest.raises(UsageError, match="different lengths"):
        step_seconds(d, [1, 2], [100, 200, 300])


def test_step_seconds_has_no_flat_spots_at_rounded_grid_points() -> None:
    """Contexts just past a rounded grid point (1009 for 64 x 2^(32/8) = 1009.4) interpolate in the next interval:
    the step time keeps growing with the context (it once stood still there)."""
    d = _d("llama3-8b", "h100-sxm")
    values = [step_seconds(d, 16, 1000 + 0.05 * i) for i in range(400)]
    assert all(b > a for a, b in zip(values, values[1:], strict=False))


def test_serving_step_seconds_several_chunks_and_pipelines() -> None:
    """A step of several short prompts is step_time with prefill_seqs > 1; pp = 1 is step_seconds; with pp stages
    the step is estimate's decode phase: pp batches of 1/pp in flight, max(trip, pp x slowest stage)."""
    d = _d("llama3-8b", "h100-sxm")
    assert serving_step_seconds(d, 32, 2048, 512, 1024) == step_seconds(d, 32, 2048, 512, 1024)
    three = step_time(d, StepShape(decode_seqs=16, decode_context=2048, prefill_seqs=3, prefill_tokens=300)).seconds
    assert serving_step_seconds(d, 16, 2048, 300, 0, prefill_seqs=3) == pytest.approx(three, rel=1e-12)
    assert serving_step_seconds(d, 16, 2048, 300, 0, prefill_seqs=3) > serving_step_seconds(d, 16, 2048, 300, 0)
    p2 = _d("llama3-70b", "h100-sxm", "bf16", tp=4, pp=2)
    for batch in (2, 8, 64):
        assert serving_step_seconds(p2, batch, 2048) == pytest.approx(
            estimate_latency(p2, batch, 2048 - 64, 128).tpot_s, rel=1e-9)  # decode context 2048 on the grid
    one = step_time(p2, StepShape(decode_seqs=4, decode_context=2048, prefill_seqs=1, prefill_tokens=256))
    assert serving_step_seconds(p2, 8, 2048, 512) == pytest.approx(
        max(one.seconds, 2 * max(one.stage_seconds)), rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["llama3-8b", "gemma2-9b", "mixtral-8x7b", "deepseek-v3"]), st.integers(1, 256),
       st.floats(1, 100_000), st.sampled_from([0, 512, 2048]), st.integers(0, 20_000))
def test_step_seconds_interpolates_within_half_a_percent(name: str, batch: int, context: float, chunk: int,
                                                         past: int) -> None:
    d = _d(name, "h200", "bf16", tp=2)
    shape = StepShape(decode_seqs=batch, decode_context=context, prefill_seqs=1 if chunk else 0,
                      prefill_tokens=chunk, prefill_past=past if chunk else 0)
    assert step_seconds(d, batch, context, chunk, past) == pytest.approx(step_time(d, shape).seconds, rel=5e-3)


def test_turning_point() -> None:
    d = _d("llama3.2-1b", "h100-sxm")
    b = turning_point_batch(d, 16)
    assert b is not None and b > 1
    ideal = step_time(d, StepShape(decode_seqs=b, decode_context=16), ideal=True)
    below = step_time(d, StepShape(decode_seqs=b - 1, decode_context=16), ideal=True)
    assert ideal.bound == "compute" and below.bound == "memory"


TP_MODELS = {"llama3-8b": (1, 2, 4, 8), "qwen2.5-7b": (1, 2, 4), "mixtral-8x7b": (1, 2, 4, 8),
             "deepseek-v3": (1, 2, 4, 8)}


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(TP_MODELS)), st.integers(1, 64), st.integers(1, 32_000), st.booleans())
def test_more_gpus_never_slower_in_ideal_mode_without_communication(name: str, batch: int, context: int,
                                                                     prefill: bool) -> None:
    shape = (StepShape(prefill_seqs=1, prefill_tokens=min(context, 4096)) if prefill
             else StepShape(decode_seqs=batch, decode_context=context))
    times = []
    for tp in TP_MODELS[name]:
        step = step_time(_d(name, "h200", "bf16", tp=tp), shape, ideal=True)
        times.append(max(step.ideal_compute_seconds, step.ideal_memory_seconds))
    assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:], strict=False))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["llama3-8b", "gemma2-9b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-20b"]),
       st.integers(1, 64), st.integers(1, 100_000), st.integers(1, 20_000), st.sampled_from([1, 2]))
def test_latency_monotone_in_context(name: str, batch: int, context: int, more: int, tp: int) -> None:
    d = _d(name, "h200", "bf16", tp=tp)
    decode = [step_time(d, StepShape(decode_seqs=batch, decode_context=c)).seconds for c in (context,
                                                                                                context + more)]
    assert decode[1] >= decode[0]
    short, long = min(context, 8192), min(context + more, 8192 + more)
    prefill = [step_time(d, StepShape(prefill_seqs=1, prefill_tokens=n), "prefill").seconds for n in (short, long)]
    assert prefill[1] >= prefill[0]


def test_a_part_of_the_same_silicon_takes_the_engines_kernel_entries() -> None:
    """SGLang's fused-MoE entries were measured on an H100 SXM; the H100 PCIe (same GH100 die) takes them through
    its preset's latency.kernels_as, while a part the engine measured keeps its own."""
    from tfcalc.calc.latency import engine_kernels_gpu, rates_for

    sglang = load_engine("sglang").kernels
    sxm, pcie, h200 = (rates_for(load_gpu(n), sglang) for n in ("h100-sxm", "h100-pcie", "h200"))
    assert engine_kernels_gpu(load_gpu("h100-pcie"), sglang) == "h100-sxm"
    assert pcie.moe_large_m_memory == sxm.moe_large_m_memory == sglang.moe_large_m_memory_by_gpu["h100-sxm"]
    assert pcie.moe_stream_bits == sxm.moe_stream_bits == sglang.moe_stream_bits_by_gpu["h100-sxm"]
    assert pcie.moe_efficiency_by_dtype["fp4"] == sxm.moe_efficiency_by_dtype["fp4"]
    assert h200.moe_large_m_memory == sglang.moe_large_m_memory_by_gpu["h200"] != sxm.moe_large_m_memory
    assert engine_kernels_gpu(load_gpu("h100-pcie"), EngineKernels()) == "h100-pcie"  # nothing to share


def test_overlap_of_two_streams_by_hand() -> None:
    """Two kernel paths on two CUDA streams last max(t_a, t_b, w_a + w_b), w = time - fixed part: fixed costs
    (floors, host time) hide behind the other path, work shares the GPU and adds up."""
    from tfcalc.calc.latency import _Acc, _overlap, _Snapshot

    def run(a: tuple[float, float], b: tuple[float, float]) -> _Acc:
        acc = _Acc(seconds=5.0, floor_seconds=1.0, by_bound={"memory": 5.0})
        start = _Snapshot.of(acc)
        acc.seconds, acc.floor_seconds = acc.seconds + a[0], acc.floor_seconds + a[1]
        acc.by_bound = {"memory": 5.0, "floor": a[0]}
        middle = _Snapshot.of(acc)
        acc.seconds, acc.floor_seconds = acc.seconds + b[0], acc.floor_seconds + b[1]
        acc.by_bound = {"memory": 5.0 + b[0], "floor": a[0]}
        _overlap(acc, start, middle)
        return acc

    hidden = run((10.0, 8.0), (30.0, 5.0))  # the shared path's 8 of fixed time hides behind 30: max(10, 30, 27)
    assert hidden.seconds == pytest.approx(5.0 + 30.0) and hidden.floor_seconds == pytest.approx(1.0 + 30.0 - 27.0)
    assert sum(hidden.by_bound.values()) == pytest.approx(hidden.seconds)
    shared = run((10.0, 1.0), (12.0, 1.0))  # both mostly work: 9 + 11 = 20 > max(10, 12)
    assert shared.seconds == pytest.approx(5.0 + 20.0) and shared.floor_seconds == pytest.approx(1.0)
    work_only = run((10.0, 0.0), (12.0, 0.0))  # pure work gains nothing
    assert work_only.seconds == pytest.approx(27.0) and work_only.by_bound == {"memory": 17.0, "floor": 10.0}


def test_shared_experts_beside_the_routed_ones_per_engine() -> None:
    """vLLM runs DeepSeek-V3's shared experts on a second stream in steps of <= 256 tokens on CUDA GPUs,
    TensorRT-LLM in steps replayed from CUDA graphs (kernels.shared_experts_stream): the MoE group gets faster by
    at most the shared path and the step stays above the pure roofline; nothing moves above 256 tokens, in ideal
    mode, on an AMD GPU, or for a model without shared experts."""
    vllm, trtllm = load_engine("vllm").kernels, load_engine("trtllm").kernels
    kw = {"tp": 8, "routing": kernels.parse_routing("power-law:1.01")}

    def moe(name: str, gpu: str, engine: EngineKernels, shape: StepShape, ideal: bool = False) -> float:
        d = _d(name, gpu, "fp8_block" if name == "deepseek-v3" else None, engine_kernels=engine, **kw)
        return step_time(d, shape, "decode", ideal).groups["moe"].seconds

    decode, big = StepShape(decode_seqs=16, decode_context=2048), StepShape(decode_seqs=300, decode_context=2048)
    prefill = StepShape(prefill_seqs=1, prefill_tokens=128)
    for engine in (vllm, trtllm):
        none = replace(engine, shared_experts_stream_max_tokens=0, shared_experts_stream_in_graphs=False)
        beside, alone = moe("deepseek-v3", "h200", engine, decode), moe("deepseek-v3", "h200", none, decode)
        assert 0.8 * alone < beside < alone
        assert moe("deepseek-v3", "h200", engine, decode, True) == moe("deepseek-v3", "h200", none, decode, True)
        assert moe("mixtral-8x7b", "h200", engine, decode) == moe("mixtral-8x7b", "h200", none, decode)
        assert moe("deepseek-v3", "mi300x", engine, decode) == moe("deepseek-v3", "mi300x", none, decode)
    none = replace(vllm, shared_experts_stream_max_tokens=0)
    assert moe("deepseek-v3", "h200", vllm, big) == moe("deepseek-v3", "h200", none, big)  # above 256 tokens
    assert moe("deepseek-v3", "h200", vllm, prefill) < moe("deepseek-v3", "h200", none, prefill)  # eager: still
    in_graphs = replace(trtllm, shared_experts_stream_in_graphs=False)
    assert moe("deepseek-v3", "h200", trtllm, prefill) == moe("deepseek-v3", "h200", in_graphs, prefill)
    assert moe("deepseek-v3", "h200", trtllm, big) < moe("deepseek-v3", "h200", in_graphs, big)  # a graph step


def test_gated_deltanet_layers_read_their_state_not_the_context() -> None:
    """Qwen3.5-27B decode: the 16 attention layers read the context's K and V (4 KV heads x 256 x 2 x 2 B per
    token), the 48 Gated DeltaNet layers read and write each sequence's state once whatever the context; the
    recurrence's prefill FLOPs grow linearly with the prompt, not quadratically."""
    d = _d("qwen3.5-27b", "h200", "bf16")
    state = 3 * (2 * 16 * 128 + 48 * 128) * 2 + 48 * 128 * 128 * 4
    short, long = (step_time(d, StepShape(decode_seqs=4, decode_context=c)) for c in (1024, 9216))
    assert long.kv_read_bytes - short.kv_read_bytes == 4 * 8192 * 16 * 2 * 4 * 256 * 2
    assert short.kv_read_bytes == 4 * 1024 * 16 * 2 * 4 * 256 * 2 + 4 * 48 * 2 * state
    one, two = (step_time(d, StepShape(prefill_seqs=1, prefill_tokens=n)).groups["attention"].flops
                for n in (4096, 8192))
    attention_only = 4 * 24 * 256 * 16 * (8192 * 8193 / 2 - 2 * 4096 * 4097 / 2)  # 16 layers' causal QK, PV
    recurrence = 48 * 48 * (6 * 128 * 128 + 4 * 64 * 256) * 4096
    projections = 2 * 4096 * (48 * (5120 * (2 * 2048 + 2 * 6144 + 96) + 6144 * 5120)
                              + 16 * (5120 * (2 * 6144 + 2 * 1024) + 6144 * 5120))
    assert two - 2 * one == pytest.approx(attention_only, rel=1e-9)
    assert one == pytest.approx(recurrence + projections + 4 * 24 * 256 * 16 * 4096 * 4097 / 2, rel=1e-9)


def test_an_engine_keeping_states_in_the_model_dtype_reads_half_the_recurrent_state() -> None:
    """Qwen3.5-27B's checkpoint declares its recurrent state in float32 (vLLM keeps it so); TensorRT-LLM 1.0-1.2
    keeps it in the model's bf16 (``recurrent_state_rule`` "model"): a decode step reads and writes 48 layers x 48 heads
    x 128 x 128 x 2 B less per sequence, its conv state unchanged."""
    fp32, bf16 = (_d("qwen3.5-27b", "h200", "bf16", recurrent_state_rule=m) for m in ("checkpoint", "model"))
    shape = StepShape(decode_seqs=4, decode_context=1024)
    saved = step_time(fp32, shape).kv_read_bytes - step_time(bf16, shape).kv_read_bytes
    assert saved == 4 * 2 * 48 * 48 * 128 * 128 * (4 - 2)


def test_llama4_chunked_decode_reads_the_mean_keys_over_its_span() -> None:
    """A chunked layer's keys fall back to 1 at each chunk's start: a step standing for contexts lo .. hi - 1 reads
    their mean, brute-forced context by context (the KV read is linear in the keys)."""
    d = _d("llama4-scout-17b-16e", "h200", tp=4, engine_kernels=load_engine("vllm").kernels)

    def kv_read(context: float, span: float = 0.0) -> float:
        return step_time(d, StepShape(decode_seqs=8, decode_context=context, decode_span=span), "decode").kv_read_bytes

    lo, hi = 7900, 8500  # crosses the chunk boundary at 8192
    brute = sum(kv_read(c) for c in range(lo, hi)) / (hi - lo)
    assert kv_read((lo + hi) / 2, hi - lo) == pytest.approx(brute, rel=1e-4)  # half a token on the full layers
    assert kv_read((lo + hi) / 2) < 0.6 * brute  # the chunked layers' 8 keys at 8,200 alone
    # the static estimate averages over its generation; full-attention models ignore the span
    e = estimate_latency(d, 8, 8000, 500)
    assert e.tpot_s == pytest.approx(step_time(d, StepShape(decode_seqs=8, decode_context=8250, decode_span=500),
                                               "decode").seconds)
    dense = _d("llama3-8b")
    assert step_time(dense, StepShape(decode_seqs=8, decode_context=9000, decode_span=600), "decode").seconds == (
        step_time(dense, StepShape(decode_seqs=8, decode_context=9000), "decode").seconds)


# --- Gemma 4 -----------------------------------------------------------------------------------------------------

def test_gemma4_31b_decode_reads_each_layer_kind_with_its_own_shape() -> None:
    """50 sliding layers read min(context, 1024) keys of 16 KV heads x 256, 10 global layers the whole context of
    4 x 512; the QKV GEMM of a global layer has the V slot engines fill with K (32 + 2 x 4 heads of 512)."""
    d = _d("gemma4-31b")
    step = step_time(d, StepShape(decode_seqs=8, decode_context=4096))
    assert step.kv_read_bytes == 8 * (50 * 1024 * 2 * 16 * 256 + 10 * 4096 * 2 * 4 * 512) * 2
    h, local, full = 5376, 5376 * (32 + 2 * 16) * 256, 5376 * (32 + 2 * 4) * 512
    mlp, o_local, o_full = 3 * 5376 * 21504, 32 * 256 * h, 32 * 512 * h
    per_layers = 50 * (local + o_local + mlp) + 10 * (full + o_full + mlp)
    assert step.weight_bytes == (per_layers + 262144 * h) * 2  # + the tied head; the embedding is gathered


def test_gemma4_moe_runs_its_dense_mlp_beside_the_experts_and_reduces_it_apart() -> None:
    d1, d2 = _d("gemma4-26b-a4b"), _d("gemma4-26b-a4b", tp=2)
    shape = StepShape(decode_seqs=16, decode_context=2048)
    one, two = step_time(d1, shape), step_time(d2, shape)
    assert one.groups["dense_ffn"].bytes > 0 and one.groups["moe"].bytes > 0  # every layer runs both
    without = replace(d2.spec, moe=replace(d2.spec.moe, dense_mlp_beside=False))
    plain = step_time(deployment(without, d2.gpu, d2.precision, d2.kv_dtype, tp=2), shape)
    # one more all-reduce of 16 tokens x 2816 x 2 bytes in each of the 30 layers (vLLM Gemma4MLP reduces its own)
    assert two.comm_bytes - plain.comm_bytes == 30 * 16 * 2816 * 2
    assert two.tp_comm_seconds > plain.tp_comm_seconds and plain.groups["dense_ffn"].bytes == 0


def test_gemma4_prefill_attention_on_sglangs_hopper_fallback_kernel() -> None:
    """Gemma 4's heads of 512 exceed FlashAttention's 256: SGLang on an H100 runs every layer's prefill attention on
    its Triton kernel (the sliding layers' whole triangles too), the rest of the step unchanged; a model of narrower
    heads is untouched."""
    sglang = load_engine("sglang").kernels
    flash = replace(sglang, wide_head_prefill_scale_by_gpu={})
    shape = StepShape(prefill_seqs=4, prefill_tokens=3000)
    triton_step, flash_step = (step_time(_d("gemma4-31b", tp=2, engine_kernels=k), shape, "prefill")
                               for k in (sglang, flash))
    assert _d("gemma4-31b").widest_head_dim == 512 and _d("llama3-8b").widest_head_dim == 128
    # the attention group (its projections included) about doubles at 3,000 tokens
    assert triton_step.groups["attention"].seconds > 1.5 * flash_step.groups["attention"].seconds
    assert triton_step.groups["dense_ffn"] == flash_step.groups["dense_ffn"]
    assert triton_step.flops == flash_step.flops  # the FLOPs reported are the window's
    llama = StepShape(prefill_seqs=4, prefill_tokens=3000)
    assert step_time(_d("llama3-8b", engine_kernels=sglang), llama, "prefill") == step_time(
        _d("llama3-8b", engine_kernels=flash), llama, "prefill")


def test_bitsandbytes_nf4_unpacks_a_matrix_before_a_gemm_of_more_than_one_row() -> None:
    """bitsandbytes' matmul_4bit runs its fused GEMV for one token row only; any more rows unpack the whole matrix
    to 16 bits (F.dequantize_4bit) and multiply in bf16. Llama 3 8B on an H100: one row decodes faster than bf16
    (4.5 instead of 16 bits a weight read), eight rows slower, by the unpacking pass over each matrix (reading
    4.5 bits and writing 16 a weight); a 2k-token prefill too, as users report (vllm-project/vllm#9535: a
    batched bitsandbytes run 71 s against 45 s in bf16). The ideal columns keep the pure roofline."""
    spec = load_model("llama3-8b")
    nf4, bf16 = (deployment(spec, load_gpu("h100-sxm"), parse_weight_precision(w), KV) for w in ("nf4", "bf16"))
    one, one16 = step_time(nf4, StepShape(decode_seqs=1, decode_context=1024)), step_time(
        bf16, StepShape(decode_seqs=1, decode_context=1024))
    assert one.seconds < 0.6 * one16.seconds
    eight = step_time(nf4, StepShape(decode_seqs=8, decode_context=1024))
    eight16 = step_time(bf16, StepShape(decode_seqs=8, decode_context=1024))
    linear = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336)  # the head stays bf16
    unpack = linear * (4.5 / 8 + 2)
    assert eight.seconds - eight16.seconds == pytest.approx(unpack / nf4.gpu.hbm_bandwidth_bytes_per_s, rel=0.35)
    assert eight.seconds > 1.2 * eight16.seconds
    prefill = estimate_latency(nf4, 1, 2048, 2)
    assert prefill.ttft_s > estimate_latency(bf16, 1, 2048, 2).ttft_s
    assert step_time(nf4, StepShape(decode_seqs=8, decode_context=1024), ideal=True).seconds < eight16.seconds


def test_weight_only_float_checkpoints_run_on_16_bit_tensor_cores() -> None:
    """ModelOpt W4A16_NVFP4 keeps 16-bit activations: on a B200 (fp4 tensor cores) its MLP is a weight-only GEMM
    (bf16 MMA after unpacking), NVFP4 W4A4 an fp4 GEMM; a long prefill, compute-bound, is therefore slower. The
    same weights re-quantised by the engine (a 16-bit checkpoint served as nvfp4) are not the checkpoint's."""
    spec = replace(load_model("llama3-8b"), native_dtype="nvfp4")
    w4a16 = replace(spec, checkpoint_weight_only=("attention", "mlp"))
    gpu, precision = load_gpu("b200"), parse_weight_precision("nvfp4")
    a4, a16 = (estimate_latency(deployment(s, gpu, precision, KV), 1, 8192, 2) for s in (spec, w4a16))
    assert a16.ttft_s > 1.3 * a4.ttft_s
    served = estimate_latency(deployment(replace(w4a16, native_dtype="bf16"), gpu, precision, KV), 1, 8192, 2)
    assert served.ttft_s == a4.ttft_s
    # FP8 weight-only (compressed-tensors W8A16) on an H100: bf16 MMA after unpacking, not the fp8 peak
    fp8 = replace(load_model("llama3-8b"), native_dtype="fp8")
    a8, a16_fp8 = (estimate_latency(deployment(s, load_gpu("h100-sxm"), parse_weight_precision("fp8"), KV), 1, 8192,
                                    2) for s in (fp8, replace(fp8, checkpoint_weight_only=("attention", "mlp"))))
    assert a16_fp8.ttft_s > 1.2 * a8.ttft_s


def test_layers_a_checkpoint_keeps_16_bit_are_timed_in_16_bits() -> None:
    """Meta's Llama 3.1 405B FP8 keeps every attention and the first and last layers' MLP in bf16
    (quantized_weight_exceptions): at fp8 on 8 H100s a batch-1 decode step reads, per GPU, 126 attentions and 2
    MLPs at 2 bytes a weight and 124 MLPs at 1, by hand (before, every layer was timed at fp8, though memory and
    plan counted them 16-bit); served in bf16 the exceptions change nothing."""
    spec = load_model("llama3.1-405b")
    h, inter, vocab = 16384, 53248, 128256
    attention = 2 * h * h + 2 * h * 1024
    mlp = 3 * h * inter
    d = deployment(spec, load_gpu("h100-sxm"), parse_weight_precision("fp8"), KV, tp=8)
    step = step_time(d, StepShape(decode_seqs=1, decode_context=1024))
    assert step.weight_bytes == pytest.approx((126 * attention * 2 + 2 * mlp * 2 + 124 * mlp + vocab * h * 2) / 8)
    plain = deployment(replace(spec, quantized_weight_exceptions=()), load_gpu("h100-sxm"),
                       parse_weight_precision("fp8"), KV, tp=8)
    # 9.6 GB more to read per GPU, less the fp8 layers' input scales (vLLM quantises a 16-bit checkpoint online:
    # a dynamic scale per linear) the 16-bit ones do not compute
    fp8_everywhere = step_time(plain, StepShape(decode_seqs=1, decode_context=1024))
    assert step.seconds > 1.05 * fp8_everywhere.seconds
    assert step.weight_bytes - fp8_everywhere.weight_bytes == pytest.approx((126 * attention + 2 * mlp) / 8)
    bf16 = deployment(spec, load_gpu("h100-sxm"), BF16, KV, tp=8)
    assert bf16.variants == () and step_time(bf16, StepShape(decode_seqs=1, decode_context=1024)).weight_bytes == \
        pytest.approx((126 * (attention + mlp) + vocab * h) * 2 / 8)


def test_mla_projections_kept_16_bit_beside_a_quantized_o_proj_are_timed_so() -> None:
    """NVIDIA's DeepSeek-V3.2-NVFP4 keeps MLA's q_a / q_b / kv_a / kv_b and the indexer in bf16, o_proj nvfp4: on
    8 B200s a batch-1 decode step reads those projections at 2 bytes a weight and o_proj at 0.5625, per GPU as
    tensor parallelism lays them out (q_a, kv_a and the indexer whole on every GPU), and o_proj in its own format;
    before, every projection was timed nvfp4."""
    from tfcalc.calc.params import attention_modules, indexer_modules
    from tfcalc.spec.model import WeightException

    base = replace(load_model("deepseek-v3.2"), native_dtype="nvfp4")
    kept = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "indexer.wq_b", "indexer.wk",
            "indexer.weights_proj")
    spec = replace(base, quantized_weight_exceptions=(WeightException(
        layers=tuple(range(base.num_layers)), components=("attention",), dtype="bf16", formats=("nvfp4",),
        modules=kept),))
    nvfp4 = parse_weight_precision("nvfp4")
    shape = StepShape(decode_seqs=1, decode_context=2048)
    steps = [step_time(deployment(s, load_gpu("b200"), nvfp4, get_dtype("fp8"), tp=8), shape) for s in (base, spec)]
    modules = {**attention_modules(spec), **indexer_modules(spec)}
    per_gpu = sum(modules[m].per_rank(8).matrix for m in kept)
    assert steps[1].weight_bytes - steps[0].weight_bytes == pytest.approx(
        base.num_layers * per_gpu * (2 - 4.5 / 8), rel=0.02)
    ideal = [step_time(deployment(s, load_gpu("b200"), nvfp4, get_dtype("fp8"), tp=8), shape, ideal=True)
             for s in (base, spec)]
    assert ideal[1].seconds > ideal[0].seconds  # more bytes; the real step may not be slower: the nvfp4 GEMMs'
    # input quantisation kernels are gone (at batch 1 those projections are floor-bound)


def _minimax_m3(engine: str, gpu: str = "h200", tp: int = 8, weights: str = "bf16"):  # noqa: ANN202 - Deployment
    return _d("minimax-m3", gpu, weights, tp=tp, engine_kernels=load_engine(engine).kernels)


def test_msa_on_tensorrt_llm_hopper_is_the_fp32_expansion() -> None:
    # TensorRT-LLM's Triton MSA path (its only one off SM100) copies every query's keys to FP32: the MiniMax-M3
    # prefill grows with prompt x prompt on its 57 sparse layers, and is many times vLLM's sparse kernel's
    trt, vllm = _minimax_m3("trtllm"), _minimax_m3("vllm")
    shape = StepShape(prefill_seqs=1, prefill_tokens=3000)
    t_trt, t_vllm = step_time(trt, shape, "prefill"), step_time(vllm, shape, "prefill")
    assert t_trt.seconds > 5 * t_vllm.seconds
    expansion = kernels.msa_fp32_expansion(trt.rates_prefill, seqs=1, queries=3000, keys=3000, kv_heads=1, q_heads=8,
                                           head_dim=128, index_heads=4, index_dim=128,
                                           efficiency=trt.rates_prefill.msa_fp32_expansion["prefill"])
    assert t_trt.groups["attention"].seconds >= 57 * expansion.seconds
    longer = step_time(trt, StepShape(prefill_seqs=1, prefill_tokens=6000), "prefill")
    assert t_trt.groups["attention"].seconds * 3.5 < longer.groups["attention"].seconds
    # the pure roofline does not change with the engine's path
    assert step_time(trt, shape, "prefill", ideal=True).seconds == pytest.approx(
        step_time(vllm, shape, "prefill", ideal=True).seconds)


def test_msa_block_floors_in_decode() -> None:
    # TensorRT-LLM's MSA block's fixed cost per sparse layer (57 of MiniMax-M3's 60) bounds a decode step from below
    # on the H200 (Triton path) and on the B200 (fmha_sm100 path), where vLLM has none
    for gpu, tp, weights in (("h200", 8, "bf16"), ("b200", 4, "nvfp4")):
        trt = _minimax_m3("trtllm", gpu, tp, weights)
        floor = trt.rates_decode.dsa_block_floors["msa_decode"]
        shape = StepShape(decode_seqs=1, decode_context=256)
        assert step_time(trt, shape).groups["attention"].seconds >= 57 * floor
        vllm = _minimax_m3("vllm", gpu, tp, weights)
        assert step_time(vllm, shape).groups["attention"].seconds < 57 * floor
    # decode on the Triton path grows with the batch's keys
    trt = _minimax_m3("trtllm")
    steps = [step_time(trt, StepShape(decode_seqs=b, decode_context=3150)).seconds for b in (1, 4, 24, 64)]
    assert steps == sorted(steps)


def test_msa_layers_price_as_full_attention_elsewhere() -> None:
    # an engine without an MSA path prices MiniMax-M3's sparse layers exactly as its dense-attention layers
    d = _minimax_m3("vllm")
    dense = replace(d, spec=replace(d.spec, sparse_indexer=None))
    for shape in (StepShape(prefill_seqs=2, prefill_tokens=1500), StepShape(decode_seqs=8, decode_context=2000)):
        assert step_time(d, shape).seconds == pytest.approx(step_time(dense, shape).seconds)


def test_msa_prefill_block_floor_on_sglang() -> None:
    # SGLang runs MiniMax-M3's sparse prefill eagerly with a fixed cost per layer (its msa_context_module rows: flat
    # 0.69-0.83 ms up to 1,024 tokens): a short prompt's attention is at least 57 of them; a long batch's kernels
    # hide it; vLLM has none
    sglang, vllm = _minimax_m3("sglang"), _minimax_m3("vllm")
    floor = sglang.rates_prefill.dsa_block_floors["msa_prefill"]
    short = StepShape(prefill_seqs=1, prefill_tokens=256)
    assert step_time(sglang, short, "prefill").groups["attention"].seconds >= 57 * floor
    assert step_time(vllm, short, "prefill").groups["attention"].seconds < 57 * floor
    long = StepShape(prefill_seqs=24, prefill_tokens=3000)
    assert step_time(sglang, long, "prefill").groups["attention"].seconds == pytest.approx(
        step_time(replace(sglang, spec=replace(sglang.spec, sparse_indexer=None)), long, "prefill")
        .groups["attention"].seconds)


# aiconfigurator 0.12 generation_attention_perf rows (vLLM's FlashAttention-2, bf16 cache, head dim 128): 16
# sequences of 8,192 tokens, 32 query and 8 KV heads (512 MiB of KV): A100 vllm/0.14.0 342.0 us, L40S vllm/0.24.0
# 838.0 us; and the A100's GQA row of 4 sequences of 131,072 tokens, 8 query heads, 1 KV head (256 MiB), 193.4 us
@pytest.mark.parametrize(("gpu", "seqs", "ctx", "kv_heads", "measured_us"), [
    ("a100-80gb", 16, 8192, 8, 342.0), ("l40s", 16, 8192, 8, 838.0), ("a100-80gb", 4, 131072, 1, 193.4)])
def test_fa2_decode_attention_against_aiconfigurator_rows(gpu: str, seqs: int, ctx: int, kv_heads: int,
                                                          measured_us: float) -> None:
    from tfcalc.calc.latency import rates_for

    rates = rates_for(load_gpu(gpu), load_engine("vllm-0.21").kernels)
    kv = 2.0 * seqs * ctx * kv_heads * 128 * 2
    t = kernels.decode_attention(rates, seqs, kv_heads, kv, 4.0 * seqs * 4 * kv_heads * 128 * ctx).seconds
    assert t * 1e6 == pytest.approx(measured_us, rel=0.10)


def _kimi_k3_sglang(**spec_changes):  # noqa: ANN202 - Deployment
    from tfcalc.spec.hf_config import load_hf_config

    spec = load_hf_config(Path(__file__).parents[1] / "fixtures" / "hf_configs" / "kimi-k3.json", name="kimi-k3")
    return deployment(replace(spec, **spec_changes), load_gpu("b300"),
                      parse_weight_precision("experts=mxfp4,default=bf16"), KV, tp=8,
                      engine_kernels=load_engine("sglang").kernels)


# aiconfigurator 0.12 gemm_perf rows, B300 sglang/0.5.14, bfloat16, m = 64: [3584 x 7168] 12.73 us (Kimi K3's
# routed_expert_down_proj), [7168 x 3584] 11.86 us (its up_proj)
@pytest.mark.parametrize(("n", "k", "row_us"), [(3584, 7168, 12.73), (7168, 3584, 11.86)])
def test_kimi_k3_latent_projections_are_bf16_gemms_against_aiconfigurator_rows(n: int, k: int,
                                                                             row_us: float) -> None:
    """Kimi K3's latent projections stay bf16 beside the MXFP4 experts (SGLang KimiK3MoE: ReplicatedLinear with
    quant_config=None): a decode step of 64 tokens spends one such GEMM more per MoE layer (92) with them than
    without the latent, within 20 % of aiconfigurator's bf16 rows (priced in MXFP4, 7 us: 45 % short)."""
    d = _kimi_k3_sglang()
    assert d.dims.latent_mode is not None and d.dims.latent_mode.bits == 16
    rates = d.rates_decode
    t = kernels.gemm(rates, 64, n, k, 16, "bf16").seconds
    assert t * 1e6 == pytest.approx(row_us, rel=0.20)
    mxfp4 = replace(d.dims, latent_mode=None)
    assert kernels.gemm(rates, 64, n, k, mxfp4.experts_mode.bits, mxfp4.experts_mode.compute,
                        dequant=mxfp4.experts_mode.dequant, weight_format=mxfp4.experts_mode.weights
                        ).seconds < 0.7 * t


def test_kimi_k3_attention_residuals_norm_and_kda_decay_against_aiconfigurator() -> None:
    """At 64 decode tokens (context 2,150) aiconfigurator's SGLang B300 prediction of Kimi K3 spends 723 us a step
    on the attention residuals (two aggregations a layer, 93 layers: generation_attn_res), 303 us on the latent
    RMSNorm (92 MoE layers: generation_latent_norm) and 150 us on KDA's f_b [128 -> 1,536] (69 layers:
    generation_kda_fb_gemm); each within 35 % here, and absent without the part."""
    shape = StepShape(decode_seqs=64, decode_context=2150, decode_span=300)
    full = step_time(_kimi_k3_sglang(), shape).seconds
    no_res = step_time(_kimi_k3_sglang(attention_residual_block=0), shape).seconds
    assert (full - no_res) * 1e6 == pytest.approx(723, rel=0.35)
    d = _kimi_k3_sglang()
    assert d.dims.latent_norm and d.dims.kda
    norm = kernels.elementwise(d.rates_decode, 2 * 64 * 3584 * 2).seconds * 92
    assert norm * 1e6 == pytest.approx(303, rel=0.35)
    f_b = kernels.gemm(d.rates_decode, 64, 1536, 128, 16, "bf16").seconds * 69
    assert f_b * 1e6 == pytest.approx(150, rel=0.35)
