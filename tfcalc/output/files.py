"""Where results are written: the one mechanism for ``--output``, ``--plot``, ``--save-calibration``.

``open_output(path)`` gives a handle to write to and decides what writing means from what is at ``path``:

- ``-``, ``/dev/stdout`` (``/dev/fd/1``, ``/proc/self/fd/1``): the process's stdout, as it is (a pipe, a
  terminal, a file opened for appending); ``/dev/stderr`` likewise.
- an existing character device, FIFO, or anything under ``/dev`` or ``/proc`` (``/dev/null``, ``>(cmd)``'s
  ``/dev/fd/63``): opened and written to, never replaced; tfcalc never creates files there. Block devices and
  folders are refused.
- a regular file, or no file yet: replaced atomically. The text goes to a temporary file beside the target
  (a short name, so names up to the file system's 255 bytes work), which is flushed, given the mode a plain
  write would leave (the existing file's mode and, when permitted, owner; else 0666 minus the umask), fsynced
  and renamed over the target. A reader sees the old file or the whole new one; on any failure the temporary
  file is removed and the target is left as it was. Symbolic links are followed: the file they point to is
  replaced, the link stays.

``check_outputs`` refuses, before any work, an output that is one of the run's input files (whatever the
path spelling: symlinks and hard links are compared by device and inode) or two outputs on one destination.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tfcalc.errors import OutputError, UsageError
from tfcalc.output import STDOUT_NAMES

STDERR_NAMES = frozenset({"/dev/stderr", "/dev/fd/2", "/proc/self/fd/2"})
_SPECIAL_ROOTS = ("/dev/", "/proc/")
TEMP_PREFIX = ".tfcalc-"

__all__ = ["STDOUT_NAMES", "atomic_file", "check_outputs", "is_stdout", "open_output", "write_atomic"]


def is_stdout(path: Path | str | None) -> bool:
    """Whether ``path`` names the process's stdout (``-``, ``/dev/stdout``...)."""
    return path is not None and os.fspath(path) in STDOUT_NAMES


def _is_special(text: str) -> bool:
    return text.startswith(_SPECIAL_ROOTS) or os.path.realpath(text).startswith(_SPECIAL_ROOTS)


def _error(path: Path | str, exc: OSError) -> OutputError:
    return OutputError(f"cannot write {path}: {exc.strerror or exc}")


def _classify(path: Path | str) -> tuple[str, Path, os.stat_result | None]:
    """("stdout" | "stderr" | "stream" | "file", where to open or replace, the existing file's stat)."""
    text = os.fspath(path)
    if text in STDOUT_NAMES:
        return "stdout", Path(text), None
    if text in STDERR_NAMES:
        return "stderr", Path(text), None
    if not text:
        raise OutputError("cannot write to an empty file name")
    try:
        st: os.stat_result | None = os.stat(text)  # follows symlinks, /proc's magic links included
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise OutputError(f"cannot write {path}: {Path(text).parent} is not a folder") from None
    except OSError as exc:
        raise _error(path, exc) from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"cannot write {path}: it is a folder")
        if stat.S_ISBLK(st.st_mode):
            raise OutputError(f"refusing to write {path}: it is a block device")
        if not stat.S_ISREG(st.st_mode) or _is_special(text):
            return "stream", Path(text), st
        return "file", Path(os.path.realpath(text)), st
    if _is_special(text):
        raise OutputError(f"cannot write {path}: no such device (tfcalc creates no files under /dev or /proc)")
    real = Path(os.path.realpath(text))
    if not real.parent.is_dir():
        folder = Path(text).parent if not os.path.islink(text) else real.parent
        raise OutputError(f"cannot write {path}: folder {folder} does not exist")
    return "file", real, None


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (/proc/self/status, kernel >= 4.7)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _std_stream(kind: str, binary: bool) -> IO[Any]:
    stream = sys.stdout if kind == "stdout" else sys.stderr
    if stream is None:
        raise OutputError(f"cannot write the result: {kind} is closed")
    return stream.buffer if binary else stream  # type: ignore[return-value]


@contextmanager
def open_output(path: Path | str, binary: bool = False) -> Iterator[IO[Any]]:
    """A handle on ``path`` opened as the module docstring says; OS errors become one-line OutputErrors."""
    kind, target, existing = _classify(path)
    mode: dict[str, Any] = {"mode": "wb"} if binary else {"mode": "w", "encoding": "utf-8", "newline": ""}
    if kind in ("stdout", "stderr"):
        stream = _std_stream(kind, binary)
        try:
            yield stream
            stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:
            raise OutputError(f"cannot write to {kind}: {getattr(exc, 'strerror', None) or exc}") from None
        return
    if kind == "stream":
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise _error(path, exc) from None
        try:
            with os.fdopen(fd, **mode) as handle:
                yield handle
        except OSError as exc:
            raise _error(path, exc) from None
        return
    import tempfile

    folder = target.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".tmp", dir=folder)
    except OSError as exc:
        raise _error(path, exc) from None
    try:
        with os.fdopen(fd, **mode) as handle:
            yield handle
            handle.flush()
            if existing is not None:
                os.fchmod(fd, stat.S_IMODE(existing.st_mode))
                if (existing.st_uid, existing.st_gid) != (os.geteuid(), os.getegid()):
                    try:
                        os.fchown(fd, existing.st_uid, existing.st_gid)
                    except OSError:  # not permitted: the new file is ours, as with any editor's save
                        pass
            else:
                os.fchmod(fd, 0o666 & ~_umask())
            os.fsync(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
            raise _error(path, exc) from None
        raise
    try:  # make the rename itself durable; a folder that cannot be opened or synced is no failure
        folder_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(folder_fd)
        finally:
            os.close(folder_fd)
    except OSError:
        pass


atomic_file = open_output  # the name call sites used before stdout and devices were handled


def write_atomic(path: Path | str, text: str) -> None:
    """Write ``text`` to ``path`` through ``open_output`` (atomic for regular files)."""
    with open_output(path) as handle:
        handle.write(text)


def _identity(path: Path | str) -> tuple[object, ...]:
    text = os.fspath(path)
    if text in STDOUT_NAMES:
        return ("stdout",)
    if text in STDERR_NAMES:
        return ("stderr",)
    try:
        st = os.stat(text)
    except OSError:
        return ("path", os.path.realpath(text))
    return ("inode", st.st_dev, st.st_ino)


def check_outputs(outputs: Iterable[tuple[str, Path | str | None]],
                  inputs: Iterable[tuple[str, Path | str]] = ()) -> None:
    """Refuse, before any work, outputs that would destroy an input or each other, or cannot be created.

    ``outputs`` and ``inputs`` are (option, path) pairs such as ("--output", Path("x.csv")); ``None`` outputs
    are skipped. Raises UsageError (output = input, two outputs on one destination) or OutputError (missing
    folder, a folder or block device as the output).
    """
    seen_inputs: dict[tuple[object, ...], tuple[str, str]] = {}
    for option, path in inputs:
        try:
            if not os.path.isfile(path):
                continue
        except (OSError, ValueError):
            continue
        seen_inputs.setdefault(_identity(path), (option, os.fspath(path)))
    seen_outputs: dict[tuple[object, ...], str] = {}
    for option, path in outputs:
        if path is None:
            continue
        kind, _, _ = _classify(path)
        identity = _identity(path)
        if identity in seen_inputs and kind == "file":
            source_option, source = seen_inputs[identity]
            same = "" if os.fspath(path) == source else f" ({source})"
            raise UsageError(f"{option} {path} is the {source_option} file{same}; refusing to overwrite an input")
        if identity in seen_outputs and kind != "stream":
            raise UsageError(f"{option} {path} is also given as {seen_outputs[identity]}; give each output its "
                             "own file")
        seen_outputs[identity] = option
