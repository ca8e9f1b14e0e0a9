"""GPUSpec: one frozen description of an accelerator for the planner and the roofline estimates.

Units in the dataclass are SI base units: bytes, bytes/s, FLOP/s. Preset YAML (``presets/gpus/NAME.yaml``)
uses the units datasheets print and is converted here, in ``gpu_from_mapping``:

- ``memory_gib``: capacity in binary GiB (2^30 bytes). HBM and GDDR parts are built from DRAM dies whose
  densities are powers of two, and the vendor's "80GB" is in practice 80 GiB: an A100 80GB exposes 81,920 MiB,
  and AMD's ROCm hardware table lists the MI300X as "192 GiB" (research/facts.md, "GB vs GiB"). So vendor
  "80GB" -> 80 x 2^30 = 85,899,345,920 bytes. ``memory_gb`` (decimal, 10^9) is accepted instead for a part
  known to be decimal. What the driver and ECC leave usable is *not* subtracted here; the planner's
  ``gpu_memory_utilization`` (default 0.9) and runtime overhead cover it.
- ``hbm_bandwidth_tb_s``: 10^12 bytes/s (or ``hbm_bandwidth_gb_s``, 10^9).
- ``dense_tflops``: *dense* peak per dtype in 10^12 FLOP/s (or TOPS for int8), never the 2:4-sparse figure
  NVIDIA datasheets print with an asterisk. ``fp32`` is the non-tensor CUDA-core rate; ``tf32`` the tensor rate.
- ``interconnect_bidirectional_gb_s``: total bidirectional GPU-to-GPU bandwidth per GPU as vendors quote it
  (NVLink 900 GB/s on H100). ``interconnect_bandwidth_bytes_per_s`` is half of it: what one direction of a
  ring all-reduce can use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tfcalc.errors import SpecError

GIB = 1 << 30
FLOP_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")
MEMORY_CONVENTION = ("capacity: memory_gib x 2^30 bytes (vendor 'GB' on HBM/GDDR parts is binary: A100 80GB "
                     "exposes 81,920 MiB; ROCm lists MI300X as 192 GiB)")


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One accelerator: capacity, memory bandwidth, dense peak throughput per dtype, interconnect."""

    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    dense_flops_per_s: dict[str, float] = field(hash=False)
    interconnect_bandwidth_bytes_per_s: float
    interconnect: str = ""
    display_name: str = ""
    vendor: str = ""
    latency: GPULatency | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        n = self.name
        if self.memory_bytes <= 0:
            raise SpecError(f"{n}: memory must be positive")
        if self.hbm_bandwidth_bytes_per_s <= 0:
            raise SpecError(f"{n}: memory bandwidth must be positive")
        if self.interconnect_bandwidth_bytes_per_s <= 0:
            raise SpecError(f"{n}: interconnect bandwidth must be positive")
        if "bf16" not in self.dense_flops_per_s and "fp16" not in self.dense_flops_per_s:
            raise SpecError(f"{n}: dense_tflops needs at least bf16 or fp16")
        for key, value in self.dense_flops_per_s.items():
            if key not in FLOP_DTYPES:
                raise SpecError(f"{n}: unknown dense_tflops dtype '{key}' (known: {', '.join(FLOP_DTYPES)})")
            if value <= 0:
                raise SpecError(f"{n}: dense_tflops.{key} must be positive")

    def peak_flops(self, compute_dtype: str) -> tuple[str, float]:
        """(dtype actually used, dense FLOP/s); a dtype the chip lacks falls back to bf16 (then fp16)."""
        for key in (compute_dtype, "bf16", "fp16"):
            if key in self.dense_flops_per_s:
                return key, self.dense_flops_per_s[key]
        raise SpecError(f"{self.name}: no dense throughput for {compute_dtype}")  # unreachable: checked above


_ALLOWED = {"name", "memory_gib", "memory_gb", "hbm_bandwidth_tb_s", "hbm_bandwidth_gb_s", "dense_tflops",
            "interconnect", "interconnect_bidirectional_gb_s", "display_name", "vendor", "memory_type",
            "sources", "notes", "kind", "published", "latency"}


def _number(value: Any, origin: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{origin}: field '{key}' must be a number, got {value!r}")
    if value <= 0:
        raise SpecError(f"{origin}: field '{key}' must be positive, got {value!r}")
    return float(value)


def _one_of(data: dict[str, Any], keys: tuple[str, str], origin: str) -> tuple[str, float]:
    present = [k for k in keys if data.get(k) is not None]
    if len(present) != 1:
        raise SpecError(f"{origin}: give exactly one of {' or '.join(keys)}")
    return present[0], _number(data[present[0]], origin, present[0])


def gpu_from_mapping(data: dict[str, Any], origin: str, default_name: str) -> GPUSpec:
    """Validate a GPU preset mapping (units as in the module docstring) and build the GPUSpec."""
    from tfcalc.spec.presets import suggest

    unknown = sorted(set(data) - _ALLOWED)
    if unknown:
        hints = suggest(unknown[0], sorted(_ALLOWED), limit=1)
        hint = f" (did you mean '{hints[0]}'?)" if hints else ""
        raise SpecError(f"{origin}: unknown field '{unknown[0]}'{hint}")
    key, memory = _one_of(data, ("memory_gib", "memory_gb"), origin)
    memory_bytes = round(memory * (GIB if key == "memory_gib" else 1e9))
    key, bandwidth = _one_of(data, ("hbm_bandwidth_tb_s", "hbm_bandwidth_gb_s"), origin)
    bandwidth *= 1e12 if key == "hbm_bandwidth_tb_s" else 1e9
    tflops = data.get("dense_tflops")
    if not isinstance(tflops, dict) or not tflops:
        raise SpecError(f"{origin}: field 'dense_tflops' must be a mapping such as {{bf16: 989.5, fp8: 1979}}")
    flops: dict[str, float] = {}
    for dtype, value in tflops.items():
        if dtype not in FLOP_DTYPES:
            hints = suggest(str(dtype), list(FLOP_DTYPES), limit=1)
            hint = f" (did you mean '{hints[0]}'?)" if hints else ""
            raise SpecError(f"{origin}: unknown dense_tflops dtype '{dtype}'{hint}")
        if value is None:
            continue  # the chip lacks the format (no FP8 on Ampere)
        flops[str(dtype)] = _number(value, origin, f"dense_tflops.{dtype}") * 1e12
    if data.get("interconnect_bidirectional_gb_s") is None:
        raise SpecError(f"{origin}: missing required field 'interconnect_bidirectional_gb_s'")
    link = _number(data["interconnect_bidirectional_gb_s"], origin, "interconnect_bidirectional_gb_s") * 1e9 / 2
    try:
        return GPUSpec(name=str(data.get("name", default_name)), memory_bytes=memory_bytes,
                       hbm_bandwidth_bytes_per_s=bandwidth, dense_flops_per_s=flops,
                       interconnect_bandwidth_bytes_per_s=link, interconnect=str(data.get("interconnect", "")),
                       display_name=str(data.get("display_name", default_name)),
                       vendor=str(data.get("vendor", "")),
                       latency=None if data.get("latency") is None else latency_from_mapping(data["latency"], origin))
    except SpecError as exc:
        raise SpecError(f"{origin}: {exc}") from None


# --- the latency block: what the GPU achieves, for ``tfcalc estimate`` (tfcalc/calc/kernels.py) -------------

_LATENCY_KEYS = {"sm_count", "gemm_efficiency", "attention_efficiency", "moe_efficiency", "memory_efficiency",
                 "floors_us", "interconnect_preset", "sources"}
_FLOOR_KEYS = ("gemm", "elementwise", "attention", "moe")


@dataclass(frozen=True, kw_only=True)
class GPULatency:
    """Achievable fractions of the datasheet peaks and per-kernel floors, each sourced in the preset.

    ``gemm_efficiency``: fraction of the dense peak large GEMMs reach, per compute dtype; ``attention_efficiency``:
    flash-attention prefill on long sequences (16-bit); ``moe_efficiency``: grouped expert GEMMs relative to a dense
    GEMM of the same shape; ``memory_efficiency``: large streaming kernels (GEMV);
    ``floors_s``: fixed seconds of one kernel per class (gemm, elementwise, attention, moe);
    ``interconnect_preset``: the presets/interconnects entry of its GPU-to-GPU fabric.
    """

    sm_count: int
    gemm_efficiency: dict[str, float] = field(hash=False)
    attention_efficiency: float
    moe_efficiency: float
    memory_efficiency: float
    floors_s: dict[str, float] = field(hash=False)
    interconnect_preset: str


def _fraction(value: Any, origin: str, key: str) -> float:
    number = _number(value, origin, key)
    if number > 1:
        raise SpecError(f"{origin}: field '{key}' must be in (0, 1], got {value!r}")
    return number


def latency_from_mapping(data: Any, origin: str) -> GPULatency:
    """Validate a GPU preset's ``latency:`` block (units as printed: fractions, microseconds)."""
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: field 'latency' must be a mapping")
    unknown = sorted(set(data) - _LATENCY_KEYS)
    if unknown:
        raise SpecError(f"{origin}: unknown field 'latency.{unknown[0]}' (known: {', '.join(sorted(_LATENCY_KEYS))})")
    for key in ("sm_count", "gemm_efficiency", "attention_efficiency", "moe_efficiency", "memory_efficiency",
                "floors_us", "interconnect_preset"):
        if data.get(key) is None:
            raise SpecError(f"{origin}: missing required field 'latency.{key}'")
    sm_count = data["sm_count"]
    if isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count <= 0:
        raise SpecError(f"{origin}: field 'latency.sm_count' must be a positive integer, got {sm_count!r}")
    gemm = data["gemm_efficiency"]
    if not isinstance(gemm, dict) or not gemm:
        raise SpecError(f"{origin}: field 'latency.gemm_efficiency' must be a mapping such as {{bf16: 0.79}}")
    efficiencies = {}
    for dtype, value in gemm.items():
        if dtype not in FLOP_DTYPES:
            raise SpecError(f"{origin}: unknown dtype 'latency.gemm_efficiency.{dtype}' "
                            f"(known: {', '.join(FLOP_DTYPES)})")
        efficiencies[str(dtype)] = _fraction(value, origin, f"latency.gemm_efficiency.{dtype}")
    floors = data["floors_us"]
    if not isinstance(floors, dict):
        raise SpecError(f"{origin}: field 'latency.floors_us' must be a mapping of {', '.join(_FLOOR_KEYS)}")
    missing = [k for k in _FLOOR_KEYS if k not in floors]
    extra = sorted(set(floors) - set(_FLOOR_KEYS))
    if missing or extra:
        which = f"missing 'latency.floors_us.{missing[0]}'" if missing else f"unknown 'latency.floors_us.{extra[0]}'"
        raise SpecError(f"{origin}: {which} (give {', '.join(_FLOOR_KEYS)})")
    floors_s = {k: _number(floors[k], origin, f"latency.floors_us.{k}") * 1e-6 for k in _FLOOR_KEYS}
    return GPULatency(sm_count=sm_count, gemm_efficiency=efficiencies,
                      attention_efficiency=_fraction(data["attention_efficiency"], origin,
                                                     "latency.attention_efficiency"),
                      moe_efficiency=_fraction(data["moe_efficiency"], origin, "latency.moe_efficiency"),
                      memory_efficiency=_fraction(data["memory_efficiency"], origin, "latency.memory_efficiency"),
                      floors_s=floors_s, interconnect_preset=str(data["interconnect_preset"]))
