"""Rows for `tfcalc presets list` and `tfcalc presets show`."""

from __future__ import annotations

import re

from tfcalc.calc.params import count_params

Row = dict[str, object]


def _flatten(mapping: dict[str, object], prefix: str = "") -> list[tuple[str, object]]:
    """(dotted field, value) for every leaf, each ``sources`` block left out (``source_index`` reads them); a list
    of mappings (an engine's scheduler defaults by GPU) gives one field per entry, ``scheduler_defaults[0].max_...``."""
    items: list[tuple[str, object]] = []
    for key, value in mapping.items():
        if key == "sources" and isinstance(value, dict):
            continue
        if isinstance(value, dict):
            items.extend(_flatten(value, f"{prefix}{key}."))
        elif isinstance(value, list) and value and all(isinstance(entry, dict) for entry in value):
            for i, entry in enumerate(value):
                items.extend(_flatten(entry, f"{prefix}{key}[{i}]."))
        else:
            items.append((f"{prefix}{key}", value))
    return items


def source_index(document: dict[str, object], prefix: str = "") -> dict[str, str]:
    """Every ``sources`` block, at the top or inside a section (``latency.sources`` cites ``latency.*`` fields): its
    keys are comma-separated field names relative to that block's section; map each dotted field to its citation."""
    index: dict[str, str] = {}
    for key, value in document.items():
        if not isinstance(value, dict):
            continue
        if key == "sources":
            for keys, citation in value.items():
                for field in str(keys).split(","):
                    index[prefix + field.strip()] = " ".join(str(citation).split())
        else:
            index.update(source_index(value, f"{prefix}{key}."))
    return index


def _source_of(field: str, sources: dict[str, str]) -> str:
    """The citation of ``field`` or of the nearest section that holds it (``dense_tflops`` cites
    ``dense_tflops.bf16``)."""
    parts = re.sub(r"\[\d+\]", "", field).split(".")
    for end in range(len(parts), 0, -1):
        citation = sources.get(".".join(parts[:end]))
        if citation is not None:
            return citation
    return ""


def preset_field_rows(kind: str, name: str) -> list[Row]:
    """Every field of a preset with the source that covers it."""
    from tfcalc.spec.presets import load_preset_document

    document = load_preset_document(kind, name)
    sources = source_index(document)
    rows: list[Row] = [{"field": key, "value": _cell(value), "source": _source_of(key, sources)}
                       for key, value in _flatten(document)]
    if kind == "gpu":
        rows.extend(_price_rows(name))
    return rows


def _price_rows(gpu: str) -> list[Row]:
    """The GPU's rate in presets/prices.yaml, which `capacity` costs plans at: price.usd_per_gpu_hour,
    price.provider_kind (neocloud / hyperscaler) and price.as_of, cited by the entry's source; none if unpriced."""
    from tfcalc.spec.prices import load_prices

    price = load_prices().get(gpu)
    if price is None:
        return []
    source = f"{' '.join(price.source.split())} (presets/prices.yaml)"
    return [{"field": f"price.{field}", "value": value, "source": source}
            for field, value in (("usd_per_gpu_hour", price.usd_per_gpu_hour),
                                 ("provider_kind", price.provider_kind), ("as_of", price.as_of))]


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
