"""Calibration files: strict validation, and fits that recover the parameters a synthetic device was built with."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from tfcalc.calc import kernels
from tfcalc.calc.calibration import (
    MIN_EFFICIENCY_FACTOR,
    Calibration,
    Efficiency,
    calibrated_rates,
    fit_rates,
    fitted_summary,
    is_calibration_v2,
    load_calibration,
    load_calibration_v2,
)
from tfcalc.calc.latency import rates_for
from tfcalc.errors import SpecError
from tfcalc.spec.engine import EngineKernels
from tfcalc.spec.presets import load_gpu

BASE = rates_for(load_gpu("h100-sxm"), EngineKernels())
# A made-up device: 0.7 of the bf16 peak, 0.75 of HBM, floors 4 / 3 / 14 us, eager launches of 9 us.
TRUE = replace(BASE, gemm_efficiency={**BASE.gemm_efficiency, "bf16": 0.7}, memory_efficiency=0.75,
               attention_efficiency=0.5, floors={**BASE.floors, "gemm": 4e-6, "elementwise": 3e-6, "attention": 14e-6})


def synthetic() -> dict:
    """Measurements the latency model itself predicts for TRUE (what a perfect device would report)."""
    gemm = [{"dtype": "bf16", "m": m, "n": nk, "k": nk, "seconds": kernels.gemm(TRUE, m, nk, nk, 16, "bf16").seconds}
            for nk in (1024, 4096, 8192) for m in (1, 16, 1024, 4096, 8192)]
    # the smallest copies sit on the floor; bandwidth 0.75 x 3.35 TB/s beyond
    memory = [{"bytes": b, "seconds": 3e-6 + (b / (3.35e12 * 0.75) if b >= 1 << 20 else 0.0)}
              for b in (8192, 1 << 20, 1 << 24, 1 << 30)]
    attention = [{"phase": "decode", "batch": 16, "heads": 32, "kv_heads": 8, "head_dim": 128, "seq_len": 64,
                  "seconds": 14e-6}]
    for seq in (1024, 4096, 16384):
        t = kernels.flash_prefill(TRUE, seqs=1, tokens=seq, past=0, heads=32, qk_dim=128, v_dim=128, window=None,
                                  kv_bytes_read=0.0, exact_flops=0.0).seconds
        attention.append({"phase": "prefill", "batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128,
                          "seq_len": seq, "seconds": t})
    return {"kind": "tfcalc-calibration", "version": 2, "device_name": "synthetic H100", "gemm": gemm,
            "memory": memory, "launch": {"graph_seconds": 3e-6, "eager_seconds": 9e-6}, "attention": attention}


def test_fit_recovers_the_device() -> None:
    fitted = fit_rates(BASE, load_calibration_v2(synthetic(), "cal.json"))
    assert fitted.gemm_efficiency["bf16"] == pytest.approx(0.7, rel=0.01)
    assert fitted.gemm_efficiency["fp8"] == BASE.gemm_efficiency["fp8"]  # not measured: the preset's
    assert fitted.memory_efficiency == pytest.approx(0.75, rel=0.01)
    assert fitted.attention_efficiency == pytest.approx(0.5, rel=0.01)
    assert fitted.floors["elementwise"] == 3e-6 and fitted.floors["attention"] == 14e-6
    assert fitted.floors["gemm"] == pytest.approx(4e-6, rel=0.1)
    assert fitted.launch_s == 9e-6 and "cal.json" in fitted.source
    names = [name for name, _, _ in fitted_summary(BASE, fitted)]
    assert "gemm_efficiency.bf16" in names and "memory_efficiency" in names


def test_partial_calibration_keeps_the_rest() -> None:
    data = {"kind": "tfcalc-calibration", "launch": {"graph_seconds": None, "eager_seconds": 5e-6}}
    fitted = fit_rates(BASE, load_calibration_v2(data, "cal.json"))
    assert fitted.launch_s == 5e-6 and fitted.gemm_efficiency == BASE.gemm_efficiency


@pytest.mark.parametrize(("change", "message"), [
    ({"gemm": [{"dtype": "bf16", "m": 1, "n": 8, "k": 8}]}, r"cal.json: gemm\[0\]: missing field 'seconds'"),
    ({"gemm": [{"dtype": "bf16", "m": 0, "n": 8, "k": 8, "seconds": 1e-5}]},
     r"gemm\[0\]: field 'm' must be positive, got 0"),
    ({"gemm": [{"dtype": "tf33", "m": 1, "n": 8, "k": 8, "seconds": 1e-5}]}, r"gemm\[0\]: field 'dtype' must be one"),
    ({"memory": [{"bytes": 1024, "seconds": "fast"}]}, r"memory\[0\]: field 'seconds' must be a number, got 'fast'"),
    ({"gemm": [{"dtype": "bf16", "m": 1.5, "n": 8, "k": 8, "seconds": 1e-5}]},
     r"gemm\[0\]: field 'm' must be an integer, got 1.5"),
    ({"memory": [{"bytes": 1024, "seconds": 1e-6, "colour": 1}]}, r"memory\[0\]: unknown field 'colour'"),
    ({"memory": {"bytes": 1}}, "field 'memory' must be a list of rows"),
    ({"launch": {"graph_seconds": 1e-6}}, "launch: missing field 'eager_seconds'"),
    ({"attention": [{"phase": "decode", "batch": 1, "heads": 32, "kv_heads": 5, "head_dim": 128, "seq_len": 64,
                     "seconds": 1e-5}]}, r"attention\[0\]: field 'kv_heads' \(5\) must divide 'heads' \(32\)"),
    ({"attention": [{"phase": "train", "batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128, "seq_len": 64,
                     "seconds": 1e-5}]}, r"attention\[0\]: field 'phase' must be prefill or decode"),
    ({"version": 3, "memory": []}, "calibration version 3 is not supported"),
    ({"kind": "other"}, "field 'kind' must be 'tfcalc-calibration'"),
    ({"gpu": "h100"}, "unknown calibration field 'gpu'"),
    ({}, "no measurements"),
])
def test_malformed_rows_are_one_line_errors_naming_the_field(change: dict, message: str) -> None:
    data = {"kind": "tfcalc-calibration", **change}
    with pytest.raises(SpecError, match=message):
        load_calibration_v2(data, "cal.json")


def test_which_format() -> None:
    assert is_calibration_v2(synthetic())
    assert not is_calibration_v2({"compute_efficiency": {"prefill": 0.5, "decode": 0.5}})
    assert not is_calibration_v2([{"status": "ok"}])


def test_efficiency_calibration_schema() -> None:
    good = {"device_name": "NVIDIA H200", "compute_efficiency": {"prefill": 0.7, "decode": 0.5},
            "bandwidth_efficiency": {"prefill": 0.8, "decode": 0.75}, "source": "tfcalc profile"}
    eff = load_calibration(good, "cal.json")
    assert isinstance(eff, Efficiency) and (eff.compute_prefill, eff.bandwidth_decode) == (0.7, 0.75)
    with pytest.raises(SpecError, match="bandwidth_efficiency.decode' must be a number in"):
        load_calibration({**good, "bandwidth_efficiency": {"prefill": 0.8, "decode": 1.5}}, "cal.json")
    with pytest.raises(SpecError, match="unknown calibration field"):
        load_calibration({**good, "compute": 1}, "cal.json")
    # a vanishing factor (1e-300 of peak) overflowed the latency arithmetic into an internal error: refused below
    # the smallest factor a profile writes (tfcalc.profile.efficiency's clamp), which still loads
    with pytest.raises(SpecError, match=r"compute_efficiency.prefill' must be a number in \[1e-06, 1\], got 1e-300"):
        load_calibration({**good, "compute_efficiency": {"prefill": 1e-300, "decode": 0.5}}, "cal.json")
    floor = {"prefill": MIN_EFFICIENCY_FACTOR, "decode": MIN_EFFICIENCY_FACTOR}
    assert load_calibration({**good, "compute_efficiency": floor}, "cal.json").compute_decode == MIN_EFFICIENCY_FACTOR
    for not_a_mapping in ([{"status": "ok"}], "x"):  # profile rows are tfcalc.profile.efficiency's to read
        with pytest.raises(SpecError, match="cal.json: a calibration must be a JSON object"):
            load_calibration(not_a_mapping, "cal.json")


def test_calibrated_rates_apply_each_kind_per_phase() -> None:
    eff = Efficiency(compute_prefill=0.5, compute_decode=0.4, bandwidth_prefill=0.3, bandwidth_decode=0.2,
                     source="calibration cal.json")
    prefill, decode = calibrated_rates(BASE, eff, "prefill"), calibrated_rates(BASE, eff, "decode")
    assert set(prefill.gemm_efficiency.values()) == {0.5} and prefill.memory_efficiency == 0.3
    assert decode.attention_efficiency == 0.4 and decode.memory_efficiency == 0.2
    assert decode.source == "calibration cal.json"
    measured = load_calibration_v2(synthetic(), "cal.json")
    assert calibrated_rates(BASE, measured, "decode") == fit_rates(BASE, measured)


# --- collectives: tfcalc bench collectives ------------------------------------------------------------------------

COLLECTIVES = [{"op": "all_reduce", "ranks": 2, "bytes": 1024 * 4**i, "seconds": 30e-6 + 1024 * 4**i / 4e9}
               for i in range(6)]


def test_a_collectives_section_is_a_calibration_and_replaces_the_nccl_link() -> None:
    from tfcalc.calc import comm, latency
    from tfcalc.dtypes import WeightPrecision, get_dtype
    from tfcalc.spec.engine import EngineKernels
    from tfcalc.spec.presets import load_gpu, load_model

    data = {"kind": "tfcalc-calibration", "version": 2, "collectives": COLLECTIVES}
    assert is_calibration_v2({"collectives": COLLECTIVES})
    cal = load_calibration(data, "c.json")
    assert isinstance(cal, Calibration) and len(cal.collectives) == 6
    gpu, spec = load_gpu("h100-sxm"), load_model("llama3-8b")
    base = latency.rates_for(gpu, EngineKernels())
    rates = calibrated_rates(base, cal, "decode")
    assert rates.collectives is not None and rates.collectives.launch_s == pytest.approx(30e-6)
    assert rates.gemm_efficiency == base.gemm_efficiency and rates.memory_efficiency == base.memory_efficiency
    precision, kv = WeightPrecision(get_dtype("bf16")), get_dtype("bf16")
    no_custom = EngineKernels(custom_allreduce=False)
    before = latency.deployment(spec, gpu, precision, kv, tp=2, engine_kernels=no_custom)
    after = latency.deployment(spec, gpu, precision, kv, tp=2, engine_kernels=no_custom, rates_prefill=rates,
                               rates_decode=rates)
    nbytes = 8192 * 4096 * 2  # one prefill chunk's hidden states, bf16
    measured = latency._all_reduce(after, nbytes, 2, False)[0].seconds
    # the measured collectives ran back to back: inside a forward each still meets its peer (the fabric's sync)
    assert measured == pytest.approx(comm.fit_link([(r["op"], r["ranks"], r["bytes"], r["seconds"])
                                                    for r in COLLECTIVES]).seconds("all_reduce", 2, nbytes)
                                     + after.intra.forward_sync_s_per_peer)
    assert measured != pytest.approx(latency._all_reduce(before, nbytes, 2, False)[0].seconds, rel=0.05)
    # the pure roofline still prices the datasheet link
    assert after.intra.nccl.bandwidth_bytes_per_s == before.intra.nccl.bandwidth_bytes_per_s


@pytest.mark.parametrize("change, message", [
    ({"op": "broadcast"}, "collectives[0]: field 'op' must be one of all_reduce"),
    ({"ranks": 1}, "collectives[0]: field 'ranks' must be at least 2"),
    ({"seconds": -1}, "collectives[0]: field 'seconds' must be positive, got -1"),
    ({"size": 4}, "collectives[0]: unknown field 'size'"),
])
def test_malformed_collective_rows_are_one_line_errors(change: dict, message: str) -> None:
    rows = [{**COLLECTIVES[0], **change}, *COLLECTIVES[1:]]
    with pytest.raises(SpecError, match=re.escape(message)):
        load_calibration_v2({"collectives": rows}, "c.json")
    with pytest.raises(SpecError, match="at least two timed collectives"):
        load_calibration_v2({"collectives": COLLECTIVES[:1]}, "c.json")
