"""Running a job on several ranks with ``torch.distributed``: spawned here or under torchrun; faults; Ctrl-C.

``tfcalc profile --tp N`` and ``tfcalc bench collectives`` run a *job* (a picklable callable taking a
:class:`RankContext`) on every rank. Two ways to start the ranks:

- **spawned** (:func:`launch`): ``world`` processes on this node, forked from multiprocessing's fork server (one
  clean interpreter that imports torch once and never touches CUDA, so its children may: safe with CUDA, and a
  second launch in the same process starts in a fraction of a second), joining through a TCPStore this process
  hosts on 127.0.0.1 (port chosen by the OS). Rank r runs on cuda:``devices[r]`` with NCCL, or on the CPU with
  gloo (each rank taking its share of the cores).
- **torchrun** (:func:`run_under_torchrun`, when :func:`torchrun_rank` finds the env:// variables RANK,
  WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT that torchrun sets): this process is one rank; every
  rank runs the same command line on its node (multi-node the standard way: ``torchrun --nnodes 2
  --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m tfcalc profile --tp 16 ...``), on
  cuda:LOCAL_RANK.

Rank 0 gathers what the ranks measured (``RankContext.gather``, over a gloo group even beside NCCL) and hands its
results to the caller (``RankContext.send``: through a pipe to the spawning process, or directly under torchrun);
the other ranks write nothing.

Faults, spawned: a rank that raises sends one line ("RuntimeError: ...", "ran out of memory: ...") and exits;
one that dies (killed, ``os._exit``) is seen by its exit sentinel. Either way the supervisor listens ``SETTLE_S``
more for the others' reports, terminates every rank still running (SIGTERM, SIGKILL after ``GRACE_S``), waits
for them, and raises :class:`RankFailed` naming the rank that failed first in cause: one that died without a word
or raised something of its own, before one that only lost its peer (``PEER_LOST``). What rank 0 sent before
stays with the caller. Each rank also watches its parent (the fork server, which exits when the command does)
and exits when it is gone, so no rank outlives a command killed with SIGKILL. Ctrl-C: the ranks ignore SIGINT;
the supervisor's first Ctrl-C (``stop_requested``) asks them to stop after the current point, which they agree
on by an all-reduce (``RankContext.should_stop``), so every rank stops at the same one; a second Ctrl-C or
SIGTERM (a KeyboardInterrupt in the supervisor) terminates them at once. Under torchrun, torchrun supervises:
it stops the other workers when one fails, and every rank handles its own signals.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tfcalc.errors import TfcalcError, UsageError
from tfcalc.profile.device import is_oom
from tfcalc.profile.timing import first_sentence

GRACE_S = 5.0  # how long a terminated rank may take to exit before SIGKILL
SETTLE_S = 1.0  # after a first failure, how long to listen for the others before naming one
# How a rank reports that a peer vanished (gloo's TCP pairs, NCCL's watchdog): a consequence, not a cause.
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Socket closed", "Broken pipe",
             "remote process exited", "communicator was aborted", "Connection refused", "EOF")
TIMEOUT_S = 600.0  # a collective waiting longer than this for a peer fails (process-group timeout)
POLL_S = 0.2  # how often the supervisor looks at Ctrl-C and the ranks, and a rank at its parent
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
PRELOAD = ("tfcalc.profile.distributed", "tfcalc.profile.sweep", "tfcalc.profile.collectives")  # the fork server's

Job = Callable[["RankContext"], None]
OnMessage = Callable[[str, object], None]


class RankFailed(TfcalcError):
    """A rank failed (an exception, out of memory, killed); the others were stopped."""


@dataclass(frozen=True)
class TorchrunRank:
    rank: int
    world: int
    local_rank: int
    local_world: int


def torchrun_rank() -> TorchrunRank | None:
    """This process's rank when a launcher set the env:// variables (torchrun does), else None."""
    if not all(name in os.environ for name in TORCHRUN_VARIABLES):
        return None
    try:
        rank, world, local = (int(os.environ[name]) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except ValueError:
        raise UsageError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (as torchrun sets them)") from None
    return TorchrunRank(rank, world, local, local_world)


@dataclass
class RankContext:
    """What a job sees on its rank: who it is, its device, and the few collective steps every job needs."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    device: torch.device
    backend: str  # "nccl" or "gloo"
    launcher: str  # "spawned" or "torchrun"
    control: Any = None  # the gloo group results and stop flags travel on (None: the default group is gloo)
    _send: Callable[[str, object], None] | None = field(default=None, repr=False)
    _stop: Callable[[], bool] = field(default=lambda: False, repr=False)

    def send(self, kind: str, payload: object) -> None:
        """Hand a result to the caller (rank 0 only; the other ranks' calls do nothing)."""
        if self.rank == 0 and self._send is not None:
            self._send(kind, payload)

    def should_stop(self) -> bool:
        """Whether any rank was asked to stop (Ctrl-C): every rank calls it at the same point and gets the same
        answer."""
        flag = torch.tensor([1 if self._stop() else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.control)
        return bool(flag.item())

    def gather(self, obj: object) -> list[object] | None:
        """Every rank's ``obj`` on rank 0, in rank order (None on the other ranks)."""
        out: list[object] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.control)
        return out

    def agree_any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any."""
        value = torch.tensor([1 if flag else 0])
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.control)
        return bool(value.item())


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def _join(rank: int, world: int, local_rank: int, local_world: int, device_type: str, device_index: int | None,
          launcher: str, store: Any = None, timeout_s: float = TIMEOUT_S) -> RankContext:
    """Initialise the default process group (and a gloo control group beside NCCL) and this rank's device."""
    backend = backend_for(device_type)
    if device_type == "cuda":
        device = torch.device("cuda", local_rank if device_index is None else device_index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    return RankContext(rank=rank, world=world, local_rank=local_rank, local_world=local_world, device=device,
                       backend=backend, launcher=launcher, control=control)


def describe_failure(exc: BaseException) -> str:
    """One line for what ended a rank."""
    if is_oom(exc):
        return f"ran out of memory ({first_sentence(exc)})"
    if isinstance(exc, TfcalcError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {first_sentence(exc, limit=200)}"


# --- under torchrun ---------------------------------------------------------------------------------------------


def run_under_torchrun(job: Job, where: TorchrunRank, device_type: str, on_message: OnMessage,
                       stop_requested: Callable[[], bool]) -> None:
    """Run ``job`` as this torchrun rank; rank 0's results go to ``on_message``. An exception ends this rank with
    a one-line error naming it (torchrun then stops the others)."""
    ctx = _join(where.rank, where.world, where.local_rank, where.local_world, device_type, None, "torchrun")
    ctx._send, ctx._stop = on_message, stop_requested
    try:
        job(ctx)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        raise RankFailed(f"rank {where.rank}: {describe_failure(exc)}") from None
    dist.destroy_process_group()


# --- spawned here ------------------------------------------------------------------------------------------------


def _watch_parent() -> None:
    """Exit this rank when the process that forked it is gone (so a SIGKILLed command leaves no rank behind)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(POLL_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="tfcalc-parent-watch", daemon=True).start()


def _rank_main(rank: int, world: int, port: int, device_type: str, device_index: int | None, job: Job,
               conn: Any, stop_event: Any, timeout_s: float) -> None:
    """A spawned rank: ignore Ctrl-C (the supervisor handles it), join, run the job, report how it ended."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent()
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        ctx = _join(rank, world, rank, world, device_type, device_index, "spawned", store, timeout_s)
        ctx._send = lambda kind, payload: conn.send((kind, rank, payload))
        ctx._stop = stop_event.is_set
        job(ctx)
        conn.send(("done", rank, None))
    except BaseException as exc:  # noqa: BLE001 - whatever ends the rank is reported as one line
        try:
            conn.send(("error", rank, describe_failure(exc)))
            conn.close()
        finally:
            os._exit(1)  # never wait on a process group whose peer may be gone
    conn.close()
    dist.destroy_process_group()


def _ending(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch(job: Job, world: int, device_type: str, on_message: OnMessage, *,
           devices: list[int] | None = None, stop_requested: Callable[[], bool] = lambda: False,
           timeout_s: float = TIMEOUT_S) -> None:
    """Spawn ``world`` ranks running ``job`` on this node and supervise them (module docstring). Returns when
    every rank finished; raises :class:`RankFailed` when one failed and KeyboardInterrupt (after stopping the
    ranks) when the supervisor is interrupted."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    if device_type == "cuda" and devices is not None and len(devices) != world:
        raise UsageError(f"{world} ranks need {world} GPUs, --gpu names {len(devices)}")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    stop_event = context.Event()
    processes, pipes = [], []
    failures: list[tuple[int, str, bool]] = []  # (rank, what, whether it said why), in the order seen
    try:
        for rank in range(world):
            receive, send = context.Pipe(duplex=False)
            index = devices[rank] if devices is not None else (rank if device_type == "cuda" else None)
            process = context.Process(target=_rank_main, name=f"tfcalc-rank-{rank}", args=(
                rank, world, store.port, device_type, index, job, send, stop_event, timeout_s))
            process.start()
            send.close()
            processes.append(process)
            pipes.append(receive)
        running = dict(enumerate(processes))
        open_pipes = dict(enumerate(pipes))

        said: set[int] = set()

        def read(rank: int) -> None:
            try:
                kind, sender, payload = open_pipes[rank].recv()
            except (EOFError, OSError):
                del open_pipes[rank]
                return
            if kind == "error":
                failures.append((sender, f"failed: {payload}", True))
                said.add(sender)
            elif kind != "done":  # a result rank 0 completed is kept, even one that arrives after a failure
                on_message(kind, payload)

        settle = None
        while running and (settle is None or time.monotonic() < settle):
            if stop_requested():
                stop_event.set()
            waiting = {pipe: rank for rank, pipe in open_pipes.items()}
            sentinels = {process.sentinel: rank for rank, process in running.items()}
            for ready in wait([*waiting, *sentinels], timeout=POLL_S):
                if ready in waiting and waiting[ready] in open_pipes:
                    read(waiting[ready])
            for rank, process in list(running.items()):
                if process.exitcode is None:
                    continue
                while rank in open_pipes and open_pipes[rank].poll():  # what it said before it ended
                    read(rank)
                del running[rank]
                if process.exitcode != 0 and rank not in said:
                    failures.append((rank, _ending(process.exitcode), False))
            if failures and settle is None:
                settle = time.monotonic() + SETTLE_S
    finally:
        _stop_all(processes)
        for pipe in pipes:
            pipe.close()
    if failures:
        rank, what, _ = min(failures, key=lambda f: (f[2] and any(p in f[1] for p in PEER_LOST), f[2]))
        others = world - 1
        raise RankFailed(f"rank {rank} {what}; stopped the other {others} rank{'' if others == 1 else 's'}")


def _stop_all(processes: list[Any]) -> None:
    """SIGTERM every live rank, SIGKILL those still there after GRACE_S, and reap them all."""
    for process in processes:
        if process.exitcode is None:
            process.terminate()
    deadline = time.monotonic() + GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.exitcode is None:
            process.kill()
            process.join()
