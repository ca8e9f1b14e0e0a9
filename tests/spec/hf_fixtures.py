"""The config.json fixtures of tests/fixtures/hf_configs, read with changes, and the specs they give."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tfcalc.spec.hf_config import spec_from_hf_config
from tfcalc.spec.model import ModelSpec

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
DROP = object()   # a change that removes the key


def fixture(name: str, **changes: Any) -> dict[str, Any]:
    """The fixture ``name``.json with ``changes`` laid over it (a value of ``DROP`` removes that key)."""
    data = json.loads((FIXTURE_DIR / f"{name}.json").read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is DROP:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def build(name: str, **changes: Any) -> ModelSpec:
    """The spec tfcalc reads from the changed fixture."""
    return spec_from_hf_config(fixture(name, **changes), origin=f"{name}.json", name=name)
