"""benchmarks/validation/engine_logs.json (held-out public engine startup logs, replayed by
benchmarks/engine_log_validation.py) is well-formed: each case names its source and every memory setting, its arguments
agree with those settings, `tfcalc plan` runs on it, and the summary docs/planning.md quotes is what the script gives,
so a change in the engine models shows here."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from tfcalc.spec.presets import preset_names

SETTINGS = ("model", "dtype", "quantization", "kv_cache_dtype", "tp", "pp", "ep", "flags")


@pytest.fixture(scope="module")
def replay(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("engine_log_validation.py")


@pytest.fixture(scope="module")
def results(replay: ModuleType) -> list[dict]:
    return replay.evaluate(replay.load()["cases"])


def test_every_case_names_its_source_and_settings(replay: ModuleType) -> None:
    cases = replay.load()["cases"]
    assert len({c["id"] for c in cases}) == len(cases)
    for c in cases:
        assert c["engine"] in ("vllm", "sglang", "trtllm") and c["version"], c["id"]
        assert c["gpu"] in preset_names("gpu") and c["gpu_count"] >= 1, c["id"]
        assert c["url"] is None or c["url"].startswith("https://github.com/"), c["id"]
        assert c["source"].strip() and (c["url"] or "no URL" in c["source"]), c["id"]   # unresolved: said so
        s = c["settings"]
        assert all(k in s for k in SETTINGS), c["id"]
        assert ("gpu_memory_utilization" in s) != ("mem_fraction_static" in s), c["id"]
        assert ("max_model_len" in s) != ("context_length" in s), c["id"]
        assert c["log_lines"] and c["logged"]["kv_tokens"] > 0, c["id"]
        assert all(str(c["logged"]["kv_tokens"]) in line.replace(",", "") for line in c["log_lines"]
                   if "#tokens" in line or "KV cache size" in line), c["id"]


def test_arguments_match_the_stated_settings(replay: ModuleType) -> None:
    for c in replay.load()["cases"]:
        a, s = c["args"], c["settings"]
        opt = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("-")}
        assert opt["-g"] == c["gpu"] and int(opt["-tp"]) * s["pp"] == c["gpu_count"], c["id"]
        assert int(opt.get("--ep", 1)) == s["ep"], c["id"]
        fraction = s.get("gpu_memory_utilization", s.get("mem_fraction_static"))
        assert float(opt.get("--gpu-memory-utilization", opt.get("--mem-fraction-static"))) == fraction, c["id"]
        assert int(opt["--max-model-len"]) == s.get("max_model_len", s.get("context_length")), c["id"]
        assert opt["--engine"].startswith(c["engine"]), c["id"]


def test_plan_runs_on_every_case_under_the_stated_preset(results: list[dict]) -> None:
    for r in results:
        c, p = r["case"], r["pred"]
        assert p["kv_tokens"] > 0 and p["weights_gib"] > 0, c["id"]
        assert p["engine"].startswith(c["engine"]), c["id"]


def test_summary_is_the_documented_one(replay: ModuleType, results: list[dict]) -> None:
    """The numbers docs/planning.md quotes; a change to an engine model that moves a case across ±5 % shows here."""
    assert replay.summary(results) == replay.load()["summary"]


def test_table_has_a_row_per_case(replay: ModuleType, results: list[dict]) -> None:
    table = replay.markdown(results)
    assert table.count("\n") == len(results) + 1
    assert all(r["case"]["id"] in table for r in results)
