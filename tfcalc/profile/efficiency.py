"""Efficiency factors from the rows of a ``tfcalc profile`` run: what ``--save-calibration`` writes and what
``--calibration`` makes of a profile JSON file. Reads the profiler's own row keys, so it lives beside the profiler;
imports no torch (``tfcalc estimate`` loads it for a profile file).
"""

from __future__ import annotations

import math
import statistics

from tfcalc.calc.calibration import MIN_EFFICIENCY_FACTOR
from tfcalc.errors import SpecError


def _renamed(row: dict) -> dict:
    """A row as this version names its keys: rows saved before MFU against the datasheet was called
    ``mfu_datasheet`` call it ``mfu`` (the same ratio)."""
    return {**row, "mfu_datasheet": row["mfu"]} if "mfu" in row and "mfu_datasheet" not in row else row


def _factor(row: dict, key: str, origin: str) -> float:
    """A row's ratio as a number; ValueError or KeyError where it has none, SpecError where it is not positive and
    finite (an infinite MFU would clamp to 1, a negative one to 1e-6, silently)."""
    value = float(str(row[key]))
    if not (math.isfinite(value) and value > 0):
        raise SpecError(f"{origin}: a profile row's '{key}' is {value:g}, not a positive finite number")
    return value


def efficiency_from_rows(rows: list[dict], origin: str = "profile rows") -> dict[str, object]:
    """Measured efficiencies for ``--calibration``: compute from prefill MFU, bandwidth from decode MBU (medians
    over ok rows), against the datasheet when a preset matched, else the measured ceilings.

    Decode is memory-bound and prefill compute-bound, so each phase measures one resource well; both phases
    take the same two factors (a decode 'compute efficiency' taken from a memory-bound step would be tiny and
    would wrongly make the model compute-bound).
    """
    ok = [_renamed(r) for r in rows if isinstance(r, dict) and str(r.get("status", "")).startswith("ok")]
    if not ok:
        raise SpecError(f"{origin}: no successfully measured profile rows to calibrate from")
    datasheet = all(r.get("mfu_datasheet") is not None and r.get("mbu_datasheet") is not None for r in ok)
    compute_key, bandwidth_key = ("mfu_datasheet", "mbu_datasheet") if datasheet else ("mfu_measured", "mbu_measured")
    try:
        compute = statistics.median(_factor(r, compute_key, origin) for r in ok)
        bandwidth = statistics.median(_factor(r, bandwidth_key, origin) for r in ok)
    except (KeyError, ValueError):
        raise SpecError(f"{origin}: profile rows without a numeric '{compute_key}' and '{bandwidth_key}'") from None

    def clamp(value: float) -> float:  # efficiencies live in [MIN_EFFICIENCY_FACTOR, 1], as load_efficiency reads them
        return min(max(value, MIN_EFFICIENCY_FACTOR), 1.0)

    return {
        "device_name": str(ok[0].get("device_name", "")),
        "compute_efficiency": {"prefill": clamp(compute), "decode": clamp(compute)},
        "bandwidth_efficiency": {"prefill": clamp(bandwidth), "decode": clamp(bandwidth)},
        "source": "tfcalc profile: median prefill MFU and decode MBU of "
                  f"{len(ok)} rows, against {'the datasheet peaks' if datasheet else 'the measured ceilings'}",
    }
