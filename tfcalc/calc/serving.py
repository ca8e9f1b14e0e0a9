"""Steady-state model of one replica serving requests with continuous batching and chunked prefill.

The engine (vLLM V1, SGLang) runs back-to-back scheduler steps while it has work. Each step carries every
running sequence's next decode token (k + 1 tokens when verifying k speculative ones) and fills the rest of
the token budget C (max_num_batched_tokens) with prefill chunks, first come first served; at most S sequences
(max_num_seqs) run at once and their KV cache must fit the replica's blocks. The model is parametrised by B,
the mean number of decoding sequences in a busy step, and derives everything else in closed form:

- work per request: P prefill tokens (prompt minus prefix-cache hits), D = output - 1 decode tokens, D / a
  steps with a = (1 - alpha^(k+1)) / (1 - alpha) tokens accepted per step (Leviathan et al. 2023, eq. 1).
- step mix: prefill tokens per busy step N = B P / (D / a) (the ratio of prefill to decode work); prompts
  arrive Poisson, so a step finds prefill work with probability q = max(1 - exp(-N / P), N / (C - B (k + 1)))
  and then carries n = N / q tokens; mean step time tau = q tau(B, n) + (1 - q) tau(B, 0) from the replica's
  step-time model.
- arrival rate: the engine is busy with probability f = 1 - exp(-lambda T) (requests in the engine are
  Poisson with mean lambda T, as in M/G/inf, T = prefill time + decode time of one request), and decode steps
  per busy step give B = lambda (D / a) tau / f; solved for lambda given B by Newton's method.
- TTFT = request overhead + wait for a seat + wait for the prefill queue + remaining part of the running step
  + prefill service + streaming of the token. Seats: M/G/c with c = min(S, KV blocks / blocks per live
  sequence) (Erlang C with the Allen-Cunneen (1 + cs^2) / 2 factor); prefill queue: M/G/1 on prefill tokens
  (Pollaczek-Khinchine mean). Percentiles of the waiting time: zero with probability 1 - P(wait), else
  exponential with the conditional mean (exact for M/M/1 and M/M/c).
- TPOT: step time at the batch a request sees, 1 + m with m = lambda D tau (others decoding, Poisson); its
  percentiles from a normal approximation of the time-average of that Poisson count over the request's life
  (variance 2m/3 for a window equal to the service time) and of the share of its steps that carry prefill.
- end-to-end = TTFT + (output - 1) x TPOT at the same percentile (a conservative combination).

Everything is monotone in B, so the largest rate meeting the targets is the largest B meeting them, found on
a fixed grid of B by regula falsi. The
discrete-event simulation in ``serving_sim`` runs the same scheduler request by request and checks this model
(tests/calc/test_serving.py). Pure math: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tfcalc.calc.serving_inputs import StepModel
from tfcalc.calc.serving_traffic import LengthDist, Overheads, Target, normal_quantile


@dataclass(frozen=True, kw_only=True)
class SpecDecoding:
    """Speculative decoding: k draft tokens per step, each accepted with probability alpha (independent).

    draft_cost: time of one draft forward as a fraction of the target's decode step at the same batch (an
    EAGLE/MTP head is about one layer, 1/layers; a separate draft model its parameter ratio).
    """

    num_tokens: int
    acceptance: float
    draft_cost: float

    @property
    def tokens_per_step(self) -> float:
        """(1 - alpha^(k+1)) / (1 - alpha): expected tokens emitted per verification step."""
        a, k = self.acceptance, self.num_tokens
        return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


@dataclass(frozen=True, kw_only=True)
class ReplicaServing:
    """One replica (one engine on tp x pp GPUs) and the traffic it serves."""

    step: StepModel
    input_len: LengthDist
    output_len: LengthDist
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: float
    block_size: int = 16
    overheads: Overheads = field(default_factory=Overheads)
    prefix_hit_ratio: float = 0.0
    spec: SpecDecoding | None = None
    role: str = "both"          # "both" (aggregated), "decode" (disaggregated decode pool)
    kv_transfer_s: float = 0.0  # decode pool: KV of one prompt arriving from the prefill pool


@dataclass(frozen=True)
class _Work:
    prefill_mean: float
    prefill_m2: float
    prefix: float
    steps: float            # decode steps per request (D / a)
    decode_tokens: float    # D
    tokens_per_decode: float
    accepted: float         # a
    decode_context: float
    prefill_keys_per_token: float
    kv_units_live: float
    held_decode: float      # keys one decode query attends (summed over layers) at the mean context
    held_prefix: float      # keys of the cached prefix a prefill chunk reads back


def _work(r: ReplicaServing) -> _Work:
    i, o = r.input_len, r.output_len
    h = r.prefix_hit_ratio
    kv = r.step.work.kv
    prefix = h * i.mean
    if r.role == "decode":
        p_mean, p_m2 = 0.0, 0.0
    else:
        p_mean, p_m2 = (1 - h) * i.mean, (1 - h) ** 2 * i.second_moment
    d_mean = o.mean - 1
    d_m2 = o.second_moment - 2 * o.mean + 1
    accepted = r.spec.tokens_per_step if r.spec else 1.0
    tokens_per_decode = float(r.spec.num_tokens + 1) if r.spec else 1.0
    context = i.mean + (d_m2 + d_mean) / (2 * d_mean) if d_mean > 0 else i.mean
    pk = kv.causal_keys(round(prefix), max(1, round(p_mean))) / max(1, round(p_mean)) if p_mean > 0 else 0.0
    live = kv.units(context) - (kv.units(prefix) if h else 0.0) + r.block_size / 2
    return _Work(p_mean, p_m2, prefix, d_mean / accepted, d_mean, tokens_per_decode, accepted, context, pk,
                 max(live, 1.0), kv.held(context), kv.held(prefix))


def _step_time(r: ReplicaServing, w: _Work, batch: float, prefill: float, completing: float) -> float:
    """One busy step: ``batch`` decoding sequences (with their draft passes) + ``prefill`` prompt tokens of which
    ``completing`` prompts finish (and sample), + the CPU step overhead."""
    step = r.step
    t = step.time(batch, prefill, batch * w.held_decode, prefill * w.prefill_keys_per_token,
                  w.held_prefix if prefill else 0.0, batch * w.tokens_per_decode + completing, w.tokens_per_decode)
    if r.spec is not None and batch:
        t += r.spec.num_tokens * r.spec.draft_cost * step.time(batch, 0.0, batch * w.held_decode, 0.0, 0.0, batch,
                                                               1.0)
    return t + r.overheads.step_s


def erlang_c(servers: int, load: float) -> float:
    """Probability an arrival waits in M/M/c with c servers and offered load a = lambda / mu (< c).

    Erlang B from 1 / B = sum_i prod_{m<i} (c - m) / a (terms fall off geometrically once c - i < a, so the
    sum stops after O(sqrt(c)) terms), then C = c B / (c - a (1 - B)).
    """
    if load <= 0:
        return 0.0
    if load >= servers:
        return 1.0
    if servers - load > 7 * math.sqrt(servers) + 2:
        return 0.0  # Halfin-Whitt: P(wait) ~ phi(beta) / beta < 1e-11 for beta = (c - a) / sqrt(c) > 7
    total = term = 1.0
    for i in range(1, servers + 1):
        term *= (servers - i + 1) / load
        total += term
        if term < 1e-16 * total and servers - i + 1 < load:
            break
    b = 1 / total
    return servers * b / (servers - load * (1 - b))


def _solve_x(y: float) -> float:
    """x > 0 with x / (1 - exp(-x)) = y (y > 1), by Newton's method."""
    if y <= 1:
        return 0.0
    x = 2 * (y - 1) if y < 1.5 else y
    for _ in range(30):
        e = math.exp(-x)
        g = x - y * (1 - e)
        dg = 1 - y * e
        step = g / dg if dg > 1e-12 else g
        x_new = max(x - step, x / 2)
        if abs(x_new - x) <= 1e-12 * x:
            return x_new
        x = x_new
    return x


@dataclass(frozen=True, kw_only=True)
class Point:
    """The replica at one operating point (busy decode batch ``batch``)."""

    model: ReplicaServing
    batch: float
    rate_per_s: float
    stable: bool
    limit: str                    # what breaks first when not stable ("" when stable)
    step_s: float                 # mean busy step time
    decode_step_s: float
    prefill_step_s: float
    prefill_step_share: float
    chunk_tokens: float           # prefill tokens a prefill step carries
    prefill_capacity: float       # C - B (k + 1): prefill tokens a step can take
    busy: float
    decode_others: float          # m: mean number of other sequences decoding
    seats: float                  # min(max_num_seqs, KV-limited sequences)
    kv_seats: float
    seat_load: float
    wait_probability: float
    wait_mean_s: float
    prefill_utilization: float
    engine_time_s: float
    w: _Work

    # --- latencies ---------------------------------------------------------------------------------------
    def _prefill_service(self, tokens: float) -> float:
        """Steps to prefill ``tokens`` alone at this load: full chunks then the remainder."""
        if tokens <= 0:
            return 0.0
        cap = self.prefill_capacity
        full = math.ceil(tokens / cap) - 1
        rest = tokens - full * cap
        return full * self._step(self.batch, cap) + self._step(self.batch, rest, completing=1.0)

    def _step(self, batch: float, prefill: float, completing: float | None = None) -> float:
        w = self.w
        if completing is None:
            completing = prefill / w.prefill_mean if w.prefill_mean else 0.0
        return _step_time(self.model, w, batch, prefill, completing)

    def _wait_quantile(self, p: float) -> float:
        pw, mean = self.wait_probability, self.wait_mean_s
        if pw <= 0 or mean <= 0 or pw <= 1 - p:
            return 0.0
        return mean / pw * math.log(pw / (1 - p))

    def ttft(self, percentile: float = 0.0) -> float:
        """Time to first token (s): mean (percentile 0) or the given percentile."""
        m, w = self.model, self.w
        o = m.overheads
        residual = self.busy * self.step_s / 2
        if percentile == 0:
            tokens = w.prefill_mean
            return (o.front_s(m.input_len.mean) + o.stream_s + self.wait_mean_s + residual
                    + self._prefill_service(tokens))
        p = percentile / 100
        tokens = m.input_len.quantile(p) * (1 - m.prefix_hit_ratio) if m.role != "decode" else 0.0
        return (o.front_s(m.input_len.quantile(p)) + o.stream_s + self._wait_quantile(p) + residual
                + self._prefill_service(tokens))

    def tpot(self, percentile: float = 0.0) -> float:
        """Time per output token after the first (s), per request: mean or percentile over requests."""
        m, w = self.model, self.w
        seen = 1 + self.decode_others
        q = self.prefill_step_share
        if percentile:
            z = normal_quantile(percentile / 100)
            seen += z * math.sqrt(2 * self.decode_others / 3)
            q = q + z * math.sqrt(q * (1 - q) / max(w.steps, 1.0))
        seen = min(max(seen, 1.0), self.seats if self.seats >= 1 else 1.0)
        q = min(max(q, 0.0), 1.0)
        step = q * self._step(seen, self.chunk_tokens) + (1 - q) * self._step(seen, 0.0) if q else \
            self._step(seen, 0.0)
        return step / w.accepted + (m.kv_transfer_s / max(w.decode_tokens, 1.0) if m.role == "decode" else 0.0)

    def e2e(self, percentile: float = 0.0) -> float:
        m = self.model
        decode = (m.output_len.quantile(percentile / 100) if percentile else m.output_len.mean) - 1
        ttft = self.ttft(percentile) if m.role != "decode" else 0.0
        return ttft + max(decode, 0.0) * self.tpot(percentile)

    def metric(self, target: Target) -> float:
        return getattr(self, target.metric)(target.percentile)

    def meets(self, targets: tuple[Target, ...]) -> bool:
        return self.stable and all(self.metric(t) <= t.seconds for t in targets)

    def binding(self, targets: tuple[Target, ...]) -> Target | None:
        """The target with the least slack (largest value / target)."""
        return max(targets, key=lambda t: self.metric(t) / t.seconds) if targets else None

    @property
    def concurrency(self) -> float:
        """Requests in flight (Little's law: rate x mean end-to-end latency)."""
        return self.rate_per_s * self.e2e(0)


def at_batch(r: ReplicaServing, batch: float, w: _Work | None = None) -> Point:
    """The operating point whose busy steps carry ``batch`` decoding sequences on average."""
    w = w or _work(r)
    budget = r.max_num_batched_tokens
    capacity = budget - batch * w.tokens_per_decode
    stable, limit = True, ""
    if capacity < 1 and w.prefill_mean > 0:
        capacity, stable, limit = 1.0, False, "token budget"

    def tau(b: float, n: float, done: float) -> float:
        return _step_time(r, w, b, n, done)

    tau_d = tau(batch, 0.0, 0.0)
    tau_full = tau(batch, capacity, capacity / w.prefill_mean) if w.prefill_mean else tau_d
    per_step = batch * w.prefill_mean / w.steps if w.steps else 0.0   # mean prefill tokens per busy step
    rho_steps = per_step / capacity if w.prefill_mean else 0.0       # share of step capacity used by prefill
    if rho_steps >= 1:
        stable, limit = False, limit or "prefill throughput"
        rho_steps = 0.999
    # Prompts arrive Poisson: a step finds new prefill work with probability 1 - exp(-prompts per step);
    # a step carries at most the capacity, so under load q = N / capacity.
    q = max(1 - math.exp(-per_step / w.prefill_mean), rho_steps) if w.prefill_mean else 0.0
    chunk = per_step / q if q else 0.0
    tau_p = tau(batch, chunk, chunk / w.prefill_mean) if chunk else tau_d
    tau_mean = q * tau_p + (1 - q) * tau_d
    # One request alone in the engine: prefill in chunks, then its decode steps.
    prefill_alone = 0.0
    if w.prefill_mean:
        full = math.ceil(w.prefill_mean / capacity) - 1
        prefill_alone = full * tau_full + tau(batch, w.prefill_mean - full * capacity, 1.0)
    decode_time = w.steps * tau_mean
    engine = prefill_alone + decode_time
    if w.steps and decode_time > 0:
        y = batch * engine / decode_time
        x = _solve_x(y)
        rate = x / engine
        busy = 1 - math.exp(-x)
    else:
        # No decode work (outputs of one token): the prefill queue alone sets the rate.
        rate = rho_steps * capacity / (w.prefill_mean * tau_mean) if w.prefill_mean else 0.0
        busy = min(rate * engine, 1.0)
    if r.role == "decode":
        engine += r.kv_transfer_s
    others = rate * decode_time
    kv_seats = r.kv_capacity_tokens / w.kv_units_live
    seats = min(float(r.max_num_seqs), kv_seats)
    seat_load = rate * engine
    if batch > seats:
        stable, limit = False, limit or ("max_num_seqs" if r.max_num_seqs <= kv_seats else "KV cache")
    if seat_load >= seats:
        stable, limit = False, limit or ("max_num_seqs" if r.max_num_seqs <= kv_seats else "KV cache")
    # Waiting for a seat: M/G/c (Erlang C, Allen-Cunneen); for the prefill queue: M/G/1 on tokens.
    c = max(int(seats), 1)
    p_seat = erlang_c(c, seat_load) if stable else 1.0
    cs2 = (r.output_len.variance / max(w.decode_tokens, 1.0) ** 2) * (decode_time / engine) ** 2 if engine else 0.0
    wait_seat = p_seat * engine / max(c - seat_load, 1e-9) * (1 + cs2) / 2 if p_seat > 0 else 0.0
    mu_tokens = capacity / tau_full if w.prefill_mean else math.inf
    rho_p = rate * w.prefill_mean / mu_tokens if w.prefill_mean else 0.0
    if rho_p >= 1:
        stable, limit = False, limit or "prefill throughput"
    wait_prefill = rate * w.prefill_m2 / mu_tokens ** 2 / (2 * (1 - rho_p)) if 0 < rho_p < 1 else 0.0
    p_wait = 1 - (1 - min(p_seat, 1.0)) * (1 - min(rho_p, 1.0))
    return Point(model=r, batch=batch, rate_per_s=rate, stable=stable, limit=limit, step_s=tau_mean,
                 decode_step_s=tau_d, prefill_step_s=tau_p, prefill_step_share=q, chunk_tokens=chunk,
                 prefill_capacity=capacity, busy=busy, decode_others=others, seats=seats, kv_seats=kv_seats,
                 seat_load=seat_load, wait_probability=p_wait, wait_mean_s=wait_seat + wait_prefill,
                 prefill_utilization=rho_p, engine_time_s=engine, w=w)


def batch_limit(r: ReplicaServing) -> float:
    """Largest busy batch worth trying: the seats and the token budget bound it."""
    w = _work(r)
    return max(1.0, min(float(r.max_num_seqs), r.kv_capacity_tokens / w.kv_units_live,
                        (r.max_num_batched_tokens - 1) / w.tokens_per_decode))


def at_rate(r: ReplicaServing, rate: float, below: Point | None = None) -> Point:
    """The operating point at arrival rate ``rate`` (req/s); unstable if the replica cannot carry it.
    ``below``: a stable point known to carry at least ``rate`` (narrows the search)."""
    w = _work(r)
    lo = 1e-6
    if below is not None and below.stable and below.rate_per_s >= rate:
        return _bisect_rate(r, w, lo, below.batch, rate)
    hi = batch_limit(r)
    top = at_batch(r, hi, w)
    if top.rate_per_s < rate or not top.stable and top.rate_per_s <= rate:
        # Past the last stable batch: report the saturated point, marked unstable.
        point = _last_stable(r, w, lo, hi)
        if point.rate_per_s >= rate:
            return _bisect_rate(r, w, lo, point.batch, rate)
        limit = point.limit or top.limit or "throughput"
        return _replace_unstable(point, rate, limit)
    return _bisect_rate(r, w, lo, hi, rate)


def _replace_unstable(point: Point, rate: float, limit: str) -> Point:
    from dataclasses import replace

    return replace(point, rate_per_s=rate, stable=False, limit=limit or "throughput")


def _bisect_rate(r: ReplicaServing, w: _Work, lo: float, hi: float, rate: float) -> Point:
    """The point whose rate is ``rate`` (to 0.1 %), by regula falsi on B (rate is smooth and increasing in B)."""
    p_lo, p_hi = at_batch(r, lo, w), at_batch(r, hi, w)
    point = p_hi
    for _ in range(60):
        span = p_hi.rate_per_s - p_lo.rate_per_s
        mid = lo + (hi - lo) * (rate - p_lo.rate_per_s) / span if span > 0 else (lo + hi) / 2
        mid = min(max(mid, lo + 0.02 * (hi - lo)), hi - 0.02 * (hi - lo))
        p = at_batch(r, mid, w)
        if p.rate_per_s >= rate:
            hi, p_hi, point = mid, p, p
        else:
            lo, p_lo = mid, p
        if abs(point.rate_per_s - rate) <= 1e-3 * rate or hi - lo <= 1e-6 * hi:
            break
    return point


def _last_stable(r: ReplicaServing, w: _Work, lo: float, hi: float) -> Point:
    best = at_batch(r, lo, w)
    if not best.stable:
        return best
    for _ in range(50):
        mid = (lo + hi) / 2
        p = at_batch(r, mid, w)
        if p.stable:
            lo, best = mid, p
        else:
            hi = mid
        if hi - lo <= 1e-6 * hi:
            break
    return best


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """The most one replica carries within the targets, and what stops it."""

    rate_per_s: float              # 0 when even a lone request misses a target
    point: Point                   # the operating point at that rate
    binding: str                   # the target or limit that binds ("TTFT p90", "KV cache", ...)


# Capacity is searched on a fixed geometric grid of busy batches, B_k = 0.01 x 1.002^k: the answer is the
# largest grid point meeting the targets, whatever path the search takes to it, so it is exactly monotone in
# the targets (a looser target can only move it up) and the same for every max_num_seqs above the batch.
_GRID_START = 0.01
_GRID_RATIO = 1.002
_LOG_RATIO = math.log(_GRID_RATIO)


def _grid(k: int) -> float:
    return _GRID_START * _GRID_RATIO ** k


def _slack(p: Point, targets: tuple[Target, ...]) -> float:
    """max over targets of value / target - 1 (<= 0: all met); +inf when the replica cannot carry the load."""
    if not p.stable:
        return math.inf
    worst = -1.0
    for t in targets:
        worst = max(worst, p.metric(t) / t.seconds - 1)
    return worst


def _largest_meeting(points: Callable[[int], Point], targets: tuple[Target, ...], lo: int, hi: int,
                     s_lo: float, s_hi: float) -> tuple[int, int]:
    """Largest k in [lo, hi) with slack <= 0, given slack(lo) <= 0 < slack(hi): (k, k + 1), by the Illinois
    variant of regula falsi on grid indices (bisection where the slack is infinite)."""
    side = 0
    while hi - lo > 1:
        if math.isfinite(s_hi) and s_hi - s_lo > 0:
            mid = lo + round((hi - lo) * (-s_lo) / (s_hi - s_lo))
            mid = min(max(mid, lo + 1), hi - 1)
        else:
            mid = (lo + hi) // 2
        s_mid = _slack(points(mid), targets)
        if s_mid <= 0:
            lo, s_lo = mid, s_mid
            if side == -1:
                s_hi /= 2
            side = -1
        else:
            hi, s_hi = mid, s_mid
            if side == 1:
                s_lo /= 2
            side = 1
    return lo, hi


def max_rates(r: ReplicaServing, targets: tuple[Target, ...],
              relaxed: tuple[Target, ...] | None = None) -> tuple[Capacity, Capacity]:
    """Largest arrival rate at which the replica is stable and meets ``targets``; and the same for a subset
    ``relaxed`` of them (the Pareto frontier uses all but TPOT). Both share the grid points evaluated."""
    w = _work(r)
    top = max(1, int(math.log(batch_limit(r) / _GRID_START) / _LOG_RATIO))
    cache: dict[int, Point] = {}

    def points(k: int) -> Point:
        p = cache.get(k)
        if p is None:
            p = cache[k] = at_batch(r, _grid(k), w)
        return p

    full = _capacity(r, w, points, targets, 0, top)
    if relaxed is None or relaxed == targets:
        return full, full
    start = max((k for k, p in cache.items() if p is full.point), default=0)
    return full, _capacity(r, w, points, relaxed, start, top)


def _capacity(r: ReplicaServing, w: _Work, points: Callable[[int], Point], targets: tuple[Target, ...], lo: int,
              top: int) -> Capacity:
    first = points(lo)
    s_first = _slack(first, targets)
    if s_first > 0:
        worst = first.binding(targets)
        return Capacity(rate_per_s=0.0, point=first,
                        binding=(worst.label if worst and first.stable else first.limit or "latency"))
    last = points(top)
    s_last = _slack(last, targets)
    if s_last <= 0:
        return Capacity(rate_per_s=last.rate_per_s, point=last, binding=_limit_name(r, last, w))
    k, over_k = _largest_meeting(points, targets, lo, top, s_first, s_last)
    best, over = points(k), points(over_k)
    if not over.stable:
        binding = over.limit
    else:
        worst = over.binding(targets)
        binding = worst.label if worst else "throughput"
    return Capacity(rate_per_s=best.rate_per_s, point=best, binding=binding)


def max_rate(r: ReplicaServing, targets: tuple[Target, ...]) -> Capacity:
    """Largest arrival rate at which the replica is stable and meets every target."""
    return max_rates(r, targets)[0]


def _limit_name(r: ReplicaServing, p: Point, w: _Work) -> str:
    if p.seats <= r.max_num_seqs and p.kv_seats < r.max_num_seqs:
        return "KV cache"
    if r.max_num_seqs * w.tokens_per_decode >= r.max_num_batched_tokens - 1:
        return "token budget"
    return "max_num_seqs"


def at_concurrency(r: ReplicaServing, concurrency: float) -> Point:
    """Closed loop: ``concurrency`` requests always in flight; rate x (end-to-end + client turnaround) = N."""
    w = _work(r)
    lo, hi = 1e-6, batch_limit(r)

    def inflight(p: Point) -> float:
        return p.rate_per_s * (p.e2e(0) + r.overheads.stream_s)

    top = at_batch(r, hi, w)
    if inflight(top) < concurrency:
        return top
    point = top
    for _ in range(60):
        mid = (lo + hi) / 2
        p = at_batch(r, mid, w)
        if inflight(p) >= concurrency:
            hi, point = mid, p
        else:
            lo = mid
        if hi - lo <= 1e-7 * hi:
            break
    return point


# --- a prefill-only replica (disaggregated serving's prefill pool) -----------------------------------------


def prefill_only_at(r: ReplicaServing, rate: float) -> Point:
    """A replica whose steps carry only prefill chunks (no decodes): an M/G/1 queue of prompt tokens served
    C tokens per step; the first token leaves with the last chunk."""
    w = _work(r)
    capacity = float(r.max_num_batched_tokens)

    def tau(n: float, done: float) -> float:
        return _step_time(r, w, 0.0, n, done)

    tau_full = tau(capacity, capacity / w.prefill_mean)
    mu_tokens = capacity / tau_full
    rho = rate * w.prefill_mean / mu_tokens
    stable = rho < 1
    per_step_arrivals = rate * tau_full
    q = 1 - math.exp(-per_step_arrivals) if per_step_arrivals > 0 else 0.0
    chunk = min(capacity, max(w.prefill_mean, rate * w.prefill_mean * tau_full / q if q else w.prefill_mean))
    tau_p = tau(chunk, chunk / w.prefill_mean)
    full = math.ceil(w.prefill_mean / capacity) - 1
    engine = full * tau_full + tau(w.prefill_mean - full * capacity, 1.0)
    wait = rate * w.prefill_m2 / mu_tokens ** 2 / (2 * (1 - rho)) if 0 < rho < 1 else 0.0
    return Point(model=r, batch=0.0, rate_per_s=rate, stable=stable, limit="" if stable else "prefill throughput",
                 step_s=tau_p, decode_step_s=0.0, prefill_step_s=tau_p, prefill_step_share=1.0, chunk_tokens=chunk,
                 prefill_capacity=capacity, busy=min(rho, 1.0), decode_others=0.0, seats=float(r.max_num_seqs),
                 kv_seats=math.inf, seat_load=0.0, wait_probability=min(rho, 1.0) if stable else 1.0,
                 wait_mean_s=wait, prefill_utilization=rho, engine_time_s=engine, w=w)


def prefill_only_max_rate(r: ReplicaServing, targets: tuple[Target, ...], tolerance: float = 1e-3) -> Capacity:
    """Largest rate a prefill-only replica carries within the TTFT targets (bisection on the rate)."""
    ttft = tuple(t for t in targets if t.metric == "ttft")
    w = _work(r)
    capacity = float(r.max_num_batched_tokens)
    tau_full = _step_time(r, w, 0.0, capacity, capacity / w.prefill_mean)
    top = capacity / tau_full / w.prefill_mean   # saturation rate

    def ok(rate: float) -> bool:
        p = prefill_only_at(r, rate)
        return p.stable and all(p.ttft(t.percentile) <= t.seconds for t in ttft)

    first = prefill_only_at(r, 1e-9 * top)
    if not ok(1e-9 * top):
        worst = max(ttft, key=lambda t: first.ttft(t.percentile) / t.seconds) if ttft else None
        return Capacity(rate_per_s=0.0, point=first, binding=worst.label if worst else "latency")
    lo, hi = 0.0, top
    while hi - lo > tolerance * top:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    over = prefill_only_at(r, hi)
    binding = "prefill throughput" if not over.stable else (
        max(ttft, key=lambda t: over.ttft(t.percentile) / t.seconds).label if ttft else "prefill throughput")
    return Capacity(rate_per_s=lo, point=prefill_only_at(r, lo), binding=binding)
