"""The one output layer: rows (lists of dicts) become a Rich table, CSV or JSON, on stdout or a file."""

from __future__ import annotations

import sys
from pathlib import Path

from tfcalc.errors import UsageError
from tfcalc.output.columns import Column

FORMATS = ("table", "csv", "json")
__all__ = ["Column", "FORMATS", "emit", "resolve_format"]


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
        if suffix in ("txt", "table", ""):
            return "table"
        raise UsageError(f"cannot tell the format of '{output}' from its extension; pass --format csv|json|table")
    return "table"


def emit(rows: list[dict[str, object]], columns: list[Column], fmt: str | None = None, output: Path | None = None,
         title: str = "", notes: tuple[str, ...] = (),
         extra: list[tuple[str, list[dict[str, object]], list[Column]]] = ()) -> None:
    """Render ``rows``: the table shows ``columns`` in human units; CSV/JSON carry every key, exact.

    ``extra`` adds further (title, rows, columns) tables after the first, in table format only.
    """
    fmt = resolve_format(fmt, output)
    if fmt == "table":
        from tfcalc.output.table import render_table

        text = render_table(rows, columns, title, notes, to_file=output is not None)
        for extra_title, extra_rows, extra_columns in extra:
            text += render_table(extra_rows, extra_columns, extra_title, to_file=output is not None)
    else:
        from tfcalc.output.export import to_csv, to_json

        text = to_csv(rows) if fmt == "csv" else to_json(rows)
    if output is None:
        if fmt == "table":
            sys.stdout.write(text)
        else:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    from tfcalc.output.files import write_atomic

    write_atomic(output, text)
    sys.stderr.write(f"wrote {len(rows)} rows to {output}\n")
