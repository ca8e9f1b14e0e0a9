"""Steady-state model of one replica serving requests with continuous batching and chunked prefill.

The engine (vLLM V1, SGLang) runs back-to-back scheduler steps while it has work. Each step carries every
running sequence's next decode token (k + 1 tokens when verifying k speculative ones) and fills the rest of
the token budget C (max_num_batched_tokens, or SGLang's max_prefill_tokens where smaller) with prefill chunks,
first come first served; at most S sequences (max_num_seqs) run at once and their KV cache must fit the replica's
blocks. SGLang's default policy (``prefill_first``) runs the prefill chunks in a step of their own before the
decode step instead: the same formulas with a busy step = decode step + (with probability q) a prefill step, a
prompt's own steps without decoding sequences, the whole budget for prefill, E[ceil(P / C)] steps a prompt, and a
share 1 - q of the steps that give the decoding sequences a token (a request's decode steps each come with
q / (1 - q) prefill steps: its decode time and TPOT are divided by 1 - q). The model is parametrised by the
offered seat load a = lambda T (T: the time a request holds a seat; a: the mean number being served) and
derives everything else in closed form:

- work per request: P prefill tokens (prompt minus prefix-cache hits), D = output - 1 decode tokens, D / acc
  steps with acc = (1 - alpha^(k+1)) / (1 - alpha) tokens accepted per step (Leviathan et al. 2023, eq. 1).
- seats: c = min(S, KV blocks / blocks per live sequence); M/M/c gives P(wait) (Erlang C) and P(empty); the
  engine is busy with probability 1 - P(empty), so its busy steps carry B = a x (decode share of T) / P(busy)
  decoding sequences (a fixed point on the decode share, a few iterations).
- step mix: prefill tokens per busy step N = B P / (D / acc) (the ratio of prefill to decode work); prompts
  arrive Poisson, so a step finds prefill work with probability q = max(1 - exp(-N / P), N / (C - B (k + 1)))
  and then carries n = N / q tokens; mean step time tau = q tau(B, n) + (1 - q) tau(B, 0) from the replica's
  step-time model; T = prefill time of one prompt + (D / acc) tau, and lambda = a / T.
- data-parallel attention ranks (``lockstep_ranks`` n > 1) end every step together (they meet in the experts'
  all-to-all each layer): a decode-only step lasts as long as the busiest rank's (peers at Poisson batches,
  ``_slowest_decode``); a step without prefill here lasts as long as a peer's prefill step with probability s, the
  peers' part of the share of long steps in a chain where a step is long when some rank's prompt arrived during the
  one before (``_peer_share``), so tau = q tau_p + s tau_peer + (1 - q - s) tau_d; a step lasts as long as the
  longest chunk prefilled in it, each of the n - 1 peers prefilling with probability q and the chunks following
  the prompt lengths (E[max of K draws], ``_longest_chunk``: tau_peer given K >= 1, tau_p with this rank's own);
  a new request waits for the rest of the group's step (length-biased, E[tau^2] / 2 E[tau], while any rank is
  busy), and its own prefill steps last the longer of its chunk and a peer's with probability 1 - (1 - q)^(n - 1).
  The engines' opt-in prefill delayers (SGLang --enable-prefill-delayer, TensorRT-LLM attention_dp_config
  enable_balance) that align the ranks' prefills are not modelled.
- the API server(s): a serial resource with the requests' own work and bulks of streamed chunks, one per step
  (``_api_queue``): utilization rho = rate / N x work per request (rho >= 1: the replica cannot carry the rate,
  "API server"), and the delay a request and its first token see.
- TTFT = request latency + API delay + wait (a seat: Erlang C with the Allen-Cunneen (1 + cs^2) / 2 factor; the
  prefill queue: M/G/1 on prompt tokens, Pollaczek-Khinchine) + the rest of the running step + prefill service
  + streaming of the token. Percentiles: the exact mixture over prompt-length nodes of the fixed part with the
  wait, taken as zero with probability 1 - P(wait) and exponential otherwise (exact for M/M/1 and M/M/c); the API
  server's queueing wait likewise, zero with probability 1 - rho (the sum of the two waits: a hypoexponential).
- TPOT: step time at the batch a request sees, 1 + m with m = lambda D tau (others decoding, Poisson); its
  percentiles from the variance of that count's time-average over the request's life (2m/3) and of the share
  of its steps that carry prefill (compound Poisson: prompts of several chunks take consecutive steps; averaged
  over the output lengths: E[1/D]).
- ITL: one step at the batch it carries, decode-only or with a chunk sized like the prompts; a mixture.
- end-to-end = TTFT + (output - 1) x TPOT; percentiles over the output-length nodes with the wait.

Everything is monotone in the load, so the largest rate meeting the targets is the largest load on a fixed
geometric grid that meets them, found by regula falsi (from a hint when there is one: the same grid answer). The
discrete-event simulation in ``serving_sim`` runs the API servers and the scheduler request by request and checks
this model (tests/calc/test_serving.py). Pure math: no I/O.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from tfcalc.calc.serving_inputs import StepSource
from tfcalc.calc.serving_traffic import LengthDist, Overheads, Target, normal_quantile
from tfcalc.spec.engine import SchedulerPolicy

# SGLang's admission estimate (python/sglang/srt/environ.py, scheduler.py init_schedule_policy, schedule_policy.py
# PrefillAdder, schedule_batch.py retract_decode): running requests reserve min(remaining output, 4096) x a ratio that
# starts at 0.7, falls by (0.7 - 0.7 x 0.14) / 600 per decode batch to 0.098, returns to 0.7 when idle and, after a
# retraction, becomes (tokens decoded + 20 per request) / (output tokens + 1) over the requests left, at most 1.
RATIO_INIT = 0.7
RATIO_MIN = RATIO_INIT * 0.14
RATIO_DECAY = (RATIO_INIT - RATIO_MIN) / 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096

# An API-server wait whose mean is below this share of the fastest TTFT is added as a constant (its spread moves a
# percentile by well under 1 %); the others enter the percentiles as a random wait (Point._plus_wait_quantile).
API_WAIT_AS_CONSTANT = 1e-3
# The rest of the running lockstep step a request arriving at random waits for: TTFT's percentiles take it as this
# many equal-probability bins, each at its mean over this many quantile midpoints (Point._residual_nodes)
RESIDUAL_NODES = 5
RESIDUAL_SUBSAMPLES = 8


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

    step: StepSource
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
    policy: SchedulerPolicy = SchedulerPolicy()   # all but chunked_prefill (prompts are chunked here)
    lockstep_ranks: int = 1     # data-parallel attention ranks whose steps end together (this one among them)


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
    kv_units_live: float
    inverse_steps: float    # E[1 / decode steps] over the output lengths
    chunks: float           # streamed chunks per request: the first token + one per decode step
    api_work: float         # serial API-server work of a mean request (s)
    api_request_m2: float   # E[(request part of the API work)^2]
    step: Callable[[float, float, float], float]   # busy step time: (decoding, prefill tokens, completing)
    owner: ReplicaServing = field(compare=False, repr=False)

    def __reduce__(self) -> tuple:
        """Pickled as its replica (the step function is a closure): rebuilt by ``_work`` on the other side."""
        return _work, (self.owner,)


_WORK_CACHE: dict[int, tuple[ReplicaServing, _Work]] = {}


def _work(r: ReplicaServing) -> _Work:
    """Per-request work and the step-time function of ``r`` (memoised on the object: a search asks often)."""
    hit = _WORK_CACHE.get(id(r))
    if hit is not None and hit[0] is r:
        return hit[1]
    if len(_WORK_CACHE) > 4096:
        _WORK_CACHE.clear()
    w = _make_work(r)
    _WORK_CACHE[id(r)] = (r, w)
    return w


def _make_work(r: ReplicaServing) -> _Work:
    i, o = r.input_len, r.output_len
    h = r.prefix_hit_ratio
    kv = r.step.kv
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
    live = kv.units(context) - (kv.units(prefix, state=False) if h else 0.0) + r.block_size / 2
    if r.policy.reserve_output:   # SGLang's admission: the remaining output (mean residual) x its ratio's floor
        remaining = min(context - i.mean, CLIP_MAX_NEW_TOKENS)
        live += RATIO_MIN * (kv.units(context + remaining) - kv.units(context))
    inverse = sum(weight / max((x - 1) / accepted, 1.0) for x, weight in o.nodes())
    step = r.step.busy_step(context, (1 - h) * i.mean, prefix, tokens_per_decode, r.overheads.step_s)
    if r.spec is not None:
        main, draft = step, r.step.busy_step(context, (1 - h) * i.mean, prefix, 1.0)
        factor = r.spec.num_tokens * r.spec.draft_cost

        def step(batch: float, prefill: float, completing: float) -> float:
            t = main(batch, prefill, completing)
            return t + factor * draft(batch, 0.0, 0.0) if batch else t
    if r.policy.prefill_first:   # the decode step and the prefill step that runs before it, one after the other
        joint = step

        def step(batch: float, prefill: float, completing: float) -> float:
            if batch and prefill:
                return joint(batch, 0.0, 0.0) + joint(0.0, prefill, completing)
            return joint(batch, prefill, completing)
    ov = r.overheads
    chunks = 1 + d_mean / accepted
    request_part = ov.api_request_s + ov.api_input_token_s * i.mean
    request_m2 = request_part ** 2 + ov.api_input_token_s ** 2 * i.variance
    return _Work(p_mean, p_m2, prefix, d_mean / accepted, d_mean, tokens_per_decode, accepted, context,
                 max(live, 1.0), inverse, chunks, ov.api_work_s(i.mean, chunks), request_m2, step, r)


HALFIN_WHITT = 5.0


def erlang(servers: int, load: float) -> tuple[float, float]:
    """(P(an arrival waits), P(the system is empty)) of M/M/c with c servers and offered load a = lambda / mu.

    Erlang B from 1 / B = sum_i prod_{m<i} (c - m) / a (= sum_k t_k / t_c with t_k = a^k / k!; terms fall off
    geometrically once c - i < a, so the sum stops after O(sqrt(c)) of them); C = c B / (c - a (1 - B));
    P0 = 1 / (sum_{k<c} t_k + t_c c / (c - a)).
    """
    if load <= 0:
        return 0.0, 1.0
    if load >= servers:
        return 1.0, 0.0
    if servers - load > HALFIN_WHITT * math.sqrt(servers) + 2:
        # Halfin-Whitt: P(wait) ~ phi(beta) / beta < 3e-7 for beta = (c - a) / sqrt(c) > 5; the occupancy is
        # then Poisson(a) to the same accuracy (and the seats play no part: the search reuses such answers).
        return 0.0, math.exp(-load)
    total = term = 1.0
    for i in range(1, servers + 1):
        term *= (servers - i + 1) / load
        total += term
        if term < 1e-16 * total and servers - i + 1 < load:
            break
    b = 1 / total
    wait = servers * b / (servers - load * (1 - b))
    log_tc = servers * math.log(load) - math.lgamma(servers + 1)
    empty = math.exp(-log_tc) / (total - 1 + servers / (servers - load)) if log_tc > -700 else 0.0
    return wait, min(empty, 1.0)


def erlang_c(servers: int, load: float) -> float:
    """Probability an arrival waits in M/M/c (Erlang C)."""
    return erlang(servers, load)[0]


@dataclass(kw_only=True, slots=True)
class Point:
    """The replica at one operating point (busy decode batch ``batch``). Not frozen: built millions of times
    in a search, and a frozen dataclass's constructor is several times slower; treat it as read-only."""

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
    api_utilization: float = 0.0  # of one API server
    api_delay_s: float = 0.0      # a request's mean API-server time on its way in and its first token's: waits + work
    api_wait_s: float = 0.0       # the queueing part of it (mean): 0 for a share 1 - rho of requests, else random
    peer_step_share: float = 0.0  # lockstep ranks: share of steps lengthened by a peer's prefill (none here)
    peer_step_s: float = 0.0      # the time of such a step at the busy batch
    slowest_rank_s: float = 0.0   # lockstep ranks: what a decode-only step adds waiting for the busiest peer
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    # --- latencies ---------------------------------------------------------------------------------------
    def _prefill_service(self, tokens: float) -> float:
        """Steps to prefill ``tokens`` alone at this load: full chunks then the remainder."""
        if tokens <= 0:
            return 0.0
        cap = self.prefill_capacity
        full = math.ceil(tokens / cap) - 1
        step = self.w.step
        beside = 0.0 if self.model.policy.prefill_first else self.batch   # decoding sequences in the prompt's steps
        rest = self._beside_peers(step(beside, tokens - full * cap, 1.0))
        return full * self._beside_peers(step(beside, cap, cap / self.w.prefill_mean)) + rest if full else rest

    def _beside_peers(self, own: float) -> float:
        """A step of this rank's own prefill in a lockstep group: a peer prefills in the same step with probability
        1 - (1 - q)^(ranks - 1), and the step then lasts the longer of the two (a peer's chunk: ``peer_step_s``)."""
        if self.model.lockstep_ranks <= 1 or not self.peer_step_share:
            return own
        return own + self._peer_beside() * max(self.peer_step_s - own, 0.0)

    def _peer_beside(self) -> float:
        """The chance that a peer prefills in the same step as this rank's own prefill: 1 - (1 - q)^(ranks - 1)."""
        return 1 - (1 - self.prefill_step_share) ** (self.model.lockstep_ranks - 1)

    def _step(self, batch: float, prefill: float, completing: float | None = None) -> float:
        w = self.w
        if completing is None:
            completing = prefill / w.prefill_mean if w.prefill_mean else 0.0
        return w.step(batch, prefill, completing)

    def _lockstep_steps(self) -> tuple[float, list[tuple[float, float]]]:
        """A lockstep group's steps as a request arriving at random meets them: (the chance that one runs, while
        any rank is busy: 1 - (1 - busy)^ranks; [(share of the steps, time)] of decode-only steps, steps with
        prefill here and steps in which peers prefill, the longest of their chunks (``_peer_steps``), at least this
        rank's decode)."""
        q, s = self.prefill_step_share, self.peer_step_share
        peers = [(s * weight, tau) for weight, tau in self._peer_steps(self.batch, self.decode_step_s)]
        return (1 - (1 - self.busy) ** self.model.lockstep_ranks,
                [(1 - q - s, self.decode_step_s), (q, self.prefill_step_s), *peers])

    def _running_step_s(self) -> float:
        """The mean rest of the running step that a request arriving at random waits for: half a mean step while
        the engine is busy. In a lockstep group the step it lands in is length-biased: E[tau^2] / (2 E[tau]) over
        ``_lockstep_steps``, whose spread the percentiles take (``_residual_nodes``)."""
        if self.model.lockstep_ranks <= 1 or not self.peer_step_share:
            return self.busy * self.step_s / 2
        busy, steps = self._lockstep_steps()
        first = sum(weight * tau for weight, tau in steps)
        return busy * sum(weight * tau * tau for weight, tau in steps) / (2 * first) if first > 0 else 0.0

    def _residual_nodes(self) -> list[tuple[float, float]]:
        """That rest as (value, weight) nodes: its mean, or in a lockstep group ``RESIDUAL_NODES`` equal-probability
        bins of its distribution, each at its mean (over ``RESIDUAL_SUBSAMPLES`` midpoints: the nodes keep the mean):
        0 while no step runs, else uniform over a step picked with probability share x time / E[tau]. The CDF is
        piecewise linear, 1 - busy + busy (the sum over steps shorter than t of pi_i + t x the sum over the others of
        pi_i / tau_i), inverted segment by segment. (The same spread for a lone replica moved the simulation
        check's TTFT p90 closer and its p50 further: docs/capacity.md.)"""
        if self.model.lockstep_ranks <= 1 or not self.peer_step_share:
            return [(self._running_step_s(), 1.0)]
        busy, steps = self._lockstep_steps()
        first = sum(weight * tau for weight, tau in steps)
        if busy <= 0 or first <= 0:
            return [(0.0, 1.0)]
        parts = sorted((tau, weight * tau / first) for weight, tau in steps if weight > 0 and tau > 0)
        top = sum(pi / tau for tau, pi in parts)

        def quantile(u: float) -> float:
            if u <= 1 - busy:
                return 0.0
            v = (u - (1 - busy)) / busy
            below, slope, start = 0.0, top, 0.0
            for tau, pi in parts:
                if below + slope * tau >= v:
                    return max((v - below) / slope, start)
                below, slope, start = below + pi, slope - pi / tau, tau
            return parts[-1][0]

        bins, sub = RESIDUAL_NODES, RESIDUAL_SUBSAMPLES
        return [(sum(quantile((k + (j + 0.5) / sub) / bins) for j in range(sub)) / sub, 1 / bins)
                for k in range(bins)]

    def _peer_step(self, seen: float, decode: float) -> float:
        """A step here without prefill while peer ranks prefill their chunks (lockstep): the longer of this rank's
        decode and the longest of their chunks (``_longest_chunk``)."""
        m = self.model
        beside = 0.0 if m.policy.prefill_first else seen
        longest = self.chunk_tokens * _longest_chunk(m.input_len, m.lockstep_ranks - 1, self.prefill_step_share)
        return max(decode, self._step(beside, min(longest, self.prefill_capacity)))

    def _peer_steps(self, seen: float, decode: float) -> list[tuple[float, float]]:
        """(weight, time) of the steps here without prefill while peers prefill: the longest of their chunks (K of
        the n - 1 peers, binomial with q given K >= 1; P(longest <= x) = F(x)^K over the prompt-length nodes, scaled
        to the mean chunk), each step at least this rank's decode."""
        m = self.model
        peers, q = m.lockstep_ranks - 1, self.prefill_step_share
        beside = 0.0 if m.policy.prefill_first else seen
        counts = _peer_counts(peers, q, 1)
        total = sum(p for p, _ in counts)
        nodes = m.input_len.nodes(True)
        scale = self.chunk_tokens / sum(x * wt for x, wt in nodes)
        out, cdf, below = [], 0.0, 0.0
        for x, wt in nodes:
            cdf = min(cdf + wt, 1.0)
            at_most = sum(p * cdf ** k for p, k in counts) / total
            out.append((at_most - below, max(decode, self._step(beside, min(x * scale, self.prefill_capacity)))))
            below = at_most
        return out

    def _wait_quantile(self, p: float) -> float:
        pw, mean = self.wait_probability, self.wait_mean_s
        if pw <= 0 or mean <= 0 or pw <= 1 - p:
            return 0.0
        return mean / pw * math.log(pw / (1 - p))

    def _fixed_ttft(self, prompt: float) -> float:
        """TTFT of a request with ``prompt`` tokens that does not wait: overheads, the rest of the running step,
        its prefill and the streaming of the token."""
        m = self.model
        o = m.overheads
        tokens = prompt * (1 - m.prefix_hit_ratio) if m.role != "decode" else 0.0
        return (o.front_s(prompt) + o.stream_s + self.api_delay_s - self.api_wait_s + o.api_input_token_s * prompt
                + self._running_step_s() + self._prefill_service(tokens))

    def _plus_wait_quantile(self, p: float, fixed: list[tuple[float, float]]) -> float:
        """The p-quantile of F + W (+ A): F takes each (value, weight) of ``fixed`` (nodes of a length
        distribution), W the engine's queueing wait (``_plus_one_wait_quantile``), A the API server's
        (``_plus_waits_quantile``; below ``API_WAIT_AS_CONSTANT`` of the fastest F, its mean as a constant)."""
        pw, mean = self.wait_probability, self.wait_mean_s
        nodes = fixed if all(a[0] <= b[0] for a, b in zip(fixed, fixed[1:], strict=False)) else sorted(fixed)
        if self.api_wait_s > API_WAIT_AS_CONSTANT * nodes[0][0]:
            return _plus_waits_quantile(p, nodes, (pw, mean) if pw > 0 and mean > 0 else (0.0, 0.0),
                                        (min(self.api_utilization, 1.0), self.api_wait_s))
        if self.api_wait_s > 0:   # too small to shape the spread: its mean, as a constant
            nodes = [(value + self.api_wait_s, weight) for value, weight in nodes]
        return _plus_one_wait_quantile(p, nodes, pw, mean)

    def ttft(self, percentile: float = 0.0) -> float:
        """Time to first token (s): mean (percentile 0) or the given percentile."""
        m = self.model
        if percentile == 0:
            return self._fixed_ttft(m.input_len.mean) + self.wait_mean_s + self.api_wait_s
        fixed = self._memo.get("ttft")
        if fixed is None:
            fixed = self._memo["ttft"] = self._ttft_nodes()
        return self._plus_wait_quantile(percentile / 100, fixed)

    def _ttft_nodes(self) -> list[tuple[float, float]]:
        """(TTFT without waiting, weight) at the prompt-length nodes, in increasing order: ``_fixed_ttft`` for
        each node, written out (it runs for every point a search evaluates). Lockstep ranks: the prompt's last step
        lasts as long as the longest chunk peers prefill beside it, a mixture over their chunks' nodes
        (``_peer_steps``) where the mean takes one peer step (``_beside_peers``), and the rest of the running step
        is a mixture too (``_residual_nodes``)."""
        m, w = self.model, self.w
        o = m.overheads
        base = o.request_s + o.stream_s + self.api_delay_s - self.api_wait_s
        per_token, share = o.per_input_token_s + o.api_input_token_s, 1 - m.prefix_hit_ratio
        cap, step = self.prefill_capacity, w.step
        batch = 0.0 if m.policy.prefill_first else self.batch   # decoding sequences in the prompt's own steps
        peers: list[tuple[float, float]] = [(1.0, 0.0)]
        if m.lockstep_ranks > 1 and self.peer_step_share:
            together = self._peer_beside()
            peers = [(1 - together, 0.0)] + [(together * pw, tau) for pw, tau in self._peer_steps(self.batch, 0.0)]
        full_step = -1.0
        out = []
        for prompt, weight in m.input_len.nodes(True):
            t = base + per_token * prompt
            tokens = prompt * share if m.role != "decode" else 0.0
            last = 0.0
            if tokens > 0:
                full = math.ceil(tokens / cap) - 1
                last = step(batch, tokens - full * cap, 1.0)
                if full:
                    if full_step < 0:
                        full_step = self._beside_peers(step(batch, cap, cap / w.prefill_mean))
                    t += full * full_step
            out += [(t + max(last, tau), weight * pw) for pw, tau in peers]
        rests = self._residual_nodes()
        nodes = [(value + rest, weight * chance) for value, weight in out for rest, chance in rests]
        return nodes if len(peers) == 1 and len(rests) == 1 else sorted(nodes)   # one of each: in prompt order

    def tpot(self, percentile: float = 0.0) -> float:
        """Time per output token after the first (s), per request: mean or percentile over requests.

        A request sees 1 + m sequences decoding (m others, Poisson; the time-average over its life has
        variance 2m/3) and prefill chunks in a share q of its D steps: prompts arrive Poisson and each takes k
        consecutive steps (k = ceil(P / room), 1 for prompts that share a step), so the share's variance is
        q (1 - q) E[k^2] / E[k] x E[1/D] (binomial when every prompt fits a step; averaged over the output
        lengths); percentile = mean + z x the two spreads added in quadrature. Lockstep ranks: a share s of the
        steps waits for a peer's prefill chunk, with the same spread (a third, independent term)."""
        m, w = self.model, self.w
        seats = self.seats if self.seats >= 1 else 1.0
        seen = min(1 + self.decode_others, seats)
        q, s = self.prefill_step_share, self.peer_step_share
        decode = self._step(seen, 0.0) + self.slowest_rank_s
        prefill, emitting = self._own_prefill_step(seen, decode)
        peer = self._peer_step(seen, decode) if s else decode
        mean = (q * prefill + s * peer + (1 - q - s) * decode) / emitting
        if percentile:
            z = normal_quantile(percentile / 100)
            slope = self._step(min(seen + 1, seats + 1), 0.0) - decode
            if m.policy.prefill_first:   # own prefill steps come between two tokens, geometric in number
                peers = s / emitting
                steps = prefill ** 2 * q / emitting ** 2 + (peer - decode) ** 2 * peers * (1 - peers)
            else:
                steps = (prefill - decode) ** 2 * q * (1 - q) + (peer - decode) ** 2 * s * (1 - s)
            var = slope * slope * 2 * self.decode_others / 3 + steps * self._clustering() * w.inverse_steps
            mean = max(mean + z * math.sqrt(var), decode if z < 0 else mean)
        return mean / w.accepted + (m.kv_transfer_s / max(w.decode_tokens, 1.0) if m.role == "decode" else 0.0)

    def _own_prefill_step(self, seen: float, decode: float) -> tuple[float, float]:
        """A step that prefills this rank's prompts, and the share of steps that give its decoding sequences a token:
        with the decodes in it (1), or, prefill first (SGLang), without them (1 - q: they wait for the next step).
        In a lockstep group it lasts as long as the longest chunk among its own and its peers' (``_longest_chunk``)."""
        q = self.prefill_step_share
        if not q:
            return decode, 1.0
        m = self.model
        chunk = self.chunk_tokens
        if m.lockstep_ranks > 1:
            chunk = min(chunk * _longest_chunk(m.input_len, m.lockstep_ranks - 1, q, own=True), self.prefill_capacity)
        if m.policy.prefill_first:
            return self._step(0.0, chunk), 1 - q
        return self._step(seen, chunk), 1.0

    def _clustering(self) -> float:
        """E[k^2] / E[k] of the prefill steps k = ceil(P / room) one prompt takes (prompt-length nodes)."""
        value = self._memo.get("cluster")
        if value is None:
            cap, share = self.prefill_capacity, 1 - self.model.prefix_hit_ratio
            first = second = 0.0
            for x, weight in self.model.input_len.nodes(True):
                k = max(math.ceil(x * share / cap - 1e-9), 1) if cap > 0 else 1
                first += weight * k
                second += weight * k * k
            value = self._memo["cluster"] = second / first if first > 0 else 1.0
        return value

    def itl(self, percentile: float = 0.0) -> float:
        """Inter-token latency (s): the gap between two streamed chunks, over all gaps (vLLM bench's ITL). A gap is
        one step at the batch it carries (1 + Poisson(m) decoding, capped by the seats): a decode-only step, or with
        probability q one that carries a prefill chunk, whose size follows the prompt lengths (scaled to the mean
        chunk, capped by the room in a step). Mean (percentile 0) or the percentile of that mixture, each step time
        spread normally by the batch's Poisson spread (variance m). Prefill first (SGLang): ``_prefill_first_gaps``.
        Lockstep ranks: a share of the decode-only gaps lasts a peer's prefill step instead (``_peer_step``)."""
        seats = self.seats if self.seats >= 1 else 1.0
        seen = min(1 + self.decode_others, seats)
        q, s = self.prefill_step_share, self.peer_step_share
        decode = self._step(seen, 0.0) + self.slowest_rank_s
        peer = self._peer_step(seen, decode) if s else decode
        if percentile == 0:
            prefill, emitting = self._own_prefill_step(seen, decode)
            return (q * prefill + s * peer + (1 - q - s) * decode) / emitting
        key = ("itl", percentile)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        if q and self.model.policy.prefill_first:
            parts = self._prefill_first_gaps(decode)
        else:
            parts = [(1 - q, decode)]
            if q:
                nodes = self.model.input_len.nodes(True)
                cap = self.prefill_capacity
                typical = sum(wt * min(x, cap) for x, wt in nodes)
                scale = self.chunk_tokens / typical if typical > 0 else 1.0
                parts += [(q * wt, self._step(seen, min(x * scale, cap))) for x, wt in nodes]
        if s and self.model.policy.prefill_first:   # a gap's closing decode step waits for peers' prefill
            long = min(s / (1 - q), 1.0)
            peers = self._peer_steps(seen, decode)
            parts = [(wt * (1 - long), gap) for wt, gap in parts] + [(wt * long * pw, gap - decode + tau)
                                                                     for wt, gap in parts for pw, tau in peers]
        elif s:   # taken from the decode-only gaps
            share = min(s, parts[0][0])
            parts = [(parts[0][0] - share, decode), *((share * pw, tau) for pw, tau in self._peer_steps(seen, decode)),
                     *parts[1:]]
        sigma = (self._step(min(seen + 1, seats + 1), 0.0) - decode) * math.sqrt(self.decode_others)
        value = _mixture_quantile(percentile / 100, tuple(parts), max(sigma, 0.0))
        self._memo[key] = value
        return value

    def _prefill_first_gaps(self, decode: float) -> list[tuple[float, float]]:
        """(weight, gap) of SGLang's inter-token gaps: a decode step after all the prefill that ran since the last
        one. A gap holds prefill when a prompt arrived during the decode step before it (probability
        g = 1 - exp(-rate x decode step)); the prompts arriving while those prefill join the same run, so with m
        prompts per decode step a run holds k >= 1 prompts, k geometric with mean m / g, prefilled together in
        consecutive steps of the room (``_prefill_service`` of k prompts' tokens)."""
        m = self.model
        share = 1 - m.prefix_hit_ratio
        own = self.prefill_step_share   # share of all steps that prefill here; the rest decode
        per_decode = own * self.chunk_tokens / self.w.prefill_mean / (1 - own)   # prompts per decode step
        q = min(1 - math.exp(-self.rate_per_s * decode), per_decode)
        mean_run = per_decode / q if q > 0 else 1.0
        chain = 1 - 1 / mean_run
        longest = max(1, min(12, math.ceil(math.log(1e-3) / math.log(chain)))) if chain > 0 else 1
        runs = [((1 - chain) * chain ** (k - 1), k) for k in range(1, longest + 1)]
        parts = [(1 - q, decode)]
        for x, wt in m.input_len.nodes(True):
            parts += [(q * wt * weight, decode + self._prefill_service(k * x * share)) for weight, k in runs]
        return parts

    def e2e(self, percentile: float = 0.0) -> float:
        """End-to-end latency (s): TTFT + (output - 1) x TPOT; percentiles over the output lengths and the
        wait, with TTFT's own spread at the mean prompt."""
        m = self.model
        tpot = self.tpot(0)
        start = self._fixed_ttft(m.input_len.mean) if m.role != "decode" else 0.0
        if percentile == 0:
            return start + self.wait_mean_s + self.api_wait_s + max(m.output_len.mean - 1, 0.0) * tpot
        fixed = [(start + max(o - 1, 0.0) * tpot, weight) for o, weight in m.output_len.nodes()]
        return self._plus_wait_quantile(percentile / 100, fixed)

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


def _mixture_quantile(p: float, parts: tuple[tuple[float, float], ...], sigma: float) -> float:
    """The p-quantile of a mixture of normals N(value, sigma^2) with the given (weight, value) parts; sigma 0: of the
    discrete distribution. Bisection on the CDF (60 halvings: exact to the float)."""
    parts = tuple((wt, v) for wt, v in parts if wt > 0)
    if sigma <= 0:
        acc = 0.0
        for wt, v in sorted(parts, key=lambda x: x[1]):
            acc += wt
            if acc >= p - 1e-12:
                return v
        return max(v for _, v in parts)
    lo = min(v for _, v in parts) - 8 * sigma
    hi = max(v for _, v in parts) + 8 * sigma
    scale = 1 / (sigma * math.sqrt(2))
    for _ in range(60):
        mid = (lo + hi) / 2
        cdf = sum(wt * 0.5 * (1 + math.erf((mid - v) * scale)) for wt, v in parts)
        lo, hi = (mid, hi) if cdf < p else (lo, mid)
        if hi - lo <= 1e-12 * max(abs(hi), 1e-9):
            break
    return max((lo + hi) / 2, 0.0)


class _Mix(NamedTuple):
    """The steps of a busy replica whose steps carry ``batch`` decoding sequences and, on average,
    ``prefill_per_step`` prompt tokens (a named tuple: built millions of times in a search)."""

    capacity: float
    tau_d: float
    tau_full: float
    tau_p: float
    tau_mean: float
    q: float
    chunk: float
    rho_steps: float
    prefill_alone: float
    decode_time: float
    limit: str
    peer_share: float = 0.0     # lockstep: share of steps without prefill here that a peer rank's prefill lengthens
    tau_peer: float = 0.0       # such a step's time


def _plus_one_wait_quantile(p: float, nodes: list[tuple[float, float]], pw: float, mean: float) -> float:
    """The p-quantile of F + W: F takes each (value, weight) of ``nodes`` (in increasing order), W (the queueing
    wait, independent of F) is 0 with probability 1 - ``pw`` and exponential with mean ``mean`` / pw otherwise.
    Between two values of F the CDF is A - K exp(-t / theta), solved in closed form; at a value of F it jumps (the
    atom of W)."""
    if pw <= 0 or mean <= 0:
        acc = 0.0
        for value, weight in nodes:
            acc += weight
            if acc >= p - 1e-12:
                return value
        return nodes[-1][0]
    theta = mean / pw
    total = k = 0.0   # mass of F at or below t; K: the exponential tails' weight at the current node
    previous = nodes[0][0]
    for j, (value, weight) in enumerate(nodes):
        k = k * math.exp(-(value - previous) / theta) + weight * pw
        total += weight
        previous = value
        if total - k >= p:
            return value
        x = -theta * math.log((total - p) / k) if total > p else math.inf
        if j == len(nodes) - 1 or value + x < nodes[j + 1][0]:
            return value + x
    return math.inf


def _plus_waits_quantile(p: float, nodes: list[tuple[float, float]], engine: tuple[float, float],
                         api: tuple[float, float]) -> float:
    """The p-quantile of F + W + A: F takes each (value, weight) of ``nodes`` (in increasing order), W and A are
    independent waits, each 0 with probability 1 - q and exponential with mean m / q otherwise ((q, m) =
    ``engine``, ``api``). P(W + A <= x) sums the four cases (neither waits, one, both: a hypoexponential); the
    quantile is found by Newton's method on the CDF of the sum, kept inside a bisection bracket, to 1 us, from
    the quantile of one wait with the two's probability and mean (closed form)."""
    (qw, mw), (qa, ma) = engine, api
    tw, ta = (mw / qw if qw > 0 else 0.0), ma / qa
    if abs(tw - ta) < 1e-6 * ta:
        tw = ta * (1 + 1e-6)   # equal means: the hypoexponential's limit, nudged apart
    none = (1 - qw) * (1 - qa)
    # P(W + A <= x) = 1 - a_tail e^(-x/ta) - w_tail e^(-x/tw): the A-only, W-only and hypoexponential terms collected
    # (tw = 0: no engine wait, W = 0)
    both = qw * qa / (tw - ta) if tw > 0 else 0.0
    a_tail, w_tail = (1 - qw) * qa - both * ta, (qw * (1 - qa) + both * tw if tw > 0 else 0.0)
    exp = math.exp

    def cdf_pdf(t: float) -> tuple[float, float]:
        cdf = pdf = 0.0
        for value, weight in nodes:
            x = t - value
            if x < 0:
                break
            ea = a_tail * exp(-x / ta)
            ew = w_tail * exp(-x / tw) if tw > 0 else 0.0
            cdf += weight * (1 - ea - ew)
            pdf += weight * (ea / ta + (ew / tw if tw > 0 else 0.0))
        return cdf, pdf

    lo, hi = nodes[0][0], math.inf
    if p <= nodes[0][1] * none:   # within the atom of the fastest F with neither wait
        return lo
    t = max(_plus_one_wait_quantile(p, nodes, 1 - none, mw + ma), lo)
    for _ in range(200):
        cdf, pdf = cdf_pdf(t)
        if cdf >= p:
            hi = t
        else:
            lo = t
        nxt = t + (p - cdf) / pdf if pdf > 0 else math.inf
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2 if hi < math.inf else lo + 2 * (lo - nodes[0][0]) + tw + ta
        if abs(nxt - t) < 1e-6 or hi - lo < 1e-6:
            return nxt
        t = nxt
    return t


def _mix(r: ReplicaServing, w: _Work, batch: float, prefill_per_step: float) -> _Mix:
    limit = ""
    cap = r.policy.max_prefill_tokens
    budget = r.max_num_batched_tokens if cap is None else min(r.max_num_batched_tokens, cap)
    capacity = budget - (0.0 if r.policy.prefill_first else batch * w.tokens_per_decode)
    if capacity < 1 and w.prefill_mean > 0:
        capacity, limit = 1.0, "token budget"
    tau_d = w.step(batch, 0.0, 0.0) if r.lockstep_ranks <= 1 else _slowest_decode(w, batch, r.lockstep_ranks)
    if not w.prefill_mean:
        return _Mix(capacity, tau_d, tau_d, tau_d, tau_d, 0.0, 0.0, 0.0, 0.0, w.steps * tau_d, limit)
    beside = 0.0 if r.policy.prefill_first else batch   # decoding sequences in a prompt's own steps
    tau_full = w.step(beside, capacity, capacity / w.prefill_mean)
    prompts = prefill_per_step / w.prefill_mean
    rho_steps = prefill_per_step / capacity                      # share of step capacity used by prefill
    if r.policy.prefill_first:
        # prompts prefill in steps of their own, y per decode step: those arriving during one step share the next
        # while they fit, a prompt takes E[ceil(P / capacity)] of them, and together they carry at most the
        # capacity each; so q = y / (1 + y) of all steps prefill here, and prompts arrive (1 - q) N / P a step
        pieces = r.input_len.pieces(capacity / (1 - r.prefix_hit_ratio))
        y = max((1 - math.exp(-prompts)) * pieces, rho_steps)
        q = y / (1 + y)
        chunk = prefill_per_step / y if y else 0.0
        prompts *= 1 - q
    else:
        if rho_steps >= 1:
            limit = limit or "prefill throughput"
            rho_steps = 0.999
        # Prompts arrive Poisson: a step finds new prefill work with probability 1 - exp(-prompts per step);
        # a step carries at most the capacity, so under load q = N / capacity. A prompt longer than the room left
        # beside the decodes is prefilled in chunks over consecutive steps (running sequences first), which keep a
        # lockstep rank prefilling whatever arrives meanwhile (``_peer_share``): ``pieces`` counts them in full
        # steps' worth of tokens, so that a prompt a few tokens over the room counts as one step, not two.
        pieces = r.input_len.steps_of(capacity / (1 - r.prefix_hit_ratio)) if r.lockstep_ranks > 1 else 1.0
        q = max(1 - math.exp(-prompts), rho_steps) if prefill_per_step > 0 else 0.0
        chunk = prefill_per_step / q if q else 0.0
    tau_p = w.step(beside, chunk, chunk / w.prefill_mean) if chunk else tau_d
    tau_mean = q * tau_p + (1 - q) * tau_d
    peer_share = tau_peer = 0.0
    if r.lockstep_ranks > 1 and chunk:   # a step without prefill here still lasts as long as a peer's with
        longest = min(chunk * _longest_chunk(r.input_len, r.lockstep_ranks - 1, q), capacity)
        tau_peer = max(tau_d, w.step(beside, longest, longest / w.prefill_mean))
        peer_share = _peer_share(q, prompts, r.lockstep_ranks, tau_d, tau_peer, pieces)
        # this rank's own prefill step lasts as long as the longest chunk among it and the peers prefilling beside it
        own = min(chunk * _longest_chunk(r.input_len, r.lockstep_ranks - 1, q, own=True), capacity)
        tau_p = max(tau_p, w.step(beside, own, own / w.prefill_mean))
        tau_mean = q * tau_p + (1 - q) * tau_d + peer_share * (tau_peer - tau_d)
    full = math.ceil(w.prefill_mean / capacity) - 1
    alone = full * tau_full + w.step(beside, w.prefill_mean - full * capacity, 1.0)
    # prefill first: the steps that prefill here give the decoding sequences no token, so each of a request's
    # decode steps comes with q / (1 - q) of them
    emitting = 1 - q if r.policy.prefill_first else 1.0
    return _Mix(capacity, tau_d, tau_full, tau_p, tau_mean, q, chunk, rho_steps, alone, w.steps * tau_mean / emitting,
                limit, peer_share, tau_peer)


def _longest_chunk(prompts: LengthDist, peers: int, q: float, own: bool = False) -> float:
    """The longest chunk a lockstep step prefills, over the mean chunk: each of ``peers`` prefills with probability q
    (K of them, binomial), each chunk following the prompt lengths: E[max of K draws] / E[draw]
    (``LengthDist.max_of``) given K >= 1, or with ``own`` of 1 + K draws (this rank prefills too)."""
    if peers < 1 or q <= 0:
        return 1.0
    mean = prompts.max_of(1)
    if mean <= 0:
        return 1.0
    counts = _peer_counts(peers, q, 0 if own else 1)
    weight = sum(p for p, _ in counts)
    total = sum(p * prompts.max_of(k + own) for p, k in counts)
    return total / (weight * mean) if weight > 0 else 1.0


def _peer_counts(peers: int, q: float, least: int) -> list[tuple[float, int]]:
    """(probability, k) of k = ``least`` ... ``peers`` of the peers prefilling in a step, each with probability q
    (binomial; not renormalised)."""
    return [(math.comb(peers, k) * q ** k * (1 - q) ** (peers - k), k) for k in range(least, peers + 1)]


def _slowest_decode(w: _Work, batch: float, ranks: int) -> float:
    """A lockstep group's decode-only step: it lasts as long as its slowest rank's, this one at ``batch`` decoding
    sequences and each peer at a Poisson(``batch``) count (independent): E[tau_d(max(batch, M))], P(M <= k) =
    F(k)^(ranks - 1), summed term by term below ``EXACT_SLOWEST_BELOW`` sequences; above, tau_d at batch + sqrt(batch)
    x E[max(0, the largest of ranks - 1 standard normals)] (one step time: a search asks this millions of times)."""
    own = w.step(batch, 0.0, 0.0)
    if batch <= 0:
        return own
    if batch >= EXACT_SLOWEST_BELOW:
        return w.step(batch + math.sqrt(batch) * _normal_max_excess(ranks - 1), 0.0, 0.0)
    top = int(batch + 8 * math.sqrt(batch) + 8)
    pmf = cdf = math.exp(-batch)
    below = cdf ** (ranks - 1)
    total = below * own
    for k in range(1, top + 1):
        pmf *= batch / k
        cdf += pmf
        at_most = cdf ** (ranks - 1)
        total += (at_most - below) * (w.step(float(k), 0.0, 0.0) if k > batch else own)
        below = at_most
    return total + (1 - below) * w.step(float(top), 0.0, 0.0)


EXACT_SLOWEST_BELOW = 8.0


@functools.lru_cache(maxsize=64)
def _normal_max_excess(count: int) -> float:
    """E[max(0, Z_1, ..., Z_count)] for independent standard normals: the integral of 1 - Phi(x)^count over x > 0
    (midpoint rule, step 0.005, to 8)."""
    h = 0.005
    return sum((1 - (0.5 * (1 + math.erf((i + 0.5) * h / math.sqrt(2)))) ** count) * h for i in range(1600))


def _peer_share(q: float, prompts_per_step: float, ranks: int, tau_d: float, tau_long: float,
                pieces: float = 1.0) -> float:
    """Share of a lockstep rank's steps without prefill of its own that a peer's prefill lengthens. A prompt is
    prefilled in the step after it arrives, so a step is long when some rank's prompt arrived during the one before:
    with probability a = 1 - exp(-n lam tau_d) after a decode-only step, b = 1 - exp(-n lam tau_long) after a long one
    (n ranks, each's prompts Poisson at lam = prompts per step / mean step). Long steps draw the arrivals that make
    the next one long: the chain's stationary share of long steps is Q = a / (1 - b + a) (solved with the mean step
    it implies), against 1 - (1 - q)^n for ranks prefilling independently; the peers' part is Q - q. Prompts of
    ``pieces`` >= 2 steps each (in chunks of the budget: SGLang's prefill steps, or vLLM's chunks beside the decodes)
    keep their ranks prefilling whatever arrives: Q is then at least the independent share."""
    if q <= 0 or prompts_per_step <= 0:
        return 0.0
    share = 1 - (1 - q) ** ranks
    # prompts of two or more steps each keep their rank prefilling whatever arrives: at least the ranks' independent
    # share (blended in between one and two steps a prompt)
    floor = 1 - (1 - q * min(max(pieces - 1, 0.0), 1.0)) ** ranks
    for _ in range(20):
        rate = ranks * prompts_per_step / ((1 - share) * tau_d + share * tau_long)
        short_next, long_next = 1 - math.exp(-rate * tau_d), 1 - math.exp(-rate * tau_long)
        new = max(short_next / (1 - long_next + short_next), floor, q)
        if abs(new - share) < 1e-6:
            break
        share = new
    return min(max(share - q, 0.0), 1 - q)


def at_load(r: ReplicaServing, load: float, w: _Work | None = None) -> Point:
    """The operating point at offered seat load ``load`` = arrival rate x time a request holds a seat (the
    mean number of requests being served: M/G/c with c = min(max_num_seqs, KV-limited sequences))."""
    w = w or _work(r)
    kv_seats = r.kv_capacity_tokens / w.kv_units_live
    seats = min(float(r.max_num_seqs), kv_seats)
    c = max(int(seats), 1)
    a = load
    stable, limit = True, ""
    if a >= c:
        stable, limit = False, ("max_num_seqs" if r.max_num_seqs <= kv_seats else "KV cache")
        a = c * (1 - 1e-9)
    p_seat, p_empty = erlang(c, a)
    busy = max(1 - p_empty, 1e-12)
    transfer = r.kv_transfer_s if r.role == "decode" else 0.0
    # Fixed point on the share of a request's engine time spent decoding (weakly load-dependent), always from
    # the same start so that a load maps to exactly one point.
    share = 1.0 if w.steps else 0.0
    engine = tau = 0.0
    for _ in range(12):
        batch = a * share / busy
        if w.steps:
            per_step = batch * w.prefill_mean / w.steps
        else:  # outputs of one token: prompts per busy step from the rate and the step time
            per_step = (a / engine if engine else 0.0) * w.prefill_mean * tau / busy
        mix = _mix(r, w, batch, per_step)
        engine_new = mix.prefill_alone + mix.decode_time + transfer
        share_new = mix.decode_time / engine_new if engine_new > 0 else 0.0
        converged = abs(engine_new - engine) <= 1e-4 * engine_new
        engine, share, tau = engine_new, share_new, mix.tau_mean
        if converged:
            break
    rate = a / engine if engine > 0 else 0.0
    if mix.limit:
        stable, limit = False, limit or mix.limit
    others = rate * mix.decode_time
    cs2 = (r.output_len.variance / max(w.decode_tokens, 1.0) ** 2) * (mix.decode_time / engine) ** 2 if engine else 0.0
    wait_seat = p_seat * engine / max(c - a, 1e-9) * (1 + cs2) / 2 if p_seat > 0 else 0.0
    mu_tokens = mix.capacity / mix.tau_full if w.prefill_mean else math.inf
    rho_p = rate * w.prefill_mean / mu_tokens if w.prefill_mean else 0.0
    if rho_p >= 1:
        stable, limit = False, limit or "prefill throughput"
    wait_prefill = rate * w.prefill_m2 / mu_tokens ** 2 / (2 * (1 - rho_p)) if 0 < rho_p < 1 else 0.0
    p_wait = 1 - (1 - min(p_seat, 1.0)) * (1 - min(rho_p, 1.0))
    api_rho, api_delay, api_wait = _api_queue(r, w, rate, busy, mix.tau_mean)
    if api_rho >= 1:
        stable, limit = False, limit or "API server"
    return Point(model=r, batch=batch, rate_per_s=rate, stable=stable, limit=limit, step_s=mix.tau_mean,
                 decode_step_s=mix.tau_d, prefill_step_s=mix.tau_p, prefill_step_share=mix.q,
                 chunk_tokens=mix.chunk, prefill_capacity=mix.capacity, busy=busy, decode_others=others, seats=seats,
                 kv_seats=kv_seats, seat_load=a, wait_probability=p_wait, wait_mean_s=wait_seat + wait_prefill,
                 prefill_utilization=rho_p, engine_time_s=engine, w=w, api_utilization=api_rho,
                 api_delay_s=api_delay, api_wait_s=api_wait, peer_step_share=mix.peer_share,
                 peer_step_s=mix.tau_peer,
                 slowest_rank_s=mix.tau_d - w.step(batch, 0.0, 0.0) if r.lockstep_ranks > 1 else 0.0)


def _api_queue(r: ReplicaServing, w: _Work, rate: float, busy: float,
               step_s: float) -> tuple[float, float, float]:
    """(utilization of one API server, a request's mean API delay on its way in and for its first token, the
    queueing part of that delay).

    Each of the N servers takes 1/N of the requests: utilization rho = (rate / N) x work per request. Its tasks are
    the requests' own work S (Poisson arrivals) and, at the end of every engine step, a bulk of b streamed chunks of
    c each (b = chunks per second per server x step time / busy share), streamed in scheduling order: running
    sequences first, new ones last. A request arriving at a random time waits for the work the server holds, first
    come first served: Pollaczek-Khinchine's residual work R / (1 - rho), R = lambda E[S^2] / 2 + (steps per
    second) (b c)^2 / 2 (the bulks' residual); its first token is the last of its bulk and waits for the other
    requests' work, lambda E[S^2] / (2 (1 - rho)), and the whole bulk, b c. Delay = both waits + S (its prompt part
    is added per prompt length); the waits are the random part (``Point.api_wait_s``). tests/calc/test_serving.py
    checks it against the simulation and against M/D/1.
    """
    o = r.overheads
    if not o.has_api or rate <= 0:
        return 0.0, 0.0, 0.0
    lam = rate / o.api_servers
    rho = lam * w.api_work
    if rho >= 1:
        return rho, math.inf, 0.0
    chunk = o.api_token_s
    bulk = lam * w.chunks * step_s / busy * chunk if busy > 0 else 0.0   # work of one bulk (s)
    steps_per_s = busy / step_s if step_s > 0 else 0.0
    others = lam * w.api_request_m2 / (2 * (1 - rho))
    arrival = steps_per_s * bulk * bulk / 2 + others
    first = others if chunk else 0.0   # a chunk of no work does not queue
    wait = arrival + first
    return rho, wait + o.api_request_s + (max(bulk, chunk) if chunk else 0.0), wait


def load_limit(r: ReplicaServing) -> float:
    """The seat count c: the offered load must stay below it."""
    w = _work(r)
    return max(min(float(r.max_num_seqs), r.kv_capacity_tokens / w.kv_units_live), 1.0)


def at_rate(r: ReplicaServing, rate: float, below: Point | None = None, known: tuple[Point, ...] = ()) -> Point:
    """The operating point at arrival rate ``rate`` (req/s); unstable if the replica cannot carry it.
    ``below``: a stable point known to carry at least ``rate``; ``known``: points already evaluated (both
    narrow the search)."""
    w = _work(r)
    lo = 1e-9
    if below is not None and below.stable and below.rate_per_s >= rate:
        hi_point, lo_point = below, None
        for p in known:
            if p.stable and p.model is r:
                if p.rate_per_s >= rate and p.seat_load < hi_point.seat_load:
                    hi_point = p
                elif p.rate_per_s < rate and (lo_point is None or p.seat_load > lo_point.seat_load):
                    lo_point = p
        if abs(hi_point.rate_per_s - rate) <= 1e-3 * rate:
            return hi_point
        if lo_point is None:   # at light load rate ~ a / T: a first guess from the known point's time in system
            guess = rate * hi_point.seat_load / hi_point.rate_per_s
            lo_point = at_load(r, min(guess * 0.99, hi_point.seat_load * 0.5 + guess * 0.5), w)
            if not lo_point.stable or lo_point.rate_per_s >= rate:
                lo_point = None
        return _solve_load(r, w, lo_point.seat_load if lo_point else lo, hi_point.seat_load,
                           lambda p: p.rate_per_s, rate, lo_point, hi_point)
    hi = load_limit(r) * (1 - 1e-9)
    top = at_load(r, hi, w)
    if top.rate_per_s < rate or not top.stable:
        point = _last_stable(r, w, lo, hi)
        if point.stable and point.rate_per_s >= rate:
            return _solve_load(r, w, lo, point.seat_load, lambda p: p.rate_per_s, rate)
        return _replace_unstable(point, rate, point.limit or top.limit or "throughput")
    return _solve_load(r, w, lo, hi, lambda p: p.rate_per_s, rate)


def _replace_unstable(point: Point, rate: float, limit: str) -> Point:
    from dataclasses import replace

    return replace(point, rate_per_s=rate, stable=False, limit=limit or "throughput")


def _solve_load(r: ReplicaServing, w: _Work, lo: float, hi: float, value: Callable[[Point], float],
                target: float, p_lo: Point | None = None, p_hi: Point | None = None) -> Point:
    """The point where ``value`` (increasing in the load) reaches ``target`` (to 0.1 %), by the Illinois variant of
    regula falsi between loads ``lo`` and ``hi`` (their points, when already known)."""
    p_lo = p_lo or at_load(r, lo, w)
    p_hi = p_hi or at_load(r, hi, w)
    point = p_hi
    f_lo, f_hi = value(p_lo) - target, value(p_hi) - target
    side = 0
    for _ in range(60):
        if abs(value(point) - target) <= 1e-3 * target or hi - lo <= 1e-9 * hi:
            break
        span = f_hi - f_lo
        mid = lo + (hi - lo) * (-f_lo) / span if span > 0 and math.isfinite(span) else (lo + hi) / 2
        mid = min(max(mid, lo + 1e-4 * (hi - lo)), hi - 1e-4 * (hi - lo))
        p = at_load(r, mid, w)
        f = value(p) - target
        if f >= 0:
            hi, f_hi, point = mid, f, p
            if side == 1:
                f_lo /= 2
            side = 1
        else:
            lo, f_lo = mid, f
            if side == -1:
                f_hi /= 2
            side = -1
    return point


def _last_stable(r: ReplicaServing, w: _Work, lo: float, hi: float) -> Point:
    best = at_load(r, lo, w)
    if not best.stable:
        return best
    for _ in range(50):
        mid = (lo + hi) / 2
        p = at_load(r, mid, w)
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
    explored: tuple[Point, ...] = field(default=(), repr=False)   # points evaluated on the way


# Capacity is searched on a fixed geometric grid of offered seat loads, a_k = 0.001 x 1.01^k: the answer is
# the largest grid point meeting the targets, whatever path the search takes to it, so it is exactly monotone
# in the targets (a looser target can only move it up) and the same for every max_num_seqs that does not bind.
_GRID_START = 0.001
_GRID_RATIO = 1.01
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


def _grid_index(load: float) -> int:
    return int(math.log(max(load, _GRID_START) / _GRID_START) / _LOG_RATIO)


def _largest_meeting(points: Callable[[int], Point], targets: tuple[Target, ...], lo: int, hi: int,
                     s_lo: float, s_hi: float) -> tuple[int, int]:
    """Largest k in [lo, hi) with slack <= 0, given slack(lo) <= 0 < slack(hi): (k, k + 1), by the Illinois
    variant of regula falsi on the load (rounded to the grid), bisection where the slack is infinite."""
    side = 0
    while hi - lo > 1:
        if math.isfinite(s_hi) and s_hi - s_lo > 0:
            a_lo, a_hi = _grid(lo), _grid(hi)
            mid = _grid_index(a_lo + (a_hi - a_lo) * (-s_lo) / (s_hi - s_lo))
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


def max_rates(r: ReplicaServing, targets: tuple[Target, ...], relaxed: tuple[Target, ...] | None = None,
              known: Capacity | None = None, hints: tuple[int | None, int | None] = (None, None)
              ) -> tuple[Capacity, Capacity]:
    """Largest arrival rate at which the replica is stable and meets ``targets``; and the same for a subset
    ``relaxed`` of them (the Pareto frontier uses all but TPOT). Both share the grid points evaluated;
    ``known``: the answer for ``targets`` when already known (only the relaxed search runs); ``hints``: grid
    indices where the two answers are likely (a similar configuration's), where the searches start. The answer is
    the largest grid point meeting the targets whatever the start (the slack grows with the load)."""
    w = _work(r)
    top = max(1, _grid_index(load_limit(r)))
    cache: dict[int, Point] = {}

    def points(k: int) -> Point:
        p = cache.get(k)
        if p is None:
            p = cache[k] = at_load(r, _grid(k), w)
        return p

    if known is not None:
        full = known
        start = min(_grid_index(known.point.seat_load), top)
        if known.rate_per_s <= 0 or _slack(points(start), relaxed or targets) > 0:
            start = 0
    else:
        full = _capacity(r, w, points, targets, 0, top, hints[0])
        start = max((k for k, p in cache.items() if p is full.point), default=0)
    if relaxed is None or relaxed == targets:
        return _with_explored(full, cache), _with_explored(full, cache)
    dropped = {t.label for t in targets if t not in relaxed}
    if known is None and full.binding not in dropped:
        # what stopped the full search (a kept target, or a limit) stops the relaxed one at the same grid point
        return _with_explored(full, cache), _with_explored(full, cache)
    return _with_explored(full, cache), _with_explored(_capacity(r, w, points, relaxed, start, top, hints[1]),
                                                       cache)


def capacity_index(c: Capacity) -> int | None:
    """The grid index of a capacity's operating point (a hint for a similar configuration's search)."""
    return _grid_index(c.point.seat_load) if c.rate_per_s > 0 else None


def _with_explored(c: Capacity, cache: dict[int, Point]) -> Capacity:
    from dataclasses import replace

    return replace(c, explored=tuple(cache.values())) if not c.explored else c


def _capacity(r: ReplicaServing, w: _Work, points: Callable[[int], Point], targets: tuple[Target, ...], lo: int,
              top: int, hint: int | None = None) -> Capacity:
    if hint is not None and lo < hint < top:
        bracket = _bracket(points, targets, lo, top, hint)
        if bracket is not None:
            return _capacity_between(r, points, targets, *bracket)
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
    return _capacity_between(r, points, targets, lo, top, s_first, s_last)


def _bracket(points: Callable[[int], Point], targets: tuple[Target, ...], lo: int, top: int,
             hint: int) -> tuple[int, int, float, float] | None:
    """(k, k', slack(k) <= 0 < slack(k')) found from ``hint`` by steps of 1, 4, 16 ... up or down; None when the
    answer is at an end of [lo, top] (the search from the ends decides those)."""
    s = _slack(points(hint), targets)
    step = 1
    if s <= 0:
        k, s_k = hint, s
        while True:
            nxt = min(k + step, top)
            s_n = _slack(points(nxt), targets)
            if s_n > 0:
                return k, nxt, s_k, s_n
            if nxt == top:
                return None
            k, s_k, step = nxt, s_n, step * 4
    k, s_k = hint, s
    while True:
        nxt = max(k - step, lo)
        s_n = _slack(points(nxt), targets)
        if s_n <= 0:
            return nxt, k, s_n, s_k
        if nxt == lo:
            return None
        k, s_k, step = nxt, s_n, step * 4


def _capacity_between(r: ReplicaServing, points: Callable[[int], Point], targets: tuple[Target, ...], lo: int,
                      hi: int, s_lo: float, s_hi: float) -> Capacity:
    """The capacity given slack(lo) <= 0 < slack(hi)."""
    k, over_k = _largest_meeting(points, targets, lo, hi, s_lo, s_hi)
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
    hi = load_limit(r) * (1 - 1e-9)

    def inflight(p: Point) -> float:
        return p.rate_per_s * (p.e2e(0) + r.overheads.stream_s) if p.stable else math.inf

    top = _last_stable(r, w, 1e-9, hi)
    if inflight(top) < concurrency:
        return top  # the seats are full: the rest wait in the queue
    return _solve_load(r, w, 1e-9, top.seat_load, inflight, concurrency)


# --- a prefill-only replica (disaggregated serving's prefill pool) -----------------------------------------


def prefill_only_at(r: ReplicaServing, rate: float) -> Point:
    """A replica whose steps carry only prefill chunks (no decodes): an M/G/1 queue of prompt tokens served
    C tokens per step; the first token leaves with the last chunk."""
    w = _work(r)
    capacity = float(r.max_num_batched_tokens)

    def tau(n: float, done: float) -> float:
        return w.step(0.0, n, done)

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
    tau_full = w.step(0.0, capacity, capacity / w.prefill_mean)
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
