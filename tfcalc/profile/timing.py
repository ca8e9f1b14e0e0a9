"""Timing after warm-up: device events on CUDA, synchronize + perf_counter on the CPU; medians with spread."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tfcalc.profile.device import is_oom, release_memory


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Seconds per call over ``repeats`` timed calls, after ``warmup`` untimed ones."""

    median_s: float
    p25_s: float
    p75_s: float
    min_s: float
    repeats: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.p75_s - self.p25_s) / self.median_s if self.median_s > 0 else 0.0


def summarize(samples: list[float]) -> Timing:
    if len(samples) >= 2:
        q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    else:
        q1 = q3 = samples[0]
    return Timing(median_s=statistics.median(samples), p25_s=q1, p75_s=q3, min_s=min(samples), repeats=len(samples))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, warmup: int = 2, repeats: int = 5,
              setup: Callable[[], object] | None = None) -> Timing:
    """Median wall time of ``fn()``; ``setup()`` runs untimed before each call (e.g. resetting a cache)."""
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    synchronize(device)
    samples: list[float] = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        synchronize(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - begin)
    return summarize(samples)


def first_sentence(exc: BaseException, limit: int = 120) -> str:
    """The first sentence of an error message, for a one-line row note."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(". ")[0].rstrip(".")[:limit]


def time_or_failure(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int
                    ) -> tuple[Timing | None, str]:
    """(timing, "ok"), or (None, "oom" / "error: ...") when the call fails at this size (memory released)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return time_call(fn, device, warmup=warmup, repeats=repeats), "ok"
    except RuntimeError as exc:
        release_memory(device)
        if is_oom(exc):
            return None, "oom"
        return None, f"error: {first_sentence(exc)}"
