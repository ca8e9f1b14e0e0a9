"""Rows for `tfcalc presets list` and `tfcalc presets show`."""

from __future__ import annotations

from tfcalc.calc.params import count_params

Row = dict[str, object]


def _flatten(mapping: dict[str, object], prefix: str = "") -> list[tuple[str, object]]:
    items: list[tuple[str, object]] = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            items.extend(_flatten(value, f"{prefix}{key}."))
        else:
            items.append((f"{prefix}{key}", value))
    return items


def source_index(document: dict[str, object]) -> dict[str, str]:
    """``sources`` keys are comma-separated field names; map each field to its citation."""
    index: dict[str, str] = {}
    sources = document.get("sources") or {}
    if isinstance(sources, dict):
        for keys, citation in sources.items():
            for key in str(keys).split(","):
                index[key.strip()] = " ".join(str(citation).split())
    return index


def preset_field_rows(kind: str, name: str) -> list[Row]:
    """Every field of a preset with the source that covers it."""
    from tfcalc.spec.presets import load_preset_document

    document = load_preset_document(kind, name)
    sources = source_index(document)
    body = {k: v for k, v in document.items() if k != "sources"}
    return [{"field": key, "value": _cell(value), "source": sources.get(key, "")} for key, value in _flatten(body)]


def _cell(value: object) -> object:
    """Scalars as they are; lists as comma-separated text (aliases, layer indices)."""
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    return str(value)


def preset_rows(kind: str) -> list[Row]:
    """One row per preset of ``kind`` (model, gpu, engine, interconnect): its headline facts, exact."""
    from tfcalc.spec.presets import preset_names

    return [_ROW_MAKERS[kind](name) for name in preset_names(kind)]


def _model_row(name: str) -> Row:
    from tfcalc.spec.presets import load_model, load_preset_document

    spec = load_model(name)
    counts = count_params(spec)
    return {"name": name, "display_name": load_preset_document("model", name).get("display_name", name),
            "attention": spec.attention_kind, "layers": spec.num_layers, "hidden_size": spec.hidden_size,
            "moe": f"{spec.moe.experts_per_token} of {spec.moe.num_experts}" if spec.moe else "",
            "total_params": counts.total_params, "active_params": counts.active_params,
            "max_context": spec.max_context, "native_dtype": spec.native_dtype}


def _gpu_row(name: str) -> Row:
    """Exact B/s and FLOP/s (tables show TB/s and TFLOP/s)."""
    from tfcalc.dtypes import FLOP_DTYPES
    from tfcalc.spec.presets import load_gpu

    gpu = load_gpu(name)
    return {"name": name, "display_name": gpu.display_name, "gpu_memory_bytes": gpu.memory_bytes,
            "hbm_bandwidth_bytes_per_s": gpu.hbm_bandwidth_bytes_per_s,
            **{f"{d}_dense_flops_per_s": gpu.dense_flops_per_s.get(d) for d in FLOP_DTYPES},
            "interconnect": gpu.interconnect,
            "interconnect_bandwidth_bytes_per_s": gpu.interconnect_bandwidth_bytes_per_s}


def _engine_row(name: str) -> Row:
    from tfcalc.spec.presets import load_engine

    engine = load_engine(name)
    return {"name": name, "engine": engine.name, "releases": engine.releases or None, "default": engine.default,
            "budget": engine.budget, "display_name": engine.display_name}


def _interconnect_row(name: str) -> Row:
    from tfcalc.spec.interconnect import load_interconnect

    fabric = load_interconnect(name)
    return {"name": name, "display_name": fabric.display_name,
            "link_bandwidth_bytes_per_s": fabric.nccl.bandwidth_bytes_per_s, "nccl_algorithm": fabric.algorithm,
            "custom_allreduce": fabric.custom_allreduce is not None}


_ROW_MAKERS = {"model": _model_row, "gpu": _gpu_row, "engine": _engine_row, "interconnect": _interconnect_row}
