"""Ranks spawned and supervised on the CPU (gloo): a rank that fails ends every rank within a bounded time with one
line naming it, what rank 0 sent before is kept, a stop is agreed by all ranks, an interrupted supervisor stops
its ranks, and no rank outlives the launch."""

from __future__ import annotations

import os
import time

import pytest
from rank_jobs import Fails, Points

from tfcalc.errors import Terminated, UsageError
from tfcalc.profile.distributed import RankFailed, describe_failure, launch, torchrun_rank

BOUND_S = 30  # a failed launch ends well within this on a loaded 2-core machine


def _gone(pids: list[int], within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how, message", [
    ("raise", "rank 1 failed: ValueError: the model refused to load; stopped the other 1 rank"),
    ("oom", "rank 1 failed: ran out of memory (CUDA out of memory"),
    ("exit", "rank 1 exited with code 3; stopped the other 1 rank"),
    ("kill", "rank 1 was killed by SIGKILL; stopped the other 1 rank"),
])
def test_a_failed_rank_ends_every_rank_with_one_line_naming_it(how: str, message: str) -> None:
    got: list[tuple[str, object]] = []
    start = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        launch(Fails(rank=1, how=how), 2, "cpu", lambda kind, payload: got.append((kind, payload)))
    assert time.monotonic() - start < BOUND_S
    text = str(failure.value)
    assert message in text and "\n" not in text
    assert ("row", {"pid": got[0][1]["pid"], "rank": 0}) in got  # rank 0's result before the failure is kept
    pids = next(payload for kind, payload in got if kind == "pids")
    assert _gone(pids), "a rank outlived the launch"


def test_a_stop_is_agreed_by_every_rank_at_the_same_point() -> None:
    got: list[tuple[str, object]] = []
    launch(Points(count=50), 2, "cpu", lambda kind, payload: got.append((kind, payload)),
           stop_requested=lambda: sum(kind == "row" for kind, _ in got) >= 2)
    rows = [payload for kind, payload in got if kind == "row"]
    stopped = [payload for kind, payload in got if kind == "stopped"]
    assert 2 <= len(rows) < 50 and stopped == [len(rows)]  # a clean end: both ranks left the loop together
    assert _gone(next(payload for kind, payload in got if kind == "pids"))


@pytest.mark.parametrize("signal_like", [KeyboardInterrupt, Terminated])
def test_an_interrupted_supervisor_stops_its_ranks(signal_like: type[BaseException]) -> None:
    """A second Ctrl-C (or SIGTERM, which raises Terminated) while the ranks run: they are terminated and the
    interrupt reaches the caller, who keeps the rows."""
    got: list[tuple[str, object]] = []

    def on_message(kind: str, payload: object) -> None:
        got.append((kind, payload))
        if kind == "row" and payload == 1:
            raise signal_like()

    with pytest.raises(signal_like):
        launch(Points(count=1000), 2, "cpu", on_message)
    assert [p for k, p in got if k == "row"] == [0, 1]
    assert _gone(next(payload for kind, payload in got if kind == "pids"))


def test_torchrun_environment_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert torchrun_rank() is None
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("MASTER_PORT", "29500")
    for name, value in (("RANK", "9"), ("WORLD_SIZE", "16"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "8")):
        monkeypatch.setenv(name, value)
    where = torchrun_rank()
    assert where is not None and (where.rank, where.world, where.local_rank, where.local_world) == (9, 16, 1, 8)
    monkeypatch.setenv("RANK", "nine")
    with pytest.raises(UsageError, match="must be integers"):
        torchrun_rank()


def test_failures_are_described_in_one_line() -> None:
    assert describe_failure(MemoryError()).startswith("ran out of memory")
    assert describe_failure(RuntimeError("first line\nsecond")) == "RuntimeError: first line"
    assert describe_failure(UsageError("tp 3 does not divide the 32 attention heads")) == \
        "tp 3 does not divide the 32 attention heads"
