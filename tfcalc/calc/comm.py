"""Communication time of collectives and point-to-point sends: a launch floor + alpha per step + bytes / beta.

With n GPUs, S bytes per GPU, alpha the latency of one algorithm step and beta the achievable one-direction
bandwidth per GPU (link bandwidth x efficiency), the classic costs (Thakur, Rabenseifner & Gropp, "Optimization
of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005; NCCL's ring and tree algorithms) are:

- all-reduce, ring (reduce-scatter then all-gather): 2 (n - 1) alpha + 2 (n - 1) / n x S / beta
- all-reduce, tree (reduce to a root, broadcast back; pipelined): 2 ceil(log2 n) alpha + 2 S / beta
- all-gather / reduce-scatter, ring (S = the gathered total): (n - 1) alpha + (n - 1) / n x S / beta
- all-to-all, pairwise exchange (S = what one GPU sends in all): (n - 1) alpha + (n - 1) / n x S / beta
- point-to-point: alpha + S / beta

Each collective also pays ``launch_s``, the fixed cost of its kernel. ``auto`` takes the faster of ring and tree,
as NCCL's tuner does: trees win for small messages (fewer latency steps), rings for large ones.
Pure math: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tfcalc.spec.interconnect import ALGORITHMS, Link


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


def point_to_point(nbytes: float, link: Link) -> CommTime:
    """One send between neighbouring pipeline stages."""
    _check(1, nbytes, "ring")
    return CommTime(seconds=link.launch_s + link.step_latency_s + nbytes / link.beta, algorithm="p2p",
                    bytes_per_gpu=nbytes)
