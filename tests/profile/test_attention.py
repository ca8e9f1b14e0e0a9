"""``tfcalc bench attention`` on the CPU: FLOP and byte counts by hand, rows from the real timer and from a fake
one, unavailable backends reported."""

from __future__ import annotations

import math

import pytest
import torch

from tfcalc.errors import UsageError
from tfcalc.profile import attention, device, timing
from tfcalc.profile.attention import attention_rows, decode_attention_flops, decode_kv_bytes, prefill_attention_flops
from tfcalc.profile.timing import Timing

CPU = torch.device("cpu")
FAST = {"warmup": 1, "repeats": 2}


def _finite_positive(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


# --- counts by hand ----------------------------------------------------------------------------------------------


def test_prefill_flops_by_hand() -> None:
    # B=2, H=8, T=128, D=64: QK^T 2*2*8*128*128*64 = 33,554,432 and PV the same -> 67,108,864; causal half.
    assert prefill_attention_flops(2, 8, 128, 64, causal=False) == 67_108_864
    assert prefill_attention_flops(2, 8, 128, 64, causal=True) == 33_554_432
    assert prefill_attention_flops(2, 8, 128, 64) == 33_554_432  # causal is the default


def test_decode_flops_and_bytes_by_hand() -> None:
    # One query: 4 * B4 * H8 * T512 * D64 = 4,194,304 FLOPs; K+V read: 2 * B4 * Hkv2 * 512 * 64 * 4 B = 2 MiB.
    assert decode_attention_flops(4, 8, 512, 64) == 4_194_304
    assert decode_kv_bytes(4, 2, 512, 64, 4) == 2_097_152
    # GQA changes the bytes, not the FLOPs (H counts query heads).
    assert decode_kv_bytes(4, 8, 512, 64, 4) == 4 * decode_kv_bytes(4, 2, 512, 64, 4)


# --- attention ---------------------------------------------------------------------------------------------------


def test_attention_rows_real_timer_cpu() -> None:
    rows = attention_rows(CPU, torch.float32, ["auto", "flash", "efficient", "cudnn", "math"], [64], heads=4,
                          kv_heads_list=[4, 2], head_dim=16, batch=1, decode_batch=2, **FAST)
    assert len(rows) == 5 * 2 * 1 * 2  # backends x kv heads x seq lens x phases: nothing silently dropped
    cudnn = [r for r in rows if r["backend"] == "cudnn"]
    assert cudnn and all(r["status"] == "unavailable" and r["note"] and r["time_s"] is None for r in cudnn)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["backend"] for r in ok} >= {"auto", "math"}
    for r in ok:
        assert _finite_positive(r["time_s"]) and _finite_positive(r["flops_per_s"])
        assert r["time_p25_s"] <= r["time_s"] <= r["time_p75_s"]
        assert r["flops_per_s"] == pytest.approx(r["flops"] / r["time_s"])
        assert r["tflops_per_s"] == pytest.approx(r["flops_per_s"] / 1e12)
        if r["phase"] == "prefill":
            assert r["flops"] == prefill_attention_flops(1, 4, 64, 16) and r["bytes_per_s"] is None
            assert r["causal"] is True and r["batch"] == 1
        else:
            assert r["batch"] == 2 and r["flops"] == decode_attention_flops(2, 4, 64, 16)
            assert r["bytes"] == decode_kv_bytes(2, r["kv_heads"], 64, 16, 4)
            assert _finite_positive(r["bytes_per_s"])
        assert r["flops_fraction_of_peak"] is None  # no peak given
        assert r["backend_ran"] == r["backend"] or r["backend"] == "auto"
    # 'auto' records the kernel SDPA's dispatcher picked; a forced backend is what ran.
    assert all(r["backend_ran"] in ("flash", "efficient", "cudnn", "math") for r in ok)


def test_attention_rows_exact_with_fake_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "time_call", lambda fn, device, warmup, repeats: (fn(), Timing(
        median_s=0.002, p25_s=0.001, p75_s=0.004, min_s=0.001, repeats=repeats))[1])
    rows = attention_rows(CPU, torch.bfloat16, ["math"], [32], heads=8, kv_heads_list=[2], head_dim=8, batch=3,
                          causal=False, decode_batch=5, peak_flops_per_s=1e9, peak_bytes_per_s=1e8, **FAST)
    prefill, decode = rows
    assert prefill["phase"] == "prefill" and prefill["flops"] == 4 * 3 * 8 * 32 * 32 * 8  # non-causal: full
    assert prefill["flops_per_s"] == prefill["flops"] / 0.002
    assert prefill["flops_fraction_of_peak"] == pytest.approx(prefill["flops"] / 0.002 / 1e9)
    assert prefill["bandwidth_fraction_of_peak"] is None
    assert decode["bytes"] == 2 * 5 * 2 * 32 * 8 * 2  # bf16: 2 bytes
    assert decode["bytes_per_s"] == decode["bytes"] / 0.002
    assert decode["bandwidth_fraction_of_peak"] == pytest.approx(decode["bytes"] / 0.002 / 1e8)
    assert decode["causal"] is False and decode["dtype"] == "bf16" and decode["gqa_ratio"] == 4


def test_unavailable_backend_is_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "sdpa_runs", lambda backend, *a, **k: "not here" if backend == "flash" else None)
    rows = attention_rows(CPU, torch.float32, ["flash", "math"], [16, 32], heads=2, kv_heads_list=[1], head_dim=8,
                          batch=1, decode=False, **FAST)
    flash = [r for r in rows if r["backend"] == "flash"]
    assert [r["seq_len"] for r in flash] == [16, 32]
    assert all(r["status"] == "unavailable" and r["note"] == "not here" for r in flash)
    assert all(r["status"] == "ok" for r in rows if r["backend"] == "math")


def test_oom_marks_the_row_and_the_sweep_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake(fn, device, warmup, repeats):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB")
        return Timing(median_s=0.001, p25_s=0.001, p75_s=0.001, min_s=0.001, repeats=repeats)

    monkeypatch.setattr(timing, "time_call", fake)
    rows = attention_rows(CPU, torch.float32, ["math"], [16, 32], heads=2, kv_heads_list=[2], head_dim=8, batch=1,
                          decode=False, **FAST)
    assert [r["status"] for r in rows] == ["oom", "ok"] and rows[0]["time_s"] is None


def test_sdpa_probe_and_kv_heads_checks() -> None:
    assert attention.sdpa_runs("math", 4, 2, 16, torch.float32, CPU) is None
    assert attention.sdpa_runs("cudnn", 4, 2, 16, torch.float32, CPU)  # a reason, never on a CPU
    with pytest.raises(UsageError, match="unknown attention backend"):
        attention.sdpa_runs("xformers", 4, 2, 16, torch.float32, CPU)
    with pytest.raises(UsageError, match="must divide"):
        attention_rows(CPU, torch.float32, ["math"], [16], heads=4, kv_heads_list=[3], head_dim=8, batch=1)


def test_datasheet_peaks_none_on_cpu_and_dtype_names() -> None:
    assert device.datasheet_peaks(CPU, torch.bfloat16) == (None, None, None)
    assert device.torch_dtype("bf16") is torch.bfloat16
    with pytest.raises(UsageError, match="unknown dtype"):
        device.torch_dtype("fp8")
