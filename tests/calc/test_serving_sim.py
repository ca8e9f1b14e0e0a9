"""The scheduler simulation against closed forms (M/M/1, M/D/1, M/G/inf, a closed loop), against itself without
its decode-only fast-forward, and against an independent brute-force simulation."""

from __future__ import annotations

import math
import random

import pytest

from tfcalc.calc.serving_inputs import ConstantStep, latency_step
from tfcalc.calc.serving_sim import SimConfig, SimResult, Workload, simulate
from tfcalc.calc.serving_traffic import LengthDist, Overheads
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.engine import SchedulerPolicy
from tfcalc.spec.presets import load_gpu, load_model

BIG = 10**9


def _cfg(seats: int, budget: int = 8192, kv: int = BIG, overheads: Overheads | None = None) -> SimConfig:
    return SimConfig(max_num_seqs=seats, max_num_batched_tokens=budget, kv_capacity_tokens=kv,
                     overheads=overheads or Overheads())


def test_mm1_sojourn_and_waiting_time(constant_step) -> None:
    """One seat, one-token prompts, geometric outputs: a request holds the seat for O steps of tau, nearly
    exponential service with mean m tau. M/M/1: sojourn ~ Exp(mu - lambda); P(wait > t) = rho e^-(mu-lambda)t."""
    tau, m, rho = 1e-3, 400, 0.5
    mu = 1 / (m * tau)
    lam = rho * mu
    load = Workload(input_len=LengthDist(kind="fixed", mean=1), output_len=LengthDist(kind="exponential", mean=m),
                    num_requests=20_000, rate_per_s=lam, seed=1, warmup_fraction=0.05)
    r = simulate(constant_step(tau), _cfg(1), load)
    gap = mu - lam
    assert r.metric("e2e", 0) == pytest.approx(1 / gap, rel=0.04)
    for p, tolerance in ((50, 0.04), (90, 0.04), (99, 0.08)):
        assert r.metric("e2e", p) == pytest.approx(-math.log(1 - p / 100) / gap, rel=tolerance)
    # TTFT = wait + the one prefill step; the wait is 0 with probability 1 - rho.
    assert r.metric("ttft", 0) == pytest.approx(rho / gap + tau, rel=0.04)
    assert r.metric("ttft", 90) == pytest.approx(math.log(rho / 0.1) / gap + tau, rel=0.04)
    assert r.metric("ttft", 40) < 2 * tau  # the 1 - rho = 50 % who never wait


def test_md1_pollaczek_khinchine_mean_wait(constant_step) -> None:
    tau, m, rho = 1e-3, 300, 0.6
    service = m * tau
    load = Workload(input_len=LengthDist(kind="fixed", mean=1), output_len=LengthDist(kind="fixed", mean=m),
                    num_requests=15_000, rate_per_s=rho / service, seed=2, warmup_fraction=0.05)
    r = simulate(constant_step(tau), _cfg(1), load)
    wait = rho * service / (2 * (1 - rho))
    assert r.metric("ttft", 0) - tau == pytest.approx(wait, rel=0.05)
    assert r.metric("e2e", 0) == pytest.approx(wait + service, rel=0.03)


def test_mg_infinity_never_waits(constant_step) -> None:
    """Seats and budget enough for everyone and a step time independent of the batch: every request takes
    exactly its O steps, after waiting at most one step for the running one to end."""
    tau = 2e-3
    load = Workload(input_len=LengthDist(kind="fixed", mean=10), output_len=LengthDist(kind="uniform", mean=50,
                                                                                      spread=0.8),
                    num_requests=3000, rate_per_s=200, seed=3)
    r = simulate(constant_step(tau), _cfg(100_000, budget=1 << 30), load)
    rng = random.Random(3)  # noqa: S311 - seeded test data
    [load.input_len.sample(rng) for _ in range(3000)]  # the simulation draws every prompt first
    outputs = [load.output_len.sample(rng) for _ in range(3000)]
    assert len(r.e2e_s) == 3000
    for e2e, o in zip(r.e2e_s, outputs, strict=True):
        assert o * tau - 1e-12 <= e2e <= (o + 1) * tau + 1e-12


def test_closed_loop_throughput(constant_step) -> None:
    tau, n, o = 1e-3, 4, 100
    load = Workload(input_len=LengthDist(kind="fixed", mean=1), output_len=LengthDist(kind="fixed", mean=o),
                    num_requests=400, concurrency=n)
    r = simulate(constant_step(tau), _cfg(8), load)
    assert r.request_throughput == pytest.approx(n / (o * tau), rel=1e-6)
    assert max(r.ttft_s) == pytest.approx(tau)


def test_clients_out_of_step_do_not_queue_behind_each_other(constant_step) -> None:
    """Clients that all send at t = 0 queue for the prefill budget (one prompt a step here): the k-th waits k steps.
    Clients started at random times within a request's lifetime (``start_spread_s``) mostly meet a free budget."""
    tau, n, prompt = 1e-3, 8, 64
    common = {"input_len": LengthDist(kind="fixed", mean=prompt), "output_len": LengthDist(kind="fixed", mean=200),
              "num_requests": 4 * n, "concurrency": n, "seed": 4}
    step, cfg = constant_step(tau), _cfg(64, budget=prompt + n)
    lockstep = simulate(step, cfg, Workload(**common))
    assert sorted(lockstep.ttft_s[:n]) == pytest.approx([(k + 1) * tau for k in range(n)])
    spread = simulate(step, cfg, Workload(**common, start_spread_s=200 * tau))
    assert min(spread.ttft_s) >= tau
    assert sum(spread.ttft_s[:n]) / n < 2 * tau < sum(lockstep.ttft_s[:n]) / n


def test_without_chunked_prefill_a_step_takes_whole_prompts(constant_step) -> None:
    """Four clients send 600-token prompts at t = 0 into a 1,000-token budget. Chunked (vLLM): step 1 runs one prompt
    and 400 tokens of the next; step 2 the first's decode token, the second's last 200, the whole third and 199 of
    the fourth; step 3 the rest -- first tokens after steps 1, 2, 2, 3. Whole prompts (TensorRT-LLM's default): one
    prompt a step beside the running decodes, first tokens after steps 1-4. A prompt larger than the whole budget
    never runs: its request fails, as the engine rejects it, and the closed loop goes on."""
    tau, n = 1e-3, 4
    load = Workload(input_len=LengthDist(kind="fixed", mean=600), output_len=LengthDist(kind="fixed", mean=50),
                    num_requests=n, concurrency=n)
    chunked = simulate(constant_step(tau), _cfg(8, budget=1000), load)
    assert sorted(chunked.ttft_s) == pytest.approx([tau, 2 * tau, 2 * tau, 3 * tau])
    assert chunked.steps == 3 + 49
    whole_cfg = SimConfig(max_num_seqs=8, max_num_batched_tokens=1000, kv_capacity_tokens=BIG,
                          policy=SchedulerPolicy(chunked_prefill=False))
    whole = simulate(constant_step(tau), whole_cfg, load)
    assert sorted(whole.ttft_s) == pytest.approx([(k + 1) * tau for k in range(n)])
    assert whole.steps == 4 + 49
    too_long = Workload(input_len=LengthDist(kind="fixed", mean=1200), output_len=LengthDist(kind="fixed", mean=5),
                        num_requests=6, concurrency=2)
    r = simulate(constant_step(tau), whole_cfg, too_long)
    assert r.requests == 0
    assert simulate(constant_step(tau), _cfg(8, budget=1000), too_long).requests == 6


def test_prefill_first_steps_carry_prefill_alone(constant_step) -> None:
    """Three clients send 600-token prompts at t = 0 into a 1,000-token budget. Prefill first (SGLang): step 1 runs
    one prompt and 400 tokens of the next, step 2 the second's last 200 and the whole third -- no decode token beside
    them, so the first request's 49 decode tokens come in steps 3-51 (vLLM's mixed steps: steps 2-50). With SGLang's
    max_prefill_tokens at 1,000 a further prompt joins only while smaller than what is left: one prompt a step, first
    tokens after steps 1, 2, 3, in either policy. Decode steps of prefill-first take every running sequence, beyond
    the token budget: eight 4-token prompts in a 4-token budget prefill one a step, then all eight decode together."""
    tau = 1e-3
    load = Workload(input_len=LengthDist(kind="fixed", mean=600), output_len=LengthDist(kind="fixed", mean=50),
                    num_requests=3, concurrency=3)

    def run(prefill_first: bool, cap: int | None = None, budget: int = 1000) -> SimResult:
        cfg = SimConfig(max_num_seqs=8, max_num_batched_tokens=budget, kv_capacity_tokens=BIG,
                        policy=SchedulerPolicy(prefill_first=prefill_first, max_prefill_tokens=cap))
        return simulate(constant_step(tau), cfg, load)

    first, mixed = run(True), run(False)
    assert sorted(first.ttft_s) == pytest.approx([tau, 2 * tau, 2 * tau]) == sorted(mixed.ttft_s)
    assert min(first.e2e_s) == pytest.approx(51 * tau) and min(mixed.e2e_s) == pytest.approx(50 * tau)
    for prefill_first in (True, False):
        capped = run(prefill_first, cap=1000)
        assert sorted(capped.ttft_s) == pytest.approx([tau, 2 * tau, 3 * tau])
        assert capped.steps == 3 + 49
    tiny = Workload(input_len=LengthDist(kind="fixed", mean=4), output_len=LengthDist(kind="fixed", mean=10),
                    num_requests=8, concurrency=8)
    r = simulate(constant_step(tau), SimConfig(max_num_seqs=8, max_num_batched_tokens=4, kv_capacity_tokens=BIG,
                                               policy=SchedulerPolicy(prefill_first=True)), tiny)
    assert sorted(r.ttft_s) == pytest.approx([(k + 1) * tau for k in range(8)])
    assert r.steps == 8 + 9 and r.e2e_s == pytest.approx([17 * tau] * 8)


def test_sglang_admission_reserves_the_outputs(constant_step) -> None:
    """Three 100-token prompts for 1,000 output tokens each, a pool of 1,500 tokens, prefill first. SGLang admits a
    prompt only while prompt + output (1,100) is below the free tokens less the running requests' remaining output x
    its ratio (0.7, falling 0.001 a decode step to 0.098). A runs alone (steps 1-1,000: at most 820 tokens spare
    beside it). Step 1,001 prefills B; step 1,002 C (1,400 free - 0.098 x 999 = 1,302 > 1,100). Both decode until
    the pool is full (650 steps); C is retracted with 651 tokens, the ratio becomes (651 + 20) / 1,001 = 0.67, and
    C waits until B ends (349 steps), re-prefills (1 step) and decodes its last 348: 2,350 steps, one preemption.
    Admitting greedily instead (vLLM) preempts more."""
    tau = 1e-3
    load = Workload(input_len=LengthDist(kind="fixed", mean=100), output_len=LengthDist(kind="fixed", mean=1000),
                    num_requests=3, concurrency=3)

    def run(reserve: bool) -> SimResult:
        cfg = SimConfig(max_num_seqs=8, max_num_batched_tokens=8192, kv_capacity_tokens=1500, block_size=1,
                        policy=SchedulerPolicy(prefill_first=True, reserve_output=reserve))
        return simulate(constant_step(tau), cfg, load)

    greedy, reserved = run(False), run(True)
    assert sorted(reserved.ttft_s) == pytest.approx([tau, 1001 * tau, 1002 * tau])
    assert reserved.preemptions == 1 and reserved.steps == 1000 + 1 + 1 + 650 + 349 + 1 + 348
    assert greedy.preemptions > reserved.preemptions


def test_closed_loop_goes_on_after_requests_that_cannot_fit(constant_step) -> None:
    """A closed-loop client whose request can never be admitted (the pool holds less than its prompt) gets an error
    and sends the next one: the run ends with every request failed, an empty result, not a crash or a hang."""
    load = Workload(input_len=LengthDist(kind="fixed", mean=64), output_len=LengthDist(kind="fixed", mean=8),
                    num_requests=12, concurrency=4)
    r = simulate(constant_step(1e-3), _cfg(8, kv=32), load)
    assert r.requests == 0 and r.ttft_s == () and r.output_throughput == 0.0
    mixed = Workload(input_len=LengthDist(kind="empirical", values=(16, 64)), output_len=LengthDist(kind="fixed",
                     mean=8), num_requests=40, concurrency=4, seed=3)
    r = simulate(constant_step(1e-3), _cfg(8, kv=48), mixed)
    assert 0 < r.requests < 40 and all(t > 0 for t in r.ttft_s)


def test_overheads_add_to_latencies(constant_step) -> None:
    tau = 1e-3
    o = Overheads(request_s=0.05, per_input_token_s=1e-5, step_s=0.0, stream_s=0.002)
    load = Workload(input_len=LengthDist(kind="fixed", mean=100), output_len=LengthDist(kind="fixed", mean=10),
                    num_requests=1, rate_per_s=1)
    r = simulate(constant_step(tau), _cfg(4, overheads=o), load)
    assert r.ttft_s[0] == pytest.approx(0.05 + 100 * 1e-5 + tau + 0.002)
    assert r.e2e_s[0] == pytest.approx(0.05 + 100 * 1e-5 + 10 * tau + 0.002)


# --- against itself and a brute-force reference --------------------------------------------------------


def _llama_step():
    spec = load_model("llama3-8b")
    return latency_step(spec, load_gpu("h100-sxm"), parse_weight_precision("bf16"), get_dtype("bf16"))


CASES = [
    # (model, seats, budget, KV tokens, rate or None, concurrency or None, prefill first)
    ("llama3-8b", 64, 2048, BIG, 20.0, None, False),
    ("llama3-8b", 16, 512, BIG, 8.0, None, False),
    ("llama3-8b", 256, 8192, 60_000, 30.0, None, False),      # tight KV: preemptions
    ("llama3-8b", 32, 2048, BIG, None, 48, False),           # closed loop, more clients than seats
    ("gemma2-9b", 64, 2048, 200_000, 15.0, None, False),     # sliding windows
    ("qwen3.5-27b", 64, 2048, 60_000, 15.0, None, False),    # Gated DeltaNet states: a block per state layer
    ("llama3-8b", 256, 8192, 60_000, 30.0, None, True),       # SGLang's step policy, preemptions
    ("llama3-8b", 32, 2048, BIG, None, 48, True),
    ("llama3-8b", 256, 8192, 60_000, 30.0, None, "reserve"),  # and its admission reserving output tokens
    ("llama3-8b", 64, 8192, 40_000, None, 48, "reserve"),
]


@pytest.mark.parametrize("case", [*CASES,
                                  # data-parallel attention ranks in lockstep: the runs of every rank together
                                  ("llama3-8b", 64, 2048, BIG, 20.0, None, False, 2),
                                  ("llama3-8b", 32, 2048, BIG, None, 48, True, 3),
                                  ("llama3-8b", 256, 8192, 60_000, 30.0, None, "reserve", 4),
                                  ("llama3-8b", 16, 512, BIG, None, 96, False, 8)],   # idle ranks between runs
                         ids=lambda c: "-".join(str(x) for x in c))
def test_fast_forward_changes_nothing(case: tuple) -> None:
    name, seats, budget, kv, rate, clients, prefill_first, *ranks = case
    spec = load_model(name)
    step = latency_step(spec, load_gpu("h100-sxm"), parse_weight_precision("bf16"), get_dtype("bf16"))
    load = Workload(input_len=LengthDist(kind="lognormal", mean=800, spread=0.6),
                    output_len=LengthDist(kind="lognormal", mean=150, spread=0.8), num_requests=400,
                    rate_per_s=rate, concurrency=clients, seed=7)
    cfg = SimConfig(max_num_seqs=seats, max_num_batched_tokens=budget, kv_capacity_tokens=kv,
                    overheads=Overheads(request_s=0.01, step_s=1e-4, stream_s=1e-3),
                    policy=SchedulerPolicy(prefill_first=bool(prefill_first),
                                           reserve_output=prefill_first == "reserve"))
    ranks = ranks[0] if ranks else 1
    fast = simulate(step, cfg, load, fast_forward=True, ranks=ranks)
    slow = simulate(step, cfg, load, fast_forward=False, ranks=ranks)
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions
    assert fast.ttft_s == pytest.approx(slow.ttft_s, rel=1e-9)
    assert fast.e2e_s == pytest.approx(slow.e2e_s, rel=1e-9)
    if kv < BIG and name == "llama3-8b" and not cfg.policy.reserve_output:
        assert fast.preemptions > 0


def _brute_force(step, prompts: list[int], outputs: list[int], arrivals: list[float], seats: int,
                 budget: int, prefill_first: bool = False, cap: int | None = None
                 ) -> tuple[list[float], list[float]]:
    """The same policy written the plain way: every step rescans every request; no blocks (KV unbounded).
    ``prefill_first``: a step with any prefill work to do carries nothing else, else every running request decodes;
    ``cap``: after a step's first prefill work, a prompt joins only while smaller than cap - decode tokens - the
    prefill tokens already in the step."""
    n = len(prompts)
    state = [{"done": 0, "gen": 0, "first": -1.0, "last": -1.0, "in": False, "fin": False} for _ in range(n)]
    waiting: list[int] = []
    running: list[int] = []
    arrived = 0
    t = 0.0
    while not all(s["fin"] for s in state):
        while arrived < n and arrivals[arrived] <= t:
            waiting.append(arrived)
            arrived += 1
        if not running and not waiting:
            t = arrivals[arrived]
            continue
        left = budget
        plan = []
        for i in running:
            if left == 0:
                break
            s = state[i]
            if prefill_first and s["done"] >= prompts[i]:
                continue
            want = min(prompts[i] - s["done"], left) if s["done"] < prompts[i] else 1
            plan.append((i, want, s["done"] < prompts[i]))
            left -= want
        decoding = sum(w for _, w, pre in plan if not pre)
        while waiting and left > 0 and len(running) < seats:
            taken = sum(w for _, w, pre in plan if pre)
            if cap is not None and taken and prompts[waiting[0]] >= cap - decoding - taken:
                break
            i = waiting.pop(0)
            running.append(i)
            want = min(prompts[i], left)
            plan.append((i, want, True))
            left -= want
        if prefill_first and not plan:
            plan = [(i, 1, False) for i in running]
        decode = sum(1 for _, _, pre in plan if not pre)
        chunks = sum(1 for _, _, pre in plan if pre)
        prefill = sum(w for _, w, pre in plan if pre)
        context = sum(state[i]["done"] + 1 for i, _, pre in plan if not pre) / decode if decode else 0.0
        past = sum(state[i]["done"] for i, _, pre in plan if pre) / chunks if chunks else 0.0
        t += step.time(decode, context, prefill, past, chunks, 1)
        for i, w, pre in plan:
            s = state[i]
            s["done"] += w
            if pre and s["done"] < prompts[i]:
                continue
            if s["first"] < 0:
                s["first"] = t
            s["gen"] += 1
            s["last"] = t
            if s["gen"] >= outputs[i]:
                s["fin"] = True
                running.remove(i)
    return [s["first"] - a for s, a in zip(state, arrivals, strict=True)], \
        [s["last"] - a for s, a in zip(state, arrivals, strict=True)]


@pytest.mark.parametrize("seats,budget,rate,prefill_first,cap", [
    (64, 2048, 20.0, False, None), (8, 256, 3.0, False, None), (128, 512, 25.0, False, None),
    (64, 2048, 20.0, True, None), (32, 1024, 12.0, True, 1500), (64, 4096, 20.0, False, 1800)])
def test_simulation_equals_brute_force(seats: int, budget: int, rate: float, prefill_first: bool,
                                       cap: int | None) -> None:
    step = _llama_step()
    load = Workload(input_len=LengthDist(kind="lognormal", mean=700, spread=0.7),
                    output_len=LengthDist(kind="lognormal", mean=120, spread=0.9), num_requests=300,
                    rate_per_s=rate, seed=11)
    rng = random.Random(11)  # noqa: S311 - seeded test data
    prompts = [load.input_len.sample(rng) for _ in range(300)]
    outputs = [load.output_len.sample(rng) for _ in range(300)]
    gaps = [rng.expovariate(1.0) for _ in range(300)]
    arrivals = list(itertools_accumulate(g / rate for g in gaps))
    ttft, e2e = _brute_force(step, prompts, outputs, arrivals, seats, budget, prefill_first, cap)
    r = simulate(step, SimConfig(max_num_seqs=seats, max_num_batched_tokens=budget, kv_capacity_tokens=BIG,
                                 policy=SchedulerPolicy(prefill_first=prefill_first, max_prefill_tokens=cap)), load)
    assert list(r.ttft_s) == pytest.approx(ttft, rel=1e-9)
    assert list(r.e2e_s) == pytest.approx(e2e, rel=1e-9)


def itertools_accumulate(values) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def test_percentile_matches_numpy_convention() -> None:
    values = (1.0, 2.0, 3.0, 4.0)
    assert SimResult.percentile(values, 50) == 2.5
    assert SimResult.percentile(values, 0) == 2.5
    assert SimResult.percentile(values, 100 * 2 / 3) == pytest.approx(3.0)


class _TwoSpeed(ConstantStep):
    """10 ms for a step with prefill, 1 ms for a decode-only step."""

    def time(self, decode_seqs: int, decode_context: float, prefill_tokens: int, prefill_past: float,
             prefill_seqs: int, tokens_per_decode: int = 1) -> float:
        return 10e-3 if prefill_tokens else (1e-3 if decode_seqs else 0.0)


def test_lockstep_ranks_wait_for_a_peers_prefill_by_hand() -> None:
    """Two ranks in lockstep, one 3-token request each, no overheads: rank A's arrives at 0 and prefills in [0, 10]
    ms; rank B's arrives at 5 ms, waits for that step, and prefills in [10, 20] while A decodes in the same step, so
    A's second token comes at 20 ms, not 11; both then decode in 1 ms steps (A done at 21, B at 22). A: TTFT 10 ms,
    TPOT (21 - 10) / 2; B: TTFT 15 ms, TPOT 1 ms."""
    from tfcalc.calc.serving_sim import _Engine, _lockstep, _merged

    load = Workload(input_len=LengthDist(kind="fixed", mean=100), output_len=LengthDist(kind="fixed", mean=3),
                    num_requests=1, rate_per_s=1.0)
    step = _TwoSpeed(seconds=0.0)
    a, b = (_Engine(step, _cfg(8), load, [100], [3], [gap]) for gap in (0.0, 5e-3))
    _lockstep([a, b])
    r = _merged([a, b])
    assert r.ttft_s == pytest.approx((10e-3, 15e-3))
    assert r.tpot_s == pytest.approx((5.5e-3, 1e-3))
    assert r.duration_s == pytest.approx(22e-3) and r.requests == 2 and r.steps == 3 + 3
    alone = simulate(step, _cfg(8), load)   # rank A without a peer: its decodes take 1 ms
    assert alone.tpot_s == pytest.approx((1e-3,))


def test_one_lockstep_rank_is_the_plain_simulation() -> None:
    """``ranks`` = 1 is the engine alone; a rank's share of the load splits rate, clients and requests evenly."""
    from tfcalc.calc.serving_sim import _rank_share

    step = _llama_step()
    load = Workload(input_len=LengthDist(kind="lognormal", mean=800, spread=0.5),
                    output_len=LengthDist(kind="lognormal", mean=100, spread=0.5), num_requests=300, rate_per_s=8.0,
                    seed=3)
    assert simulate(step, _cfg(64, 2048), load, ranks=1) == simulate(step, _cfg(64, 2048), load)
    shares = [_rank_share(load, r, 4) for r in range(4)]
    assert sum(s.num_requests for s in shares) == 300 and {s.rate_per_s for s in shares} == {2.0}
    assert len({s.seed for s in shares}) == 4
    closed = [_rank_share(Workload(input_len=load.input_len, output_len=load.output_len, num_requests=10,
                                   concurrency=6), r, 4) for r in range(4)]
    assert [s.concurrency for s in closed] == [2, 2, 1, 1] and [s.num_requests for s in closed] == [3, 3, 2, 2]
