"""Rows -> a Rich table in human units (the only module that draws tables)."""

from __future__ import annotations

import io
import shutil
import sys

from tfcalc.output.columns import Column, format_cell
from tfcalc.output.terminal import printable

NUMERIC_KINDS = {"int", "bytes", "bytes_exact", "params", "float", "percent", "seconds", "rate", "si"}


def render_table(rows: list[dict[str, object]], columns: list[Column], title: str = "",
                 notes: tuple[str, ...] = (), to_file: bool = False) -> str:
    """The table, then the notes, as plain text. Cells are Text, never parsed as Rich markup, with escape
    sequences and control characters removed (``printable``)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # A column with no value in any row (e.g. datasheet MFU on a CPU) is left out of the table, not of CSV/JSON.
    columns = [c for c in columns if any(row.get(c.key) is not None for row in rows)] if rows else columns
    title_text = Text(printable(title, one_line=True)) if title else None
    table = Table(title=title_text, title_justify="left", header_style="bold")
    for column in columns:
        table.add_column(Text(column.header), justify="right" if column.kind in NUMERIC_KINDS else "left")
    for row in rows:
        table.add_row(*(Text(printable(format_cell(row.get(c.key), c))) for c in columns))
    buffer = io.StringIO()
    # On a terminal, fit its width; in a pipe or a file, draw the table at its natural width (up to 250
    # columns) rather than cut cells, and wrap the notes to the table's width.
    terminal = sys.stdout.isatty() and not to_file
    console = Console(file=buffer, width=shutil.get_terminal_size().columns if terminal else 250,
                      force_terminal=False, color_system=None, soft_wrap=False, emoji=False, highlight=False,
                      markup=False)
    console.print(table)
    if not terminal:
        console.width = max(100, max(len(line) for line in buffer.getvalue().splitlines()))
    for note in notes:
        console.print(Text(printable(note)))
    return buffer.getvalue()
