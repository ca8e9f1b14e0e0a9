"""Timing after warm-up: device events on CUDA, synchronize + perf_counter on the CPU; medians with spread."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
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
    return Timing(statistics.median(samples), q1, q3, min(samples), len(samples))


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
