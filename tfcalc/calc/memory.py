"""Weight, KV-cache and activation-workspace bytes for a choice of storage formats.

Weights: per component, matrices x bits/element of the component's format (scale overhead included) +
1-D tensors (biases, norms) at 16 bits when the matrices are quantized. Weights may mix formats per
component, e.g. ``experts=mxfp4,default=bf16`` as gpt-oss ships.
"""

from __future__ import annotations

import math
from fractions import Fraction

from tfcalc.calc.params import ParamCounts, latent_shape
from tfcalc.dtypes import DType, WeightPrecision, vector_dtype
from tfcalc.spec.model import ModelSpec


def weights_bytes_by_component(counts: ParamCounts, precision: WeightPrecision, active: bool = False,
                               spec: ModelSpec | None = None) -> dict[str, int]:
    """Bytes per component: matrix elements x format bits + vector elements x 16 (or the float format's) bits;
    with ``spec``, its quantized_weight_exceptions applied (layers a quantized checkpoint keeps in 16 bits) and a
    latent MoE's projections, counted with the experts, in their own format (``shard.latent_dtype``)."""
    params = counts.active if active else counts.total
    deltas: dict[str, Fraction] = {}
    if spec is not None:
        from tfcalc.calc.shard import Parallelism, dtype_bytes, exception_counts, exception_deltas, latent_dtype, shard

        if spec.quantized_weight_exceptions and not active:
            everything = range(spec.num_layers)
            deltas = exception_deltas(spec, shard(spec, Parallelism()), precision,
                                      exception_counts(spec, everything))
        latent = latent_shape(spec).total() * spec.num_moe_layers  # as count_params adds it to the experts
        deltas["experts"] = deltas.get("experts", Fraction(0)) + dtype_bytes(
            latent, latent_dtype(spec, precision)) - dtype_bytes(latent, precision.for_component("experts"))
    result: dict[str, int] = {}
    for component, p in params.items():
        matrix_dtype = precision.for_component(component)
        exact = matrix_dtype.bytes_for(p.matrix) + vector_dtype(matrix_dtype).bytes_for(p.vector)
        result[component] = math.ceil(exact + deltas.get(component, 0))
    return result


def weights_bytes(counts: ParamCounts, precision: WeightPrecision) -> int:
    return sum(weights_bytes_by_component(counts, precision).values())


def activation_workspace_bytes(spec: ModelSpec, batch: int, context: int, activation_dtype: DType,
                               prefill_chunk_tokens: int, tp: int = 1) -> int:
    """Peak transient activations of one forward pass (an estimate, not a bound): T x (2h + max(attention width,
    FFN width)) x activation bytes + batch x vocab x 4 (fp32 logits), T = min(batch x context, prefill chunk).

    With tensor parallelism each GPU holds 1/tp of the attention/FFN widths and of the logits.
    """
    tokens = min(batch * context, prefill_chunk_tokens)
    h = spec.hidden_size
    if spec.mla is not None:
        m = spec.mla
        attention_width = spec.num_attention_heads * (2 * m.qk_head_dim + 2 * m.v_head_dim)
    else:
        attention_width = max((2 * spec.num_attention_heads + 2 * shape.num_kv_heads) * shape.head_dim
                              for shape in (spec, spec.full_layer_spec))  # Gemma 4's full layers: their own
    dense = spec.moe is None or bool(spec.moe.dense_layers) or spec.moe.dense_mlp_beside
    ffn_intermediate = spec.intermediate_size if dense else 0
    if spec.moe is not None:
        moe = spec.moe
        routed = moe.experts_per_token * moe.expert_intermediate_size
        shared = moe.num_shared_experts * moe.shared_expert_intermediate_size
        ffn_intermediate = max(ffn_intermediate, routed + shared)
    ffn_width = 3 * ffn_intermediate
    per_token = (2 * h + Fraction(max(attention_width, ffn_width), tp)) * activation_dtype.bits_per_element / 8
    logits = batch * spec.vocab_size * 4 // tp
    return math.ceil(tokens * per_token) + logits
