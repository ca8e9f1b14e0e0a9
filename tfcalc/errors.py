"""Error types the CLI turns into one-line messages and exit codes.

Exit codes (README, "Errors and exit codes"): 0 success, 1 a runtime failure, 2 a usage error (bad option,
unknown preset, malformed size), 130 interrupted by Ctrl-C (SIGINT), 143 stopped by SIGTERM.
"""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_SIGINT = 128 + signal.SIGINT  # 130
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143


class TfcalcError(Exception):
    """Base class: a failure the user can act on; its message is one line."""

    exit_code = EXIT_FAILURE


class UsageError(TfcalcError):
    """A bad command-line value: unknown preset or dtype, malformed size, impossible combination."""

    exit_code = EXIT_USAGE


class SpecError(TfcalcError):
    """A model or GPU description (preset, user YAML, config.json) that is malformed or cannot exist."""

    exit_code = EXIT_FAILURE


class OutputError(TfcalcError):
    """The result could not be written."""

    exit_code = EXIT_FAILURE


class Terminated(KeyboardInterrupt):
    """Raised by the CLI's SIGTERM handler. A KeyboardInterrupt, so that every ``except KeyboardInterrupt``
    that keeps partial results or cleans up (temporary files, progress bars) treats SIGTERM like Ctrl-C."""


class Interrupted(TfcalcError):
    """Stopped by a signal after keeping what could be kept: exit 130 (Ctrl-C) or 143 (SIGTERM).

    ``Interrupted.from_exception(exc, "kept 3 rows")`` picks the code from the KeyboardInterrupt caught.
    """

    def __init__(self, message: str = "interrupted", signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum

    @classmethod
    def from_exception(cls, exc: BaseException, message: str = "") -> Interrupted:
        signum = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
        what = "terminated" if signum == signal.SIGTERM else "interrupted"
        return cls(f"{what}: {message}" if message else what, signum)


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's own index of CPU-only wheels


def install_command(extra: str) -> str:
    """``pip install ...`` of an optional extra's packages, read from tfcalc's installed metadata (pyproject.toml's
    [project.optional-dependencies]): a command that works however tfcalc itself was installed."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    try:
        wanted = [r.split(";")[0].replace(" ", "") for r in requires("tfcalc") or []
                  if re.search(rf"extra\s*==\s*['\"]{extra}['\"]", r)]
    except PackageNotFoundError:
        wanted = []
    return "pip install " + " ".join(f"'{r}'" for r in wanted) if wanted else f"pip install '.[{extra}]'"


def missing_torch_message() -> str:
    """What to run when the profiler's PyTorch is not installed (the CPU-only wheel too: no CUDA download)."""
    return (f"the profiler needs PyTorch: {install_command('profile')} (for a CPU-only PyTorch, without the CUDA "
            f"libraries, first: pip install torch --index-url {TORCH_CPU_INDEX})")


def missing_matplotlib_message() -> str:
    return f"--plot needs matplotlib: {install_command('plot')}"
