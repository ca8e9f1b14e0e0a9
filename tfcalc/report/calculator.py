"""Calculator results as rows: one dict per result, exact integers under unit-bearing keys. No I/O."""

from __future__ import annotations

import itertools

from tfcalc.calc.kv_cache import attention_variants, kv_bytes_per_token, kv_cache_bytes
from tfcalc.calc.memory import activation_workspace_bytes, weights_bytes_by_component
from tfcalc.calc.params import COMPONENTS, count_params
from tfcalc.dtypes import DType, WeightPrecision, get_dtype, parse_weight_precision
from tfcalc.spec.model import ModelSpec

Row = dict[str, object]


def params_rows(specs: list[ModelSpec]) -> list[Row]:
    """Per model: total and active parameters, then each component's total and active count."""
    rows: list[Row] = []
    for spec in specs:
        counts = count_params(spec)
        row: Row = {
            "model": spec.name,
            "total_params": counts.total_params,
            "active_params": counts.active_params,
            "non_embedding_params": counts.total_params - counts.total["embedding"].total
            - counts.total["lm_head"].total,
        }
        for component in COMPONENTS:
            row[f"{component}_params"] = counts.total[component].total
            row[f"{component}_active_params"] = counts.active[component].total
        row["active_convention"] = counts.convention
        rows.append(row)
    return rows


def params_breakdown_rows(specs: list[ModelSpec]) -> list[Row]:
    """Long format for the table: one row per (model, component) with its share of the total."""
    rows: list[Row] = []
    for spec in specs:
        counts = count_params(spec)
        for component in COMPONENTS:
            total = counts.total[component].total
            if total == 0:
                continue
            rows.append({"model": spec.name, "component": component, "total_params": total,
                         "active_params": counts.active[component].total,
                         "share_of_total": total / counts.total_params})
    return rows


def default_kv_dtype(spec: ModelSpec) -> DType:
    """The cache is kept in the model's float dtype: bf16 unless the checkpoint is fp16/fp32."""
    native = parse_weight_precision(spec.native_dtype).default
    return native if not native.quantized else get_dtype("bf16")


def _window_label(spec: ModelSpec) -> str:
    if spec.sliding_window is None:
        return ""
    layers = len(spec.sliding_window_layers)
    return f"{spec.sliding_window} on {layers}/{spec.num_layers} layers"


def kv_cache_rows(specs: list[ModelSpec], contexts: list[int], batches: list[int], kv_dtypes: list[DType],
                  compare_attention: bool = False) -> list[Row]:
    """One row per model x attention variant x context x batch x dtype; ``kv_bytes_per_token`` is uncapped."""
    rows: list[Row] = []
    for spec in specs:
        variants = attention_variants(spec) if compare_attention else [(spec.attention_kind, spec)]
        for (label, variant), context, batch, kv_dtype in itertools.product(
                variants, contexts or [spec.max_context], batches, kv_dtypes or [default_kv_dtype(spec)]):
            per_token = kv_bytes_per_token(variant, kv_dtype)
            rows.append({
                "model": spec.name,
                "attention": label,
                "kv_heads": variant.num_kv_heads if variant.mla is None else None,
                "head_dim": variant.head_dim if variant.mla is None else None,
                "layers": variant.num_layers,
                "sliding_window": _window_label(variant),
                "context": context,
                "batch": batch,
                "kv_dtype": kv_dtype.name,
                "kv_bytes_per_token": per_token,
                "kv_cache_bytes": kv_cache_bytes(variant, kv_dtype, context, batch),
                "kv_cache_bytes_uncapped": per_token * context * batch,
                "exceeds_max_context": context > spec.max_context,
            })
    return rows


def memory_rows(specs: list[ModelSpec], contexts: list[int], batches: list[int],
                weight_precisions: list[WeightPrecision], kv_dtypes: list[DType], activation_dtype: DType,
                prefill_chunk_tokens: int) -> list[Row]:
    """Weights + KV cache + activation workspace, one row per combination, with per-component weight bytes."""
    rows: list[Row] = []
    for spec in specs:
        counts = count_params(spec)
        precisions = weight_precisions or [parse_weight_precision(spec.native_dtype)]
        for precision, kv_dtype, context, batch in itertools.product(
                precisions, kv_dtypes or [default_kv_dtype(spec)], contexts or [spec.max_context], batches):
            by_component = weights_bytes_by_component(counts, precision)
            weights = sum(by_component.values())
            kv = kv_cache_bytes(spec, kv_dtype, context, batch)
            activations = activation_workspace_bytes(spec, batch, context, activation_dtype, prefill_chunk_tokens)
            row: Row = {
                "model": spec.name,
                "context": context,
                "batch": batch,
                "weights_dtype": precision.label,
                "kv_dtype": kv_dtype.name,
                "weights_bytes": weights,
                "kv_cache_bytes": kv,
                "activation_bytes": activations,
                "total_bytes": weights + kv + activations,
            }
            for component in COMPONENTS:
                row[f"{component}_weights_bytes"] = by_component[component]
            rows.append(row)
    return rows


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
    return [{"field": key, "value": value if isinstance(value, (int, float, str, bool)) or value is None
             else str(value), "source": sources.get(key, "")} for key, value in _flatten(body)]


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
        from tfcalc.spec.gpu import gpu_preset_columns, gpu_preset_rows

        return gpu_preset_rows(), gpu_preset_columns()
    raise ValueError(f"no preset listing for kind {kind!r}")
