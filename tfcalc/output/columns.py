"""How one table column is titled and formatted; exact values stay in the rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["text", "int", "bytes", "bytes_exact", "params", "float", "percent", "bool", "seconds", "rate", "si"]

GIB = 1 << 30


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    kind: Kind = "text"
    unit: str = ""  # appended to "rate" ("tok/s") and "bytes" ("/s") cells; the base unit of "si" cells


def format_bytes(value: float) -> str:
    """Binary units: GiB = 2^30 bytes, MiB = 2^20, KiB = 2^10."""
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} B"


def format_params(value: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.2f}{unit}"
    return f"{value:,.0f}"


def format_si(value: float, unit: str) -> str:
    """Decimal prefixes, as vendors quote bandwidth and throughput: 3.35e12 B/s -> 3.35 TB/s."""
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.4g} {prefix}{unit}"
    return f"{value:,.4g} {unit}"


def format_seconds(value: float) -> str:
    if value >= 1:
        return f"{value:,.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:,.2f} ms"
    return f"{value * 1e6:,.1f} µs"


def format_cell(value: object, column: Column) -> str:
    if value is None:
        return "—"
    if column.kind == "bool":
        return "yes" if value else "no"
    if isinstance(value, str) or column.kind == "text":
        return str(value)
    if not isinstance(value, (int, float)):
        return str(value)
    if column.kind == "bytes":
        return format_bytes(value) + column.unit
    if column.kind == "bytes_exact":
        return f"{value:,} B"
    if column.kind == "params":
        return format_params(value)
    if column.kind == "int":
        return f"{value:,}"
    if column.kind == "percent":
        return f"{value * 100:.1f} %"
    if column.kind == "si":
        return format_si(value, column.unit)
    if column.kind == "seconds":
        return format_seconds(value)
    if column.kind == "rate":
        return f"{value:,.1f} {column.unit}".rstrip()
    return f"{value:,.4g}"
