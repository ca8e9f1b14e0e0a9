"""The bundled GPU presets: they load, every number names a source, dense (not sparse) peaks, GiB capacities."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.presets import load_gpu, load_preset_document, preset_names

GPUS = {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h100-nvl", "h200", "b200", "b300", "gb200", "gb300",
        "l40s", "l4", "rtx4090", "rtx-pro-6000", "mi300x", "mi325x", "mi350x", "mi355x",
        "a10g", "a10", "l40", "h20", "rtx5090", "gh200", "gh200-144gb", "rtx-a6000", "rtx6000-ada", "a40"}
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
    ("h100-nvl", 94, 835.5e12, 3.9e12),
    ("l4", 24, 121e12, 0.3e12),
    ("rtx-pro-6000", 96, 480e12, 1.597e12),
    ("mi355x", 288, 2516.6e12, 8.0e12),
    ("mi350x", 288, 2306.9e12, 8.0e12),
    ("a10g", 24, 70.04e12, 0.6e12),
    ("a10", 24, 125e12, 0.6e12),
    ("l40", 48, 181.05e12, 0.864e12),
    ("h20", 96, 148e12, 4.0e12),
    ("rtx5090", 32, 209.5e12, 1.792e12),
    ("gh200", 96, 990e12, 4.0e12),  # GH200 datasheet: "96GB HBM3 | 144GB HBM3e", "Up to 4TB/s | Up to 4.9TB/s"
    ("gh200-144gb", 144, 990e12, 4.9e12),
    ("rtx-a6000", 48, 309.7e12 / 2, 0.768e12),  # datasheet "Tensor Performance 309.7 TFLOPS" (sparse), 768 GB/s
    ("rtx6000-ada", 48, 1457.0e12 / 4, 0.96e12),  # datasheet sparse FP8 1,457.0: / 2 (dense) / 2 (16-bit)
    ("a40", 48, 149.7e12, 0.696e12),  # datasheet "BF16 ... with FP32 Accumulate 149.7 | 299.4*", 696 GB/s
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


# The new parts' cited figures (each preset's sources): dense = the datasheet's with-sparsity figure / 2 where the
# vendor prints one; runtime capacity as the CUDA runtime reports it; GPU-to-GPU bandwidth one direction.
NEW_PARTS = {
    # name: (runtime GiB, {dtype: dense TFLOPS}, interconnect GB/s one way, SMs / CUs, fabric, kernels_as, measured_on)
    "h100-nvl": (93.09, {"fp32": 60, "tf32": 835 / 2, "bf16": 1671 / 2, "fp8": 3341 / 2, "int8": 3341 / 2}, 64, 132,
                 "pcie5", "h100-sxm", "h100-sxm"),
    "l4": (22.03, {"fp32": 30.3, "tf32": 120 / 2, "bf16": 242 / 2, "fp8": 485 / 2, "int8": 485 / 2}, 32, 58, "pcie4",
           "l40s", "l40s"),
    "rtx-pro-6000": (95.01, {"fp32": 120, "bf16": 480, "fp8": 960, "int8": 960, "fp4": 1920}, 64, 188, "pcie5", None,
                     None),   # its own SM120 tables (aiconfigurator 0.12 systems/data/rtx_pro_6000_server)
    "mi355x": (287.98, {"fp32": 157.3, "bf16": 2516.6, "fp8": 5033.2, "int8": 5033.2, "fp4": 10066.3}, 537.6, 256,
               "xgmi-mi350", None, "none"),
    "mi350x": (287.98, {"fp32": 144.2, "bf16": 2306.9, "fp8": 4613.7, "int8": 4613.7, "fp4": 9227.5}, 537.6, 256,
               "xgmi-mi350", None, "none"),
    # A10 datasheet (dense = sparse*/2); L40 datasheet column; H20 partner-sheet figures (printed dense); the A10G's
    # and RTX 5090's are derived (test_derived_tensor_rates below checks the arithmetic against the printed figures)
    "a10": (22.06, {"fp32": 31.2, "tf32": 125 / 2, "bf16": 250 / 2, "int8": 500 / 2}, 32, 72, "pcie4", "l40s", "l40s"),
    "a10g": (22.06, {"fp32": 35.02, "tf32": 35.02, "bf16": 70.04, "int8": 280.17}, 32, 80, "pcie4", "l40s", "l40s"),
    "l40": (44.4, {"fp32": 90.5, "tf32": 181 / 2, "bf16": 362.1 / 2, "fp8": 724 / 2, "int8": 724 / 2}, 32, 142, "pcie4",
            "l40s", "l40s"),
    "h20": (95.0, {"fp32": 44, "tf32": 74, "bf16": 148, "fp8": 296, "int8": 296}, 450, 78, "nvlink4", "h100-sxm",
            "h100-sxm"),
    "rtx5090": (31.36, {"fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp8": 419, "int8": 838, "fp4": 1676}, 64, 170,
                "pcie5", "l40s", "l40s"),
    # GH200 datasheet's dense column (printed after each sparse* figure); the driver's totals (97,280 MiB, OpenCL;
    # 153,008,209,920 B, cuDeviceTotalMem); 18 NVLink 4 links (NV18) = 900 GB/s, 450 one way
    "gh200": (97280 / 1024, {"fp32": 67, "tf32": 494, "bf16": 990, "fp8": 1979, "int8": 1979}, 450, 132, "nvlink4",
              "h100-sxm", "h100-sxm"),
    "gh200-144gb": (153_008_209_920 / GIB, {"fp32": 67, "tf32": 494, "bf16": 990, "fp8": 1979, "int8": 1979}, 450, 132,
                    "nvlink4", "h200", "h200"),
    # A40 datasheet (dense as printed); the RTX A6000's and RTX 6000 Ada's are derived (test_derived_tensor_rates);
    # torch total_memory 45,416 / 48,676 / 48,622 MiB; PCIe 4.0 x16 64 GB/s bidirectional
    "a40": (45416 / 1024, {"fp32": 37.4, "tf32": 74.8, "bf16": 149.7, "int8": 299.3}, 32, 84, "pcie4", "l40s", "l40s"),
    "rtx-a6000": (48676 / 1024, {"fp32": 38.7, "tf32": 309.7 / 4, "bf16": 309.7 / 2, "int8": 309.7}, 32, 84, "pcie4",
                  "l40s", "l40s"),
    "rtx6000-ada": (48622 / 1024, {"fp32": 91.1, "tf32": 1457 / 8, "bf16": 1457 / 4, "fp8": 1457 / 2, "int8": 1457 / 2},
                    32, 142, "pcie4", "l40s", "l40s"),
}


@pytest.mark.parametrize("name", sorted(NEW_PARTS))
def test_new_parts_match_their_sources(name: str) -> None:
    runtime, tflops, link, sms, fabric, shared, measured = NEW_PARTS[name]
    gpu = load_gpu(name)
    assert gpu.runtime_memory_bytes == (None if runtime is None else pytest.approx(runtime * GIB, abs=0.005 * GIB))
    assert {k: v / 1e12 for k, v in gpu.dense_flops_per_s.items() if k != "fp16"} == pytest.approx(tflops)
    assert gpu.dense_flops_per_s["fp16"] == gpu.dense_flops_per_s["bf16"]
    assert gpu.interconnect_bandwidth_bytes_per_s == pytest.approx(link * 1e9)
    lat = gpu.latency
    assert (lat.sm_count, lat.interconnect_preset, lat.kernels_as, lat.measured_on) == (sms, fabric, shared, measured)
    assert gpu.vendor == ("AMD" if name.startswith("mi") else "NVIDIA")


def test_new_parts_memory_and_ratios() -> None:
    """Each sparse-only datasheet figure is halved once; the CDNA 4 peaks are one per-CU-clock rate at two clocks."""
    assert load_gpu("h100-nvl").runtime_memory_bytes < load_gpu("h100-nvl").memory_bytes
    assert load_gpu("l4").runtime_memory_bytes / GIB == pytest.approx(23034 / 1024 - 0.46, abs=0.01)  # nvidia-smi
    mi355x, mi350x = load_gpu("mi355x").dense_flops_per_s, load_gpu("mi350x").dense_flops_per_s
    for dtype, per_cu_clock in (("bf16", 4096), ("fp8", 8192), ("fp4", 16384), ("fp32", 256)):
        assert mi355x[dtype] == pytest.approx(256 * per_cu_clock * 2.4e9, rel=5e-4)  # as printed, to 0.1 TFLOPS
        assert mi350x[dtype] == pytest.approx(256 * per_cu_clock * 2.2e9, rel=5e-4)
    assert "tf32" not in mi355x and "tf32" not in mi350x  # CDNA 4 has no TF32 matrix path: falls back to bf16
    pro = load_gpu("rtx-pro-6000").dense_flops_per_s
    assert pro["bf16"] == 4 * pro["fp32"] and pro["fp4"] == 4 * pro["bf16"]  # GB202: 1,024 / 256 FLOPs a SM-clock


def test_derived_tensor_rates() -> None:
    """The derived dense rates redone from their sources' printed figures: per SM-clock rates x SMs x boost clock."""
    a10, a10g = load_gpu("a10").dense_flops_per_s, load_gpu("a10g").dense_flops_per_s
    per_sm_clock = 125e12 / (72 * 1.695e9)  # A10 datasheet BF16 over its 72 SMs at 1,695 MHz: 1,024 FLOPs
    assert per_sm_clock == pytest.approx(1024, rel=1e-3)
    assert a10["fp32"] == pytest.approx(72 * 128 * 2 * 1.695e9, rel=2e-3)  # 31.24 printed as 31.2
    assert a10g["bf16"] == pytest.approx(80 * per_sm_clock / 2 * 1.71e9, rel=1e-3)  # half rate, 80 SMs, 1,710 MHz
    assert a10g["fp32"] == pytest.approx(80 * 128 * 2 * 1.71e9, rel=1e-3)
    assert a10g["int8"] == pytest.approx(a10["int8"] / (72 * 1.695e9) * 80 * 1.71e9, rel=1e-3)
    assert a10g["tf32"] == a10g["bf16"] / 2 and a10["tf32"] == a10["bf16"] / 2
    assert "fp8" not in a10 and "fp8" not in a10g  # Ampere: fp8 falls back to bf16
    assert load_gpu("a10g").peak_flops("fp8") == ("bf16", 70.04e12)
    l40, l40s = load_gpu("l40").dense_flops_per_s, load_gpu("l40s").dense_flops_per_s
    assert l40["bf16"] == pytest.approx(142 * 512 * 2.49e9, rel=1e-3)  # half the L40S's 1,024 per SM-clock
    assert l40["bf16"] == pytest.approx(l40s["bf16"] / 2, rel=1e-3) and l40["fp8"] == 2 * 181e12
    rtx = load_gpu("rtx5090").dense_flops_per_s
    assert rtx["bf16"] == pytest.approx(838.4e12 / 4, rel=1e-3)  # sparse FP16-accumulate / 2 (sparsity) / 2 (FP32 acc)
    assert rtx["bf16"] == pytest.approx(170 * 512 * 2.407e9, rel=1e-3)  # the 4090's per SM-clock rate
    assert rtx["fp32"] == pytest.approx(170 * 128 * 2 * 2.407e9, rel=1e-3)
    assert rtx["fp4"] == 3352e12 / 2 == 8 * rtx["bf16"] and rtx["int8"] == 4 * rtx["bf16"] == 2 * rtx["fp8"]
    h20, h100 = load_gpu("h20").dense_flops_per_s, load_gpu("h100-sxm").dense_flops_per_s
    assert h20["bf16"] / h100["bf16"] == pytest.approx(1 / 7, abs=0.01)  # "~15 % of the H100"
    assert h20["fp8"] == h20["int8"] == 2 * h20["bf16"]
    a6000 = load_gpu("rtx-a6000").dense_flops_per_s  # datasheet: 38.7 FP32, 309.7 sparse tensor, 84 SMs at 1.80 GHz
    assert a6000["fp32"] == pytest.approx(84 * 128 * 2 * 1.80e9, rel=2e-3)
    assert a6000["bf16"] == pytest.approx(84 * per_sm_clock * 1.80e9, rel=1e-3)  # the A10's full per SM-clock rate
    assert a6000["tf32"] == pytest.approx(a6000["bf16"] / 2) and a6000["int8"] == pytest.approx(2 * a6000["bf16"])
    a40 = load_gpu("a40").dense_flops_per_s  # datasheet: 149.7 dense BF16, 84 SMs at 1.74 GHz
    assert a40["bf16"] == pytest.approx(84 * per_sm_clock * 1.74e9, rel=1e-3)
    assert "fp8" not in a40 and "fp8" not in a6000  # Ampere
    ada = load_gpu("rtx6000-ada").dense_flops_per_s  # datasheet: 91.1 FP32, 1,457.0 sparse FP8, 142 SMs at 2.505 GHz
    assert ada["fp32"] == pytest.approx(18176 * 2 * 2.505e9, rel=1e-3)
    assert ada["fp8"] == pytest.approx(142 * 2048 * 2.505e9, rel=1e-3)  # the L40S's rate (733 = 142 x 2,048 x 2.52)
    assert ada["bf16"] == ada["fp8"] / 2 and ada["int8"] == ada["fp8"] and ada["tf32"] == pytest.approx(ada["bf16"] / 2,
                                                                                                        rel=1e-4)
    gh200, gh200e = load_gpu("gh200").dense_flops_per_s, load_gpu("gh200-144gb").dense_flops_per_s
    assert gh200 == gh200e  # one datasheet column for both memory variants
    for dtype, sparse in (("tf32", 989), ("bf16", 1979), ("fp8", 3958), ("int8", 3958)):
        assert gh200[dtype] == pytest.approx(sparse * 1e12 / 2, rel=1.5e-3)  # printed dense = sparse* / 2, rounded
    assert gh200["bf16"] == pytest.approx(h100["bf16"], rel=1e-3)  # the H100 SXM's GH100 peaks


def test_new_parts_runtime_memory_below_nvidia_smi() -> None:
    """The CUDA runtime's total sits 0.4-0.6 GiB under nvidia-smi's (the MiB totals each preset's sources quote)."""
    for name, smi_mib in (("a10g", 23028), ("a10", 23028), ("l40", 46068), ("h20", 97871), ("rtx5090", 32607)):
        gpu = load_gpu(name)
        gap = smi_mib / 1024 - gpu.runtime_memory_bytes / GIB
        assert 0.4 <= gap <= 0.6, (name, gap)
        assert gpu.runtime_memory_bytes < smi_mib * (1 << 20) < gpu.memory_bytes
    assert load_gpu("a10g").runtime_memory_bytes / GIB == pytest.approx(22587 / 1024, abs=0.005)  # torch MiB
    assert load_gpu("h20").runtime_memory_bytes / GIB == pytest.approx(97285 / 1024, abs=0.005)
    # the second batch's nvidia-smi totals (each preset's memory_gib source): ECC off on the workstation cards
    for name, smi_mib in (("rtx-a6000", 49140), ("rtx6000-ada", 49140), ("a40", 46068), ("gh200", 97871),
                          ("gh200-144gb", 146831)):
        gpu = load_gpu(name)
        assert 0.4 <= smi_mib / 1024 - gpu.runtime_memory_bytes / GIB <= 0.9, name  # GH200: 591 / 911 MiB
        assert gpu.runtime_memory_bytes < smi_mib * (1 << 20) <= gpu.memory_bytes


def test_gh200_hosts_and_fabric() -> None:
    """Lambda rents a GH200 one to a host; a GH200 NVL2 server holds two; both join GPUs by NVLink 4, not the C2C."""
    one, pair = load_gpu("gh200"), load_gpu("gh200-144gb")
    assert (one.gpus_per_host, pair.gpus_per_host) == (1, 2)
    assert one.nvlink_domain_gpus is None and pair.nvlink_domain_gpus is None
    assert one.interconnect_bandwidth_bytes_per_s == load_gpu("h100-sxm").interconnect_bandwidth_bytes_per_s
    assert one.memory_bytes < pair.memory_bytes and one.hbm_bandwidth_bytes_per_s < pair.hbm_bandwidth_bytes_per_s


@pytest.mark.parametrize(("device_name", "preset"), [
    ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA L4", "l4"), ("NVIDIA L40S", "l40s"), ("NVIDIA L40", "l40"),
    ("NVIDIA A10G", "a10g"), ("NVIDIA A10", "a10"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb"), ("NVIDIA A100 80GB PCIe", "a100-80gb"),
    ("NVIDIA H20", "h20"), ("NVIDIA H200", "h200"), ("NVIDIA H200 NVL", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA GeForce RTX 5090", "rtx5090"), ("NVIDIA GeForce RTX 5090 D", None), ("NVIDIA GeForce RTX 5090 D v2", None),
    ("NVIDIA GeForce RTX 5090 Laptop GPU", None), ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA A40", "a40"),
    ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA GH200 144G HBM3e", "gh200-144gb"), ("NVIDIA GH200 120GB", "gh200"),
    ("NVIDIA RTX A6000", "rtx-a6000"), ("NVIDIA RTX 6000 Ada Generation", "rtx6000-ada"), ("Quadro RTX 6000", None),
    ("NVIDIA RTX A4000", None), ("NVIDIA RTX A400", None), ("NVIDIA RTX 5000 Ada Generation", None),
    ("NVIDIA L20", None),
    ("NVIDIA A16", None), ("NVIDIA GeForce RTX 5080", None),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", None),  # 1,792 GB/s: a different part
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", None),
    ("AMD Instinct MI355X", "mi355x"), ("AMD Instinct MI350X", "mi350x"), ("AMD Instinct MI300X", "mi300x"),
])
def test_device_names_of_the_new_parts(device_name: str, preset: str | None) -> None:
    from tfcalc.profile.device import match_gpu_preset

    assert match_gpu_preset(device_name) == preset


# Printed runtime totals (each preset's runtime_memory_gib source), redone here from the figure as printed: torch's
# total_memory in MiB ("MB" in its repr) / 1,024, or a GiB figure printed to 0.01 by vLLM or torch.
RUNTIME_PRINTED_GIB = {
    "a100-40gb": 39.49,            # "NVIDIA A100-SXM4-40GB (39.49 GiB usable)", vLLM "total_gpu_memory (39.49GiB)"
    "a100-80gb": 79.15,            # "A100-SXM4-80GB (79.15 GB VRAM)", torch OOM "79.15 GiB total capacity"
    "h100-pcie": 81008 / 1024,     # "name='NVIDIA H100 PCIe' ... total_memory=81008MB"
    "b200": 182631 / 1024,         # "name='NVIDIA B200' ... total_memory=182631MB"; vLLM "(.../178.35 GiB)"
    "mi300x": 196592 / 1024,       # "name='AMD Instinct MI300X' ... total_memory=196592MB" (ROCm/ROCm #4203)
    "mi355x": 287.98,              # vLLM on ROCm "Free memory on device cuda:0 (84.11/287.98 GiB) on startup"
    "b300": 287_428_771_840 / GIB,  # torch "device_total_bytes=287428771840"; vLLM "(264.8/267.69 GiB)"
    "gb200": 184.31,               # torch "GPU 3 has a total capacity of 184.31 GiB" (vllm issue #43951)
    "gb300": 276.50,               # torch "GPU 0 has a total capacity of 276.50 GiB" (64 x GB300 FSDP sweep)
    "mi325x": 255.98,              # torch on ROCm "GPU 0 has a total capacity of 255.98 GiB" (vllm issue #41962)
    "mi350x": 287.98,              # torch on ROCm "GPU N has a total capacity of 287.98 GiB" (8 x MI350X, vLLM 0.25.1)
    "l4": 19.83 / 0.9,             # vLLM "Free memory on device cuda:0 (2.3/22.03 GiB) ... (0.9, 19.83 GiB)"
    "rtx5090": 28.22 / 0.9,        # vLLM 0.28 "Free memory on device (30.86/31.36 GiB) ... (0.9, 28.22 GiB)"
}


@pytest.mark.parametrize("name", sorted(RUNTIME_PRINTED_GIB))
def test_runtime_memory_matches_the_printed_figure(name: str) -> None:
    """runtime_memory_gib is the printed runtime total to the preset's two decimals, below the nominal capacity."""
    gpu = load_gpu(name)
    assert gpu.runtime_memory_bytes == pytest.approx(RUNTIME_PRINTED_GIB[name] * GIB, abs=0.005 * GIB)
    assert gpu.runtime_memory_bytes < gpu.memory_bytes


def test_runtime_memory_cross_checks() -> None:
    """The second printed figure each source names agrees; the runtime keeps 0.4-0.9 GiB under nvidia-smi's total on
    Ampere and Hopper parts, 0.7-1.1 GiB on Blackwell ones, and a few MiB of the ROCm-listed capacity on AMD parts."""
    gib = {name: load_gpu(name).runtime_memory_bytes / GIB for name in RUNTIME_PRINTED_GIB}
    assert gib["b200"] == pytest.approx(178.35, abs=0.005)  # vLLM "Free memory on device cuda:0 (48.48/178.35 GiB)"
    assert gib["mi300x"] == pytest.approx(182.39 / 0.95, abs=0.01)  # vLLM "(0.95, 182.39 GiB)" on the MI300X
    assert gib["mi355x"] == pytest.approx(273.59 / 0.95, abs=0.01)  # vLLM "(0.95, 273.59 GiB)" on the MI355X
    assert gib["h100-pcie"] == pytest.approx(79.1, abs=0.05)  # "NVIDIA H100 PCIe (79.1GB)"
    for name, smi_mib in (("a100-40gb", 40960), ("a100-80gb", 81920)):
        assert 0.4 <= smi_mib / 1024 - gib[name] <= 0.9, name
    for name, listed in (("mi300x", 192), ("mi355x", 288), ("mi325x", 256), ("mi350x", 288)):
        assert 0 < listed - gib[name] < 0.05, name  # ROCm's "VRAM (GiB)" table
    assert gib["b300"] == pytest.approx(267.69, abs=0.005)  # vLLM "Free memory on device (264.8/267.69 GiB)"
    assert gib["b300"] == pytest.approx(208.8 / 0.78, abs=0.01)  # vLLM "(0.78, 208.8 GiB)" on the same node
    # nvidia-smi's MiB totals (memory_gib's sources): the Blackwell parts' runtime keeps 0.7-1.1 GiB of them (B200:
    # 183,359 MiB against 178.35 GiB), more than the Hopper and Ampere parts' 0.4-0.9
    for name, smi_mib in (("b300", 275_040), ("gb200", 189_471), ("gb300", 284_208), ("b200", 183_359)):
        assert 0.7 <= smi_mib / 1024 - gib[name] <= 1.1, name
    for name, smi_mib in (("b300", 275_040), ("gb200", 189_471), ("gb300", 284_208)):
        assert load_gpu(name).memory_bytes == pytest.approx(smi_mib * (1 << 20), abs=0.005 * GIB), name
