"""Progress on stderr for work that may take a while: nothing for the first second, then a Rich bar (or a status
line) on a terminal; a plain line every ``PLAIN_EVERY_S`` seconds in a CI log or a pipe. One clock for
``tfcalc capacity``'s search and the calculator sweeps (``tfcalc.cli.common.run_sweep``)."""

from __future__ import annotations

import sys
import time
from typing import Any

PLAIN_EVERY_S = 10.0  # without a terminal on stderr: one progress line per this many seconds
SHOW_AFTER_S = 1.0    # on a terminal: shown once the work has run this long (a quick run shows nothing)
BAR_REFRESH_S = 0.1   # the bar's numbers are updated at most this often (a sweep row can take microseconds)


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal (a closed or broken stderr is not)."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (OSError, ValueError):
        return False


class Progress:
    """``say(message, done)`` as the work goes on, ``close()`` at the end (also after an interruption).

    On a terminal, from ``SHOW_AFTER_S`` on: a transient Rich bar of ``done`` / ``total`` labelled ``message`` when
    ``total`` is given, else one status line that each message rewrites (``tfcalc.output.show_progress``); elsewhere
    ``message, N s`` every ``PLAIN_EVERY_S`` seconds (``print_stderr``).
    """

    def __init__(self, total: int | None = None) -> None:
        self.total = total
        self.start = time.perf_counter()
        self.terminal = stderr_is_terminal()
        self.shown = False
        self.last_line = self.start
        self.last_bar = self.start
        self.bar: Any = None  # rich.progress.Progress, started once shown
        self.task: Any = None

    def say(self, message: str, done: int | None = None) -> None:
        """Report ``message`` (and ``done`` of ``total``) if the clock says so; cheap when it does not."""
        from tfcalc.output import print_stderr, show_progress

        now = time.perf_counter()
        if not self.terminal:
            if now - self.last_line >= PLAIN_EVERY_S:
                self.last_line = now
                print_stderr(f"{message}, {now - self.start:,.1f} s")
            return
        if not self.shown and now - self.start < SHOW_AFTER_S:
            return
        self.shown = True
        if self.total is None or done is None:
            show_progress(f"{message}, {now - self.start:,.1f} s")
        elif self.bar is None or now - self.last_bar >= BAR_REFRESH_S:
            self.last_bar = now
            self._bar(message, done)

    def _bar(self, message: str, done: int) -> None:
        from rich.markup import escape

        from tfcalc.output.terminal import printable

        label = escape(printable(message, one_line=True))
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(label, total=self.total)
        self.bar.update(self.task, completed=done, description=label)

    def close(self) -> None:
        """Remove what the terminal shows (the bar or the status line)."""
        from tfcalc.output import show_progress

        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        elif self.shown:
            show_progress("")
