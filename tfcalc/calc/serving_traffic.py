"""What a service asks for: request lengths, arrival pattern, latency targets, per-request overheads.

Length distributions (tokens): fixed; uniform over mean x [1 - r, 1 + r] (vLLM bench's --random-range-ratio);
lognormal with a coefficient of variation (chat traffic such as ShareGPT is right-skewed); exponential
(geometric in whole tokens: the M/M/1 limit); empirical (a list of lengths, e.g. from a CSV).
Pure math: no I/O.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Literal

from tfcalc.errors import UsageError
from tfcalc.spec.engine import EngineSpec, RequestCosts

_COARSE_PROBABILITIES = (0.1, 0.3, 0.5, 0.7, 0.85, 0.9, 0.95, 0.99, 0.999)
_NODE_PROBABILITIES = (0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.97, 0.98, 0.99, 0.995,
                       0.999)
DistKind = Literal["fixed", "uniform", "lognormal", "exponential", "empirical"]
Metric = Literal["ttft", "tpot", "itl", "e2e"]
METRICS: tuple[Metric, ...] = ("ttft", "tpot", "itl", "e2e")
METRIC_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "end-to-end"}
MAX_LOGNORMAL_SPREAD = 100.0  # coefficient of variation: sigma^2 = ln(1 + cv^2) stays finite


def _normal_quantile(p: float) -> float:
    """Inverse of the standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    if p <= 0 or p >= 1:
        raise ValueError("p must be in (0, 1)")
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)



@dataclass(frozen=True, kw_only=True)
class LengthDist:
    """A distribution of token counts (each sample at least 1)."""

    kind: DistKind = "fixed"
    mean: float = 1.0
    spread: float = 0.0                    # uniform: range ratio r; lognormal: coefficient of variation
    values: tuple[int, ...] = field(default=())  # empirical
    _quantiles: dict[float, float] = field(default_factory=dict, compare=False, hash=False, repr=False)
    _derived: dict[tuple[str, float], float] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind == "empirical":
            if not self.values or min(self.values) < 1:
                raise UsageError("an empirical length distribution needs positive lengths")
            object.__setattr__(self, "mean", sum(self.values) / len(self.values))
            return
        if self.mean < 1:
            raise UsageError(f"mean length must be at least 1 token, got {self.mean}")
        if self.kind == "uniform" and not 0 <= self.spread < 1:
            raise UsageError(f"uniform range ratio must be in [0, 1), got {self.spread}")
        if self.kind == "lognormal" and not 0 < self.spread <= MAX_LOGNORMAL_SPREAD:
            raise UsageError(f"lognormal spread (coefficient of variation) must be in (0, {MAX_LOGNORMAL_SPREAD:g}], "
                             f"got {self.spread}")

    @property
    def second_moment(self) -> float:
        m = self.mean
        if self.kind == "fixed":
            return m * m
        if self.kind == "uniform":
            half = m * self.spread
            return m * m + half * half / 3
        if self.kind == "lognormal":
            return m * m * (1 + self.spread ** 2)
        if self.kind == "exponential":
            return 2 * m * m - m  # geometric on {1, 2, ...} with mean m: E[X^2] = (2 - p) / p^2, p = 1/m
        return sum(v * v for v in self.values) / len(self.values)

    @property
    def variance(self) -> float:
        return max(self.second_moment - self.mean ** 2, 0.0)

    def quantile(self, p: float) -> float:
        """The p-quantile (0 < p < 1), continuous approximation (memoised: searches ask for a few p often)."""
        value = self._quantiles.get(p)
        if value is None:
            value = self._quantiles[p] = self._quantile(p)
        return value

    def nodes(self, coarse: bool = False) -> tuple[tuple[float, float], ...]:
        """(length, weight) pairs standing for the distribution: the quantiles at the probabilities in
        ``_NODE_PROBABILITIES`` (dense in the tail, exactly at p50/p90/p95/p99/p99.9) with trapezoid weights,
        so that a node's cumulative weight reaches its probability; equal lengths merged. ``coarse``: half as
        many (for lengths whose every node costs a step-time evaluation)."""
        key = -2.0 if coarse else -1.0
        cached = self._quantiles.get(key)
        if cached is None:
            merged: dict[float, float] = {}
            probs = _COARSE_PROBABILITIES if coarse else _NODE_PROBABILITIES
            last = len(probs) - 1
            for j, prob in enumerate(probs):
                start = (probs[j - 1] + prob) / 2 if j else 0.0
                end = (prob + probs[j + 1]) / 2 if j < last else 1.0
                value = self._quantile(prob)
                merged[value] = merged.get(value, 0.0) + end - start
            self._quantiles[key] = cached = tuple(merged.items())  # type: ignore[assignment]
        return cached  # type: ignore[return-value]

    def max_of(self, count: int) -> float:
        """E[the largest of ``count`` independent draws], over the nodes: P(max <= x) = F(x)^count."""
        key = ("max", count)
        cached = self._derived.get(key)
        if cached is None:
            cached = below = cdf = 0.0
            for x, weight in self.nodes():
                cdf += weight
                at_most = min(cdf, 1.0) ** count
                cached += x * (at_most - below)
                below = at_most
            self._derived[key] = cached
        return cached

    def pieces(self, size: float) -> float:
        """E[ceil(draw / size)]: the pieces of at most ``size`` a draw is cut into (the steps a prompt's prefill
        takes in chunks of that many tokens), over the nodes."""
        key = ("pieces", size)
        cached = self._derived.get(key)
        if cached is None:
            cached = sum(weight * max(math.ceil(x / size - 1e-9), 1) for x, weight in self.nodes()) if size > 0 \
                else 1.0
            self._derived[key] = cached
        return cached

    def steps_of(self, size: float) -> float:
        """E[max(draw / size, 1)]: the steps' worth of tokens a draw fills in steps of ``size`` (at least one), over
        the nodes; ``pieces`` without rounding the last, partly filled step up. Not cached: ``size`` is the room a
        search's every operating point leaves, a continuum."""
        return sum(weight * max(x / size, 1.0) for x, weight in self.nodes()) if size > 0 else 1.0

    def _quantile(self, p: float) -> float:
        m = self.mean
        if self.kind == "fixed":
            return m
        if self.kind == "uniform":
            return m * (1 - self.spread) + 2 * m * self.spread * p
        if self.kind == "lognormal":
            s2 = math.log(1 + self.spread ** 2)
            return m * math.exp(-s2 / 2 + math.sqrt(s2) * _normal_quantile(p))
        if self.kind == "exponential":
            return max(1.0, -m * math.log(1 - p))
        ordered = sorted(self.values)
        return float(ordered[min(len(ordered) - 1, int(p * len(ordered)))])

    def sample(self, rng: random.Random) -> int:
        """One length drawn from the distribution (rounded, at least 1)."""
        m = self.mean
        if self.kind == "fixed":
            return max(1, round(m))
        if self.kind == "uniform":
            lo, hi = max(1, math.floor(m * (1 - self.spread))), max(1, math.ceil(m * (1 + self.spread)))
            return rng.randint(lo, hi)
        if self.kind == "lognormal":
            s2 = math.log(1 + self.spread ** 2)
            return max(1, round(rng.lognormvariate(math.log(m) - s2 / 2, math.sqrt(s2))))
        if self.kind == "exponential":
            p = 1 / m
            return 1 if p >= 1 else 1 + int(math.log(1 - rng.random()) / math.log(1 - p))
        return rng.choice(self.values)

    @property
    def label(self) -> str:
        if self.kind == "fixed":
            return f"{self.mean:,.0f}"
        if self.kind == "uniform":
            return f"{self.mean:,.0f}±{self.spread:.0%}"
        if self.kind == "lognormal":
            return f"{self.mean:,.0f} (cv {self.spread:g})"
        if self.kind == "exponential":
            return f"{self.mean:,.0f} (exp)"
        return f"{self.mean:,.0f} (n={len(self.values)})"


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """Requests: prompt and output lengths, and either an open arrival rate or a closed-loop concurrency."""

    input_len: LengthDist
    output_len: LengthDist
    rate_per_s: float | None = None        # Poisson arrivals (requests/s, whole service)
    concurrency: int | None = None         # closed loop: this many requests always in flight
    prefix_hit_ratio: float = 0.0          # share of each prompt found in the prefix cache

    def __post_init__(self) -> None:
        if (self.rate_per_s is None) == (self.concurrency is None):
            raise UsageError("give the traffic as a request rate or as a concurrency (one of them)")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise UsageError(f"request rate must be positive, got {self.rate_per_s}")
        if self.concurrency is not None and self.concurrency < 1:
            raise UsageError(f"concurrency must be at least 1, got {self.concurrency}")
        if not 0 <= self.prefix_hit_ratio < 1:
            raise UsageError(f"prefix cache hit ratio must be in [0, 1), got {self.prefix_hit_ratio}")

    @property
    def load(self) -> float:
        return float(self.rate_per_s if self.rate_per_s is not None else self.concurrency)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class Target:
    """One latency target: ``metric`` at ``percentile`` (0 = mean) must be at most ``seconds``."""

    metric: Metric
    percentile: float
    seconds: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise UsageError(f"unknown latency metric '{self.metric}' (ttft, tpot, itl, e2e)")
        if not (self.percentile == 0 or 0 < self.percentile < 100):
            raise UsageError(f"percentile must be in (0, 100) or 0 for the mean, got {self.percentile}")
        if self.seconds <= 0:
            raise UsageError(f"latency target must be positive, got {self.seconds}")

    @property
    def label(self) -> str:
        which = "mean" if self.percentile == 0 else f"p{self.percentile:g}"
        return f"{METRIC_NAMES[self.metric]} {which}"

    @property
    def key(self) -> str:
        which = "mean" if self.percentile == 0 else f"p{self.percentile:g}".replace(".", "_")
        return f"{self.metric}_{which}_s"


@dataclass(frozen=True, kw_only=True)
class Overheads(RequestCosts):
    """Costs outside the GPU forward pass (seconds): an engine's request costs (``RequestCosts``, its preset's
    ``requests:`` block) with where they come from.

    Latencies (added to a request's path, shared by nothing): ``request_s`` from the client to the engine's queue
    beyond the API server's own work (network, IPC hand-off, the engine loop picking it up), ``per_input_token_s``
    per prompt token on that path, ``stream_s`` from the API server to the client; ``step_s``: CPU per engine step
    not overlapped with the GPU (scheduler, input preparation).
    The API server (vLLM's, SGLang's tokenizer manager, trtllm-serve) is a serial resource: one Python process per
    ``api_servers`` (vLLM --api-server-count), each request pinned to one. Its work per request:
    ``api_request_s`` (HTTP, validation, chat template, tokenization, hand-off) + ``api_input_token_s`` per prompt
    token + ``api_token_s`` per streamed chunk (detokenize, OpenAI chunk object, JSON, SSE write) -- one chunk per
    engine step that gives the request tokens. The serving model queues these (``tfcalc.calc.serving``), the
    simulation runs them (``tfcalc.calc.serving_sim``).
    """

    source: str = "none"

    def __post_init__(self) -> None:
        for name in (f.name for f in fields(RequestCosts) if f.name != "api_servers"):  # the seconds
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value <= 3600):
                raise UsageError(f"overhead {name} must be between 0 and 3600 s, got {value}")
        if not 1 <= self.api_servers <= 4096:
            raise UsageError(f"API server count must be between 1 and 4096, got {self.api_servers}")

    def front_s(self, input_tokens: float) -> float:
        """Latency before the engine that is not API-server work."""
        return self.request_s + self.per_input_token_s * input_tokens

    def api_work_s(self, input_tokens: float, chunks: float) -> float:
        """Serial API-server CPU of one request: its request part and its streamed chunks."""
        return self.api_request_s + self.api_input_token_s * input_tokens + self.api_token_s * chunks

    @property
    def has_api(self) -> bool:
        return bool(self.api_request_s or self.api_input_token_s or self.api_token_s)


def engine_overheads(engine: EngineSpec | None) -> Overheads:
    """An engine preset's request costs (its ``requests:`` block, inherited from its default version; sources in its
    ``sources.requests``) as the serving model's overheads; no engine (ideal): none."""
    if engine is None or engine.requests == RequestCosts():
        return Overheads(source=f"{engine.label if engine else 'ideal'}: no request overheads")
    r = engine.requests
    return Overheads(**asdict(r), source=f"{engine.label}: API server {r.api_request_s * 1e3:g} ms/request + "
                                         f"{r.api_token_s * 1e6:g} us/chunk, {r.request_s * 1e3:g} ms request latency "
                                         "(engine preset, sources.requests)")


normal_quantile = lru_cache(maxsize=256)(_normal_quantile)
