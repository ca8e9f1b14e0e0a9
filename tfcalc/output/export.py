"""Rows -> CSV (pandas) or JSON: exact integers under unit-bearing column names."""

from __future__ import annotations

import json


def to_csv(rows: list[dict[str, object]]) -> str:
    import pandas as pd  # noqa: TID251 - the one place pandas is used

    columns = list(dict.fromkeys(key for row in rows for key in row))
    # dtype=object keeps Python ints exact (no int -> float upcast where a column has blanks).
    frame = pd.DataFrame(rows, columns=columns, dtype=object)
    return frame.to_csv(index=False, lineterminator="\n")


def to_json(rows: list[dict[str, object]]) -> str:
    """A list of row objects with the same keys as the CSV columns."""
    return json.dumps(rows, indent=2, ensure_ascii=False) + "\n"
