"""The presets the latency model reads: GPU latency blocks, interconnects, engines -- sourced, validated strictly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfcalc.errors import SpecError
from tfcalc.spec.engine import engine_from_mapping, load_engine
from tfcalc.spec.gpu import latency_from_mapping
from tfcalc.spec.interconnect import interconnect_from_mapping, load_interconnect
from tfcalc.spec.presets import load_gpu, load_preset_document, preset_names, preset_root, read_data_file

GPUS = preset_names("gpu")
INTERCONNECTS = sorted(p.stem for p in (preset_root() / "interconnects").glob("*.yaml"))
ENGINES = sorted(p.stem for p in (preset_root() / "engines").glob("*.yaml"))


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
def test_engines_sourced_and_valid(name: str) -> None:
    document = read_data_file(preset_root() / "engines" / f"{name}.yaml")
    numbers = [k for k in document if k not in ("display_name", "sources", "notes")]
    assert [k for k in numbers if k not in _sourced(document)] == []
    assert load_engine(name).name == name


def test_reference_engines_exist() -> None:
    assert {"vllm", "sglang", "trtllm", "gpt-fast"} <= set(ENGINES)


GOOD = {"sm_count": 132, "gemm_efficiency": {"bf16": 0.8}, "attention_efficiency": 0.6, "moe_efficiency": 0.7,
        "memory_efficiency": 0.85, "floors_us": {"gemm": 3, "elementwise": 2, "attention": 10, "moe": 30},
        "interconnect_preset": "nvlink4"}


@pytest.mark.parametrize(("change", "message"), [
    ({"sm_count": 0}, "latency.sm_count' must be a positive integer"),
    ({"gemm_efficiency": {"bf17": 0.8}}, "unknown dtype 'latency.gemm_efficiency.bf17'"),
    ({"memory_efficiency": 1.5}, "latency.memory_efficiency' must be in"),
    ({"floors_us": {"gemm": 3}}, "missing 'latency.floors_us.elementwise'"),
    ({"floors_us": {**GOOD["floors_us"], "gemv": 1}}, "unknown 'latency.floors_us.gemv'"),
    ({"moe_efficiency": None}, "missing required field 'latency.moe_efficiency'"),
    ({"colour": 1}, "unknown field 'latency.colour'"),
])
def test_latency_block_errors_name_the_field(change: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        latency_from_mapping({**GOOD, **change}, "gpu.yaml")


def test_user_gpu_with_latency_block(tmp_path: Path) -> None:
    path = tmp_path / "mygpu.yaml"
    path.write_text("memory_gb: 96\nhbm_bandwidth_gb_s: 4000\ndense_tflops: {bf16: 500}\n"
                    "interconnect_bidirectional_gb_s: 900\nlatency: {sm_count: 100, gemm_efficiency: {bf16: 0.7}, "
                    "attention_efficiency: 0.5, moe_efficiency: 0.6, memory_efficiency: 0.8, floors_us: {gemm: 3, "
                    "elementwise: 2, attention: 9, moe: 20}, interconnect_preset: pcie5}\n")
    gpu = load_gpu(str(path))
    assert gpu.latency is not None and gpu.latency.floors_s["moe"] == pytest.approx(20e-6)


def test_interconnect_and_engine_errors() -> None:
    with pytest.raises(SpecError, match="nccl.efficiency' must be in"):
        interconnect_from_mapping({"bandwidth_gb_s": 450, "nccl": {"efficiency": 2, "launch_us": 1,
                                                                   "step_latency_us": 1}}, "x.yaml", "x")
    with pytest.raises(SpecError, match="missing required field 'nccl.launch_us'"):
        interconnect_from_mapping({"bandwidth_gb_s": 450, "nccl": {"efficiency": 0.5, "step_latency_us": 1}},
                                  "x.yaml", "x")
    with pytest.raises(SpecError, match="nccl.algorithm' must be one of"):
        interconnect_from_mapping({"bandwidth_gb_s": 450, "nccl": {"efficiency": 0.5, "launch_us": 1,
                                                                   "step_latency_us": 1, "algorithm": "star"}},
                                  "x.yaml", "x")
    with pytest.raises(SpecError, match="cuda_graphs' must be true or false"):
        engine_from_mapping({"cuda_graphs": "yes"}, "e.yaml", "e")
    with pytest.raises(SpecError, match="unknown field 'block_floors_us.mla_encode'"):
        engine_from_mapping({"block_floors_us": {"mla_encode": 3}}, "e.yaml", "e")
