"""Parsing of sizes and lists typed on the command line, and quantities written for people.

Token counts and batch sizes use binary suffixes, as context lengths are quoted: ``128k`` = 131072,
``1m`` = 1048576; plain integers may use ``_`` separators (``1_000``). Sizes are parsed exactly, as integers
(never through floating point: ``9007199254740993`` stays itself), and bounded by ``MAX_SIZE``.
"""

from __future__ import annotations

import math
import re

from tfcalc.errors import UsageError

_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"(\d[\d_]*)(?:\.(\d+))?\s*([kmgt]?)", re.IGNORECASE)
# 2^62: far above any token count, batch or byte size tfcalc reasons about (1 EiB = 2^60 bytes), and small
# enough that products of a few sizes stay exact in a float's exponent range.
MAX_SIZE = 1 << 62
MAX_TOKENS = 1 << 40  # a sequence length: far past any model, exact as a float (the latency model's arithmetic)
_MAX_DIGITS = 60  # longer numbers are refused before any arithmetic on them


def parse_size(text: str, what: str = "size", maximum: int = MAX_SIZE) -> int:
    """``131072``, ``128k``/``128K`` (x1024), ``1m`` (x1024^2), ``1_000``, ``1.5k`` (= 1536); 1..maximum."""
    match = _SIZE.fullmatch(text.strip())
    if not match and _SIZE.fullmatch(text.strip().removeprefix("-")):
        raise UsageError(f"invalid {what} '{text}': must be positive")
    if not match:
        raise UsageError(f"invalid {what} '{text}': expected an integer such as 4096, 128k or 1m")
    whole, fraction, suffix = match.groups()
    if len(whole) + len(fraction or "") > _MAX_DIGITS:
        raise UsageError(f"invalid {what} '{text.strip()[:20]}...' ({len(text.strip())} characters): at most "
                         f"{maximum:,}")
    scale = _SUFFIX[suffix.lower()]
    value = int(whole.replace("_", "")) * scale
    if fraction:  # integer arithmetic only: 1.5k = 1536 exactly, 1.3 is refused
        extra, remainder = divmod(int(fraction) * scale, 10 ** len(fraction))
        if remainder:
            raise UsageError(f"invalid {what} '{text}': not a whole number")
        value += extra
    if value <= 0:
        raise UsageError(f"invalid {what} '{text}': must be positive")
    if value > maximum:
        raise UsageError(f"invalid {what} '{text}': at most {maximum:,}")
    return int(value)


def split_list(text: str, what: str = "list") -> list[str]:
    """``a,b , c`` -> [a, b, c]; empty items are errors, named by ``what`` (the option's name for its values)."""
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items):
        raise UsageError(f"invalid {what} '{text}': " + ("empty" if len(items) == 1 else "empty item in the list"))
    return items


def parse_sizes(values: list[str] | None, what: str, maximum: int = MAX_SIZE) -> list[int]:
    """Every ``--opt a,b --opt c`` value parsed as a size, order kept, duplicates dropped."""
    sizes: list[int] = []
    for value in values or []:
        for item in split_list(value, what):
            size = parse_size(item, what, maximum)
            if size not in sizes:
                sizes.append(size)
    return sizes


def parse_float(text: str, what: str, low: float = 0.0, high: float | None = None) -> float:
    """A finite number in (low, high]: ``nan``, ``inf`` and ``1e400`` are refused."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"invalid {what} '{text}': expected a number") from None
    if not math.isfinite(value):
        raise UsageError(f"invalid {what} '{text}': expected a finite number")
    if value <= low or (high is not None and value > high):
        upper = f" and at most {high}" if high is not None else ""
        raise UsageError(f"invalid {what} '{text}': must be greater than {low}{upper}")
    return value


# --- quantities for people: tables (tfcalc.output) and sentences (tfcalc.report) write them alike ------------------

def format_bytes(value: float) -> str:
    """Binary units: GiB = 2^30 bytes, MiB = 2^20, KiB = 2^10."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
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
    """s, ms or µs with two decimals (one for µs): 22.45 ms."""
    if value >= 1:
        return f"{value:,.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:,.2f} ms"
    return f"{value * 1e6:,.1f} µs"


def format_count(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless one: "1 GPU", "8 GPUs" (counts printed with thousands separators)."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
