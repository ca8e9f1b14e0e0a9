"""Efficiency factors from profile rows (tfcalc.profile.efficiency), and a profile JSON file as --calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfcalc.errors import SpecError
from tfcalc.profile.efficiency import efficiency_from_rows

ROWS = [{"status": "ok", "device_name": "x", "mfu_datasheet": 0.5, "mbu_datasheet": 0.8, "mfu_measured": 0.6,
         "mbu_measured": 0.9}, {"status": "oom", "device_name": "x"},
        {"status": "ok", "device_name": "x", "mfu_datasheet": 0.7, "mbu_datasheet": 0.6, "mfu_measured": 0.8,
         "mbu_measured": 0.7}]


def test_medians_of_the_ok_rows_against_the_datasheet() -> None:
    calibration = efficiency_from_rows(ROWS)
    assert calibration["compute_efficiency"] == {"prefill": pytest.approx(0.6), "decode": pytest.approx(0.6)}
    assert calibration["bandwidth_efficiency"] == {"prefill": pytest.approx(0.7), "decode": pytest.approx(0.7)}
    assert "datasheet" in str(calibration["source"])


def test_measured_ceilings_when_a_row_has_no_datasheet_ratio() -> None:
    rows = [{**ROWS[0], "mfu_datasheet": None}, ROWS[2]]
    calibration = efficiency_from_rows(rows)
    assert calibration["compute_efficiency"]["prefill"] == pytest.approx(0.7)  # median of 0.6 and 0.8 (measured)
    assert calibration["bandwidth_efficiency"]["decode"] == pytest.approx(0.8)
    assert "measured ceilings" in str(calibration["source"])


@pytest.mark.parametrize(("rows", "message"), [
    ([{"status": "oom"}], "no successfully measured profile rows"),
    ([{"status": "ok", "mfu_datasheet": "fast", "mbu_datasheet": 0.5}], "without a numeric 'mfu_datasheet'"),
])
def test_rows_that_say_nothing_are_one_line_errors(rows: list[dict], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        efficiency_from_rows(rows, "run.json")


def test_a_profile_json_file_is_a_calibration(tmp_path: Path) -> None:
    from tfcalc.cli.common import read_calibration

    path = tmp_path / "rows.json"
    path.write_text(json.dumps(ROWS))
    eff = read_calibration(path)
    assert eff.bandwidth_decode == pytest.approx(0.7) and eff.compute_prefill == pytest.approx(0.6)
    assert "rows.json" in eff.source


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -0.5, 0.0, "Infinity"])
def test_a_factor_that_is_not_a_positive_finite_number_is_a_one_line_error(value: object) -> None:
    """An infinite MFU would clamp to an efficiency of 1 and a negative one to 1e-6, silently: refused instead."""
    rows = [{**ROWS[0], "mfu_datasheet": value}, ROWS[2]]
    with pytest.raises(SpecError, match="run.json: a profile row's 'mfu_datasheet' is .*, not a positive finite "
                                        "number") as caught:
        efficiency_from_rows(rows, "run.json")
    assert "\n" not in str(caught.value)


def test_rows_saved_before_mfu_was_renamed_still_read_against_the_datasheet() -> None:
    """``tfcalc profile`` JSON written before the rename to mfu_datasheet names the same ratio 'mfu': it stays the
    datasheet basis (not silently the measured ceilings)."""
    old = [{k if k != "mfu_datasheet" else "mfu": v for k, v in row.items()} for row in ROWS]
    assert efficiency_from_rows(old) == efficiency_from_rows(ROWS)
