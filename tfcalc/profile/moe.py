"""``tfcalc bench moe``: the bundled MoE layer against a dense FFN of the same active parameters, and the expert load.

Pure measurement: rows (one dict per token count), never printed here. Parameter counts are asked of
``tfcalc.calc.params`` (the one derivation of shapes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from tfcalc.errors import UsageError
from tfcalc.profile.device import dtype_name, is_oom, release_memory
from tfcalc.profile.timing import first_sentence, time_or_failure

CPU_MOE_HIDDEN = 512  # hidden width the CPU default scales an MoE preset down to (experts and top-k kept)


def moe_bench_spec(spec, device: torch.device, hidden: int | None = None, experts: int | None = None,
                   experts_per_token: int | None = None, expert_intermediate: int | None = None):
    """``spec`` for the MoE benchmark: the preset's sizes on a GPU; on the CPU, hidden scaled down to 512.
    Whenever hidden changes and no expert width is given, the expert width (and a shared expert's) is scaled by
    the same factor, rounded to 16; experts and top-k are kept unless given."""
    from tfcalc.model.transformer import scale_spec

    if spec.moe is None:
        raise UsageError(f"{spec.name} has no MoE layers; pick an MoE preset (e.g. mixtral-8x7b, qwen3-30b-a3b)")
    if device.type == "cpu" and hidden is None and spec.hidden_size > CPU_MOE_HIDDEN:
        hidden = CPU_MOE_HIDDEN
    if hidden is not None and hidden > 0 and hidden != spec.hidden_size and expert_intermediate is None:
        factor = hidden / spec.hidden_size
        expert_intermediate = max(16, round(spec.moe.expert_intermediate_size * factor / 16) * 16)
    for value, what in ((hidden, "hidden"), (experts, "experts"), (experts_per_token, "experts per token"),
                        (expert_intermediate, "expert intermediate")):
        if value is not None and value <= 0:
            raise UsageError(f"--{what.replace(' ', '-')} must be positive")
    return scale_spec(spec, hidden=hidden, experts=experts, experts_per_token=experts_per_token,
                      expert_intermediate=expert_intermediate)


def moe_layer_params(spec) -> dict[str, int]:  # spec: ModelSpec with moe
    """Parameter counts of one MoE layer, asked of ``tfcalc.calc.params`` (the one derivation of shapes): total,
    active per token (router + K experts + shared), one expert, the router, and the dense FFN of width K·I
    (+ shared width) that matches the active expert parameters."""
    from tfcalc.calc.params import count_params, ffn_params

    moe = spec.moe
    totals = count_params(spec).total
    layers = spec.num_moe_layers
    per_expert = ffn_params(spec, moe.expert_intermediate_size, moe.expert_bias).total
    router = totals["router"].total // layers
    shared = totals["shared_experts"].total // layers
    dense = ffn_params(spec, dense_intermediate(spec), False).total
    return {"total": totals["experts"].total // layers + router + shared,
            "active": router + moe.experts_per_token * per_expert + shared,
            "per_expert": per_expert, "router": router, "dense": dense}


def dense_intermediate(spec) -> int:
    """K x expert width + shared width: a dense FFN with the MoE layer's active expert parameters per token."""
    moe = spec.moe
    return moe.experts_per_token * moe.expert_intermediate_size + moe.num_shared_experts * \
        moe.shared_expert_intermediate_size


def expert_load(counts: list[int], experts_per_token: int, tokens: int) -> dict[str, float]:
    """From per-expert (token, expert) pair counts: max and mean tokens per expert, max / mean, distinct
    experts touched, and the distinct count expected under uniform routing, E(1 - (1 - k/E)^N)."""
    from tfcalc.calc.kernels import distinct_experts

    e = len(counts)
    mean = tokens * experts_per_token / e
    peak = max(counts)
    return {"max_tokens_per_expert": peak, "mean_tokens_per_expert": mean,
            "load_imbalance": peak / mean if mean else math.nan,
            "distinct_experts": sum(1 for c in counts if c > 0),
            "expected_distinct_experts": distinct_experts(e, experts_per_token, tokens)}


def moe_rows(device: torch.device, dtype: torch.dtype, spec, tokens_list: Iterable[int], warmup: int = 2,
             repeats: int = 5, seed: int = 0,
             progress: Callable[[str], None] | None = None) -> list[dict[str, object]]:
    """The bundled :class:`~tfcalc.model.layers.MoE` layer of ``spec`` (already scaled to fit) against a dense
    :class:`~tfcalc.model.layers.FeedForward` of width :func:`dense_intermediate` (same active expert
    parameters per token), both on N random tokens; per N: time, tokens/s, moe/dense and the expert load the
    layer's ``expert_counts`` recorded for that input."""
    from tfcalc.model.layers import FeedForward, MoE

    if spec.moe is None:
        raise UsageError(f"{spec.name} has no MoE layers; pick an MoE preset (e.g. mixtral-8x7b, qwen3-30b-a3b)")
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in the benchmark dtype: no fp32 copy of a GPU-sized layer first
    try:
        with torch.device(device):
            moe_layer = MoE(spec).eval()
            dense = FeedForward(spec, dense_intermediate(spec), bias=False).eval()
    finally:
        torch.set_default_dtype(previous)
    params = moe_layer_params(spec)
    m = spec.moe
    rows: list[dict[str, object]] = []
    for n in tokens_list:
        row: dict[str, object] = {
            "device": str(device), "model": spec.name, "dtype": dtype_name(dtype), "hidden": spec.hidden_size,
            "experts": m.num_experts, "experts_per_token": m.experts_per_token,
            "expert_intermediate": m.expert_intermediate_size, "dense_intermediate": dense_intermediate(spec),
            "moe_params": params["total"], "moe_active_params": params["active"], "dense_params": params["dense"],
            "tokens": n, "moe_time_s": None, "dense_time_s": None, "moe_tokens_per_s": None,
            "dense_tokens_per_s": None, "moe_over_dense": None, "max_tokens_per_expert": None,
            "mean_tokens_per_expert": None, "load_imbalance": None, "distinct_experts": None,
            "expected_distinct_experts": None, "status": "ok", "note": "",
        }
        rows.append(row)
        if progress is not None:
            progress(f"moe tokens={n}")
        try:
            x = torch.randn(n, spec.hidden_size, device=device, dtype=dtype)
        except RuntimeError as exc:
            release_memory(device)
            row["status"] = "oom" if is_oom(exc) else "error"
            row["note"] = first_sentence(exc)
            continue
        with torch.inference_mode():
            moe_t, moe_status = time_or_failure(lambda x=x: moe_layer(x), device, warmup, repeats)
            counts = [int(c) for c in moe_layer.expert_counts.tolist()]  # the timed input's routing
            dense_t, dense_status = time_or_failure(lambda x=x: dense(x), device, warmup, repeats)
        if moe_t is None or dense_t is None:
            bad = moe_status if moe_t is None else dense_status
            row["status"], row["note"] = bad.split(":")[0], bad
            continue
        row.update(moe_time_s=moe_t.median_s, dense_time_s=dense_t.median_s, moe_tokens_per_s=n / moe_t.median_s,
                   dense_tokens_per_s=n / dense_t.median_s, moe_over_dense=dense_t.median_s / moe_t.median_s,
                   **expert_load(counts, m.experts_per_token, n))
    release_memory(device)
    return rows
