"""The output layer: exact integers in CSV/JSON, same columns in both, atomic files."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from tfcalc.errors import OutputError
from tfcalc.output import Column, emit, resolve_format
from tfcalc.output.export import to_csv, to_json
from tfcalc.output.files import write_atomic

ROWS = [{"model": "a", "kv_cache_bytes": 2**62 + 1, "share": 0.5, "note": None},
        {"model": "b", "kv_cache_bytes": 7, "share": 1.0, "note": "x"}]


def test_csv_and_json_keep_exact_integers_and_the_same_columns() -> None:
    parsed_csv = list(csv.DictReader(io.StringIO(to_csv(ROWS))))
    parsed_json = json.loads(to_json(ROWS))
    assert parsed_csv[0]["kv_cache_bytes"] == str(2**62 + 1)  # no float rounding, no "4.6e18"
    assert parsed_json[0]["kv_cache_bytes"] == 2**62 + 1
    assert list(parsed_csv[0]) == list(parsed_json[0])
    assert parsed_csv[0]["note"] == "" and parsed_json[0]["note"] is None


def test_format_from_extension() -> None:
    assert resolve_format(None, Path("x.csv")) == "csv"
    assert resolve_format(None, Path("x.JSON")) == "json"
    assert resolve_format("table", Path("x.csv")) == "table"
    assert resolve_format(None, None) == "table"


def test_write_atomic_replaces_whole_and_cleans_up_on_failure(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "out.csv"
    target.write_text("old\n")
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n"

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("tfcalc.output.files.os.replace", broken_replace)
    with pytest.raises(OutputError, match="No space left"):
        write_atomic(target, "half\n")
    assert target.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_emit_table_shows_human_units(capsys) -> None:
    emit(ROWS, [Column("model", "model"), Column("kv_cache_bytes", "cache", "bytes")], title="T")
    out = capsys.readouterr().out
    assert "4,194,304.00 TiB" in out and "7 B" in out


def test_values_as_spreadsheets_and_json_readers_expect() -> None:
    rows = [{"fits": True, "flops": 2039e12, "rate": 0.6, "bad": float("nan"), "big": 1e300, "name": "a\x9bb"},
            {"fits": False, "flops": 3.35e12, "rate": 1.0, "bad": float("inf"), "big": 2**70, "name": "\u202e"}]
    parsed = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert [r["fits"] for r in parsed] == ["TRUE", "FALSE"]
    assert [r["flops"] for r in parsed] == ["2039000000000000", "3350000000000"]
    assert [r["rate"] for r in parsed] == ["0.6", "1"] and [r["bad"] for r in parsed] == ["", ""]
    assert parsed[0]["big"] == "1e+300" and parsed[1]["big"] == str(2**70)
    text = to_json(rows)
    assert "\\u009b" in text and "\\u202e" in text  # C1 controls and bidi overrides escaped, the value kept
    data = json.loads(text)
    assert data[0]["flops"] == 2039 * 10**12 and isinstance(data[0]["flops"], int)
    assert data[0]["bad"] is None and data[0]["fits"] is True and data[0]["name"] == "a\x9bb"


def test_gpu_csv_has_no_float_rounding_tails() -> None:
    from tfcalc.report.presets import preset_rows

    text = to_csv(preset_rows("gpu"))
    assert ".0002" not in text and "2039000000000," in text and "e+" not in text


def test_emit_to_dash_is_stdout(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    emit(ROWS, [Column("model", "model")], "json", Path("-"))
    assert json.loads(capsys.readouterr().out)[0]["model"] == "a"
    assert list(tmp_path.iterdir()) == []
