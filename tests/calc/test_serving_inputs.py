"""The capacity planner's seam: memory from plan_fit with the engine's model, step times from the latency model
(exact for a simulated step, tabulated and interpolated for the analytic model)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc.latency import StepShape, in_flight_seconds, serving_step_seconds
from tfcalc.calc.plan import PlanConfig, plan_fit
from tfcalc.calc.serving_inputs import (
    BATCH_GRID,
    COARSE_GRID,
    PREFILL_GRID,
    KvShape,
    kv_shape,
    latency_step,
    replica_memory,
)
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.presets import load_engine, load_gpu, load_model

VLLM = load_engine("vllm")


def _step(name: str, tp: int = 1, pp: int = 1, gpu: str = "h100-sxm", engine=VLLM):  # noqa: ANN001, ANN202
    spec = load_model(name)
    return latency_step(spec, load_gpu(gpu), parse_weight_precision(spec.native_dtype), get_dtype("bf16"), tp=tp,
                        pp=pp, engine=engine)


@pytest.mark.parametrize("engine", ["vllm", "vllm-0.11", "sglang", "trtllm", "ideal"])
@pytest.mark.parametrize("name,tp", [("llama3-70b", 4), ("gpt-oss-120b", 1), ("qwen3-30b-a3b", 2)])
def test_replica_memory_is_plan_fit(engine: str, name: str, tp: int) -> None:
    """KV tokens, sequences at max_model_len and the verdict are plan's for the same engine and flags."""
    spec, gpu = load_model(name), load_gpu("h100-sxm")
    e = None if engine == "ideal" else load_engine(engine)
    precision, kv = parse_weight_precision(spec.native_dtype), get_dtype("bf16")
    m = replica_memory(spec, gpu, precision, kv, tp=tp, pp=1, ep=1, engine=e, max_model_len=8192, max_num_seqs=256,
                       max_num_batched_tokens=4096)
    r = plan_fit(spec, gpu, precision, kv, PlanConfig(num_gpus=tp, tp=tp, context=8192, engine=e, max_num_seqs=256,
                                                      max_num_batched_tokens=4096))
    assert m.kv_capacity_tokens == r.kv_pool_tokens_per_gpu
    assert m.max_sequences_at_max_len == r.max_concurrent_sequences
    assert m.fits == (r.max_concurrent_sequences >= 1)
    assert m.engine == (e.label if e else "ideal")


def test_more_seats_never_leave_more_kv() -> None:
    """vLLM's profiling run samples over max_num_seqs rows and captures CUDA graphs up to 2 x max_num_seqs: a larger
    max_num_seqs never leaves more KV cache (the capacity search relies on it when it reuses a smaller one)."""
    spec, gpu = load_model("llama3-8b"), load_gpu("h100-sxm")
    sizes = [replica_memory(spec, gpu, parse_weight_precision("bf16"), get_dtype("bf16"), tp=1, pp=1, ep=1,
                            engine=VLLM, max_model_len=8192, max_num_seqs=s, max_num_batched_tokens=8192
                            ).kv_capacity_tokens for s in (8, 64, 256, 1024)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]


def test_kv_shape_follows_the_engines_pool() -> None:
    """vLLM's hybrid allocator holds a sliding layer's window only; SGLang counts its pool in full-layer tokens."""
    spec = load_model("gpt-oss-120b")
    assert kv_shape(spec, VLLM).windows and kv_shape(spec, None).windows
    assert kv_shape(spec, load_engine("sglang")) == KvShape(num_layers=spec.num_layers)
    full = kv_shape(load_model("llama3-8b"), VLLM)
    assert full.units(1000) == 1000


@pytest.mark.parametrize("engine", ["vllm", "ideal"])
@pytest.mark.parametrize("context", [2048, 32_768])
def test_gemma4_kv_units_are_the_pools_window_aware_count(engine: str, context: int) -> None:
    """Gemma 4's global layers cache half the elements per token of its sliding ones (31B, tp 1): a sequence's units
    weigh each kind so that the pool's tokens over one sequence's units is the plan's window-aware count (vLLM: its
    pool in tokens of the 16-token blocks, the global group's blocks holding 32)."""
    spec, e = load_model("gemma4-31b"), load_engine(engine) if engine != "ideal" else None
    r = plan_fit(spec, load_gpu("h200"), parse_weight_precision("bf16"), get_dtype("bf16"),
                 PlanConfig(num_gpus=1, context=context, engine=e))
    units = kv_shape(spec, e).units(context)
    assert r.kv_pool_tokens_per_gpu / units == pytest.approx(r.max_concurrent_sequences_window_aware, rel=0.01,
                                                             abs=1)
    assert units < context  # the windows hold 1,024 tokens each


@pytest.mark.parametrize("engine", ["vllm", "sglang", "ideal"])
@pytest.mark.parametrize("tp,context", [(1, 32_768), (2, 8192)])
def test_kv_shape_counts_gated_deltanet_states(engine: str, tp: int, context: int) -> None:
    """Qwen3.5-27B's 48 Gated DeltaNet layers hold a state per sequence: in vLLM's pool one 784-token block per state
    layer (48 x 784 / 64 = 588 tokens of the stack, 294 at tp 2 where the state halves and KV heads split), in
    SGLang's a pool of their own (none in the KV pool; its slots cap the running requests), elsewhere its bytes in
    the attention layers' tokens; the pool then seats the sequences plan's concurrency counts (SGLang: within its
    running cap), and a shared prefix carries no state of its own."""
    spec, gpu = load_model("qwen3.5-27b"), load_gpu("h100-sxm")
    e = None if engine == "ideal" else load_engine(engine)
    shape = kv_shape(spec, e, tp=tp)
    m = replica_memory(spec, gpu, parse_weight_precision("bf16"), get_dtype("bf16"), tp=tp, pp=1, ep=1, engine=e,
                       max_model_len=context, max_num_seqs=256, max_num_batched_tokens=8192)
    state = 48 * (3 * (2 * 16 * 128 + 48 * 128) * 2 + 48 * 128 * 128 * 4) // tp   # bytes per sequence per GPU
    if engine == "vllm":
        assert shape.state_units == 48 * 784 / 64 and m.block_size == 784
    elif engine == "sglang":
        assert shape.state_units == 0 and m.max_running is not None
    else:
        assert shape.state_units == pytest.approx(state / (16 * 2 * (4 // tp) * 256 * 2))
    whole_blocks = -(-context // m.block_size) * m.block_size   # the engine rounds a request up to whole blocks
    seats = m.kv_capacity_tokens / shape.units(whole_blocks)
    if m.max_running is not None:
        seats = min(seats, m.max_running)
    assert m.max_sequences_at_max_len <= seats < m.max_sequences_at_max_len + 1
    assert shape.units(1000, state=False) == 1000 * 16 / shape.num_layers


def test_simulated_step_is_the_latency_model() -> None:
    step = _step("llama3-8b")
    assert step.time(32, 2048.0, 512, 1024.0, 1) == serving_step_seconds(step.deployment, 32, 2048.0, 512, 1024)
    assert step.time(8, 900.0, 600, 0.0, 3) == serving_step_seconds(step.deployment, 8, 900.0, 200, 0, 3)
    assert step.time(0, 0.0, 0, 0.0, 0) == 0.0


@pytest.mark.parametrize("name,tp,pp", [("llama3-8b", 1, 1), ("qwen3-30b-a3b", 2, 1), ("llama3-70b", 4, 2)])
def test_table_is_exact_on_its_grid(name: str, tp: int, pp: int) -> None:
    """At a grid point (coarse for prefill) the table is the latency model's step: a chunk at the mean past, or
    whole prompts; pp batches in flight."""
    step = _step(name, tp, pp)
    table = step.busy_step(3000.0, 2000.0, 0.0)
    for b in (1.0, 16.0, 64.0):
        for n in (0.0, 512.0, 8192.0):
            seqs, tokens = int(b), n / pp
            chunks, per, past = (1, round(tokens), (2000 - tokens) / 2) if tokens < 2000 else (
                round(tokens / 2000), round(tokens / round(tokens / 2000)), 0)
            shape = StepShape(decode_seqs=seqs, decode_context=3000.0, prefill_seqs=chunks if per else 0,
                              prefill_tokens=per, prefill_past=round(past) if per else 0)
            assert table(b * pp, n) == pytest.approx(in_flight_seconds(step.deployment, shape), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["llama3-8b", "gemma2-9b", "qwen2.5-7b", "llama3-70b"]), st.floats(0, 600),
       st.sampled_from([0.0, 1.0]) | st.floats(1, 8192), st.floats(100, 20_000), st.floats(50, 8000))
def test_table_interpolates_within_a_few_percent(name: str, batch: float, prefill: float, context: float,
                                                 prompt: float) -> None:
    """Between grid points the bilinear interpolation stays within about 5 % of the exact step of the same mix (the
    latency model at a fractional batch interpolates between its neighbouring integers). Dense models: the latency
    model's MoE kernel splits tokens evenly over experts in 64-row tiles, so its step jumps where the rows per expert
    cross a tile (+70 % from 2,048 to 2,049 tokens of gpt-oss-120b); the table interpolates across those jumps
    (exact on its grid, test above), as random routing smooths them on a real GPU."""
    tp = 4 if name == "llama3-70b" else 1
    step = _step(name, tp, gpu="h200")
    table = step.busy_step(context, prompt, 0.0)
    if batch < 1 and prefill == 0:
        return
    lo, hi = int(batch), int(batch) + 1
    exact = (hi - batch) * table.exact(lo, prefill) + (batch - lo) * table.exact(hi, prefill)
    assert table(batch, prefill) == pytest.approx(exact, rel=0.06)  # worst 5.0 % in a scan of 48,000 mixes


def test_grids_are_increasing() -> None:
    assert list(BATCH_GRID) == sorted(set(BATCH_GRID)) and list(PREFILL_GRID) == sorted(set(PREFILL_GRID))
    assert list(COARSE_GRID) == sorted(set(COARSE_GRID)) and set(COARSE_GRID) <= set(BATCH_GRID)
    assert BATCH_GRID[-1] >= 65536 and PREFILL_GRID[-1] >= 131072
