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


def preset_rows(kind: str) -> tuple[list[Row], list]:
    """One row per preset of ``kind`` and the table columns to show it with."""
    from tfcalc.output import Column
    from tfcalc.spec.presets import load_model, load_preset_document, preset_names

    rows: list[Row] = []
    if kind == "model":
        for name in preset_names("model"):
            spec = load_model(name)
            counts = count_params(spec)
            rows.append({
                "name": name,
                "display_name": load_preset_document("model", name).get("display_name", name),
                "attention": spec.attention_kind,
                "layers": spec.num_layers,
                "hidden_size": spec.hidden_size,
                "moe": f"{spec.moe.experts_per_token} of {spec.moe.num_experts}" if spec.moe else "",
                "total_params": counts.total_params,
                "active_params": counts.active_params,
                "max_context": spec.max_context,
                "native_dtype": spec.native_dtype,
            })
        columns = [Column("name", "preset"), Column("display_name", "model"), Column("attention", "attn"),
                   Column("layers", "layers", "int"), Column("moe", "experts"),
                   Column("total_params", "total params", "params"),
                   Column("active_params", "active params", "params"),
                   Column("max_context", "max context", "int"), Column("native_dtype", "native dtype")]
        return rows, columns
    if kind == "gpu":
        return _gpu_preset_rows()
    raise ValueError(f"no preset listing for kind {kind!r}")


def _gpu_preset_rows() -> tuple[list[Row], list]:
    """One row per GPU preset (exact B/s and FLOP/s), shown in TB/s and TFLOP/s."""
    from tfcalc.output import Column
    from tfcalc.spec.gpu import FLOP_DTYPES
    from tfcalc.spec.presets import load_gpu, preset_names

    rows: list[Row] = []
    for name in preset_names("gpu"):
        gpu = load_gpu(name)
        rows.append({
            "name": name, "display_name": gpu.display_name, "memory_bytes": gpu.memory_bytes,
            "hbm_bandwidth_bytes_per_s": gpu.hbm_bandwidth_bytes_per_s,
            **{f"{d}_dense_flops_per_s": gpu.dense_flops_per_s.get(d) for d in FLOP_DTYPES},
            "interconnect": gpu.interconnect,
            "interconnect_bandwidth_bytes_per_s": gpu.interconnect_bandwidth_bytes_per_s,
        })
    columns = [Column("name", "preset"), Column("display_name", "GPU"), Column("memory_bytes", "memory", "bytes"),
               Column("hbm_bandwidth_bytes_per_s", "HBM bandwidth", "si", "B/s"),
               Column("bf16_dense_flops_per_s", "bf16 dense", "si", "FLOP/s"),
               Column("fp8_dense_flops_per_s", "fp8 dense", "si", "FLOP/s"),
               Column("fp4_dense_flops_per_s", "fp4 dense", "si", "FLOP/s"),
               Column("interconnect", "interconnect"),
               Column("interconnect_bandwidth_bytes_per_s", "link, one direction", "si", "B/s")]
    return rows, columns
