"""``tfcalc bench collectives``: all-reduce, all-gather, reduce-scatter and all-to-all over message sizes on
``torch.distributed`` (NCCL on GPUs, gloo on the CPU), with the bandwidths nccl-tests reports and an alpha-beta fit.

Definitions (nccl-tests, doc/PERFORMANCE.md and src/common.cu at NVIDIA/nccl-tests a0b82b2):

- size S: the all-reduce buffer; the gathered total of an all-gather (n x each rank's part); the reduce-scatter
  input (n x each rank's result); what one rank sends in an all-to-all (n x each part);
- time t: ``iters`` calls issued back to back and timed together (CUDA events on a GPU, ``perf_counter`` on the
  CPU, after a barrier), divided by ``iters``, averaged over the ranks (nccl-tests averages the same way); of
  ``repeats`` such timings after ``warmup`` untimed ones, the median on a GPU and the fastest on the CPU (as
  ``tfcalc bench calibrate`` takes it there: on a shared CPU other processes' time slices land in the timings);
- algorithm bandwidth algbw = S / t; bus bandwidth busbw = algbw x 2 (n - 1) / n for all-reduce, x (n - 1) / n for
  the others (``tfcalc.calc.comm.bus_factor``): comparable with a link's bandwidth whatever n.

The fit (``tfcalc.calc.comm.fit_link``) gives each op its latency and bus bandwidth, and all ops together the
link (launch, alpha per ring step, beta) that ``estimate --calibration`` prices communication with; the rows carry
the fitted time and its residual. Pure measurement: rows, never printed here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tfcalc.calc.comm import COLLECTIVES, LinkFit, bus_factor, fit_link
from tfcalc.profile.device import DTYPES, available_memory_bytes, describe, dtype_name
from tfcalc.profile.distributed import RankContext

Row = dict[str, object]


def message_sizes(smallest: int, largest: int) -> list[int]:
    """smallest, 2 x smallest, ... up to largest (nccl-tests -b -e -f 2)."""
    sizes, size = [], smallest
    while size <= largest:
        sizes.append(size)
        size *= 2
    return sizes


def largest_fitting(device: torch.device, ranks_here: int, requested: int) -> int:
    """The largest power-of-two size <= ``requested`` whose buffers (at most 2 S per op plus S / n) fit in a third
    of the free memory (a GPU's, or the CPU's MemAvailable shared by the ranks on this node)."""
    free = available_memory_bytes(device)
    if free is None:
        return requested
    if device.type == "cpu":
        free //= ranks_here
    size = requested
    while size > 1024 and 3 * size > free:
        size //= 2
    return size


def _buffers(op: str, nbytes: int, n: int, dtype: torch.dtype, device: torch.device
             ) -> tuple[Callable[[], object], int]:
    """(one call of ``op`` on random buffers of nccl-tests size ~nbytes, the exact size S used: a multiple of
    n elements)."""
    element = torch.empty((), dtype=dtype).element_size()
    count = max(n, nbytes // element // n * n)
    whole = torch.empty(count, dtype=dtype, device=device).normal_()  # drawn in place: no float32 copy first
    part = torch.empty(count // n, dtype=dtype, device=device).normal_()
    if op == "all_reduce":
        return (lambda: dist.all_reduce(whole)), count * element
    if op == "all_gather":
        return (lambda: dist.all_gather_single(whole, part)), count * element
    if op == "reduce_scatter":
        return (lambda: dist.reduce_scatter_single(part, whole)), count * element
    out = torch.empty_like(whole)
    return (lambda: dist.all_to_all_single(out, whole)), count * element


def time_collective(call: Callable[[], object], ctx: RankContext, iters: int, warmup: int, repeats: int
                    ) -> list[float]:
    """Seconds per call of ``call`` on this rank, one value per repeat (module docstring)."""
    cuda = ctx.device.type == "cuda"
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(ctx.device)
        dist.barrier(group=ctx.control)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                call()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / iters)
        else:
            begin = time.perf_counter()
            for _ in range(iters):
                call()
            samples.append((time.perf_counter() - begin) / iters)
    return samples


def measure(ctx: RankContext, ops: list[str], sizes: list[int], dtype: str, iters: int, warmup: int,
            repeats: int, progress: Callable[[str], None] | None = None) -> list[tuple[str, int, float]] | None:
    """Every rank times every (op, size); rank 0 gets [(op, S, seconds per call averaged over the ranks, median
    over repeats)], the other ranks None."""
    torch_dtype = DTYPES[dtype]
    results = []
    for op in ops:
        for nbytes in sizes:
            call, exact = _buffers(op, nbytes, ctx.world, torch_dtype, ctx.device)
            per_rank = torch.tensor(time_collective(call, ctx, iters, warmup, repeats), dtype=torch.float64)
            dist.all_reduce(per_rank, group=ctx.control)  # summed over ranks, repeat by repeat
            averaged = per_rank / ctx.world
            seconds = float(averaged.median() if ctx.device.type == "cuda" else averaged.min())
            results.append((op, exact, seconds))
            if progress is not None:
                progress(f"{op} {exact:,} B")
            del call
    return results if ctx.rank == 0 else None


def rows(results: list[tuple[str, int, float]], ranks: int, backend: str, device: str, dtype: str,
         fits: dict[str, LinkFit]) -> list[Row]:
    """One row per (op, size): time, algbw, busbw, the op's fitted time, its residual, and whether the fit left it
    out as a slow outlier (``tfcalc.calc.comm.fit_link``)."""
    out = []
    index: dict[str, int] = {}
    for op, nbytes, seconds in results:
        algbw = nbytes / seconds
        fit = fits.get(op)
        fitted = fit.seconds(op, ranks, nbytes) if fit is not None else None
        position = index[op] = index.get(op, -1) + 1  # this sample's place among its op's, as the fit saw them
        out.append({
            "op": op, "world_size": ranks, "dist_backend": backend, "device": device, "dtype": dtype, "bytes": nbytes,
            "time_s": seconds, "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": algbw * bus_factor(op, ranks),
            "fitted_time_s": fitted, "fit_residual": None if fitted is None else fitted / seconds - 1,
            "fit_outlier": None if fit is None else position in fit.excluded, "status": "ok",
        })
    return out


def fits_by_op(results: list[tuple[str, int, float]], ranks: int) -> dict[str, LinkFit]:
    """Each op's own latency / bus-bandwidth fit (ops with fewer than two sizes are not fitted)."""
    out = {}
    for op in COLLECTIVES:
        samples = [(o, ranks, nbytes, t) for o, nbytes, t in results if o == op]
        if len(samples) >= 2:
            try:
                out[op] = fit_link(samples)
            except ValueError:
                continue
    return out


@dataclass(frozen=True)
class CollectivesJob:
    """The bench on every rank; rank 0 sends ("results", [(op, S, seconds)])."""

    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str
    iters: int
    warmup: int
    repeats: int

    def __call__(self, ctx: RankContext) -> None:
        largest = torch.tensor([largest_fitting(ctx.device, ctx.local_world, max(self.sizes))])
        dist.all_reduce(largest, op=dist.ReduceOp.MIN, group=ctx.control)  # every rank measures the same sizes
        largest = int(largest.item())
        fitting = [s for s in self.sizes if s <= largest]
        results = measure(ctx, list(self.ops), fitting, self.dtype, self.iters, self.warmup, self.repeats,
                          progress=lambda text: ctx.send("progress", text))
        skipped = [s for s in self.sizes if s > largest]
        ctx.send("results", {"results": results, "skipped": skipped, "backend": ctx.backend,
                             "device": describe(ctx.device).name, "dtype": dtype_name(DTYPES[self.dtype])})
