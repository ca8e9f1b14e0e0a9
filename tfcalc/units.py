"""Parsing of sizes and lists typed on the command line.

Token counts and batch sizes use binary suffixes, as context lengths are quoted: ``128k`` = 131072,
``1m`` = 1048576; plain integers may use ``_`` separators (``1_000``).
"""

from __future__ import annotations

import re

from tfcalc.errors import UsageError

_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SIZE = re.compile(r"(\d[\d_]*(?:\.\d+)?)\s*([kmg]?)", re.IGNORECASE)


def parse_size(text: str, what: str = "size") -> int:
    """``131072``, ``128k``/``128K`` (x1024), ``1m`` (x1024^2), ``1_000``, ``1.5k`` (= 1536); must be > 0."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"invalid {what} '{text}': expected an integer such as 4096, 128k or 1m")
    number, suffix = match.groups()
    value = float(number.replace("_", "")) * _SUFFIX[suffix.lower()]
    if value != int(value):
        raise UsageError(f"invalid {what} '{text}': not a whole number of tokens")
    if value <= 0:
        raise UsageError(f"invalid {what} '{text}': must be positive")
    return int(value)


def split_list(text: str) -> list[str]:
    """``a,b , c`` -> [a, b, c]; empty items are errors."""
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items):
        raise UsageError(f"invalid list '{text}': empty item")
    return items


def parse_sizes(values: list[str] | None, what: str) -> list[int]:
    """Every ``--opt a,b --opt c`` value parsed as a size, order kept, duplicates dropped."""
    sizes: list[int] = []
    for value in values or []:
        for item in split_list(value):
            size = parse_size(item, what)
            if size not in sizes:
                sizes.append(size)
    return sizes


def parse_float(text: str, what: str, low: float = 0.0, high: float | None = None) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"invalid {what} '{text}': expected a number") from None
    if value <= low or (high is not None and value > high):
        upper = f" and at most {high}" if high is not None else ""
        raise UsageError(f"invalid {what} '{text}': must be greater than {low}{upper}")
    return value
