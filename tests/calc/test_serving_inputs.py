"""The capacity planner's seam: step coefficients against the roofline's own work, memory against plan_fit."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc import roofline
from tfcalc.calc.plan import PlanConfig, plan_fit
from tfcalc.calc.roofline import Efficiency
from tfcalc.calc.serving_inputs import KvShape, kv_shape, probe_work, replica_memory, step_model, step_work
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.presets import load_gpu, load_model

MODELS = ["llama3-8b", "llama3-70b", "qwen2.5-7b", "mistral-7b", "gemma2-27b", "mixtral-8x7b", "qwen3-30b-a3b",
          "deepseek-v3", "gpt-oss-120b"]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("tp", [1, 4])
def test_step_work_reproduces_the_roofline(name: str, tp: int) -> None:
    """FLOPs exactly; bytes within 1 % (the step model also writes fp32 logits for a prompt's last position and
    the KV of every prompt token, which the roofline's prefill leaves out)."""
    spec = load_model(name)
    precision, kv = parse_weight_precision(spec.native_dtype), get_dtype("bf16")
    w = step_work(spec, precision, kv, tp)
    m = roofline.make_model(spec, precision, kv, tp)
    for batch, context in [(1, 10), (7, 3000), (64, 9000), (256, 200)]:
        ref = roofline.decode_work(m, batch, context)
        flops, nbytes = w.flops_bytes(batch, batch, batch * w.kv.held(context), 0, 0)
        assert flops == pytest.approx(ref.flops, rel=1e-9)
        assert nbytes == pytest.approx(ref.bytes, rel=1e-9)
    for prompt in [1, 300, 5000]:
        ref = roofline.prefill_work(m, 2, prompt)
        flops, nbytes = w.flops_bytes(2 * prompt, 2, 0, 2 * w.kv.causal_keys(0, prompt), 0)
        assert flops == pytest.approx(ref.flops, rel=1e-9)
        assert nbytes == pytest.approx(ref.bytes, rel=1e-2)


@pytest.mark.parametrize("name", ["llama3-8b", "gpt-oss-120b", "gemma2-27b", "deepseek-v3"])
@pytest.mark.parametrize("kv_name", ["fp8", "fp16", "nvfp4"])
def test_kv_format_rescaling_equals_probing(name: str, kv_name: str) -> None:
    spec = load_model(name)
    precision = parse_weight_precision(spec.native_dtype)
    rescaled = asdict(step_work(spec, precision, get_dtype(kv_name), 2))
    probed = asdict(probe_work(spec, precision, get_dtype(kv_name), 2))
    for key, value in probed.items():
        if isinstance(value, float):
            assert rescaled[key] == pytest.approx(value, rel=1e-12, abs=1e-9), key


def test_ideal_step_time_is_the_roofline_decode_step() -> None:
    spec, gpu = load_model("llama3-70b"), load_gpu("h100-sxm")
    precision, kv = parse_weight_precision("fp8"), get_dtype("fp8")
    ideal = Efficiency(1, 1, 1, 1, "ideal")
    for tp in (1, 4):
        model = step_model(step_work(spec, precision, kv, tp), gpu, ideal)
        m = roofline.make_model(spec, precision, kv, tp)
        for batch, context in [(1, 100), (32, 4000), (512, 1000)]:
            ref = roofline.decode_step(m, gpu, batch, context, ideal)
            got = model.time(batch, 0, batch * model.kv.held(context), 0, 0, batch)
            assert got == pytest.approx(ref.time_s_ideal, rel=1e-9)


def test_pipeline_stages_halve_compute_bound_steps() -> None:
    """pp = 2: two micro-batches are in flight, each stage runs half the layers. A compute-bound step of the
    whole batch takes half as long (two GPUs work); a lone sequence still reads every weight once per token
    (no faster than one GPU)."""
    spec, gpu = load_model("llama3-8b"), load_gpu("h100-sxm")
    p, kv, eff = parse_weight_precision("bf16"), get_dtype("bf16"), Efficiency()
    one = step_model(step_work(spec, p, kv, 1, 1), gpu, eff)
    two = step_model(step_work(spec, p, kv, 1, 2), gpu, eff)
    t1 = one.time(0, 8192, 0, one.kv.causal_keys(0, 8192), 0, 1)
    t2 = two.time(0, 8192, 0, two.kv.causal_keys(0, 8192), 0, 1)
    assert 0.49 < t2 / t1 < 0.52
    lone1 = one.time(1, 0, one.kv.held(100), 0)
    lone2 = two.time(1, 0, two.kv.held(100), 0)
    assert 0.98 < lone2 / lone1 < 1.05
    assert two.work.weight_bytes == pytest.approx(one.work.weight_bytes / 2, rel=0.01)


def test_kv_shape_windows() -> None:
    shape = kv_shape(load_model("gemma2-27b"))
    assert shape.num_layers == 46 and shape.windows == ((23, 4096),)
    assert shape.held(10_000) == 23 * 10_000 + 23 * 4096
    assert shape.units(100) == 100
    plain = KvShape(num_layers=2)
    assert plain.causal_keys(0, 4) == 2 * (1 + 2 + 3 + 4)
    assert plain.causal_keys(2, 2) == 2 * (3 + 4)
    windowed = KvShape(num_layers=1, windows=((1, 2),))
    assert windowed.causal_keys(0, 4) == 1 + 2 + 2 + 2


@settings(max_examples=40)
@given(name=st.sampled_from(["llama3-8b", "llama3-70b", "gpt-oss-120b", "qwen3-30b-a3b", "gemma2-9b"]),
       gpu=st.sampled_from(["h100-sxm", "h200", "a100-40gb", "l40s", "mi300x", "b200"]),
       tp=st.sampled_from([1, 2, 4, 8]), chunk=st.sampled_from([256, 512, 2048, 8192, 16384]),
       weights=st.sampled_from(["native", "fp8", "int4"]), kv=st.sampled_from(["bf16", "fp8"]),
       util=st.sampled_from([0.8, 0.9, 0.95]), max_len=st.sampled_from([2048, 8192, 32768]))
def test_replica_memory_equals_plan_fit(name: str, gpu: str, tp: int, chunk: int, weights: str, kv: str,
                                        util: float, max_len: int) -> None:
    """The adapter re-applies plan_fit's reserved-memory formula for other capacities and chunks; this guards
    it against any change to plan.py."""
    spec, g = load_model(name), load_gpu(gpu)
    precision = parse_weight_precision(spec.native_dtype if weights == "native" else weights)
    try:
        direct = plan_fit(spec, g, precision, get_dtype(kv), PlanConfig(
            num_gpus=tp, tp=tp, context=max_len, gpu_memory_utilization=util, prefill_chunk_tokens=chunk))
    except Exception:  # a layout the model does not allow
        return
    mine = replica_memory(spec, g, precision, get_dtype(kv), tp=tp, pp=1, ep=1, max_model_len=max_len,
                          max_num_batched_tokens=chunk, gpu_memory_utilization=util, block_size=16,
                          runtime_overhead_bytes=1 << 30)
    assert mine.fits == direct.fits
    assert mine.weights_bytes_per_gpu == direct.weights_bytes_per_gpu
    assert mine.reserved_bytes_per_gpu == direct.reserved_bytes_per_gpu
    assert mine.kv_budget_bytes_per_gpu == direct.kv_budget_bytes_per_gpu
    assert mine.kv_capacity_tokens == direct.kv_blocks_per_gpu * 16
    assert mine.max_sequences_at_max_len == direct.max_concurrent_sequences
