"""Results as rows (one dict per result, exact integers under unit-bearing keys), one module per command family.

No I/O here: the CLI hands these rows to ``tfcalc.output``.
"""

from __future__ import annotations

import math
from collections.abc import Sized


def sweep_rows(*lists: Sized) -> int:
    """The rows a sweep over ``lists`` makes: their lengths multiplied, an empty list (a default) counting 1."""
    return math.prod(max(len(items), 1) for items in lists)
