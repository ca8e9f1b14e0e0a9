"""Communication time of collectives and point-to-point sends: a launch floor + alpha per step + bytes / beta.

With n GPUs, S bytes per GPU, alpha the latency of one algorithm step and beta the achievable one-direction
bandwidth per GPU (link bandwidth x efficiency), the classic costs (Thakur, Rabenseifner & Gropp, "Optimization
of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005; NCCL's ring and tree algorithms) are:

- all-reduce, ring (reduce-scatter then all-gather): 2 (n - 1) alpha + 2 (n - 1) / n x S / beta
- all-reduce, tree (reduce to a root, broadcast back; pipelined): 2 ceil(log2 n) alpha + 2 S / beta
- all-gather / reduce-scatter, ring (S = the gathered total): (n - 1) alpha + (n - 1) / n x S / beta
- all-to-all, pairwise exchange (S = what one GPU sends in all): (n - 1) alpha + (n - 1) / n x S / beta
- MoE dispatch / combine (DeepEP, TensorRT-LLM's NVLink all-to-all; ``expert_all_to_all``): every peer written at
  once, launch + S (l - 1) / n / beta_NVLink beside launch + S (n - l) / n / beta_network, l GPUs of one NVLink domain
- point-to-point: alpha + S / beta
- custom all-reduce (vLLM / SGLang / TensorRT-LLM over peer memory; ``custom_all_reduce``), one-shot: every GPU
  reads each peer's whole buffer and reduces locally, launch + (n - 1) x S / beta_1; two-shot (reduce-scatter,
  then all-gather, through peer buffers): launch + latency_2 + (n - 1) x latency_peer + 2 (n - 1) / n x S / beta_2
  (docs/estimate.md)

Each collective also pays ``launch_s``, the fixed cost of its kernel. ``auto`` takes the faster of ring and tree,
as NCCL's tuner does: trees win for small messages (fewer latency steps), rings for large ones.

A measured link (``tfcalc bench collectives``, the ``collectives`` section of a calibration file) replaces a
fabric's: ``fit_link`` fits launch, alpha and beta to measured times of the ring forms above (weighted least
squares on the relative error, every parameter >= 0), and ``calibrated_link`` is that link with the fabric's
datasheet bandwidth kept (beta = bandwidth x efficiency), so the pure roofline still prices the datasheet.
Message sizes S follow nccl-tests (doc/PERFORMANCE.md): the all-reduce buffer; the gathered total of an
all-gather (n x each part), the reduce-scatter input (n x each result), what one rank sends in an all-to-all;
the bytes a ring moves per GPU are S times the bus-bandwidth factor, 2 (n - 1) / n for all-reduce, (n - 1) / n
for the others.
Pure math: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from tfcalc.spec.interconnect import ALGORITHMS, CustomAllReduce, Link


@dataclass(frozen=True, kw_only=True)
class CommTime:
    """One collective: its time, the algorithm used and the bytes it moved per GPU."""

    seconds: float
    algorithm: str
    bytes_per_gpu: float


def _check(n: int, nbytes: float, algorithm: str) -> None:
    if n < 1:
        raise ValueError(f"a collective needs at least one GPU, got {n}")
    if nbytes < 0:
        raise ValueError(f"message size must be >= 0, got {nbytes}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm '{algorithm}' (choose {', '.join(ALGORITHMS)})")


def all_reduce(nbytes: float, n: int, link: Link, algorithm: str = "auto") -> CommTime:
    """All-reduce of ``nbytes`` per GPU over ``n`` GPUs (module docstring); 0 for one GPU."""
    _check(n, nbytes, algorithm)
    if n == 1 or nbytes == 0:
        return CommTime(seconds=0.0, algorithm="none", bytes_per_gpu=0.0)
    ring_bytes = 2 * (n - 1) / n * nbytes
    ring = link.launch_s + 2 * (n - 1) * link.step_latency_s + ring_bytes / link.beta
    tree_bytes = 2 * nbytes
    tree = link.launch_s + 2 * math.ceil(math.log2(n)) * link.step_latency_s + tree_bytes / link.beta
    if algorithm == "ring" or (algorithm == "auto" and ring <= tree):
        return CommTime(seconds=ring, algorithm="ring", bytes_per_gpu=ring_bytes)
    return CommTime(seconds=tree, algorithm="tree", bytes_per_gpu=tree_bytes)


def custom_all_reduce(nbytes: float, n: int, kernel: CustomAllReduce, one_shot: bool) -> CommTime:
    """All-reduce of ``nbytes`` per GPU over ``n`` GPUs by an engine's peer-memory kernel, one- or two-shot
    (module docstring; which one the engine runs: ``EngineKernels.one_shot_allreduce``); 0 for one GPU."""
    _check(n, nbytes, "ring")
    if n == 1 or nbytes == 0:
        return CommTime(seconds=0.0, algorithm="none", bytes_per_gpu=0.0)
    if one_shot:
        moved = (n - 1) * nbytes
        seconds = kernel.launch_s + moved / (kernel.bandwidth_bytes_per_s * kernel.one_shot_efficiency)
        return CommTime(seconds=seconds, algorithm="one-shot", bytes_per_gpu=moved)
    moved = 2 * (n - 1) / n * nbytes
    seconds = (kernel.launch_s + kernel.two_shot_latency_s + (n - 1) * kernel.two_shot_latency_s_per_peer
               + moved / (kernel.bandwidth_bytes_per_s * kernel.two_shot_efficiency))
    return CommTime(seconds=seconds, algorithm="two-shot", bytes_per_gpu=moved)


def all_gather(total_bytes: float, n: int, link: Link) -> CommTime:
    """Ring all-gather (or reduce-scatter) whose gathered result is ``total_bytes`` per GPU."""
    _check(n, total_bytes, "ring")
    if n == 1 or total_bytes == 0:
        return CommTime(seconds=0.0, algorithm="none", bytes_per_gpu=0.0)
    moved = (n - 1) / n * total_bytes
    return CommTime(seconds=link.launch_s + (n - 1) * link.step_latency_s + moved / link.beta, algorithm="ring",
                    bytes_per_gpu=moved)


reduce_scatter = all_gather


def all_to_all(send_bytes: float, n: int, link: Link) -> CommTime:
    """Pairwise all-to-all: each GPU sends ``send_bytes`` spread evenly over the n GPUs (its own share stays)."""
    _check(n, send_bytes, "ring")
    if n == 1 or send_bytes == 0:
        return CommTime(seconds=0.0, algorithm="none", bytes_per_gpu=0.0)
    moved = (n - 1) / n * send_bytes
    return CommTime(seconds=link.launch_s + (n - 1) * link.step_latency_s + moved / link.beta,
                    algorithm="pairwise", bytes_per_gpu=moved)


def expert_all_to_all(send_bytes: float, n: int, domain: int, intra: Link, inter: Link,
                      network_bytes: float | None = None) -> CommTime:
    """MoE dispatch or combine over ``n`` GPUs as DeepEP's and TensorRT-LLM's kernels run it: every peer written at
    once, one launch, no step per peer. Of the ``send_bytes`` a GPU sends, spread evenly over the n, the share for
    the other GPUs of its NVLink domain (``domain`` GPUs) crosses ``intra`` while the rest crosses ``inter`` at the
    same time: max(launch + S (l - 1) / n / beta_intra, launch + S (n - l) / n / beta_inter), l = min(n, domain).
    ``network_bytes`` replaces S (n - l) / n where a kernel sends each token once per remote domain (DeepEP's
    normal kernels: ``remote_domains_touched``). ``bytes_per_gpu``: what crosses the fabric that bounds it.
    Against DeepEP's published low-latency figures (EP 16-256 over 400 Gb/s NICs): -13 ... +1 %
    (benchmarks/validation/expert_all_to_all_fit.py)."""
    _check(n, send_bytes, "ring")
    if n == 1 or send_bytes == 0:
        return CommTime(seconds=0.0, algorithm="none", bytes_per_gpu=0.0)
    local = min(n, domain)
    network = send_bytes * (n - local) / n if network_bytes is None else network_bytes
    seconds, moved = max((link.launch_s + link.step_latency_s + nbytes / link.beta, nbytes)
                         for link, nbytes, peers in ((intra, send_bytes * (local - 1) / n, local - 1),
                                                     (inter, network, n - local)) if peers > 0)
    return CommTime(seconds=seconds, algorithm="one-shot" if local == n else "one-shot, two fabrics",
                    bytes_per_gpu=moved)


def remote_domains_touched(experts: int, top_k: int, domains: int, groups: int = 1,
                           groups_per_token: int = 1) -> float:
    """How many of the other domains a token's top-k experts reach when the experts are spread evenly over
    ``domains`` NVLink domains and picked uniformly: (D - 1) (1 - C(E - E/D, k) / C(E, k)) (each other domain is
    missed with the probability that all k picks fall outside its E / D experts). With group-limited routing
    (DeepSeek-V3: the k experts among the top ``groups_per_token`` of ``groups`` groups) and groups aligned with the
    domains (whole groups per domain, or whole domains per group), a domain is missed when none of its groups is
    picked or the k picks avoid its j picked ones: P(miss) = sum_j P(j) C(gE/G - j s, k) / C(gE/G, k), j
    hypergeometric over the domain's groups, s their experts in it."""
    if domains <= 1:
        return 0.0
    k = min(top_k, experts)
    if groups <= 1 or groups_per_token >= groups or (groups % domains and domains % groups):
        missed = _all_miss(experts, experts / domains, k)
    else:
        own = max(groups // domains, 1)                   # groups that hold this domain's experts
        share = experts / max(groups, domains)            # experts of one such group inside the domain
        eligible = groups_per_token * experts / groups    # the experts of the picked groups
        total = math.comb(groups, groups_per_token)
        missed = sum(math.comb(own, j) * math.comb(groups - own, groups_per_token - j) / total
                     * _all_miss(eligible, j * share, k) for j in range(min(own, groups_per_token) + 1))
    touched = (domains - 1) * (1 - missed)
    # fewer experts than domains (a fraction of one each): the formula is no count, bound it
    return min(touched, float(domains - 1), float(k)) if experts < domains else touched


def _all_miss(pool: float, avoided: float, picks: int) -> float:
    """The probability that ``picks`` draws without replacement from ``pool`` all miss ``avoided`` of them."""
    outside, missed = pool - avoided, 1.0
    for i in range(min(picks, int(pool))):
        missed *= max(outside - i, 0.0) / (pool - i)
    return missed


def point_to_point(nbytes: float, link: Link) -> CommTime:
    """One send between neighbouring pipeline stages."""
    _check(1, nbytes, "ring")
    return CommTime(seconds=link.launch_s + link.step_latency_s + nbytes / link.beta, algorithm="p2p",
                    bytes_per_gpu=nbytes)


# --- a link measured: tfcalc bench collectives ----------------------------------------------------------------------

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth / algorithm bandwidth (doc/PERFORMANCE.md): 2 (n - 1) / n for all-reduce,
    (n - 1) / n for all-gather, reduce-scatter and all-to-all; also the ring's bytes moved per GPU over S."""
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective '{op}' (choose {', '.join(COLLECTIVES)})")
    return (2 if op == "all_reduce" else 1) * (n - 1) / n


def ring_steps(op: str, n: int) -> int:
    """Latency steps of the ring form: 2 (n - 1) for all-reduce, n - 1 for the others."""
    return (2 if op == "all_reduce" else 1) * (n - 1)


@dataclass(frozen=True, kw_only=True)
class LinkFit:
    """launch + steps x alpha + moved / beta fitted to measured collectives (``fit_link``), with the relative
    residuals (model / measured - 1) of the samples in their order and the ones left out of the fit."""

    launch_s: float
    step_latency_s: float
    bandwidth_bytes_per_s: float  # beta: achievable bytes/s per GPU, one direction (nccl-tests' bus bandwidth)
    residuals: tuple[float, ...]
    samples: int
    excluded: tuple[int, ...] = ()  # indices of samples measured slower than SLOW_OUTLIER x the first fit
    source: str = ""

    @property
    def kept_residuals(self) -> tuple[float, ...]:
        return tuple(r for i, r in enumerate(self.residuals) if i not in self.excluded)

    @property
    def rms_residual(self) -> float:
        """Over the samples the fit kept."""
        kept = self.kept_residuals
        return math.sqrt(sum(r * r for r in kept) / len(kept)) if kept else 0.0

    @property
    def max_residual(self) -> float:
        """Over the samples the fit kept."""
        return max((abs(r) for r in self.kept_residuals), default=0.0)

    def seconds(self, op: str, n: int, nbytes: float) -> float:
        """The fitted time of one collective of nccl-tests size ``nbytes`` over ``n`` ranks."""
        return self.launch_s + ring_steps(op, n) * self.step_latency_s + bus_factor(op, n) * nbytes / (
            self.bandwidth_bytes_per_s)

    def latency_s(self, op: str, n: int) -> float:
        """The size-independent part of one collective: launch + steps x alpha."""
        return self.launch_s + ring_steps(op, n) * self.step_latency_s


def _solve(rows: list[list[float]]) -> list[float] | None:
    """Least squares of rows [x..., 1] ~ 0 by the normal equations (Gaussian elimination); None if singular."""
    k = len(rows[0]) - 1
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] + [sum(r[i] * r[k] for r in rows)] for i in range(k)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda i: abs(a[i][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for i in range(k):
            if i != col:
                f = a[i][col] / a[col][col]
                a[i] = [x - f * y for x, y in zip(a[i], a[col], strict=True)]
    return [a[i][k] / a[i][i] for i in range(k)]


SLOW_OUTLIER = 2.0  # a sample measured this many times slower than the first fit is left out of the second


def fit_link(samples: Sequence[tuple[str, int, float, float]], source: str = "") -> LinkFit:
    """Fit launch, alpha >= 0 and beta > 0 to samples (op, ranks, nccl-tests size S in bytes, seconds per call):
    t ~ launch + ring_steps x alpha + bus_factor x S / beta, minimising the squared relative error. Every subset
    of {launch, alpha} beside 1/beta is solved and the best one with no negative parameter kept (the smaller set
    on a tie: with one op at one rank count, launch and alpha cannot be told apart, and all of it is launch).
    Interference only ever adds time (another process's time slice, a descheduled peer), so samples measured
    more than SLOW_OUTLIER times slower than this first fit are left out of a second one (``excluded``), as long
    as two samples remain; the residuals of every sample are against the second."""
    data = [(float(ring_steps(op, n)), bus_factor(op, n) * float(nbytes), float(t)) for op, n, nbytes, t in samples
            if t > 0 and n > 1]
    if len(data) < 2 or len(data) != len(samples):
        raise ValueError("fitting a link needs at least two timed collectives over two or more ranks")
    launch, alpha, inverse = _fit(data)
    excluded = tuple(i for i, (st, mv, t) in enumerate(data) if t > SLOW_OUTLIER * (launch + alpha * st + inverse * mv))
    if excluded and len(data) - len(excluded) >= 2:
        launch, alpha, inverse = _fit([d for i, d in enumerate(data) if i not in excluded])
    else:
        excluded = ()
    residuals = tuple((launch + alpha * st + inverse * mv) / t - 1 for st, mv, t in data)
    return LinkFit(launch_s=launch, step_latency_s=alpha, bandwidth_bytes_per_s=1 / inverse, residuals=residuals,
                   samples=len(data), excluded=excluded, source=source)


def _fit(data: list[tuple[float, float, float]]) -> list[float]:
    """[launch, alpha, 1 / beta] for (steps, bytes moved, seconds) rows (``fit_link``)."""
    best: tuple[float, list[float]] | None = None
    for size in range(3):
        for free in combinations((0, 1), size):
            columns = [*free, 2]
            rows = []
            for steps, moved, t in data:
                features = (1.0, steps, moved)
                rows.append([features[c] / t for c in columns] + [1.0])
            solution = _solve(rows)
            if solution is None or any(v < 0 for v in solution) or solution[-1] <= 0:
                continue
            params = [0.0, 0.0, 0.0]
            for c, v in zip(columns, solution, strict=True):
                params[c] = v
            error = sum(((params[0] + params[1] * st + params[2] * mv) / t - 1) ** 2 for st, mv, t in data)
            if best is None or error < best[0] * (1 - 1e-9):
                best = (error, params)
    if best is None:
        raise ValueError("no link fits these timings (bandwidth would not be positive)")
    return best[1]


def calibrated_link(fit: LinkFit, base: Link) -> Link:
    """``base`` (a fabric's NCCL link) with the measured launch, alpha and beta; its datasheet bandwidth kept."""
    return replace(base, name=f"{base.name} (measured)", efficiency=fit.bandwidth_bytes_per_s /
                   base.bandwidth_bytes_per_s, step_latency_s=fit.step_latency_s, launch_s=fit.launch_s,
                   source=fit.source or base.source)
