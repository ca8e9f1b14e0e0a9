"""Decode capture in the profiler, on the CPU: priming keeps the compile out of the timing, failures and skipped
CUDA graphs fall back to eager and say so, MoE is never compiled, the backend reported is the one that ran."""

from __future__ import annotations

import pytest
import torch

from tfcalc.model.transformer import build_model, scale_spec
from tfcalc.profile import measure as measure_module
from tfcalc.profile.measure import PRIMING_CALLS, decode_fn, measure
from tfcalc.spec.presets import load_model

TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 128, "vocab": 256}


def _model(name: str = "llama3.2-1b", **extra: int):
    return build_model(scale_spec(load_model(name), **{**TINY, **extra}), dtype=torch.float32)


def test_compiled_decode_is_primed_before_timing_and_equals_eager() -> None:
    """torch.compile(fullgraph) of the real decode_step (aot_eager on the CPU): primed PRIMING_CALLS times, each
    after a rewind, and then gives the eager logits."""
    torch.manual_seed(0)
    model = _model()
    model.setup_caches(batch=2, max_len=12)
    prompt, token = torch.randint(1, 256, (2, 8)), torch.randint(1, 256, (2, 1))
    rewinds = []

    def rewind() -> None:
        rewinds.append(1)
        model.cache_pos.fill_(8)

    with torch.inference_mode():
        model.prefill(prompt)
        step, compiled = decode_fn(model, token, rewind, True,
                                   compiler=lambda f: torch.compile(f, backend="aot_eager", fullgraph=True))
        assert compiled and len(rewinds) == PRIMING_CALLS and int(model.cache_pos) == 9
        assert model.decode_ran == "flex"  # the compiled step reads the live blocks through flex_attention
        rewind()
        got = torch.cat([step(token) for _ in range(3)], dim=1)
        rewind()
        expected = torch.cat([model.decode_step(token) for _ in range(3)], dim=1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_failed_compile_falls_back_to_eager_with_a_warning() -> None:
    model = _model()
    model.setup_caches(batch=1, max_len=8)

    def broken(fn):
        def run(token: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("Dynamo recompile limit exceeded")
        return run

    with pytest.warns(UserWarning, match="eagerly.*recompile limit"):
        step, compiled = decode_fn(model, torch.zeros(1, 1, dtype=torch.long), lambda: None, True, compiler=broken)
    assert not compiled and step == model.decode_step


def test_skipped_cuda_graph_counts_as_not_compiled() -> None:
    from torch._dynamo.utils import counters

    model = _model()
    model.setup_caches(batch=1, max_len=8)

    def skipping(fn):
        def run(token: torch.Tensor) -> torch.Tensor:
            counters["inductor"]["cudagraph_skips"] += 1  # what inductor does for e.g. mutated non-static inputs
            return fn(token)
        return run

    with pytest.warns(UserWarning, match="skipped its CUDA graph"):
        step, compiled = decode_fn(model, torch.zeros(1, 1, dtype=torch.long), model.reset, True, compiler=skipping)
    assert not compiled and step == model.decode_step


def test_moe_and_cpu_decode_are_not_compiled() -> None:
    called = []
    moe = _model("mixtral-8x7b", experts=4, expert_intermediate=32)
    step, compiled = decode_fn(moe, torch.zeros(1, 1, dtype=torch.long), lambda: None, True,
                               compiler=lambda f: called.append(f) or f)
    assert not compiled and not called and step == moe.decode_step
    dense = _model()
    assert decode_fn(dense, torch.zeros(1, 1, dtype=torch.long), lambda: None, True) == (dense.decode_step, False)


def test_measure_times_the_primed_step_and_reports_it_compiled(monkeypatch) -> None:
    """The compile happens before the first (warm-up) call that time_call makes: with warmup=0 every timed call
    is a replay of the primed function."""
    events = []

    def compiler(fn):
        def run(token: torch.Tensor) -> torch.Tensor:
            events.append("step")
            return fn(token)
        events.append("compile")
        return run

    real_time_call = measure_module.time_call

    def spy(fn, device, warmup, repeats, setup=None):
        events.append("time")
        return real_time_call(fn, device, warmup, repeats, setup)

    monkeypatch.setattr(measure_module, "time_call", spy)
    m = measure(_model(), batch=1, prompt_len=4, gen_len=3, backend="auto", compile_decode=True, warmup=0,
                repeats=1, compiler=compiler)
    assert m.compiled
    decode_timing = len(events) - 1 - events[::-1].index("time")
    assert events[:decode_timing].count("step") == PRIMING_CALLS and "compile" in events[:decode_timing]
    assert events[decode_timing + 1:] == ["step"] * 2  # one timed loop of gen_len - 1 steps


def test_forced_backend_is_reported_and_math_runs_everything() -> None:
    m = measure(_model(), batch=1, prompt_len=4, gen_len=2, backend="math", compile_decode=False, warmup=0,
                repeats=1)
    assert m.attn_backend == "math" and not m.compiled and m.decode_attention == "live" and m.fp8_gemm is None


def test_live_decode_is_never_compiled() -> None:
    """``live`` slices the cache at a host-read position: only eager can do that, so it is not handed to
    torch.compile (which would fail on the host read and fall back with a warning)."""
    model = build_model(scale_spec(load_model("llama3.2-1b"), **TINY), decode_attention="live")
    called = []
    step, compiled = decode_fn(model, torch.zeros(1, 1, dtype=torch.long), lambda: None, True,
                               compiler=lambda f: called.append(f) or f)
    assert (step, compiled, called, model.decode_ran) == (model.decode_step, False, [], "live")
