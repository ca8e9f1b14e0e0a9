"""Atomic file writes: a reader sees the old file or the whole new one, never half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tfcalc.errors import OutputError


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"cannot write {path}: folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {path}: {exc.strerror}") from None
        raise
