"""``tfcalc bench ceilings`` on the CPU: copy and matmul rows with their spread."""

from __future__ import annotations

import math

import pytest
import torch

from tfcalc.profile.ceilings import ceiling_rows

CPU = torch.device("cpu")
FAST = {"warmup": 1, "repeats": 2}


def _finite_positive(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


# --- ceilings ----------------------------------------------------------------------------------------------------


def test_ceiling_rows_cpu() -> None:
    rows = ceiling_rows(CPU, [torch.float32, torch.bfloat16], copy_bytes=1 << 20, matmul_n=64, repeats=3)
    copy, fp32, bf16 = rows
    assert (copy["ceiling"], copy["size"], copy["work_per_call"]) == ("copy", 1 << 20, 2 << 20)
    assert copy["bytes_per_s"] == pytest.approx(copy["work_per_call"] / copy["time_s"]) and copy["flops_per_s"] is None
    for row in rows:
        assert row["status"] == "ok" and row["repeats"] == 3
        rate = row["bytes_per_s"] or row["flops_per_s"]
        assert _finite_positive(rate)
        unit = "bytes_per_s" if row["ceiling"] == "copy" else "flops_per_s"
        assert row[f"p25_{unit}"] <= rate <= row[f"p75_{unit}"]
    assert (fp32["dtype"], bf16["dtype"], fp32["work_per_call"]) == ("fp32", "bf16", 2 * 64**3)
    assert fp32["flops_per_s"] == pytest.approx(2 * 64**3 / fp32["time_s"])
