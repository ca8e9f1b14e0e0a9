"""Rows for `tfcalc kv-cache`: bytes per token and for batch x context, per attention variant."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from tfcalc.calc.kv_cache import (
    attention_variants,
    default_kv_dtype,
    kv_bytes_per_token,
    kv_cache_bytes,
    linear_name,
    state_exact_bytes_per_sequence,
)
from tfcalc.dtypes import DType
from tfcalc.report import sweep_rows
from tfcalc.spec.model import ModelSpec

Row = dict[str, object]


def _window_label(spec: ModelSpec) -> str:
    if spec.sliding_window is None:
        return ""
    layers = len(spec.sliding_window_layers)
    what = "chunks of " if spec.chunked_attention else ""
    return f"{what}{spec.sliding_window} on {layers}/{spec.num_layers} layers"


def _variant_label(spec: ModelSpec, kind: str, variant: ModelSpec) -> str:
    """``GQA (as configured, 8 KV heads)``, ``MHA (materialised K/V)`` for an MLA model, else the kind."""
    if variant is spec:
        heads = (f"{spec.num_kv_heads} / {spec.full_attention.num_kv_heads} KV heads" if spec.full_attention is not None
                 else f"{spec.num_kv_heads} KV heads")  # Gemma 4: the sliding layers', then the global ones'
        return f"{kind} (as configured, {heads})" if kind == "GQA" else f"{kind} (as configured)"
    return "MHA (materialised K/V)" if kind == "MHA" and spec.mla is not None else kind


def kv_cache_rows(specs: list[ModelSpec], contexts: list[int], batches: list[int], kv_dtypes: list[DType],
                  compare_attention: bool = False) -> list[Row]:
    """One row per model x attention variant x context x batch x dtype; ``kv_bytes_per_token`` is uncapped."""
    return list(iter_kv_cache_rows(specs, contexts, batches, kv_dtypes, compare_attention))


def kv_cache_row_count(specs: list[ModelSpec], contexts: list[int], batches: list[int], kv_dtypes: list[DType],
                       compare_attention: bool = False) -> int:
    """How many rows ``kv_cache_rows`` makes (the attention variants differ by model)."""
    variants = sum(len(attention_variants(spec)) if compare_attention else 1 for spec in specs)
    return variants * sweep_rows(contexts, batches, kv_dtypes)


def iter_kv_cache_rows(specs: list[ModelSpec], contexts: list[int], batches: list[int], kv_dtypes: list[DType],
                       compare_attention: bool = False) -> Iterator[Row]:
    """``kv_cache_rows`` one at a time (a sweep stopped part-way keeps the rows made)."""
    for spec in specs:
        variants = ([(_variant_label(spec, kind, variant), variant) for kind, variant in attention_variants(spec)]
                    if compare_attention else [(spec.attention_kind, spec)])
        state = state_exact_bytes_per_sequence(spec)
        for (label, variant), context, batch, kv_dtype in itertools.product(
                variants, contexts or [spec.max_context], batches, kv_dtypes or [default_kv_dtype(spec)]):
            per_token = kv_bytes_per_token(variant, kv_dtype)
            yield {
                "model": spec.name,
                "attention": label if spec.linear_attention is None else f"{label} + {linear_name(spec)}",
                "kv_heads": variant.num_kv_heads if variant.mla is None else None,
                "head_dim": variant.head_dim if variant.mla is None else None,
                "layers": variant.num_layers,
                "linear_layers": variant.num_linear_layers if spec.linear_attention is not None else None,
                "sliding_window": _window_label(variant),
                "context": context,
                "batch": batch,
                "kv_dtype": kv_dtype.name,
                "kv_bytes_per_token": per_token,
                "state_bytes": math.ceil(batch * state) if state else None,
                "kv_cache_bytes": kv_cache_bytes(variant, kv_dtype, context, batch),
                "kv_cache_bytes_uncapped": math.ceil(per_token * context * batch + batch * state),
                "exceeds_max_context": context > spec.max_context,
            }
