"""Device facts: which devices to profile, what NVML says about a GPU (name, memory, clocks, power), and the
few torch facts every profiler module shares (the dtype names, what an out-of-memory looks like, releasing
memory after one).

The theoretical bandwidth NVML implies is memory clock x 2 (double data rate) x bus width / 8; datasheet peaks
come from the GPU preset the device name matches, or none.
"""

from __future__ import annotations

import gc
import os
import platform
import re
from dataclasses import dataclass

import torch

from tfcalc.errors import UsageError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# How torch reports running out of memory: CUDA's allocator raises torch.OutOfMemoryError ("CUDA out of
# memory"); the CPU allocator raises a RuntimeError ("[enforce fail at alloc_cpu.cpp] ... DefaultCPUAllocator:
# can't allocate memory: you tried to allocate N bytes" or "DefaultCPUAllocator: not enough memory"); Python
# itself raises MemoryError.
OOM_MESSAGES = ("out of memory", "can't allocate memory", "not enough memory")


def torch_dtype(name: str) -> torch.dtype:
    """``bf16`` / ``fp16`` / ``fp32`` -> the torch dtype; a one-line UsageError otherwise."""
    if name not in DTYPES:
        raise UsageError(f"unknown dtype '{name}' (choose {', '.join(DTYPES)})")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return next((k for k, v in DTYPES.items() if v == dtype), str(dtype).removeprefix("torch."))


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory on any device (see OOM_MESSAGES)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(m in text for m in OOM_MESSAGES)


def release_memory(device: torch.device) -> None:
    """Return what the failed or finished work held: collect its garbage and empty the CUDA caching allocator."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def available_memory_bytes(device: torch.device) -> int | None:
    """Free device memory (CUDA), or the memory Linux reports available (MemAvailable), else None."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None

# Device-name patterns (as NVML / torch report them) -> GPU preset. First match wins; more specific first.
GPU_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"GH200.*144\s*G", "gh200-144gb"),  # "NVIDIA GH200 144G HBM3e"; before the H200, whose name it contains
    (r"GH200", "gh200"),  # "NVIDIA GH200 480GB" (96 GB HBM3; 480 GB is the Grace CPU's LPDDR5X)
    (r"H200", "h200"),
    (r"H100.*NVL", "h100-nvl"),
    (r"H100.*PCIe", "h100-pcie"),
    (r"H100", "h100-sxm"),
    (r"GB200", "gb200"),
    (r"B200", "b200"),
    (r"GB300", "gb300"),
    (r"B300", "b300"),
    (r"\bH20\b", "h20"),  # "NVIDIA H20" (the 96 GB part); not the H200 above
    (r"A100.*80\s*GB", "a100-80gb"),
    (r"A100", "a100-40gb"),
    (r"\bA10G\b", "a10g"),  # AWS's "NVIDIA A10G"
    (r"\bA10\b", "a10"),  # "NVIDIA A10"; not the A100 / A10G
    (r"\bA40\b", "a40"),  # "NVIDIA A40"; not the A400 / A4000
    (r"L40S", "l40s"),
    (r"\bL40\b", "l40"),  # "NVIDIA L40"; not the L40S
    (r"\bL4\b", "l4"),  # "NVIDIA L4"; not the L40 / L40S
    (r"RTX 4090", "rtx4090"),
    (r"RTX 5090(?!\s*(D\b|Laptop))", "rtx5090"),  # not the RTX 5090 D (capped tensor rate) or the Laptop GPU (GB203)
    (r"RTX A6000", "rtx-a6000"),  # "NVIDIA RTX A6000" (Ampere); not the RTX 6000 Ada or RTX PRO 6000
    (r"RTX 6000 Ada", "rtx6000-ada"),  # "NVIDIA RTX 6000 Ada Generation"; not Turing's "Quadro RTX 6000"
    (r"RTX PRO 6000 Blackwell Server", "rtx-pro-6000"),  # the Server Edition only (Workstation: 1,792 GB/s)
    (r"MI300X", "mi300x"),
    (r"MI325X", "mi325x"),
    (r"MI355X", "mi355x"),
    (r"MI350X", "mi350x"),
)


def match_gpu_preset(device_name: str) -> str | None:
    for pattern, preset in GPU_NAME_PATTERNS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return preset
    return None


@dataclass(frozen=True, kw_only=True)
class DeviceInfo:
    device: str  # "cuda:0" or "cpu"
    name: str
    memory_bytes: int | None = None
    memory_clock_hz: float | None = None
    memory_bus_width_bits: int | None = None
    sm_clock_hz: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    driver: str | None = None
    gpu_preset: str | None = None
    note: str = ""

    @property
    def theoretical_bandwidth_bytes_per_s(self) -> float | None:
        """NVML memory clock x 2 (DDR) x bus width / 8."""
        if self.memory_clock_hz is None or self.memory_bus_width_bits is None:
            return None
        return self.memory_clock_hz * 2 * self.memory_bus_width_bits / 8


def select_devices(gpu: str | None, device: str) -> list[torch.device]:
    """``--device cpu`` -> the CPU; ``--gpu 0``, ``--gpu 0,1`` or ``--gpu all`` -> those CUDA devices. A GPU
    index with the CPU is a contradiction, refused rather than ignored."""
    if device == "cpu":
        if gpu is not None:
            raise UsageError(f"--gpu {gpu} names a GPU but --device cpu profiles the CPU; drop one of them")
        return [torch.device("cpu")]
    if device != "cuda":
        raise UsageError(f"unknown device '{device}' (choose cuda or cpu)")
    if not torch.cuda.is_available():
        build = "a CUDA build" if torch.version.cuda else "a CPU-only build"
        raise UsageError(f"no CUDA GPU is visible to PyTorch {torch.__version__} ({build}); pass --device cpu to "
                         "profile the CPU")
    count = torch.cuda.device_count()
    if gpu in (None, "all"):
        indices = list(range(count)) if gpu == "all" else [0]
    else:
        try:
            indices = [int(item) for item in gpu.split(",")]
        except ValueError:
            raise UsageError(f"invalid --gpu '{gpu}': expected an index such as 0, a list 0,1, or all") from None
    for index in indices:
        if not 0 <= index < count:
            raise UsageError(f"no GPU {index}: {count} visible (indices 0..{count - 1})")
    return [torch.device("cuda", index) for index in indices]


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def select_rank_devices(gpu: str | None, device: str, world: int) -> list[torch.device]:
    """The devices of a spawned run of ``world`` ranks: ``world`` GPUs (``--gpu``'s list, else the first
    ``world`` visible), or the CPU (every rank on it)."""
    if device != "cuda" or not torch.cuda.is_available():
        return select_devices(gpu, device)  # the CPU, or select_devices' one-line error
    visible = torch.cuda.device_count()
    chosen = select_devices(gpu or ",".join(str(i) for i in range(min(world, visible))), device)
    if len(chosen) != world:
        raise UsageError(f"{world} ranks need {world} GPUs: {len(chosen)} {'given' if gpu else 'visible'} "
                         f"({visible} visible); pass --gpu with {world} indices, or run under torchrun across nodes")
    return chosen


def describe(device: torch.device) -> DeviceInfo:
    """NVML facts for a GPU (torch's where NVML is missing), or the CPU's name and core count."""
    if device.type == "cpu":
        name = platform.processor() or platform.machine()
        return DeviceInfo(device="cpu",
                          name=f"CPU {name} ({os.cpu_count()} logical cores, {torch.get_num_threads()} threads)")
    props = torch.cuda.get_device_properties(device)
    base = DeviceInfo(device=f"cuda:{device.index}", name=props.name, memory_bytes=props.total_memory,
                      gpu_preset=match_gpu_preset(props.name))
    try:
        import pynvml
    except ImportError:
        return _with_note(base, "NVML not available (pip install nvidia-ml-py): clocks and power not read")
    try:
        pynvml.nvmlInit()
        handle = _nvml_handle(pynvml, props, device.index)
        facts = {
            "memory_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle).total,
            "memory_clock_hz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM) * 1e6,
            "memory_bus_width_bits": pynvml.nvmlDeviceGetMemoryBusWidth(handle),
            "sm_clock_hz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) * 1e6,
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
            "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3,
            "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
        }
    except Exception as exc:  # pynvml.NVMLError and missing symbols on old drivers
        return _with_note(base, f"NVML query failed ({exc}); facts from PyTorch only")
    return DeviceInfo(device=base.device, name=base.name, gpu_preset=base.gpu_preset, **facts)


def _nvml_handle(pynvml: object, props: object, index: int) -> object:
    """The NVML device of this CUDA device: by UUID (right under CUDA_VISIBLE_DEVICES), else by index."""
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")  # type: ignore[attr-defined]
        except Exception:  # noqa: S110 - fall back to the index below
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)  # type: ignore[attr-defined]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _with_note(info: DeviceInfo, note: str) -> DeviceInfo:
    from dataclasses import replace

    return replace(info, note=note)


def check_fits(device: torch.device, nbytes: int, what: str, hint: str) -> None:
    """Refuse up front when ``nbytes`` exceed 80 % of the device's free memory (a GPU's, or what Linux reports
    available to the CPU: an allocation past it may not raise there, the OOM killer ends the process instead)."""
    free = available_memory_bytes(device)
    if free is None:
        return
    if nbytes > 0.8 * free:
        raise UsageError(f"{what} needs {nbytes / (1 << 30):,.1f} GiB but {device} has {free / (1 << 30):,.1f} GiB "
                         f"free; {hint}")


def datasheet_peaks(device: torch.device, dtype: torch.dtype) -> tuple[float | None, float | None, str | None]:
    """(dense FLOP/s for ``dtype``, HBM bytes/s, preset name) of the GPU preset this device's name matches;
    (None, None, None) on the CPU or when no preset matches."""
    if device.type != "cuda":
        return None, None, None
    from tfcalc.spec.presets import load_gpu

    preset = match_gpu_preset(torch.cuda.get_device_name(device))
    if preset is None:
        return None, None, None
    gpu = load_gpu(preset)
    return gpu.dense_flops_per_s.get(dtype_name(dtype)), gpu.hbm_bandwidth_bytes_per_s, preset
