"""The profiler on the CPU: byte and FLOP accounting by hand, the timing harness, faults, device matching."""

from __future__ import annotations

import pytest
import torch

from tfcalc.calc import work
from tfcalc.calc.params import count_params
from tfcalc.dtypes import WeightPrecision, get_dtype
from tfcalc.errors import UsageError
from tfcalc.model.transformer import build_model, scale_spec
from tfcalc.profile import sweep as profiler
from tfcalc.profile.device import match_gpu_preset, select_devices
from tfcalc.profile.measure import measure
from tfcalc.profile.timing import summarize, time_call
from tfcalc.spec.presets import load_model

TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 128, "vocab": 256}


def _tiny(name: str = "llama3.2-1b", **extra: int):
    return scale_spec(load_model(name), **{**TINY, **extra})


def test_decode_bytes_by_hand_dense() -> None:
    # Untied 2-layer model, bf16: per layer attention (q 64x64, k and v 64x32, o 64x64) + MLP 3 x 64 x 128
    # + 2 norms of 64; final norm 64; lm_head 256 x 64 read whole; of the embedding only the batch's rows.
    spec = _tiny("llama3-8b")
    batch, context, bf16 = 2, 10, get_dtype("bf16")
    step = work.decode_work(work.make_model(spec, WeightPrecision(bf16), bf16), batch, context)
    layer = (64 * 64 + 2 * 64 * 32 + 64 * 64) + 3 * 64 * 128 + 2 * 64
    weights = 2 * (2 * layer + 64 + 256 * 64 + batch * 64)
    kv_read = 2 * batch * 2 * context * (2 * 2 * 16)  # bf16 x batch x layers x tokens x (K+V of 2 heads x 16)
    kv_written = 2 * batch * 2 * (2 * 2 * 16)
    logits = batch * 256 * 4
    hidden = 4 * batch * 64 * 2 * 2
    assert step.bytes == weights + kv_read + kv_written + logits + hidden
    matmul_params = 2 * ((64 * 64 + 2 * 64 * 32 + 64 * 64) + 3 * 64 * 128) + 256 * 64
    attention = batch * 2 * context * 4 * 4 * 16  # 2 FLOPs x (QK and PV) x heads x head_dim per key
    assert step.flops == 2 * matmul_params * batch + attention


def test_decode_bytes_use_measured_experts() -> None:
    # MoE bytes count the experts the router really touched: one fewer expert per layer = one expert's bytes less.
    spec = _tiny("mixtral-8x7b", experts=8, expert_intermediate=32)
    bf16 = get_dtype("bf16")
    m = work.make_model(spec, WeightPrecision(bf16), bf16)
    two = work.decode_work(m, 1, 8, {0: 2.0, 1: 2.0})
    one = work.decode_work(m, 1, 8, {0: 1.0, 1: 2.0})
    assert two.bytes - one.bytes == pytest.approx(2 * 3 * 64 * 32)


def test_timing_excludes_warmup_and_takes_the_median(monkeypatch) -> None:
    # Exactly 4 (start, end) readings: a timed warm-up call would exhaust the clock.
    clock = iter([0.0, 0.004, 1.0, 1.001, 2.0, 2.002, 3.0, 3.003])
    monkeypatch.setattr("tfcalc.profile.timing.time.perf_counter", lambda: next(clock))
    calls = []
    timing = time_call(lambda: calls.append(1), torch.device("cpu"), warmup=3, repeats=4)
    assert len(calls) == 7  # 3 warm-up calls, untimed, then 4 timed
    assert timing.repeats == 4 and timing.median_s == pytest.approx(0.0025, rel=1e-6)
    assert timing.min_s == pytest.approx(0.001)
    assert summarize([1.0, 2.0, 100.0]).median_s == 2.0


def test_measure_times_prefill_and_decode_separately() -> None:
    model = build_model(_tiny(), dtype=torch.float32)
    m = measure(model, batch=2, prompt_len=8, gen_len=4, backend="math", compile_decode=False, warmup=1, repeats=2)
    assert m.decode_steps == 3 and m.attn_backend == "math" and not m.compiled
    assert m.prefill.median_s > 0 and m.decode_loop.median_s > 0
    assert m.distinct_experts is None and m.peak_memory_bytes is None


def test_measure_counts_distinct_experts() -> None:
    model = build_model(_tiny("mixtral-8x7b", experts=8, expert_intermediate=32), dtype=torch.float32)
    m = measure(model, batch=4, prompt_len=4, gen_len=3, backend="auto", compile_decode=False, warmup=0, repeats=1)
    assert m.distinct_experts is not None and set(m.distinct_experts) == {0, 1}
    assert all(2 <= v <= 8 for v in m.distinct_experts.values())  # 4 tokens x top-2 of 8


def _sweep(**changes) -> profiler.Sweep:
    base = dict(spec=_tiny(), layers_total=2, layers_explicit=True, batches=[1, 2, 3], prompt_lens=[8],
                gen_lens=[3], dtypes=["fp32"], backends=["auto"], compile_decode=False, warmup=0, repeats=1)
    return profiler.Sweep(**{**base, **changes})


def test_sweep_marks_oom_rows_and_goes_on(monkeypatch) -> None:
    real = profiler.measure

    def flaky(model, batch, *args, **kwargs):
        if batch == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(profiler, "measure", flaky)
    rows: list[dict] = []
    assert profiler.run_sweep(_sweep(), [torch.device("cpu")], rows.append)
    assert [r["status"] for r in rows] == ["ok", "oom", "ok"]
    assert rows[1]["tpot_s"] is None and rows[1]["predicted_decode_tokens_per_s"] > 0


def test_sweep_stops_after_the_current_row_on_ctrl_c() -> None:
    stop = profiler.StopRequested()
    rows: list[dict] = []

    def on_row(row: dict) -> None:
        rows.append(row)
        stop.requested = True  # as the SIGINT handler does

    assert profiler.run_sweep(_sweep(), [torch.device("cpu")], on_row, stop) is False
    assert len(rows) == 1 and rows[0]["status"] == "ok"


def test_unavailable_backend_is_a_row_not_a_crash() -> None:
    rows: list[dict] = []
    profiler.run_sweep(_sweep(batches=[1], backends=["cudnn", "math"]), [torch.device("cpu")], rows.append)
    assert rows[0]["status"].startswith("unavailable") and rows[1]["status"] == "ok"


def test_layers_that_fit_shrinks_to_free_memory() -> None:
    spec = load_model("llama3-8b")
    sweep = _sweep(spec=spec, batches=[1], prompt_lens=[512], gen_lens=[128], dtypes=["bf16"])
    one_layer = profiler.predicted_memory_bytes(spec.with_overrides(layers=1), "bf16", 1, 512, 128)
    assert profiler.layers_that_fit(spec, sweep, 10**15) == 32
    assert profiler.layers_that_fit(spec, sweep, int(one_layer / profiler.MEMORY_HEADROOM) + 1) == 1
    assert profiler.layers_that_fit(spec, sweep, one_layer // 2) == 0
    half = profiler.predicted_memory_bytes(spec.with_overrides(layers=16), "bf16", 1, 512, 128)
    assert profiler.layers_that_fit(spec, sweep, int(half / profiler.MEMORY_HEADROOM) + 1) == 16


@pytest.mark.parametrize("name, preset", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA L40S", "l40s"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("AMD Instinct MI300X", "mi300x"), ("NVIDIA B200", "b200"),
    ("NVIDIA B300 SXM6 AC", "b300"), ("NVIDIA GB200", "gb200"),
    ("NVIDIA GB300", "gb300"), ("AMD Instinct MI325X", "mi325x"), ("Tesla T4", None),
    ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA L4", "l4"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
    ("AMD Instinct MI355X", "mi355x"), ("AMD Instinct MI350X", "mi350x"),
    ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA GH200 144G HBM3e", "gh200-144gb"), ("NVIDIA RTX A6000", "rtx-a6000"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000-ada"), ("NVIDIA A40", "a40"),
])
def test_device_names_match_gpu_presets(name: str, preset: str | None) -> None:
    assert match_gpu_preset(name) == preset
    if preset:
        from tfcalc.spec.presets import load_gpu

        assert load_gpu(preset).name == preset


def test_no_gpu_is_one_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(UsageError, match="pass --device cpu"):
        select_devices("0", "cuda")
    assert select_devices(None, "cpu") == [torch.device("cpu")]


def test_rows_carry_device_facts_and_say_when_no_preset_matched() -> None:
    from tfcalc.profile.device import DeviceInfo

    unknown = DeviceInfo(device="cuda:0", name="Tesla T4", memory_bytes=16 << 30, memory_clock_hz=5.001e9,
                         memory_bus_width_bits=256)
    columns = profiler.device_columns(unknown)
    assert columns["nvml_bandwidth_bytes_per_s"] == pytest.approx(5.001e9 * 2 * 256 / 8)  # 320 GB/s
    assert "no GPU preset matches 'Tesla T4'" in columns["device_note"]
    assert profiler.device_columns(DeviceInfo(device="cpu", name="CPU"))["device_note"] is None


def test_layers_that_fit_keep_the_layer_pattern() -> None:
    """DeepSeek-V3 sized to a GPU keeps dense and MoE layers in proportion (here: 1 dense of 3, the rest MoE)."""
    spec = load_model("deepseek-v3")
    sweep = _sweep(spec=spec, batches=[1], prompt_lens=[512], gen_lens=[64], dtypes=["bf16"],
                   weights_dtypes=["fp8_block"])
    six = profiler.predicted_memory_bytes(scale_spec(spec, layers=6), "bf16", 1, 512, 64, "fp8_block")
    fit = profiler.layers_that_fit(spec, sweep, int(six / profiler.MEMORY_HEADROOM) + 1)
    assert fit == 6
    kept = scale_spec(spec, layers=fit)
    assert kept.moe.dense_layers == (0,) and kept.num_moe_layers == 5


def test_context_sweep_doubles_up_to_the_max_context_or_memory() -> None:
    spec = _tiny().with_overrides(max_context=1000)
    sweep = _sweep(spec=spec, batches=[1], gen_lens=[8])
    assert profiler.contexts_that_fit(spec, sweep, None, 64) == [64, 128, 256, 512, 992]  # then the max, 1000 - 8
    need_256 = profiler.predicted_memory_bytes(spec, "fp32", 1, 256, 8)
    assert profiler.contexts_that_fit(spec, sweep, int(need_256 / profiler.MEMORY_HEADROOM) + 1, 64) == [64, 128, 256]


def test_predicted_memory_counts_fp8_matrices_at_one_byte() -> None:
    spec = load_model("llama3-70b").with_overrides(num_layers=2)
    bf16 = profiler.predicted_memory_bytes(spec, "bf16", 1, 128, 16)
    fp8 = profiler.predicted_memory_bytes(spec, "bf16", 1, 128, 16, "fp8")
    matrices = sum(count_params(spec).total[c].matrix for c in ("attention", "mlp"))
    assert bf16 - fp8 == matrices  # two bytes -> one for every attention and MLP matrix element
    assert profiler.weight_precision("bf16", "fp8_block").for_component("experts").name == "fp8_block"
    assert profiler.weight_precision("bf16", "fp8").for_component("lm_head").name == "bf16"


@pytest.mark.parametrize("message, oom", [
    ("CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to allocate 8", True),
    ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes. Error code 12", True),
    ("mat1 and mat2 shapes cannot be multiplied (4x64 and 32x64)", False),
])
def test_out_of_memory_is_recognised_on_every_device(message: str, oom: bool) -> None:
    from tfcalc.profile.device import is_oom

    assert is_oom(RuntimeError(message)) is oom
    assert is_oom(MemoryError()) and is_oom(torch.OutOfMemoryError("x")) and not is_oom(ValueError(message))


def test_ctrl_c_once_finishes_the_row_twice_stops_now() -> None:
    import os
    import signal

    stop = profiler.StopRequested()
    before = signal.getsignal(signal.SIGINT)
    with stop.installed():
        os.kill(os.getpid(), signal.SIGINT)  # first Ctrl-C: finish the row, then stop
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the second: stop now
    assert signal.getsignal(signal.SIGINT) is before  # the handler restored
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # SIGTERM is the entry point's, not the sweep's


def test_cpu_points_predicted_past_the_memory_are_oom_rows_without_running(monkeypatch) -> None:
    """Linux may overcommit and then kill the process instead of raising: such points are never built."""
    monkeypatch.setattr(profiler, "available_memory_bytes", lambda device: 1 << 10)
    monkeypatch.setattr(profiler, "build_model", lambda *a, **k: pytest.fail("built a model that cannot fit"))
    rows: list[dict] = []
    assert profiler.run_sweep(_sweep(batches=[1, 2]), [torch.device("cpu")], rows.append)
    assert [r["status"].split(" (")[0] for r in rows] == ["oom", "oom"]
    assert "GiB available" in rows[0]["status"] and rows[0]["predicted_memory_bytes"] > 1 << 10


# --- the prediction beside each row: tfcalc estimate's latency model ------------------------------------------------


def _context(gpu_preset: str | None = None, fp8: bool = False) -> profiler.DeviceContext:
    """A device with fixed ceilings: copy 20 GB/s, matmul 100 GFLOP/s (and an FP8 GEMM at twice that)."""
    from tfcalc.profile.ceilings import Ceiling
    from tfcalc.profile.device import DeviceInfo
    from tfcalc.profile.timing import Timing
    from tfcalc.spec.presets import load_gpu

    timing = Timing(median_s=1e-3, p25_s=1e-3, p75_s=1e-3, min_s=1e-3, repeats=1)
    matmul = {d: Ceiling(name="matmul", dtype=d, size=1024, value=1e11, timing=timing) for d in ("bf16", "fp32")}
    if fp8:
        matmul["fp8"] = Ceiling(name="matmul", dtype="fp8", size=1024, value=2e11, timing=timing)
    device = "cuda:0" if gpu_preset else "cpu"
    return profiler.DeviceContext(
        device=torch.device("cpu"), info=DeviceInfo(device=device, name="test device", gpu_preset=gpu_preset),
        gpu=load_gpu(gpu_preset) if gpu_preset else None,
        copy=Ceiling(name="copy", dtype="uint8", size=1 << 28, value=20e9, timing=timing), matmul=matmul,
        parallel_units=2)


def test_prediction_on_measured_ceilings_is_the_counted_bytes_over_the_copy_rate() -> None:
    """On a device without a preset, decode at batch 1 is priced at the measured copy rate in full: the predicted
    TPOT is the step's bytes (as the row counts them, tfcalc.calc.work) over the copy bandwidth. That is why a
    calibration from the row's MBU makes measured / predicted 1 (the loop closes), whatever the machine does --
    to within the GEMMs' compute time, which their overlap with the bytes (kernels.GEMM_OVERLAP_P) adds: half the
    bandwidth is a little under twice the time."""
    from tfcalc.calc import work
    from tfcalc.calc.calibration import Efficiency

    spec = load_model("llama3.2-1b").with_overrides(layers=2)
    p = profiler.Point("bf16", None, "auto", 1, 128, 16)
    sweep = _sweep(spec=spec, dtypes=["bf16"])
    row = profiler.row_for(spec, 2, _context(), sweep, p, None, "oom")
    bf16 = get_dtype("bf16")
    model = work.make_model(spec, WeightPrecision(bf16), bf16)
    contexts = profiler.decode_contexts(p, "live")
    counted = sum(work.decode_work(model, 1, c).bytes for c in contexts) / len(contexts)
    assert row["predicted_tpot_s"] == pytest.approx(counted / 20e9, rel=0.03)
    assert "measured copy and matmul ceilings" in row["prediction_basis"]
    half = Efficiency(compute_prefill=1.0, compute_decode=1.0, bandwidth_prefill=0.5, bandwidth_decode=0.5,
                      source="calibration half.json")
    calibrated = profiler.row_for(spec, 2, _context(), _sweep(spec=spec, dtypes=["bf16"], calibration=half), p, None,
                               "oom")
    assert 0.98 * 2 * row["predicted_tpot_s"] < calibrated["predicted_tpot_s"] < 2 * row["predicted_tpot_s"]
    assert "calibration half.json" in calibrated["prediction_basis"]


def test_fp8_rows_that_ran_dequantized_are_not_priced_at_the_fp8_peak() -> None:
    from types import SimpleNamespace

    spec = load_model("llama3-8b").with_overrides(layers=2)
    sweep = _sweep(spec=spec, dtypes=["bf16"], weights_dtypes=["fp8"])
    p = profiler.Point("bf16", "fp8", "auto", 8, 2048, 16)
    ctx = _context("h100-sxm", fp8=True)
    native, native_basis = profiler.prediction(spec, ctx, sweep, p,
                                               SimpleNamespace(fp8_gemm="scaled_mm", compiled=True))
    dequantized, dequantized_basis = profiler.prediction(spec, ctx, sweep, p,
                                                         SimpleNamespace(fp8_gemm="dequantized", compiled=True))
    plain, _ = profiler.prediction(spec, ctx, _sweep(spec=spec, dtypes=["bf16"]),
                                   profiler.Point("bf16", None, "auto", 8, 2048, 16), None)
    # prefill of 16k tokens is compute-bound: FP8 tensor cores beat bf16, a dequantized FP8 GEMM does not
    assert native.ttft_s < 0.9 * plain.ttft_s and dequantized.ttft_s == pytest.approx(plain.ttft_s, rel=0.01)
    assert "dequantized" in dequantized_basis and "dequantized" not in native_basis
    # unmeasured rows (oom) follow what the device runs: the FP8 GEMM where the probe found it, else dequantized
    with_fp8 = profiler.row_for(spec, 2, ctx, sweep, p, None, "oom")
    without = profiler.row_for(spec, 2, _context("h100-sxm"), sweep, p, None, "oom")
    assert "dequantized" in without["prediction_basis"] and "dequantized" not in with_fp8["prediction_basis"]
    assert with_fp8["datasheet_flops_per_s"] == 2 * without["datasheet_flops_per_s"]  # H100 fp8 vs bf16 peak
