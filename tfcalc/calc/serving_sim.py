"""Discrete-event simulation of a serving engine: its API server(s) and its continuous-batching scheduler (vLLM V1's
policy), step by step.

API server (a serial resource; ``Overheads.api_*``): each request is pinned to one of ``api_servers`` servers (round
robin); the server runs its tasks first come first served -- a request's own work (HTTP, template, tokenization) when
it is sent, and one chunk of work per engine step that gives the request tokens (detokenize, stream). A request
reaches the engine's queue ``request_s`` (+ per prompt token) after its own work is done; a token reaches the client
``stream_s`` after its chunk is done. The engine never waits for the API server (vLLM's output queue), so a slow
server delays what the client sees and, in a closed loop, when the next request is sent.

Engine step: every running sequence is scheduled first, in admission order (one decode token, k + 1 when verifying k
speculative tokens, or the next prefill chunk of a partly prefilled prompt), within the token budget C
(max_num_batched_tokens); then waiting requests, first come first served, while the budget, the max_num_seqs seats
and the KV blocks allow -- a chunk of the head's prompt where the rest of the budget is short, or, without chunked
prefill (``SchedulerPolicy.chunked_prefill``; TensorRT-LLM's default), only a whole prompt, the head waiting otherwise.
With ``SchedulerPolicy.prefill_first`` (SGLang without ``--enable-mixed-chunk``) a step is either a prefill batch or a
decode batch: whenever a prompt (or the rest of a partly prefilled one) can be admitted, the step carries prefill
chunks only; otherwise every running sequence decodes, with no token budget. ``max_prefill_tokens`` (SGLang's, less
the step's decode tokens) admits a prompt after the step's first prefill work only while it is smaller than what
that cap leaves (SGLang's PrefillAdder); the budget still chunks the one that overflows it. ``reserve_output``
(SGLang) admits a prompt only while the rest of it plus its output (at most 4,096 tokens) fits in the free KV
tokens less the running requests' remaining outputs times SGLang's decaying ratio (constants below).
KV blocks are allocated on demand, block_size tokens at a time; when a running sequence cannot grow, the most
recently admitted one is preempted (its blocks freed; it re-prefills prompt + generated tokens later, vLLM's
recompute preemption). The step takes the step source's time for its mix (decoding sequences at their
mean context, prefill chunks at their mean length and past); tokens are emitted at the step's end.

Runs of decode-only steps during which nothing can change the batch (no request finishes, none waits to be admitted,
no block boundary can run the pool dry, no sequence crosses a sliding window) are advanced with scalar arithmetic
instead of per-sequence bookkeeping (``fast_forward``): step durations in closed form on linear pieces, the API
servers' queue per step, a sequence's own work only at the run's ends. tests/calc/test_serving_sim.py checks it
against the plain per-step loop and a brute-force reference, and the whole simulation against M/M/1, M/D/1 and M/G/inf
closed forms. Pure math: no I/O.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tfcalc.calc.serving import (
    CLIP_MAX_NEW_TOKENS,
    RATIO_DECAY,
    RATIO_INIT,
    RATIO_MIN,
    RETRACT_DECODE_STEPS,
    SpecDecoding,
)
from tfcalc.calc.serving_inputs import StepSource
from tfcalc.calc.serving_traffic import LengthDist, Overheads
from tfcalc.spec.engine import SchedulerPolicy


@dataclass(eq=False)
class _Seq:
    index: int
    arrival: float               # sent by the client
    prompt: int
    output: int
    cached: int
    server: int
    kept: bool                   # counted in the statistics (outside the warm-up / cool-down share)
    ready: float = 0.0           # in the engine's queue
    length: int = 0              # tokens whose KV is held (computed)
    target: int = 0              # tokens to compute before the next output token (prompt, or more after preemption)
    generated: int = 0
    blocks: int = 0
    first_token: float = -1.0    # delivered to the client (before stream_s)
    last_token: float = -1.0
    preempted: int = 0
    failed: bool = False
    active: bool = False         # in the running list


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int
    block_size: int = 16
    overheads: Overheads = field(default_factory=Overheads)
    spec: SpecDecoding | None = None
    policy: SchedulerPolicy = SchedulerPolicy()   # how the scheduler fills a step (chunks, prefill first, caps)


def weighted_percentile(values: tuple[float, ...], weights: tuple[float, ...], p: float) -> float:
    """The p-th percentile of values with weights (the smallest value whose cumulative weight reaches p %); p=0: the
    weighted mean."""
    if not values:
        return math.nan
    total = sum(weights)
    if p == 0:
        return sum(v * w for v, w in zip(values, weights, strict=True)) / total
    acc = 0.0
    goal = p / 100 * total
    for v, w in sorted(zip(values, weights, strict=True)):
        acc += w
        if acc >= goal - 1e-9 * total:
            return v
    return max(values)


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """Per-request latencies (seconds) of the measured requests, inter-token gaps, and totals over the whole run."""

    ttft_s: tuple[float, ...]
    tpot_s: tuple[float, ...]
    e2e_s: tuple[float, ...]
    itl_s: tuple[float, ...]
    itl_weights: tuple[float, ...]
    duration_s: float
    requests: int
    input_tokens: int
    output_tokens: int
    steps: int
    preemptions: int
    mean_batch: float
    api_busy_s: float = 0.0

    @staticmethod
    def percentile(values: tuple[float, ...], p: float) -> float:
        """Percentile by linear interpolation between order statistics (numpy's default); p=0: the mean."""
        if not values:
            return math.nan
        if p == 0:
            return sum(values) / len(values)
        ordered = sorted(values)
        pos = (len(ordered) - 1) * p / 100
        lo = math.floor(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    def metric(self, metric: str, p: float) -> float:
        if metric == "itl":
            return weighted_percentile(self.itl_s, self.itl_weights, p)
        return self.percentile(getattr(self, f"{metric}_s"), p)

    @property
    def request_throughput(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def total_throughput(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Requests to simulate: open loop (Poisson at ``rate_per_s``) or closed loop (``concurrency`` clients)."""

    input_len: LengthDist
    output_len: LengthDist
    num_requests: int
    rate_per_s: float | None = None
    concurrency: int | None = None
    prefix_hit_ratio: float = 0.0
    seed: int = 0
    warmup_fraction: float = 0.0   # share of the first (and last) requests left out of the statistics
    start_spread_s: float = 0.0    # closed loop: each client's first request at a random time in [0, this)


def simulate(step: StepSource, cfg: SimConfig, load: Workload, fast_forward: bool = True,
             ranks: int = 1) -> SimResult:
    """Run ``load`` through the API servers and the scheduler; latencies of the requests outside the warm-up /
    cool-down share. ``ranks`` > 1: that many data-parallel attention ranks in lockstep (SGLang's
    --enable-dp-attention, TensorRT-LLM's enable_attention_dp), each serving its share of ``load`` (the rate, the
    clients and the requests split evenly; its own draws) with its own scheduler, KV pool and API server; every step
    lasts as long as the slowest rank's (the ranks meet in the experts' all-to-all every layer), and a rank whose
    work arrives mid-step starts with the next one."""
    if ranks <= 1:
        return _engine(step, cfg, load).run(fast_forward)
    engines = [_engine(step, cfg, share) for share in (_rank_share(load, r, ranks) for r in range(ranks))
               if share.num_requests > 0 and share.concurrency != 0]
    _lockstep(engines, fast_forward)
    return _merged(engines)


def _engine(step: StepSource, cfg: SimConfig, load: Workload) -> _Engine:
    rng = random.Random(load.seed)  # noqa: S311 - a seeded simulation, not cryptography
    n = load.num_requests
    prompts = [load.input_len.sample(rng) for _ in range(n)]
    outputs = [load.output_len.sample(rng) for _ in range(n)]
    gaps = [rng.expovariate(1.0) for _ in range(n)]
    return _Engine(step, cfg, load, prompts, outputs, gaps)


def _rank_share(load: Workload, rank: int, ranks: int) -> Workload:
    """Rank ``rank``'s share of ``load``: 1 / ``ranks`` of the rate, and of the requests and clients (the first
    ones take the remainder), with draws of its own."""
    def split(n: int) -> int:
        return n // ranks + (rank < n % ranks)

    return replace(load, num_requests=split(load.num_requests),
                   rate_per_s=load.rate_per_s / ranks if load.rate_per_s is not None else None,
                   concurrency=split(load.concurrency) if load.concurrency is not None else None,
                   seed=load.seed + 7919 * rank)


def _lockstep(engines: list[_Engine], fast_forward: bool = True) -> None:
    """Every engine's steps in lockstep: each rank with work plans its step, all of them end together after the
    longest; an idle rank waits (its requests arriving during a step start with the next). Where every rank with
    work only decodes and none can admit, and no idle rank's request is due, the ranks advance together in closed
    form (``_lockstep_run``)."""
    for e in engines:
        e._start()
    t = 0.0
    while True:
        live = [e for e in engines if len(e.done) < e.load.num_requests]
        if not live:
            return
        busy = [e for e in live if e._arrive(t)]
        if fast_forward and busy:
            end = _lockstep_run(live, busy, t)
            if end is not None:
                t = end
                continue
        plans = []
        for e in busy:
            plan = e._plan(t)
            if plan is not None:
                plans.append((e, plan))
        if not plans:
            if not any(e.running or e.waiting for e in live):   # else a head failed: schedule again at t
                t = min(e._idle_until(t) for e in live)
            continue
        end = t + max(dt for _, (_, dt, _) in plans)
        for e, (scheduled, _, k1) in plans:
            e._commit(scheduled, k1, end)
        t = end


def _lockstep_run(live: list[_Engine], busy: list[_Engine], t: float) -> float | None:
    """A decode-only run of every busy rank together from ``t``, each step as long as the slowest rank's (the
    single-rank run's limits, the fewest steps of any rank, stopped by the first request that could change a rank's
    next step, an idle rank's included); its end, or None where the next step must run the general path."""
    limits = []
    for e in busy:
        if not (e._decode_only() and e._admission_blocked()):
            return None
        limit = e._decode_run_limit()
        if limit is None:
            return None
        limits.append(limit)
    k = min(steps for steps, _ in limits)
    stop = min(until for _, until in limits)
    for e in live:
        if not (e.running or e.waiting):   # an idle rank starts its next request with the step after it is ready
            stop = min(stop, e._next_change())
    times = [e._decode_step_time() for e in busy]

    def duration(j: int) -> float:
        return max(time(j) for time in times)

    _, pieces = _advance(duration, k, t, stop)
    ends = _step_ends(pieces, t)
    for e in busy:
        e._commit_decode_run(ends)
    return ends[-1]


def _merged(engines: list[_Engine]) -> SimResult:
    """One result of several ranks: their requests pooled, the run from the first arrival to the last token."""
    parts = [e._result() for e in engines]
    o = engines[0].cfg.overheads
    served = [s for e in engines for s in e.done if not s.failed]
    start = min((s.arrival for s in served), default=0.0)
    end = max((s.last_token for s in served), default=-o.stream_s) + o.stream_s
    steps = sum(e.steps for e in engines)

    def pooled(name: str) -> tuple[float, ...]:
        return tuple(x for r in parts for x in getattr(r, name))

    return SimResult(ttft_s=pooled("ttft_s"), tpot_s=pooled("tpot_s"), e2e_s=pooled("e2e_s"), itl_s=pooled("itl_s"),
                     itl_weights=pooled("itl_weights"), duration_s=end - start if served else 0.0,
                     requests=sum(r.requests for r in parts), input_tokens=sum(r.input_tokens for r in parts),
                     output_tokens=sum(r.output_tokens for r in parts), steps=steps,
                     preemptions=sum(r.preemptions for r in parts),
                     mean_batch=sum(e.batch_sum for e in engines) / max(steps, 1),
                     api_busy_s=sum(r.api_busy_s for r in parts))


class _Engine:
    def __init__(self, step: StepSource, cfg: SimConfig, load: Workload, prompts: list[int], outputs: list[int],
                 gaps: list[float]) -> None:
        self.step, self.cfg, self.load = step, cfg, load
        self.kv = step.kv
        self.prompts, self.outputs, self.gaps = prompts, outputs, gaps
        self.total_blocks = cfg.kv_capacity_tokens // cfg.block_size
        self.free_blocks = self.total_blocks
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.sends: list[tuple[float, int]] = []      # heap of (send time, index): not yet through the API server
        self.arrivals: list[tuple[float, int, _Seq]] = []   # heap of (ready time, index, sequence)
        self.done: list[_Seq] = []
        self.sent = 0
        self.preemptions = 0
        self.steps = 0
        self.batch_sum = 0.0
        o = cfg.overheads
        self.api_free = [0.0] * o.api_servers
        self.api_busy = 0.0
        self.chunk_s = o.api_token_s
        skip = int(load.warmup_fraction * load.num_requests)
        self.kept = range(skip, load.num_requests - skip)
        self.itl: list[float] = []
        self.itl_weight: list[float] = []
        self.rng = random.Random(load.seed + 1)  # noqa: S311 - a seeded simulation
        self.ratio = RATIO_INIT   # SGLang's new_token_ratio (``SchedulerPolicy.reserve_output``)

    # --- requests and the API servers -----------------------------------------------------------------------
    def _send(self, t: float) -> None:
        i = self.sent
        self.sent += 1
        heapq.heappush(self.sends, (t, i))
        if not self.chunk_s:   # no chunk work to interleave with: the order of requests alone decides
            self._resolve_one()

    def _resolve_one(self) -> None:
        """The next sent request through its API server (first come first served with the streamed chunks)."""
        t, i = heapq.heappop(self.sends)
        o = self.cfg.overheads
        prompt = self.prompts[i]
        server = i % o.api_servers
        work = o.api_request_s + o.api_input_token_s * prompt
        start = max(self.api_free[server], t)
        self.api_free[server] = start + work
        self.api_busy += work
        cached = min(int(self.load.prefix_hit_ratio * prompt), prompt - 1)
        seq = _Seq(i, t, prompt, self.outputs[i], cached, server, i in self.kept)
        seq.ready = start + work + o.front_s(prompt)
        seq.length = cached
        seq.target = prompt
        heapq.heappush(self.arrivals, (seq.ready, i, seq))

    def _resolve_sends(self, t: float) -> None:
        while self.sends and self.sends[0][0] <= t:
            self._resolve_one()

    def _deliver(self, seq: _Seq, t: float) -> float:
        """One streamed chunk of ``seq`` produced at engine time ``t``: when its server finishes it."""
        if not self.chunk_s:   # no chunk work: the server never holds a token back
            return t
        server = seq.server
        start = self.api_free[server]
        if start < t:
            start = t
        done = start + self.chunk_s
        self.api_free[server] = done
        self.api_busy += self.chunk_s
        return done

    def _units(self, tokens: int, state: bool = True) -> int:
        """Blocks a sequence of ``tokens`` held tokens occupies (window caps applied per layer; its fixed state
        included unless ``state`` is false)."""
        if not self.kv.windows and not self.kv.state_layers and not self.kv.state_units:
            return -(-tokens // self.cfg.block_size)
        return math.ceil(self.kv.units(tokens, state) / self.cfg.block_size)

    def _blocks_needed(self, seq: _Seq, tokens: int) -> int:
        """Blocks ``seq`` must add to hold ``tokens`` more (its cached prefix's blocks are shared, not its own; its
        fixed state is its own)."""
        if self.kv.windows or self.kv.state_layers or self.kv.state_units:
            return max(self._units(seq.length + tokens) - self._units(seq.cached, state=False), 0) - seq.blocks
        size = self.cfg.block_size   # no windows: _units' ceilings inlined (this runs once per sequence and step)
        need = -(-(seq.length + tokens) // size) + (-seq.cached // size)
        return (need if need > 0 else 0) - seq.blocks

    # --- the loop ------------------------------------------------------------------------------------------
    def run(self, fast_forward: bool) -> SimResult:
        self._start()
        n = self.load.num_requests
        t = 0.0
        while len(self.done) < n:
            if not self._arrive(t):
                t = self._idle_until(t)
                continue
            if fast_forward and self._decode_only() and self._admission_blocked():
                t = self._fast_forward(t)
            else:
                t = self._one_step(t)
        return self._result()

    def _start(self) -> None:
        """The first requests sent: every client's (closed loop), or all of them at their Poisson times."""
        load = self.load
        n = load.num_requests
        if load.concurrency is not None:
            phases = random.Random(load.seed + 2)  # noqa: S311 - a seeded simulation
            for start in sorted(phases.uniform(0.0, load.start_spread_s) for _ in range(min(load.concurrency, n))):
                self._send(start)   # in time order: the API servers take requests as they are sent
        else:
            rate = load.rate_per_s or 1.0
            clock = 0.0
            for i in range(n):
                clock += self.gaps[i] / rate
                self._send(clock)

    def _arrive(self, t: float) -> bool:
        """Requests sent by ``t`` through their API server, those ready by ``t`` into the queue; whether the engine
        has work (idle: SGLang resets its estimate)."""
        self._resolve_sends(t)
        while self.arrivals and self.arrivals[0][0] <= t:
            self.waiting.append(heapq.heappop(self.arrivals)[2])
        if self.running or self.waiting:
            return True
        self.ratio = RATIO_INIT
        return False

    def _idle_until(self, t: float) -> float:
        """An idle engine: when its next request is ready."""
        if not self.arrivals:
            self._resolve_one()
        while self.sends and self.sends[0][0] <= self.arrivals[0][0]:
            self._resolve_one()
        return max(t, self.arrivals[0][0])

    def _decode_only(self) -> bool:
        return bool(self.running) and all(s.length >= s.target for s in self.running)

    def _admission_blocked(self) -> bool:
        """No waiting request could be admitted at the next step (none waits, or no seat/budget/blocks)."""
        if not self.waiting:
            return True
        cfg = self.cfg
        running = len(self.running)
        room = cfg.max_num_batched_tokens if cfg.policy.prefill_first else cfg.max_num_batched_tokens - running
        if running >= cfg.max_num_seqs or room <= 0:
            return True
        if cfg.policy.reserve_output:   # the reservation changes every step: step plainly while a request could join
            return False
        head = self.waiting[0]
        if not cfg.policy.chunked_prefill and head.target - head.length > room:
            return True
        want = min(head.target - head.length, room)
        return self._blocks_needed(head, want) > self.free_blocks

    def _schedule_running(self, budget: float, k1: int, prefill: bool, decode: bool
                          ) -> tuple[list[tuple[_Seq, int, bool]], bool]:
        """The running sequences' share of a step, in admission order within ``budget`` tokens: the next chunk of
        each partly prefilled one (``prefill``) and each decoding one's k1 tokens (``decode``); a sequence that
        cannot grow preempts the most recently admitted. Returns (scheduled, whether it preempted)."""
        scheduled: list[tuple[_Seq, int, bool]] = []   # (sequence, tokens, is a prefill chunk)
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            is_prefill = seq.length < seq.target
            if not (prefill if is_prefill else decode):
                i += 1
                continue
            want = int(min(seq.target - seq.length, budget)) if is_prefill else int(min(k1, budget))
            need = self._blocks_needed(seq, want)
            while need > self.free_blocks and seq.active:
                self._preempt(self.running[-1])
                preempted = True
                need = self._blocks_needed(seq, want)
            if not seq.active:
                break
            self._allocate(seq, want, need)
            scheduled.append((seq, want, is_prefill))
            budget -= want
            i += 1
        return scheduled, preempted

    def _admit(self, scheduled: list[tuple[_Seq, int, bool]]) -> list[tuple[_Seq, int, bool]]:
        """Waiting requests admitted to a step that holds ``scheduled``, first come first served while the budget,
        the seats and the KV blocks allow; with ``max_prefill_tokens`` (SGLang's, less the step's decode tokens)
        a prompt after the step's first prefill work only while smaller than what that cap leaves."""
        cfg = self.cfg
        if not self.waiting or len(self.running) >= cfg.max_num_seqs:
            return []
        budget = cfg.max_num_batched_tokens - sum(want for _, want, _ in scheduled)
        taken = sum(want for _, want, prefill in scheduled if prefill)
        cap = cfg.policy.max_prefill_tokens
        room = None if cap is None else cap - _decode_tokens(scheduled)
        spare = self._unreserved_tokens() if cfg.policy.reserve_output else 0.0
        admitted: list[tuple[_Seq, int, bool]] = []
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            rest = seq.target - seq.length
            if not cfg.policy.chunked_prefill and rest > budget:
                break   # first come first served: the head waits for a step with room for all of its prompt
            if room is not None and taken and rest >= room - taken:
                break
            if cfg.policy.reserve_output:
                claim = rest + min(seq.output - seq.generated, CLIP_MAX_NEW_TOKENS)
                if claim >= spare:
                    break
                spare -= claim
            want = min(rest, budget)
            need = self._blocks_needed(seq, want)
            if need > self.free_blocks:
                break
            self.waiting.popleft()
            self.running.append(seq)
            seq.active = True
            self._allocate(seq, want, need)
            admitted.append((seq, want, True))
            budget -= want
            taken += want
        return admitted

    def _unreserved_tokens(self) -> float:
        """Free KV tokens less the running requests' reservation, min(remaining output, 4096) x the ratio."""
        reserved = sum(min(s.output - s.generated, CLIP_MAX_NEW_TOKENS) for s in self.running)
        return self.free_blocks * self.cfg.block_size - self.ratio * reserved

    def _retract_ratio(self) -> float:
        """SGLang's estimate after a retraction, over the requests still running."""
        decoded = sum(s.generated for s in self.running)
        outputs = sum(s.output for s in self.running)
        return min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / (outputs + 1))

    def _one_step(self, t: float) -> float:
        """Schedule and run one step the way the engine does; returns the time at its end."""
        plan = self._plan(t)
        if plan is None:
            return t
        scheduled, dt, k1 = plan
        self._commit(scheduled, k1, t + dt)
        return t + dt

    def _plan(self, t: float) -> tuple[list[tuple[_Seq, int, bool]], float, int] | None:
        """The next step's schedule (sequence, tokens, is a prefill chunk), its duration with the step overhead and
        the tokens a decode verifies (k + 1); None where nothing can run and the waiting head failed instead."""
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        k1 = cfg.spec.num_tokens + 1 if cfg.spec else 1
        scheduled, preempted = self._schedule_running(budget, k1, prefill=True, decode=not cfg.policy.prefill_first)
        if not preempted:
            scheduled += self._admit(scheduled)
        if not scheduled and cfg.policy.prefill_first:
            scheduled, retracted = self._schedule_running(math.inf, k1, prefill=False, decode=True)
            preempted = preempted or retracted
        if cfg.policy.reserve_output and scheduled:
            if preempted:
                self.ratio = self._retract_ratio()
            elif not any(prefill for _, _, prefill in scheduled):   # a decode batch
                self.ratio = max(self.ratio - RATIO_DECAY, RATIO_MIN)
        if not scheduled:
            # Nothing can run: the waiting head needs more blocks than the whole pool. It fails, and in a closed
            # loop its client sends the next request, as on any error.
            seq = self.waiting.popleft()
            seq.failed = True
            self.done.append(seq)
            self._client_sends_next(t)
            return None
        decode_seqs = prefill_seqs = prefill_tokens = 0
        decode_context = prefill_past = 0.0
        for seq, want, prefill in scheduled:
            start = seq.length - want
            if prefill:
                prefill_seqs += 1
                prefill_tokens += want
                prefill_past += start
            else:
                decode_seqs += 1
                decode_context += start + 1
        step = self.step.time
        mean_context = decode_context / decode_seqs if decode_seqs else 0.0
        dt = step(decode_seqs, mean_context, prefill_tokens, prefill_past / prefill_seqs if prefill_seqs else 0.0,
                  prefill_seqs, k1)
        if cfg.spec and decode_seqs:
            dt += cfg.spec.num_tokens * cfg.spec.draft_cost * step(decode_seqs, mean_context, 0, 0.0, 0, 1)
        return scheduled, dt + cfg.overheads.step_s, k1

    def _commit(self, scheduled: list[tuple[_Seq, int, bool]], k1: int, t: float) -> None:
        """The step of ``scheduled`` ends at ``t``: its tokens are emitted."""
        self.steps += 1
        self.batch_sum += sum(not prefill for _, _, prefill in scheduled)   # decoding sequences
        self._resolve_sends(t)   # requests sent during the step reach their server before its chunks
        for seq, want, prefill in scheduled:
            if prefill:
                if seq.length >= seq.target:
                    self._emit(seq, 1, t)
            else:
                accepted = self._accepted(k1)
                if accepted < want:   # rejected draft tokens leave the cache
                    seq.length -= want - accepted
                self._emit(seq, accepted, t)

    def _accepted(self, k1: int) -> int:
        spec = self.cfg.spec
        if spec is None:
            return 1
        accepted = 1
        while accepted < k1 and self.rng.random() < spec.acceptance:
            accepted += 1
        return accepted

    def _emit(self, seq: _Seq, tokens: int, t: float) -> None:
        delivered = self._deliver(seq, t)
        if seq.first_token < 0:
            seq.first_token = delivered
        elif seq.kept:
            self.itl.append(delivered - seq.last_token)
            self.itl_weight.append(1.0)
        seq.generated = min(seq.generated + tokens, seq.output)
        seq.last_token = delivered
        seq.target = seq.length
        if seq.generated >= seq.output:
            self._finish(seq)

    def _finish(self, seq: _Seq) -> None:
        self.running.remove(seq)
        seq.active = False
        self.free_blocks += seq.blocks
        seq.blocks = 0
        self.done.append(seq)
        self._client_sends_next(seq.last_token + self.cfg.overheads.stream_s)

    def _client_sends_next(self, t: float) -> None:
        """Closed loop: the client whose request ended (answered, or failed) sends its next one at ``t``."""
        if self.load.concurrency is not None and self.sent < self.load.num_requests:
            self._send(t)

    def _allocate(self, seq: _Seq, tokens: int, need: int) -> None:
        """``seq`` computes ``tokens`` more, taking the ``need`` blocks ``_blocks_needed`` counted for them."""
        self.free_blocks -= need
        seq.blocks += need
        seq.length += tokens

    def _preempt(self, seq: _Seq) -> None:
        self.running.remove(seq)
        seq.active = False
        self.free_blocks += seq.blocks
        seq.blocks = 0
        seq.length = seq.cached
        seq.target = seq.prompt + seq.generated
        seq.preempted += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    # --- decode-only runs ------------------------------------------------------------------------------------
    def _fast_forward(self, t: float) -> float:
        """Steps in which every running sequence decodes one token and nothing else can change, advanced with
        scalar arithmetic; stops before a step where a sequence finishes, a block could be missing, a request
        becomes ready (or is sent, when it could be admitted), or a sliding window fills."""
        run = self._decode_run_limit()
        if run is None:
            return self._one_step(t)
        k, stop = run
        _, pieces = _advance(self._decode_step_time(), k, t, stop)
        ends = _step_ends(pieces, t)
        self._commit_decode_run(ends)
        return ends[-1]

    def _decode_run_limit(self) -> tuple[int, float] | None:
        """(the most decode-only steps that may run from here, the time by which the run must stop: a request that
        could be admitted becoming ready or sent), or None where the next step must run the general path."""
        cfg = self.cfg
        running = self.running
        if cfg.spec is not None or len(running) > cfg.max_num_batched_tokens:
            return None
        kv = self.kv
        k = min(s.output - s.generated for s in running) - 1   # the finishing step runs the general path
        for s in running:
            for _, window in kv.windows:
                if s.length + 1 < window:
                    k = min(k, window - s.length - 1)
        if k >= 1:
            need = sum(self._blocks_needed(s, k) for s in running)
            while need > self.free_blocks and k > 1:
                k //= 2
                need = sum(self._blocks_needed(s, k) for s in running)
            if need > self.free_blocks:
                k = 0
        if k < 1:
            return None
        return k, self._next_change() if self._could_admit_later() else math.inf

    def _next_change(self) -> float:
        """When the next request becomes ready or is sent (inf: none pending)."""
        stop = self.arrivals[0][0] if self.arrivals else math.inf
        return min(stop, self.sends[0][0]) if self.sends else stop

    def _decode_step_time(self) -> Callable[[int], float]:
        """Step j of a decode-only run from here: every running sequence decodes, the mean context grown by j."""
        b = len(self.running)
        context = sum(s.length + 1 for s in self.running) / b
        step_time, overhead = self.step.time, self.cfg.overheads.step_s

        def duration(j: int) -> float:
            return step_time(b, context + j, 0, 0.0, 0, 1) + overhead

        return duration

    def _commit_decode_run(self, ends: list[float]) -> None:
        """A decode-only run of ``len(ends)`` steps ending at ``ends``: tokens streamed, blocks allocated."""
        running = self.running
        done = len(ends)
        self.steps += done
        self.batch_sum += len(running) * done
        self.ratio = max(self.ratio - done * RATIO_DECAY, RATIO_MIN)
        self._stream_run(ends)
        for s in running:
            self._allocate(s, done, self._blocks_needed(s, done))
            s.generated += done
            s.target = s.length

    def _stream_run(self, ends: list[float]) -> None:
        """The chunks of a decode-only run through the API servers: one bulk per step, in running order, sent
        requests resolved in time order between them; inter-token gaps recorded per server and step."""
        running = self.running
        servers = len(self.api_free)
        counts = [0] * servers
        kept = [0] * servers
        for s in running:
            counts[s.server] += 1
            kept[s.server] += s.kept
        chunk = self.chunk_s
        starts = [0.0] * servers
        previous = [0.0] * servers
        for j, t_j in enumerate(ends):
            if self.sends and self.sends[0][0] <= t_j:
                self._resolve_sends(t_j)
            for server in range(servers):
                if not counts[server]:
                    continue
                start = self.api_free[server] if chunk else t_j
                if start < t_j:
                    start = t_j
                starts[server] = start
                self.api_free[server] = start + counts[server] * chunk
                if j and kept[server]:
                    self.itl.append(start - previous[server])
                    self.itl_weight.append(float(kept[server]))
                previous[server] = start
            if j == 0:
                position = [0] * servers
                for s in running:
                    delivered = starts[s.server] + (position[s.server] + 1) * chunk
                    position[s.server] += 1
                    if s.kept:
                        self.itl.append(delivered - s.last_token)
                        self.itl_weight.append(1.0)
        self.api_busy += len(ends) * len(running) * chunk
        position = [0] * servers
        for s in running:
            position[s.server] += 1
            s.last_token = starts[s.server] + position[s.server] * chunk

    def _could_admit_later(self) -> bool:
        """Whether a request becoming ready could change the next step (a free seat and budget)."""
        cfg = self.cfg
        if cfg.policy.prefill_first:   # a prefill batch has the whole budget
            return len(self.running) < cfg.max_num_seqs
        return len(self.running) < min(cfg.max_num_seqs, cfg.max_num_batched_tokens)

    def _result(self) -> SimResult:
        o = self.cfg.overheads
        ordered = sorted((s for s in self.done if not s.failed), key=lambda s: s.index)
        kept = [s for s in ordered if s.kept]
        ttft = tuple(s.first_token + o.stream_s - s.arrival for s in kept)
        tpot = tuple((s.last_token - s.first_token) / (s.output - 1) for s in kept if s.output > 1)
        e2e = tuple(s.last_token + o.stream_s - s.arrival for s in kept)
        start = min((s.arrival for s in ordered), default=0.0)   # every request failed: an empty run
        end = max(s.last_token for s in ordered) + o.stream_s if ordered else 0.0
        return SimResult(ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, itl_s=tuple(self.itl), itl_weights=tuple(self.itl_weight),
                         duration_s=end - start, requests=len(ordered),
                         input_tokens=sum(s.prompt for s in ordered), output_tokens=sum(s.output for s in ordered),
                         steps=self.steps, preemptions=self.preemptions,
                         mean_batch=self.batch_sum / max(self.steps, 1), api_busy_s=self.api_busy)


Piece = tuple[int, int, float, float]   # (first step, steps, duration of the first, duration of the last)


def _decode_tokens(scheduled: list[tuple[_Seq, int, bool]]) -> int:
    """Decode tokens in a step's schedule (sequence, tokens, is a prefill chunk)."""
    return sum(want for _, want, prefill in scheduled if not prefill)


def _advance(duration: Callable[[int], float], k: int, t: float, stop: float) -> tuple[int, list[Piece]]:
    """Run steps j = 0..k-1 of the given durations from time t, stopping after the first step that ends at or after
    ``stop``: (steps run, the run as linear pieces). A step's duration is piecewise linear in j (the context grows
    by one a step); where it equals its chord at two interior points of an interval it is taken as linear there and
    the interval sums in closed form; elsewhere the interval is halved."""
    done = 0
    pieces: list[Piece] = []
    stack = [(0, k)]
    while stack:
        lo, hi = stack.pop()
        n = hi - lo
        if n <= 8:
            for j in range(lo, hi):
                d = duration(j)
                t += d
                done += 1
                pieces.append((j, 1, d, d))
                if t >= stop:
                    return done, pieces
            continue
        first, last = duration(lo), duration(hi - 1)
        linear = True
        for mid in (lo + (n - 1) // 3, lo + 2 * (n - 1) // 3):
            chord = first + (last - first) * (mid - lo) / (n - 1)
            if abs(duration(mid) - chord) > 1e-12 * max(abs(chord), 1e-30):
                linear = False
                break
        if linear:
            total = (first + last) * n / 2
            if t + total < stop:
                t += total
                done += n
                pieces.append((lo, n, first, last))
                continue
        mid = lo + (n - 1) // 2
        stack.append((mid, hi))   # the later half runs after the earlier one (a stack: push it first)
        stack.append((lo, mid))
    return done, pieces


def _step_ends(pieces: list[Piece], t: float) -> list[float]:
    """The end time of every step of a run given as linear pieces."""
    ends = []
    for _, n, first, last in pieces:
        slope = (last - first) / (n - 1) if n > 1 else 0.0
        for j in range(n):
            t += first + slope * j
            ends.append(t)
    return ends
