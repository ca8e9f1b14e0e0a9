"""Rows -> CSV (pandas) or JSON: exact integers under unit-bearing column names.

Values are written the way the tools that read them expect: a float that holds a whole number is written
as that integer (``2039000000000000``, not ``2039000000000000.0`` or a float-rounding tail), NaN and
infinities as empty cells / ``null`` (JSON has no NaN); CSV booleans as ``TRUE`` / ``FALSE``, which Excel,
LibreOffice, Google Sheets and pandas all read as booleans.
"""

from __future__ import annotations

import json
import math
import re

_MAX_EXACT_FLOAT_INT = 2**53  # every integer-valued float below this is exactly the integer it prints as
# JSON escapes C0 controls itself; C1 controls and bidi overrides it leaves raw, and a terminal may act on them.
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def plain_value(value: object) -> object:
    """A row value as exported: integral floats -> int, non-finite floats -> None, others unchanged."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value.is_integer() and abs(value) < _MAX_EXACT_FLOAT_INT:
            return int(value)
    return value


def _csv_value(value: object) -> object:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    return plain_value(value)


def to_csv(rows: list[dict[str, object]]) -> str:
    import pandas as pd  # noqa: TID251 - the one place pandas is used

    columns = list(dict.fromkeys(key for row in rows for key in row))
    # dtype=object keeps Python ints exact (no int -> float upcast where a column has blanks).
    frame = pd.DataFrame([{k: _csv_value(v) for k, v in row.items()} for row in rows], columns=columns,
                         dtype=object)
    return frame.to_csv(index=False, lineterminator="\n")


def to_json(rows: list[dict[str, object]]) -> str:
    """A list of row objects with the same keys as the CSV columns."""
    text = json.dumps([{k: plain_value(v) for k, v in row.items()} for row in rows], indent=2, ensure_ascii=False)
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"
