"""Each kernel's FLOPs and bytes against hand counts, and its time against the formula in kernels.py."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc import kernels
from tfcalc.calc.kernels import GEMM_K0, MOE_K0, Rates

RATES = Rates(name="test", peak_flops={"bf16": 1000e12, "fp8": 2000e12, "fp32": 60e12},
              gemm_efficiency={"bf16": 0.8, "fp8": 0.6}, attention_efficiency=0.7, moe_efficiency=0.5,
              memory_bandwidth=4e12, memory_efficiency=0.8, alu_ops_per_s=30e12, sm_count=100,
              floors={"gemm": 3e-6, "elementwise": 2e-6, "attention": 10e-6, "moe": 25e-6}, launch_s=8e-6)
IDEAL = RATES.as_ideal()


def _overlap(t_compute: float, t_memory: float) -> float:
    """A dense GEMM's work by hand: the p-norm of its compute and memory times (kernels.GEMM_OVERLAP_P)."""
    p = kernels.GEMM_OVERLAP_P
    return (t_compute ** p + t_memory ** p) ** (1 / p)


def _gemm_bytes(m: int, n: int, k: int, weight_bytes: float) -> float:
    return n * k * weight_bytes + m * k * 2 + m * n * 2


def test_gemm_counts_and_time_by_hand() -> None:
    # [16 x 4096] @ [4096 x 8192] bf16: 2 x 16 x 8192 x 4096 FLOPs; weights 8192 x 4096 x 2 B, input 16 x 4096 x 2,
    # output 16 x 8192 x 2
    c = kernels.gemm(RATES, 16, 8192, 4096, 16, "bf16")
    assert c.flops == 2 * 16 * 8192 * 4096
    assert c.bytes == 8192 * 4096 * 2 + 16 * 4096 * 2 + 16 * 8192 * 2
    assert c.weight_bytes == c.ideal_bytes == 8192 * 4096 * 2
    t_memory = c.bytes / (4e12 * 0.8)
    t_compute = c.flops / (1000e12 * 0.8 * 4096 / (4096 + GEMM_K0["bf16"]))
    assert t_memory > t_compute and c.bound == "memory"
    assert c.seconds == pytest.approx(_overlap(t_compute, t_memory) + 3e-6)
    # large M: compute-bound at 0.8 x K/(K + 128) of the bf16 peak
    big = kernels.gemm(RATES, 8192, 8192, 4096, 16, "bf16")
    assert big.bound == "compute"
    assert big.seconds == pytest.approx(_overlap(big.flops / (1000e12 * 0.8 * 4096 / 4224),
                                                 big.bytes / (4e12 * 0.8)) + 3e-6)


def test_gemm_overlap_is_the_larger_time_away_from_the_ridge_and_more_at_it() -> None:
    """(t_c^p + t_m^p)^(1/p): 2^(1/p) x either time at the ridge, within 0.2 % of the larger one at a 10:1 ratio,
    the larger one when ideal or when either is zero; gemm_compute_seconds inverts it."""
    p = kernels.GEMM_OVERLAP_P
    assert kernels.gemm_work_seconds(1.0, 1.0) == pytest.approx(2 ** (1 / p))
    assert 1.0 < kernels.gemm_work_seconds(1.0, 0.1) < 1.002
    assert kernels.gemm_work_seconds(1.0, 1.0, ideal=True) == 1.0
    assert kernels.gemm_work_seconds(0.0, 2.0) == 2.0 and kernels.gemm_work_seconds(3.0, 0.0) == 3.0
    for t_c, t_m in ((1.0, 0.3), (0.2, 1.0), (5e-5, 4e-5)):
        assert kernels.gemm_compute_seconds(kernels.gemm_work_seconds(t_c, t_m), t_m) == pytest.approx(t_c)
    assert kernels.gemm_compute_seconds(1.0, 1.0) == 0.0 and kernels.gemm_compute_seconds(1.0, 0.5, True) == 1.0
    # ideal rates: the pure roofline, max(FLOPs / peak, bytes / HBM), no floor
    c = kernels.gemm(IDEAL, 512, 8192, 8192, 16, "bf16")
    assert c.seconds == pytest.approx(max(c.flops / 1000e12, c.bytes / 4e12))


def test_gemm_fp8_uses_the_fp8_peak_and_its_k0() -> None:
    c = kernels.gemm(RATES, 8192, 8192, 1024, 8, "fp8")
    assert c.bytes == 8192 * 1024 * 1 + 8192 * 1024 * 2 + 8192 * 8192 * 2
    assert c.seconds == pytest.approx(_overlap(c.flops / (2000e12 * 0.6 * 1024 / (1024 + GEMM_K0["fp8"])),
                                               c.bytes / (4e12 * 0.8)) + 3e-6)


def test_a_weight_formats_own_streaming_fraction_by_hand() -> None:
    """gemm_memory_efficiency: [8 x 8192] @ [8192 x 8192] per-tensor fp8 streams at its format's 0.6 of 4 TB/s, not
    the rates' 0.8; other formats, ideal rates, a measured bandwidth curve and a memory-efficiency override keep
    the common figure; a compute-bound shape streams at it too, in its small memory term."""
    own = replace(RATES, gemm_memory_efficiency={"fp8_e4m3": 0.6})
    c = kernels.gemm(own, 8, 8192, 8192, 8, "fp8", weight_format="fp8_e4m3")
    nbytes = 8192 * 8192 * 1 + 8 * 8192 * 2 + 8 * 8192 * 2
    t_compute = c.flops / (2000e12 * 0.6 * 8192 / (8192 + GEMM_K0["fp8"]))
    assert c.bytes == nbytes and c.bound == "memory"
    assert c.seconds == pytest.approx(_overlap(t_compute, nbytes / (4e12 * 0.6)) + 3e-6)
    common = _overlap(t_compute, nbytes / (4e12 * 0.8)) + 3e-6
    assert kernels.gemm(own, 8, 8192, 8192, 8, "fp8", weight_format="fp8_block").seconds == pytest.approx(common)
    assert kernels.gemm(own, 8, 8192, 8192, 8, "fp8").seconds == pytest.approx(common)
    assert kernels.gemm(own.as_ideal(), 8, 8192, 8192, 8, "fp8", weight_format="fp8_e4m3").seconds == \
        pytest.approx(max(c.flops / 2000e12, nbytes / 4e12))
    curve = replace(own, bandwidth_points=((1e6, 2e12), (1e9, 3e12)))
    assert kernels.gemm(curve, 8, 8192, 8192, 8, "fp8", weight_format="fp8_e4m3").seconds == \
        pytest.approx(_overlap(t_compute, nbytes / curve.bandwidth(nbytes)) + 3e-6)
    assert own.with_efficiency(memory=0.7).gemm_memory_efficiency == {}
    big = kernels.gemm(own, 8192, 8192, 8192, 8, "fp8", weight_format="fp8_e4m3")
    big_compute = big.flops / (2000e12 * 0.6 * 8192 / (8192 + GEMM_K0["fp8"]))
    assert big.bound == "compute" and big.seconds == pytest.approx(_overlap(big_compute, big.bytes / (4e12 * 0.6))
                                                                   + 3e-6)


def test_a_weight_formats_own_compute_fraction_by_hand() -> None:
    """gemm_efficiency_by_format: a compute-bound [8192 x 8192] @ [8192 x 8192] per-tensor fp8 GEMM runs at its
    format's 0.8 of the fp8 peak x K/(K + K0), not the dtype's 0.6; other formats, a weight-only (dequant) kernel,
    grouped expert GEMMs (at MOE_K0), ideal rates and a compute-efficiency override keep the dtype's figure."""
    own = replace(RATES, gemm_efficiency_by_format={"fp8_e4m3": 0.8})
    c = kernels.gemm(own, 8192, 8192, 8192, 8, "fp8", weight_format="fp8_e4m3")
    at = 8192 / (8192 + GEMM_K0["fp8"])
    t_memory = _gemm_bytes(8192, 8192, 8192, 1) / (4e12 * 0.8)
    assert c.bound == "compute" and c.seconds == pytest.approx(_overlap(c.flops / (2000e12 * 0.8 * at), t_memory)
                                                               + 3e-6)
    common = kernels.gemm(RATES, 8192, 8192, 8192, 8, "fp8").seconds
    assert common == pytest.approx(_overlap(c.flops / (2000e12 * 0.6 * at), t_memory) + 3e-6)
    assert kernels.gemm(own, 8192, 8192, 8192, 8, "fp8", weight_format="fp8_block").seconds == pytest.approx(common)
    assert kernels.gemm(own, 8192, 8192, 8192, 8, "fp8").seconds == pytest.approx(common)
    weight_only = replace(own, gemm_efficiency_by_format={"int8": 0.9})
    assert kernels.gemm(weight_only, 8192, 8192, 8192, 8, "bf16", dequant="int8", weight_format="int8").seconds == \
        pytest.approx(kernels.gemm(RATES, 8192, 8192, 8192, 8, "bf16", dequant="int8").seconds)
    assert own.gemm_flops_per_s("fp8", 8192, grouped=True, weight_format="fp8_e4m3") == \
        pytest.approx(2000e12 * 0.6 * 8192 / (8192 + MOE_K0["fp8"]))
    assert own.as_ideal().gemm_flops_per_s("fp8", 8192, weight_format="fp8_e4m3") == 2000e12
    assert own.with_efficiency(compute=0.5).gemm_efficiency_by_format == {}


def test_dynamic_scale_reads_the_input_once_more_after_a_floor() -> None:
    """A per-tensor fp8 GEMM's dynamic scale: a max reduction over its [m x k] 16-bit input, at least the engine's
    measured fixed time, else the elementwise floor; outside CUDA graphs the host launch; none when ideal."""
    small = kernels.dynamic_scale(RATES, 8, 8192)
    assert small.bytes == 8 * 8192 * 2 and small.flops == 0 and small.bound == "floor"
    assert small.seconds == pytest.approx(2e-6 + 8 * 8192 * 2 / 3.2e12)
    measured = replace(RATES, dynamic_scale_s=7.4e-6)
    assert kernels.dynamic_scale(measured, 8, 8192).seconds == pytest.approx(7.4e-6 + 8 * 8192 * 2 / 3.2e12)
    big = kernels.dynamic_scale(measured, 8192, 8192)
    assert big.bound == "memory" and big.seconds == pytest.approx(7.4e-6 + 8192 * 8192 * 2 / 3.2e12)
    assert kernels.dynamic_scale(replace(measured, cuda_graphs=False), 8, 8192).seconds == pytest.approx(8e-6)
    assert kernels.dynamic_scale(measured.as_ideal(), 8, 8192).seconds == pytest.approx(8 * 8192 * 2 / 4e12)


def test_weight_only_gemm_is_bound_by_dequantisation_at_small_m() -> None:
    # int4 weight-only: 4096 x 4096 elements x 5.6 instructions / 30e12 per s = 3.1 us > 8.6 MB at 3.2 TB/s = 2.7 us
    c = kernels.gemm(RATES, 1, 4096, 4096, 4.125, "bf16", dequant="int4")
    assert c.bound == "dequant"
    assert c.seconds == pytest.approx(4096 * 4096 * kernels.DEQUANT_OPS["int4"] / 30e12 + 3e-6)
    assert kernels.gemm(IDEAL, 1, 4096, 4096, 4.125, "bf16", dequant="int4").bound == "memory"


def test_ideal_rates_are_the_roofline() -> None:
    c = kernels.gemm(IDEAL, 64, 4096, 4096, 16, "bf16")
    assert c.seconds == pytest.approx(max(c.flops / 1000e12, c.bytes / 4e12))
    e = kernels.elementwise(IDEAL, 1e6)
    assert e.seconds == pytest.approx(1e6 / 4e12) and e.floor_seconds == 0


def test_floors_and_eager_launches() -> None:
    tiny = kernels.elementwise(RATES, 100)
    assert tiny.bound == "floor" and tiny.seconds == pytest.approx(2e-6 + 100 / 3.2e12)
    eager = replace(RATES, cuda_graphs=False)
    assert kernels.elementwise(eager, 100).seconds == pytest.approx(8e-6)  # the GPU waits for the host's launch
    big = kernels.elementwise(RATES, 1e8)
    assert kernels.elementwise(eager, 1e8).seconds == pytest.approx(big.seconds)  # a long kernel hides the launch
    assert kernels.elementwise(eager, 100, kernels=3).seconds == pytest.approx(3 * 8e-6)
    assert kernels.elementwise(RATES, 1000, kernels=3).floor_seconds == pytest.approx(6e-6)


def test_flash_tiles_by_hand() -> None:
    # 1024 new tokens, no cache: 8 query tiles see 1..8 key tiles = 36; a window of 256 caps at ceil(256/128)+1 = 3
    assert kernels._tiles(1024, 0, None) == (36, 8, 8)
    assert kernels._tiles(1024, 0, 256) == (1 + 2 + 3 * 6, 3, 8)
    # 128 new tokens after 1000 cached: one query tile sees ceil(1000/128) + 1 = 9 key tiles
    assert kernels._tiles(128, 1000, None) == (9, 9, 1)


def test_flash_prefill_time_is_max_of_total_work_and_longest_tile() -> None:
    heads, seq = 32, 1024
    exact = 2.0 * heads * (128 + 128) * seq * (seq + 1) / 2
    c = kernels.flash_prefill(RATES, seqs=1, tokens=seq, past=0, heads=heads, qk_dim=128, v_dim=128, window=None,
                              kv_bytes_read=0.0, exact_flops=exact)
    tile_time = 2.0 * 128 * 128 * 256 / (1000e12 * 0.7 / 100)
    work = heads * (36 + 2 * 8)  # key tiles + a 2-tile prologue per query tile
    assert c.flops == exact
    assert c.seconds == pytest.approx(tile_time * max(work / 100, 8 + 2) + 10e-6)
    # one head: 8 query tiles on 100 SMs -> the longest tile (8 + 2) sets the time
    one = kernels.flash_prefill(RATES, seqs=1, tokens=seq, past=0, heads=1, qk_dim=128, v_dim=128, window=None,
                                kv_bytes_read=0.0, exact_flops=exact / heads)
    assert one.seconds == pytest.approx(tile_time * 10 + 10e-6)



def test_flash_prefill_over_an_fp8_cache() -> None:
    """An fp8 cache changes prefill attention only where the engine measured its kernel so (vLLM's FA3 on Hopper:
    1.1 x the bf16 cache's time, its query staying bf16): the tile time scales, the launch floor does not; ideal
    mode and a bf16 cache ignore it."""
    heads, seq = 32, 1024
    exact = 2.0 * heads * (128 + 128) * seq * (seq + 1) / 2

    def prefill(rates, fp8_cache: bool):  # noqa: ANN001, ANN202
        return kernels.flash_prefill(rates, seqs=1, tokens=seq, past=0, heads=heads, qk_dim=128, v_dim=128,
                                     window=None, kv_bytes_read=0.0, exact_flops=exact, fp8_cache=fp8_cache)

    wide = prefill(RATES, False)
    assert prefill(RATES, True) == wide
    measured = replace(RATES, fp8_kv_prefill_scale=1.1)
    assert prefill(measured, True).seconds - 10e-6 == pytest.approx(1.1 * (wide.seconds - 10e-6))
    assert prefill(measured, True).flops == exact and prefill(measured, False) == wide
    ideal = measured.as_ideal()
    assert prefill(ideal, True) == prefill(ideal, False)


def test_wide_head_prefill_runs_the_whole_triangle_at_the_engines_scale() -> None:
    """Heads over FlashAttention's 256 on an engine with a measured fallback kernel (SGLang's Triton on Hopper):
    scale x the flash time of the whole causal triangle, a window skipping no tile; the FLOPs reported stay the
    window's; other engines and ideal mode ignore it."""
    seq, window, heads = 8192, 1024, 8
    exact = 2.0 * heads * 1024 * (window * (window + 1) / 2 + (seq - window) * window)

    def prefill(rates, wide: bool, win: int | None = window):  # noqa: ANN001, ANN202
        return kernels.flash_prefill(rates, seqs=1, tokens=seq, past=0, heads=heads, qk_dim=512, v_dim=512,
                                     window=win, kv_bytes_read=0.0, exact_flops=exact, wide_heads=wide)

    assert prefill(RATES, True) == prefill(RATES, False)  # no fallback measured: flash, window skipped
    triton = replace(RATES, wide_head_prefill_scale=5.0)
    whole = prefill(RATES, False, None)
    assert prefill(triton, True).seconds - 10e-6 == pytest.approx(5.0 * (whole.seconds - 10e-6))
    assert prefill(triton, True).flops == exact and prefill(triton, False) == prefill(RATES, False)
    assert prefill(triton.as_ideal(), True) == prefill(RATES.as_ideal(), True)


def test_decode_attention_streams_kv_with_enough_streams() -> None:
    kv = 64 * 4096 * 2 * 8 * 128 * 2  # batch 64, context 4096, 8 KV heads of 128, K and V, bf16
    c = kernels.decode_attention(RATES, 64, 8, kv, 4.0 * 64 * 32 * 128 * 4096)
    util = 512 / (512 + kernels.DECODE_STREAMS_HALF)
    assert c.bytes == kv and c.bound == "memory"
    assert c.seconds == pytest.approx(kv / (3.2e12 * util) + 10e-6)
    one = kernels.decode_attention(RATES, 1, 1, kv / 512, 1.0)
    assert one.seconds > kv / 512 / 3.2e12 * 3  # one stream reaches ~26 % of the bandwidth


def test_decode_attention_over_an_fp8_cache() -> None:
    """Without a measured fp8 kernel an fp8 cache streams at the bf16 kernel's bandwidth (half the bytes, half the
    memory time); with one (vLLM's FA3: fixed, scale) its streaming time is scale x the bf16 cache's for the same
    tokens and fixed is added beside the floor; ideal mode and a bf16 cache ignore it."""
    fp8 = 64 * 4096 * 2 * 8 * 128  # the cache above in one byte per element
    flops = 4.0 * 64 * 32 * 128 * 4096
    wide = kernels.decode_attention(RATES, 64, 8, 2 * fp8, flops)
    plain = kernels.decode_attention(RATES, 64, 8, fp8, flops, fp8_cache=True)
    assert plain.seconds - 10e-6 == pytest.approx((wide.seconds - 10e-6) / 2)
    measured = replace(RATES, fp8_kv_attention=(4e-6, 0.8))
    c = kernels.decode_attention(measured, 64, 8, fp8, flops, fp8_cache=True)
    assert c.seconds == pytest.approx(4e-6 + 10e-6 + 0.8 * (wide.seconds - 10e-6))
    assert c.bytes == fp8 and c.bound == "memory" and c.floor_seconds == pytest.approx(14e-6)
    assert kernels.decode_attention(measured, 64, 8, fp8, flops) == plain
    ideal = measured.as_ideal()
    assert kernels.decode_attention(ideal, 64, 8, fp8, flops, fp8_cache=True) == kernels.decode_attention(
        ideal, 64, 8, fp8, flops)


# the decode kernel a GPU preset measured (latency.decode_attention): streaming fraction, u_half, s per stream
MEASURED_DECODE = replace(RATES, decode_attention_memory=0.95, decode_streams_half=0.5, decode_stream_s=15e-9)


def test_decode_attention_at_the_gpus_measured_kernel() -> None:
    """t = floor + u x stream_s + bytes / (datasheet x fraction x u / (u + u_half)), by hand; MLA (FlashMLA, not
    the table's kernel), the ideal roofline and a calibrated bandwidth curve keep the generic pricing."""
    kv = 8 * 65536 * 2 * 128 * 2  # batch 1, 64k context, 8 KV heads of 128, K and V, bf16
    c = kernels.decode_attention(MEASURED_DECODE, 1, 8, kv, 1.0)
    assert c.seconds == pytest.approx(10e-6 + 8 * 15e-9 + kv / (4e12 * 0.95 * 8 / 8.5))
    assert c.floor_seconds == pytest.approx(10e-6 + 8 * 15e-9) and c.bound == "memory"
    assert kernels.decode_attention(MEASURED_DECODE, 1, 8, kv, 1.0, mla=True) == kernels.decode_attention(
        RATES, 1, 8, kv, 1.0)
    ideal = kernels.decode_attention(MEASURED_DECODE.as_ideal(), 1, 8, kv, 1.0)
    assert ideal == kernels.decode_attention(IDEAL, 1, 8, kv, 1.0) and ideal.seconds == pytest.approx(kv / 4e12)
    curve = replace(MEASURED_DECODE, bandwidth_points=((1e6, 2e12), (1e9, 3e12)))
    assert kernels.decode_attention(curve, 1, 8, kv, 1.0).seconds == pytest.approx(
        10e-6 + kv / (curve.bandwidth(kv) * 8 / (8 + kernels.DECODE_STREAMS_HALF)))
    assert RATES.with_efficiency(memory=0.5).decode_attention_memory == 0.0
    assert MEASURED_DECODE.with_efficiency(memory=0.5).decode_attention_memory == 0.0


def test_decode_attention_unsplit_mha_by_hand() -> None:
    """A kernel that runs MHA unsplit (decode_unsplit_cta_bandwidth: one CTA per sequence and head) streams at
    min(the GQA rate, u x the CTA's rate) for an MHA model only; GQA, MLA and the ideal roofline are unchanged."""
    unsplit = replace(MEASURED_DECODE, decode_unsplit_cta_bandwidth=20e9)
    kv = 4 * 65536 * 2 * 128 * 2  # batch 1, 64k context, 4 heads
    c = kernels.decode_attention(unsplit, 1, 4, kv, 1.0, mha=True)
    assert c.seconds == pytest.approx(10e-6 + 4 * 15e-9 + kv / (4 * 20e9))
    assert kernels.decode_attention(unsplit, 1, 4, kv, 1.0) == kernels.decode_attention(MEASURED_DECODE, 1, 4, kv, 1.0)
    big = kernels.decode_attention(unsplit, 1024, 4, 1024 * kv, 1.0, mha=True)  # 4096 CTAs: the GQA rate binds
    assert big == kernels.decode_attention(MEASURED_DECODE, 1024, 4, 1024 * kv, 1.0)
    assert kernels.decode_attention(unsplit, 1, 4, kv, 1.0, mla=True, mha=True) == kernels.decode_attention(
        RATES, 1, 4, kv, 1.0)
    assert kernels.decode_attention(unsplit.as_ideal(), 1, 4, kv, 1.0, mha=True).seconds == pytest.approx(kv / 4e12)


@given(st.integers(1, 256), st.integers(1, 16), st.integers(1, 1 << 17), st.booleans(), st.booleans())
@settings(max_examples=300, deadline=None)
def test_decode_attention_monotone_in_context_and_fp8_never_slower_when_long(
        seqs: int, kv_heads: int, context: int, measured_kernel: bool, fp8: bool) -> None:
    """One more token of context never makes decode attention faster, with or without a measured kernel or an fp8
    cache; where the bf16 cache is bandwidth-bound (>= 64 MiB, beyond L2) an fp8 cache (half the bytes) is never
    slower, at vLLM's FA3 on an H200 (the slowest fp8 kernel of the engine presets: fixed 1.5 us, scale 0.74)."""
    rates = replace(MEASURED_DECODE if measured_kernel else RATES, fp8_kv_attention=(1.5e-6, 0.74))

    def t(ctx: int, cache_fp8: bool) -> float:
        kv = seqs * kv_heads * 2 * 128 * (1 if cache_fp8 else 2) * ctx
        return kernels.decode_attention(rates, seqs, kv_heads, kv, 4.0 * seqs * kv_heads * 4 * 128 * ctx,
                                        fp8_cache=cache_fp8).seconds

    assert t(context + 1, fp8) >= t(context, fp8)
    if seqs * kv_heads * 2 * 128 * 2 * context >= 64 * 2**20:
        assert t(context, True) <= t(context, False)


@pytest.mark.parametrize(("experts", "k", "tokens", "expected"), [
    (8, 2, 1, 2.0), (8, 2, 64, 8 * (1 - 0.75**64)), (256, 8, 64, 256 * (1 - (1 - 8 / 256) ** 64)),
])
def test_distinct_experts_uniform(experts: int, k: int, tokens: int, expected: float) -> None:
    assert kernels.distinct_experts(experts, k, tokens) == pytest.approx(expected)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 256), st.integers(1, 8), st.integers(1, 4096), st.floats(0.1, 2.0))
def test_skewed_routing_touches_fewer_experts(experts: int, k: int, tokens: int, skew: float) -> None:
    k = min(k, experts)
    uniform = kernels.distinct_experts(experts, k, tokens)
    zipf = kernels.Routing("zipf", skew)
    skewed = kernels.distinct_experts(experts, k, tokens, zipf)
    assert skewed <= uniform + 1e-9 and skewed <= experts + 1e-9
    assert kernels.distinct_experts(experts, k, tokens + 1, zipf) >= skewed - 1e-9


def test_moe_one_token_reads_k_experts_by_hand() -> None:
    # Mixtral-like: 1 token, top-2 of 8, hidden 4096, width 14336, bf16: two experts of 3 x 4096 x 14336 params
    c = kernels.moe_experts(RATES, tokens=1, experts_local=8, experts_total=8, top_k=2, hidden=4096,
                            expert_width=14336, gated=True, weight_bits=16, compute="bf16")
    weights = 2 * 3 * 4096 * 14336 * 2
    assert c.weight_bytes == pytest.approx(weights)
    assert c.flops == pytest.approx(2 * 2 * 3 * 4096 * 14336)
    # activations: up reads 2 x 4096 and writes 2 x 28672, act reads 28672 + 14336 and writes, down reads 14336 and
    # writes 4096 per pair; combine reads 2 pairs + writes 1 token of 4096 (bf16)
    acts = 2 * (4096 * 2 + 28672 * 2) + 2 * (28672 + 14336) * 2 + 2 * (14336 * 2 + 4096 * 2) + 3 * 4096 * 2
    assert c.bytes == pytest.approx(weights + acts)
    assert c.floor_seconds == 25e-6 and c.seconds > weights / 3.2e12 + 25e-6


def test_nvfp4_experts_stage_fp4_rows_by_hand() -> None:
    """NVFP4 experts: one quantization as tokens are permuted (each token's 16-bit row read once, an FP4 copy written
    per routed row), FP4 rows into each GEMM, the
    gated activation fused into the first GEMM's epilogue (no separate pass), 16-bit output rows; MXFP4 experts keep
    the staged 16-bit rows and a quantization before each GEMM."""
    fp4 = replace(RATES, peak_flops={**RATES.peak_flops, "fp4": 4000e12}, gemm_efficiency={**RATES.gemm_efficiency,
                                                                                            "fp4": 0.5})
    args = dict(tokens=1, experts_local=8, experts_total=8, top_k=2, hidden=4096, expert_width=14336, gated=True,
                weight_bits=4.5, compute="fp4")
    nv = kernels.moe_experts(fp4, weight_format="nvfp4", **args)
    row = 4.5 / 8  # E2M1 + an E4M3 scale per 16
    weights = 2 * 3 * 4096 * 14336 * 4.5 / 8
    # the token's 4096 x 2 B read once (quantize); per pair: up writes 4096 FP4 (quantize), reads 4096 FP4 (GEMM),
    # writes 14336 FP4 (fused SwiGLU + quantize); down reads 14336 FP4 and writes 4096 x 2 B; combine reads 2 pairs +
    # writes 1 token (bf16)
    acts = 4096 * 2 + 2 * (4096 * 2 * row + 14336 * row) + 2 * (14336 * row + 4096 * 2) + 3 * 4096 * 2
    assert nv.weight_bytes == pytest.approx(weights)
    assert nv.bytes == pytest.approx(weights + acts)
    mx = kernels.moe_experts(fp4, weight_format="mxfp4", **args)
    staged = (2 * (4096 * (2 + 2 + 4.5 / 8) + 28672 * 2) + 2 * (28672 + 14336) * 2
              + 2 * (14336 * (2 + 2 + 4.5 / 8) + 4096 * 2) + 3 * 4096 * 2)
    assert mx.bytes == pytest.approx(weights + staged) and mx.bytes > nv.bytes
    # an engine's own per-row traffic (TensorRT-LLM's CUTLASS NVFP4 flow: kernels.moe_row_bytes) on each routed row
    heavy = kernels.moe_experts(replace(fp4, moe_row_bytes={"nvfp4": 16.0}), weight_format="nvfp4", **args)
    assert heavy.bytes == pytest.approx(nv.bytes + 2 * 4096 * 16.0) and heavy.seconds > nv.seconds


def test_fused_fp8_experts_stage_fp8_rows_by_hand() -> None:
    """An engine's fp8 MoE listed in moe_fused_rows (vLLM's per-tensor FP8 experts on FlashInfer's TRT-LLM MoE on a
    B200) stages like NVFP4: one quantization as tokens are permuted (each token's 16-bit row read once, an 8-bit
    copy written per routed row), 8-bit rows into
    each GEMM, the gated activation fused into the first GEMM's epilogue, 16-bit output rows; the same format
    elsewhere, block-scale fp8 and the ideal roofline keep their own traffic."""
    args = dict(tokens=1, experts_local=8, experts_total=8, top_k=2, hidden=4096, expert_width=14336, gated=True,
                weight_bits=8, compute="fp8")
    fused_rates = replace(RATES, moe_fused_rows=frozenset({"fp8_e4m3"}))
    fused = kernels.moe_experts(fused_rates, weight_format="fp8_e4m3", **args)
    weights = 2 * 3 * 4096 * 14336
    acts = 4096 * 2 + 2 * (4096 * 2 * 1 + 14336 * 1) + 2 * (14336 * 1 + 4096 * 2) + 3 * 4096 * 2
    assert fused.weight_bytes == pytest.approx(weights) and fused.bytes == pytest.approx(weights + acts)
    staged = kernels.moe_experts(RATES, weight_format="fp8_e4m3", **args)
    # a quantization before each GEMM (2 B read + 1 B written) and the 16-bit rows through a separate activation
    assert staged.bytes == pytest.approx(weights + 2 * (4096 * (2 + 3) + 28672 * 2) + 2 * (28672 + 14336) * 2
                                         + 2 * (14336 * (2 + 3) + 4096 * 2) + 3 * 4096 * 2)
    assert staged.bytes > fused.bytes and staged.seconds > fused.seconds
    assert kernels.moe_experts(fused_rates, weight_format="fp8_block", **args) == kernels.moe_experts(
        RATES, weight_format="fp8_block", **args)
    assert kernels.moe_experts(fused_rates.as_ideal(), weight_format="fp8_e4m3", **args) == kernels.moe_experts(
        RATES.as_ideal(), weight_format="fp8_e4m3", **args)


def test_moe_expert_parallel_share_and_padding() -> None:
    # 256 tokens, top-8 of 256 experts, 32 of them on this GPU: 256 x 8 / 8 = 256 pairs here
    c = kernels.moe_experts(IDEAL, tokens=256, experts_local=32, experts_total=256, top_k=8, hidden=7168,
                            expert_width=2048, gated=True, weight_bits=8, compute="fp8")
    assert c.flops == pytest.approx(2 * 256 * 8 / 8 * 3 * 7168 * 2048)
    distinct = 32 * (1 - (1 - 8 / 256) ** 256)
    assert c.weight_bytes == pytest.approx(distinct * 3 * 7168 * 2048)
    # padding: 8 pairs per touched expert are computed as a 64-row tile, so the real kernel is slower than ideal
    real = kernels.moe_experts(replace(RATES, floors={**RATES.floors, "moe": 0.0}), tokens=256, experts_local=32,
                               experts_total=256, top_k=8, hidden=7168, expert_width=2048, gated=True, weight_bits=8,
                               compute="fp8")
    assert real.seconds > c.seconds


def test_expected_max_of_standard_normals() -> None:
    """E[max of n standard normals]: 1 / sqrt(pi) for two (closed form), and the tabulated 1.0294 / 1.4236 /
    1.7660 for 4 / 8 / 16."""
    assert kernels.expected_max_normal(1) == 0.0
    assert kernels.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    for n, value in ((4, 1.0294), (8, 1.4236), (16, 1.7660)):
        assert kernels.expected_max_normal(n) == pytest.approx(value, abs=1e-4)


def _busiest_rank_sampled(experts: int, top_k: int, tokens: int, ranks: int, alpha: float | None,
                          trials: int = 300) -> float:
    """Brute force: the busiest rank's (token, expert) rows over the mean rank's, averaged over draws; uniform
    routing (each token picks top_k distinct experts at random) or aiconfigurator's power-law loads, step by step as
    its collector draws them (helper.py ``_generate_power_law_distribution``): i.i.d. on [1, 0.8 T] (T k > E, else
    [0.01, 2]), scaled to T k rows and rounded, capped at T, the capped rows and then the missing ones added one at
    a time round-robin over the ranks, each to its least-loaded expert below T (``_round_robin_adjust_per_rank``)."""
    rng = random.Random(7)  # noqa: S311 - seeded test data
    per_rank, ratios = experts // ranks, []
    for _ in range(trials):
        if alpha is None:
            counts = [0] * experts
            for _ in range(tokens):
                for e in rng.sample(range(experts), top_k):
                    counts[e] += 1
        else:
            g = 1 - alpha
            lo, hi = (1.0, 0.8 * tokens) if tokens * top_k > experts else (0.01, 2.0)
            loads = [((hi ** g - lo ** g) * rng.random() + lo ** g) ** (1 / g) for _ in range(experts)]
            counts = [round(x / sum(loads) * tokens * top_k) for x in loads]
            counts = [min(c, tokens) for c in counts]
            spare = tokens * top_k - sum(counts)  # the capped rows and the rounding's, dealt one at a time
            step = 1 if spare > 0 else -1
            while spare:
                dealt = False
                for r in range(ranks):
                    local = range(r * per_rank, (r + 1) * per_rank)
                    if step > 0:
                        room = [i for i in local if counts[i] < tokens]
                        pick = min(room, key=lambda i: counts[i]) if room else None
                    else:
                        pick = max(local, key=lambda i: counts[i]) if any(counts[i] for i in local) else None
                    if pick is not None and spare:
                        counts[pick] += step
                        spare, dealt = spare - step, True
                if not dealt:
                    break
        sums = [sum(counts[r * per_rank:(r + 1) * per_rank]) for r in range(ranks)]
        ratios.append(max(sums) / (tokens * top_k / ranks))
    return statistics.fmean(ratios)


@pytest.mark.parametrize(("tokens", "ranks"), [(64, 8), (16, 4)])
def test_rank_imbalance_against_sampled_uniform_routing(tokens: int, ranks: int) -> None:
    """The busiest expert-parallel rank's rows over the mean rank's under uniform top-k picks, against sampling
    the routing itself: the normal approximation within 12 %."""
    model = kernels.rank_imbalance(128, 8, tokens, ranks)
    assert model == pytest.approx(_busiest_rank_sampled(128, 8, tokens, ranks, None, 60), rel=0.12)


@pytest.mark.parametrize(("experts", "top_k", "tokens", "ranks"), [
    (128, 8, 4096, 8), (128, 8, 4096, 4), (128, 8, 512, 16), (128, 4, 2048, 4), (32, 4, 512, 4), (8, 2, 1024, 4),
    (8, 2, 2048, 8), (8, 2, 300, 2), (8, 2, 3, 4)])
def test_rank_imbalance_matches_aiconfigurators_power_law_sampler(experts: int, top_k: int, tokens: int,
                                                                  ranks: int) -> None:
    """Under aiconfigurator's power-law workload the busiest rank, against its collector's integer draw step by
    step (400 draws): within 5 % (the sampling error of both means), Mixtral's 8 experts over 4 or 8 ranks too."""
    routing = kernels.Routing("power-law", 1.2)
    sampled = _busiest_rank_sampled(experts, top_k, tokens, ranks, 1.2, 400)
    assert kernels.rank_imbalance(experts, top_k, tokens, ranks, routing) == pytest.approx(sampled, rel=0.05)


def test_rank_imbalance_bounds_and_trends() -> None:
    power = kernels.Routing("power-law", 1.2)
    assert kernels.rank_imbalance(128, 8, 4096, 1, power) == 1.0  # one rank holds every expert
    for routing in (kernels.UNIFORM, power, kernels.Routing("zipf", 1.0)):
        by_ranks = [kernels.rank_imbalance(128, 8, 4096, r, routing) for r in (2, 4, 8, 16, 32)]
        assert all(1.0 <= a <= b for a, b in zip(by_ranks, by_ranks[1:], strict=False))
        assert by_ranks[-1] <= 32
    uniform = [kernels.rank_imbalance(128, 8, t, 8) for t in (8, 64, 512, 4096, 16384)]
    assert all(a > b for a, b in zip(uniform, uniform[1:], strict=False)) and uniform[-1] < 1.02  # sums even out
    assert kernels.rank_imbalance(128, 8, 4096, 8, power) > kernels.rank_imbalance(128, 8, 4096, 8) + 0.5
    # no expert takes a token twice, so a rank of n experts holds at most n T rows: E / k times the mean rank's
    for tokens in (4, 64, 4096, 140_000):
        assert 1.0 < kernels.rank_imbalance(8, 2, tokens, 8, power) <= 4.0
        assert kernels.rank_imbalance(8, 2, tokens, 4, power) <= 4.0
    alpha_one = kernels.Routing("power-law", 1.0)  # the inverse CDF's logarithmic case
    assert 1.0 < kernels.rank_imbalance(128, 8, 4096, 8, alpha_one) < 8.0


def test_moe_expert_parallel_prefill_waits_for_the_busiest_rank() -> None:
    """Under expert parallelism a prefill's compute is the busiest rank's rows; one decode token keeps one tile per
    touched expert (no extra unpacking), and ideal mode keeps the mean rank."""
    rates = replace(RATES, floors={**RATES.floors, "moe": 0.0})
    power = kernels.Routing("power-law", 1.2)

    def cost(tokens: int, routing: kernels.Routing, local: int = 16, r: Rates = rates) -> kernels.Cost:
        return kernels.moe_experts(r, tokens=tokens, experts_local=local, experts_total=128, top_k=8, hidden=4096,
                                   expert_width=1536, gated=True, weight_bits=8, compute="fp8", routing=routing)

    busiest = kernels.rank_imbalance(128, 8, 16384, 8, power)
    skewed, whole = cost(16384, power), cost(16384, power, local=128)
    assert skewed.flops == pytest.approx(whole.flops / 8 * busiest)
    assert skewed.seconds > 1.5 * whole.seconds / 8
    assert cost(16384, kernels.UNIFORM).flops == pytest.approx(cost(16384, kernels.UNIFORM, local=128).flops / 8,
                                                               rel=0.02)
    assert cost(16384, power, r=IDEAL).flops == pytest.approx(cost(16384, power, 128, IDEAL).flops / 8)
    assert cost(1, power).weight_bytes == pytest.approx(cost(1, power, local=128).weight_bytes / 8)


def test_moe_expert_parallel_every_row_by_hand() -> None:
    """A kernel that, under ep with the tokens on every rank, activates and combines all T k rows and writes zeros
    for the other ranks' rows (Rates.moe_ep_every_row) moves exactly those bytes more: uniform routing, 4,096
    tokens, top-8 of 128 over 8 ranks (16 local experts), hidden 4096, width 1536, bf16 activations."""
    rates = replace(RATES, floors={**RATES.floors, "moe": 0.0})
    tokens, k, hidden, width = 4096, 8, 4096, 1536

    def cost(every_row: bool, replicated: bool = True, local: int = 16, r: Rates = rates,
             formats: frozenset[str] = frozenset({"*"})) -> kernels.Cost:
        return kernels.moe_experts(replace(r, moe_ep_every_row=formats if every_row else frozenset()), tokens=tokens,
                                   experts_local=local, experts_total=128, top_k=k, hidden=hidden, expert_width=width,
                                   gated=True, weight_bits=8, compute="fp8", replicated=replicated,
                                   weight_format="fp8_block")

    mine = tokens * k / 8 * kernels.rank_imbalance(128, k, tokens, 8)  # the busiest rank's rows
    others = tokens * k - mine
    # zeros for the others' gate/up (2 x width) and down (hidden) rows; the activation reads 2 x width and writes
    # width for them; the combine reads their hidden row (2 bytes each)
    extra = others * (2 * width + hidden) * 2 + others * 3 * width * 2 + others * hidden * 2
    assert cost(True).bytes - cost(False).bytes == pytest.approx(extra, rel=1e-9)
    assert cost(True).flops == cost(False).flops and cost(True).seconds > cost(False).seconds
    assert cost(True, replicated=False).bytes == cost(False).bytes  # dispatched by an all-to-all: own rows only
    assert cost(True, local=128).bytes == cost(False, local=128).bytes  # no expert parallelism
    assert cost(True, r=IDEAL).bytes == cost(False, r=IDEAL).bytes
    assert cost(True, formats=frozenset({"fp8_block"})) == cost(True)  # listed for the experts' own format
    assert cost(True, formats=frozenset({"bf16", "nvfp4"})) == cost(False)  # listed for other formats only


def _brute_tiles(n: int, q: float, tile: int) -> float:
    """E[ceil(X / tile)] for X ~ Binomial(n, q), summed over every count of the pmf."""
    return math.fsum(math.comb(n, x) * q**x * (1 - q) ** (n - x) * -(-x // tile) for x in range(n + 1))


CASES = [(n, q, tile) for n in (1, 7, 64, 300, 1000) for q in (1e-4, 0.004, 0.03, 0.25, 0.5, 0.9)
         for tile in (1, 2, 16, 64, 128)]  # q 1/2: the Fourier term at pi is exactly 0


@pytest.mark.parametrize("method", ["pmf", "fourier", "cheaper"])
def test_binomial_tiles_is_the_exact_sum_over_the_pmf(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both of binomial_tiles' methods (forced one at a time, and the one it picks) against the brute-force sum:
    narrow counts (sd < tile / 2) and wide ones (sd >= tile / 2, e.g. n 1000, q 0.25: sd 13.7 >= 16 / 2)."""
    if method != "cheaper":
        monkeypatch.setattr(kernels, "_FOURIER_COST", math.inf if method == "pmf" else 0.0)
    worst = max(abs(kernels.binomial_tiles(n, q, tile) / _brute_tiles(n, q, tile) - 1) for n, q, tile in CASES)
    assert worst < 1e-9
    assert any(math.sqrt(n * q * (1 - q)) >= tile / 2 for n, q, tile in CASES)  # wide counts are in the set


@pytest.mark.parametrize(("n", "q", "tile"), [(10**8, 1e-6, 16), (10**7, 3e-6, 32), (5 * 10**7, 1e-6, 16)])
def test_binomial_tiles_methods_agree_at_huge_counts(n: int, q: float, tile: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """At n ~ 1e7-1e8 lgamma's peak is off by ~1e-7 relative; the pmf sum divides by the mass it visited, so it
    agrees with the Fourier series (complex powers, no lgamma) to 1e-9 (it did to 2e-7 before)."""
    monkeypatch.setattr(kernels, "_FOURIER_COST", math.inf)
    by_pmf = kernels.binomial_tiles(n, q, tile)
    monkeypatch.setattr(kernels, "_FOURIER_COST", 0.0)
    assert by_pmf == pytest.approx(kernels.binomial_tiles(n, q, tile), rel=1e-9)


def test_binomial_tiles_edges() -> None:
    assert kernels.binomial_tiles(0, 0.5, 16) == 0 and kernels.binomial_tiles(10, 0.0, 16) == 0
    assert kernels.binomial_tiles(40, 1.0, 16) == 3  # every token: ceil(40 / 16)
    assert kernels.binomial_tiles(100, 0.3, 1) == pytest.approx(30)  # tiles of one row: the mean
    # one token: P(X = 1) = q tiles
    assert kernels.binomial_tiles(1, 0.2, 64) == pytest.approx(0.2)
    # a count far wider than the tile: every nonzero count pads (tile - 1) / 2 rows on average
    n, q, tile = 200_000, 0.25, 16
    assert kernels.binomial_tiles(n, q, tile) == pytest.approx((n * q + (tile - 1) / 2) / tile, rel=1e-12)


def _monte_carlo_rows(experts: int, top_k: int, tokens: int, trials: int, seed: int) -> tuple[float, float]:
    """Route ``tokens`` tokens, each to ``top_k`` distinct experts drawn uniformly, ``trials`` times; mean and
    standard error of the rows the grouped GEMMs compute at moe_tile_rows' blended tile heights."""
    rng = random.Random(seed)  # noqa: S311 - seeded test data
    lower, upper, w = kernels.moe_tile_rows(tokens, top_k, experts)
    samples = []
    for _ in range(trials):
        counts = [0] * experts
        for _ in range(tokens):
            for e in rng.sample(range(experts), top_k):
                counts[e] += 1
        rows_at = [sum(t * -(-c // t) for c in counts) for t in (lower, upper)]
        samples.append((1 - w) * rows_at[0] + w * rows_at[1])
    return statistics.fmean(samples), statistics.stdev(samples) / math.sqrt(trials)


@pytest.mark.parametrize(("experts", "top_k", "tokens"), [(8, 2, 3), (8, 2, 200), (64, 6, 50), (128, 8, 300)])
def test_routed_rows_matches_monte_carlo_routing(experts: int, top_k: int, tokens: int) -> None:
    """Top-k routing without replacement: each expert's count is still Binomial(T, k / E), so the expected rows
    are the binomial tile sum (the counts' dependence does not change an expectation)."""
    mean, stderr = _monte_carlo_rows(experts, top_k, tokens, 400, seed=experts * tokens)
    distinct, rows, tiles = kernels.routed_rows(experts, top_k, tokens)
    assert abs(rows - mean) < 4 * stderr + 1e-9 * mean
    assert distinct == pytest.approx(kernels.distinct_experts(experts, top_k, tokens))
    lower, upper, w = kernels.moe_tile_rows(tokens, top_k, experts)
    assert distinct - 1e-9 <= tiles and lower * tiles - 1e-6 <= rows <= upper * tiles + 1e-6


def test_routed_rows_skewed_is_the_sum_over_each_experts_binomial() -> None:
    probabilities = kernels._zipf_probabilities(16, 2, 1.0)
    lower, upper, w = kernels.moe_tile_rows(100, 2, 16)
    expected = sum((1 - w) * lower * _brute_tiles(100, q, lower) + w * upper * _brute_tiles(100, q, upper)
                   for q in probabilities)
    assert kernels.routed_rows(16, 2, 100, kernels.Routing("zipf", 1.0))[1] == pytest.approx(expected, rel=1e-9)


def _aiconfigurator_power_law(experts: int, top_k: int, tokens: int, alpha: float, trials: int,
                              seed: int) -> tuple[float, float]:
    """Mean (distinct experts, rows at moe_tile_rows' blended heights) over ``trials`` draws of aiconfigurator's
    power-law workload (collector helper ``_generate_power_law_distribution``, ep 1, since 2026-02-10): loads
    i.i.d. by inverse-CDF sampling of x^-alpha on [1, 0.8 T] (T k > E) or [0.01, 2], scaled to T k and rounded
    half to even like torch.round; counts clamped to T, the clamped rows and then the missing ones added one at
    a time to the least-loaded expert with room (torch.argmin: the first of ties), a surplus taken from the
    most-loaded."""
    rng = random.Random(seed)  # noqa: S311 - seeded test data
    lo, hi = (1.0, 0.8 * tokens) if tokens * top_k > experts else (0.01, 2.0)
    g = 1 - alpha
    lower, upper, w = kernels.moe_tile_rows(tokens, top_k, experts)
    distinct = rows = 0.0

    def add(counts: list[int], n: int) -> None:
        for _ in range(n):
            room = [i for i in range(experts) if counts[i] < tokens]
            if not room:
                return
            counts[min(room, key=lambda i: counts[i])] += 1

    for _ in range(trials):
        x = [((hi**g - lo**g) * rng.random() + lo**g) ** (1 / g) for _ in range(experts)]
        total = sum(x)
        counts = [round(v / total * tokens * top_k) for v in x]
        excess = sum(max(0, c - tokens) for c in counts)
        counts = [min(c, tokens) for c in counts]
        add(counts, excess)
        missing = tokens * top_k - sum(counts)
        add(counts, max(missing, 0))
        for _ in range(max(-missing, 0)):
            counts[max(range(experts), key=lambda i: counts[i])] -= 1
        distinct += sum(c > 0 for c in counts)
        rows += (1 - w) * sum(lower * -(-c // lower) for c in counts) + w * sum(upper * -(-c // upper)
                                                                               for c in counts)
    return distinct / trials, rows / trials


@pytest.mark.parametrize(("experts", "top_k", "alpha", "tolerance"), [
    (128, 8, 1.2, 0.02), (256, 8, 1.01, 0.02), (128, 4, 1.2, 0.02), (32, 4, 1.2, 0.08), (8, 2, 1.2, 0.12)])
def test_power_law_routing_matches_aiconfigurators_sampler(experts: int, top_k: int, alpha: float,
                                                           tolerance: float) -> None:
    """The closed form (the loads' sum at its mean) against a Monte Carlo of the sampler itself: within 2 % at
    E >= 128; with 8 or 32 experts the sum of a few heavy-tailed loads strays from its mean."""
    routing = kernels.Routing("power-law", alpha)
    for tokens in (1, 2, 4, 16, 64, 256, 2048):
        distinct, rows = _aiconfigurator_power_law(experts, top_k, tokens, alpha, 120, seed=tokens)
        got_distinct, got_rows, _ = kernels.routed_rows(experts, top_k, tokens, routing)
        assert got_distinct == pytest.approx(distinct, rel=tolerance), tokens
        assert got_rows == pytest.approx(rows, rel=tolerance), tokens
        assert kernels.distinct_experts(experts, top_k, tokens, routing) == pytest.approx(got_distinct, rel=0.02)


@pytest.mark.parametrize(("experts", "top_k", "tokens", "alpha"), [
    (128, 8, 4096, 1.2), (256, 8, 300, 1.01), (8, 2, 2000, 1.2), (128, 8, 10, 2.0), (64, 4, 100, 1.0)])
def test_power_law_sums_close_with_their_integral(experts: int, top_k: int, tokens: int, alpha: float) -> None:
    """The survival sums (64 terms, then the closed-form excess) against every term summed, and the excess
    against its integral by the trapezoid rule: the special exponents 1 and 2 (logarithms) included."""
    loads = kernels._power_law_loads(experts, top_k, tokens, alpha)
    most = loads.hi * loads.rows_per_unit
    for start, step in ((0.5, 1.0), (0.5, 16.0), (0.5, 128.0)):
        brute = math.fsum(loads.survival(start + j * step) for j in range(int(most / step) + 2))
        assert loads.sum_survival(start, step) == pytest.approx(brute, rel=2e-3, abs=1e-9)
    y0 = most / 5
    n = 20000
    h = (most - y0) / n
    trapezoid = h * (math.fsum(loads.survival(y0 + i * h) for i in range(1, n))
                     + (loads.survival(y0) + loads.survival(most)) / 2)
    assert loads.excess(y0) == pytest.approx(trapezoid, rel=1e-4)


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 256), st.integers(1, 8), st.floats(0.2, 20_000), st.floats(0.5, 2.5))
def test_power_law_routing_bounds(experts: int, k: int, tokens: float, alpha: float) -> None:
    """Any shape, token count (fractional ones round to whole tokens, as the sampler draws) and exponent (1 and 2
    included, where the integrals turn logarithmic): between k and E experts touched, finite rows in whole tiles."""
    k = min(k, experts)
    routing = kernels.Routing("power-law", alpha)
    distinct, rows, tiles = kernels.routed_rows(experts, k, max(1, round(tokens)), routing)
    assert min(k, experts) - 1e-9 <= distinct <= experts + 1e-9
    assert math.isfinite(rows) and rows >= kernels.MOE_TILE_MIN * min(k, experts) - 1e-6
    assert distinct - 1e-9 <= tiles
    assert kernels.MOE_TILE_MIN * tiles - 1e-6 <= rows <= kernels.MOE_TILE_MAX * tiles + 1e-6
    assert kernels.distinct_experts(experts, k, tokens, routing) == pytest.approx(distinct)


def test_power_law_routing_reads_fewer_experts_than_uniform_at_mid_batch() -> None:
    """aiconfigurator's power-law workload at 16 tokens of Qwen3-30B-A3B's top-8 of 128: ~59 experts against
    uniform routing's 128 (1 - (1 - 8/128)^16) = 82.4; one token still reads its own 8."""
    routing = kernels.Routing("power-law", 1.2)
    assert kernels.distinct_experts(128, 8, 16, routing) == pytest.approx(59.1, abs=1.5)
    assert kernels.distinct_experts(128, 8, 16) == pytest.approx(82.42, abs=0.01)
    assert kernels.distinct_experts(128, 8, 1, routing) == pytest.approx(8)


@pytest.mark.parametrize(("text", "expected"), [
    ("uniform", kernels.UNIFORM), ("zipf:0.8", kernels.Routing("zipf", 0.8)),
    ("Power-Law:1.2", kernels.Routing("power-law", 1.2))])
def test_parse_routing(text: str, expected: kernels.Routing) -> None:
    assert kernels.parse_routing(text) == expected
    assert kernels.parse_routing(str(expected)) == expected


@pytest.mark.parametrize("text", ["zipf", "power-law:", "power-law:x", "lognormal:1", "zipf:0", "zipf:-1",
                                  "power-law:nan", "power-law:9", "uniform:1"])
def test_parse_routing_rejects(text: str) -> None:
    from tfcalc.errors import UsageError

    with pytest.raises(UsageError):
        kernels.parse_routing(text)


@pytest.mark.parametrize(("mean", "expected"), [
    (1.0, (16, 16, 0.0)), (16.0, (16, 16, 0.0)), (24.0, (16, 32, math.log2(1.5))), (32.0, (32, 64, 0.0)),
    (100.0, (64, 128, math.log2(100 / 64))), (128.0, (128, 128, 0.0)), (5000.0, (128, 128, 0.0)),
])
def test_moe_tile_rows_powers_of_two_blended(mean: float, expected: tuple[int, int, float]) -> None:
    lower, upper, w = kernels.moe_tile_rows(mean * 64 / 8, 8, 64)  # T k / E = mean
    assert (lower, upper) == expected[:2] and w == pytest.approx(expected[2])


def test_moe_tile_rows_effective_height_is_continuous_and_rising() -> None:
    """The blended height (1 - w) lower + w upper rises with the tokens and meets the next power where the
    kernels switch (w -> 1 as the mean reaches 2 x lower)."""
    heights = []
    for i in range(1, 3000):
        lower, upper, w = kernels.moe_tile_rows(i / 10, 1, 1)
        heights.append((1 - w) * lower + w * upper)
    assert all(b >= a for a, b in zip(heights, heights[1:], strict=False))
    assert max(b - a for a, b in zip(heights, heights[1:], strict=False)) < 0.2  # no jump at 32, 64, 128
    assert heights[0] == 16 and heights[-1] == 128


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([(8, 2), (64, 6), (128, 8), (256, 8)]), st.integers(1, 6000), st.integers(1, 300),
       st.sampled_from(["bf16", "fp8"]), st.sampled_from([0.0, 1.2]))
def test_moe_time_never_falls_with_more_tokens(shape: tuple[int, int], tokens: int, more: int, compute: str,
                                               skew: float) -> None:
    experts, top_k = shape
    bits = 16 if compute == "bf16" else 8

    def seconds(t: int) -> float:
        return kernels.moe_experts(RATES, tokens=t, experts_local=experts, experts_total=experts, top_k=top_k,
                                   hidden=2048, expert_width=768, gated=True, weight_bits=bits, compute=compute,
                                   routing=kernels.Routing("zipf", skew) if skew else kernels.UNIFORM).seconds

    assert seconds(tokens + more) >= seconds(tokens) * (1 - 1e-12)


def test_grouped_efficiency_per_dtype_and_expert_floors() -> None:
    rates = replace(RATES, moe_efficiency_by_dtype={"bf16": 0.8, "fp8": 0.4, "fp4": 0.9},
                    moe_expert_floors={"fp8": 0.5e-6})
    assert rates.grouped_efficiency("fp8") == 0.4 and rates.grouped_efficiency("bf16") == 0.8
    assert rates.grouped_efficiency("bf16", dequant="fp4") == 0.9  # weight-only MXFP4 experts: their format
    assert rates.grouped_efficiency("int8") == 0.8  # the chip has no int8 peak: bf16, as its GEMMs
    assert RATES.grouped_efficiency("fp8") == 0.5 and rates.as_ideal().grouped_efficiency("fp8") == 1.0
    # fp8 experts run at the fp8 entry, bf16 ones at the bf16 entry; 32 local fp8 experts add 32 x 0.5 us
    args = {"tokens": 8192, "experts_local": 32, "experts_total": 256, "top_k": 8, "hidden": 7168,
            "expert_width": 2048, "gated": True, "weight_bits": 8, "compute": "fp8"}
    mine = kernels.moe_experts(rates, **args)
    same = kernels.moe_experts(replace(RATES, moe_efficiency=0.4), **args)
    assert mine.floor_seconds == pytest.approx(25e-6 + 32 * 0.5e-6)
    assert mine.seconds - mine.floor_seconds == pytest.approx(same.seconds - same.floor_seconds)
    assert mine.seconds > kernels.moe_experts(RATES, **args).seconds  # compute-bound at 8192 tokens: 0.4 < 0.5
    bf16 = {**args, "weight_bits": 16, "compute": "bf16"}
    assert (kernels.moe_experts(rates, **bf16).seconds
            == pytest.approx(kernels.moe_experts(replace(RATES, moe_efficiency=0.8), **bf16).seconds))
    assert kernels.moe_experts(rates, **bf16).floor_seconds == 25e-6  # bf16: no per-expert cost


def test_grouped_k0_scales_compute_bound_expert_gemms_by_k_plus_k0() -> None:
    """An engine's moe_k0 replaces the default grouped K0 (MOE_K0) in its grouped GEMMs only: with both expert
    GEMMs' K = 4096 and the layer compute-bound (bandwidth unbounded), the kernel's work scales by (K + K0) / (K +
    MOE_K0), its floor does not move, and a dense GEMM keeps GEMM_K0."""
    fast_memory = replace(RATES, memory_bandwidth=1e30)
    wide = replace(fast_memory, moe_k0={"fp8": 4096.0})
    args = {"tokens": 16384, "experts_local": 8, "experts_total": 8, "top_k": 2, "hidden": 4096,
            "expert_width": 4096, "gated": True, "weight_bits": 8, "compute": "fp8"}
    base, mine = kernels.moe_experts(fast_memory, **args), kernels.moe_experts(wide, **args)
    assert base.bound == mine.bound == "compute" and mine.floor_seconds == base.floor_seconds
    work = (mine.seconds - mine.floor_seconds) / (base.seconds - base.floor_seconds)
    assert work == pytest.approx((4096 + 4096) / (4096 + MOE_K0["fp8"]), rel=1e-9)
    assert kernels.gemm(wide, 8192, 8192, 4096, 8, "fp8") == kernels.gemm(fast_memory, 8192, 8192, 4096, 8, "fp8")
    bf16 = {**args, "weight_bits": 16, "compute": "bf16"}
    assert kernels.moe_experts(wide, **bf16) == kernels.moe_experts(fast_memory, **bf16)


def test_per_tile_dequantisation_unpacks_each_experts_weights_once_per_row_tile() -> None:
    """An engine whose weight-only MoE kernel unpacks the weights in every row tile's main loop (moe_dequant_per_tile)
    pays tiles / distinct experts times the once-per-expert unpacking; with the CUDA cores the bottleneck the extra
    time is exactly that multiple of the once-per-expert unpacking time. Balanced single-tile loads do not move."""
    slow_alu = replace(RATES, alu_ops_per_s=1e9)  # dequantisation bounds every stage
    per_tile = replace(slow_alu, moe_dequant_per_tile=frozenset({"fp4"}))
    routing = kernels.parse_routing("power-law:1.2")
    args = {"tokens": 1024, "experts_local": 128, "experts_total": 128, "top_k": 4, "hidden": 2880,
            "expert_width": 2880, "gated": True, "weight_bits": 4.25, "compute": "bf16", "dequant": "fp4",
            "routing": routing}
    once, mine = kernels.moe_experts(slow_alu, **args), kernels.moe_experts(per_tile, **args)
    assert once.bound == mine.bound == "dequant"
    distinct, _, tiles = kernels.routed_rows(128, 4, 1024, routing)
    assert tiles > 1.2 * distinct  # hot experts run several tiles
    unpack_once = distinct * 2880 * (2 * 2880 + 2880) * kernels.DEQUANT_OPS["fp4"] / 1e9
    assert mine.seconds - once.seconds == pytest.approx(unpack_once * (tiles / distinct - 1), rel=1e-9)
    small = {**args, "tokens": 16, "routing": kernels.UNIFORM}  # 0.5 rows per expert: one tile each
    assert kernels.moe_experts(per_tile, **small).seconds == pytest.approx(
        kernels.moe_experts(slow_alu, **small).seconds, rel=0.02)
    native = {**args, "compute": "fp4", "dequant": ""}
    assert kernels.moe_experts(per_tile, **native) == kernels.moe_experts(slow_alu, **native)


def test_a_storage_formats_entries_come_before_its_compute_dtypes() -> None:
    """An engine measured its block-scale fp8 MoE apart from its per-tensor one: the fp8_block entries (efficiency,
    K0, per-expert floor) price fp8_block experts; per-tensor fp8 takes the compute dtype's entries and MOE_K0."""
    rates = replace(RATES, moe_efficiency_by_dtype={"fp8": 0.4, "fp8_block": 0.8}, moe_k0={"fp8_block": 2048.0},
                    moe_expert_floors={"fp8_block": 1e-6})
    assert rates.grouped_efficiency("fp8", weight_format="fp8_block") == 0.8
    assert rates.grouped_efficiency("fp8", weight_format="fp8_e4m3") == rates.grouped_efficiency("fp8") == 0.4
    assert rates.gemm_flops_per_s("fp8", 1024, True, "fp8_e4m3") == pytest.approx(
        rates.gemm_flops_per_s("fp8", 1024) * (1024 + GEMM_K0["fp8"]) / (1024 + MOE_K0["fp8"]))
    assert rates.gemm_flops_per_s("fp8", 1024, True, "fp8_block") == pytest.approx(
        rates.gemm_flops_per_s("fp8", 1024) * (1024 + GEMM_K0["fp8"]) / (1024 + 2048))
    args = {"tokens": 64, "experts_local": 32, "experts_total": 256, "top_k": 8, "hidden": 7168,
            "expert_width": 2048, "gated": True, "weight_bits": 8, "compute": "fp8"}
    block = kernels.moe_experts(rates, **args, weight_format="fp8_block")
    tensor = kernels.moe_experts(rates, **args, weight_format="fp8_e4m3")
    assert block.floor_seconds == pytest.approx(25e-6 + 32 * 1e-6) and tensor.floor_seconds == 25e-6
    mx = replace(rates, moe_format_floors={"mxfp4": 40e-6})  # a format's own fixed cost replaces the moe floor
    fp4 = {**args, "weight_bits": 4.25, "compute": "bf16", "dequant": "fp4"}
    assert kernels.moe_experts(mx, **fp4, weight_format="mxfp4").floor_seconds == pytest.approx(40e-6)
    assert kernels.moe_experts(mx, **fp4, weight_format="nvfp4").floor_seconds == pytest.approx(25e-6)


def test_ideal_moe_ignores_grouped_efficiency_and_expert_floors() -> None:
    """The speed-of-light figure is the roofline whatever the preset says about real kernels."""
    rates = replace(RATES, moe_efficiency_by_dtype={"bf16": 0.3, "fp8": 0.2}, moe_expert_floors={"fp8": 5e-6})
    for tokens in (1, 64, 4096):
        args = {"tokens": tokens, "experts_local": 32, "experts_total": 256, "top_k": 8, "hidden": 7168,
                "expert_width": 2048, "gated": True, "weight_bits": 8, "compute": "fp8"}
        assert kernels.moe_experts(rates.as_ideal(), **args) == kernels.moe_experts(IDEAL, **args)


def test_weight_only_experts_take_their_format_entry_or_the_gpus_16_bit_value() -> None:
    """A weight-only MoE kernel is a kernel of its own. fp8 experts forced to 16-bit compute (--compute-dtype bf16)
    on a chip with fp8 tensor cores take the GPU preset's 16-bit value (``moe_efficiency``), neither the fp8 entry
    (measured on the native W8A8 kernels) nor a bf16 entry an engine measured on its native bf16 kernel; a format
    the chip cannot run natively (fp4 here) looks up its own entry first. Native kernels take their dtype's."""
    rates = replace(RATES, moe_efficiency=0.8, moe_efficiency_by_dtype={"bf16": 0.7, "fp8": 0.4, "fp4": 0.9})
    assert "fp8" in rates.peak_flops and "fp4" not in rates.peak_flops
    assert rates.grouped_efficiency("bf16", dequant="fp8") == 0.8
    assert rates.grouped_efficiency("bf16", dequant="int4") == 0.8
    assert rates.grouped_efficiency("fp8") == 0.4 and rates.grouped_efficiency("bf16", dequant="fp4") == 0.9
    assert rates.grouped_efficiency("bf16") == 0.7
    own = replace(rates, moe_efficiency_by_dtype={**rates.moe_efficiency_by_dtype, "mxfp4": 0.3})
    assert own.grouped_efficiency("bf16", "fp4", "mxfp4") == 0.3  # a storage format's entry comes first
    assert own.grouped_efficiency("bf16", "fp4", "nvfp4") == 0.9


def test_experts_upcast_at_load_stream_their_wider_bits_and_unpack_nothing() -> None:
    """An engine that upcast a format's experts at load (moe_stream_bits) streams them at those bits and runs no
    unpacking, however many instructions per weight the format would cost: at one token (memory-bound) the kernel
    is the 16-bit kernel by hand. Other formats, and the pure roofline (the checkpoint's bits), are untouched."""
    slow_alu = replace(RATES, alu_ops_per_s=1e9, moe_dequant_ops={"fp4": 200.0})
    upcast = replace(slow_alu, moe_stream_bits={"mxfp4": 16.0})
    args = {"tokens": 1, "experts_local": 128, "experts_total": 128, "top_k": 4, "hidden": 2880,
            "expert_width": 2880, "gated": True, "weight_bits": 4.25, "compute": "bf16", "dequant": "fp4"}
    mx = kernels.moe_experts(upcast, **args, weight_format="mxfp4")
    assert mx.weight_bytes == pytest.approx(4 * 3 * 2880 * 2880 * 2) and mx.bound == "memory"
    sixteen = kernels.moe_experts(slow_alu, **{**args, "weight_bits": 16, "dequant": ""}, weight_format="bf16")
    assert mx.seconds == pytest.approx(sixteen.seconds, rel=1e-12)
    assert kernels.moe_experts(upcast, **args, weight_format="nvfp4") == kernels.moe_experts(
        slow_alu, **args, weight_format="nvfp4")
    assert kernels.moe_experts(upcast, **args, weight_format="nvfp4").bound == "dequant"
    assert kernels.moe_experts(upcast.as_ideal(), **args, weight_format="mxfp4").weight_bytes == pytest.approx(
        4 * 3 * 2880 * 2880 * 4.25 / 8)


def test_fused_moe_stream_applies_while_each_expert_gets_one_smallest_tile() -> None:
    """moe_memory_efficiency: the GPU's fused-MoE weight stream for a format (the whole layer's experts in one
    kernel) replaces the GEMV figure while each expert gets at most one smallest row tile (T k / E <= 8 rows on
    average: Mixtral's top-2 of 8 up to 32 tokens, Qwen3's top-8 of 128 up to 128), whether the experts sit on one
    GPU or are split by expert parallelism (2 local of 8 at ep 4); not above, not for other formats, not under a
    calibrated curve or after --memory-efficiency; by hand on a memory-bound step."""
    assert kernels.moe_one_tile_per_expert(32, 2, 8) and not kernels.moe_one_tile_per_expert(33, 2, 8)
    assert kernels.moe_one_tile_per_expert(128, 8, 128) and not kernels.moe_one_tile_per_expert(129, 8, 128)
    base = replace(RATES, floors={**RATES.floors, "moe": 0.0})
    fast = replace(base, moe_memory_efficiency={"bf16": 0.95})
    args = {"experts_local": 8, "experts_total": 8, "top_k": 2, "hidden": 4096, "expert_width": 14336,
            "gated": True, "weight_bits": 16, "compute": "bf16", "weight_format": "bf16"}
    slow, quick = kernels.moe_experts(base, tokens=4, **args), kernels.moe_experts(fast, tokens=4, **args)
    assert slow.bound == quick.bound == "memory" and quick.bytes == slow.bytes
    stream = base.memory_bandwidth * base.memory_efficiency
    assert slow.seconds - quick.seconds == pytest.approx(slow.bytes / stream - slow.bytes / (0.95 * 4e12), rel=1e-9)
    assert kernels.moe_experts(fast, tokens=33, **args) == kernels.moe_experts(base, tokens=33, **args)
    assert kernels.moe_experts(fast, tokens=32, **args).seconds < kernels.moe_experts(base, tokens=32, **args).seconds
    assert kernels.moe_experts(fast, tokens=4, **{**args, "weight_format": "fp8_block"}) == kernels.moe_experts(
        base, tokens=4, **{**args, "weight_format": "fp8_block"})
    curve = ((1e6, 2e12), (1e9, 3e12))
    assert kernels.moe_experts(replace(fast, bandwidth_points=curve), tokens=4, **args) == kernels.moe_experts(
        replace(base, bandwidth_points=curve), tokens=4, **args)
    assert fast.with_efficiency(memory=0.5).moe_memory_efficiency == {}
    split = {**args, "experts_local": 2}  # ep 4: the same rows per expert
    fused, gemv = kernels.moe_experts(fast, tokens=4, **split), kernels.moe_experts(base, tokens=4, **split)
    assert fused.bound == gemv.bound == "memory"
    assert gemv.seconds / fused.seconds == pytest.approx(0.95 * 4e12 / (base.memory_bandwidth * base.memory_efficiency),
                                                         rel=0.02)
    assert kernels.moe_experts(fast, tokens=33, **split) == kernels.moe_experts(base, tokens=33, **split)


def test_large_m_stream_applies_only_once_tokens_outnumber_the_local_experts() -> None:
    """moe_large_m_memory: the format's weight stream falls to that fraction of the datasheet bandwidth for steps
    of more tokens than local experts (SGLang's default Triton tiles), not at or below it, not under a calibrated
    bandwidth curve and not after --memory-efficiency; by hand on a memory-bound step."""
    base = replace(RATES, floors={**RATES.floors, "moe": 0.0})
    slow = replace(base, moe_large_m_memory={"mxfp4": 0.25})
    args = {"experts_local": 32, "experts_total": 32, "top_k": 4, "hidden": 2880, "expert_width": 2880,
            "gated": True, "weight_bits": 16, "compute": "bf16", "weight_format": "mxfp4"}
    for tokens in (1, 8, 32):
        assert kernels.moe_experts(slow, tokens=tokens, **args) == kernels.moe_experts(base, tokens=tokens, **args)
    fast, late = kernels.moe_experts(base, tokens=33, **args), kernels.moe_experts(slow, tokens=33, **args)
    assert fast.bound == late.bound == "memory"
    stream = base.memory_bandwidth * base.memory_efficiency  # 3.2e12 against 0.25 x 4e12 = 1e12
    assert late.seconds - fast.seconds == pytest.approx(late.bytes / 1e12 - late.bytes / stream, rel=1e-9)
    assert kernels.moe_experts(slow, tokens=33, **{**args, "weight_format": "nvfp4"}) == kernels.moe_experts(
        base, tokens=33, **{**args, "weight_format": "nvfp4"})
    curve = ((1e6, 2e12), (1e9, 3e12))
    assert kernels.moe_experts(replace(slow, bandwidth_points=curve), tokens=33, **args) == kernels.moe_experts(
        replace(base, bandwidth_points=curve), tokens=33, **args)
    assert slow.with_efficiency(memory=0.5).moe_large_m_memory == {}


def test_held_weight_stream_applies_at_every_token_count() -> None:
    """moe_weight_stream: an architecture's fused MoE at heuristic tactics streams its experts' weights at one
    fraction of the datasheet whatever the tokens: at one token, between one tile per expert and more tokens than
    experts (Nemotron 3 Super's top-22 of 512 at 200 tokens, which neither the one-tile stream nor the large-M one
    reaches), and beyond, over both of those; by hand on memory-bound steps; not for other formats, not under a
    calibrated curve or after --memory-efficiency."""
    base = replace(RATES, floors={**RATES.floors, "moe": 0.0})
    held = replace(base, moe_weight_stream={"bf16": 0.15}, moe_memory_efficiency={"bf16": 0.9},
                   moe_large_m_memory={"bf16": 0.8})
    args = {"experts_local": 512, "experts_total": 512, "top_k": 22, "hidden": 1024, "expert_width": 2688,
            "gated": False, "weight_bits": 16, "compute": "bf16", "weight_format": "bf16"}
    for tokens in (1, 200, 600):
        cost = kernels.moe_experts(held, tokens=tokens, **args)
        assert cost.bound == "memory"
        assert cost.seconds == pytest.approx(cost.bytes / (0.15 * base.memory_bandwidth), rel=1e-9)
    assert not kernels.moe_one_tile_per_expert(200, 22, 512)  # the gap the held stream closes
    other = {**args, "weight_format": "fp8_block"}
    assert kernels.moe_experts(held, tokens=200, **other) == kernels.moe_experts(
        replace(base, moe_memory_efficiency={"bf16": 0.9}, moe_large_m_memory={"bf16": 0.8}), tokens=200, **other)
    curve = ((1e6, 2e12), (1e9, 3e12))
    assert kernels.moe_experts(replace(held, bandwidth_points=curve), tokens=4, **args) == kernels.moe_experts(
        replace(base, bandwidth_points=curve), tokens=4, **args)
    assert held.with_efficiency(memory=0.5).moe_weight_stream == {}



@given(tokens=st.integers(1, 5000), past=st.integers(0, 5000), chunk=st.sampled_from([128, 256, 1000, 2048]))
def test_chunked_prefill_tiles_are_each_chunks_own_causal_tiles(tokens: int, past: int, chunk: int) -> None:
    """vLLM's virtual batches: the new tokens split at chunk boundaries, each piece causal over its chunk only."""
    total = longest = 0.0
    q_tiles = 0
    position = past
    while position < past + tokens:
        end = min(past + tokens, (position // chunk + 1) * chunk)
        t, lo, q = kernels._tiles(end - position, position % chunk, None)
        total, longest, q_tiles = total + t, max(longest, lo), q_tiles + q
        position = end
    assert kernels._chunked_tiles(tokens, past, chunk) == (total, longest, q_tiles)
    if past % chunk + tokens <= chunk:  # inside one chunk: plain causal attention
        assert kernels._chunked_tiles(tokens, past, chunk) == kernels._tiles(tokens, past % chunk, None)


def _msa_tensor_bytes(seqs: int, lens: list[int], kv_heads: int, q_heads: int, d: int, index_heads: int,
                      index_dim: int, chunk_gqa: int, chunk_index: int) -> int:
    """TensorRT-LLM's Triton MSA path (sparse/minimax_m3/triton_backend.py) tensor by tensor for one layer and step:
    each tensor it writes or reads, in bytes (bf16 2, fp32 4), with the query rows of every sequence (``lens``)
    padded to the longest (max_k) and the given query rows per chunk."""
    k, q = max(lens), sum(lens)
    g = q_heads // kv_heads
    total = 0
    # _gather_paged_batched on the paged K, V (bf16) and index-K caches: read and written, [seqs, max_k, ...]
    total += 2 * (2 * seqs * k * kv_heads * d * 2) + 2 * seqs * k * index_dim * 2
    # _index_attention_and_select, per chunk: idx_k_padded.to(float32) (read bf16, write fp32) then index_select
    # (read fp32 rows of the chunk, write [chunk, max_k, d_i] fp32), the einsum reading that slab
    for start in range(0, q, chunk_index):
        rows = min(chunk_index, q - start)
        total += seqs * k * index_dim * (2 + 4) + rows * k * index_dim * (4 + 4) + rows * k * index_dim * 4
    # qk [q, index_heads, max_k] fp32 written by the einsum, read and written by masked_fill, read by the block max
    total += q * index_heads * k * 4 * 4
    # _sparse_gqa_masked, per chunk, for K and for V: to(float32), index_select, read by its einsum
    for start in range(0, q, chunk_gqa):
        rows = min(chunk_gqa, q - start)
        total += 2 * (seqs * k * kv_heads * d * (2 + 4) + rows * k * kv_heads * d * (4 + 4 + 4))
    # qk [q, kv_heads, g, max_k] fp32: einsum writes, masked_fill reads and writes, softmax reads and writes its
    # attn, the second einsum reads attn
    total += q * kv_heads * g * k * 4 * 6
    return total


@pytest.mark.parametrize(("lens", "kv_heads", "q_heads"), [([5, 5], 1, 8), ([7], 2, 8), ([3, 3, 3], 4, 16)])
def test_msa_fp32_expansion_bytes_tensor_by_tensor(lens: list[int], kv_heads: int, q_heads: int) -> None:
    # small shapes, one chunk (the 512 MiB budget holds every query)
    got = kernels.msa_fp32_expansion_bytes(seqs=len(lens), queries=sum(lens), keys=max(lens), kv_heads=kv_heads,
                                           q_heads=q_heads, head_dim=16, index_heads=4, index_dim=8)
    assert got == _msa_tensor_bytes(len(lens), lens, kv_heads, q_heads, 16, 4, 8, 10 ** 9, 10 ** 9)


def test_msa_fp32_expansion_chunks_follow_the_engine_budget() -> None:
    # MiniMax-M3 at tp 8 (8 query heads, 1 KV head of 128, 4 index heads of 128), 24 prompts of 3,000 tokens:
    # TensorRT-LLM's _compute_sparse_gqa_chunk_q: 512 MiB // (3000 x 1 x 128 x 4 x 2 + 1 x 8 x 3000 x 4 x 2) = 164
    # query rows; _compute_index_attn_chunk_q: 512 MiB // (3000 x 128 x 4 + 4 x 3000 x 4) = 338
    assert 512 * 2 ** 20 // (3000 * 128 * 8 + 8 * 3000 * 8) == 164
    assert 512 * 2 ** 20 // (3000 * 128 * 4 + 4 * 3000 * 4) == 338
    got = kernels.msa_fp32_expansion_bytes(seqs=24, queries=72000, keys=3000, kv_heads=1, q_heads=8, head_dim=128,
                                           index_heads=4, index_dim=128)
    by_hand = (72000 * 3000 * (24 * 128 + 24 * 8 + 12 * 128 + 16 * 4) + math.ceil(72000 / 164) * 24 * 3000 * 12 * 128
               + math.ceil(72000 / 338) * 24 * 3000 * 6 * 128 + 24 * 3000 * (8 * 128 + 4 * 128))
    assert got == by_hand
    # the whole-batch conversions per chunk grow with the batch squared: 24 prompts cost more than 24 x one
    one = kernels.msa_fp32_expansion_bytes(seqs=1, queries=3000, keys=3000, kv_heads=1, q_heads=8, head_dim=128,
                                           index_heads=4, index_dim=128)
    assert got > 24 * one


def test_msa_fp32_expansion_time_against_the_engine_table() -> None:
    # aiconfigurator 0.12 h200_sxm msa/trtllm/1.3.0rc23 msa_context_module_perf (bf16, 8 heads, step 0): one prompt
    # of 3,072 tokens 11.3589 ms, of 16,384 tokens 373.34 ms; the layer's fixed cost 0.19 ms (the engine preset)
    h200 = replace(RATES, memory_bandwidth=4.8e12)
    for tokens, measured in ((3072, 11.3589e-3), (16384, 373.3412e-3)):
        c = kernels.msa_fp32_expansion(h200, seqs=1, queries=tokens, keys=tokens, kv_heads=1, q_heads=8,
                                       head_dim=128, index_heads=4, index_dim=128, efficiency=0.70)
        assert c.bound == "memory"
        assert c.seconds + 0.19e-3 == pytest.approx(measured, rel=0.25)


def test_cost_per_touched_expert_and_the_fused_moe_stream() -> None:
    """moe_touched_expert: a format's fused MoE pays that many seconds per expert the step touches (on this GPU), and
    streams its weights at the GPU's bf16 fused-MoE figure while each expert gets one row tile (moe_own_stream); by
    hand: one token of top-4 touches exactly 4 experts (ep 1), 1 of them on a GPU holding 8 of 32 (ep 4, the mean);
    uniform routing at 16 tokens touches E (1 - (1 - k / E)^T) of them; other formats and the ideal roofline keep
    neither; a format's own moe_memory_efficiency wins over the bf16 figure."""
    base = replace(RATES, floors={**RATES.floors, "moe": 0.0}, moe_memory_efficiency={"bf16": 0.95})
    plain = replace(base, moe_touched_expert={"mxfp4": 0.0})
    costly = replace(base, moe_touched_expert={"mxfp4": 1e-6})
    args = {"experts_total": 32, "top_k": 4, "hidden": 2880, "expert_width": 2880, "gated": True,
            "weight_bits": 4.25, "compute": "fp4", "weight_format": "mxfp4"}
    assert kernels.moe_own_stream(plain, "mxfp4") == 0.95 and kernels.moe_own_stream(RATES, "mxfp4") is None
    assert kernels.moe_own_stream(replace(plain, moe_memory_efficiency={"bf16": 0.95, "mxfp4": 0.7}), "mxfp4") == 0.7
    for tokens, local, touched in ((1, 32, 4.0), (1, 8, 1.0), (16, 32, 32 * (1 - (1 - 4 / 32) ** 16))):
        extra = (kernels.moe_experts(costly, tokens=tokens, experts_local=local, **args).seconds
                 - kernels.moe_experts(plain, tokens=tokens, experts_local=local, **args).seconds)
        assert extra == pytest.approx(touched * 1e-6, rel=1e-9)
    one = kernels.moe_experts(plain, tokens=1, experts_local=32, **args)
    gemv = kernels.moe_experts(base, tokens=1, experts_local=32, **args)  # no entry: the GEMV stream
    assert one.bytes == gemv.bytes and one.seconds < gemv.seconds
    assert gemv.seconds / one.seconds == pytest.approx(
        0.95 * base.memory_bandwidth / (base.memory_bandwidth * base.memory_efficiency), rel=0.02)
    bf16 = {**args, "weight_bits": 16, "compute": "bf16", "weight_format": "bf16"}
    assert (kernels.moe_experts(costly, tokens=1, experts_local=32, **bf16)
            == kernels.moe_experts(plain, tokens=1, experts_local=32, **bf16))
    assert (kernels.moe_experts(costly.as_ideal(), tokens=1, experts_local=32, **args)
            == kernels.moe_experts(plain.as_ideal(), tokens=1, experts_local=32, **args))
