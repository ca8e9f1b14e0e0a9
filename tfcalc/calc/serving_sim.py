"""Discrete-event simulation of a continuous-batching scheduler (vLLM V1's policy), step by step.

Each engine step: every running sequence is scheduled first, in admission order (one decode token, k + 1
when verifying k speculative tokens, or the next prefill chunk of a partly prefilled prompt), within the token
budget C (max_num_batched_tokens); then waiting requests, first come first served, while the budget, the
max_num_seqs seats and the KV blocks allow. KV blocks are allocated on demand, block_size tokens at a time;
when a running sequence cannot grow, the most recently admitted one is preempted (its blocks freed; it
re-prefills prompt + generated tokens later, vLLM's recompute preemption). The step takes the replica's
step-time model's time for its mix; tokens are emitted at the step's end. Requests reach the engine
``request_s`` (+ per token) after they are sent, and each token reaches the client ``stream_s`` later.

Runs of decode-only steps during which nothing can change the batch (no request finishes, none waits to be
admitted, no block boundary can run the pool dry, no sequence crosses a sliding window) are advanced with
scalar arithmetic instead of per-sequence bookkeeping (``fast_forward``): a step then costs O(1) instead of
O(batch). tests/calc/test_serving_sim.py checks it against the plain per-step loop and a brute-force
reference, and the whole simulation against M/M/1, M/D/1 and M/G/inf closed forms. Pure math: no I/O.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

from tfcalc.calc.serving import SpecDecoding
from tfcalc.calc.serving_inputs import KvShape
from tfcalc.calc.serving_traffic import LengthDist, Overheads


class StepTime:
    """What the simulation needs from a step-time model: ``time(...)`` as in ``StepModel.time``."""

    kv: KvShape

    def time(self, decode_seqs: float, prefill_tokens: float, decode_keys: float, prefill_keys: float,
             read_keys: float = 0.0, logits: float | None = None, tokens_per_decode: float = 1.0) -> float:
        raise NotImplementedError


@dataclass(eq=False)
class _Seq:
    index: int
    arrival: float
    ready: float
    prompt: int
    output: int
    cached: int
    length: int = 0              # tokens whose KV is held (computed)
    target: int = 0              # tokens to compute before the next output token (prompt, or more after preemption)
    generated: int = 0
    blocks: int = 0
    first_token: float = -1.0
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


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """Per-request latencies (seconds) of the measured requests, and totals over the whole run."""

    ttft_s: tuple[float, ...]
    tpot_s: tuple[float, ...]
    e2e_s: tuple[float, ...]
    duration_s: float
    requests: int
    input_tokens: int
    output_tokens: int
    steps: int
    preemptions: int
    mean_batch: float

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
        return self.percentile(getattr(self, f"{metric}_s"), p)

    @property
    def request_throughput(self) -> float:
        return self.requests / self.duration_s

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s

    @property
    def total_throughput(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.duration_s


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


def simulate(step: StepTime, cfg: SimConfig, load: Workload, fast_forward: bool = True) -> SimResult:
    """Run ``load`` through the scheduler; latencies of the requests outside the warm-up/cool-down share."""
    rng = random.Random(load.seed)  # noqa: S311 - a seeded simulation, not cryptography
    n = load.num_requests
    prompts = [load.input_len.sample(rng) for _ in range(n)]
    outputs = [load.output_len.sample(rng) for _ in range(n)]
    gaps = [rng.expovariate(1.0) for _ in range(n)]
    return _Engine(step, cfg, load, prompts, outputs, gaps).run(fast_forward)


class _Engine:
    def __init__(self, step: StepTime, cfg: SimConfig, load: Workload, prompts: list[int], outputs: list[int],
                 gaps: list[float]) -> None:
        self.step, self.cfg, self.load = step, cfg, load
        self.kv = step.kv
        self.prompts, self.outputs, self.gaps = prompts, outputs, gaps
        self.total_blocks = cfg.kv_capacity_tokens // cfg.block_size
        self.free_blocks = self.total_blocks
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.arrivals: list[tuple[float, int]] = []   # heap of (ready time, index)
        self.done: list[_Seq] = []
        self.sent = 0
        self.preemptions = 0
        self.steps = 0
        self.batch_sum = 0.0
        self.rng = random.Random(load.seed + 1)  # noqa: S311 - a seeded simulation

    # --- requests ------------------------------------------------------------------------------------------
    def _send(self, t: float) -> None:
        i = self.sent
        self.sent += 1
        o = self.cfg.overheads
        prompt = self.prompts[i]
        cached = min(int(self.load.prefix_hit_ratio * prompt), prompt - 1)
        seq = _Seq(i, t, t + o.front_s(prompt), prompt, self.outputs[i], cached)
        seq.length = cached
        seq.target = prompt
        seq.blocks = 0  # the shared prefix's blocks are counted once, outside the pool (a few hot prefixes)
        heapq.heappush(self.arrivals, (seq.ready, i, seq))  # type: ignore[arg-type]

    def _units(self, tokens: int) -> int:
        """Blocks a sequence of ``tokens`` held tokens occupies (window caps applied per layer)."""
        if not self.kv.windows:
            return -(-tokens // self.cfg.block_size)
        return math.ceil(self.kv.units(tokens) / self.cfg.block_size)

    def _blocks_needed(self, seq: _Seq, tokens: int) -> int:
        return max(self._units(seq.length + tokens) - self._units(seq.cached), 0) - seq.blocks

    # --- the loop ------------------------------------------------------------------------------------------
    def run(self, fast_forward: bool) -> SimResult:
        load = self.load
        n = load.num_requests
        t = 0.0
        if load.concurrency is not None:
            for _ in range(min(load.concurrency, n)):
                self._send(0.0)
        else:
            rate = load.rate_per_s or 1.0
            clock = 0.0
            for i in range(n):
                clock += self.gaps[i] / rate
                self._send(clock)
        while len(self.done) < n:
            while self.arrivals and self.arrivals[0][0] <= t:
                self.waiting.append(heapq.heappop(self.arrivals)[2])  # type: ignore[misc]
            if not self.running and not self.waiting:
                t = self.arrivals[0][0]
                continue
            if fast_forward and self._decode_only() and self._admission_blocked():
                t = self._fast_forward(t)
            else:
                t = self._one_step(t)
        return self._result()

    def _decode_only(self) -> bool:
        return bool(self.running) and all(s.length >= s.target for s in self.running)

    def _admission_blocked(self) -> bool:
        """No waiting request could be admitted at the next step (none waits, or no seat/budget/blocks)."""
        if not self.waiting:
            return True
        cfg = self.cfg
        if len(self.running) >= cfg.max_num_seqs or len(self.running) >= cfg.max_num_batched_tokens:
            return True
        head = self.waiting[0]
        want = min(head.target - head.length, cfg.max_num_batched_tokens - len(self.running))
        return self._blocks_needed(head, want) > self.free_blocks

    def _one_step(self, t: float) -> float:
        """Schedule and run one step the way the engine does; returns the time at its end."""
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        k1 = cfg.spec.num_tokens + 1 if cfg.spec else 1
        scheduled: list[tuple[_Seq, int, bool]] = []   # (sequence, tokens, is a prefill chunk)
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            prefill = seq.length < seq.target
            want = min(seq.target - seq.length, budget) if prefill else min(k1, budget)
            while self._blocks_needed(seq, want) > self.free_blocks and seq.active:
                self._preempt(self.running[-1])
                preempted = True
            if not seq.active:
                break
            self._allocate(seq, want)
            scheduled.append((seq, want, prefill))
            budget -= want
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                seq = self.waiting[0]
                want = min(seq.target - seq.length, budget)
                if self._blocks_needed(seq, want) > self.free_blocks:
                    break
                self.waiting.popleft()
                self.running.append(seq)
                seq.active = True
                self._allocate(seq, want)
                scheduled.append((seq, want, True))
                budget -= want
        if not scheduled:
            # Nothing can run: the waiting head needs more blocks than the whole pool. It fails.
            seq = self.waiting.popleft()
            seq.failed = True
            self.done.append(seq)
            return t
        kv = self.kv
        decode_seqs = prefill_tokens = completing = 0
        decode_keys = prefill_keys = read_keys = 0.0
        for seq, want, prefill in scheduled:
            start = seq.length - want
            if prefill:
                prefill_tokens += want
                prefill_keys += kv.causal_keys(start, want)
                read_keys += kv.held(start)
                completing += seq.length >= seq.target
            else:
                decode_seqs += 1
                decode_keys += kv.held(start + 1)
        dt = self.step.time(decode_seqs, prefill_tokens, decode_keys, prefill_keys, read_keys,
                            decode_seqs * k1 + completing, k1)
        if cfg.spec and decode_seqs:
            dt += cfg.spec.num_tokens * cfg.spec.draft_cost * self.step.time(decode_seqs, 0, decode_keys, 0, 0,
                                                                             decode_seqs, 1)
        t += dt + cfg.overheads.step_s
        self.steps += 1
        self.batch_sum += decode_seqs
        for seq, want, prefill in scheduled:
            if prefill:
                if seq.length >= seq.target:
                    self._emit(seq, 1, t)
            else:
                accepted = self._accepted(k1)
                if accepted < want:   # rejected draft tokens leave the cache
                    seq.length -= want - accepted
                self._emit(seq, accepted, t)
        return t

    def _accepted(self, k1: int) -> int:
        spec = self.cfg.spec
        if spec is None:
            return 1
        accepted = 1
        while accepted < k1 and self.rng.random() < spec.acceptance:
            accepted += 1
        return accepted

    def _emit(self, seq: _Seq, tokens: int, t: float) -> None:
        if seq.first_token < 0:
            seq.first_token = t
        seq.generated = min(seq.generated + tokens, seq.output)
        seq.last_token = t
        seq.target = seq.length
        if seq.generated >= seq.output:
            self._finish(seq, t)

    def _finish(self, seq: _Seq, t: float) -> None:
        self.running.remove(seq)
        seq.active = False
        self.free_blocks += seq.blocks
        seq.blocks = 0
        self.done.append(seq)
        if self.load.concurrency is not None and self.sent < self.load.num_requests:
            self._send(t + self.cfg.overheads.stream_s)

    def _allocate(self, seq: _Seq, tokens: int) -> None:
        need = self._blocks_needed(seq, tokens)
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
        becomes ready, or a sliding window fills."""
        cfg = self.cfg
        running = self.running
        b = len(running)
        if cfg.spec is not None or b > cfg.max_num_batched_tokens:
            return self._one_step(t)
        kv = self.kv
        k = min(s.output - s.generated for s in running) - 1   # the finishing step runs the general path
        slope = 0.0
        full_layers = kv.num_layers - sum(c for c, _ in kv.windows)
        for s in running:
            slope += full_layers
            for count, window in kv.windows:
                if s.length + 1 < window:
                    slope += count
                    k = min(k, window - s.length - 1)
        if k >= 1:
            need = sum(self._blocks_needed(s, k) for s in running)
            while need > self.free_blocks and k > 1:
                k //= 2
                need = sum(self._blocks_needed(s, k) for s in running)
            if need > self.free_blocks:
                k = 0
        if k < 1:
            return self._one_step(t)
        keys = sum(kv.held(s.length + 1) for s in running)
        next_ready = self.arrivals[0][0] if self.arrivals and self._could_admit_later() else math.inf
        step_time, overhead = self.step.time, cfg.overheads.step_s

        def duration(j: int) -> float:
            return step_time(b, 0, keys + slope * j, 0, 0, b, 1) + overhead

        done, t = _advance(duration, k, t, next_ready)
        self.steps += done
        self.batch_sum += b * done
        for s in running:
            self._allocate(s, done)
            s.generated += done
            s.last_token = t
            s.target = s.length
        return t

    def _could_admit_later(self) -> bool:
        """Whether a request becoming ready could change the next step (a free seat and budget)."""
        cfg = self.cfg
        return len(self.running) < min(cfg.max_num_seqs, cfg.max_num_batched_tokens)

    def _result(self) -> SimResult:
        load, o = self.load, self.cfg.overheads
        ordered = sorted((s for s in self.done if not s.failed), key=lambda s: s.index)
        skip = int(load.warmup_fraction * len(ordered))
        kept = ordered[skip:len(ordered) - skip] if skip else ordered
        ttft = tuple(s.first_token + o.stream_s - s.arrival for s in kept)
        tpot = tuple((s.last_token - s.first_token) / (s.output - 1) for s in kept if s.output > 1)
        e2e = tuple(s.last_token + o.stream_s - s.arrival for s in kept)
        start = min(s.arrival for s in ordered)
        end = max(s.last_token for s in ordered) + o.stream_s
        return SimResult(ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, duration_s=end - start, requests=len(ordered),
                         input_tokens=sum(s.prompt for s in ordered), output_tokens=sum(s.output for s in ordered),
                         steps=self.steps, preemptions=self.preemptions,
                         mean_batch=self.batch_sum / max(self.steps, 1))


def _advance(duration, k: int, t: float, stop: float) -> tuple[int, float]:
    """Run steps j = 0..k-1 of the given durations from time t, stopping after the first step that ends at or
    after ``stop``: (steps run, time). A step's duration is convex and piecewise linear in j (a max of two
    linear functions of the growing context), so wherever it equals its chord at an interior point it is
    linear on the whole interval and a run of steps sums in closed form; elsewhere the interval is halved.
    """
    done = 0
    stack = [(0, k)]
    while stack:
        lo, hi = stack.pop()
        n = hi - lo
        if n <= 8:
            for j in range(lo, hi):
                t += duration(j)
                done += 1
                if t >= stop:
                    return done, t
            continue
        first, last = duration(lo), duration(hi - 1)
        mid = lo + (n - 1) // 2
        chord = first + (last - first) * (mid - lo) / (n - 1)
        if abs(duration(mid) - chord) <= 1e-12 * max(abs(chord), 1e-30):
            total = (first + last) * n / 2
            if t + total < stop:
                t += total
                done += n
                continue
        stack.append((mid, hi))   # the later half runs after the earlier one (a stack: push it first)
        stack.append((lo, mid))
    return done, t
