"""A calibration file's numbers are finite: JSON's NaN and Infinity (which Python's json reads) are refused."""

from __future__ import annotations

import json

import pytest

from tfcalc.calc.calibration import load_calibration_v2
from tfcalc.errors import SpecError


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_seconds_are_refused(text: str) -> None:
    data = json.loads(f'{{"kind": "tfcalc-calibration", "memory": [{{"bytes": 1024, "seconds": {text}}}]}}')
    with pytest.raises(SpecError, match=r"cal.json: memory\[0\]: field 'seconds' must be a finite number"):
        load_calibration_v2(data, "cal.json")
