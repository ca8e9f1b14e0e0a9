"""The one place where preset and user YAML files become validated specs.

Model presets live in ``presets/models/NAME.yaml`` and GPU presets in ``presets/gpus/NAME.yaml``. The
folder ships inside the wheel as ``tfcalc/_presets`` and is found beside the package in a checkout.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.model import MLASpec, ModelSpec, MoESpec, RopeScaling

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
PRESET_KINDS = ("model", "gpu")
_KIND_FOLDERS = {"model": "models", "gpu": "gpus", "interconnect": "interconnects", "engine": "engines"}

# Keys a preset may carry besides the spec's own fields: provenance and published figures.
_DOC_KEYS = {"display_name", "sources", "published", "kind"}


def preset_root() -> Path:
    """``tfcalc/_presets`` in an installed wheel, else the checkout's top-level ``presets/``."""
    for candidate in (_PACKAGE_DIR / "_presets", _PACKAGE_DIR.parent / "presets"):
        if (candidate / "models").is_dir():
            return candidate
    raise SpecError(f"preset folder not found next to {_PACKAGE_DIR}; reinstall tfcalc")


def preset_names(kind: str = "model") -> list[str]:
    folder = preset_root() / _KIND_FOLDERS[kind]
    return sorted(p.stem for p in folder.glob("*.yaml"))


def suggest(name: str, choices: list[str], limit: int = 3) -> list[str]:
    """Closest names: difflib similarity first, then names sharing a substring."""
    import difflib

    lowered = name.lower()
    close = difflib.get_close_matches(lowered, choices, n=limit, cutoff=0.5)
    for choice in choices:
        if len(close) >= limit:
            break
        if choice not in close and (lowered in choice or choice in lowered):
            close.append(choice)
    return close


def unknown_name_error(kind: str, name: str, choices: list[str]) -> UsageError:
    hints = suggest(name, choices)
    hint = f"; did you mean {', '.join(hints)}?" if hints else f"; run 'tfcalc presets list --kind {kind}'"
    return UsageError(f"unknown {kind} preset '{name}'{hint}")


def read_data_file(path: Path, allow_list: bool = False) -> Any:
    """Parse a YAML or JSON file into a mapping (or a list of mappings, if allowed), with one-line errors."""
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None
    import json

    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            data = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except Exception as exc:  # yaml.YAMLError and its subclasses
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{path}: malformed YAML{where}: {problem}") from None
    if allow_list and isinstance(data, list) and all(isinstance(item, dict) for item in data):
        return data
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data


def preset_path(kind: str, name: str) -> Path:
    path = preset_root() / _KIND_FOLDERS[kind] / f"{name}.yaml"
    if not path.is_file():
        raise unknown_name_error(kind, name, preset_names(kind))
    return path


def looks_like_path(value: str) -> bool:
    return value.endswith((".yaml", ".yml", ".json")) or "/" in value or "\\" in value


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name, or a user's YAML file in the preset format."""
    if looks_like_path(name_or_path):
        path = Path(name_or_path)
        return model_from_mapping(read_data_file(path), origin=str(path), default_name=path.stem)
    path = preset_path("model", name_or_path)
    return model_from_mapping(read_data_file(path), origin=str(path), default_name=name_or_path)


def load_gpu(name_or_path: str):  # -> tfcalc.spec.gpu.GPUSpec
    """A GPU preset by name, or a user's YAML file in the GPU preset format."""
    from tfcalc.spec.gpu import gpu_from_mapping

    if looks_like_path(name_or_path):
        path = Path(name_or_path)
        return gpu_from_mapping(read_data_file(path), origin=str(path), default_name=path.stem)
    path = preset_path("gpu", name_or_path)
    return gpu_from_mapping(read_data_file(path), origin=str(path), default_name=name_or_path)


def load_preset_document(kind: str, name: str) -> dict[str, Any]:
    """The raw preset mapping (with sources and published figures), for ``presets show`` and tests."""
    return read_data_file(preset_path(kind, name))


# --- mapping -> ModelSpec ------------------------------------------------------------------------

_MODEL_FIELDS = {f.name for f in fields(ModelSpec)} - {"extra"}
_MOE_FIELDS = {f.name for f in fields(MoESpec)}
_MLA_FIELDS = {f.name for f in fields(MLASpec)}
_ROPE_FIELDS = {f.name for f in fields(RopeScaling)}
_INT_FIELDS = {"vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim",
               "intermediate_size", "max_context", "norms_per_layer"}
_MOE_INT_FIELDS = {"num_experts", "experts_per_token", "expert_intermediate_size", "num_shared_experts",
                   "shared_expert_intermediate_size"}
_BOOL_FIELDS = {"tie_word_embeddings", "qkv_bias", "o_bias", "attention_sinks", "mlp_bias", "qk_norm"}


def _check_keys(data: dict[str, Any], allowed: set[str], origin: str, prefix: str = "") -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        hints = suggest(unknown[0], sorted(allowed), limit=1)
        hint = f" (did you mean '{prefix}{hints[0]}'?)" if hints else ""
        raise SpecError(f"{origin}: unknown field '{prefix}{unknown[0]}'{hint}")


def _int(value: Any, origin: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{origin}: field '{key}' must be an integer, got {value!r}")
    return value


def _layer_list(value: Any, num_layers: int, origin: str, key: str) -> tuple[int, ...]:
    """``all``, ``even``, ``odd``, ``none`` or an explicit list of layer indices."""
    patterns = {
        "all": range(num_layers),
        "even": range(0, num_layers, 2),
        "odd": range(1, num_layers, 2),
        "none": range(0),
    }
    if isinstance(value, str) and value in patterns:
        return tuple(patterns[value])
    if isinstance(value, list):
        return tuple(_int(v, origin, key) for v in value)
    raise SpecError(f"{origin}: field '{key}' must be all, even, odd, none or a list of layer indices")


def model_from_mapping(data: dict[str, Any], origin: str, default_name: str) -> ModelSpec:
    """Validate a preset-format mapping and build the ModelSpec; errors name the file and the field."""
    data = dict(data)
    _check_keys(data, _MODEL_FIELDS | _DOC_KEYS | {"moe", "mla", "rope_scaling", "sliding_window_layers"}, origin)
    for key in _DOC_KEYS:
        data.pop(key, None)
    for key in _INT_FIELDS & set(data):
        _int(data[key], origin, key)
    for key in _BOOL_FIELDS & set(data):
        if not isinstance(data[key], bool):
            raise SpecError(f"{origin}: field '{key}' must be true or false, got {data[key]!r}")
    num_layers = data.get("num_layers")
    if not isinstance(num_layers, int):
        raise SpecError(f"{origin}: missing required field 'num_layers'")
    if "sliding_window_layers" in data:
        data["sliding_window_layers"] = _layer_list(data["sliding_window_layers"], num_layers, origin,
                                                    "sliding_window_layers")
    elif data.get("sliding_window") is not None:
        data["sliding_window_layers"] = tuple(range(num_layers))
    data.setdefault("name", default_name)
    try:
        return _build_model(data, num_layers, origin)
    except TypeError as exc:
        message = str(exc)
        prefix = {"MoESpec": "moe.", "MLASpec": "mla.", "RopeScaling": "rope_scaling."}.get(message.split(".")[0], "")
        match = re.search(r"argument: '(\w+)'", message)
        if match:
            raise SpecError(f"{origin}: missing required field '{prefix}{match.group(1)}'") from None
        raise SpecError(f"{origin}: invalid value: {message}") from None
    except SpecError as exc:
        message = str(exc)
        raise SpecError(message if message.startswith(origin) else f"{origin}: {message}") from None


def _build_model(data: dict[str, Any], num_layers: int, origin: str) -> ModelSpec:
    if data.get("moe") is not None:
        moe = data["moe"]
        if not isinstance(moe, dict):
            raise SpecError(f"{origin}: field 'moe' must be a mapping")
        moe = dict(moe)
        _check_keys(moe, _MOE_FIELDS | {"first_k_dense"}, origin, "moe.")
        if "first_k_dense" in moe:
            moe["dense_layers"] = tuple(range(_int(moe.pop("first_k_dense"), origin, "moe.first_k_dense")))
        elif "dense_layers" in moe:
            moe["dense_layers"] = _layer_list(moe["dense_layers"], num_layers, origin, "moe.dense_layers")
        for key, value in moe.items():
            if key in _MOE_INT_FIELDS:
                _int(value, origin, f"moe.{key}")
        data["moe"] = MoESpec(**moe)
    if data.get("mla") is not None:
        if not isinstance(data["mla"], dict):
            raise SpecError(f"{origin}: field 'mla' must be a mapping")
        _check_keys(data["mla"], _MLA_FIELDS, origin, "mla.")
        for key, value in data["mla"].items():
            if value is not None:
                _int(value, origin, f"mla.{key}")
        data["mla"] = MLASpec(**{"q_lora_rank": None, **data["mla"]})
    if data.get("rope_scaling") is not None:
        if not isinstance(data["rope_scaling"], dict):
            raise SpecError(f"{origin}: field 'rope_scaling' must be a mapping")
        _check_keys(data["rope_scaling"], _ROPE_FIELDS, origin, "rope_scaling.")
        data["rope_scaling"] = RopeScaling(**data["rope_scaling"])
    return ModelSpec(**data)
