"""benchmarks/validation/mlperf_server.json and openorca_lengths.csv (the MLPerf Inference runs docs/capacity.md
replays) resolve to presets and formats, match the published runs' sample count, and the replay's helpers do what
benchmarks/mlperf_validation.py says."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def replay(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("mlperf_validation.py")


def test_points_resolve_and_are_consistent(replay: ModuleType) -> None:
    points = replay.points()
    assert len(points) == 12
    assert len([p for p in points if p.get("lengths_csv", replay.OPENORCA) == replay.OPENORCA]) == 9
    assert len(replay.points("Interactive")) == 2
    for p in points:
        assert p["gpus"] % p["tp"] == 0
        assert p["completed_qps"] <= p["scheduled_qps"] * 1.01
        ttft_limit, tpot_limit = replay.limits(p)
        assert p["ttft_ms"]["p50"] <= p["ttft_ms"]["p99"] <= ttft_limit * 1e3   # valid runs meet the limits
        assert p["tpot_ms"]["p50"] <= p["tpot_ms"]["p99"] <= tpot_limit * 1e3
        if p.get("lengths_csv", replay.OPENORCA) == replay.OPENORCA:
            assert 250 < p["output_tok_s"] / p["completed_qps"] < 330      # tokens per sample, as generated
        replicas = [replay.server_replica(p)] + ([replay.offline_replica(p)] if p["offline"] else [])
        for replica in replicas:
            assert replica.fits and replica.kv_tokens > 0 and replica.replicas == p["gpus"] // p["tp"]


def test_each_dataset_is_the_runs_sample_set(replay: ModuleType) -> None:
    """Every point's lengths file has as many rows as LoadGen's performance_sample_count in its summary, no prompt
    beyond its max_model_len, and the replay's outputs have the run's generated mean where the cap allows."""
    for p in replay.points():
        mean = p["output_tok_s"] / p["completed_qps"]
        cap = p.get("max_new_tokens", replay.MAX_NEW_TOKENS)
        inputs, outputs = replay.dataset_lengths(mean, p.get("lengths_csv", replay.OPENORCA), cap)
        assert len(inputs.values) == p["performance_sample_count"], p["id"]
        assert max(inputs.values) <= p.get("max_model_len", 2048) and max(outputs.values) <= cap
        assert outputs.mean == pytest.approx(min(mean, cap), rel=0.01), p["id"]


def test_outputs_reach_the_cap_when_the_run_does(replay: ModuleType) -> None:
    """Llama 3.1 8B generates 129 tokens a sample at a 128-token limit: every replayed output is at the cap (a plain
    rescale by 129 / 81.6 would leave a third of them short)."""
    _, outputs = replay.dataset_lengths(129.0, "benchmarks/validation/cnndm_llama3_lengths.csv", 128)
    assert set(outputs.values) == {128}


def test_lengths_are_the_published_sample_set(replay: ModuleType) -> None:
    inputs, outputs = replay.dataset_lengths(290.0)
    count = replay.points()[0]["performance_sample_count"]   # LoadGen's performance_sample_count in every summary
    assert len(inputs.values) == len(outputs.values) == count == 24576
    assert max(inputs.values) <= 1024 and max(outputs.values) <= replay.MAX_NEW_TOKENS
    assert outputs.mean == pytest.approx(290.0, rel=0.01)     # rescaled to the run's generated mean (cap: < 1 %)


@dataclass
class _Sim:
    qps: float
    limit: float

    def metric(self, name: str, p: float) -> float:     # meets both limits below ``limit`` samples/s
        return (0.1 if name == "tpot" else 1.0) * (1.0 if self.qps <= self.limit else 3.0)


@dataclass
class _FakeReplica:
    limit: float

    def run(self, qps: float, duration_s: float) -> _Sim:
        return _Sim(qps, self.limit)


@pytest.mark.parametrize("limit", [40.0, 75.0, 160.0])
def test_max_qps_brackets_the_limit(replay: ModuleType, limit: float) -> None:
    best = replay.max_qps(_FakeReplica(limit), 75.0, 60.0)
    assert best <= limit and best >= limit / 1.02


def test_a_short_server_run_completes(replay: ModuleType) -> None:
    point = replay.points()[1]
    sim = replay.server_replica(point).run(point["scheduled_qps"], duration_s=20.0)
    assert sim.requests > 100 and math.isfinite(sim.metric("tpot", 99))


def test_operating_point_is_littles_law_and_the_length_biased_context(replay: ModuleType) -> None:
    point = replay.points()[1]
    replica = replay.server_replica(point)
    op = replay.operating_point(point, replica)
    rate = point["completed_qps"] / replica.replicas
    assert op["seqs"] == round(rate * point["e2e_mean_s"])
    outputs = replica.outputs.values
    brute = sum(replica.inputs.mean + t - 0.5 for o in outputs for t in range(1, o + 1)) / sum(outputs)
    assert op["context"] == pytest.approx(brute, rel=1e-9)   # each step of each sequence, at its step's midpoint
    assert op["context"] > replica.inputs.mean + sum(outputs) / len(outputs) / 2   # longer outputs weigh more
    assert op["prefill_tokens"] == pytest.approx(op["prompts"] * replica.inputs.mean)
    mixed = replica.step.time(op["seqs"], op["context"], round(op["prefill_tokens"]), 0.0, round(op["prompts"]))
    assert replica.step.time(op["seqs"], op["context"], 0, 0.0, 0) < mixed < op["step_s"] * 2


def test_aiconfigurator_is_optional(replay: ModuleType) -> None:
    point = next(p for p in replay.points() if p["engine"] != "trtllm")
    assert replay.aiconfigurator_tpot_s(point, 8, 222, 290) is None


def test_a_stated_token_budget_is_the_replays(replay: ModuleType) -> None:
    """Runs whose configuration states the engine's token budget (TensorRT-LLM max_num_tokens, vLLM
    max_num_batched_tokens) are replayed with it; the others keep the engine preset's default."""
    from tfcalc.calc.engine import scheduler_defaults
    from tfcalc.spec.presets import load_engine, load_gpu

    stated = [p for p in replay.points() if "max_num_batched_tokens" in p]
    assert {p["max_num_batched_tokens"] for p in stated} >= {1536, 3584, 40960}
    for p in replay.points():
        default = scheduler_defaults(load_engine(p["engine"]), load_gpu(p["gpu"]))[1]
        assert replay.server_replica(p).budget == p.get("max_num_batched_tokens", default)
        if p["offline"]:
            assert replay.offline_replica(p).budget == p["offline"].get("max_num_batched_tokens", default)


def test_the_step_model_at_the_2025_runs_operating_points(replay: ModuleType) -> None:
    """One scheduler step at each v5.1 run's measured operating point (Little's law's sequences at their mean
    context beside the prefill the run's rate brings; ``--steps``) against the run's TPOT p50: NVIDIA's NVFP4 B200
    and AMD's MI325X (a GPU no kernel of which was measured) within 10 %, the H200 and MI300X runs' steps 18-21 %
    above tfcalc's (docs/capacity.md, "MLPerf Inference v5.1")."""
    errors = {}
    for point in replay.points("v5.1"):
        if point.get("lengths_csv", replay.OPENORCA) != replay.OPENORCA or point.get("scenario") == "Interactive":
            continue
        replica = replay.server_replica(point)
        op = replay.operating_point(point, replica)
        step = replica.step.time(op["seqs"], op["context"], round(op["prefill_tokens"]), 0.0,
                                 max(1, round(op["prompts"])))
        errors[point["gpu"]] = step / op["step_s"] - 1
    assert set(errors) == {"b200", "h200", "mi300x", "mi325x"}
    assert abs(errors["b200"]) <= 0.1 and abs(errors["mi325x"]) <= 0.1, errors
    assert -0.25 <= errors["h200"] <= -0.1 and -0.25 <= errors["mi300x"] <= -0.1, errors


def test_a_stated_unchunked_prefill_is_the_replays(replay: ModuleType) -> None:
    """AMD's v5.1 vLLM runs state enable_chunked_prefill False (vLLM V0's _schedule_default: whole prompts in steps
    without decodes); the replay's simulation takes it, NVIDIA's chunked runs keep chunks beside decodes. On the
    MI300X Interactive run a prompt's step stalls the decodes, so TPOT p99 rises over the chunked replay's."""
    from dataclasses import replace

    from tfcalc.spec.engine import SchedulerPolicy

    amd = [p for p in replay.points("v5.1") if p["submitter"] == "AMD"]
    assert len(amd) == 4
    for p in replay.points():
        policy = replay.server_replica(p).cfg.policy
        assert policy == (SchedulerPolicy(chunked_prefill=False, prefill_first=True) if p in amd
                          else SchedulerPolicy())
    point = next(p for p in amd if "Interactive" in p["id"])
    replica = replay.server_replica(point)
    whole = replica.run(point["scheduled_qps"], duration_s=60.0)
    replica.cfg = replace(replica.cfg, policy=SchedulerPolicy())
    chunked = replica.run(point["scheduled_qps"], duration_s=60.0)
    assert whole.metric("tpot", 99) > chunked.metric("tpot", 99)
