"""The capacity search: the cheapest plan really is the cheapest, the frontier is Pareto-optimal, and the
monotonicity the issue asks for (looser targets never cost more; more traffic never needs fewer GPUs; a
cheaper price never makes a feasible plan infeasible)."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc.capacity import (
    Candidate,
    Evaluation,
    GpuOffer,
    SearchSpace,
    count_candidates,
    nearest_miss,
    scheduler_policy,
    search,
    simulate_evaluation,
    tokens_per_gpu,
    tokens_per_user,
)
from tfcalc.calc.serving import SpecDecoding, prefill_only_at
from tfcalc.calc.serving_inputs import ReplicaMemory
from tfcalc.calc.serving_traffic import LengthDist, Target, Traffic, engine_overheads
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import UsageError
from tfcalc.spec.presets import load_engine, load_gpu, load_model

SPEC = load_model("llama3-8b")
OVERHEADS = engine_overheads(load_engine("vllm"))
VLLM = load_engine("vllm")


def _space(*gpus: tuple[str, float], **changes) -> SearchSpace:
    base = SearchSpace(gpus=tuple(GpuOffer(gpu=load_gpu(n), price_per_hour=p) for n, p in gpus),
                       weight_precisions=(parse_weight_precision("bf16"), parse_weight_precision("fp8")),
                       kv_dtypes=(get_dtype("bf16"),), tps=(1, 2), max_num_seqs=(16, 64, 256),
                       chunk_sizes=(512, 2048), max_gpus=32, max_model_len=4096, engines=(VLLM,))
    return replace(base, **changes)


def _traffic(rate: float | None = 10.0, concurrency: int | None = None) -> Traffic:
    return Traffic(input_len=LengthDist(kind="lognormal", mean=800, spread=0.5),
                   output_len=LengthDist(kind="lognormal", mean=200, spread=0.7), rate_per_s=rate,
                   concurrency=concurrency)


def _targets(ttft: float = 0.8, tpot: float = 0.05) -> tuple[Target, ...]:
    return (Target(metric="ttft", percentile=90, seconds=ttft), Target(metric="tpot", percentile=90, seconds=tpot))


def test_best_is_the_cheapest_feasible_and_every_candidate_is_there() -> None:
    space = _space(("h100-sxm", 3.0), ("a100-80gb", 2.0), ("l40s", 1.2))
    result = search(SPEC, _traffic(), _targets(), space, OVERHEADS)
    assert len(result.evaluations) == count_candidates(SPEC, space) == 3 * 2 * 2 * 1 * 3 * 2
    feasible = [e for e in result.evaluations if e.feasible]
    assert result.best is not None and result.best.feasible
    assert result.best.cost_per_hour == min(e.cost_per_hour for e in feasible)
    for e in feasible:
        assert e.num_gpus == e.replicas * e.candidate.tp * e.candidate.pp
        assert e.cost_per_hour == pytest.approx(e.num_gpus * e.price_per_gpu_hour)
        assert e.replicas * e.capacity_rate_per_s >= 10.0 - 1e-9
        assert (e.replicas - 1) * e.capacity_rate_per_s < 10.0
        assert e.operating is not None and e.operating.meets(_targets())
    # Cost per token: the GPU-hour is split between input and output, so they add back up to it.
    b = result.best
    per_s = 10.0 * (800 * b.cost_per_m_input + 200 * b.cost_per_m_output) / 1e6
    assert per_s * 3600 == pytest.approx(b.cost_per_hour, rel=0.01)


def test_frontier_is_pareto_optimal() -> None:
    result = search(SPEC, _traffic(), _targets(), _space(("h100-sxm", 3.0), ("l40s", 1.2)), OVERHEADS)
    points = [(tokens_per_user(e.frontier), tokens_per_gpu(e)) for e in result.evaluations if e.frontier]
    front = [(tokens_per_user(e.frontier), tokens_per_gpu(e)) for e in result.frontier]
    assert len(front) >= 2
    for u, g in front:
        assert not any(pu > u and pg > g for pu, pg in points)
    for u, g in points:
        assert any(fu >= u and fg >= g for fu, fg in front)


def _cost(result) -> float:
    return result.best.cost_per_hour if result.best else float("inf")


@settings(max_examples=12)
@given(ttft=st.floats(0.2, 2.0), tpot=st.floats(0.02, 0.15), factor=st.floats(1.0, 3.0))
def test_looser_targets_never_cost_more(ttft: float, tpot: float, factor: float) -> None:
    space = _space(("h100-sxm", 3.0), ("l40s", 1.2))
    tight = search(SPEC, _traffic(), _targets(ttft, tpot), space, OVERHEADS)
    loose = search(SPEC, _traffic(), _targets(ttft * factor, tpot * factor), space, OVERHEADS)
    assert _cost(loose) <= _cost(tight)


@settings(max_examples=12)
@given(rate=st.floats(0.5, 40.0), more=st.floats(1.0, 4.0))
def test_more_traffic_never_needs_fewer_gpus(rate: float, more: float) -> None:
    """With one GPU type the cost is proportional to the GPU count; with several the cost never falls."""
    one = _space(("h100-sxm", 3.0))
    a = search(SPEC, _traffic(rate), _targets(), one, OVERHEADS)
    b = search(SPEC, _traffic(rate * more), _targets(), one, OVERHEADS)
    if a.best is None:
        assert b.best is None
    elif b.best is not None:
        assert b.best.num_gpus >= a.best.num_gpus
    two = _space(("h100-sxm", 3.0), ("a100-80gb", 2.0))
    assert _cost(search(SPEC, _traffic(rate * more), _targets(), two, OVERHEADS)) >= \
        _cost(search(SPEC, _traffic(rate), _targets(), two, OVERHEADS))


@settings(max_examples=10)
@given(price=st.floats(0.5, 5.0), cut=st.floats(0.1, 1.0))
def test_a_cheaper_price_keeps_feasible_plans_feasible(price: float, cut: float) -> None:
    before = search(SPEC, _traffic(), _targets(), _space(("h100-sxm", price), ("l40s", 1.5)), OVERHEADS)
    after = search(SPEC, _traffic(), _targets(), _space(("h100-sxm", price * cut), ("l40s", 1.5)), OVERHEADS)
    feasible_before = {e.candidate for e in before.evaluations if e.feasible}
    feasible_after = {e.candidate for e in after.evaluations if e.feasible}
    assert feasible_before <= feasible_after
    assert _cost(after) <= _cost(before)


def test_concurrency_traffic() -> None:
    result = search(SPEC, _traffic(None, 64), _targets(), _space(("h100-sxm", 3.0)), OVERHEADS)
    b = result.best
    assert b is not None and b.replicas * b.capacity_concurrency >= 64 * 0.999


def test_disaggregated_and_speculative_candidates() -> None:
    space = _space(("h100-sxm", 3.0), disaggregated=True,
                   speculative=(None, SpecDecoding(num_tokens=3, acceptance=0.7, draft_cost=1 / 32)))
    result = search(SPEC, _traffic(), _targets(), space, OVERHEADS)
    disagg = [e for e in result.evaluations if e.candidate.mode == "disaggregated"]
    assert disagg and any(e.feasible for e in disagg)
    for e in disagg:
        assert e.prefill is not None
        assert e.num_gpus == e.replicas * e.candidate.gpus_per_replica + \
            e.candidate.prefill_replicas * e.candidate.prefill_tp
    assert any(e.candidate.spec is not None and e.feasible for e in result.evaluations)
    for e in disagg:   # a request's TTFT: the prefill pool's, then the KV transfer and the decode side's first step
        assert e.prefill is not None and e.operating is not None
        pre = prefill_only_at(e.prefill.model, _traffic().load / e.candidate.prefill_replicas)
        for t in _targets():
            if t.metric == "ttft":
                assert e.numbers[t.key] == pytest.approx(pre.ttft(t.percentile) + e.operating.ttft(t.percentile))
                assert e.numbers[t.key] > pre.ttft(t.percentile)


def test_disaggregated_pools_of_data_parallel_ranks() -> None:
    """PD disaggregation with wide expert parallelism (SGLang's large-scale EP deployments): either pool may be
    groups of data-parallel attention ranks; each comes in whole groups, and the GPUs add up."""
    deepseek = load_model("deepseek-v3")
    fp8 = parse_weight_precision("fp8_block")
    traffic = Traffic(input_len=LengthDist(kind="fixed", mean=2000), output_len=LengthDist(kind="fixed", mean=500),
                      rate_per_s=50.0)
    space = _space(("h100-sxm", 3.0), disaggregated=True, weight_precisions=(fp8,), kv_dtypes=(get_dtype("fp8"),),
                   tps=(1,), attention_dp=(8, 16, 32), max_num_seqs=(128,), chunk_sizes=(2048,), max_gpus=128,
                   engines=(load_engine("sglang"),), max_model_len=4096)
    result = search(deepseek, traffic, (Target(metric="tpot", percentile=90, seconds=0.1),
                                        Target(metric="ttft", percentile=90, seconds=5.0)), space, OVERHEADS)
    wide = [e for e in result.evaluations if e.candidate.mode == "disaggregated" and e.candidate.dp > 1]
    assert wide and any(e.feasible for e in wide)
    for e in wide:
        c = e.candidate
        assert c.prefill_dp > 1 and c.prefill_replicas % c.prefill_dp == 0 and e.replicas % c.dp == 0
        assert e.num_gpus == e.replicas * c.gpus_per_replica + c.prefill_replicas * c.prefill_tp
        assert f"+{c.prefill_replicas}x tp1 dp{c.prefill_dp} ep{c.prefill_ep} prefill" in c.label


def test_simulation_of_the_chosen_plan_agrees() -> None:
    traffic = _traffic(12.0)
    result = search(SPEC, traffic, _targets(), _space(("h100-sxm", 3.0)), OVERHEADS)
    best = result.best
    assert best is not None and best.operating is not None
    sim = simulate_evaluation(best, traffic, num_requests=1500)
    assert sim is not None
    assert sim.metric("ttft", 90) == pytest.approx(best.operating.ttft(90), rel=0.2)
    assert sim.metric("tpot", 90) == pytest.approx(best.operating.tpot(90), rel=0.1)


def test_sglang_plans_run_its_scheduler_policy() -> None:
    """An SGLang configuration's model and its simulation both run prefill steps of their own first (the engine
    preset's scheduler section), and agree with each other (TPOT mean 8 % and p90 12 % low here, vLLM's p90 9 %:
    the tail of the per-request prefill share); vLLM's do not run it."""
    traffic = _traffic(12.0)
    sglang = load_engine("sglang")
    result = search(SPEC, traffic, _targets(), _space(("h100-sxm", 3.0), engines=(VLLM, sglang)), None)
    policies = {(e.candidate.engine, e.model.policy.prefill_first, e.model.policy.max_prefill_tokens)
                for e in result.evaluations if e.model is not None}
    assert policies == {(VLLM.label, False, None), (sglang.label, True, None)}   # 0.5.13+: no prefill cap
    best = next(e for e in result.evaluations if e.feasible and e.candidate.engine == sglang.label
                and e.operating is not None)
    sim = simulate_evaluation(best, traffic, num_requests=1500)
    assert sim is not None
    assert sim.metric("ttft", 90) == pytest.approx(best.operating.ttft(90), rel=0.2)
    assert sim.metric("tpot", 0) == pytest.approx(best.operating.tpot(0), rel=0.1)
    assert sim.metric("tpot", 90) == pytest.approx(best.operating.tpot(90), rel=0.15)


def test_planned_trtllm_replicas_chunk_prompts_as_their_launch_command_sets() -> None:
    """TensorRT-LLM schedules whole prompts by default (enable_chunked_prefill False), but the trtllm-serve
    options the plan prints turn chunking on, so its replicas are simulated chunked; the rest of a policy is the
    engine's (SGLang keeps prefill first)."""
    trtllm, sglang = load_engine("trtllm"), load_engine("sglang")
    assert not trtllm.scheduler.chunked_prefill
    assert scheduler_policy(trtllm) == replace(trtllm.scheduler, chunked_prefill=True)
    assert scheduler_policy(sglang) == sglang.scheduler and scheduler_policy(sglang).prefill_first
    assert scheduler_policy(None) == scheduler_policy(VLLM)


def test_two_workers_give_the_same_answer() -> None:
    space = _space(("h100-sxm", 3.0), ("l40s", 1.2))
    one = search(SPEC, _traffic(), _targets(), space, OVERHEADS)
    two = search(SPEC, _traffic(), _targets(), space, OVERHEADS, workers=2)
    assert [(e.candidate, e.cost_per_hour, e.capacity_rate_per_s) for e in one.evaluations] == \
        [(e.candidate, e.cost_per_hour, e.capacity_rate_per_s) for e in two.evaluations]


def test_a_search_worker_killed_mid_search_loses_no_group(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The first group a worker takes kills that worker (as the OOM killer would): the pool breaks, the groups it
    lost run in this process, and the search answers the same as with one process."""
    import multiprocessing
    import signal

    from tfcalc.calc import capacity

    space = _space(("h100-sxm", 3.0), ("l40s", 1.2))
    one = search(SPEC, _traffic(), _targets(), space, OVERHEADS)
    parent, original, marker = os.getpid(), capacity._Job.run, tmp_path / "killed"

    def run(self, group):  # noqa: ANN001, ANN202  (named as the method: the pool pickles job.run by name)
        if os.getpid() != parent:
            try:
                marker.open("x").close()   # exactly one worker, once: the first to create the marker
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, group)

    monkeypatch.setattr(capacity._Job, "run", run)
    two = search(SPEC, _traffic(), _targets(), space, OVERHEADS, workers=2)
    assert marker.exists()   # a worker did die
    assert [(e.candidate, e.cost_per_hour, e.capacity_rate_per_s) for e in one.evaluations] == \
        [(e.candidate, e.cost_per_hour, e.capacity_rate_per_s) for e in two.evaluations]
    assert multiprocessing.active_children() == []


def test_nothing_fits() -> None:
    big = load_model("llama3.1-405b")
    result = search(big, _traffic(), _targets(), _space(("l40s", 1.2)), OVERHEADS)
    assert result.best is None and not any(e.fits for e in result.evaluations)
    assert all(e.reason.startswith("does not fit") for e in result.evaluations)



def test_a_set_kv_cache_is_vllm_s_budget_and_fits_only_beside_the_rest() -> None:
    """--kv-cache-memory-bytes: each vLLM candidate's KV budget is the set size (SGLang sizes its own); a smaller set
    cache holds fewer KV tokens than vLLM's own sizing; a size the GPU cannot hold beside the weights and the rest fits
    nowhere, and says by how much."""
    sglang = load_engine("sglang")
    free = search(SPEC, _traffic(), _targets(), _space(("h100-sxm", 3.0), engines=(VLLM, sglang)), OVERHEADS)
    set20 = search(SPEC, _traffic(), _targets(), _space(("h100-sxm", 3.0), engines=(VLLM, sglang),
                                                        kv_cache_memory_bytes=20 << 30), OVERHEADS)
    own = {e.candidate: e for e in free.evaluations}
    assert len(own) == len(set20.evaluations)
    for b in set20.evaluations:
        a = own[b.candidate]
        assert a.memory is not None and b.memory is not None
        if a.candidate.engine.startswith("sglang"):
            assert b.memory == a.memory
        else:
            assert b.memory.kv_budget_bytes_per_gpu == 20 << 30 < a.memory.kv_budget_bytes_per_gpu
            assert b.memory.kv_capacity_tokens < a.memory.kv_capacity_tokens
    too_big = search(SPEC, _traffic(), _targets(), _space(("h100-sxm", 3.0), kv_cache_memory_bytes=75 << 30),
                     OVERHEADS)
    assert too_big.best is None and not any(e.fits for e in too_big.evaluations)
    assert all("set KV cache of 75.00 GiB per GPU and the rest exceed the GPU by" in e.reason
               for e in too_big.evaluations)

# --- the command's choice: the cheapest plan the simulation confirms -------------------------------------------

def _verify(result, traffic, targets, space, requests: int = 300, workers: int = 1):  # noqa: ANN001, ANN202
    from tfcalc.calc.capacity import full_evaluation, verified_choice

    def full(e):  # noqa: ANN001, ANN202
        return full_evaluation(SPEC, traffic, targets, space, OVERHEADS, e)

    return verified_choice(result, traffic, targets, space, full, num_requests=requests, max_simulations=40,
                           workers=workers)


def _sim_ok(e, traffic, targets, requests: int = 300) -> bool:  # noqa: ANN001
    sim = simulate_evaluation(e, traffic, num_requests=requests)
    return all(sim.metric(t.metric, t.percentile) <= t.seconds for t in targets)


def test_verified_choice_meets_its_own_simulation() -> None:
    space = _space(("h100-sxm", 3.0), ("l40s", 1.2), tps=(1,), max_num_seqs=(16, 64), chunk_sizes=(512, 2048))
    traffic, targets = _traffic(9.0), _targets(ttft=0.35, tpot=0.045)
    result = search(SPEC, traffic, targets, space, OVERHEADS)
    v = _verify(result, traffic, targets, space)
    assert v.verified and v.plan is not None and _sim_ok(v.plan, traffic, targets)
    assert v.plan.cost_per_hour >= result.best.cost_per_hour
    # the confirmed plan's simulated values are the walk's own simulation of it (same requests, same seed)
    sim = simulate_evaluation(v.plan, traffic, num_requests=300)
    assert v.simulated == {t.key: pytest.approx(sim.metric(t.metric, t.percentile)) for t in targets}
    assert all(v.simulated[t.key] <= t.seconds for t in targets)



def test_explain_says_when_the_simulation_check_added_replicas() -> None:
    """The explanation's replica count is the model's (ceil of the load over one replica's capacity); a plan the walk
    resized says both: "= 2; 3 after the simulation check"."""
    from tfcalc.calc.capacity import full_evaluation, resize
    from tfcalc.report.capacity import explain_lines

    space = _space(("h100-sxm", 3.0), tps=(1,), max_num_seqs=(64,), chunk_sizes=(2048,))
    traffic, targets = _traffic(9.0), _targets(ttft=0.35, tpot=0.045)
    best = full_evaluation(SPEC, traffic, targets, space, OVERHEADS, search(SPEC, traffic, targets, space,
                                                                            OVERHEADS).best)
    modelled = best.replicas
    line = next(x for x in explain_lines(SPEC, best, traffic, targets, space) if x.startswith("capacity:"))
    assert line.endswith(f" = {modelled}")
    bigger = resize(best, modelled + 1, traffic, targets, space)
    line = next(x for x in explain_lines(SPEC, bigger, traffic, targets, space) if x.startswith("capacity:"))
    assert line.endswith(f" = {modelled}; {modelled + 1} after the simulation check")

class _Verdict:
    """A stand-in for a simulation: misses the targets unless the plan has enough replicas for its GPU type."""

    def __init__(self, ok: bool) -> None:
        self.ok, self.steps, self.preemptions = ok, 1, 0

    def metric(self, metric: str, percentile: float) -> float:
        return 0.0 if self.ok else 1e9


def _fake_rule(e) -> bool:  # noqa: ANN001
    need = {"l40s": 4, "h100-sxm": 2}[e.candidate.gpu] + (e.candidate.max_num_seqs == 16)
    return e.replicas >= need


def test_verified_choice_walks_down_to_the_cheapest_confirmed_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """With simulations that reject plans the model accepts (a stand-in that asks for more replicas per GPU type),
    the walk returns the cheapest plan of all that the simulation accepts: brute force over every configuration and
    replica count agrees, with fewer simulations than configurations."""
    from tfcalc.calc import capacity
    from tfcalc.calc.capacity import full_evaluation, resize

    monkeypatch.setattr(capacity, "simulate_evaluation", lambda e, traffic, num_requests=0: _Verdict(_fake_rule(e)))
    space = _space(("h100-sxm", 3.0), ("l40s", 1.2), tps=(1, 2), max_num_seqs=(16, 64), chunk_sizes=(512, 2048))
    traffic, targets = _traffic(6.0), _targets()
    result = search(SPEC, traffic, targets, space, OVERHEADS)
    v = _verify(result, traffic, targets, space)
    brute = math.inf
    for e in result.evaluations:
        if not e.feasible or e.candidate.mode != "aggregated":
            continue
        rich = full_evaluation(SPEC, traffic, targets, space, OVERHEADS, e)
        for replicas in range(rich.replicas, 40):
            sized = resize(rich, replicas, traffic, targets, space)
            if sized.feasible and _fake_rule(sized):
                brute = min(brute, sized.cost_per_hour)
                break
    assert v.verified and v.plan.cost_per_hour == pytest.approx(brute)
    assert v.plan.cost_per_hour > result.best.cost_per_hour and 2 <= v.simulations < len(result.evaluations)
    assert _verify(result, traffic, targets, space, workers=3) == v   # simulations run ahead: the same walk


def test_an_interrupted_check_leaves_no_worker_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or SIGTERM, a KeyboardInterrupt in tfcalc) in the middle of the walk stops its simulation workers."""
    import multiprocessing

    from tfcalc.calc import capacity
    from tfcalc.calc.capacity import full_evaluation, verified_choice

    monkeypatch.setattr(capacity, "simulate_evaluation", lambda e, traffic, num_requests=0: _Verdict(False))
    space = _space(("h100-sxm", 3.0), ("l40s", 1.2), tps=(1, 2), max_num_seqs=(16, 64), chunk_sizes=(512, 2048))
    traffic, targets = _traffic(6.0), _targets()
    result = search(SPEC, traffic, targets, space, OVERHEADS)
    calls, parent, resize = [], os.getpid(), capacity.resize

    def interrupted_resize(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if os.getpid() == parent:   # the walk's own process (Ctrl-C reaches it, not the workers: they ignore it)
            calls.append(args)
            if len(calls) == 4:   # a few simulations into the walk, some of them run ahead
                raise KeyboardInterrupt
        return resize(*args, **kwargs)

    def full(e):  # noqa: ANN001, ANN202
        return full_evaluation(SPEC, traffic, targets, space, OVERHEADS, e)

    monkeypatch.setattr(capacity, "resize", interrupted_resize)
    with pytest.raises(KeyboardInterrupt):
        verified_choice(result, traffic, targets, space, full, num_requests=100, workers=2)
    assert len(calls) == 4
    assert multiprocessing.active_children() == [] and capacity._WALK is None


def test_a_killed_worker_does_not_hang_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A simulation worker killed from outside (the OOM killer, a stray SIGKILL) would never answer its task: the
    walk notices, runs the rest in its own process and gives the same answer."""
    import signal
    import threading
    import time

    from tfcalc.calc import capacity

    parent, here = os.getpid(), []

    def slow_verdict(e, traffic, num_requests=0):  # noqa: ANN001, ANN202
        if os.getpid() != parent:
            time.sleep(0.3)
        else:
            here.append(e)
        return _Verdict(_fake_rule(e))

    monkeypatch.setattr(capacity, "simulate_evaluation", slow_verdict)
    space = _space(("h100-sxm", 3.0), ("l40s", 1.2), tps=(1, 2), max_num_seqs=(16, 64), chunk_sizes=(512, 2048))
    traffic, targets = _traffic(6.0), _targets()
    result = search(SPEC, traffic, targets, space, OVERHEADS)
    alone = _verify(result, traffic, targets, space)
    here.clear()

    def kill_a_worker() -> None:
        time.sleep(0.15)
        os.kill(min(capacity._children()), signal.SIGKILL)

    killer = threading.Thread(target=kill_a_worker)
    killer.start()
    started = time.perf_counter()
    survived = _verify(result, traffic, targets, space, workers=2)
    killer.join()
    assert survived == alone and time.perf_counter() - started < 30
    assert here   # the walk went on in its own process


def test_verified_choice_with_workers_is_the_same_walk() -> None:
    """Forked workers running simulations ahead change when each one runs, not the answer or the lines."""
    space = _space(("h100-sxm", 3.0), ("l40s", 1.2), tps=(1, 2), max_num_seqs=(16, 64), chunk_sizes=(512, 2048))
    traffic, targets = _traffic(9.0), _targets(ttft=0.15, tpot=0.04)   # the model's two cheapest plans miss
    result = search(SPEC, traffic, targets, space, OVERHEADS)
    one = _verify(result, traffic, targets, space, requests=200)
    two = _verify(result, traffic, targets, space, requests=200, workers=2)
    assert one.simulations >= 2 and (one.lines, one.simulations, one.verified) == (two.lines, two.simulations,
                                                                                  two.verified)
    assert one.plan is not None and two.plan is not None and one.plan.cost_per_hour == two.plan.cost_per_hour


@settings(max_examples=4, deadline=None)
@given(ttft=st.floats(0.3, 1.0), factor=st.floats(1.0, 2.0))
def test_verified_choice_looser_targets_never_cost_more(ttft: float, factor: float) -> None:
    space = _space(("h100-sxm", 3.0), ("l40s", 1.2), tps=(1,), max_num_seqs=(16, 64), chunk_sizes=(512, 2048))
    traffic = _traffic(9.0)
    tight, loose = _targets(ttft, 0.05), _targets(ttft * factor, 0.05 * factor)
    a = _verify(search(SPEC, traffic, tight, space, OVERHEADS), traffic, tight, space)
    b = _verify(search(SPEC, traffic, loose, space, OVERHEADS), traffic, loose, space)
    if a.verified:
        assert b.verified and b.plan.cost_per_hour <= a.plan.cost_per_hour


@settings(max_examples=4, deadline=None)
@given(price=st.floats(0.5, 5.0), cut=st.floats(0.2, 1.0))
def test_verified_choice_cheaper_price_never_hurts(price: float, cut: float) -> None:
    traffic, targets = _traffic(9.0), _targets(0.4, 0.05)

    def choose(p: float):  # noqa: ANN202
        space = _space(("h100-sxm", p), ("l40s", 1.5), tps=(1,), max_num_seqs=(16, 64), chunk_sizes=(512, 2048))
        return _verify(search(SPEC, traffic, targets, space, OVERHEADS), traffic, targets, space)

    before, after = choose(price), choose(price * cut)
    if before.verified:
        assert after.verified and after.plan.cost_per_hour <= before.plan.cost_per_hour


@settings(max_examples=6, deadline=None)
@given(ttft=st.floats(0.3, 1.0), factor=st.floats(1.0, 3.0), price=st.floats(0.5, 5.0), cut=st.floats(0.2, 1.0))
def test_verified_choice_monotone_when_the_simulation_disagrees(ttft: float, factor: float, price: float,
                                                                cut: float) -> None:
    """The same two properties with simulations that reject what the model accepts (the stand-in above), where the
    walk goes down the list and adds replicas."""
    from tfcalc.calc import capacity

    traffic = _traffic(6.0)

    def choose(targets, p):  # noqa: ANN001, ANN202
        space = _space(("h100-sxm", p), ("l40s", 1.2), tps=(1, 2), max_num_seqs=(16, 64), chunk_sizes=(512, 2048))
        return _verify(search(SPEC, traffic, targets, space, OVERHEADS), traffic, targets, space)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity, "simulate_evaluation", lambda e, t, num_requests=0: _Verdict(_fake_rule(e)))
        tight, loose = _targets(ttft, 0.05), _targets(ttft * factor, 0.05 * factor)
        a, b = choose(tight, price), choose(loose, price)
        if a.verified:
            assert b.verified and b.plan.cost_per_hour <= a.plan.cost_per_hour + 1e-9
        c = choose(tight, price * cut)
        if a.verified:
            assert c.verified and c.plan.cost_per_hour <= a.plan.cost_per_hour + 1e-9


def test_data_parallel_attention_layouts_and_sizing() -> None:
    """SearchSpace.attention_dp: an MoE model gets layouts of dp ranks of tp GPUs sharing the experts at ep = tp x dp
    (one pipeline stage, across nodes up to the GPU limit), a dense model none. A replica is one rank: its KV pool and
    sequences are plan_fit's for the whole group of tp x dp GPUs divided over the ranks, its replicas come in whole
    groups, and for DeepSeek-V3's MLA cache (one latent head, held whole by every tp rank: the same bytes per token
    per GPU) eight tp-1 ranks hold five times the sequences of one tp-8 replica on the same eight GPUs (800 against
    153; each rank also holds the whole attention's weights)."""
    from tfcalc.calc.capacity import _layouts
    from tfcalc.calc.plan import PlanConfig, plan_fit
    from tfcalc.calc.serving_inputs import replica_memory

    deepseek, h200 = load_model("deepseek-v3"), load_gpu("h200")
    space = _space(("h200", 3.0), tps=(1, 2, 4, 8), attention_dp=(1, 2, 4, 8), max_gpus=64)
    layouts = _layouts(deepseek, space)
    assert {(1, 1, 8), (2, 1, 8), (4, 1, 8), (1, 1, 4), (2, 1, 4), (4, 1, 32), (8, 1, 64)} <= set(layouts)
    assert all(tp * (ep // tp if ep > tp else 1) <= 64 for tp, _, ep in layouts)
    assert (8, 1, 64) not in _layouts(deepseek, replace(space, max_gpus=32))
    eplb = replace(space, tps=(1,), attention_dp=(8, 36, 64, 72), max_gpus=72)
    assert {ep for _, _, ep in _layouts(deepseek, eplb)} == {1, 8, 64}          # 256 experts: not 36 or 72
    assert {ep for _, _, ep in _layouts(deepseek, replace(eplb, redundant_experts=32))} == {1, 8, 36, 72}   # 288
    assert _layouts(SPEC, space) == _layouts(SPEC, replace(space, attention_dp=(1,)))   # dense: nothing new
    fp8 = parse_weight_precision("fp8_block")
    rank = replica_memory(deepseek, h200, fp8, get_dtype("fp8"), tp=1, pp=1, ep=8, engine=VLLM, max_model_len=8192,
                          max_num_seqs=64, max_num_batched_tokens=8192)
    group = plan_fit(deepseek, h200, fp8, get_dtype("fp8"),
                     PlanConfig(num_gpus=8, tp=1, pp=1, ep=8, context=8192, batch=1, engine=VLLM, max_num_seqs=64,
                                max_num_batched_tokens=8192), with_ideal=False, with_max_context=False)
    assert rank.kv_capacity_tokens == group.kv_tokens_per_gpu
    assert rank.max_sequences_at_max_len * 8 == group.max_concurrent_sequences
    tp8 = replica_memory(deepseek, h200, fp8, get_dtype("fp8"), tp=8, pp=1, ep=8, engine=VLLM, max_model_len=8192,
                         max_num_seqs=64, max_num_batched_tokens=8192)
    assert rank.kv_bytes_per_token_per_gpu == tp8.kv_bytes_per_token_per_gpu
    assert 8 * rank.max_sequences_at_max_len >= 5 * tp8.max_sequences_at_max_len
    traffic = Traffic(input_len=LengthDist(kind="fixed", mean=2048), output_len=LengthDist(kind="fixed", mean=500),
                      rate_per_s=30.0)
    result = search(deepseek, traffic, (Target(metric="tpot", percentile=90, seconds=0.08),),
                    replace(space, weight_precisions=(fp8,), kv_dtypes=(get_dtype("fp8"),), tps=(1, 8),
                            max_num_seqs=(128,), chunk_sizes=(8192,), attention_dp=(1, 8), max_gpus=128), OVERHEADS)
    wide = [e for e in result.evaluations if e.candidate.dp == 8 and e.candidate.tp == 1 and e.feasible]
    assert wide and all(e.replicas % 8 == 0 and e.num_gpus == e.replicas for e in wide)
    assert all(math.ceil(30.0 / e.capacity_rate_per_s / 8) * 8 == e.replicas for e in wide)
    assert "dp8" in wide[0].candidate.label


def test_search_skips_layouts_that_cut_weight_blocks() -> None:
    """Qwen3-235B-A22B-FP8's experts sliced over tp 8 cut its 128x128 blocks (engines refuse to load it): the search
    keeps tp 8 with whole experts per GPU and drops the sliced layout, and says why when nothing else is left."""
    spec = load_model("qwen3-235b-a22b")
    space = _space(("b200", 5.0), weight_precisions=(parse_weight_precision("fp8_block"),), tps=(8,),
                   max_num_seqs=(64,), chunk_sizes=(2048,))
    result = search(spec, _traffic(), _targets(2.0, 0.1), space)
    layouts = {(e.candidate.tp, e.candidate.ep) for e in result.evaluations}
    assert layouts == {(8, 8)}
    with pytest.raises(UsageError, match="192 wide, not a whole number of fp8_block's 128-wide blocks"):
        search(spec, _traffic(), _targets(2.0, 0.1), replace(space, expert_parallel=(False,)))


# the executor's result pipe and a marker file, for its forked worker (a queue cannot be sent as an argument)
_RESULT_PIPE: list = []


def _half_a_result() -> None:
    """A worker killed while sending its result, made certain: half a message on the result pipe, then nothing."""
    import struct
    import time

    results, marker = _RESULT_PIPE
    header = struct.pack("!i", 1 << 20)   # multiprocessing's frame: a length, then that many bytes
    os.write(results._writer.fileno(), header + b"x" * 100)
    marker.touch()
    time.sleep(60)


def test_a_worker_killed_mid_result_does_not_hang_the_exit(tmp_path: Path) -> None:
    """The pool's thread waits for the rest of a result its killed worker never finished sending: stopping the
    workers ends that wait (it would otherwise hang the interpreter's exit, which joins the thread)."""
    import time

    from tfcalc.calc import capacity

    pool, others = capacity._executor(2, 2)
    assert pool is not None
    marker = tmp_path / "written"
    _RESULT_PIPE[:] = [pool._result_queue, marker]
    job = pool.submit(_half_a_result)
    manager = pool._executor_manager_thread
    for _ in range(200):   # the worker has written half its result
        if marker.exists():
            break
        time.sleep(0.05)
    time.sleep(0.3)   # the thread has read the header and waits for the rest
    assert marker.exists() and manager.is_alive()
    started = time.monotonic()
    capacity._stop_workers(pool, others)
    assert not manager.is_alive() and time.monotonic() - started < 5
    assert capacity._children() <= others and job.done() and not job.cancelled()
    _RESULT_PIPE.clear()


def test_sglang_state_slots_cap_the_seats() -> None:
    """Qwen3.5-27B under SGLang: its state pool admits fewer running requests than max_num_seqs, and every
    evaluated configuration's serving model seats no more than that cap."""
    spec = load_model("qwen3.5-27b")
    sglang = load_engine("sglang")
    space = _space(("h100-sxm", 3.0), engines=(sglang,), tps=(1,), max_num_seqs=(256,), chunk_sizes=(8192,),
                   weight_precisions=(parse_weight_precision("bf16"),))
    result = search(spec, _traffic(1.0), _targets(5.0, 0.2), space, engine_overheads(sglang))
    capped = [e for e in result.evaluations if e.model is not None]
    assert capped and all(e.memory is not None and e.memory.max_running is not None
                          and e.model.max_num_seqs == min(256, e.memory.max_running) < 256 for e in capped)


def _miss(label: str, fits: bool, rate: float = 0.0, kv_budget: int | None = None) -> Evaluation:
    """A failing evaluation whose candidate is told apart by its chunk; memory only where ``kv_budget`` is given."""
    memory = None if kv_budget is None else ReplicaMemory(
        fits=fits, reason=label, weights_bytes_per_gpu=0, reserved_bytes_per_gpu=0, kv_budget_bytes_per_gpu=kv_budget,
        kv_bytes_per_token_per_gpu=1, kv_capacity_tokens=max(kv_budget, 0), max_sequences_at_max_len=0, block_size=16,
        engine="ideal")
    cand = Candidate(gpu="l40s", tp=1, pp=1, ep=1, weights="bf16", kv_dtype="bf16", max_num_seqs=8,
                     chunk=len(label))
    return Evaluation(candidate=cand, fits=fits, feasible=False, reason=label, price_per_gpu_hour=1.0, memory=memory,
                      capacity_rate_per_s=rate)


def test_nearest_miss_prefers_a_fitting_candidate_then_the_smallest_shortfall() -> None:
    """Fitting candidates beat non-fitting ones whatever their memory, the most traffic first; among the rest the
    largest KV budget (a shortfall is a negative budget); no candidate with memory or fit: None."""
    short_a, short_b = _miss("a", False, kv_budget=-5 << 30), _miss("bb", False, kv_budget=-1 << 30)
    slow, faster = _miss("ccc", True, rate=0.5, kv_budget=1 << 30), _miss("dddd", True, rate=2.0, kv_budget=0)
    assert nearest_miss([short_a, short_b]) is short_b
    assert nearest_miss([short_a, slow, short_b, faster]) is faster
    assert nearest_miss([_miss("e", False)]) is None
    assert nearest_miss([]) is None
    won = replace(faster, feasible=True)
    assert nearest_miss([won, slow]) is slow
