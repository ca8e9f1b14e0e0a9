"""Rows -> a Rich table in human units (the only module that draws tables)."""

from __future__ import annotations

import io
import shutil
import sys

from tfcalc.output.columns import Column, format_cell


def render_table(rows: list[dict[str, object]], columns: list[Column], title: str = "",
                 notes: tuple[str, ...] = (), to_file: bool = False) -> str:
    from rich.console import Console
    from rich.table import Table

    # A column with no value in any row (e.g. datasheet MFU on a CPU) is left out of the table, not of CSV/JSON.
    columns = [c for c in columns if any(row.get(c.key) is not None for row in rows)] if rows else columns
    table = Table(title=title or None, title_justify="left", header_style="bold")
    numeric = {"int", "bytes", "bytes_exact", "params", "float", "percent", "seconds", "rate"}
    for column in columns:
        table.add_column(column.header, justify="right" if column.kind in numeric else "left")
    for row in rows:
        table.add_row(*(format_cell(row.get(c.key), c) for c in columns))
    buffer = io.StringIO()
    # On a terminal, fit its width; in a pipe or a file, draw the table at its natural width (up to 250
    # columns) rather than cut cells, and wrap the notes to that width.
    if sys.stdout.isatty() and not to_file:
        width = shutil.get_terminal_size().columns
    else:
        natural = Console(width=250, file=io.StringIO()).measure(table).maximum
        width = max(100, min(natural, 250))
    console = Console(file=buffer, width=width, force_terminal=False, color_system=None, soft_wrap=False,
                      emoji=False, highlight=False)
    console.print(table)
    for note in notes:
        console.print(note, highlight=False, markup=False)
    return buffer.getvalue()
