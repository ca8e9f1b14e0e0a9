"""The presets the latency model reads: GPU latency blocks, interconnects, engines -- sourced, validated strictly."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tfcalc.calc import kernels
from tfcalc.calc.latency import linear_mode, rates_for
from tfcalc.dtypes import get_dtype
from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.engine import EngineKernels, SchedulerPolicy, engine_from_mapping, kernels_from_mapping
from tfcalc.spec.gpu import gpu_from_mapping, latency_from_mapping
from tfcalc.spec.interconnect import interconnect_from_mapping, load_interconnect
from tfcalc.spec.presets import (
    engine_family,
    load_engine,
    load_gpu,
    load_preset_document,
    preset_names,
    preset_root,
    read_data_file,
)

GPUS = preset_names("gpu")
INTERCONNECTS = sorted(p.stem for p in (preset_root() / "interconnects").glob("*.yaml"))
ENGINES = preset_names("engine")


def _sourced(document: dict) -> set[str]:
    return {k.strip() for keys in document["sources"] for k in keys.split(",")}


@pytest.mark.parametrize("name", GPUS)
def test_every_gpu_has_a_sourced_latency_block(name: str) -> None:
    block = load_preset_document("gpu", name)["latency"]
    numbers = [k for k in block if k != "sources"]
    assert [k for k in numbers if k not in _sourced(block)] == []
    latency = load_gpu(name).latency
    assert latency is not None and latency.sm_count > 0
    assert 0 < latency.memory_efficiency <= 1 and latency.floors_s["gemm"] < 10e-6
    load_interconnect(latency.interconnect_preset)  # every GPU names a fabric that exists


@pytest.mark.parametrize("name", INTERCONNECTS)
def test_interconnects_sourced_and_valid(name: str) -> None:
    document = read_data_file(preset_root() / "interconnects" / f"{name}.yaml")
    numbers = [k for k in document if k not in ("display_name", "sources", "notes")]
    assert [k for k in numbers if k not in _sourced(document)] == []
    fabric = load_interconnect(name)
    assert 0 < fabric.nccl.efficiency <= 1 and fabric.nccl.bandwidth_bytes_per_s > 1e9


@pytest.mark.parametrize("name", ENGINES)
def test_engine_kernel_blocks_sourced_and_valid(name: str) -> None:
    """Every kernel fact an engine preset states is sourced in its kernels.sources; a version file without the
    block runs its kernels as its engine's default version (which has one)."""
    document = read_data_file(preset_root() / "engines" / f"{name}.yaml")
    engine = load_engine(name)
    assert engine.name == engine_family(name)
    block = document.get("kernels")
    if block is None:
        default = load_engine(engine.name)
        assert default.default and default is not engine and read_data_file(
            preset_root() / "engines" / f"{engine.name}-{default.version}.yaml").get("kernels") is not None
        assert engine.kernels == default.kernels and engine.kernels.sources == default.kernels.sources
        return
    numbers = [k for k in block if k != "sources"]
    assert [k for k in numbers if k not in _sourced(block)] == []
    assert engine.kernels == kernels_from_mapping(block, name)


def test_reference_engines_exist() -> None:
    assert {"vllm", "sglang", "trtllm", "gpt-fast"} <= {engine_family(n) for n in ENGINES}
    # the kernel facts issue 9 measured, now in the engine version presets they were measured on
    assert load_engine("vllm").kernels.block_floors_s == pytest.approx({"mla_decode": 79e-6, "mla_prefill": 100e-6})
    assert load_engine("vllm@0.9").kernels == load_engine("vllm").kernels  # shared, not repeated
    assert load_engine("sglang").kernels.floors_s == pytest.approx({"attention": 9.2e-6, "moe": 22e-6,
                                                                    "gdn_prefill": 21.7e-6, "gdn_decode": 4.2e-6})
    trt = load_engine("trtllm").kernels
    assert trt.fused_activation_quant and trt.floors_s["moe"] == pytest.approx(29.4e-6)
    fast = load_engine("gpt-fast")
    assert fast.budget == "ideal" and not fast.models_memory and fast.overheads is None
    assert fast.kernels.fused_activation_quant and fast.kernels.cuda_graphs


GOOD = {"sm_count": 132, "gemm_efficiency": {"bf16": 0.8}, "attention_efficiency": 0.6, "moe_efficiency": 0.7,
        "memory_efficiency": 0.85, "floors_us": {"gemm": 3, "elementwise": 2, "attention": 10, "moe": 30},
        "interconnect_preset": "nvlink4"}


@pytest.mark.parametrize(("change", "message"), [
    ({"sm_count": 0}, "latency.sm_count' must be positive"),
    ({"sm_count": 1.5}, "latency.sm_count' must be an integer"),
    ({"sm_count": 10**9}, "latency.sm_count' must be at most"),
    ({"attention_efficiency": True}, "latency.attention_efficiency' must be a number"),
    ({"moe_efficiency": float("nan")}, "latency.moe_efficiency' must be a finite number"),
    ({"gemm_efficiency": {"bf16": 0}}, "latency.gemm_efficiency.bf16' must be positive"),
    ({"floors_us": {**GOOD["floors_us"], "moe": float("inf")}}, "latency.floors_us.moe' must be a finite number"),
    ({"floors_us": {**GOOD["floors_us"], "gemm": 1e9}}, "latency.floors_us.gemm' must be at most"),
    ({"interconnect_preset": ["nvlink4"]}, "latency.interconnect_preset' must be text"),
    ({"gemm_efficiency": {"bf17": 0.8}}, "unknown dtype 'latency.gemm_efficiency.bf17'"),
    ({"memory_efficiency": 1.5}, "latency.memory_efficiency' must be at most 1, got 1.5"),
    ({"floors_us": {"gemm": 3}}, "missing 'latency.floors_us.elementwise'"),
    ({"floors_us": {**GOOD["floors_us"], "gemv": 1}}, "unknown 'latency.floors_us.gemv'"),
    ({"moe_efficiency": None}, "missing required field 'latency.moe_efficiency'"),
    ({"colour": 1}, "unknown field 'latency.colour'"),
    ({"moe_efficiency": {"fp8": 0.6}}, "field 'latency.moe_efficiency' needs a bf16 entry"),
    ({"moe_efficiency": {"bf16": 0.7, "fp9": 0.6}}, "unknown dtype 'latency.moe_efficiency.fp9'"),
    ({"moe_efficiency": {"bf16": 0.7, "fp8": 0}}, "latency.moe_efficiency.fp8' must be positive"),
    ({"moe_efficiency": {"bf16": "fast"}}, "latency.moe_efficiency.bf16' must be a number"),
    ({"moe_efficiency": [0.7]}, "latency.moe_efficiency' must be a number"),
    ({"kernel_peak_tflops": [9000]}, "latency.kernel_peak_tflops' must be a mapping"),
    ({"kernel_peak_tflops": {"fp5": 9000}}, "unknown dtype 'latency.kernel_peak_tflops.fp5'"),
    ({"kernel_peak_tflops": {"fp4": -1}}, "latency.kernel_peak_tflops.fp4' must be positive"),
    ({"decode_attention": {"memory_efficiency": 0.9}}, "latency.decode_attention' must be a mapping of"),
    ({"decode_attention": {"memory_efficiency": 1.2, "streams_half": 1, "stream_ns": 5}},
     "latency.decode_attention.memory_efficiency' must be at most 1"),
    ({"decode_attention": {"memory_efficiency": 0.9, "streams_half": 0, "stream_ns": 5}},
     "latency.decode_attention.streams_half' must be positive"),
    ({"decode_attention": {"memory_efficiency": 0.9, "streams_half": 1, "stream_ns": -1}},
     "latency.decode_attention.stream_ns' must be at least 0"),
    ({"decode_attention": {"memory_efficiency": 0.9, "streams_half": 1, "stream_ns": 5, "unsplit_mha_cta_gb_s": 0}},
     "latency.decode_attention.unsplit_mha_cta_gb_s' must be positive"),
    ({"decode_attention": {"memory_efficiency": 0.9, "streams_half": 1, "stream_ns": 5, "splits": 4}},
     "latency.decode_attention' must be a mapping of"),
])
def test_latency_block_errors_name_the_field(change: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        latency_from_mapping({**GOOD, **change}, "gpu.yaml")


def test_moe_efficiency_per_compute_dtype() -> None:
    """A number applies to every compute dtype; a mapping per dtype, bf16 the default of the rest."""
    assert latency_from_mapping(GOOD, "gpu.yaml").moe_efficiency_by_dtype == {}
    latency = latency_from_mapping({**GOOD, "moe_efficiency": {"bf16": 0.8, "fp8": 0.6}}, "gpu.yaml")
    assert latency.moe_efficiency == 0.8 and latency.moe_efficiency_by_dtype == {"bf16": 0.8, "fp8": 0.6}
    h200 = load_gpu("h200").latency
    assert h200 is not None and h200.moe_efficiency_by_dtype == {"bf16": 0.79, "fp8": 0.53}
    rates = rates_for(load_gpu("h200"), load_engine("vllm").kernels)
    assert rates.grouped_efficiency("fp8") == 0.53  # bf16: vLLM's Triton kernel on its tuned shapes (0.83)
    assert rates_for(load_gpu("h200"), EngineKernels()).grouped_efficiency("bf16") == 0.79  # the GPU preset's
    assert rates_for(load_gpu("h200"), load_engine("trtllm").kernels).moe_expert_floors == pytest.approx(
        {"fp8_block": 0.245e-6, "nvfp4": 0.133e-6})
    assert rates_for(load_gpu("h200"), load_engine("vllm").kernels).moe_expert_floors == {}


def test_engine_moe_efficiency_replaces_the_gpu_value_on_its_gpus() -> None:
    """kernels.moe_efficiency: per GPU preset and compute dtype, replacing the GPU preset's entry for that engine
    only; other dtypes, other GPUs and other engines keep the GPU preset's; ideal rates stay at 1."""
    kernels = kernels_from_mapping({"moe_efficiency": {"h200": {"fp8": 0.5}}}, "e.yaml")
    assert kernels.moe_efficiency_by_gpu == {"h200": {"fp8": 0.5}}
    h200 = rates_for(load_gpu("h200"), kernels)
    assert h200.grouped_efficiency("fp8") == 0.5 and h200.grouped_efficiency("bf16") == 0.79
    assert h200.as_ideal().grouped_efficiency("fp8") == 1.0
    assert rates_for(load_gpu("h100-sxm"), kernels).grouped_efficiency("fp8") == 0.63
    assert rates_for(load_gpu("h200"), EngineKernels()).grouped_efficiency("fp8") == 0.53
    sglang = rates_for(load_gpu("h200"), load_engine("sglang").kernels)
    assert sglang.grouped_efficiency("fp8") == 0.75 and sglang.grouped_efficiency("bf16") == 0.95  # tuned shapes
    assert sglang.source.endswith(", bf16/fp4/fp8/int4 MoE efficiency from the engine preset")  # those it replaces
    assert sglang.grouped_efficiency("bf16", "fp4") == 0.63  # MXFP4 experts upcast to bf16 on Hopper
    vllm = rates_for(load_gpu("h200"), load_engine("vllm").kernels)
    # Triton bf16 and MXFP4 experts; ModelOpt FP8 experts (FlashInfer CUTLASS, autotuned) keep the GPU's fp8 value
    assert vllm.source.endswith(", bf16/fp4/int4 MoE efficiency from the engine preset")
    assert vllm.grouped_efficiency("bf16", "fp4") == 0.87 and vllm.grouped_efficiency("fp8") == 0.53
    # int4 groups (Kimi K2.5's experts) on each engine's own weight-only kernel: Marlin on Hopper (and vLLM's B200),
    # FlashInfer TRT-LLM's on SGLang's B200
    assert vllm.grouped_efficiency("bf16", "int4") == 0.38 and sglang.grouped_efficiency("bf16", "int4") == 0.41
    assert rates_for(load_gpu("b200"), load_engine("vllm").kernels).grouped_efficiency("bf16", "int4") == 0.19
    assert rates_for(load_gpu("b200"), load_engine("sglang").kernels).grouped_efficiency("bf16", "int4") == 0.65
    assert vllm.grouped_efficiency("fp8", weight_format="fp8_e4m3") == 0.53 and not vllm.moe_format_floors
    assert vllm.grouped_efficiency("bf16") == 0.83 and vllm.moe_untuned_efficiency == {"bf16": 0.76}
    assert "engine" not in rates_for(load_gpu("a100-80gb"), load_engine("vllm").kernels).source
    assert rates_for(load_gpu("b200"), load_engine("sglang").kernels).grouped_efficiency("fp8") == 0.45
    b200 = rates_for(load_gpu("b200"), load_engine("trtllm").kernels)
    assert b200.grouped_efficiency("fp8", weight_format="fp8_block") == 1.75
    assert b200.grouped_efficiency("fp8", weight_format="fp8_e4m3") == 0.45  # per-tensor: the GPU preset's kernel
    assert b200.grouped_efficiency("bf16", weight_format="bf16") == 1.35


def test_engine_moe_efficiency_is_validated() -> None:
    for value, message in (
            ({"h200x": {"fp8": 0.9}}, r"unknown field 'kernels.moe_efficiency.h200x' \(did you mean "
                                     r"'kernels.moe_efficiency.h200'\?\)$"),
            ({"h200": {"fp9": 0.9}}, "unknown field 'kernels.moe_efficiency.h200.fp9'"),
            ({"h200": {"fp8": 0}}, "field 'kernels.moe_efficiency.h200.fp8' must be at least 0.001, got 0$"),
            ({"h200": {"fp8": 4}}, "field 'kernels.moe_efficiency.h200.fp8' must be at most 3"),
            ({"h200": {"fp8": float("nan")}}, "kernels.moe_efficiency.h200.fp8' must be a finite number"),
            ({"h200": {"fp8": True}}, "kernels.moe_efficiency.h200.fp8' must be a number"),
            ({"h200": 0.9}, "field 'kernels.moe_efficiency.h200' must be a mapping of bf16, fp16, fp8, int8, int4, "
                            "fp4, fp8_e4m3, fp8_e5m2, fp8_block, mxfp4, nvfp4$"),
            (0.9, "field 'kernels.moe_efficiency' must be a mapping of GPU preset names")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"moe_efficiency": value}, "e.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("e.yaml: ")


def test_engine_unfused_activation_quant_names_formats_and_places() -> None:
    """kernels.unfused_activation_quant: per weight format, the kinds of kernel (norm, attention, activation) after
    which a fused engine's W8A8 / W4A4 linear still casts its own input; anything else is a one-line error."""
    kernels = kernels_from_mapping({"fused_activation_quant": True,
                                    "unfused_activation_quant": {"fp8_e4m3": ["norm"]}}, "e.yaml")
    assert kernels.unfused_activation_quant == {"fp8_e4m3": frozenset({"norm"})}
    assert not kernels.fuses_input_quant("fp8_e4m3", "norm") and kernels.fuses_input_quant("fp8_e4m3", "attention")
    assert kernels.fuses_input_quant("nvfp4", "norm")
    unfused = kernels_from_mapping({"unfused_activation_quant": {"fp8_e4m3": []}}, "e.yaml")
    assert not unfused.fuses_input_quant("fp8_e4m3", "attention")  # nothing is fused without fused_activation_quant
    for value, message in (
            ({"fp9": ["norm"]}, "unknown weight format 'fp9'"),
            ({"fp8_e4m3": ["gemm"]}, r"'kernels.unfused_activation_quant.fp8_e4m3' must be a list of norm, "
                                     r"attention, activation, got \['gemm'\]$"),
            (["norm"], "must map weight formats to lists of norm, attention, activation$")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"unfused_activation_quant": value}, "e.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("e.yaml: ")


def test_engine_moe_k0_replaces_gemm_k0_in_that_engines_fused_moe() -> None:
    """kernels.moe_k0: per GPU preset and compute dtype, the grouped GEMMs' K0 of that engine's fused MoE; dense
    GEMMs keep kernels.GEMM_K0; other dtypes, GPUs and engines' grouped GEMMs kernels.MOE_K0 (else GEMM_K0)."""
    kernels = kernels_from_mapping({"moe_efficiency": {"h200": {"fp8": 1.0}}, "moe_k0": {"h200": {"fp8": 4096}}},
                                   "e.yaml")
    assert kernels.moe_k0_by_gpu == {"h200": {"fp8": 4096.0}}
    h200 = rates_for(load_gpu("h200"), kernels)
    assert h200.moe_k0 == {"fp8": 4096.0} and "grouped-GEMM K0 fp8 4096" in h200.source
    dense = h200.gemm_flops_per_s("fp8", 1024)
    assert h200.gemm_flops_per_s("fp8", 1024, grouped=True) == pytest.approx(dense * (1024 + 512) / (1024 + 4096))
    assert h200.gemm_flops_per_s("bf16", 1024, grouped=True) == h200.gemm_flops_per_s("bf16", 1024)
    assert h200.as_ideal().gemm_flops_per_s("fp8", 1024, grouped=True) == h200.peak("fp8")[1]
    assert rates_for(load_gpu("h100-sxm"), kernels).moe_k0 == {}
    assert rates_for(load_gpu("h200"), load_engine("vllm").kernels).moe_k0 == {}
    trtllm = {g: rates_for(load_gpu(g), load_engine("trtllm").kernels) for g in ("h100-sxm", "h200", "b200")}
    assert {g: r.moe_k0 for g, r in trtllm.items()} == {"h100-sxm": {"fp8_block": 4096, "bf16": 768},
                                                         "h200": {"fp8_block": 4096, "bf16": 512},
                                                         "b200": {"fp8_block": 1536, "bf16": 1280}}
    h200 = trtllm["h200"]  # a format's K0 is looked up before its compute dtype's; per-tensor fp8 takes MOE_K0
    assert h200.gemm_flops_per_s("fp8", 1024, True, "fp8_block") == pytest.approx(
        h200.gemm_flops_per_s("fp8", 1024) * (1024 + 512) / (1024 + 4096))
    assert h200.gemm_flops_per_s("fp8", 1024, True, "fp8_e4m3") == pytest.approx(
        h200.gemm_flops_per_s("fp8", 1024) * (1024 + 512) / (1024 + 128))


def test_engine_grouped_gemms_never_run_above_the_peak() -> None:
    """Every bundled engine's (moe_efficiency, moe_k0) pair keeps its grouped GEMMs at most at the GPU's peak
    however long K grows: efficiency x the GPU's large-GEMM efficiency <= 1 (the rule moe_kernel_rates.py --k0
    picks K0 by), and at any K the grouped rate stays below the peak."""
    from tfcalc.spec.presets import preset_names

    checked = 0
    for name in preset_names("engine"):
        kernels = load_engine(name).kernels
        for gpu_name, by_dtype in kernels.moe_k0_by_gpu.items():
            rates = rates_for(load_gpu(gpu_name), kernels)
            for key in by_dtype:  # a compute dtype or a storage format (fp8_block computes in fp8)
                dtype = linear_mode(get_dtype(key), load_gpu(gpu_name)).compute
                grouped = rates.grouped_efficiency(dtype, weight_format=key)
                assert grouped * rates.gemm_efficiency[dtype] <= 1.0, (name, gpu_name, key)
                for k in (128, 7168, 1 << 20):
                    rate = rates.gemm_flops_per_s(dtype, k, True, key) * grouped
                    assert rate < rates.peak(dtype)[1]
                checked += 1
    assert checked >= 6


def test_engine_moe_k0_is_validated() -> None:
    for value, message in (
            ({"h200": {"fp8": 0}}, "field 'kernels.moe_k0.h200.fp8' must be at least 1, got 0$"),
            ({"h200": {"fp8": 1e6}}, "field 'kernels.moe_k0.h200.fp8' must be at most 65536"),
            ({"h200": {"fp9": 512}}, "unknown field 'kernels.moe_k0.h200.fp9'"),
            ({"h100-sxm": {"fp8": 512}}, "field 'kernels.moe_k0.h100-sxm.fp8' needs "
                                         "'kernels.moe_efficiency.h100-sxm.fp8'")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"moe_efficiency": {"h200": {"fp8": 1.0}}, "moe_k0": value}, "e.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("e.yaml: ")


def test_engine_moe_dequant_per_tile_per_gpu() -> None:
    """kernels.moe_dequant_per_tile: per GPU preset, the weight-only formats that engine's fused MoE unpacks again in
    every row tile; vLLM's and TensorRT-LLM's MXFP4 experts on Hopper do, SGLang's do not; vLLM's and SGLang's int4
    experts (Marlin; FlashInfer TRT-LLM's on SGLang's B200) do; no other GPU is affected."""
    parsed = kernels_from_mapping({"moe_dequant_per_tile": {"h200": ["fp4", "int4"]}}, "e.yaml")
    assert parsed.moe_dequant_per_tile_by_gpu == {"h200": frozenset({"fp4", "int4"})}
    assert rates_for(load_gpu("h200"), parsed).moe_dequant_per_tile == {"fp4", "int4"}
    assert rates_for(load_gpu("a100-80gb"), parsed).moe_dequant_per_tile == frozenset()
    for engine, hopper in (("vllm", {"fp4", "int4"}), ("trtllm", {"fp4"})):
        for gpu in ("h100-sxm", "h200", "h100-pcie"):  # the PCIe part through kernels_as
            assert rates_for(load_gpu(gpu), load_engine(engine).kernels).moe_dequant_per_tile == hopper
        assert rates_for(load_gpu("a100-80gb"), load_engine(engine).kernels).moe_dequant_per_tile == frozenset()
    for engine, gpu in (("sglang", "h200"), ("sglang", "b200"), ("vllm", "b200")):
        assert rates_for(load_gpu(gpu), load_engine(engine).kernels).moe_dequant_per_tile == {"int4"}
    for value, message in (
            ({"h200": "fp4"}, "field 'kernels.moe_dequant_per_tile.h200' must be a list of int8, fp8, int4, fp4, got"),
            ({"h200": ["fp5"]}, "field 'kernels.moe_dequant_per_tile.h200' must be a list of"),
            ({"h201": ["fp4"]}, "unknown field 'kernels.moe_dequant_per_tile.h201'"),
            (["fp4"], "field 'kernels.moe_dequant_per_tile' must be a mapping of GPU preset names")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"moe_dequant_per_tile": value}, "e.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("e.yaml: ")


def test_engine_moe_weight_only_per_gpu() -> None:
    """kernels.moe_weight_only: per GPU preset, the formats that engine's fused MoE runs weight-only although the GPU
    has tensor cores for them (an engine YAML for vLLM's code default on Blackwell, MXFP4 x BF16). No shipped preset
    sets it: the measured vLLM runs on B200 are as fast as MXFP8 activations (docs/estimate-validation.md)."""
    parsed = kernels_from_mapping({"moe_weight_only": {"b200": ["fp4"]}}, "e.yaml")
    assert parsed.moe_weight_only_by_gpu == {"b200": frozenset({"fp4"})}
    for engine in ("vllm", "sglang", "trtllm", "gpt-fast"):
        assert load_engine(engine).kernels.moe_weight_only_by_gpu == {}
    for value, message in (
            ({"b200": "fp4"}, "field 'kernels.moe_weight_only.b200' must be a list of int8, fp8, int4, fp4, got"),
            ({"b200": ["mxfp4"]}, "field 'kernels.moe_weight_only.b200' must be a list of"),
            ({"b201": ["fp4"]}, "unknown field 'kernels.moe_weight_only.b201'")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"moe_weight_only": value}, "e.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("e.yaml: ")


def test_engine_deepep_moe_kernel() -> None:
    """kernels.deepep_moe: per GPU preset, the experts' kernel where DeepEP brings the tokens (SGLang: DeepGEMM's
    masked grouped GEMMs on fp8 rows), parsed as a moe_by_architecture entry with its 8-bit rows; bad entries fail
    in one line that names the field."""
    entry = {"efficiency": {"fp8_block": 1.2}, "memory_efficiency": {"fp8_block": 0.8},
             "floors_us": {"fp8_block": 20}, "fused_rows": ["fp8_block"]}
    parsed = kernels_from_mapping({"deepep_moe": {"h200": entry}}, "e.yaml")
    kernel = parsed.deepep_moe_by_gpu["h200"]
    assert kernel.efficiency == {"fp8_block": 1.2} and kernel.fused_rows == {"fp8_block"}
    assert kernel.floors_s == {"fp8_block": pytest.approx(20e-6)} and kernel.memory_efficiency == {"fp8_block": 0.8}
    sglang = load_engine("sglang").kernels
    assert {"h100-sxm", "h200", "b200"} <= set(sglang.deepep_moe_by_gpu)
    assert not load_engine("vllm").kernels.deepep_moe_by_gpu
    for value, message in (({"h200": {"efficiency": {"fp8_block": 1.2}, "fused_rows": ["bf16"]}},
                            "kernels.deepep_moe.h200.fused_rows' must be a list of fp8_e4m3, fp8_block"),
                           ({"h200": {"memory_efficiency": {"fp8_block": 0.8}}},
                            "kernels.deepep_moe.h200' must be a mapping with efficiency"),
                           ({"h900": {"efficiency": {"fp8_block": 1.2}}}, "unknown field 'kernels.deepep_moe.h900'")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"deepep_moe": value}, "e.yaml")
        assert "\n" not in str(caught.value)


def test_engine_moe_by_architecture() -> None:
    """kernels.moe_by_architecture: per GPU preset and model architecture, the fused MoE the engine runs for it (its
    efficiency, fixed cost and expert-parallel rows), over the engine's per-GPU entries. SGLang on a B200 serves
    Qwen3-MoE and DeepSeek-V3 with FlashInfer TRT-LLM's MoE and every other MoE (Mixtral) with its Triton one;
    elsewhere nothing changes."""
    parsed = kernels_from_mapping({"moe_efficiency": {"b200": {"bf16": 0.3}},
                                   "moe_floors_us": {"b200": {"bf16": 31.0, "fp8_block": 33.0}},
                                   "moe_ep_every_row": ["b200"],
                                   "moe_by_architecture": {"b200": {"Qwen3MoeForCausalLM": {
                                       "efficiency": {"bf16": 1.1, "fp8_block": 0.5}, "floors_us": {"bf16": 14.0},
                                       "ep_every_row": ["fp8_block"]}}}},
                                  "e.yaml")
    b200, h200 = load_gpu("b200"), load_gpu("h200")
    qwen = rates_for(b200, parsed, architecture="Qwen3MoeForCausalLM")
    other = rates_for(b200, parsed, architecture="MixtralForCausalLM")
    assert qwen.moe_efficiency_by_dtype["bf16"] == 1.1 and other.moe_efficiency_by_dtype["bf16"] == 0.3
    assert rates_for(b200, parsed).moe_efficiency_by_dtype["bf16"] == 0.3
    assert "Qwen3MoeForCausalLM's kernel" in qwen.source
    # its own floor where it has one, the GPU's per-format floor elsewhere
    assert qwen.moe_format_floors == {"bf16": pytest.approx(14e-6), "fp8_block": pytest.approx(33e-6)}
    assert other.moe_format_floors == {"bf16": pytest.approx(31e-6), "fp8_block": pytest.approx(33e-6)}
    # "*" (every format) stays for the default kernel's formats; the architecture's kernel says for its own
    assert "*" in other.moe_ep_every_row
    assert "fp8_block" in qwen.moe_ep_every_row and "bf16" not in qwen.moe_ep_every_row
    assert {"mxfp4", "nvfp4", "fp8_e4m3"} <= qwen.moe_ep_every_row
    sglang = load_engine("sglang").kernels
    qwen_sglang = rates_for(b200, sglang, architecture="Qwen3MoeForCausalLM")
    triton = rates_for(b200, sglang, architecture="MixtralForCausalLM")
    mixtral = triton.moe_efficiency_by_dtype
    assert (8, 1792) not in triton.moe_tuned_shapes["bf16"]  # no Mixtral shape has a Triton config on B200
    assert qwen_sglang.moe_efficiency_by_dtype["bf16"] > 3 * triton.moe_untuned_efficiency["bf16"]
    assert qwen_sglang.moe_efficiency_by_dtype["fp8_block"] > mixtral["fp8_block"]
    assert qwen_sglang.moe_efficiency_by_dtype["bf16"] > mixtral["bf16"]  # its tuned Triton shapes too
    # FlashInfer TRT-LLM's bf16 MoE starts sooner than Triton's and computes only its own experts' rows under ep
    assert qwen_sglang.floor("moe", "bf16") < 0.5 * triton.floor("moe", "bf16")
    # on Hopper SGLang runs Nemotron-H's experts on FlashInfer CUTLASS, untuned: one slow weight stream of its own
    nano = rates_for(h200, sglang, architecture="NemotronHForCausalLM")
    assert nano.moe_weight_stream == {"bf16": 0.15} and nano.grouped_efficiency("bf16") == 0.231
    assert nano.moe_format_floors["bf16"] == pytest.approx(105e-6) and "bf16" not in nano.moe_tuned_shapes
    assert rates_for(h200, sglang, architecture="MixtralForCausalLM").moe_weight_stream == {}
    assert rates_for(b200, sglang, architecture="NemotronHForCausalLM").moe_weight_stream == {}
    stream = kernels_from_mapping({"moe_by_architecture": {"h200": {"NemotronHForCausalLM": {
        "efficiency": {"bf16": 0.2}, "memory_efficiency": {"bf16": 0.5}}}}}, "e.yaml")
    assert stream.moe_by_architecture["h200"]["NemotronHForCausalLM"].memory_efficiency == {"bf16": 0.5}
    for value, message in (({"bf16": 1.5}, "memory_efficiency.bf16' must be at most 1"),
                           ({"bf17": 0.5}, "unknown field 'kernels.moe_by_architecture.h200.NemotronHForCausalLM."
                                           "memory_efficiency.bf17'")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"moe_by_architecture": {"h200": {"NemotronHForCausalLM": {
                "efficiency": {"bf16": 0.2}, "memory_efficiency": value}}}}, "e.yaml")
    assert "bf16" in triton.moe_ep_every_row and "bf16" not in qwen_sglang.moe_ep_every_row
    assert (rates_for(h200, sglang, architecture="Qwen3MoeForCausalLM").moe_efficiency_by_dtype
            == rates_for(h200, sglang, architecture="MixtralForCausalLM").moe_efficiency_by_dtype)
    assert load_engine("trtllm").kernels.moe_by_architecture == {}
    # vLLM: Kimi K3's MXFP4 experts alone, on Marlin (weight-only fp4) on Blackwell
    (k3,) = load_engine("vllm").kernels.moe_by_architecture["b200"].values()
    assert k3.weight_only == {"fp4"} and k3.ep_every_row == {"mxfp4"}
    assert kernels_from_mapping({"moe_by_architecture": {"b200": {"X": {
        "efficiency": {"mxfp4": 0.2}, "weight_only": ["fp4"]}}}}, "e.yaml").moe_by_architecture["b200"]["X"] \
        .weight_only == {"fp4"}
    with pytest.raises(SpecError, match="weight_only' must be a list of int8, fp8, int4, fp4"):
        kernels_from_mapping({"moe_by_architecture": {"b200": {"X": {
            "efficiency": {"mxfp4": 0.2}, "weight_only": ["mxfp4"]}}}}, "e.yaml")
    arch = "Qwen3MoeForCausalLM"
    for value, message in (
            ({"b200": {arch: {"efficiency": {"bf17": 1.0}}}},
             f"unknown field 'kernels.moe_by_architecture.b200.{arch}.efficiency.bf17'"),
            ({"b200": {"Qwen3 Moe": {"efficiency": {"bf16": 1.0}}}}, "has 'Qwen3 Moe', not an architecture class"),
            ({"b200": {arch: {"efficiency": {"bf16": 0}}}}, "must be at least 0.001"),
            ({"b200": {arch: {"bf16": 1.0}}}, f"field 'kernels.moe_by_architecture.b200.{arch}' must be a mapping "
                                              "with efficiency"),
            ({"b200": {arch: {"efficiency": {"bf16": 1.0}, "floor_us": {}}}},
             f"unknown field 'kernels.moe_by_architecture.b200.{arch}.floor_us'"),
            ({"b200": {arch: {"efficiency": {"bf16": 1.0}, "floors_us": {"bf16": -1}}}}, "must be at least 0"),
            ({"b200": {arch: {"efficiency": {"bf16": 1.0}, "ep_every_row": ["fp8_block"]}}},
             "ep_every_row' must be a list of formats its efficiency names"),
            ({"b201": {arch: {"efficiency": {"bf16": 1.0}}}}, "unknown field 'kernels.moe_by_architecture.b201'"),
            ({"b200": []}, "must be a mapping of model architectures")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"moe_by_architecture": value}, "e.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("e.yaml: ")


def test_engine_moe_ep_every_row_gpus() -> None:
    """kernels.moe_ep_every_row: the GPUs (and expert formats) on which the engine's fused MoE touches every token's
    rows under expert parallelism; SGLang's kernels on every Hopper part measured, every format, and on the B200 all
    but its FlashInfer FP4 ones (mxfp4, nvfp4: their own rows); vLLM's block-fp8 kernel on the B200 only (its bf16,
    nvfp4 and fp8 kernels there scale with their share); TensorRT-LLM's nowhere. "*" in a mapping: every format."""
    parsed = kernels_from_mapping({"moe_ep_every_row": ["h200"]}, "e.yaml")
    assert rates_for(load_gpu("h200"), parsed).moe_ep_every_row == {"*"}
    assert not rates_for(load_gpu("b200"), parsed).moe_ep_every_row
    by_format = kernels_from_mapping({"moe_ep_every_row": {"b200": ["fp8_block", "nvfp4"]}}, "e.yaml")
    assert by_format.moe_ep_every_row_by_gpu == {"b200": {"fp8_block", "nvfp4"}}
    assert kernels_from_mapping({"moe_ep_every_row": {"h200": ["*"]}}, "e.yaml").moe_ep_every_row_by_gpu == {
        "h200": {"*"}}
    sglang = load_engine("sglang").kernels.moe_ep_every_row_by_gpu
    assert sglang["h100-sxm"] == sglang["h200"] == {"*"} and set(sglang) == {"h100-sxm", "h200", "b200"}
    assert "fp8_block" in sglang["b200"] and not {"mxfp4", "nvfp4", "*"} & sglang["b200"]
    assert rates_for(load_gpu("h100-pcie"), load_engine("sglang").kernels).moe_ep_every_row  # H100 SXM's silicon
    assert load_engine("vllm").kernels.moe_ep_every_row_by_gpu == {"b200": {"fp8_block"}}
    assert load_engine("trtllm").kernels.moe_ep_every_row_by_gpu == {}
    for value, message in (("h200", "field 'kernels.moe_ep_every_row' must be a list of GPU preset names"),
                           (["h201"], "field 'kernels.moe_ep_every_row' names an unknown GPU preset 'h201'"),
                           ({"h201": ["bf16"]}, "unknown field 'kernels.moe_ep_every_row.h201'"),
                           ({"b200": ["bf17"]}, "field 'kernels.moe_ep_every_row.b200' must be a list of bf16"),
                           ({"b200": []}, "field 'kernels.moe_ep_every_row.b200' must be a list of")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"moe_ep_every_row": value}, "e.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("e.yaml: ")


def test_engine_moe_fused_rows_per_gpu() -> None:
    """kernels.moe_fused_rows: per GPU preset, the fp8 expert formats whose fused MoE passes 8-bit rows with the
    activation fused; vLLM's per-tensor FP8 experts on a B200 (FlashInfer's TRT-LLM MoE), with that kernel's
    efficiency and large-expert slowdown, and nowhere else; one-line errors for other formats or shapes."""
    vllm = load_engine("vllm").kernels
    b200 = rates_for(load_gpu("b200"), vllm)
    assert b200.moe_fused_rows == frozenset({"fp8_e4m3"})
    assert b200.grouped_efficiency("fp8", weight_format="fp8_e4m3") == 1.10
    assert b200.moe_large_expert["fp8_e4m3"] == (pytest.approx(64 * 2**20), 2.0)
    assert b200.grouped_efficiency("fp8", weight_format="fp8_block") == 0.45  # another kernel: the GPU's value
    assert rates_for(load_gpu("h200"), vllm).moe_fused_rows == frozenset()
    assert rates_for(load_gpu("b200"), load_engine("sglang").kernels).moe_fused_rows == frozenset()
    for value, message in (({"b200": ["nvfp4"]}, "'kernels.moe_fused_rows.b200' must be a list of fp8_e4m3, "
                                                 "fp8_block"),
                           (["fp8_e4m3"], "'kernels.moe_fused_rows' must be a mapping")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"moe_fused_rows": value}, "e.yaml")
        assert "\n" not in str(caught.value)


def test_engine_moe_floors_per_gpu_and_format() -> None:
    """kernels.moe_floors_us: per GPU preset and expert storage format, the fused MoE's fixed cost, replacing the
    moe floor for that format only (TensorRT-LLM's MXFP4 backends: Triton on Hopper, TRTLLM-gen on a B200); CUDA
    graphs off, a short kernel lasts at least the launch interval; ideal rates have none."""
    kernels = kernels_from_mapping({"moe_floors_us": {"h200": {"mxfp4": 50}}}, "e.yaml")
    assert kernels.moe_floors_by_gpu == {"h200": {"mxfp4": pytest.approx(50e-6)}}
    h200 = rates_for(load_gpu("h200"), kernels)
    assert h200.floor("moe", "mxfp4") == pytest.approx(50e-6)
    assert h200.floor("moe", "bf16") == h200.floor("moe") == pytest.approx(26e-6)  # the GPU preset's
    assert h200.as_ideal().floor("moe", "mxfp4") == 0.0
    eager = rates_for(load_gpu("h200"), kernels_from_mapping({"moe_floors_us": {"h200": {"mxfp4": 1}}}, "e.yaml"),
                      cuda_graphs=False)
    assert eager.fixed(eager.floor("moe", "mxfp4"), 0.0) == pytest.approx(eager.launch_s)
    trtllm = {g: rates_for(load_gpu(g), load_engine("trtllm").kernels) for g in ("h100-pcie", "h200", "b200")}
    assert trtllm["b200"].floor("moe", "mxfp4") < trtllm["b200"].floor("moe") < trtllm["h200"].floor("moe", "mxfp4")
    assert trtllm["h100-pcie"].floor("moe", "mxfp4") == pytest.approx(49.6e-6)  # kernels_as: h100-sxm
    for value, message in (
            ({"h200": {"mxfp5": 9}}, "unknown field 'kernels.moe_floors_us.h200.mxfp5'"),
            ({"h200": {"mxfp4": -1}}, "field 'kernels.moe_floors_us.h200.mxfp4' must be at least 0"),
            ({"h201": {"mxfp4": 9}}, "unknown field 'kernels.moe_floors_us.h201'")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"moe_floors_us": value}, "e.yaml")


def test_engine_msa_fp32_expansion_per_gpu_and_phase() -> None:
    """kernels.msa_fp32_expansion: per GPU preset, the fractions of the datasheet bandwidth of MiniMax-M3's FP32
    expansion path, decode and prefill both; TensorRT-LLM's names the H200 only (its Triton path is the only one off
    SM100; the B200 runs fmha_sm100); bad values are one-line errors."""
    kernels = kernels_from_mapping({"msa_fp32_expansion": {"h200": {"decode": 0.3, "prefill": 0.7}}}, "e.yaml")
    assert rates_for(load_gpu("h200"), kernels).msa_fp32_expansion == {"decode": 0.3, "prefill": 0.7}
    assert rates_for(load_gpu("b200"), kernels).msa_fp32_expansion == {}
    trtllm = load_engine("trtllm").kernels
    assert set(trtllm.msa_fp32_expansion_by_gpu) == {"h200"}
    assert "msa_decode" in trtllm.dsa_block_floors_by_gpu["b200"]
    assert not load_engine("vllm").kernels.msa_fp32_expansion_by_gpu
    for value, message in (
            ({"h200": {"decode": 0.3}}, "field 'kernels.msa_fp32_expansion.h200' must be a mapping of decode and"),
            ({"h200": {"decode": 0.3, "prefill": 2}}, "field 'kernels.msa_fp32_expansion.h200.prefill' must be at"),
            ({"h201": {"decode": 0.3, "prefill": 0.7}}, "unknown field 'kernels.msa_fp32_expansion.h201'")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"msa_fp32_expansion": value}, "e.yaml")


def test_vllm_mla_block_floor_is_the_gpus_own_where_it_runs_flashinfer_mla() -> None:
    """vLLM runs FlashAttention MLA on Hopper and FlashInfer MLA on Blackwell: its block floor per layer is 79 us on the
    H200 (block_floors_us) and the B200's own 30 us (dsa_block_floors_us b200 mla_decode), no more than the kernels'
    floors of Kimi K2.5's bf16 attention there, so its B200 decode block at one sequence and 256 tokens costs what
    its kernels cost without any block floor; the B300's own rows give it 67 us (read beside the B200's other
    entries), the H200's 79 us, each plus its kernels' work. A mla_decode key is accepted per GPU; a DSA model's
    decode / prefill keep their own."""
    from tfcalc.calc.latency import StepShape, deployment, step_time
    from tfcalc.dtypes import parse_weight_precision
    from tfcalc.spec.presets import load_model

    vllm = load_engine("vllm").kernels
    assert vllm.block_floors_s["mla_decode"] == pytest.approx(79e-6)
    assert vllm.dsa_block_floors_by_gpu["b200"]["mla_decode"] == pytest.approx(30e-6)
    assert "mla_decode" not in vllm.dsa_block_floors_by_gpu["h200"]
    spec = load_model("kimi-k2.5")
    shape = StepShape(decode_seqs=1, decode_context=256)

    def attention(gpu: str, kernels: EngineKernels) -> object:
        d = deployment(spec, load_gpu(gpu), parse_weight_precision("default=nvfp4,attention=bf16"), get_dtype("bf16"),
                       tp=8, engine_kernels=kernels)
        return step_time(d, shape, "decode").groups["attention"]

    bare = dataclasses.replace(vllm, block_floors_s={})
    assert attention("b200", vllm).seconds == pytest.approx(attention("b200", bare).seconds)
    assert attention("b200", vllm).floor_seconds / spec.num_layers > 30e-6
    for gpu, block in (("h200", 79e-6), ("b300", 67e-6)):  # the B300's own rows, beside the B200's other entries
        floored, unfloored = attention(gpu, vllm), attention(gpu, bare)
        assert floored.floor_seconds / spec.num_layers == pytest.approx(block)
        assert floored.seconds - floored.floor_seconds == pytest.approx(unfloored.seconds - unfloored.floor_seconds)
    assert vllm.dsa_block_floors_by_gpu["b300"] == {"mla_decode": pytest.approx(67e-6)}
    mine = kernels_from_mapping({"dsa_block_floors_us": {"b200": {"mla_decode": 30}}}, "e.yaml")
    assert mine.dsa_block_floors_by_gpu == {"b200": {"mla_decode": pytest.approx(30e-6)}}


def test_engine_moe_ep_floors_add_under_expert_parallelism() -> None:
    """kernels.moe_ep_floors_us: per GPU preset and expert format, what the fused MoE adds under expert parallelism
    (vLLM's MXFP4 experts on Hopper route through the expert map in kernels of their own): exactly that much more at
    ep > 1, nothing at ep 1, for other formats or GPUs, or in ideal mode; bad values are one-line errors."""
    from tfcalc.calc import kernels as k

    vllm = load_engine("vllm").kernels
    assert vllm.moe_ep_floors_by_gpu == {"h100-sxm": {"mxfp4": pytest.approx(26.0e-6)},
                                         "h200": {"mxfp4": pytest.approx(26.9e-6)}}
    h200, b200 = rates_for(load_gpu("h200"), vllm), rates_for(load_gpu("b200"), vllm)
    without = dataclasses.replace(h200, moe_ep_floors={})
    shape = dict(tokens=4, experts_total=128, top_k=4, hidden=2880, expert_width=2880, gated=True, weight_bits=4.25,
                 compute="bf16", dequant="fp4", weight_format="mxfp4")
    assert k.moe_experts(h200, experts_local=32, **shape).seconds - k.moe_experts(
        without, experts_local=32, **shape).seconds == pytest.approx(26.9e-6)
    assert k.moe_experts(h200, experts_local=128, **shape).seconds == k.moe_experts(
        without, experts_local=128, **shape).seconds  # ep 1
    bf16 = {**shape, "weight_bits": 16, "dequant": "", "weight_format": "bf16"}
    assert k.moe_experts(h200, experts_local=32, **bf16).seconds == k.moe_experts(
        without, experts_local=32, **bf16).seconds
    assert not b200.moe_ep_floors and rates_for(load_gpu("h100-pcie"), vllm).moe_ep_floors == {
        "mxfp4": pytest.approx(26.0e-6)}  # kernels_as: h100-sxm
    ideal = h200.as_ideal()
    assert k.moe_experts(ideal, experts_local=32, **shape).seconds == k.moe_experts(
        dataclasses.replace(ideal, moe_ep_floors={}), experts_local=32, **shape).seconds
    for value, message in (({"h200": {"mxfp4": -1}}, "field 'kernels.moe_ep_floors_us.h200.mxfp4' must be at least 0"),
                           ({"h201": {"mxfp4": 9}}, "unknown field 'kernels.moe_ep_floors_us.h201'")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"moe_ep_floors_us": value}, "e.yaml")


def test_engine_moe_row_bytes_per_gpu_and_format() -> None:
    """kernels.moe_row_bytes: per GPU preset and expert format, the bytes per routed row and hidden element a fused
    MoE moves beyond the staged rows (TensorRT-LLM's CUTLASS NVFP4 flow on a B200); none elsewhere, none in ideal
    mode; bad values are one-line errors."""
    from tfcalc.calc import kernels as k

    trtllm = load_engine("trtllm").kernels
    b200 = rates_for(load_gpu("b200"), trtllm)
    assert b200.moe_row_bytes == {"nvfp4": pytest.approx(16.3)}
    assert not rates_for(load_gpu("b200"), load_engine("vllm").kernels).moe_row_bytes
    assert not rates_for(load_gpu("h200"), trtllm).moe_row_bytes
    shape = dict(tokens=4096, experts_local=128, experts_total=128, top_k=8, hidden=4096, expert_width=1536,
                 gated=True, weight_bits=4.5, compute="fp4", weight_format="nvfp4")
    without = dataclasses.replace(b200, moe_row_bytes={})
    assert k.moe_experts(b200, **shape).bytes - k.moe_experts(without, **shape).bytes == pytest.approx(
        4096 * 8 * 4096 * 16.3)
    ideal = b200.as_ideal()
    assert k.moe_experts(ideal, **shape).seconds == k.moe_experts(
        dataclasses.replace(ideal, moe_row_bytes={}), **shape).seconds
    for value, message in (({"b200": {"nvfp4": -1}}, "field 'kernels.moe_row_bytes.b200.nvfp4' must be at least 0"),
                           ({"b201": {"nvfp4": 9}}, "unknown field 'kernels.moe_row_bytes.b201'")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"moe_row_bytes": value}, "e.yaml")


def test_trtllm_nvfp4_experts_pay_its_cutlass_cost_per_local_expert() -> None:
    """TensorRT-LLM runs NVFP4 experts on its CUTLASS MoE at every batch (MoeConfig backend AUTO -> CUTLASS): its
    fixed cost grows by 0.133 us per expert on the GPU (kernels.moe_expert_floors_us nvfp4), so Kimi K2.5's 384
    experts at one token cost 384 x 0.133 = 51.1 us more than without it, 48 of them at ep 8 one eighth of that; the
    work is unchanged, vLLM's NVFP4 experts (FlashInfer) pay none, and ideal mode none."""
    from tfcalc.calc import kernels as k

    b200 = rates_for(load_gpu("b200"), load_engine("trtllm").kernels)
    without = dataclasses.replace(b200, moe_expert_floors={})
    shape = dict(tokens=1, experts_local=384, experts_total=384, top_k=8, hidden=7168, expert_width=256, gated=True,
                 weight_bits=4.5, compute="fp4", weight_format="nvfp4")
    mine, base = k.moe_experts(b200, **shape), k.moe_experts(without, **shape)
    assert mine.floor_seconds - base.floor_seconds == pytest.approx(384 * 0.133e-6)
    assert mine.seconds - mine.floor_seconds == pytest.approx(base.seconds - base.floor_seconds)
    ep8 = {**shape, "experts_local": 48}
    assert (k.moe_experts(b200, **ep8).floor_seconds - k.moe_experts(without, **ep8).floor_seconds
            == pytest.approx(48 * 0.133e-6))
    vllm = rates_for(load_gpu("b200"), load_engine("vllm").kernels)
    assert "nvfp4" not in vllm.moe_expert_floors
    assert k.moe_experts(b200.as_ideal(), **shape).seconds == k.moe_experts(without.as_ideal(), **shape).seconds


def test_engine_fp8_kv_attention_per_gpu() -> None:
    """kernels.fp8_kv_attention: per GPU preset, decode attention over an fp8 cache as fixed_us + scale x the bf16
    cache's time (vLLM's and SGLang's FA3 on Hopper); TensorRT-LLM has none (its fp8 cache streams at full
    bandwidth); a GPU sharing its silicon takes the entry (H100 PCIe -> H100 SXM); bad entries are one line."""
    k = kernels_from_mapping({"fp8_kv_attention": {"h200": {"fixed_us": 4, "scale": 0.9}}}, "e.yaml")
    assert k.fp8_kv_attention_by_gpu == {"h200": (pytest.approx(4e-6), 0.9)}
    assert rates_for(load_gpu("h200"), k).fp8_kv_attention == (pytest.approx(4e-6), 0.9)
    assert rates_for(load_gpu("b200"), k).fp8_kv_attention is None
    vllm, sglang, trtllm = (load_engine(e).kernels for e in ("vllm", "sglang", "trtllm"))
    assert rates_for(load_gpu("h100-pcie"), vllm).fp8_kv_attention == vllm.fp8_kv_attention_by_gpu["h100-sxm"]
    assert sglang.fp8_kv_attention_by_gpu["h200"][1] > vllm.fp8_kv_attention_by_gpu["h200"][1] > 0.5
    assert trtllm.fp8_kv_attention_by_gpu == {}
    for value, message in (
            ({"h200": {"fixed_us": 4}}, "needs both fixed_us and scale"),
            ({"h200": {"fixed_us": 4, "scale": 0}}, "scale' must be in \\(0, 4\\]"),
            ({"h200": {"fixed_us": 4, "scale": 0.9, "slope": 1}},
             "unknown field 'kernels.fp8_kv_attention.h200.slope'"),
            ({"h201": {"fixed_us": 4, "scale": 0.9}}, "unknown field 'kernels.fp8_kv_attention.h201'")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"fp8_kv_attention": value}, "e.yaml")
        assert "\n" not in str(caught.value)


# aiconfigurator 0.12 systems/data/<gpu>/attention/vllm/0.24.0 generation_attention_perf, Llama-3.1-8B's heads
# (32 query, 8 KV, head dim 128): (GPU, batch, context, us over a bf16 cache, us over an fp8 cache)
VLLM_DECODE_ATTENTION = (("h100-sxm", 1, 65536, 117.1, 75.1), ("h100-sxm", 8, 65536, 693.3, 376.0),
                         ("h100-sxm", 64, 4096, 353.6, 210.4), ("h200", 1, 65536, 84.3, 63.8),
                         ("h200", 8, 65536, 497.6, 345.3), ("b200", 1, 65536, 56.4, 35.5),
                         ("b200", 8, 65536, 299.8, 157.9), ("b200", 64, 4096, 158.7, 86.5),
                         ("rtx-pro-6000", 8, 65536, 1423.8, 721.9), ("rtx-pro-6000", 64, 4096, 721.2, 373.4))


@pytest.mark.parametrize(("gpu", "batch", "context", "bf16_us", "fp8_us"), VLLM_DECODE_ATTENTION)
def test_decode_attention_against_vllms_measured_kernel(gpu: str, batch: int, context: int, bf16_us: float,
                                                        fp8_us: float) -> None:
    """Long-context decode attention with the GPU preset's measured kernel (latency.decode_attention) and vLLM's
    fp8 entry lands within 15 % of vLLM's measured FA3 / FA2 / FlashInfer kernel over both caches (the streaming
    fraction, u_half 2.8 and no per-stream time of before: +14 ... +17 % in bf16, up to +47 % over fp8 on the
    H100), and the fp8 cache is faster than the bf16 one as in the table."""
    rates = rates_for(load_gpu(gpu), load_engine("vllm").kernels)
    bf16_bytes, flops = batch * context * 8 * 128 * 2 * 2, 4.0 * batch * 32 * 128 * context
    bf16 = kernels.decode_attention(rates, batch, 8, bf16_bytes, flops).seconds * 1e6
    fp8 = kernels.decode_attention(rates, batch, 8, bf16_bytes / 2, flops, fp8_cache=True).seconds * 1e6
    assert bf16 == pytest.approx(bf16_us, rel=0.15) and fp8 == pytest.approx(fp8_us, rel=0.15)
    assert fp8 < bf16


# MHA decode (query heads = KV heads, head dim 128, bf16 cache) in aiconfigurator 0.12's vLLM FlashAttention-2
# tables: (GPU, batch, context, heads, ms): systems/data/a100_sxm/attention/vllm/0.14.0 and l40s/.../vllm/0.24.0
FA2_MHA_DECODE = [("a100-80gb", 1, 131072, 4, 3.017), ("a100-80gb", 16, 32768, 1, 0.771),
                  ("a100-80gb", 4, 32768, 8, 0.768), ("a100-80gb", 64, 32768, 1, 0.802),
                  ("l40s", 1, 131072, 4, 2.444), ("l40s", 16, 32768, 1, 0.619), ("l40s", 8, 32768, 4, 0.719)]


@pytest.mark.parametrize(("gpu", "batch", "context", "heads", "ms"), FA2_MHA_DECODE)
def test_unsplit_mha_decode_against_fa2_tables(gpu: str, batch: int, context: int, heads: int, ms: float) -> None:
    """vLLM's FlashAttention-2 runs an MHA decode with one CTA per (sequence, head), unsplit: within 12 % of its
    measured rows (below HBM saturation the GQA rate alone
    is 1.3-15x fast); a GQA model of the same KV bytes
    keeps the GQA rate."""
    rates = rates_for(load_gpu(gpu), load_engine("vllm").kernels)
    kv, flops = batch * context * heads * 128 * 2 * 2, 4.0 * batch * heads * 128 * context
    mha = kernels.decode_attention(rates, batch, heads, kv, flops, mha=True).seconds * 1e3
    assert mha == pytest.approx(ms, rel=0.12)
    gqa = kernels.decode_attention(rates, batch, heads, kv, flops).seconds * 1e3
    gqa_rate = rates.memory_bandwidth * rates.decode_attention_memory
    saturated = batch * heads * rates.decode_unsplit_cta_bandwidth >= 0.9 * gqa_rate
    assert gqa <= mha and (saturated or gqa < ms / 1.3)


def test_engine_decode_attention_per_gpu() -> None:
    """kernels.decode_attention: SGLang's FlashInfer on the L40S replaces the GPU preset's (vLLM's FA2) block and its
    unsplit MHA rate (FlashInfer splits); elsewhere the GPU preset's block stands, its unsplit MHA rate only for
    vLLM (kernels.decode_unsplit_mha); bad entries are one line."""
    sglang, vllm = load_engine("sglang").kernels, load_engine("vllm").kernels
    on_l40s = rates_for(load_gpu("l40s"), sglang)
    assert (on_l40s.decode_attention_memory, on_l40s.decode_unsplit_cta_bandwidth) == (0.855, 0.0)
    assert rates_for(load_gpu("l40s"), vllm).decode_unsplit_cta_bandwidth == pytest.approx(27.5e9)
    assert rates_for(load_gpu("h200"), sglang).decode_attention_memory == load_gpu("h200").latency.decode_attention[0]
    for engine in ("sglang", "trtllm", "gpt-fast"):  # FlashInfer, XQA / MMHA, SDPA: they split an MHA decode
        assert rates_for(load_gpu("a100-80gb"), load_engine(engine).kernels).decode_unsplit_cta_bandwidth == 0.0
    assert rates_for(load_gpu("a100-80gb"), vllm).decode_unsplit_cta_bandwidth == pytest.approx(22.3e9)
    assert vllm.decode_unsplit_mha and all(load_engine(f"vllm-{v}").kernels.decode_unsplit_mha for v in ("0.8", "0.34"))
    block = {"memory_efficiency": 0.9, "streams_half": 1, "stream_ns": 5}
    for value, message in (({"h201": block}, "unknown field 'kernels.decode_attention.h201'"),
                           ({"h200": {"memory_efficiency": 0.9}}, "kernels.decode_attention.h200' must be a mapping"),
                           ({"h200": {**block, "stream_ns": -1}}, "kernels.decode_attention.h200.stream_ns"),
                           ([block], "kernels.decode_attention' must be a mapping of GPU preset names")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"decode_attention": value}, "e.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("e.yaml: ")


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "b200", "b300", "gb200", "gb300"])
@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_fp8_cache_never_slower_at_long_context(gpu: str, engine: str) -> None:
    """At 32k tokens and batch 1-64 an fp8 cache (half the bytes) never decodes slower than a bf16 one on any
    engine preset's kernel: the fp8 kernels' added per-element cost (FA3's dequantisation on Hopper: scale
    0.59-0.87) stays below the halved bytes."""
    rates = rates_for(load_gpu(gpu), load_engine(engine).kernels)
    for batch in (1, 8, 64):
        bf16_bytes, flops = batch * 32768 * 8 * 128 * 2 * 2, 4.0 * batch * 32 * 128 * 32768
        assert kernels.decode_attention(rates, batch, 8, bf16_bytes / 2, flops, fp8_cache=True).seconds < \
            kernels.decode_attention(rates, batch, 8, bf16_bytes, flops).seconds


def test_engine_wide_head_prefill_attention_per_gpu() -> None:
    """kernels.wide_head_prefill_attention: SGLang's Triton fallback on Hopper for heads over 256 (5.25 / 5.3 x the
    whole triangle's flash time), none on the B200 or in vLLM's preset; bad entries are one line."""
    sglang = load_engine("sglang").kernels
    assert sglang.wide_head_prefill_scale_by_gpu == {"h100-sxm": 5.25, "h200": 5.3}
    assert rates_for(load_gpu("h100-pcie"), sglang).wide_head_prefill_scale == 5.25  # its silicon's entry
    assert rates_for(load_gpu("b200"), sglang).wide_head_prefill_scale is None
    assert load_engine("vllm").kernels.wide_head_prefill_scale_by_gpu == {}
    with pytest.raises(SpecError, match="kernels.wide_head_prefill_attention.h200"):
        kernels_from_mapping({"wide_head_prefill_attention": {"h200": 0.5}}, "e.yaml")


def test_engine_fp8_kv_prefill_attention_per_gpu() -> None:
    """kernels.fp8_kv_prefill_attention: per GPU preset, prefill attention over an fp8 cache as scale x the bf16
    cache's time (vLLM: slower on Hopper's FA3, its query bf16; faster on B200's TensorRT-LLM prefill kernel and
    under SGLang's FA3, whose query is fp8); a GPU sharing its silicon takes the entry; bad entries are one line."""
    k = kernels_from_mapping({"fp8_kv_prefill_attention": {"h200": 1.1}}, "e.yaml")
    assert k.fp8_kv_prefill_scale_by_gpu == {"h200": 1.1}
    assert rates_for(load_gpu("h200"), k).fp8_kv_prefill_scale == 1.1
    assert rates_for(load_gpu("b200"), k).fp8_kv_prefill_scale is None
    vllm = load_engine("vllm").kernels
    assert rates_for(load_gpu("h100-pcie"), vllm).fp8_kv_prefill_scale == vllm.fp8_kv_prefill_scale_by_gpu["h100-sxm"]
    assert vllm.fp8_kv_prefill_scale_by_gpu["b200"] < 1 < vllm.fp8_kv_prefill_scale_by_gpu["h200"]
    sglang, trtllm = (load_engine(e).kernels for e in ("sglang", "trtllm"))
    assert sglang.fp8_kv_prefill_scale_by_gpu["h200"] < 1 and trtllm.fp8_kv_prefill_scale_by_gpu == {}
    for value, message in (({"h200": 0}, "must be in \\(0, 4\\]"), ({"h200": 5}, "fp8_kv_prefill_attention.h200"),
                           ({"h201": 1.1}, "unknown field 'kernels.fp8_kv_prefill_attention.h201'")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"fp8_kv_prefill_attention": value}, "e.yaml")
        assert "\n" not in str(caught.value)


def test_gemm_streaming_per_weight_format_gpu_then_engine() -> None:
    """latency.gemm_memory_efficiency (GPU) and kernels.gemm_memory_efficiency (engine, per GPU): the small-M GEMM
    streaming fraction by storage format, aliases kept as the canonical name; the engine's entry replaces the GPU's
    for its GPUs and the part sharing their silicon; bad entries are one line."""
    block = {**load_preset_document("gpu", "h200")["latency"], "gemm_memory_efficiency": {"fp8": 0.7}}
    assert latency_from_mapping(block, "g.yaml").gemm_memory_efficiency == {"fp8_e4m3": 0.7}
    vllm, trtllm = load_engine("vllm").kernels, load_engine("trtllm").kernels
    h100 = load_gpu("h100-sxm").latency.gemm_memory_efficiency
    assert 0.5 < h100["fp8_e4m3"] < load_gpu("h100-sxm").latency.memory_efficiency  # fp8 streams slower
    assert rates_for(load_gpu("h100-sxm"), vllm).gemm_memory_efficiency == h100
    trt = rates_for(load_gpu("h100-pcie"), trtllm).gemm_memory_efficiency  # kernels_as: h100-sxm
    assert trt == trtllm.gemm_memory_efficiency_by_gpu["h100-sxm"] and set(trt) == {"bf16", "fp8_e4m3", "fp8_block"}
    assert rates_for(load_gpu("a100-80gb"), trtllm).gemm_memory_efficiency == {}
    k = kernels_from_mapping({"gemm_memory_efficiency": {"b200": {"bfloat16": 0.7}}}, "e.yaml")
    assert k.gemm_memory_efficiency_by_gpu == {"b200": {"bf16": 0.7}}
    for value, message in (
            ({"b200": {"fp9": 0.5}}, "field 'kernels.gemm_memory_efficiency.b200.fp9': unknown dtype 'fp9'"),
            ({"b200": {"bf16": 1.5}}, "kernels.gemm_memory_efficiency.b200.bf16' must be at most 1"),
            ({"b201": {"bf16": 0.5}}, "unknown field 'kernels.gemm_memory_efficiency.b201'"),
            ({"b200": 0.5}, "must be a mapping of weight formats")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"gemm_memory_efficiency": value}, "e.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("e.yaml: ")
    with pytest.raises(SpecError, match="g.yaml: field 'latency.gemm_memory_efficiency' must be a mapping"):
        latency_from_mapping({**block, "gemm_memory_efficiency": 0.7}, "g.yaml")


# aiconfigurator 0.12 systems/data/rtx_pro_6000_server/gemm/vllm/0.24.0 gemm_perf (vLLM 0.24 on "NVIDIA RTX PRO 6000
# Blackwell Server Edition"): (format, M, N, K, us); the fp8 rows less their input quantisation, the quantize tables'
# computescale + scale_matrix at the row's M, K (136.8 / 11.7 / 3.0 us)
RTX_PRO_6000_GEMMS = (("bf16", 8192, 8192, 8192, 2820.5), ("bf16", 4096, 4096, 4096, 345.6),
                      ("bf16", 8, 8192, 8192, 95.6), ("fp8_e4m3", 8192, 8192, 8192, 1424.4 - 136.8),
                      ("fp8_e4m3", 4096, 4096, 4096, 206.7 - 11.7), ("fp8_e4m3", 8, 8192, 8192, 47.8 - 3.0))


@pytest.mark.parametrize(("fmt", "m", "n", "k", "us"), RTX_PRO_6000_GEMMS)
def test_rtx_pro_6000_gemms_against_its_own_table(fmt: str, m: int, n: int, k: int, us: float) -> None:
    """The RTX PRO 6000 prices its GEMMs at its own measured rates (no longer the L40S's, ``measured_on``): vLLM's
    rows on the card within 10 %, where the L40S's fractions it borrowed put the large fp8 GEMM 2.1x too slow."""
    gpu = load_gpu("rtx-pro-6000")
    assert gpu.latency.measured_here and gpu.latency.kernels_as is None
    bits, compute = (16, "bf16") if fmt == "bf16" else (8, "fp8")
    rates = rates_for(gpu, load_engine("vllm").kernels)
    assert kernels.gemm(rates, m, n, k, bits, compute, weight_format=fmt).seconds * 1e6 == pytest.approx(us, rel=0.10)
    if m == 8192 and fmt == "fp8_e4m3":
        borrowed = dataclasses.replace(gpu, latency=load_gpu("l40s").latency)
        slow = kernels.gemm(rates_for(borrowed, load_engine("vllm").kernels), m, n, k, bits, compute,
                            weight_format=fmt).seconds * 1e6
        assert slow > 1.7 * us


def test_fused_moe_stream_per_weight_format_from_the_gpu_preset() -> None:
    """latency.moe_memory_efficiency: the GPU's fused-MoE weight stream by storage format (bf16 on H100 SXM, H200
    and B200, where it streams faster than a GEMV: the whole layer's experts in one kernel), passed to every engine's
    rates; a GPU without it (A100) keeps the GEMV figure; bad entries are one line."""
    for gpu in ("h100-sxm", "h200", "b200"):
        latency = load_gpu(gpu).latency
        assert latency.memory_efficiency < latency.moe_memory_efficiency["bf16"] <= 1
        for engine in ("vllm", "sglang", "trtllm"):
            assert rates_for(load_gpu(gpu), load_engine(engine).kernels).moe_memory_efficiency == \
                latency.moe_memory_efficiency
    assert rates_for(load_gpu("a100-80gb"), load_engine("vllm").kernels).moe_memory_efficiency == {}
    block = load_preset_document("gpu", "h200")["latency"]
    assert latency_from_mapping({**block, "moe_memory_efficiency": {"bfloat16": 0.9}},
                                "g.yaml").moe_memory_efficiency == {"bf16": 0.9}
    for value, message in (({"bf16": 1.5}, "latency.moe_memory_efficiency.bf16' must be at most 1"),
                           (0.9, "field 'latency.moe_memory_efficiency' must be a mapping")):
        with pytest.raises(SpecError, match=message) as caught:
            latency_from_mapping({**block, "moe_memory_efficiency": value}, "g.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("g.yaml: ")


def test_engine_gemm_compute_efficiency_per_weight_format() -> None:
    """kernels.gemm_efficiency (engine, per GPU): TensorRT-LLM's large GEMMs by storage format reach the GPU; per-tensor
    fp8 runs well above vLLM's CUTLASS scaled-mm (the GPU presets' fp8 figure) on Hopper; the part sharing the
    silicon borrows the entry; a GPU the engine did not measure and vLLM keep the GPU preset's; bad entries are
    one line."""
    vllm, trtllm = load_engine("vllm").kernels, load_engine("trtllm").kernels
    h100 = load_gpu("h100-sxm")
    trt = rates_for(load_gpu("h100-pcie"), trtllm).gemm_efficiency_by_format  # kernels_as: h100-sxm
    assert trt == trtllm.gemm_efficiency_by_gpu["h100-sxm"] and set(trt) == {"bf16", "fp8_e4m3"}
    assert trt["fp8_e4m3"] > 1.2 * h100.latency.gemm_efficiency["fp8"]
    assert rates_for(h100, vllm).gemm_efficiency_by_format == {}
    assert rates_for(load_gpu("a100-80gb"), trtllm).gemm_efficiency_by_format == {}
    k = kernels_from_mapping({"gemm_efficiency": {"b200": {"fp8": 0.7}}}, "e.yaml")
    assert k.gemm_efficiency_by_gpu == {"b200": {"fp8_e4m3": 0.7}}
    for value, message in (
            ({"b200": {"fp9": 0.5}}, "field 'kernels.gemm_efficiency.b200.fp9': unknown dtype 'fp9'"),
            ({"b200": {"bf16": 0}}, "kernels.gemm_efficiency.b200.bf16' must be"),
            ({"b201": {"bf16": 0.5}}, "unknown field 'kernels.gemm_efficiency.b201'")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"gemm_efficiency": value}, "e.yaml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("e.yaml: ")


def test_engine_fp8_scales_online_and_their_measured_cost() -> None:
    """kernels.online_fp8_scale (how an engine's own fp8 quantisation of a 16-bit checkpoint scales inputs) and
    kernels.dynamic_scale_us (per GPU: one reduction's fixed time), reaching the rates; bad entries are one line."""
    vllm, sglang, trtllm = (load_engine(e).kernels for e in ("vllm", "sglang", "trtllm"))
    assert (vllm.online_fp8_scale, sglang.online_fp8_scale, trtllm.online_fp8_scale) == ("dynamic", "dynamic",
                                                                                         "static")
    assert EngineKernels().online_fp8_scale == "dynamic"
    assert sglang.dynamic_scale_s_by_gpu == vllm.dynamic_scale_s_by_gpu == {}  # their reduction: elementwise floor
    assert trtllm.dynamic_scale_s_by_gpu["h100-sxm"] > 3 * load_gpu("h100-sxm").latency.floors_s["elementwise"]
    assert rates_for(load_gpu("h100-pcie"), trtllm).dynamic_scale_s == trtllm.dynamic_scale_s_by_gpu["h100-sxm"]
    assert rates_for(load_gpu("a100-80gb"), trtllm).dynamic_scale_s is None
    for block, message in (
            ({"online_fp8_scale": "sometimes"}, "field 'kernels.online_fp8_scale' must be static or dynamic"),
            ({"dynamic_scale_us": {"h201": 1}}, "unknown field 'kernels.dynamic_scale_us.h201'"),
            ({"dynamic_scale_us": {"h200": -1}}, "field 'kernels.dynamic_scale_us.h200' must be at least 0")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping(block, "e.yaml")
        assert "\n" not in str(caught.value)


def test_engine_linear_host_time_per_gpu_and_format() -> None:
    """kernels.linear_host_us: per GPU preset and storage format, one linear call's host seconds outside a CUDA
    graph, as token steps; only the formats named in uncaptured_linears reach the rates; ideal rates have none."""
    block = {"linear_host_us": {"h200": {"fp8_block": [[17, 59], [None, 91]]}}}
    kernels = kernels_from_mapping(block, "e.yaml")
    assert kernels.linear_host_s_by_gpu == {"h200": {"fp8_block": ((17, pytest.approx(59e-6), None),
                                                                   (None, pytest.approx(91e-6), None))}}
    assert kernels.uncaptured_linears == frozenset()
    assert rates_for(load_gpu("h200"), kernels).linear_host == {}  # every linear captured: no host time
    uncaptured = kernels_from_mapping({**block, "uncaptured_linears": ["fp8_block"]}, "e.yaml")
    h200 = rates_for(load_gpu("h200"), uncaptured)
    assert [h200.linear_host_s("fp8_block", m) for m in (1, 17, 18, 4096)] == pytest.approx([59e-6, 59e-6, 91e-6,
                                                                                             91e-6])
    assert h200.linear_host_s("fp8", 1) == 0.0 and h200.as_ideal().linear_host_s("fp8_block", 1) == 0.0
    assert rates_for(load_gpu("b200"), uncaptured).linear_host == {}  # no entry for that GPU
    # DeepGEMM's block-scale path: rows in multiples of SCALE_ALIGNED_ROWS (4) skip the scales' re-layout
    aligned = kernels_from_mapping({"linear_host_us": {"h200": {"fp8_block": [[1, 271], [None, 234, 178]]}},
                                    "uncaptured_linears": ["fp8_block"]}, "e.yaml")
    rates = rates_for(load_gpu("h200"), aligned)
    assert [rates.linear_host_s("fp8_block", m) for m in (1, 2, 3, 4, 8, 18, 20, 4096, 4097)] == pytest.approx(
        [271e-6, 234e-6, 234e-6, 178e-6, 178e-6, 234e-6, 178e-6, 178e-6, 234e-6])
    assert rates.linear_host_s("fp8_block", 4.5) == pytest.approx(234e-6)  # a mean token count: not aligned
    vllm = load_engine("vllm").kernels
    assert vllm.uncaptured_linears == frozenset()
    assert set(vllm.linear_host_s_by_gpu) == {"h100-sxm", "h200", "b200", "gb200", "gb300"}
    # the host path is the machine's (the GB200's Grace CPU), beside its silicon's (the B200's) other entries
    gb200 = rates_for(load_gpu("gb200"), dataclasses.replace(vllm, uncaptured_linears=frozenset({"fp8_block"})))
    assert gb200.linear_host_s("fp8_block", 1) == pytest.approx(533.3e-6)
    assert gb200.grouped_efficiency("fp4", weight_format="nvfp4") == 1.05  # the B200's entry (kernels_as)
    for value, message in (
            ({"h200": {"fp9": [[None, 9]]}}, "unknown field 'kernels.linear_host_us.h200.fp9'"),
            ({"h200": {"fp8_block": [[None, -1]]}}, r"field 'kernels.linear_host_us.h200.fp8_block\[0\]' must be at"),
            ({"h200": {"fp8_block": [[17, 9]]}}, "must be a list of \\[max tokens, microseconds"),
            ({"h200": {"fp8_block": [[None, 9, 8, 7]]}}, "must be a list of \\[max tokens, microseconds"),
            ({"h200": {"fp8_block": [[None, 9, -1]]}},
             r"field 'kernels.linear_host_us.h200.fp8_block\[0\]' must be at"),
            ({"h200": {"fp8_block": [[17, 9], [8, 9], [None, 9]]}}, "needs ascending whole token counts"),
            ({"h200": {"fp8_block": 59}}, "must be a list of"),
            ({"h201": {"fp8_block": [[None, 9]]}}, "unknown field 'kernels.linear_host_us.h201'")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"linear_host_us": value}, "e.yaml")
        assert "\n" not in str(caught.value)
    with pytest.raises(SpecError, match="field 'kernels.uncaptured_linears' must be a list of"):
        kernels_from_mapping({"uncaptured_linears": "fp8_block"}, "e.yaml")


def test_engine_graph_coverage_keys() -> None:
    """kernels.graph_prefill and kernels.graph_max_tokens: which steps an engine replays from CUDA graphs -- rows of
    (minimum GiB, tokens below tp 4, tokens at tp >= 4), the last row the GPU's memory reaches applying."""
    rows = [[0, 24, 80], [35, 32, 160], [60, 256, 512], [160, 512, 512]]
    k = kernels_from_mapping({"graph_prefill": False, "graph_max_tokens": rows}, "e.yaml")
    assert not k.graph_prefill and EngineKernels().graph_prefill and EngineKernels().graph_token_cap(80, 1) is None
    assert [k.graph_token_cap(gib, tp) for gib, tp in ((24, 1), (48, 1), (48, 8), (79.2, 1), (79.2, 4), (139.8, 2),
                                                       (178, 1))] == [24, 32, 160, 256, 512, 256, 512]
    sglang, vllm, trtllm = (load_engine(e).kernels for e in ("sglang", "vllm", "trtllm"))
    # SGLang 0.5.20+: 8 below 20 GiB, 48 / 160 from 20 GiB (arg_groups/fields tiers)
    assert sglang.graph_max_tokens == ((0, 8, 8), (20, 48, 160), (35, 32, 160), (60, 256, 512), (160, 512, 512))
    assert not sglang.graph_prefill
    assert vllm.graph_prefill and vllm.graph_token_cap(80, 8) == 512
    assert not trtllm.graph_prefill and trtllm.graph_token_cap(80, 1) is None
    for value, message in (
            ([[0, 24]], "row 1 must be \\[minimum GiB, tokens below tp 4, tokens at tp >= 4\\]"),
            ([[60, 256, 512], [35, 32, 160]], "minimums must ascend"),
            ([[0, 0, 80]], "tokens below tp 4"),
            ("512", "must be a list of"),
            ([], "must be a list of")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"graph_max_tokens": value}, "e.yaml")
        assert "\n" not in str(caught.value)
    with pytest.raises(SpecError, match="kernels.graph_prefill"):
        kernels_from_mapping({"graph_prefill": "no"}, "e.yaml")


def test_engine_moe_dequant_ops_per_gpu() -> None:
    """kernels.moe_dequant_ops: per GPU preset and weight-only format, replacing DEQUANT_OPS in that engine's MoE
    on that GPU only; other GPUs, dense GEMMs and engines keep it."""
    from tfcalc.calc import kernels as k

    parsed = kernels_from_mapping({"moe_dequant_ops": {"h200": {"fp4": 20}}}, "e.yaml")
    assert parsed.moe_dequant_ops_by_gpu == {"h200": {"fp4": 20.0}}
    mine = rates_for(load_gpu("h200"), parsed)
    vllm = rates_for(load_gpu("h200"), load_engine("vllm").kernels)
    assert mine.moe_dequant_ops == {"fp4": 20.0} and 20 > 2 * vllm.moe_dequant_ops["fp4"] > 2 * k.DEQUANT_OPS["fp4"]
    assert rates_for(load_gpu("h100-sxm"), parsed).moe_dequant_ops == {}
    assert rates_for(load_gpu("a100-80gb"), load_engine("vllm").kernels).moe_dequant_ops == {}

    def moe(rates: object) -> float:  # gpt-oss-120b's experts at 64 tokens, MXFP4 weight-only: dequant-bound
        return k.moe_experts(rates, tokens=64, experts_local=128, experts_total=128, top_k=4, hidden=2880,
                             expert_width=2880, gated=True, weight_bits=4.25, compute="bf16", dequant="fp4").seconds

    assert moe(mine) > 1.5 * moe(vllm)
    for value, message in (
            ({"h201": {"fp4": 9}}, "unknown field 'kernels.moe_dequant_ops.h201'"),
            ({"h200": {"bf16": 9}}, "unknown field 'kernels.moe_dequant_ops.h200.bf16'"),
            ({"h200": {"fp4": 0}}, "field 'kernels.moe_dequant_ops.h200.fp4' must be at least 0.001"),
            ({"h200": {"fp4": 1e6}}, "field 'kernels.moe_dequant_ops.h200.fp4' must be at most 200"),
            ({"h200": 9}, "field 'kernels.moe_dequant_ops.h200' must be a mapping of int8, fp8, int4, fp4$")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"moe_dequant_ops": value}, "e.yaml")


def test_sglang_runs_mxfp4_experts_on_hopper_as_upcast_bf16() -> None:
    """SGLang's Triton fallback upcasts MXFP4 experts to bf16 at load on Hopper (kernels.moe_stream_bits) and its
    default Triton tiles stream slower once the tokens outnumber the experts (moe_large_m_memory_efficiency): on
    the H200 its gpt-oss-120b experts at one token cost what 16-bit weights stream, with no unpacking; vLLM, other
    GPUs and other formats are untouched."""
    from tfcalc.calc import kernels as k

    sglang = rates_for(load_gpu("h200"), load_engine("sglang").kernels)
    assert sglang.moe_stream_bits == {"mxfp4": 16.0} and 0 < sglang.moe_large_m_memory["mxfp4"] < 1
    assert "fp4" not in sglang.moe_dequant_ops
    for gpu, engine in (("b200", "sglang"), ("h200", "vllm"), ("a100-80gb", "sglang")):
        other = rates_for(load_gpu(gpu), load_engine(engine).kernels)
        assert other.moe_stream_bits == {} and other.moe_large_m_memory == {}
    one = k.moe_experts(sglang, tokens=1, experts_local=128, experts_total=128, top_k=4, hidden=2880,
                        expert_width=2880, gated=True, weight_bits=4.25, compute="bf16", dequant="fp4",
                        weight_format="mxfp4")
    assert one.weight_bytes == pytest.approx(4 * 3 * 2880 * 2880 * 2) and one.bound in ("memory", "floor")
    for value, message in (
            ({"h201": {"mxfp4": 16}}, "unknown field 'kernels.moe_stream_bits.h201'"),
            ({"h200": {"mxfp5": 16}}, "unknown field 'kernels.moe_stream_bits.h200.mxfp5'"),
            ({"h200": {"mxfp4": 64}}, "field 'kernels.moe_stream_bits.h200.mxfp4' must be at most 32"),
            ({"h200": 16}, "field 'kernels.moe_stream_bits.h200' must be a mapping of")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"moe_stream_bits": value}, "e.yaml")
    with pytest.raises(SpecError, match="kernels.moe_large_m_memory_efficiency.h200.mxfp4"):
        kernels_from_mapping({"moe_large_m_memory_efficiency": {"h200": {"mxfp4": 1.5}}}, "e.yaml")


def test_sglang_prices_shapes_without_a_tuned_config_at_its_default_tiles() -> None:
    """kernels.moe_tuned_shapes: SGLang's Triton fused MoE has a config file for some (local experts, per-rank
    width) shapes per GPU (0.5.14's wheel: Mixtral 8x7B at tp 1 on the H200, not on the H100; Qwen3-30B-A3B's 64
    local experts at ep 2 on the H100, not on the H200); other shapes run the default tiles, priced at
    moe_untuned_efficiency and, once the tokens outnumber the local experts, moe_untuned_large_m_memory. Only these
    two entries differ: set to the tuned kernel's values the two prices agree. vLLM, TensorRT-LLM and the
    architectures SGLang serves with another kernel on B200 keep one price."""
    from dataclasses import replace

    from tfcalc.calc import kernels as k

    h100 = rates_for(load_gpu("h100-sxm"), load_engine("sglang").kernels)
    h200 = rates_for(load_gpu("h200"), load_engine("sglang").kernels)
    assert (8, 14336) in h200.moe_tuned_shapes["bf16"] and (8, 14336) not in h100.moe_tuned_shapes["bf16"]
    assert (64, 768) in h100.moe_tuned_shapes["bf16"] and (64, 768) not in h200.moe_tuned_shapes["bf16"]
    assert h200.moe_untuned_efficiency["bf16"] < h200.grouped_efficiency("bf16") and "default tiles" in h200.source
    args = {"experts_total": 8, "top_k": 2, "hidden": 4096, "gated": True, "weight_bits": 16, "compute": "bf16",
            "weight_format": "bf16"}
    for tokens in (4, 8192):  # a memory-bound decode at or below the local experts, a compute-bound prefill
        untuned = k.moe_experts(h200, tokens=tokens, experts_local=8, expert_width=7000, **args)
        listed = k.moe_experts(replace(h200, moe_tuned_shapes={"bf16": frozenset({(8, 7000)})}), tokens=tokens,
                               experts_local=8, expert_width=7000, **args)
        assert untuned.flops == listed.flops and untuned.bytes == listed.bytes
        assert untuned.seconds > listed.seconds if tokens > 8 else untuned == listed  # same 16-row stream
        same = replace(h200, moe_untuned_efficiency={"bf16": h200.grouped_efficiency("bf16")},
                       moe_untuned_large_m_memory={}, moe_untuned_k0=0.0)
        assert k.moe_experts(same, tokens=tokens, experts_local=8, expert_width=7000, **args) == listed
    prefill = k.moe_experts(h200, tokens=8192, experts_local=8, expert_width=7000, **args)
    assert prefill.bound == "compute" and prefill.seconds > 1.5 * k.moe_experts(
        replace(h200, moe_tuned_shapes={"bf16": frozenset({(8, 7000)})}), tokens=8192, experts_local=8,
        expert_width=7000, **args).seconds  # about 0.95 / 0.47 of the tensor-core time
    # the default tiles' K0 (32 against the tuned 128) prices a narrow expert's down GEMM (K = its width) nearer peak
    narrow = {**args, "experts_total": 128, "top_k": 8, "hidden": 2048}
    k0 = [k.moe_experts(replace(h200, moe_untuned_k0=k0), tokens=8192, experts_local=128, expert_width=96,
                        **narrow).seconds for k0 in (0.0, 32.0)]
    assert h200.moe_untuned_k0 == 32 and k0[1] < k0[0]
    # the large-M stream enters only once the tokens outnumber the local experts
    no_large_m = replace(h200, moe_untuned_large_m_memory={})
    assert k.moe_experts(no_large_m, tokens=4, experts_local=8, expert_width=7000, **args) == k.moe_experts(
        h200, tokens=4, experts_local=8, expert_width=7000, **args)
    assert h200.with_efficiency(memory=0.5).moe_untuned_large_m_memory == {}
    for gpu, engine, arch in (("b200", "vllm", None), ("h200", "trtllm", None), ("b200", "sglang",
                                                                              "Qwen3MoeForCausalLM")):
        assert rates_for(load_gpu(gpu), load_engine(engine).kernels, architecture=arch).moe_tuned_shapes == {}
    vllm = rates_for(load_gpu("h200"), load_engine("vllm").kernels)  # vLLM 0.24's files: 8x14336 on the H200 too
    assert (8, 14336) in vllm.moe_tuned_shapes["bf16"] and vllm.moe_untuned_k0 == 0.0
    assert "bf16" in rates_for(load_gpu("b200"), load_engine("sglang").kernels,
                               architecture="MixtralForCausalLM").moe_tuned_shapes


def test_moe_tuned_shapes_are_validated() -> None:
    good = {"moe_tuned_shapes": {"h200": {"bf16": ["8x14336", "128x768"]}},
            "moe_untuned_efficiency": {"h200": {"bf16": 0.5}},
            "moe_untuned_large_m_memory_efficiency": {"h200": {"bf16": 0.6}}}
    kernels = kernels_from_mapping(good, "e.yaml")
    assert kernels.moe_tuned_shapes_by_gpu == {"h200": {"bf16": frozenset({(8, 14336), (128, 768)})}}
    assert kernels.moe_untuned_efficiency_by_gpu == {"h200": {"bf16": 0.5}}
    assert kernels.moe_untuned_large_m_memory_by_gpu == {"h200": {"bf16": 0.6}} and kernels.moe_untuned_k0 == 0
    assert kernels_from_mapping({**good, "moe_untuned_k0": 32}, "e.yaml").moe_untuned_k0 == 32
    for change, message in (
            ({"moe_tuned_shapes": {"h200": {"bf16": ["8by14336"]}}},
             r"'kernels.moe_tuned_shapes.h200.bf16' has '8by14336', not a shape 'ExN'"),
            ({"moe_tuned_shapes": {"h200": {"bf16": ["0x14336"]}}}, "not a shape 'ExN'"),
            ({"moe_tuned_shapes": {"h200": {"bf16": "8x14336"}}}, "must be a list of 'ExN' shapes"),
            ({"moe_tuned_shapes": {"h201": {"bf16": ["8x14336"]}}}, "unknown field 'kernels.moe_tuned_shapes.h201'"),
            ({"moe_tuned_shapes": {"h200": {"bf17": ["8x14336"]}}},
             "unknown field 'kernels.moe_tuned_shapes.h200.bf17'"),
            ({"moe_untuned_efficiency": {}}, "'kernels.moe_tuned_shapes.h200.bf16' needs "
                                             "'kernels.moe_untuned_efficiency.h200.bf16'"),
            ({"moe_untuned_efficiency": {"h200": {"bf16": 0.5}, "b200": {"bf16": 0.3}}},
             "'kernels.moe_untuned_efficiency.b200.bf16' needs 'kernels.moe_tuned_shapes.b200.bf16'"),
            ({"moe_untuned_large_m_memory_efficiency": {"h200": {"mxfp4": 0.6}}},
             "'kernels.moe_untuned_large_m_memory_efficiency.h200.mxfp4' needs"),
            ({"moe_untuned_efficiency": {"h200": {"bf16": 0}}}, "kernels.moe_untuned_efficiency.h200.bf16"),
            ({"moe_untuned_k0": -1}, "field 'kernels.moe_untuned_k0' must be at least 0"),
            ({"moe_tuned_shapes": None, "moe_untuned_efficiency": None, "moe_untuned_large_m_memory_efficiency": None,
              "moe_untuned_k0": 32}, "field 'kernels.moe_untuned_k0' needs 'kernels.moe_tuned_shapes'")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({**good, **change}, "e.yaml")


def test_tuned_shapes_come_from_the_wheels_file_names(
        benchmark_script: Callable[[str], ModuleType]) -> None:
    """moe_config_files.tuned_shapes reads (E, N) from the 16-bit config files of every SGLang Triton folder and of
    vLLM's configs folder, per GPU preset; dtype-specific files, other devices and other folders do not count."""
    s = benchmark_script("validation/moe_config_files.py")
    root = "sglang/srt/layers/moe/moe_runner/triton_utils/configs"
    names = [f"{root}/triton_3_1_0/E=8,N=14336,device_name=NVIDIA_H200.json",
             "vllm/model_executor/layers/fused_moe/configs/E=16,N=1024,device_name=NVIDIA_B200.json",
             "vllm/model_executor/layers/fused_moe/configs/E=16,N=1024,device_name=NVIDIA_B200,dtype=fp8_w8a8.json",
             f"{root}/triton_3_4_0/E=128,N=768,device_name=NVIDIA_H200.json",
             f"{root}/triton_3_4_0/E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json",
             f"{root}/triton_3_4_0/E=64,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
             f"{root}/triton_3_4_0/E=64,N=384,device_name=NVIDIA_L40S.json",
             f"{root}/README.md", "sglang/other/E=1,N=1,device_name=NVIDIA_B200.json"]
    assert s.tuned_shapes(names) == {"h100-sxm": [(128, 768)], "h200": [(8, 14336), (128, 768)], "b200": [(16, 1024)]}


def test_moe_expert_floors_are_validated() -> None:
    assert kernels_from_mapping({"moe_expert_floors_us": {"fp8": 0.5}}, "e.yaml").moe_expert_floors_s == \
        pytest.approx({"fp8": 0.5e-6})
    for value, message in (({"fp9": 1}, "unknown field 'kernels.moe_expert_floors_us.fp9'"),
                           ({"fp8": -1}, "kernels.moe_expert_floors_us.fp8' must be at least 0"),
                           ({"fp8": float("nan")}, "kernels.moe_expert_floors_us.fp8' must be a finite number"),
                           (0.24, "field 'kernels.moe_expert_floors_us' must be a mapping")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"moe_expert_floors_us": value}, "e.yaml")


def test_user_gpu_with_latency_block(tmp_path: Path) -> None:
    path = tmp_path / "mygpu.yaml"
    path.write_text("memory_gb: 96\nhbm_bandwidth_gb_s: 4000\ndense_tflops: {bf16: 500}\n"
                    "interconnect_bidirectional_gb_s: 900\nlatency: {sm_count: 100, gemm_efficiency: {bf16: 0.7}, "
                    "attention_efficiency: 0.5, moe_efficiency: 0.6, memory_efficiency: 0.8, floors_us: {gemm: 3, "
                    "elementwise: 2, attention: 9, moe: 20}, interconnect_preset: pcie5}\n")
    gpu = load_gpu(str(path))
    assert gpu.latency is not None and gpu.latency.floors_s["moe"] == pytest.approx(20e-6)


def test_interconnect_and_engine_errors() -> None:
    with pytest.raises(SpecError, match="x.yaml: field 'nccl.efficiency' must be at most 1, got 2"):
        interconnect_from_mapping({"bandwidth_gb_s": 450, "nccl": {"efficiency": 2, "launch_us": 1,
                                                                   "step_latency_us": 1}}, "x.yaml", "x")
    with pytest.raises(SpecError, match="missing required field 'nccl.launch_us'"):
        interconnect_from_mapping({"bandwidth_gb_s": 450, "nccl": {"efficiency": 0.5, "step_latency_us": 1}},
                                  "x.yaml", "x")
    with pytest.raises(SpecError, match="nccl.algorithm' must be one of"):
        interconnect_from_mapping({"bandwidth_gb_s": 450, "nccl": {"efficiency": 0.5, "launch_us": 1,
                                                                   "step_latency_us": 1, "algorithm": "star"}},
                                  "x.yaml", "x")
    with pytest.raises(SpecError, match="kernels.cuda_graphs' must be true or false"):
        kernels_from_mapping({"cuda_graphs": "yes"}, "e.yaml")
    with pytest.raises(SpecError, match="unknown field 'kernels.block_floors_us.mla_encode'"):
        kernels_from_mapping({"block_floors_us": {"mla_encode": 3}}, "e.yaml")
    with pytest.raises(SpecError, match="kernels.floors_us.moe' must be a finite number"):
        kernels_from_mapping({"floors_us": {"moe": float("nan")}}, "e.yaml")
    with pytest.raises(SpecError, match="kernels.eager_launch_us' must be at least 0, got -1"):
        kernels_from_mapping({"eager_launch_us": -1}, "e.yaml")
    with pytest.raises(SpecError, match="unknown field 'kernels.cuda_graph'"):
        kernels_from_mapping({"cuda_graph": True}, "e.yaml")
    assert kernels_from_mapping({}, "e.yaml") == EngineKernels()  # every field has a default
    ideal = {"name": "mine", "budget": "ideal", "sources": {"budget": "my notes"}}
    assert engine_from_mapping(ideal, "e.yaml", "e").kernels == EngineKernels()
    with pytest.raises(SpecError, match="field 'block_size' has no meaning with budget: ideal"):
        engine_from_mapping({**ideal, "block_size": 16}, "e.yaml", "e")
    with pytest.raises(SpecError, match="field 'sources' must be a mapping"):
        engine_from_mapping({**ideal, "sources": None}, "e.yaml", "e")


def test_expert_all_to_all_blocks_parse_and_fail_clearly() -> None:
    base = {"bandwidth_gb_s": 450, "nccl": {"efficiency": 0.78, "launch_us": 4.6, "step_latency_us": 0.87}}
    plain = interconnect_from_mapping(base, "x.yaml", "x")
    assert plain.expert_all_to_all is None and plain.expert_link is plain.nccl
    fabric = interconnect_from_mapping({**base, "expert_all_to_all": {"launch_us": 11.3, "efficiency": 0.55}},
                                       "x.yaml", "x")
    link = fabric.expert_link
    assert (link.launch_s, link.step_latency_s, link.beta) == (pytest.approx(11.3e-6), 0.0, pytest.approx(247.5e9))
    for value, message in (({"launch_us": 1}, "missing required field 'expert_all_to_all.efficiency'"),
                           ({"launch_us": 1, "efficiency": 1.2}, "efficiency' must be at most 1"),
                           ({"launch_us": 1, "efficiency": 0.5, "step_us": 1}, "unknown field 'expert_all_to_all.s"),
                           ([1, 0.5], "field 'expert_all_to_all' must be a mapping")):
        with pytest.raises(SpecError, match=message):
            interconnect_from_mapping({**base, "expert_all_to_all": value}, "x.yaml", "x")
    assert load_interconnect("nvlink5").expert_all_to_all is not None
    assert load_interconnect("infiniband-ndr").expert_all_to_all is None


def test_custom_allreduce_blocks_parse_and_fail_clearly() -> None:
    base = {"bandwidth_gb_s": 450, "nccl": {"efficiency": 0.78, "launch_us": 4.6, "step_latency_us": 0.87}}
    custom = {"launch_us": 4.6, "one_shot_efficiency": 0.59, "two_shot_efficiency": 0.74, "two_shot_latency_us": 3.7}
    fabric = interconnect_from_mapping({**base, "custom_allreduce": custom}, "x.yaml", "x")
    assert fabric.custom_allreduce is not None and fabric.forward_sync_s_per_peer == 0
    synced = interconnect_from_mapping({**base, "forward_sync_us_per_peer": 1.3}, "x.yaml", "x")
    assert synced.forward_sync_s_per_peer == pytest.approx(1.3e-6)
    for value, message in ((-1, "forward_sync_us_per_peer' must be at least 0"),
                           ("fast", "forward_sync_us_per_peer' must be a number")):
        with pytest.raises(SpecError, match=message):
            interconnect_from_mapping({**base, "forward_sync_us_per_peer": value}, "x.yaml", "x")
    assert fabric.custom_allreduce.two_shot_latency_s == pytest.approx(3.7e-6)
    assert fabric.custom_allreduce.bandwidth_bytes_per_s == 450e9
    for change, message in (({"one_shot_efficiency": 1.5}, "one_shot_efficiency' must be at most 1"),
                            ({"efficiency": 0.4}, "unknown field 'custom_allreduce.efficiency'"),
                            ({"two_shot_latency_us": None}, "missing required field 'custom_allreduce.two_shot_lat")):
        with pytest.raises(SpecError, match=message):
            interconnect_from_mapping({**base, "custom_allreduce": {**custom, **change}}, "x.yaml", "x")
    rule = kernels_from_mapping({"one_shot_allreduce": {"below_kib": {8: 128, 4: 1024}}}, "e.yaml")
    assert rule.one_shot_below_bytes == ((4, 1024 * 1024.0), (8, 128 * 1024.0))
    assert rule.one_shot_allreduce(1 << 19, 4, 0) and not rule.one_shot_allreduce(1 << 19, 8, 0)
    tokens = kernels_from_mapping({"one_shot_allreduce": {"max_tokens": 64},
                                   "custom_allreduce_launch_us": {"nvlink4": 3}}, "e.yaml")
    assert tokens.one_shot_max_tokens == 64 and tokens.custom_allreduce_launch_s == {"nvlink4": pytest.approx(3e-6)}
    for value, message in (({"below_kib": {8: 1}, "max_tokens": 4}, "must be a mapping of one of"),
                           ({"below_kib": {2: 64}}, "GPU counts from 3 to 1024"),
                           ({"max_tokens": 0}, "max_tokens"),
                           ({"most_tokens": 4}, "unknown field 'kernels.one_shot_allreduce.most_tokens'")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"one_shot_allreduce": value}, "e.yaml")
    with pytest.raises(SpecError, match="custom_allreduce_launch_us.nvlink4' must be at least 0"):
        kernels_from_mapping({"custom_allreduce_launch_us": {"nvlink4": -1}}, "e.yaml")
    own = kernels_from_mapping({"custom_allreduce_two_shot": {"nvlink5": {"latency_us": 2, "per_peer_us": 1.5,
                                                                           "below_kib": {8: 1024, 4: 2048}}}},
                               "e.yaml").custom_allreduce_two_shot["nvlink5"]
    assert own.below_bytes == ((4, 2048 * 1024.0), (8, 1024 * 1024.0)) and own.latency_s_per_peer == 1.5e-6
    assert own.covers(1 << 20, 2) and own.covers(1 << 20, 4) and not own.covers(1 << 20, 8)
    assert not own.covers(1, 16)   # no row for 16 GPUs
    for value, message in (({"latency_us": 1, "below_kib": {8: 1}, "slope": 2}, "unknown field 'kernels.custom_allre"),
                           ({"latency_us": 1}, "below_kib' must map GPU counts"),
                           ({"per_peer_us": -1, "below_kib": {8: 1}}, "per_peer_us' must be at least 0"),
                           ({"below_kib": {1: 64}}, "GPU counts from 2 to 1024"),
                           (3, "two_shot.nvlink5' must be a mapping of below_kib, latency_us, per_peer_us")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"custom_allreduce_two_shot": {"nvlink5": value}}, "e.yaml")


def test_user_engine_file_inherits_kernels_by_name(tmp_path: Path) -> None:
    """A user's vLLM memory model without a kernels block runs vLLM's kernels; another name the defaults."""
    text = (preset_root() / "engines" / "vllm-0.17.yaml").read_text()
    mine = tmp_path / "my-vllm.yaml"
    mine.write_text(text.replace("memory_fraction: 0.9", "memory_fraction: 0.8"))
    engine = load_engine(str(mine))
    assert engine.memory_fraction == 0.8 and engine.kernels == load_engine("vllm").kernels
    other = tmp_path / "other.yaml"
    other.write_text(text.replace("name: vllm", "name: other"))
    assert load_engine(str(other)).kernels == EngineKernels()


def test_engine_yaml_numbers_are_finite_and_bounded(tmp_path: Path) -> None:
    text = (preset_root() / "engines" / "vllm-0.21.yaml").read_text()
    for old, new, message in (("non_torch_gib_tp: 2.1", "non_torch_gib_tp: .inf", "must be a finite number"),
                              ("non_torch_gib_tp: 2.1", "non_torch_gib_tp: 1.0e+30", "must be at most"),
                              ("block_size: 16", "block_size: 16.0", "must be an integer"),
                              ("  eager_launch_us: 8", "  eager_launch_us: .nan", "must be a finite number")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text.replace(old, new))
        with pytest.raises(SpecError, match=message):
            load_engine(str(bad))


def test_engine_scheduler_section(tmp_path: Path) -> None:
    """SGLang fills a step prefill first, with max_prefill_tokens 16384 until 0.5.12 and none binding from 0.5.13;
    TensorRT-LLM takes whole prompts (its LLM API's and trtllm-serve's enable_chunked_prefill default False); an
    engine without the section runs its default version's policy (vLLM's where it has none); a bad section is a
    one-line error naming the field."""
    sglang = load_engine("sglang").scheduler
    assert (sglang.prefill_first, sglang.max_prefill_tokens, sglang.chunked_prefill, sglang.reserve_output) == \
        (True, None, True, True)
    assert load_engine("sglang@0.5.6").scheduler == dataclasses.replace(sglang, max_prefill_tokens=16384)
    assert load_engine("vllm").scheduler == SchedulerPolicy()
    assert load_engine("trtllm").scheduler == SchedulerPolicy(chunked_prefill=False)
    text = (preset_root() / "engines" / "sglang-0.5.yaml").read_text()
    mine = tmp_path / "my-sglang.yaml"   # a user's copy without the section schedules as SGLang does
    mine.write_text(text[:text.index("scheduler:")] + text[text.index("overheads:"):])
    assert load_engine(str(mine)).scheduler == sglang
    for old, new, message in (("  prefill_first: true", "  prefill_first: 1", "scheduler.prefill_first' must be true"),
                              ("  max_prefill_tokens: 16384", "  max_prefill_tokens: 0", "max_prefill_tokens"),
                              ("  max_prefill_tokens: 16384", "  mixed_chunk: true", "unknown field 'scheduler.mixed")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text.replace(old, new, 1))
        with pytest.raises(SpecError, match=message):
            load_engine(str(bad))


@pytest.mark.parametrize("name", ENGINES)
def test_engine_request_costs_sourced(name: str) -> None:
    """A preset that states request costs cites them in sources.requests; every serving engine's default version
    states them (its other versions inherit)."""
    document = read_data_file(preset_root() / "engines" / f"{name}.yaml")
    if document.get("requests") is not None:
        assert str(document["sources"].get("requests", "")).strip(), name
    if document.get("default") and document.get("budget") != "ideal":
        assert document.get("requests") and load_engine(name).requests.request_s > 0, name


def test_engine_requests_section(tmp_path: Path) -> None:
    """The requests: block in its units (ms, us per token / chunk), each engine's own (vLLM 10 ms latency, SGLang 15,
    trtllm-serve 40; the API server's 3 ms + 50 us per chunk everywhere); older versions and a user's copy without
    it take the default version's; gpt-fast (no serving) and an unknown engine name none; bad values are one-line
    errors; capacity's overheads are the preset's."""
    from tfcalc.calc.serving_traffic import engine_overheads
    from tfcalc.spec.engine import RequestCosts

    vllm = load_engine("vllm").requests
    assert (vllm.request_s, vllm.api_request_s, vllm.api_token_s, vllm.api_servers) == (0.010, 0.003, 50e-6, 1)
    assert load_engine("sglang").requests.request_s == 0.015 and load_engine("trtllm").requests.request_s == 0.040
    assert load_engine("vllm@0.11").requests == load_engine("vllm-0.17").requests == vllm
    assert load_engine("gpt-fast").requests == RequestCosts()
    o = engine_overheads(load_engine("sglang"))
    assert (o.request_s, o.api_request_s, o.api_token_s, o.step_s) == (0.015, 0.003, 50e-6, 0.0)
    assert "3 ms/request + 50 us/chunk, 15 ms request latency" in o.source
    assert engine_overheads(None).request_s == 0.0 and engine_overheads(load_engine("gpt-fast")).api_token_s == 0.0
    text = (preset_root() / "engines" / "trtllm-1.0.yaml").read_text()
    start, end = text.index("requests:"), text.index("overheads:")
    mine = tmp_path / "my-trtllm.yaml"
    mine.write_text(text[:start] + text[end:])
    assert load_engine(str(mine)).requests == load_engine("trtllm").requests
    mine.write_text(text[:start] + "requests: {latency_ms: 2.5, step_us: 40, api_servers: 4}\n" + text[end:])
    mine_costs = load_engine(str(mine)).requests
    assert (mine_costs.request_s, mine_costs.step_s, mine_costs.api_servers, mine_costs.api_request_s) == (
        0.0025, 40e-6, 4, 0.0)
    for block, message in (("requests: {latency_ms: -1}", "requests.latency_ms' must be at least 0"),
                           ("requests: {latency_ms: 4000000}", "requests.latency_ms' must be at most"),
                           ("requests: {api_servers: 0}", "requests.api_servers' must be positive"),
                           ("requests: {latency_s: 1}", "unknown field 'requests.latency_s'"),
                           ("requests: 10", "field 'requests' must be a mapping")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text[:start] + block + "\n" + text[end:])
        with pytest.raises(SpecError, match=message) as caught:
            load_engine(str(bad))
        assert "\n" not in str(caught.value)


def test_interconnect_files_are_read_strictly(tmp_path: Path) -> None:
    """Interconnect files go through read_data_file (size limits, duplicate keys) and finite, bounded fields."""
    base = {"bandwidth_gb_s": 450, "nccl": {"efficiency": 0.78, "launch_us": 4.6, "step_latency_us": 0.87}}
    for change, message in (({"bandwidth_gb_s": float("inf")}, "bandwidth_gb_s' must be a finite number"),
                            ({"bandwidth_gb_s": 1e12}, r"bandwidth_gb_s' must be at most 1e\+07 \(tfcalc's limit\)"),
                            ({"nccl": {**base["nccl"], "efficiency": float("nan")}}, "must be a finite number"),
                            ({"nccl": {**base["nccl"], "launch_us": True}}, "nccl.launch_us' must be a number"),
                            ({"nccl": {**base["nccl"], "algorithm": ["ring"]}}, "nccl.algorithm' must be one of"),
                            ({"display_name": 7}, "display_name' must be text")):
        with pytest.raises(SpecError, match=message):
            interconnect_from_mapping({**base, **change}, "x.yaml", "x")
    path = tmp_path / "fabric.yaml"
    path.write_text("bandwidth_gb_s: 450\nbandwidth_gb_s: 900\nnccl: {efficiency: 0.5, launch_us: 1, "
                    "step_latency_us: 1}\n")
    with pytest.raises(SpecError, match="duplicate key 'bandwidth_gb_s'"):
        load_interconnect(str(path))
    with pytest.raises(UsageError, match="no such file"):  # a path is a path: never resolved inside presets/
        load_interconnect("../gpus/h100-sxm")
    with pytest.raises(UsageError, match="unknown interconnect preset 'nvlink'"):
        load_interconnect("nvlink")


def test_shared_experts_stream_is_validated() -> None:
    """kernels.shared_experts_stream: {max_tokens: N} (vLLM: 256) and/or {in_graphs: true} (TensorRT-LLM); absent,
    the shared experts run in line (SGLang's preset, and every engine file that says nothing)."""
    parsed = kernels_from_mapping({"shared_experts_stream": {"max_tokens": 64, "in_graphs": True}}, "e.yaml")
    assert (parsed.shared_experts_stream_max_tokens, parsed.shared_experts_stream_in_graphs) == (64, True)
    plain = kernels_from_mapping({}, "e.yaml")
    assert (plain.shared_experts_stream_max_tokens, plain.shared_experts_stream_in_graphs) == (0, False)
    for value, message in (
            ({"max_tokens": 0}, "needs max_tokens above 0 or in_graphs: true"),
            ({}, "must be a mapping of max_tokens, in_graphs"),
            ({"tokens": 5}, "unknown field 'kernels.shared_experts_stream.tokens'"),
            ({"in_graphs": "yes"}, "kernels.shared_experts_stream.in_graphs"),
            ({"max_tokens": 1.5}, "kernels.shared_experts_stream.max_tokens"),
            (256, "must be a mapping of max_tokens, in_graphs")):
        with pytest.raises(SpecError, match=message) as caught:
            kernels_from_mapping({"shared_experts_stream": value}, "e.yaml")
        assert "\n" not in str(caught.value)


def test_vllm_prices_large_bf16_experts_on_b200_slower() -> None:
    """kernels.moe_large_expert: vLLM's B200 bf16 experts (FlashInfer's TRT-LLM MoE) run their grouped GEMMs
    1 + s (1 - B / matrix) times as long once one expert's per-rank gate/up matrix passes B (44 MiB, s 1.75): Mixtral
    8x7B at tp 1 (224 MiB) about 2.4x, at tp 8 (28 MiB) not at all; a memory-bound decode step barely moves. Hopper,
    other engines and other formats keep one price."""
    from dataclasses import replace

    from tfcalc.calc import kernels as k

    b200 = rates_for(load_gpu("b200"), load_engine("vllm").kernels)
    threshold, slowdown = b200.moe_large_expert["bf16"]
    assert (threshold, slowdown) == (44 * 2**20, 1.75)
    matrix = 4096 * 2 * 14336 * 2  # Mixtral 8x7B: hidden x (gate + up) x width x 2 bytes
    assert k.moe_large_expert_slowdown(b200, "bf16", matrix) == pytest.approx(1 + 1.75 * (1 - 44 * 2**20 / matrix))
    assert k.moe_large_expert_slowdown(b200, "bf16", matrix / 8) == 1.0  # tp 8: 28 MiB
    assert k.moe_large_expert_slowdown(b200, "fp8_block", matrix) == 1.0
    args = {"experts_local": 8, "experts_total": 8, "top_k": 2, "hidden": 4096, "expert_width": 14336,
            "gated": True, "weight_bits": 16, "compute": "bf16", "weight_format": "bf16"}
    plain = replace(b200, moe_large_expert={})
    prefill, prefill_plain = (k.moe_experts(r, tokens=16384, **args) for r in (b200, plain))
    assert prefill.bound == prefill_plain.bound == "compute" and prefill.flops == prefill_plain.flops
    assert 2.0 < prefill.seconds / prefill_plain.seconds < 2.5
    decode, decode_plain = (k.moe_experts(r, tokens=4, **args) for r in (b200, plain))
    assert decode.bound == "memory" and decode.seconds == pytest.approx(decode_plain.seconds, rel=0.02)
    for gpu, engine in (("h200", "vllm"), ("b200", "sglang"), ("b200", "trtllm")):
        assert rates_for(load_gpu(gpu), load_engine(engine).kernels).moe_large_expert == {}


def test_sglang_prices_large_upcast_mxfp4_experts_on_hopper_slower() -> None:
    """SGLang upcasts MXFP4 experts on Hopper to bf16 (moe_stream_bits), so one expert's gate/up matrix holds 16
    bits per weight as its Triton kernel runs it: gpt-oss-120b's (2880 x 2 x 2880) is 31.6 MiB at tp 1, 7.9 at tp 4,
    4.0 at tp 8 -- against 8.4 / 2.1 / 1.05 MiB at the checkpoint's 4.25 bits. Past B (6 MiB on the H100) the grouped
    GEMMs take 1 + s (1 - B / matrix) times as long; vLLM's MXFP4 kernel (packed weights) has no such step."""
    from dataclasses import replace

    from tfcalc.calc import kernels as k

    h100 = rates_for(load_gpu("h100-sxm"), load_engine("sglang").kernels)
    threshold, slowdown = h100.moe_large_expert["mxfp4"]
    assert (threshold, slowdown) == (6 * 2**20, 1.10)
    tp1 = k.moe_expert_matrix_bytes(h100, "mxfp4", 2880, 2 * 2880, 4.25)
    assert tp1 == 2880 * 2 * 2880 * 2
    assert k.moe_large_expert_slowdown(h100, "mxfp4", tp1) == pytest.approx(1 + 1.10 * (1 - 6 * 2**20 / tp1))
    assert 1.8 < k.moe_large_expert_slowdown(h100, "mxfp4", tp1) < 2.0
    assert k.moe_large_expert_slowdown(h100, "mxfp4", tp1 / 8) == 1.0  # tp 8: 4.0 MiB
    vllm = rates_for(load_gpu("h100-sxm"), load_engine("vllm").kernels)
    assert k.moe_expert_matrix_bytes(vllm, "mxfp4", 2880, 2 * 2880, 4.25) == 2880 * 2 * 2880 * 4.25 / 8
    assert vllm.moe_large_expert == {}
    args = {"experts_local": 128, "experts_total": 128, "top_k": 4, "hidden": 2880, "expert_width": 2880,
            "gated": True, "weight_bits": 4.25, "compute": "bf16", "dequant": "fp4", "weight_format": "mxfp4"}
    plain = replace(h100, moe_large_expert={})
    prefill, prefill_plain = (k.moe_experts(r, tokens=16384, **args) for r in (h100, plain))
    assert prefill.bound == "compute" and 1.5 < prefill.seconds / prefill_plain.seconds < 2.0


def test_moe_large_expert_is_validated() -> None:
    kernels = kernels_from_mapping({"moe_large_expert": {"b200": {"bf16": [44, 1.75]}}}, "e.yaml")
    assert kernels.moe_large_expert_by_gpu == {"b200": {"bf16": (44 * 2**20, 1.75)}}
    for value, message in (
            ({"b200": {"bf16": 44}}, r"'kernels.moe_large_expert.b200.bf16' must be \[MiB, slowdown\], got 44"),
            ({"b200": {"bf16": [44]}}, "must be"),
            ({"b200": {"bf16": [0, 1]}}, r"kernels.moe_large_expert.b200.bf16\[0\]"),
            ({"b200": {"bf16": [44, -1]}}, r"kernels.moe_large_expert.b200.bf16\[1\]"),
            ({"b200": {"bf16": [44, "x"]}}, r"kernels.moe_large_expert.b200.bf16\[1\]"),
            ({"b201": {"bf16": [44, 1]}}, "unknown field 'kernels.moe_large_expert.b201'"),
            ({"b200": {"bf17": [44, 1]}}, "unknown field 'kernels.moe_large_expert.b200.bf17'"),
            ({"b200": {}}, "'kernels.moe_large_expert.b200' must be a mapping"),
            ([44, 1], "'kernels.moe_large_expert' must be a mapping of GPU preset names")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"moe_large_expert": value}, "e.yaml")


def test_engine_gdn_efficiency_and_floors() -> None:
    """kernels.gdn_efficiency: per GPU preset, the fraction of the bf16 peak an engine's chunked Gated DeltaNet
    prefill reaches (FlashInfer's on vLLM well above the flash-linear-attention Triton chain of SGLang and
    TensorRT-LLM); a long prefill is its FLOPs at that rate plus the gdn_prefill floor; a GPU without an entry prices
    at the GEMM rate; decode streams each sequence's state at the HBM rate after its own floor; ideal mode ignores
    both; bad values are one-line errors."""
    from tfcalc.calc import kernels as k

    vllm, sglang = load_engine("vllm").kernels, load_engine("sglang").kernels
    h200 = rates_for(load_gpu("h200"), vllm)
    assert h200.gdn_efficiency == pytest.approx(0.292)
    assert rates_for(load_gpu("h200"), sglang).gdn_efficiency == pytest.approx(0.039)
    assert rates_for(load_gpu("h100-pcie"), vllm).gdn_efficiency == pytest.approx(0.276)  # kernels_as: h100-sxm
    assert rates_for(load_gpu("a100-80gb"), vllm).gdn_efficiency == 0.0
    shape = dict(seqs=4, tokens=16_384, heads=32, key_dim=128, value_dim=128, state_bytes=32 * 128 * 128 * 4,
                 io_bytes=0.0)
    flops = (6 * 128 * 128 + 4 * 64 * 256) * 32 * 16_384
    long = k.gated_delta_rule(h200, decode=False, **shape)
    assert long.flops == flops and long.bound == "compute"
    assert long.seconds == pytest.approx(flops / (load_gpu("h200").peak_flops("bf16")[1] * 0.292) + 11.8e-6)
    assert k.gated_delta_rule(rates_for(load_gpu("h200"), sglang), decode=False, **shape).seconds > 7 * long.seconds
    ideal = h200.as_ideal()
    assert k.gated_delta_rule(ideal, decode=False, **shape).seconds == pytest.approx(
        flops / load_gpu("h200").peak_flops("bf16")[1])
    step = k.gated_delta_rule(h200, decode=True, **{**shape, "tokens": 256, "seqs": 256})
    assert step.bytes == 2 * 256 * 32 * 128 * 128 * 4 and step.floor_seconds == pytest.approx(4.4e-6)
    assert step.seconds == pytest.approx(step.bytes / (h200.memory_bandwidth * h200.memory_efficiency) + 4.4e-6,
                                         rel=0.05)
    plain = rates_for(load_gpu("h200"), EngineKernels())  # no gdn floors: attention's and elementwise's
    assert plain.floor("gdn_prefill") == plain.floor("attention") and plain.floor("gdn_decode") == plain.floor(
        "elementwise")
    for value, message in (({"h200": 0}, "field 'kernels.gdn_efficiency.h200' must be at least 0.0001"),
                           ({"h201": 0.3}, "unknown field 'kernels.gdn_efficiency.h201'")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"gdn_efficiency": value}, "e.yaml")


def test_kernel_peak_below_the_datasheet() -> None:
    """The B300's kernels run NVFP4 at the B200's rate: the latency model prices fp4 at 9,000 TFLOPS, the ideal
    roofline at the datasheet's 14,000; a kernel peak above the datasheet is a one-line error."""
    b300 = load_gpu("b300")
    rates = rates_for(b300, load_engine("vllm").kernels)
    assert rates.peak("fp4") == ("fp4", pytest.approx(9000e12))
    assert rates.as_ideal().peak("fp4") == ("fp4", pytest.approx(14000e12))
    assert rates.peak("bf16") == rates.as_ideal().peak("bf16") == ("bf16", pytest.approx(2250e12))
    assert "fp4 at the kernels' 9,000 TFLOPS (datasheet 14,000)" in rates.source
    b200 = rates_for(load_gpu("b200"), load_engine("vllm").kernels)
    assert b200.datasheet_peak_flops == {} and b200.peak("fp4") == b200.as_ideal().peak("fp4")
    document = {"memory_gib": 80, "hbm_bandwidth_tb_s": 3, "dense_tflops": {"bf16": 900, "fp4": 9000},
                "interconnect_bidirectional_gb_s": 900, "latency": {**GOOD, "kernel_peak_tflops": {"fp4": 10000}}}
    with pytest.raises(SpecError, match="'latency.kernel_peak_tflops.fp4' must not exceed dense_tflops.fp4 .9000."):
        gpu_from_mapping(document, "gpu.yaml", "gpu")


def test_dense_model_rates_name_no_moe_kernel() -> None:
    """A model without experts never runs the engine's fused MoE: its rates' source names none of its tuned shapes
    or efficiencies (estimate's note for Llama-3-70B read 'bf16 fused-MoE shapes without a tuned config...'); the
    MoE rates themselves are the same, and an MoE model's source still names them."""
    gpu, kernels = load_gpu("h100-sxm"), load_engine("vllm").kernels
    dense, moe = rates_for(gpu, kernels, has_experts=False), rates_for(gpu, kernels)
    assert "MoE" not in dense.source and "MoE efficiency from the engine preset" in moe.source
    assert dense.moe_efficiency_by_dtype == moe.moe_efficiency_by_dtype


def test_sglang_mxfp4_cost_per_touched_expert_against_aiconfigurator_rows() -> None:
    """kernels.moe_touched_expert_us: SGLang's MXFP4 x MXFP8 fused MoE (FlashInfer TRT-LLM) pays 0.205 us per touched
    expert, its weights at the GPU's fused-MoE stream; the B300 runs the B200's entry. Held-out rows of aiconfigurator
    0.12 systems/data/b300_sxm/moe/sglang/0.5.14 (w4a8_mxfp4_mxfp8, ep 1, power_law_1.01; the value was fitted on the
    B200's gpt-oss rows): Kimi K3's routed experts (latent 3584 x 3072, 896 experts, top 16) at tp 8, 64 tokens
    303.5 us (within 5 %; before: 225 us, 26 % short) and 8 tokens 91.7 us (within 15 %: its fixed cost grows with
    the layer's 896 experts, unmodelled); gpt-oss-120b's (2880 x 2880, 128 experts, top 4) at tp 1, 16 tokens
    120.9 us (within 10 %). Bad values are one-line errors."""
    sglang = load_engine("sglang").kernels
    assert sglang.moe_touched_expert_s_by_gpu == {"b200": {"mxfp4": pytest.approx(0.205e-6)}}
    gpu = load_gpu("b300")
    rates, mode = rates_for(gpu, sglang), linear_mode(get_dtype("mxfp4"), gpu)
    assert rates.moe_touched_expert == {"mxfp4": pytest.approx(0.205e-6)}
    routing = kernels.parse_routing("power-law:1.01")
    for hidden, width, experts, top_k, tokens, measured_us, within in ((3584, 384, 896, 16, 64, 303.5, 0.05),
                                                                       (3584, 384, 896, 16, 8, 91.7, 0.15),
                                                                       (2880, 2880, 128, 4, 16, 120.9, 0.10)):
        cost = kernels.moe_experts(rates, tokens=tokens, experts_local=experts, experts_total=experts, top_k=top_k,
                                   hidden=hidden, expert_width=width, gated=True, weight_bits=mode.bits,
                                   compute=mode.compute, dequant=mode.dequant, weight_format=mode.weights,
                                   routing=routing)
        assert cost.seconds * 1e6 == pytest.approx(measured_us, rel=within)
    for value, message in (({"b200": {"mxfp4": -1}}, "field 'kernels.moe_touched_expert_us.b200.mxfp4' must be at "
                                                      "least 0"),
                           ({"b201": {"mxfp4": 1}}, "unknown field 'kernels.moe_touched_expert_us.b201'")):
        with pytest.raises(SpecError, match=message):
            kernels_from_mapping({"moe_touched_expert_us": value}, "e.yaml")


def test_nccl_efficiency_by_gpus_parses_and_fails_clearly() -> None:
    base = {"bandwidth_gb_s": 32, "nccl": {"efficiency": 0.6, "launch_us": 4.8, "step_latency_us": 1.3}}
    fabric = interconnect_from_mapping({**base, "nccl_efficiency_by_gpus": {8: 0.05, 4: 0.16}}, "x.yaml", "x")
    assert fabric.nccl_efficiency_by_gpus == ((4, 0.16), (8, 0.05))
    assert [fabric.nccl_for(n).efficiency for n in (2, 4, 6, 8)] == [0.6, 0.16, 0.16, 0.05]
    with pytest.raises(SpecError, match="x.yaml: field 'nccl_efficiency_by_gpus' has GPU count 1"):
        interconnect_from_mapping({**base, "nccl_efficiency_by_gpus": {1: 0.5}}, "x.yaml", "x")
    with pytest.raises(SpecError, match="'nccl_efficiency_by_gpus.4' must be at most 1, got 2"):
        interconnect_from_mapping({**base, "nccl_efficiency_by_gpus": {4: 2}}, "x.yaml", "x")
    with pytest.raises(SpecError, match="'nccl_efficiency_by_gpus' must be a mapping"):
        interconnect_from_mapping({**base, "nccl_efficiency_by_gpus": [0.5]}, "x.yaml", "x")
