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


def test_graph_sizes_follow_filter_rule(replay: ModuleType) -> None:
    """model_engine.py _filter_cuda_graph_batch_sizes: the listed sizes up to min(max_batch_size, max_num_tokens),
    that bound appended once when padding and a larger size is listed; none appended when the bound is listed."""
    listed = replay.DOC_GRAPH_BATCH_SIZES
    assert replay.graph_batch_sizes(listed, 1792, 3584) == (*listed[:listed.index(1024) + 1], 1792)
    assert replay.graph_batch_sizes(listed, 2048, 8192) == listed[:listed.index(2048) + 1]
    assert replay.graph_batch_sizes(listed, 4096, 3000)[-1] == 3000          # the token budget bounds it too
    assert replay.graph_batch_sizes((1, 2, 4), 64, 8192) == (1, 2, 4)         # nothing listed above: no bound added


def test_padded_batch_rounds_up_to_a_captured_size(replay: ModuleType) -> None:
    """cuda_graph_runner.py _round_up_batch_size: the smallest captured size >= the batch; above the largest the
    batch runs without a graph at its own size; an empty batch stays empty."""
    sizes = replay.graph_batch_sizes(replay.DOC_GRAPH_BATCH_SIZES, 1792, 3584)
    for batch in range(0, 2000, 7):
        padded = replay.padded_batch(batch, sizes)
        if batch == 0 or batch > sizes[-1]:
            assert padded == batch
        else:
            assert padded in sizes and padded >= batch
            assert all(s < batch for s in sizes if s < padded)   # no smaller captured size would hold it


def test_padded_step_prices_dummies_on_decode_only_steps(replay: ModuleType) -> None:
    """A decode-only step is priced at the padded count per micro-batch with the real sequences' KV spread over it
    (the dummies hold a token or two); a step with a prompt is passed through unchanged."""
    from tfcalc.calc.serving_inputs import KvShape, StepSource

    calls: list[tuple] = []

    class Recorder(StepSource):
        kv, label = KvShape(num_layers=1), "recorder"

        def time(self, *args: float) -> float:
            calls.append(args)
            return 1.0

    step = replay.GraphPaddedStep(inner=Recorder(), sizes=(1, 2, 4, 8, 16), pp=2, kv=KvShape(num_layers=1))
    step.time(10, 300.0, 0, 0.0, 0, 1)         # 5 per micro-batch -> 8 each
    seqs, context = calls[-1][:2]
    assert seqs == 16 and context * seqs == 300.0 * 10
    step.time(10, 300.0, 1024, 0.0, 1, 1)      # a prompt in the step: no graph, no padding
    assert calls[-1] == (10, 300.0, 1024, 0.0, 1, 1)
    step.time(40, 300.0, 0, 0.0, 0, 1)         # 20 per micro-batch, above the largest size: unpadded
    assert calls[-1][:2] == (40, 300.0)


def test_checkpoint_elements_reproduce_the_pr_13498_figure(replay: ModuleType) -> None:
    """trtllm-bench 1.2 sized an NVFP4 engine as the safetensors element count x 0.5 byte; NVIDIA/TensorRT-LLM PR
    #13498 measured that on DeepSeek-V3.2-NVFP4 as 183.70 GB (its fix: 386.54 GB). DeepSeek-V3's shapes (no DSA
    indexer, no MTP layer) land within 10 % of it, where the model's parameters x 0.5 byte would be 70 % above."""
    from tfcalc.spec.presets import load_model

    spec = load_model("deepseek-v3")
    gib = float(1 << 30)
    engine = replay.checkpoint_elements(spec, parse_weight_precision("nvfp4")) * 0.5 / gib
    assert engine == pytest.approx(183.70, rel=0.10)
    from tfcalc.calc.params import count_params

    assert count_params(spec).total_params * 0.5 / gib > 1.6 * 183.70


def test_checkpoint_elements_count_packed_bytes_and_scales(replay: ModuleType) -> None:
    """An NVFP4 matrix is 0.5 U8 element per weight (two packed) + 1/16 F8 scale; 16-bit and fp8 matrices and every
    vector one element per weight: a dense model's count follows from its matrix and vector totals."""
    from tfcalc.calc.params import count_params
    from tfcalc.spec.presets import load_model

    spec = load_model("llama3-70b")
    counts = count_params(spec).total
    kept = {"embedding", "lm_head", "norms", "router", "encoder"}
    quantized = sum(p.matrix for c, p in counts.items() if c not in kept)
    rest = sum(p.matrix for c, p in counts.items() if c in kept) + sum(p.vector for p in counts.values())
    assert replay.checkpoint_elements(spec, parse_weight_precision("nvfp4")) == pytest.approx(
        quantized * (0.5 + 1 / 16) + rest)
    total = count_params(spec).total_params
    assert replay.checkpoint_elements(spec, parse_weight_precision("fp8")) == pytest.approx(total)
    assert replay.checkpoint_elements(spec, parse_weight_precision("bf16")) == pytest.approx(total)
