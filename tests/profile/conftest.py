"""Profiler tests take the device ceilings as injected values (tests/conftest.py ``fixed_ceilings``); the
ceilings' own tests (test_ceilings) call the measuring functions directly, which the fixture leaves alone."""

import pytest


@pytest.fixture(autouse=True)
def _inject_ceilings(fixed_ceilings: None) -> None:
    pass
