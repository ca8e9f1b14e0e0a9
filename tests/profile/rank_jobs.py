"""Jobs for the multi-rank tests (``tfcalc.profile.distributed``): top-level classes, so the fork server's ranks
can unpickle them (this folder is on their sys.path, as on the test's)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Fails:
    """Rank ``rank`` fails ``how`` after sending a row; the others wait in a collective it never joins."""

    rank: int
    how: str  # "raise", "oom", "exit", "kill"

    def __call__(self, ctx) -> None:  # noqa: ANN001 - RankContext
        ctx.send("row", {"pid": os.getpid(), "rank": ctx.rank})
        pids = ctx.gather(os.getpid())
        if pids is not None:
            ctx.send("pids", pids)
        dist.barrier()
        if ctx.rank == self.rank:
            if self.how == "raise":
                raise ValueError("the model refused to load")
            if self.how == "oom":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
            if self.how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(1))  # never completes: its peer is gone
        time.sleep(60)


@dataclass(frozen=True)
class Points:
    """``count`` points, each agreed by ``should_stop``; rank 0 sends one row per point measured."""

    count: int

    def __call__(self, ctx) -> None:  # noqa: ANN001 - RankContext
        pids = ctx.gather(os.getpid())
        if pids is not None:
            ctx.send("pids", pids)
        for point in range(self.count):
            if ctx.should_stop():
                ctx.send("stopped", point)
                return
            time.sleep(0.05)
            dist.all_reduce(torch.ones(1))
            ctx.send("row", point)
