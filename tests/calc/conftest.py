"""Shared helpers for the serving-model tests: a step-time source with a fixed step time."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tfcalc.calc.serving_inputs import ConstantStep, KvShape


def constant_step_model(seconds: float, layers: int = 1) -> ConstantStep:
    """Every non-empty step takes ``seconds``, whatever it carries."""
    return ConstantStep(seconds=seconds, kv=KvShape(num_layers=layers))


@pytest.fixture
def constant_step() -> Callable[..., ConstantStep]:
    return constant_step_model
