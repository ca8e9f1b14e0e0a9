"""benchmarks/validation/silicon_runs.json (the measured serving runs docs/capacity.md replays) names only presets,
formats and engines tfcalc resolves, and its extractor maps aiconfigurator's labels as its docstring says."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from tfcalc.dtypes import parse_weight_precision
from tfcalc.spec.presets import load_engine, load_gpu, load_model

ROOT = Path(__file__).resolve().parents[2]
RUNS = json.loads((ROOT / "benchmarks" / "validation" / "silicon_runs.json").read_text())


@pytest.fixture(scope="module")
def extractor(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("validation/silicon_runs.py")


def test_every_run_resolves() -> None:
    assert len(RUNS) > 1000
    for key in {(r["model"], r["gpu"], r["engine"], r["weights"]) for r in RUNS}:
        model, gpu, engine, weights = key
        load_model(str(ROOT / model) if model.endswith(".yaml") else model)
        load_gpu(gpu)
        load_engine(engine)
        parse_weight_precision(weights)
    for r in RUNS:
        assert r["concurrency"] >= 1 and r["tp"] >= 1 and r["ep"] >= 1
        assert r["prompt"] > 0 and r["gen"] > 0 and r["ttft_ms"] > 0 and r["tpot_ms"] > 0


def _row(**kw: str) -> dict:
    base = {"id": "x", "silicon_data_source": "source_file=/a/b/2026-04-06.csv; model=M", "backend": "vllm",
            "backend_version": "", "model_path": "openai/gpt-oss-120b", "system": "h200_sxm", "precision": "fp4",
            "mode": "agg", "isl": "1024", "osl": "1024", "gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4",
            "batch_size": "16", "tp_size": "4", "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "4",
            "moe_ep_size": "1", "silicon_ttft_ms": "90.5", "silicon_tpot_ms": "5.25"}
    return {**base, **kw}


@pytest.mark.parametrize(("row", "weights"), [
    (_row(), "experts=mxfp4,default=bf16"),  # gpt-oss rows say nvfp4; the checkpoint is MXFP4 experts
    (_row(model_path="deepseek-ai/DeepSeek-R1", precision="fp8", gemm_quant_mode="fp8"), "fp8_block"),
    (_row(model_path="deepseek-ai/DeepSeek-R1", precision="fp4"), None),  # which FP4 checkpoint ran is unknown
    (_row(model_path="meta-llama/Llama-3.1-70B", gemm_quant_mode="nvfp4"), "nvfp4"),
    (_row(model_path="Qwen/Qwen3-32B", precision="", gemm_quant_mode=""), "bf16"),
])
def test_extractor_maps_labels_to_checkpoint_formats(extractor: ModuleType, row: dict, weights: str | None) -> None:
    runs = extractor.extract([row])
    assert [r["weights"] for r in runs] == ([weights] if weights else [])


def test_extractor_keeps_only_aggregated_single_replica_runs(extractor: ModuleType) -> None:
    kept = extractor.extract([_row(), _row(mode="disagg"), _row(attention_dp_size="8"), _row(pp_size="2"),
                       _row(system="gb200"), _row(model_path="x/Unknown")])
    assert len(kept) == 1
    run = kept[0]
    assert (run["source"], run["concurrency"], run["tp"], run["ep"], run["gpu"]) == ("2026-04-06.csv", 16, 4, 1,
                                                                                      "h200")
    assert extractor.extract([_row(model_path="Qwen/Qwen3-32B", moe_ep_size="0")])[0]["ep"] == 1


@pytest.mark.parametrize(("row", "layout"), [
    # the export's tp_size = moe_tp x moe_ep, with the id naming the layout
    (_row(id="2026_04_06_x_c4_tp8_ep8_954", tp_size="64", moe_tp_size="8", moe_ep_size="8"), (8, 8)),
    (_row(id="2026_03_25_x_c4_tp8_0_ep1_0_975", tp_size="8", moe_tp_size="8", moe_ep_size="1"), (8, 1)),
    # the same pattern without an id that names the layout (a database dump's config id)
    (_row(id="dsr1_h200_trtllm_fp8_agg_1024x1024_c4_cfg181", tp_size="16", moe_tp_size="4", moe_ep_size="4"), (4, 4)),
    # a consistent layout the id confirms: tp 4 over moe tp 2 x ep 2
    (_row(id="q_agg_128x128_c16_tp4_epnone_16", tp_size="4", moe_tp_size="2", moe_ep_size="2"), (4, 2)),
    (_row(id="cfg1", tp_size="8", moe_tp_size="1", moe_ep_size="8"), (8, 8)),
])
def test_extractor_undoes_the_exports_tp_product(extractor: ModuleType, row: dict, layout: tuple[int, int]) -> None:
    run = extractor.extract([row])[0]
    assert (run["tp"], run["ep"]) == layout


def test_no_run_spans_more_gpus_than_one_node() -> None:
    assert max(r["tp"] * max(1, r["ep"] // r["tp"]) for r in RUNS) <= 8


def test_extractor_marks_runs_whose_settings_aiconfigurator_wrote(extractor: ModuleType) -> None:
    gap = "source_file=/Users/x/projects/aic-auto-gap-analysis/data/h100_sxm/trtllm/1.0.0rc3/Qwen_Qwen3-32B.csv"
    runs = extractor.extract([_row(), _row(silicon_data_source=gap + "; silicon_concurrency=16")])
    assert [(r["source"], r["deployment"]) for r in runs] == [("2026-04-06.csv", None),
                                                              ("Qwen_Qwen3-32B.csv", "aiconfigurator")]
    assert {r["deployment"] for r in RUNS} == {None, "aiconfigurator"}


def test_replay_takes_the_generators_limits(benchmark_script: Callable[[str], ModuleType]) -> None:
    """The gap analysis's runs: budget = concurrency + prompt + 1500 in whole 32-token blocks, TensorRT-LLM without
    chunked prefill; SGLang from 0.5.6 with mixed chunks, its prefill capped at prompt + 1500 in its default chunk,
    earlier SGLang with its defaults (prefill steps first, max_prefill_tokens 16384); the other runs: the engine's
    defaults, except that TensorRT-LLM's unrecorded runs are replayed chunked (its default, whole prompts, cannot
    have served their 8,192-token prompts beside running decodes)."""
    replay = benchmark_script("capacity_validation.py")
    gpu = load_gpu("h100-sxm")
    run = {"engine": "trtllm", "concurrency": 16, "prompt": 1024, "deployment": "aiconfigurator"}
    seats, budget, policy = replay.deployment_limits(run, load_engine("trtllm"), gpu)
    assert (budget, policy.chunked_prefill, seats >= 16) == (2560, False, True)   # 16 + 1024 + 1500 -> 80 x 32
    seats, vllm_budget, policy = replay.deployment_limits({**run, "engine": "vllm"}, load_engine("vllm"), gpu)
    assert (vllm_budget, policy.chunked_prefill, policy.prefill_first) == (budget, True, False)
    defaults = replay.deployment_limits({**run, "deployment": None}, load_engine("trtllm"), gpu)
    assert defaults[:2] == (2048, 8192) and defaults[2].chunked_prefill
    assert not load_engine("trtllm").scheduler.chunked_prefill
    sglang = load_engine("sglang@0.5.6")
    assert (sglang.scheduler.prefill_first, sglang.scheduler.max_prefill_tokens) == (True, 16384)
    later = replay.deployment_limits({**run, "engine": "sglang", "engine_version": "0.5.6.post2"}, sglang, gpu)
    assert later[1:] == (8192, replace(sglang.scheduler, prefill_first=False, max_prefill_tokens=2524))
    earlier = replay.deployment_limits({**run, "engine": "sglang", "engine_version": "0.5.1.post1"}, sglang, gpu)
    assert earlier[1:] == (8192, sglang.scheduler)


def test_extractor_keeps_data_parallel_attention_runs_apart(extractor: ModuleType) -> None:
    """--attention-dp: the runs of tp-1 ranks sharing the experts (attention_dp_size = moe_ep_size, moe_tp 1), with
    dp, tp 1, ep = dp and every rank's clients (batch_size is one rank's); other shapes and the plain runs left out."""
    wide = _row(model_path="deepseek-ai/DeepSeek-R1", precision="fp8", gemm_quant_mode="fp8", tp_size="1",
                attention_dp_size="8", moe_tp_size="1", moe_ep_size="8", batch_size="32")
    product = {**wide, "attention_dp_size": "64", "moe_tp_size": "8"}
    runs = extractor.extract([wide, product, _row()], attention_dp=True)
    assert [(r["dp"], r["tp"], r["ep"], r["concurrency"]) for r in runs] == [(8, 1, 8, 256)]
    assert extractor.extract([wide]) == []


def test_data_parallel_runs_replay_every_rank(benchmark_script: Callable[[str], ModuleType]) -> None:
    """capacity_validation replays a data-parallel run as every rank in lockstep, each with its share of the clients
    (about 1 s: the ranks' decode-only runs advance together in closed form), and reports the throughput of all of
    them: on the measured runs (silicon_runs_dp.json) most land within 25 % (9 of 12 at the round that added them;
    the misses: TensorRT-LLM's DeepSeek-R1 on B200s at 8,192 output tokens, two measurements of which disagree 1.8x,
    and the H200's 8,192-token prompts, where a prefilling rank holds the others)."""
    cv = benchmark_script("capacity_validation.py")
    runs = json.loads((ROOT / "benchmarks" / "validation" / "silicon_runs_dp.json").read_text())
    assert len(runs) >= 12 and all(r["dp"] > 1 and r["ep"] == r["dp"] * r["tp"] for r in runs)
    replayed = [cv._replay(r) for r in runs]
    assert all(r["fits"] for r in replayed)
    within = [abs(r["predicted_tok_s"] / r["reported_tok_s"] - 1) <= 0.25 for r in replayed]
    assert sum(within) >= 8
    one = replayed[0]   # the reported throughput counts every rank's clients
    assert one["reported_tok_s"] == pytest.approx(cv.closed_loop_tok_s(one["concurrency"], one["gen"],
                                                                       one["ttft_ms"] / 1e3, one["tpot_ms"] / 1e3))
