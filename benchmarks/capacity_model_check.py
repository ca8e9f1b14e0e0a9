"""The analytic serving model against the discrete-event simulation of the same scheduler (docs/capacity.md).

Same step-time model (the latency model with vLLM's kernels, H100 SXM), same scheduler limits, same traffic, same
overheads (vLLM's defaults, and a heavy API server; and SGLang's kernels, overheads and scheduling policy, prefill
steps of their own first); the simulation runs 3,000 requests and leaves the first and last 10 % out. Prints
analytic / simulated - 1 for TTFT mean, p50, p90, p99, TPOT mean, p90, ITL p50, p90, p99 and end-to-end p90, the API
server's utilization (model / simulation), and the closed-form limits (M/M/1, M/D/1, the API server as M/D/1).

Usage: python benchmarks/capacity_model_check.py [--lockstep | --lockstep-chunked | --fixed-lengths]
(--lockstep: data-parallel attention ranks only; --lockstep-chunked: ranks whose prompts are chunked over several
steps under vLLM's policy, fixed lengths; --fixed-lengths: one replica under fixed lengths toward its capacity, with
the spread of the prompts that arrive during a request's decode, the open gap in docs/capacity.md)
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace

from tfcalc.calc.serving import ReplicaServing, at_concurrency, at_rate
from tfcalc.calc.serving_inputs import ConstantStep, latency_step
from tfcalc.calc.serving_sim import SimConfig, Workload, simulate
from tfcalc.calc.serving_traffic import LengthDist, Overheads, engine_overheads
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.presets import load_engine, load_gpu, load_model


def constant_step(seconds: float) -> ConstantStep:
    return ConstantStep(seconds=seconds)


def closed_forms() -> None:
    tau, m, rho = 1e-3, 400, 0.5
    mu = 1 / (m * tau)
    gap = mu * (1 - rho)
    r = ReplicaServing(step=constant_step(tau), input_len=LengthDist(kind="fixed", mean=1),
                       output_len=LengthDist(kind="exponential", mean=m), max_num_seqs=1,
                       max_num_batched_tokens=8192, kv_capacity_tokens=1e12)
    p = at_rate(r, rho * mu)
    print(f"M/M/1 (rho {rho}): TTFT mean {p.ttft(0):.4f} s vs {rho / gap + tau:.4f}; TTFT p90 {p.ttft(90):.4f} vs "
          f"{math.log(rho / 0.1) / gap + tau:.4f}; E2E mean {p.e2e(0):.4f} vs {1 / gap:.4f}; E2E p99 {p.e2e(99):.4f} "
          f"vs {math.log(100) / gap:.4f}")
    d = ReplicaServing(step=constant_step(tau), input_len=LengthDist(kind="fixed", mean=1),
                       output_len=LengthDist(kind="fixed", mean=300), max_num_seqs=1, max_num_batched_tokens=8192,
                       kv_capacity_tokens=1e12)
    service = 300 * tau
    q = at_rate(d, 0.6 / service)
    print(f"M/D/1 (rho 0.6): mean wait {q.ttft(0) - tau:.4f} s vs Pollaczek-Khinchine "
          f"{0.6 * service / (2 * 0.4):.4f}")


CASES = [
    ("llama3-8b", 1, 256, 2048, LengthDist(kind="lognormal", mean=1000, spread=0.5),
     LengthDist(kind="lognormal", mean=200, spread=0.8), [2.0, 10.0, 20.0, 25.0], False),
    ("llama3-8b", 1, 64, 512, LengthDist(kind="fixed", mean=2000), LengthDist(kind="fixed", mean=300),
     [1.0, 4.0, 6.0], False),
    ("qwen3-30b-a3b", 2, 128, 8192, LengthDist(kind="uniform", mean=3000, spread=0.5),
     LengthDist(kind="uniform", mean=500, spread=0.5), [2.0, 6.0], False),
    ("llama3-70b", 4, 128, 2048, LengthDist(kind="lognormal", mean=500, spread=1.0),
     LengthDist(kind="lognormal", mean=300, spread=1.0), [8, 32, 64], True),
]


def api_closed_form() -> None:
    """The API server alone (an engine that takes no time, one-token requests): M/D/1."""
    work, rho = 2e-3, 0.7
    o = Overheads(api_request_s=work)
    r = ReplicaServing(step=constant_step(1e-9), input_len=LengthDist(kind="fixed", mean=1),
                       output_len=LengthDist(kind="fixed", mean=1), max_num_seqs=1024, max_num_batched_tokens=8192,
                       kv_capacity_tokens=1e9, overheads=o)
    p = at_rate(r, rho / work)
    sim = simulate(constant_step(1e-9), SimConfig(max_num_seqs=1024, max_num_batched_tokens=8192,
                                                  kv_capacity_tokens=10**9, overheads=o),
                   Workload(input_len=LengthDist(kind="fixed", mean=1), output_len=LengthDist(kind="fixed", mean=1),
                            num_requests=20_000, rate_per_s=rho / work, seed=4, warmup_fraction=0.05))
    exact = rho * work / (2 * (1 - rho)) + work
    print(f"API server as M/D/1 (rho {rho}): TTFT mean {p.ttft(0) * 1e3:.3f} ms (model) vs "
          f"{sim.metric('ttft', 0) * 1e3:.3f} ms (simulation) vs {exact * 1e3:.3f} ms (Pollaczek-Khinchine)")


def main() -> None:
    closed_forms()
    api_closed_form()
    vllm, sglang = load_engine("vllm"), load_engine("sglang")
    print("| model | tp | seqs / chunk | overheads | load | TTFT mean | p50 | p90 | p99 | TPOT mean | p90 | ITL p50 | "
          "p90 | p99 | E2E p90 | API util. |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    heavy = replace(engine_overheads(vllm), api_request_s=4e-3, api_token_s=150e-6)
    for name, tp, seats, budget, inputs, outputs, loads, closed in CASES:
        spec = load_model(name)
        for label, engine, overheads in (("vLLM", vllm, engine_overheads(vllm)), ("heavy API", vllm, heavy),
                                         ("SGLang", sglang, engine_overheads(sglang))):
            if label == "heavy API" and name != "llama3-8b":
                continue
            step = latency_step(spec, load_gpu("h100-sxm"), parse_weight_precision(spec.native_dtype),
                                get_dtype("bf16"), tp=tp, engine=engine)
            policy = engine.scheduler   # SGLang: prefill steps of their own, first
            r = ReplicaServing(step=step, input_len=inputs, output_len=outputs, max_num_seqs=seats,
                               max_num_batched_tokens=budget, kv_capacity_tokens=400_000, overheads=overheads,
                               policy=policy)
            for load in loads:
                p = at_concurrency(r, load) if closed else at_rate(r, load)
                if not p.stable:
                    continue
                sim = simulate(step, SimConfig(max_num_seqs=seats, max_num_batched_tokens=budget,
                                               kv_capacity_tokens=400_000, overheads=overheads,
                                               policy=policy),
                               Workload(input_len=inputs, output_len=outputs, num_requests=3000,
                                        rate_per_s=None if closed else load,
                                        concurrency=int(load) if closed else None, warmup_fraction=0.1))
                pairs = [(p.ttft(q), sim.metric("ttft", q)) for q in (0, 50, 90, 99)]
                pairs += [(p.tpot(0), sim.metric("tpot", 0)), (p.tpot(90), sim.metric("tpot", 90))]
                pairs += [(p.itl(q), sim.metric("itl", q)) for q in (50, 90, 99)]
                pairs += [(p.e2e(90), sim.metric("e2e", 90))]
                what = f"{load:g} clients" if closed else f"{load:g} req/s"
                cells = " | ".join(f"{(a / b - 1) * 100:+.0f} %" for a, b in pairs)
                util = sim.api_busy_s / sim.duration_s / overheads.api_servers
                print(f"| {name} | {tp} | {seats} / {budget} | {label} | {what} | {cells} | "
                      f"{p.api_utilization:.0%} / {util:.0%} |", flush=True)



def lockstep() -> None:
    """Data-parallel attention ranks of Qwen3-30B-A3B on H200s sharing the experts at ep = ranks, every rank
    simulated with a shared step clock (1,500 requests a rank): analytic / simulated - 1, and the same ranks priced
    alone (no lockstep) for scale."""
    print("\n| ranks | engine | req/s per rank | TTFT p50 | p90 | TPOT mean | p90 | ITL p50 | p90 | TPOT mean alone |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    spec = load_model("qwen3-30b-a3b")
    inputs = LengthDist(kind="lognormal", mean=1500, spread=0.5)
    outputs = LengthDist(kind="lognormal", mean=300, spread=0.8)
    for label in ("vLLM", "SGLang"):
        engine = load_engine(label.lower())
        budget = 2048 if label == "vLLM" else 8192
        for ranks in (2, 4, 8):
            step = latency_step(spec, load_gpu("h200"), parse_weight_precision(spec.native_dtype), get_dtype("bf16"),
                                tp=1, ep=ranks, engine=engine)
            r = ReplicaServing(step=step, input_len=inputs, output_len=outputs, max_num_seqs=256,
                               max_num_batched_tokens=budget, kv_capacity_tokens=400_000,
                               overheads=engine_overheads(engine), policy=engine.scheduler, lockstep_ranks=ranks)
            for rate in (2.0, 4.0, 6.0):
                p = at_rate(r, rate)
                if not p.stable:
                    continue
                sim = simulate(step, SimConfig(max_num_seqs=256, max_num_batched_tokens=budget,
                                               kv_capacity_tokens=400_000, overheads=r.overheads,
                                               policy=engine.scheduler),
                               Workload(input_len=inputs, output_len=outputs, num_requests=1500 * ranks,
                                        rate_per_s=rate * ranks, warmup_fraction=0.1), ranks=ranks)
                pairs = [(p.ttft(q), sim.metric("ttft", q)) for q in (50, 90)]
                pairs += [(p.tpot(q), sim.metric("tpot", q)) for q in (0, 90)]
                pairs += [(p.itl(q), sim.metric("itl", q)) for q in (50, 90)]
                pairs += [(at_rate(replace(r, lockstep_ranks=1), rate).tpot(0), sim.metric("tpot", 0))]
                cells = " | ".join(f"{(a / b - 1) * 100:+.0f} %" for a, b in pairs)
                print(f"| {ranks} | {label} | {rate:g} | {cells} |", flush=True)



CHUNKED = [  # model, ranks, budget, req/s per rank, prompt, output, KV tokens a rank
    ("qwen3-30b-a3b", 8, 512, 1.0, 2048, 300, 400_000), ("qwen3-30b-a3b", 4, 512, 2.0, 2048, 300, 400_000),
    ("qwen3-30b-a3b", 8, 512, 2.0, 2048, 300, 400_000),
    ("deepseek-v3", 8, 512, 0.15, 2048, 1024, 877_632), ("deepseek-v3", 8, 512, 0.3125, 2048, 1024, 877_632),
    ("deepseek-v3", 8, 512, 0.6, 2048, 1024, 877_632), ("deepseek-v3", 4, 512, 0.3125, 2048, 1024, 877_632),
    ("deepseek-v3", 2, 512, 0.5, 2048, 1024, 877_632), ("deepseek-v3", 4, 1024, 0.4, 2048, 1024, 877_632),
]


def lockstep_chunked() -> None:
    """Data-parallel attention ranks under vLLM's policy with prompts several times the room beside the decodes
    (H200s, ep = ranks, fp8 KV, 128 seats, 250 requests a rank): analytic / simulated - 1."""
    print("\n| model | ranks | budget | req/s per rank | TTFT p50 | p90 | TPOT mean | p90 |")
    print("|---|---|---|---|---|---|---|---|")
    engine = load_engine("vllm")
    for name, ranks, budget, rate, prompt, output, kv in CHUNKED:
        spec = load_model(name)
        step = latency_step(spec, load_gpu("h200"), parse_weight_precision(spec.native_dtype), get_dtype("fp8"),
                            tp=1, ep=ranks, engine=engine)
        inputs, outputs = LengthDist(kind="fixed", mean=prompt), LengthDist(kind="fixed", mean=output)
        r = ReplicaServing(step=step, input_len=inputs, output_len=outputs, max_num_seqs=128,
                           max_num_batched_tokens=budget, kv_capacity_tokens=kv, overheads=engine_overheads(engine),
                           policy=engine.scheduler, lockstep_ranks=ranks)
        p = at_rate(r, rate)
        sim = simulate(step, SimConfig(max_num_seqs=128, max_num_batched_tokens=budget, kv_capacity_tokens=kv,
                                       overheads=r.overheads, policy=engine.scheduler),
                       Workload(input_len=inputs, output_len=outputs, num_requests=250 * ranks,
                                rate_per_s=rate * ranks, warmup_fraction=0.1), ranks=ranks)
        pairs = [(p.ttft(q), sim.metric("ttft", q)) for q in (50, 90)] + [(p.tpot(q), sim.metric("tpot", q))
                                                                          for q in (0, 90)]
        cells = " | ".join(f"{(a / b - 1) * 100:+.0f} %" for a, b in pairs)
        print(f"| {name} | {ranks} | {budget} | {rate:g} | {cells} |", flush=True)


def fixed_lengths() -> None:
    """Qwen3-30B-A3B fp8 on one H200 (vLLM, 256 seats, 8,192-token budget), 2,000 / 300 fixed lengths, toward its
    capacity: analytic / simulated - 1, and in the simulation the standard deviation of the prompts that arrive during
    a request's decode against a Poisson count's (the request's life stretches with the prefill work arriving in it)."""
    import bisect
    import statistics

    from tfcalc.calc.serving_inputs import replica_memory
    from tfcalc.calc.serving_sim import _engine

    spec, engine, gpu = load_model("qwen3-30b-a3b"), load_engine("vllm"), load_gpu("h200")
    precision, kv = parse_weight_precision("fp8"), get_dtype("fp8")
    step = latency_step(spec, gpu, precision, kv, tp=1, engine=engine)
    memory = replica_memory(spec, gpu, precision, kv, tp=1, pp=1, ep=1, engine=engine, max_model_len=3072,
                            max_num_seqs=256, max_num_batched_tokens=8192)
    inputs, outputs = LengthDist(kind="fixed", mean=2000), LengthDist(kind="fixed", mean=300)
    r = ReplicaServing(step=step, input_len=inputs, output_len=outputs, max_num_seqs=256, max_num_batched_tokens=8192,
                       kv_capacity_tokens=memory.kv_capacity_tokens, block_size=memory.block_size,
                       overheads=engine_overheads(engine), policy=engine.scheduler)
    cfg = SimConfig(max_num_seqs=256, max_num_batched_tokens=8192, kv_capacity_tokens=memory.kv_capacity_tokens,
                    block_size=memory.block_size, overheads=r.overheads, policy=engine.scheduler)
    print("\n| req/s | TTFT p50 | p90 | TPOT mean | p90 | prompts during a decode: sd / Poisson sd |")
    print("|---|---|---|---|---|---|")
    for rate in (10.0, 12.0, 14.0, 16.0):
        p = at_rate(r, rate)
        sim = _engine(step, cfg, Workload(input_len=inputs, output_len=outputs, num_requests=3000, rate_per_s=rate,
                                          warmup_fraction=0.1))
        result = sim.run(True)
        arrivals = sorted(s.arrival for s in sim.done)
        counts = [bisect.bisect(arrivals, s.last_token) - bisect.bisect(arrivals, s.first_token)
                  for s in sim.done if s.kept]
        spread = statistics.pstdev(counts) / statistics.mean(counts) ** 0.5
        pairs = [(p.ttft(q), result.metric("ttft", q)) for q in (50, 90)] + [(p.tpot(q), result.metric("tpot", q))
                                                                             for q in (0, 90)]
        cells = " | ".join(f"{(a / b - 1) * 100:+.0f} %" for a, b in pairs)
        print(f"| {rate:g} | {cells} | {spread:.1f} |", flush=True)

if __name__ == "__main__":
    if "--lockstep" in sys.argv:
        lockstep()
    elif "--lockstep-chunked" in sys.argv:
        lockstep_chunked()
    elif "--fixed-lengths" in sys.argv:
        fixed_lengths()
    else:
        main()
