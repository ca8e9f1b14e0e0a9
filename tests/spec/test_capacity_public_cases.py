"""capacity_validation.PUBLIC_CASES (the held-out serving runs of issue 13) are transcribed consistently: each
report's total token throughput is its output throughput x (prompt + output) / output, the same runs' token totals
over requests; known presets and engines; none repeats a case of the scored set."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from tfcalc.spec.presets import load_engine, preset_names


@pytest.fixture(scope="module")
def cv(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("capacity_validation.py")


def test_total_throughput_matches_lengths(cv: ModuleType) -> None:
    """total tok/s = output tok/s x (input mean + output mean) / output mean, within the reports' rounding (1 %)."""
    for case in cv.PUBLIC_CASES:
        implied = case.reported_output_tok_s * (case.input_mean + case.output_mean) / case.output_mean
        assert implied == pytest.approx(case.reported_total_tok_s, rel=0.01), case.id


def test_cases_are_known_and_new(cv: ModuleType) -> None:
    models, gpus = preset_names("model"), preset_names("gpu")
    scored = {(c.model, c.gpu, c.tp, c.dataset, c.input_mean, c.concurrency) for c in cv.CASES}
    ids = [c.id for c in cv.PUBLIC_CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 15
    for case in cv.PUBLIC_CASES:
        assert case.model in models and case.gpu in gpus, case.id
        assert load_engine(f"{case.engine}@{case.release}").name == case.engine, case.id
        assert (case.model, case.gpu, case.tp, case.dataset, case.input_mean, case.concurrency) not in scored
        assert case.published.startswith("2026-") and case.doc.split(" ")[0].endswith(".md"), case.id
        assert 0 < case.concurrency <= case.prompts and case.output_mean <= (case.output_cap or case.output_mean)
