"""The bundled GPU presets: they load, every number names a source, dense (not sparse) peaks, GiB capacities."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.presets import load_gpu, load_preset_document, preset_names

GPUS = {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "b300", "gb200", "gb300", "l40s",
        "rtx4090", "mi300x", "mi325x"}
GIB = 1 << 30
DOC_FIELDS = {"display_name", "vendor", "memory_type", "interconnect", "sources", "notes",
              "latency"}  # the latency block carries its own sources (tests/spec/test_latency_presets.py)


def test_names() -> None:
    assert set(preset_names("gpu")) == GPUS


@pytest.mark.parametrize("name", sorted(GPUS))
def test_every_number_names_a_source(name: str) -> None:
    document = load_preset_document("gpu", name)
    sourced = {k.strip() for keys in document["sources"] for k in keys.split(",")}
    numbers = [k for k, v in document.items() if k not in DOC_FIELDS]
    assert [k for k in numbers if k not in sourced] == []
    assert load_gpu(name).name == name


@pytest.mark.parametrize(("name", "gib", "bf16", "bandwidth"), [
    ("a100-80gb", 80, 312e12, 2.039e12),
    ("h100-sxm", 80, 989.5e12, 3.35e12),
    ("h200", 141, 989.5e12, 4.8e12),
    ("mi300x", 192, 1307.4e12, 5.3e12),
    ("mi325x", 256, 1307.4e12, 6.0e12),
    ("rtx4090", 24, 165.2e12, 1.008e12),
])
def test_values_dense_and_binary(name: str, gib: int, bf16: float, bandwidth: float) -> None:
    gpu = load_gpu(name)
    assert gpu.memory_bytes == gib * GIB
    assert gpu.dense_flops_per_s["bf16"] == pytest.approx(bf16)
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(bandwidth)


def test_not_the_sparse_figures() -> None:
    # datasheet "with sparsity" figures (docs/research/facts.yaml *_sparse_tflops) must not appear
    assert load_gpu("h100-sxm").dense_flops_per_s["fp8"] == pytest.approx(1979e12)  # not 3958
    assert load_gpu("b200").dense_flops_per_s["fp4"] == pytest.approx(9000e12)  # not 18000
    assert load_gpu("b300").dense_flops_per_s["fp4"] == pytest.approx(14000e12)  # not 18000 (HGX B300 144 PF / 8)
    assert "fp8" not in load_gpu("a100-80gb").dense_flops_per_s  # no FP8 on Ampere
    assert load_gpu("a100-80gb").peak_flops("fp8") == ("bf16", 312e12)
    assert load_gpu("h100-sxm").interconnect_bandwidth_bytes_per_s == pytest.approx(450e9)  # 900 bidirectional


def test_unknown_gpu_suggests() -> None:
    with pytest.raises(UsageError, match="did you mean .*h100-sxm"):
        load_gpu("h100")


def test_user_gpu_yaml(tmp_path: Path) -> None:
    path = tmp_path / "mygpu.yaml"
    path.write_text("memory_gb: 96\nhbm_bandwidth_gb_s: 4000\ndense_tflops: {bf16: 500}\n"
                    "interconnect_bidirectional_gb_s: 200\n")
    gpu = load_gpu(str(path))
    assert (gpu.name, gpu.memory_bytes, gpu.hbm_bandwidth_bytes_per_s) == ("mygpu", 96_000_000_000, 4e12)
    path.write_text("memory_gib: 96\nhbm_bandwith_tb_s: 4\ndense_tflops: {bf16: 500}\n")
    with pytest.raises(SpecError, match="unknown field 'hbm_bandwith_tb_s' .*did you mean 'hbm_bandwidth_tb_s'"):
        load_gpu(str(path))


def test_nvlink_domain(tmp_path: Path) -> None:
    """GB200 / GB300 NVL72 join 72 GPUs in one NVLink domain; other parts leave it to the node; a bad value fails."""
    assert load_gpu("gb200").nvlink_domain_gpus == load_gpu("gb300").nvlink_domain_gpus == 72
    assert load_gpu("gb200").gpus_per_host == load_gpu("gb300").gpus_per_host == 4   # a compute tray
    assert load_gpu("h200").nvlink_domain_gpus is None and load_gpu("h200").gpus_per_host is None
    path = tmp_path / "mygpu.yaml"
    for value in ("0", "8.5", "true", "many"):
        path.write_text("memory_gb: 96\nhbm_bandwidth_gb_s: 4000\ndense_tflops: {bf16: 500}\n"
                        f"interconnect_bidirectional_gb_s: 200\nnvlink_domain_gpus: {value}\n")
        with pytest.raises(SpecError, match="nvlink_domain_gpus' must be a whole number"):
            load_gpu(str(path))
        path.write_text("memory_gb: 96\nhbm_bandwidth_gb_s: 4000\ndense_tflops: {bf16: 500}\n"
                        f"interconnect_bidirectional_gb_s: 200\ngpus_per_host: {value}\n")
        with pytest.raises(SpecError, match="gpus_per_host' must be a whole number"):
            load_gpu(str(path))


@pytest.mark.parametrize("name", preset_names("gpu"))
def test_kernels_as_names_a_measured_preset(name: str) -> None:
    """A part that shares another's kernels names a bundled preset that itself shares nobody's."""
    shared = load_gpu(name).latency.kernels_as
    if shared is not None:
        assert shared in preset_names("gpu") and shared != name
        assert load_gpu(shared).latency.kernels_as is None


@pytest.mark.parametrize("name", preset_names("gpu"))
def test_measured_on_names_a_measured_preset_or_none(name: str) -> None:
    """A latency block measured elsewhere names a bundled preset measured on itself (or ``none``), and a part that
    shares another's engine kernels (kernels_as) was measured there too; the estimate's rates line says which."""
    from tfcalc.calc.latency import rates_for
    from tfcalc.spec.engine import EngineKernels

    lat = load_gpu(name).latency
    where = lat.measured_on
    if where is not None and where != "none":
        assert where in preset_names("gpu") and where != name and load_gpu(where).latency.measured_here
    if lat.kernels_as is not None:
        assert where == lat.kernels_as
    source = rates_for(load_gpu(name), EngineKernels()).source
    assert ("(measured kernels)" in source) == lat.measured_here
    assert ("not measured" in source) == (where == "none")


def test_trust_sentence_only_for_parts_measured_elsewhere() -> None:
    from tfcalc.report.capacity import trust_sentence

    assert "no kernel measurements" in trust_sentence(load_gpu("mi300x"), calibrated=False)
    assert "measured on h100-sxm" in trust_sentence(load_gpu("h100-pcie"), calibrated=False)
    assert trust_sentence(load_gpu("h200"), calibrated=False) is None
    assert trust_sentence(load_gpu("mi300x"), calibrated=True) is None   # the user's own measurements
