"""Serving-engine presets (``presets/engines/NAME.yaml``): what an engine's kernels add to the GPU's own costs.

The GPU preset's floors are those of vLLM's kernels (where they were measured); an engine preset says how a given
engine runs a step -- CUDA graphs or not, custom all-reduce or NCCL, fused fp8 activation quantisation -- and,
where its kernels were measured to differ, their floors (per kernel class, and per layer for fused attention
blocks such as MLA). Units as printed: microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfcalc.errors import SpecError

_KEYS = {"display_name", "cuda_graphs", "custom_allreduce", "fused_activation_quant", "eager_launch_us", "floors_us",
         "block_floors_us", "sources", "notes"}
FLOOR_CLASSES = ("gemm", "elementwise", "attention", "moe")
BLOCK_CLASSES = ("mla_decode", "mla_prefill")


@dataclass(frozen=True, kw_only=True)
class Engine:
    """How an engine runs a step (module docstring); floors in seconds."""

    name: str
    display_name: str = ""
    cuda_graphs: bool = True
    custom_allreduce: bool = True
    fused_activation_quant: bool = False
    eager_launch_s: float = 8e-6
    floors_s: dict[str, float] = field(default_factory=dict, hash=False)
    block_floors_s: dict[str, float] = field(default_factory=dict, hash=False)


def _bool(data: dict[str, Any], key: str, origin: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"{origin}: field '{key}' must be true or false, got {value!r}")
    return value


def _micros(value: Any, origin: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise SpecError(f"{origin}: field '{key}' must be a non-negative number of microseconds, got {value!r}")
    return float(value) * 1e-6


def _floors(data: Any, origin: str, key: str, allowed: tuple[str, ...]) -> dict[str, float]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: field '{key}' must be a mapping of {', '.join(allowed)}")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise SpecError(f"{origin}: unknown field '{key}.{unknown[0]}' (known: {', '.join(allowed)})")
    return {k: _micros(v, origin, f"{key}.{k}") for k, v in data.items()}


def engine_from_mapping(data: dict[str, Any], origin: str, default_name: str) -> Engine:
    """Validate an engine preset mapping (module docstring)."""
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise SpecError(f"{origin}: unknown field '{unknown[0]}' (known: {', '.join(sorted(_KEYS))})")
    return Engine(name=default_name, display_name=str(data.get("display_name", default_name)),
                  cuda_graphs=_bool(data, "cuda_graphs", origin, True),
                  custom_allreduce=_bool(data, "custom_allreduce", origin, True),
                  fused_activation_quant=_bool(data, "fused_activation_quant", origin, False),
                  eager_launch_s=_micros(data.get("eager_launch_us", 8.0), origin, "eager_launch_us"),
                  floors_s=_floors(data.get("floors_us"), origin, "floors_us", FLOOR_CLASSES),
                  block_floors_s=_floors(data.get("block_floors_us"), origin, "block_floors_us", BLOCK_CLASSES))


def load_engine(name_or_path: str) -> Engine:
    """An engine preset by name (``vllm``), or a user's YAML file in the same format."""
    from tfcalc.spec.presets import looks_like_path, preset_path, read_data_file

    if looks_like_path(name_or_path):
        path = Path(name_or_path)
        return engine_from_mapping(read_data_file(path), str(path), path.stem)
    path = preset_path("engine", name_or_path)
    return engine_from_mapping(read_data_file(path), str(path), name_or_path)
