"""Calibration files: what a device was measured to do, and the latency-model rates fitted to it.

``load_calibration`` reads any of the three inputs ``--calibration`` takes, ``calibrated_rates`` applies one to
a GPU's rates (``tfcalc estimate`` and ``tfcalc profile`` alike):

- a ``tfcalc bench calibrate`` file (version 2, below): raw measurements, fitted by ``fit_rates``;
- an efficiency-factor file, what ``tfcalc profile --save-calibration`` writes (``Efficiency``; schema in
  docs/planning.md): fractions of the peaks reached per phase, compute (GEMM and attention) and memory, which
  replace the rates' own fractions;
- the JSON rows of a ``tfcalc profile`` run, from which ``tfcalc.profile.efficiency`` derives those factors
  before they reach this module (calc reads no profiler row keys).

The version 2 file:

A calibration file (JSON, ``"kind": "tfcalc-calibration"``, ``"version": 2``) holds raw measurements, any of:

- ``gemm``: rows {dtype, m, n, k, seconds} -- the GEMM efficiency curve;
- ``memory``: rows {bytes, seconds} -- a device copy moving ``bytes`` (read + write), the bandwidth curve by size;
- ``launch``: {graph_seconds, eager_seconds} -- one tiny kernel replayed from a CUDA graph / launched eagerly
  (``graph_seconds`` is null where graphs do not exist, e.g. on a CPU);
- ``attention``: rows {phase: prefill|decode, batch, heads, kv_heads, head_dim, seq_len, seconds} -- attention by
  context;
- ``collectives``: rows {op: all_reduce|all_gather|reduce_scatter|all_to_all, ranks, bytes, seconds} -- one
  collective of nccl-tests size ``bytes`` over ``ranks`` ranks (``tfcalc bench collectives``; files written
  before this section existed read as before).

``fit_rates`` turns them into the model's parameters against the GPU preset's datasheet peaks
(tfcalc/calc/kernels.py): bandwidth curve = bytes / (time - smallest copy time) for copies of 1 MiB and more, its
largest-size value / datasheet = memory efficiency; GEMM floor = median over the three fastest GEMMs of time - their
work at those rates; GEMM efficiency per dtype = median over rows with M, K >= 1024 of FLOPs x (K + K0) / K /
(peak x (time - floor)); elementwise floor = the graph launch time (else the smallest copy); eager launch interval
= ``eager_seconds``; attention floor = fastest decode row; attention efficiency = median over prefill rows of >= 1024
tokens of the tile-model time at full rate / (time - floor); collectives: launch, alpha and beta fitted by
``tfcalc.calc.comm.fit_link``, the link that replaces the fabric's NCCL link (``Rates.collectives``). Sections left out
keep the preset's values.
Pure math: no I/O.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from tfcalc.calc import kernels
from tfcalc.calc.comm import COLLECTIVES, fit_link
from tfcalc.calc.kernels import GEMM_K0, Rates, gemm_compute_seconds, gemm_work_seconds
from tfcalc.errors import SpecError
from tfcalc.spec.model import check_float, check_int, in_file

KIND = "tfcalc-calibration"
VERSION = 2
_TOP = {"kind", "version", "device_name", "source", "measured_at", "tfcalc_version", "notes", "gemm", "memory",
        "launch", "attention", "collectives"}
_GEMM = ("dtype", "m", "n", "k", "seconds")
_MEMORY = ("bytes", "seconds")
_ATTENTION = ("phase", "batch", "heads", "kv_heads", "head_dim", "seq_len", "seconds")
_COLLECTIVES = ("op", "ranks", "bytes", "seconds")
GEMM_DTYPES = ("bf16", "fp16", "fp32", "fp8", "int8")
# The smallest efficiency factor a file may hold: what tfcalc.profile.efficiency clamps a profile's to; smaller ones
# overflow the latency arithmetic (1e-300 of peak is no device)
MIN_EFFICIENCY_FACTOR = 1e-6


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Validated measurements (module docstring); each section may be empty."""

    device_name: str
    source: str
    gemm: tuple[tuple[str, int, int, int, float], ...] = ()
    memory: tuple[tuple[float, float], ...] = ()
    graph_launch_s: float | None = None
    eager_launch_s: float | None = None
    attention: tuple[tuple[str, int, int, int, int, int, float], ...] = ()
    collectives: tuple[tuple[str, int, float, float], ...] = ()  # (op, ranks, bytes, seconds)


def is_calibration_v2(data: object) -> bool:
    """A mapping in this module's format (as opposed to the efficiency-factor calibration or profile rows)."""
    return isinstance(data, dict) and (data.get("kind") == KIND or any(k in data for k in
                                                                       ("gemm", "memory", "launch", "attention",
                                                                        "collectives")))


def _positive(row: dict, field: str, where: str, integer: bool = False) -> float:
    """A row's field: a positive integer, or a positive finite number (NaN and infinities, which JSON readers
    accept, too), checked as every spec number is (``tfcalc.spec.model``); the error names the row and the field."""
    return in_file(where, check_int if integer else check_float, field, row[field])


def _rows(data: dict, section: str, fields: tuple[str, ...], origin: str) -> list[dict]:
    rows = data.get(section, [])
    if not isinstance(rows, list):
        raise SpecError(f"{origin}: field '{section}' must be a list of rows")
    out = []
    for i, row in enumerate(rows):
        where = f"{origin}: {section}[{i}]"
        if not isinstance(row, dict):
            raise SpecError(f"{where} must be a mapping with {', '.join(fields)}")
        missing = [f for f in fields if f not in row or row[f] is None]
        if missing:
            raise SpecError(f"{where}: missing field '{missing[0]}'")
        extra = sorted(set(row) - set(fields) - {"note", "device"})
        if extra:
            raise SpecError(f"{where}: unknown field '{extra[0]}' (fields: {', '.join(fields)})")
        out.append(row)
    return out


def load_calibration_v2(data: dict, origin: str) -> Calibration:
    """Validate a calibration mapping strictly: a malformed or incomplete row is a one-line error naming the row and
    field."""
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise SpecError(f"{origin}: unknown calibration field '{unknown[0]}' (allowed: {', '.join(sorted(_TOP))})")
    if data.get("kind", KIND) != KIND:
        raise SpecError(f"{origin}: field 'kind' must be '{KIND}', got {data.get('kind')!r}")
    version = data.get("version", VERSION)
    if version != VERSION:
        raise SpecError(f"{origin}: calibration version {version!r} is not supported (this tfcalc reads {VERSION})")
    gemm = []
    for i, row in enumerate(_rows(data, "gemm", _GEMM, origin)):
        where = f"{origin}: gemm[{i}]"
        if row["dtype"] not in GEMM_DTYPES:
            raise SpecError(f"{where}: field 'dtype' must be one of {', '.join(GEMM_DTYPES)}, got {row['dtype']!r}")
        gemm.append((row["dtype"], int(_positive(row, "m", where, True)),
                     int(_positive(row, "n", where, True)),
                     int(_positive(row, "k", where, True)),
                     float(_positive(row, "seconds", where))))
    memory = []
    for i, row in enumerate(_rows(data, "memory", _MEMORY, origin)):
        where = f"{origin}: memory[{i}]"
        memory.append((float(_positive(row, "bytes", where)),
                       float(_positive(row, "seconds", where))))
    graph = eager = None
    if data.get("launch") is not None:
        launch = data["launch"]
        if not isinstance(launch, dict):
            raise SpecError(f"{origin}: field 'launch' must be a mapping {{graph_seconds, eager_seconds}}")
        extra = sorted(set(launch) - {"graph_seconds", "eager_seconds"})
        if extra:
            raise SpecError(f"{origin}: unknown field 'launch.{extra[0]}' (fields: graph_seconds, eager_seconds)")
        if "eager_seconds" not in launch:
            raise SpecError(f"{origin}: launch: missing field 'eager_seconds'")
        eager = _positive(launch, "eager_seconds", f"{origin}: launch")
        if launch.get("graph_seconds") is not None:
            graph = _positive(launch, "graph_seconds", f"{origin}: launch")
    attention = []
    for i, row in enumerate(_rows(data, "attention", _ATTENTION, origin)):
        where = f"{origin}: attention[{i}]"
        if row["phase"] not in ("prefill", "decode"):
            raise SpecError(f"{where}: field 'phase' must be prefill or decode, got {row['phase']!r}")
        ints = [int(_positive(row, f, where, True)) for f in _ATTENTION[1:6]]
        if ints[1] % ints[2]:
            raise SpecError(f"{where}: field 'kv_heads' ({ints[2]}) must divide 'heads' ({ints[1]})")
        attention.append((row["phase"], *ints, float(_positive(row, "seconds", where))))
    collectives = []
    for i, row in enumerate(_rows(data, "collectives", _COLLECTIVES, origin)):
        where = f"{origin}: collectives[{i}]"
        if row["op"] not in COLLECTIVES:
            raise SpecError(f"{where}: field 'op' must be one of {', '.join(COLLECTIVES)}, got {row['op']!r}")
        ranks = int(_positive(row, "ranks", where, True))
        if ranks < 2:
            raise SpecError(f"{where}: field 'ranks' must be at least 2, got {ranks}")
        collectives.append((row["op"], ranks, float(_positive(row, "bytes", where)),
                            float(_positive(row, "seconds", where))))
    if not (gemm or memory or attention or collectives or eager is not None):
        raise SpecError(f"{origin}: no measurements (give at least one of gemm, memory, launch, attention, "
                        "collectives)")
    if collectives:
        try:
            fit_link(collectives)
        except ValueError as exc:
            raise SpecError(f"{origin}: collectives: {exc}") from None
    device = str(data.get("device_name", ""))
    source = f"calibration {origin}" + (f" ({device})" if device else "")
    return Calibration(device_name=device, source=source, gemm=tuple(gemm), memory=tuple(sorted(memory)),
                       graph_launch_s=graph, eager_launch_s=eager, attention=tuple(attention),
                       collectives=tuple(collectives))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fit_rates(base: Rates, cal: Calibration) -> Rates:
    """The base rates with every parameter the calibration measured replaced (module docstring)."""
    changes: dict[str, Any] = {"source": cal.source}
    floors = dict(base.floors)
    if cal.memory:
        smallest = cal.memory[0][1]
        points = tuple((b, b / (t - smallest)) for b, t in cal.memory if b >= (1 << 20) and t > smallest)
        if points:
            changes["bandwidth_points"] = points
            changes["memory_efficiency"] = min(points[-1][1] / base.memory_bandwidth, 1.0)
        floors["elementwise"] = smallest
    if cal.gemm:
        streaming = replace(base, **{k: v for k, v in changes.items() if k != "source"})

        def memory_seconds(dtype: str, m: int, n: int, k: int) -> float:  # its bytes at the measured bandwidth
            bits = 8 if dtype in ("fp8", "int8") else (32 if dtype == "fp32" else 16)
            nbytes = n * k * bits / 8 + (m * k + m * n) * 2
            return nbytes / streaming.bandwidth(nbytes)

        def work(dtype: str, m: int, n: int, k: int) -> float:  # the GEMM's time at the preset's rates, no floor
            return gemm_work_seconds(2.0 * m * n * k / base.gemm_flops_per_s(dtype, k), memory_seconds(dtype, m, n, k),
                                     base.ideal)

        # floor: the three fastest GEMMs minus the little work they do
        fastest = sorted(cal.gemm, key=lambda row: row[-1])[:3]
        floor = max(statistics.median(t - work(d, m, n, k) for d, m, n, k, t in fastest), 0.0)
        floors["gemm"] = floor
        efficiency = dict(base.gemm_efficiency)
        for dtype in sorted({row[0] for row in cal.gemm}):
            _, peak = base.peak(dtype)
            k0 = GEMM_K0.get(dtype, 128)
            # each large GEMM's compute time: its work less its memory time, by the inverse of gemm_work_seconds
            computes = [(2.0 * m * n * k, k, gemm_compute_seconds(t - floor, memory_seconds(d, m, n, k), base.ideal))
                        for d, m, n, k, t in cal.gemm if d == dtype and m >= 1024 and k >= 1024 and t > floor]
            values = [flops * (k + k0) / k / (peak * t_c) for flops, k, t_c in computes if t_c > 0]
            fitted = _median(values)
            if fitted is not None:
                efficiency[dtype] = min(fitted, 1.0)
        changes["gemm_efficiency"] = efficiency
        changes["gemm_efficiency_by_format"] = {}  # the GPU's measured GEMMs replace an engine's kernel table
    if cal.graph_launch_s is not None:
        floors["elementwise"] = cal.graph_launch_s
    if cal.eager_launch_s is not None:
        changes["launch_s"] = cal.eager_launch_s
    decode = [row for row in cal.attention if row[0] == "decode"]
    if decode:
        floors["attention"] = min(row[-1] for row in decode)
    prefill = [row for row in cal.attention if row[0] == "prefill" and row[5] >= 1024]
    if prefill:
        unit = replace(base, attention_efficiency=1.0, floors={**floors, "attention": 0.0}, ideal=False,
                       cuda_graphs=True)
        attn_floor = floors.get("attention", 0.0)
        values = []
        for _, batch, heads, _kv, head_dim, seq, t in prefill:
            modelled = kernels.flash_prefill(unit, seqs=batch, tokens=seq, past=0, heads=heads, qk_dim=head_dim,
                                             v_dim=head_dim, window=None, kv_bytes_read=0.0, exact_flops=0.0).seconds
            if t > attn_floor:
                values.append(modelled / (t - attn_floor))
        fitted = _median(values)
        if fitted is not None:
            changes["attention_efficiency"] = min(fitted, 1.0)
    if cal.collectives:
        changes["collectives"] = fit_link(cal.collectives, source=cal.source)
    changes["floors"] = floors
    return replace(base, **changes)


def fitted_summary(base: Rates, fitted: Rates) -> list[tuple[str, float, float]]:
    """(parameter, preset value, calibrated value) for every parameter the calibration changed."""
    out = []
    for dtype, value in sorted(fitted.gemm_efficiency.items()):
        if base.gemm_efficiency.get(dtype) != value:
            out.append((f"gemm_efficiency.{dtype}", base.gemm_efficiency.get(dtype, float("nan")), value))
    for name in ("attention_efficiency", "memory_efficiency", "launch_s"):
        if getattr(base, name) != getattr(fitted, name):
            out.append((name, getattr(base, name), getattr(fitted, name)))
    for kind, value in sorted(fitted.floors.items()):
        if base.floors.get(kind) != value:
            out.append((f"floor.{kind}_s", base.floors.get(kind, float("nan")), value))
    return out


# --- efficiency factors: tfcalc profile --save-calibration -------------------------------------------------------

_EFFICIENCY_TOP = {"device_name", "compute_efficiency", "bandwidth_efficiency", "source", "measured_at",
                   "tfcalc_version", "notes"}


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Fractions of the peaks reached, per phase: compute (GEMM and attention FLOP/s) and memory bandwidth."""

    compute_prefill: float
    compute_decode: float
    bandwidth_prefill: float
    bandwidth_decode: float
    source: str


def load_efficiency(data: dict, origin: str) -> Efficiency:
    """An efficiency-factor mapping, checked strictly: every factor a number in (0, 1]; one-line SpecError
    otherwise."""
    unknown = sorted(set(data) - _EFFICIENCY_TOP)
    if unknown:
        raise SpecError(f"{origin}: unknown calibration field '{unknown[0]}' (allowed: "
                        f"{', '.join(sorted(_EFFICIENCY_TOP))})")
    values: dict[str, float] = {}
    for kind in ("compute_efficiency", "bandwidth_efficiency"):
        block = data.get(kind)
        if not isinstance(block, dict):
            raise SpecError(f"{origin}: field '{kind}' must be a mapping {{\"prefill\": x, \"decode\": y}}")
        extra = sorted(set(block) - {"prefill", "decode"})
        if extra:
            raise SpecError(f"{origin}: unknown phase '{kind}.{extra[0]}' (use prefill and decode)")
        for phase in ("prefill", "decode"):
            value = block.get(phase)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not MIN_EFFICIENCY_FACTOR <= value <= 1:
                raise SpecError(f"{origin}: '{kind}.{phase}' must be a number in [{MIN_EFFICIENCY_FACTOR:g}, 1], got "
                                f"{value!r}")
            values[f"{kind.split('_')[0]}_{phase}"] = float(value)
    device = data.get("device_name", "")
    return Efficiency(**values, source=f"calibration {origin}" + (f" ({device})" if device else ""))


# --- any calibration, applied -------------------------------------------------------------------------------------


def load_calibration(data: object, origin: str) -> Calibration | Efficiency:
    """Any input ``--calibration`` takes (module docstring), validated."""
    if is_calibration_v2(data):
        return load_calibration_v2(data, origin)  # type: ignore[arg-type]
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: a calibration must be a JSON object (profile rows are turned into one by "
                        "tfcalc.profile.efficiency first)")
    return load_efficiency(data, origin)


def calibrated_rates(base: Rates, calibration: Calibration | Efficiency, phase: str) -> Rates:
    """``base`` with what the calibration measured: fitted rates (version 2), or the phase's efficiency factors
    in place of the GEMM / attention and memory fractions of peak."""
    if isinstance(calibration, Calibration):
        return fit_rates(base, calibration)
    if phase == "prefill":
        rates = base.with_efficiency(calibration.compute_prefill, calibration.bandwidth_prefill)
    else:
        rates = base.with_efficiency(calibration.compute_decode, calibration.bandwidth_decode)
    return replace(rates, source=calibration.source)


@dataclass(frozen=True)
class CalibratedRates:
    """``(gpu, base rates, phase) -> rates`` with ``calibration`` applied (``calibrated_rates``): a function a
    search can hand to its worker processes (picklable, unlike a closure)."""

    calibration: Calibration | Efficiency

    def __call__(self, gpu: object, base: Rates, phase: str) -> Rates:
        return calibrated_rates(base, self.calibration, phase)


@dataclass(frozen=True)
class EfficiencyRates:
    """``(gpu, base rates, phase) -> rates`` with every compute and/or the memory efficiency replaced
    (``Rates.with_efficiency``); picklable like ``CalibratedRates``."""

    compute: float | None = None
    bandwidth: float | None = None

    def __call__(self, gpu: object, base: Rates, phase: str) -> Rates:
        return base.with_efficiency(self.compute, self.bandwidth)
