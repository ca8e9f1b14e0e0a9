"""Shared helper for the tests of the scripts under benchmarks/: import one by its path there."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="session")
def benchmark_script() -> Callable[[str], ModuleType]:
    """``benchmark_script("validation/validate.py")``: that script as a module, imported once per session and
    registered under its file name (its dataclasses look their module up in ``sys.modules``)."""
    loaded: dict[str, ModuleType] = {}

    def load(relative: str) -> ModuleType:
        if relative not in loaded:
            path = BENCHMARKS / relative
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
            loaded[relative] = module
        return loaded[relative]

    return load
