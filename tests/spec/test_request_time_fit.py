"""benchmarks/validation/request_time_fit.py: the least squares that splits a closed loop's time per request into
tfcalc's prefill and decode shares."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


def test_request_time_fit_recovers_known_shares(benchmark_script: Callable[[str], ModuleType]) -> None:
    """benchmarks/validation/request_time_fit.py's least squares: rows made as 1.3 x prefill + 0.9 x decode give
    back (1.3, 0.9) and a zero residual; one run of silicon_runs.json splits into positive terms."""
    fit = benchmark_script("validation/request_time_fit.py")
    rows = [(1.3 * p + 0.9 * d, p, d) for p, d in ((0.05, 0.2), (0.1, 0.1), (0.2, 0.05), (0.07, 0.4))]
    a, b, rms = fit.fit(rows)
    assert (a, b) == (pytest.approx(1.3), pytest.approx(0.9)) and rms == pytest.approx(0.0, abs=1e-12)
    run = next(r for r in fit.json.loads(fit.RUNS.read_text()) if r["source"].startswith("Qwen_Qwen3-32B"))
    held, prefill, decode = fit.request_terms(run)
    assert held > 0 and prefill > 0 and decode > 0
