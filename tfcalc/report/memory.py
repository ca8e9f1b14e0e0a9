"""Rows for `tfcalc memory`: weights + KV cache + activation workspace per precision choice."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from tfcalc.calc.kv_cache import default_kv_dtype, kv_cache_bytes
from tfcalc.calc.memory import activation_workspace_bytes, weights_bytes_by_component
from tfcalc.calc.params import count_params
from tfcalc.dtypes import PARAM_COMPONENTS, DType, WeightPrecision, parse_weight_precision
from tfcalc.spec.model import ModelSpec, WeightException

Row = dict[str, object]

# What tfcalc.calc.memory.activation_workspace_bytes counts, in words (the note under the memory table).
ACTIVATION_FORMULA = (
    "activation workspace = T x (2h + max(attention width, FFN width)) x activation bytes + batch x vocab x 4 "
    "(fp32 logits of the last position); T = min(batch x context, prefill chunk) tokens in one forward pass; "
    "attention width = (heads + 2 kv_heads) x head_dim + heads x head_dim; FFN width = 3 x intermediate "
    "(gate, up, product) of the widest FFN the tokens pass (top-k experts for MoE)"
)
# calc.memory.activation_workspace_bytes: MLA's prefill materialises per-head q, k (qk_head_dim) and v, o (v_head_dim)
MLA_ACTIVATION = ("MLA's attention width = heads x (2 qk_head_dim + 2 v_head_dim): the q, k, v and output its prefill "
                  "materialises from the latent")


def memory_rows(specs: list[ModelSpec], contexts: list[int], batches: list[int],
                weight_precisions: list[WeightPrecision], kv_dtypes: list[DType], activation_dtype: DType,
                prefill_chunk_tokens: int) -> list[Row]:
    """Weights + KV cache + activation workspace, one row per combination, with per-component weight bytes."""
    return list(iter_memory_rows(specs, contexts, batches, weight_precisions, kv_dtypes, activation_dtype,
                                 prefill_chunk_tokens))


def iter_memory_rows(specs: list[ModelSpec], contexts: list[int], batches: list[int],
                     weight_precisions: list[WeightPrecision], kv_dtypes: list[DType], activation_dtype: DType,
                     prefill_chunk_tokens: int) -> Iterator[Row]:
    """``memory_rows`` one at a time (a sweep stopped part-way keeps the rows made)."""
    for spec in specs:
        counts = count_params(spec)
        precisions = weight_precisions or [parse_weight_precision(spec.native_dtype)]
        for precision, kv_dtype, context, batch in itertools.product(
                precisions, kv_dtypes or [default_kv_dtype(spec)], contexts or [spec.max_context], batches):
            by_component = weights_bytes_by_component(counts, precision, spec=spec)
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
            for component in PARAM_COMPONENTS:
                row[f"{component}_weights_bytes"] = by_component[component]
            yield row


def exception_phrase(spec: ModelSpec, x: WeightException) -> str:
    """One ``quantized_weight_exceptions`` entry in words: "mlp of layers 0, 125 in bf16"."""
    layers = sorted(set(x.layers))
    where = ("every layer" if len(layers) == spec.num_layers else
             f"layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}" if len(layers) <= 4 else
             f"{len(layers)} layers")
    what = f"{', '.join(x.modules)} of the {x.components[0]}" if x.modules else ' and '.join(x.components)
    return f"{what} of {where} in {x.dtype}"


def exception_notes(specs: list[ModelSpec]) -> tuple[str, ...]:
    """The layers each model's checkpoint keeps in another format (``quantized_weight_exceptions``), which the
    weights above count wherever the chosen format is one the exception names."""
    notes = []
    for spec in specs:
        parts = [exception_phrase(spec, x) + (f" (when {' or '.join(x.formats)})" if x.formats else "")
                 for x in spec.quantized_weight_exceptions]
        if parts:
            notes.append(f"{spec.name}: as its checkpoint ships, {'; '.join(parts)}")
    return tuple(notes)
