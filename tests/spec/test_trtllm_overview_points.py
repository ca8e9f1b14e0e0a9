"""benchmarks/validation/trtllm_perf_overview.json (TensorRT-LLM 1.2's published trtllm-bench throughput, replayed by
benchmarks/trtllm_overview_validation.py) is well-formed: known presets and formats, layouts that add up, positive
numbers as the doc prints them, its source named; and the script's trtllm-bench heuristic follows tuning.py's rules."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.presets import preset_names


@pytest.fixture(scope="module")
def replay(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    benchmark_script("capacity_validation.py")   # imported by the script by name, as when run from benchmarks/
    return benchmark_script("trtllm_overview_validation.py")


def test_source_is_named(replay: ModuleType) -> None:
    source = replay.load()["source"]
    assert source["repo"] == "NVIDIA/TensorRT-LLM" and source["path"].endswith("perf-overview.md")
    assert "release/1.2" in source["revision"] and source["published"].startswith("https://")
    assert "tokens/sec/gpu" in source["metric"]


def test_rows_are_well_formed(replay: ModuleType) -> None:
    rows = replay.rows()
    models, gpus = set(preset_names("model")), set(preset_names("gpu"))
    assert len(rows) >= 150
    assert len({r["id"] for r in rows}) == len(rows)            # one row per model, GPU, layout and lengths
    for r in rows:
        assert r["model"] in models and r["gpu"] in gpus, r["id"]
        assert r["gpus"] == r["tp"] * r["pp"] * r["dp"] and r["ep"] in (1, r["dp"]), r["id"]
        assert r["doc_format"] in ("FP4", "FP8") and r["checkpoint"] and r["table"], r["id"]
        parse_weight_precision(r["weights"])
        get_dtype(r["kv"])
        assert (r["isl"], r["osl"]) in replay.DOC_REQUESTS, r["id"]
        assert r["output_tok_s_per_gpu"] > 0
        assert r["output_tok_s_per_gpu"] == int(r["doc_value"].replace(",", ""))   # the doc's printed figure
        layout = r["doc_column"]
        assert (f"DEP{r['dp']}" in layout) if r["dp"] > 1 else (f"TP{r['tp']}" in layout), r["id"]
        assert r["beta"] == ("beta" in layout)


def test_heuristic_follows_tuning_rules(replay: ModuleType) -> None:
    """tuning.py's rounding: batch at least 64 and a multiple of 32 / 128 / 256 by size, tokens at least 2048 and
    at least the longest prompt + batch (no chunked prefill); a format outside its table takes 2048 / 8192."""
    for r in replay.rows():
        point = {"model": r["model"], "engine": "trtllm", "weights": r["weights"], "gpu": r["gpu"], "kv": r["kv"]}
        spec, gpu, engine, _, _ = replay.served(point)
        batch, tokens = replay.trtllm_bench_limits(spec, gpu, r, engine)
        assert tokens >= r["isl"] + batch and tokens >= 2048, r["id"]
        if r["weights"] not in replay.HEURISTIC_BYTES:
            assert (batch, tokens) == (2048, max(8192, r["isl"] + 2048)), r["id"]
        else:
            step = 32 if batch < 256 else 128 if batch < 1024 else 256
            assert batch >= 64 and batch % step == 0, r["id"]
