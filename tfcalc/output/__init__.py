"""The one output layer: rows (lists of dicts) become a table fitted to the terminal, CSV or JSON, on stdout or a
file; and the lines for people on stderr.

Which columns a table shows is the command's declaration (``tfcalc.output.columns.pick``) and the run's
``TableView`` (``--wide``, ``--columns``), which the CLI sets once per command with ``table_view``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path

from tfcalc.errors import OutputError, UsageError
from tfcalc.output.columns import DEFAULT_VIEW, Column, TableView, pick, varies, wide

FORMATS = ("table", "csv", "json")
# Output paths that mean the process's stdout (tfcalc.output.files writes to it rather than replacing it).
STDOUT_NAMES = frozenset({"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})
__all__ = ["Column", "FORMATS", "STDOUT_NAMES", "TableView", "Verbatim", "emit", "emit_explanation", "pick",
           "print_stderr", "resolve_format", "show_progress", "table_view", "terminal_width", "varies", "wide",
           "write_stdout"]


class Verbatim(str):
    """A note printed as it is written, never re-wrapped to the width (a shell command with its continuation
    lines): ``emit(..., notes=(..., Verbatim(command)))``."""


_VIEW: ContextVar[TableView | None] = ContextVar("tfcalc_table_view", default=None)


@contextlib.contextmanager
def table_view(view: TableView) -> Iterator[None]:
    """Every table emitted inside shows ``view``'s columns (the CLI wraps each command in it)."""
    token = _VIEW.set(view)
    try:
        yield
    finally:
        _VIEW.reset(token)


def terminal_width() -> int | None:
    """The width a table on stdout must fit: on a terminal, its width as Rich's console takes it ($COLUMNS, else the
    window's size); in a pipe, $COLUMNS when it is set; else None, the table's natural width (what ``less -S``, a
    file or a script reads best)."""
    stream = sys.stdout
    try:
        terminal = stream is not None and stream.isatty()
    except (OSError, ValueError):
        terminal = False
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if terminal:
        try:
            return os.get_terminal_size(stream.fileno()).columns or 80
        except (OSError, ValueError):
            return 80
    return None


def resolve_format(fmt: str | None, output: Path | None) -> str:
    """An explicit ``--format`` wins; otherwise the output file's extension decides; else a table."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise UsageError(f"unknown format '{fmt}' (choose table, csv or json)")
        return fmt
    if output is not None:
        suffix = output.suffix.lower().lstrip(".")
        if suffix in ("csv", "json"):
            return suffix
        if suffix in ("txt", "table", "") or os.fspath(output).startswith(("/dev/", "/proc/")):
            return "table"
        raise UsageError(f"cannot tell the format of '{output}' from its extension; pass --format csv|json|table")
    return "table"


def explanation_lines(lines: Iterable[str]) -> str:
    """``--explain`` lines for an 80-column terminal: each indented two spaces (plus its own indent), long sentences
    wrapped under themselves four spaces further in."""
    import textwrap

    out = []
    for line in lines:
        indent = "  " + " " * (len(line) - len(line.lstrip()))
        out.append(textwrap.fill(line.strip(), 78, initial_indent=indent, subsequent_indent=indent + "    ",
                                 break_on_hyphens=False) + "\n")
    return "".join(out)


def emit_explanation(text: str, fmt: str | None, output: Path | None) -> None:
    """``--explain``'s trace for people: on stdout after a table, on stderr when stdout carries CSV or JSON (which
    must parse as such)."""
    to_stdout = output is None or os.fspath(output) in STDOUT_NAMES
    if to_stdout and resolve_format(fmt, output) != "table":
        for line in text.splitlines():
            print_stderr(line)
        return
    write_stdout(text)


def print_stderr(message: str) -> None:
    """One line for a person on stderr (control characters removed); silent when stderr is closed or broken."""
    from tfcalc.output.terminal import printable

    line = printable(message, one_line=True) + "\n"
    stream = sys.stderr
    try:
        if stream is not None:
            stream.write(line)
            stream.flush()
            return
    except (OSError, ValueError, UnicodeEncodeError):
        pass
    try:  # sys.stderr is gone or broken: try the descriptor itself, else give up quietly
        os.write(2, line.encode("utf-8", "replace"))
    except OSError:
        pass


def show_progress(message: str) -> None:
    """A status line on stderr that the next one replaces (carriage return, erase line); ``""`` clears it.

    For a terminal only (callers check ``sys.stderr.isatty()``); the message is printable, one line, and a
    stderr that is closed or broken is ignored, as in ``print_stderr``.
    """
    from tfcalc.output.terminal import printable

    stream = sys.stderr
    try:
        if stream is not None:
            stream.write("\r\033[K" + printable(message, one_line=True))
            stream.flush()
    except (OSError, ValueError, UnicodeEncodeError):
        pass


def _json_ascii(text: str) -> str:
    """JSON text with every non-ASCII character as a \\u escape (they only occur inside strings)."""
    out = []
    for char in text:
        code = ord(char)
        if code < 0x80:
            out.append(char)
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    return "".join(out)


def write_stdout(text: str, fmt: str = "table") -> None:
    """Write a rendered result to stdout: printable on a terminal, encodable on an ASCII-only stream.

    A table falls back to ASCII lines and look-alikes, JSON to \\u escapes; CSV that the stream cannot encode
    is refused with a one-line OutputError rather than written with substitutes. OS errors (a full disk, a
    closed stdout) become one-line OutputErrors; BrokenPipeError is left to the caller (a reader that left).
    """
    from tfcalc.output.terminal import can_encode, printable, to_ascii

    stream = sys.stdout
    if stream is None:
        raise OutputError("cannot write the result: stdout is closed")
    try:
        terminal = stream.isatty()
    except (OSError, ValueError):
        terminal = False
    if terminal:
        text = printable(text)
    encoding = getattr(stream, "encoding", None)
    utf8 = (encoding or "").lower().replace("-", "").replace("_", "") == "utf8"
    if not utf8 and not can_encode(text, encoding):
        if fmt == "json":
            text = _json_ascii(text)
        elif fmt == "csv":
            bad = next(c for c in text if not can_encode(c, encoding))
            raise OutputError(f"stdout's encoding ({encoding}) cannot represent {bad!r} in the CSV; set "
                              "PYTHONIOENCODING=utf-8 or write a file with --output")
        else:
            text = to_ascii(text)
            if not can_encode(text, encoding):
                text = text.encode(encoding, "backslashreplace").decode(encoding)  # type: ignore[arg-type]
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:
        raise OutputError(f"cannot write to stdout: {getattr(exc, 'strerror', None) or exc}") from None


def emit(rows: list[dict[str, object]], columns: list[Column], fmt: str | None = None, output: Path | None = None,
         title: str = "", notes: tuple[str, ...] = (),
         extra: list[tuple[str, list[dict[str, object]], list[Column]]] = (), announce: bool = True,
         view: TableView | None = None) -> None:
    """Render ``rows``: the table shows ``columns`` in human units, fitted to the terminal (``terminal_width``;
    files get the natural width); CSV/JSON carry every key, exact, or only ``--columns``' keys.

    ``view`` (default: the command's, see ``table_view``) picks the table's columns. ``extra`` adds further
    (title, rows, columns) tables after the first, in table format and without ``--columns`` only. ``output``
    None or ``-`` means stdout; any other path goes through ``tfcalc.output.files.open_output``, and stderr
    says "wrote N rows to PATH" unless ``announce`` is False (a checkpoint rewritten after every row).
    """
    fmt = resolve_format(fmt, output)
    view = view or _VIEW.get() or DEFAULT_VIEW
    to_stdout = output is None or os.fspath(output) in STDOUT_NAMES
    if to_stdout and sys.stdout is None:
        raise OutputError("cannot write the result: stdout is closed")
    absent = [key for key in view.keys if rows and all(key not in row for row in rows)]
    if absent and announce:
        print_stderr(f"note: this output has no column {', '.join(absent)}; shown empty")
    if fmt == "table":
        from tfcalc.output.table import render_table

        width = terminal_width() if to_stdout else None
        text = render_table(rows, columns, title, notes, width, view)
        for extra_title, extra_rows, extra_columns in () if view.keys else extra:
            text += render_table(extra_rows, extra_columns, extra_title, width=width, view=view)
    else:
        from tfcalc.output.export import to_csv, to_json

        if view.keys:
            rows = [{key: row.get(key) for key in view.keys} for row in rows]
        text = to_csv(rows) if fmt == "csv" else to_json(rows)
        if not text.endswith("\n"):
            text += "\n"
    if to_stdout:
        write_stdout(text, fmt)
        return
    from tfcalc.output.files import write_atomic

    write_atomic(output, text)
    if announce:
        print_stderr(f"wrote {len(rows):,} row{'' if len(rows) == 1 else 's'} to {output}")
