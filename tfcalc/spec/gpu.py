"""GPUSpec: one frozen description of an accelerator for the planner and the roofline estimates.

Units in the dataclass are SI base units: bytes, bytes/s, FLOP/s. Preset YAML (``presets/gpus/NAME.yaml``)
uses the units datasheets print and is converted here, in ``gpu_from_mapping``:

- ``memory_gib``: capacity in binary GiB (2^30 bytes). HBM and GDDR parts are built from DRAM dies whose
  densities are powers of two, and the vendor's "80GB" is in practice 80 GiB: an A100 80GB exposes 81,920 MiB,
  and AMD's ROCm hardware table lists the MI300X as "192 GiB" (docs/research/facts.md, "GB vs GiB"). So vendor
  "80GB" -> 80 x 2^30 = 85,899,345,920 bytes. ``memory_gb`` (decimal, 10^9) is accepted instead for a part
  known to be decimal. What the driver and ECC leave usable is *not* subtracted here; the planner's
  ``gpu_memory_utilization`` (default 0.9) and runtime overhead cover it.
- ``runtime_memory_gib`` (optional): the total the CUDA runtime reports (``cudaMemGetInfo``), which serving
  engines budget against: an "80GB" H100 reports 79.19 GiB. Engine memory models use it when given.
- ``hbm_bandwidth_tb_s``: 10^12 bytes/s (or ``hbm_bandwidth_gb_s``, 10^9).
- ``dense_tflops``: *dense* peak per dtype in 10^12 FLOP/s (or TOPS for int8), never the 2:4-sparse figure
  NVIDIA datasheets print with an asterisk. ``fp32`` is the non-tensor CUDA-core rate; ``tf32`` the tensor rate.
- ``interconnect_bidirectional_gb_s``: total bidirectional GPU-to-GPU bandwidth per GPU as vendors quote it
  (NVLink 900 GB/s on H100). ``interconnect_bandwidth_bytes_per_s`` is half of it: what one direction of a
  ring all-reduce can use.
- ``nvlink_domain_gpus`` (optional): how many GPUs one NVLink fabric joins when that is more than a node's eight
  (GB200 / GB300 NVL72: 72); collectives over at most that many GPUs stay on NVLink.
- ``gpus_per_host`` (optional): GPUs one host (one OS, one launch of an engine's process group) drives where that
  is not a node's eight (GB200 / GB300 compute trays: 4); the launch lines count hosts by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tfcalc.dtypes import FLOP_DTYPES
from tfcalc.errors import SpecError

GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One accelerator: capacity, memory bandwidth, dense peak throughput per dtype, interconnect."""

    name: str
    memory_bytes: int
    runtime_memory_bytes: int | None = None
    hbm_bandwidth_bytes_per_s: float
    dense_flops_per_s: dict[str, float] = field(hash=False)
    interconnect_bandwidth_bytes_per_s: float
    interconnect: str = ""
    display_name: str = ""
    vendor: str = ""
    nvlink_domain_gpus: int | None = None  # GPUs one NVLink fabric joins, where more than a node (NVL72: 72)
    gpus_per_host: int | None = None  # GPUs one host drives, where not a node's eight (GB200 compute tray: 4)
    latency: GPULatency | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        n = self.name
        if self.memory_bytes <= 0:
            raise SpecError(f"{n}: memory must be positive")
        if self.runtime_memory_bytes is not None and not 0 < self.runtime_memory_bytes <= self.memory_bytes:
            raise SpecError(f"{n}: runtime memory must be positive and at most the nominal capacity")
        if self.hbm_bandwidth_bytes_per_s <= 0:
            raise SpecError(f"{n}: memory bandwidth must be positive")
        if self.interconnect_bandwidth_bytes_per_s <= 0:
            raise SpecError(f"{n}: interconnect bandwidth must be positive")
        for key in ("nvlink_domain_gpus", "gpus_per_host"):
            value = getattr(self, key)
            if value is not None and not 1 <= value <= MAX_GPU_COUNT:
                raise SpecError(f"{n}: {key} must be 1-{MAX_GPU_COUNT}")
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


_ALLOWED = {"name", "memory_gib", "runtime_memory_gib", "memory_gb",
            "hbm_bandwidth_tb_s", "hbm_bandwidth_gb_s", "dense_tflops",
            "interconnect", "interconnect_bidirectional_gb_s", "display_name", "vendor", "memory_type",
            "sources", "notes", "kind", "published", "aliases", "latency", "nvlink_domain_gpus", "gpus_per_host"}
MAX_GPU_COUNT = 1 << 16


# Upper bounds of the datasheet-unit fields (finite, positive, and at most these): 1000x today's largest parts.
GPU_LIMITS: dict[str, float] = {
    "memory_gib": 1 << 20, "runtime_memory_gib": 1 << 20, "memory_gb": 1 << 20, "hbm_bandwidth_tb_s": 1e4,
    "hbm_bandwidth_gb_s": 1e7, "dense_tflops": 1e7, "interconnect_bidirectional_gb_s": 1e7,
}


def _number(value: Any, origin: str, key: str) -> float:
    """A finite, positive number within GPU_LIMITS (``dense_tflops.bf16`` uses dense_tflops' bound)."""
    from tfcalc.spec.model import check_float, in_file

    in_file(origin, check_float, key, value, GPU_LIMITS.get(key.split(".")[0]))
    return value  # type: ignore[no-any-return] - int or float as written, for exact scaling


def _scaled(value: float, factor: int) -> int | float:
    """``value x factor`` computed on the decimal the file holds: ``2039`` TFLOP/s -> 2,039,000,000,000,000
    exactly (not ``2039 * 1e12`` = 2039000000000000.2); an integer when the product is one."""
    from decimal import Decimal

    product = Decimal(repr(value)) * factor
    return int(product) if product == product.to_integral_value() else float(product)


def _text(data: dict[str, Any], key: str, origin: str, default: str = "") -> str:
    from tfcalc.spec.model import MAX_NAME_CHARS, check_str

    if data.get(key) is None:
        return default
    try:
        return check_str(key, data[key], MAX_NAME_CHARS)
    except SpecError as exc:
        raise SpecError(f"{origin}: {exc}") from None


def _one_of(data: dict[str, Any], keys: tuple[str, str], origin: str) -> tuple[str, float]:
    present = [k for k in keys if data.get(k) is not None]
    if len(present) != 1:
        raise SpecError(f"{origin}: give exactly one of {' or '.join(keys)}")
    return present[0], _number(data[present[0]], origin, present[0])


def gpu_from_mapping(data: dict[str, Any], origin: str, default_name: str) -> GPUSpec:
    """Validate a GPU preset mapping (units as in the module docstring) and build the GPUSpec."""
    from tfcalc.spec.model import key_text
    from tfcalc.spec.presets import suggest

    unknown = sorted(key_text(key) for key in data if key not in _ALLOWED)
    if unknown:
        hints = suggest(unknown[0], sorted(_ALLOWED), limit=1)
        hint = f" (did you mean '{hints[0]}'?)" if hints else ""
        raise SpecError(f"{origin}: unknown field '{unknown[0]}'{hint}")
    key, memory = _one_of(data, ("memory_gib", "memory_gb"), origin)
    memory_bytes = round(_scaled(memory, GIB if key == "memory_gib" else 10**9))
    runtime = data.get("runtime_memory_gib")
    runtime_bytes = None if runtime is None else round(_scaled(_number(runtime, origin, "runtime_memory_gib"), GIB))
    key, bandwidth = _one_of(data, ("hbm_bandwidth_tb_s", "hbm_bandwidth_gb_s"), origin)
    bandwidth = _scaled(bandwidth, 10**12 if key == "hbm_bandwidth_tb_s" else 10**9)
    tflops = data.get("dense_tflops")
    if not isinstance(tflops, dict) or not tflops:
        raise SpecError(f"{origin}: field 'dense_tflops' must be a mapping such as {{bf16: 989.5, fp8: 1979}}")
    flops: dict[str, float] = {}
    for dtype, value in tflops.items():
        if dtype not in FLOP_DTYPES:
            hints = suggest(str(dtype), list(FLOP_DTYPES), limit=1)
            hint = f" (did you mean '{hints[0]}'?)" if hints else ""
            raise SpecError(f"{origin}: unknown dense_tflops dtype '{key_text(dtype)}'{hint}")
        if value is None:
            continue  # the chip lacks the format (no FP8 on Ampere)
        flops[str(dtype)] = _scaled(_number(value, origin, f"dense_tflops.{dtype}"), 10**12)
    if data.get("interconnect_bidirectional_gb_s") is None:
        raise SpecError(f"{origin}: missing required field 'interconnect_bidirectional_gb_s'")
    link = _scaled(_number(data["interconnect_bidirectional_gb_s"], origin, "interconnect_bidirectional_gb_s"),
                   10**9 // 2)  # one direction: half the bidirectional figure
    latency = None if data.get("latency") is None else latency_from_mapping(data["latency"], origin)
    counts = {key: data.get(key) for key in ("nvlink_domain_gpus", "gpus_per_host")}
    for key, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_GPU_COUNT):
            raise SpecError(f"{origin}: field '{key}' must be a whole number 1-{MAX_GPU_COUNT}, got "
                            f"{key_text(value)!r}")
    for dtype, value in (latency.kernel_peak_flops_per_s if latency is not None else {}).items():
        if value > flops.get(dtype, 0.0):
            raise SpecError(f"{origin}: field 'latency.kernel_peak_tflops.{dtype}' must not exceed dense_tflops.{dtype}"
                            f" ({flops.get(dtype, 0.0) / 1e12:g})")
    try:
        return GPUSpec(name=_text(data, "name", origin, default_name), memory_bytes=memory_bytes,
                       runtime_memory_bytes=runtime_bytes,
                       hbm_bandwidth_bytes_per_s=bandwidth, dense_flops_per_s=flops,
                       interconnect_bandwidth_bytes_per_s=link, interconnect=_text(data, "interconnect", origin),
                       display_name=_text(data, "display_name", origin, default_name),
                       vendor=_text(data, "vendor", origin), nvlink_domain_gpus=counts["nvlink_domain_gpus"],
                       gpus_per_host=counts["gpus_per_host"],
                       latency=latency)
    except SpecError as exc:
        raise SpecError(f"{origin}: {exc}") from None


# --- the latency block: what the GPU achieves, for ``tfcalc estimate`` (tfcalc/calc/kernels.py) -------------

_LATENCY_KEYS = {"sm_count", "gemm_efficiency", "attention_efficiency", "moe_efficiency", "memory_efficiency",
                 "gemm_memory_efficiency", "moe_memory_efficiency", "floors_us", "interconnect_preset", "kernels_as",
                 "measured_on", "kernel_peak_tflops", "decode_attention", "sources"}
_DECODE_ATTENTION_KEYS = ("memory_efficiency", "streams_half", "stream_ns")
_DECODE_ATTENTION_OPTIONAL = ("unsplit_mha_cta_gb_s",)  # a kernel that runs an MHA decode unsplit (FA2)
MAX_CTA_GB_S = 1e4  # one CTA's stream: beyond 10 TB/s, a unit mistake
MAX_STREAMS_HALF = 1e3  # streams: a u_half beyond it is a unit mistake
MAX_STREAM_NS = 1e4  # 10 us per (sequence, KV head): beyond it, a unit mistake
_FLOOR_KEYS = ("gemm", "elementwise", "attention", "moe")
MAX_SM_COUNT = 1 << 16
MAX_FLOOR_US = 1e6  # one second: a kernel floor beyond it is a unit mistake, not a GPU


@dataclass(frozen=True, kw_only=True)
class GPULatency:
    """Achievable fractions of the datasheet peaks and per-kernel floors, each sourced in the preset.

    ``gemm_efficiency``: fraction of the dense peak large GEMMs reach, per compute dtype; ``attention_efficiency``:
    flash-attention prefill on long sequences (16-bit); ``moe_efficiency``: grouped expert GEMMs relative to a dense
    GEMM of the same shape (a number, or per compute dtype: ``moe_efficiency_by_dtype``, its bf16 entry the number);
    ``memory_efficiency``: large streaming kernels (GEMV); ``gemm_memory_efficiency``: the same for small-M GEMMs
    whose weights are in a storage format whose kernel streams differently (canonical dtype name -> fraction;
    per-tensor fp8 scaled-mm is slower than a bf16 GEMV); ``moe_memory_efficiency``: the same for the fused MoE's
    expert weights while each expert gets at most one smallest row tile (``kernels.moe_one_tile_per_expert``), by
    storage format, where its kernel streams them differently from a GEMV (the whole layer's experts in one kernel);
    ``floors_s``: fixed seconds of one kernel per class (gemm, elementwise, attention, moe);
    ``decode_attention``: the decode attention kernel measured on this part, (fraction of the datasheet bandwidth it
    streams the KV cache at, u_half of its u / (u + u_half) stream utilisation, seconds per (sequence, KV head),
    bytes/s one CTA streams where the kernel runs an MHA decode with one CTA per (sequence, head), else 0), or None
    (the streaming fraction, ``kernels.DECODE_STREAMS_HALF``, no per-stream time);
    ``kernel_peak_flops_per_s``: per compute dtype, the dense rate the engines' kernels are built for where it is
    below the datasheet's (the B300's NVFP4 kernels run at the B200's FP4 rate): every efficiency of the block and of
    the engines' entries is a fraction of it; the ideal roofline keeps the datasheet;
    ``interconnect_preset``: the presets/interconnects entry of its GPU-to-GPU fabric;
    ``kernels_as``: the GPU preset of the same silicon whose engine-measured kernel entries (an engine preset's
    per-GPU MoE efficiency and dequantisation cost) apply to this part when the engine names no entry for it;
    ``measured_on``: where the block's kernel measurements come from: None for this part itself, another GPU
    preset's name (the same silicon measured there), or ``none`` (no kernel table at all: published fractions and
    borrowed floors), so reports can say how far to trust the rates.
    """

    sm_count: int
    gemm_efficiency: dict[str, float] = field(hash=False)
    attention_efficiency: float
    moe_efficiency: float
    memory_efficiency: float
    floors_s: dict[str, float] = field(hash=False)
    interconnect_preset: str
    moe_efficiency_by_dtype: dict[str, float] = field(default_factory=dict, hash=False)
    gemm_memory_efficiency: dict[str, float] = field(default_factory=dict, hash=False)
    moe_memory_efficiency: dict[str, float] = field(default_factory=dict, hash=False)
    kernels_as: str | None = None
    measured_on: str | None = None
    kernel_peak_flops_per_s: dict[str, float] = field(default_factory=dict, hash=False)
    decode_attention: tuple[float, float, float, float] | None = None

    @property
    def measured_here(self) -> bool:
        """Whether this part's own kernels were measured for the block."""
        return self.measured_on is None


def decode_attention_block(value: Any, key: str) -> tuple[float, float, float, float]:
    """A measured decode attention kernel ``{memory_efficiency, streams_half, stream_ns[, unsplit_mha_cta_gb_s]}``
    (a GPU preset's ``latency.decode_attention``, an engine preset's per-GPU entry) as (fraction, u_half, seconds
    per stream, bytes/s per CTA of an unsplit MHA decode or 0)."""
    from tfcalc.spec.model import check_float

    if (not isinstance(value, dict) or not set(_DECODE_ATTENTION_KEYS) <= set(value)
            or not set(value) <= set(_DECODE_ATTENTION_KEYS + _DECODE_ATTENTION_OPTIONAL)):
        raise SpecError(f"field '{key}' must be a mapping of {', '.join(_DECODE_ATTENTION_KEYS)} "
                        f"(optional: {', '.join(_DECODE_ATTENTION_OPTIONAL)})")
    cta = value.get("unsplit_mha_cta_gb_s")
    return (check_float(f"{key}.memory_efficiency", value["memory_efficiency"], high=1.0),
            check_float(f"{key}.streams_half", value["streams_half"], MAX_STREAMS_HALF),
            check_float(f"{key}.stream_ns", value["stream_ns"], MAX_STREAM_NS, low=0.0) * 1e-9,
            check_float(f"{key}.unsplit_mha_cta_gb_s", cta, MAX_CTA_GB_S) * 1e9 if cta is not None else 0.0)


def storage_fractions(value: Any, key: str) -> dict[str, float]:
    """A mapping of weight storage formats (any name or alias ``tfcalc.dtypes.get_dtype`` knows, kept as its
    canonical name: ``fp8`` -> ``fp8_e4m3``) to fractions in (0, 1]; empty when absent."""
    from tfcalc.dtypes import get_dtype
    from tfcalc.errors import UsageError
    from tfcalc.spec.model import check_float, key_text

    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"field '{key}' must be a mapping of weight formats to fractions, such as {{fp8: 0.8}}")
    out = {}
    for name, fraction in value.items():
        try:
            canonical = get_dtype(str(name)).name
        except UsageError as exc:
            raise SpecError(f"field '{key}.{key_text(name)}': {exc}") from None
        out[canonical] = check_float(f"{key}.{name}", fraction, high=1.0)
    return out


def latency_from_mapping(data: Any, origin: str) -> GPULatency:
    """Validate a GPU preset's ``latency:`` block (units as printed: fractions in (0, 1], microseconds): every
    number finite and positive, every error one line naming the file and the field."""
    from tfcalc.spec.model import MAX_NAME_CHARS, check_float, check_int, check_str, key_text

    def fraction(value: Any, key: str) -> float:
        return check_float(key, value, high=1.0)

    if not isinstance(data, dict):
        raise SpecError(f"{origin}: field 'latency' must be a mapping")
    try:
        unknown = sorted(key_text(k) for k in data if k not in _LATENCY_KEYS)
        if unknown:
            raise SpecError(f"unknown field 'latency.{unknown[0]}' (known: {', '.join(sorted(_LATENCY_KEYS))})")
        for key in ("sm_count", "gemm_efficiency", "attention_efficiency", "moe_efficiency", "memory_efficiency",
                    "floors_us", "interconnect_preset"):
            if data.get(key) is None:
                raise SpecError(f"missing required field 'latency.{key}'")
        gemm = data["gemm_efficiency"]
        if not isinstance(gemm, dict) or not gemm:
            raise SpecError("field 'latency.gemm_efficiency' must be a mapping such as {bf16: 0.79}")
        efficiencies = {}
        for dtype, value in gemm.items():
            if dtype not in FLOP_DTYPES:
                raise SpecError(f"unknown dtype 'latency.gemm_efficiency.{key_text(dtype)}' "
                                f"(known: {', '.join(FLOP_DTYPES)})")
            efficiencies[str(dtype)] = fraction(value, f"latency.gemm_efficiency.{dtype}")
        moe, moe_by_dtype = data["moe_efficiency"], {}
        if isinstance(moe, dict):  # per compute dtype: {bf16: 0.87, fp8: 0.65}; bf16 is the default for the rest
            for dtype, value in moe.items():
                if dtype not in FLOP_DTYPES:
                    raise SpecError(f"unknown dtype 'latency.moe_efficiency.{key_text(dtype)}' "
                                    f"(known: {', '.join(FLOP_DTYPES)})")
                moe_by_dtype[str(dtype)] = fraction(value, f"latency.moe_efficiency.{dtype}")
            if "bf16" not in moe_by_dtype:
                raise SpecError("field 'latency.moe_efficiency' needs a bf16 entry (the default for other dtypes)")
            moe = moe_by_dtype["bf16"]
        gemm_memory = storage_fractions(data.get("gemm_memory_efficiency"), "latency.gemm_memory_efficiency")
        moe_memory = storage_fractions(data.get("moe_memory_efficiency"), "latency.moe_memory_efficiency")
        floors = data["floors_us"]
        if not isinstance(floors, dict):
            raise SpecError(f"field 'latency.floors_us' must be a mapping of {', '.join(_FLOOR_KEYS)}")
        missing = [k for k in _FLOOR_KEYS if k not in floors]
        extra = sorted(key_text(k) for k in floors if k not in _FLOOR_KEYS)
        if missing or extra:
            which = f"missing 'latency.floors_us.{missing[0]}'" if missing else \
                f"unknown 'latency.floors_us.{extra[0]}'"
            raise SpecError(f"{which} (give {', '.join(_FLOOR_KEYS)})")
        floors_s = {k: check_float(f"latency.floors_us.{k}", floors[k], MAX_FLOOR_US) * 1e-6 for k in _FLOOR_KEYS}
        kernel_peaks = data.get("kernel_peak_tflops") or {}
        if not isinstance(kernel_peaks, dict):
            raise SpecError("field 'latency.kernel_peak_tflops' must be a mapping such as {fp4: 9000}")
        for dtype in kernel_peaks:
            if dtype not in FLOP_DTYPES:
                raise SpecError(f"unknown dtype 'latency.kernel_peak_tflops.{key_text(dtype)}' "
                                f"(known: {', '.join(FLOP_DTYPES)})")
        kernel_peaks_s = {str(k): check_float(f"latency.kernel_peak_tflops.{k}", v, 1e7) * 1e12
                          for k, v in kernel_peaks.items()}
        decode = data.get("decode_attention")
        if decode is not None:
            decode = decode_attention_block(decode, "latency.decode_attention")
        return GPULatency(sm_count=check_int("latency.sm_count", data["sm_count"], (1, MAX_SM_COUNT)),
                          gemm_efficiency=efficiencies,
                          attention_efficiency=fraction(data["attention_efficiency"], "latency.attention_efficiency"),
                          moe_efficiency=fraction(moe, "latency.moe_efficiency"),
                          moe_efficiency_by_dtype=moe_by_dtype,
                          memory_efficiency=fraction(data["memory_efficiency"], "latency.memory_efficiency"),
                          gemm_memory_efficiency=gemm_memory, moe_memory_efficiency=moe_memory,
                          floors_s=floors_s,
                          interconnect_preset=check_str("latency.interconnect_preset", data["interconnect_preset"],
                                                        MAX_NAME_CHARS),
                          kernels_as=None if data.get("kernels_as") is None else
                          check_str("latency.kernels_as", data["kernels_as"], MAX_NAME_CHARS),
                          measured_on=None if data.get("measured_on") is None else
                          check_str("latency.measured_on", data["measured_on"], MAX_NAME_CHARS),
                          kernel_peak_flops_per_s=kernel_peaks_s, decode_attention=decode)
    except SpecError as exc:
        raise SpecError(f"{origin}: {exc}") from None
