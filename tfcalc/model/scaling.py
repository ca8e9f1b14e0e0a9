"""Scaled-down copies of a model for profiling: fewer layers that keep the layer pattern, narrower widths.

Pure spec arithmetic (no torch), so the CLI can validate overrides before anything is built. A model's layers
come in kinds: dense or MoE FFN, sliding-window (or chunked) or global attention, Gated DeltaNet (linear), Mamba-2 or
softmax attention, RoPE or NoPE (Llama 4), and Nemotron-H's blocks holding only a mixer or only an MLP / MoE.
``layers=N`` keeps each kind in proportion (largest remainder, every kind at least one layer when N allows), picks
evenly spaced layers of each kind and keeps their original order, so DeepSeek-V3 at 2 layers is one dense and one
MoE layer, Gemma 2 at 4 layers alternates sliding and global, Qwen3-Next at 4 layers is 3 linear and 1 attention
layer, Nemotron 3 Nano at 4 layers is 2 Mamba-2, 1 MoE and 1 attention block, and :func:`describe_layers` says which
were kept.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tfcalc.errors import UsageError
from tfcalc.spec.model import ModelSpec


def layer_kind(spec: ModelSpec, layer: int) -> str:
    """``dense``/``moe`` (MoE models), ``sliding`` (or ``chunked``)/``global`` (windowed models),
    ``linear``/``attention`` (Gated DeltaNet models; ``mamba``/``attention`` with Mamba-2), ``nope`` (layers without
    RoPE: Llama 4, Nemotron-H's attention) and ``indexed``/``shared`` (DSA models whose layers do not all run their
    own indexer: GLM-5.2), e.g. "moe global nope". A block without a mixer is ``mlp`` or ``moe`` alone and a block
    without an FFN names no FFN (Nemotron-H: "mamba", "attention nope", "mlp", "moe")."""
    if not spec.has_mixer(layer):
        return "moe" if spec.is_moe_layer(layer) else "mlp"
    parts = []
    if spec.moe is not None and spec.has_ffn(layer):
        parts.append("moe" if spec.is_moe_layer(layer) else "dense")
    if spec.sliding_window_layers:
        parts.append(("chunked" if spec.chunked_attention else "sliding") if spec.is_sliding_layer(layer) else "global")
    la = spec.linear_attention
    if la is not None:
        parts.append(("mamba" if la.kind == "mamba2" else "linear") if spec.is_linear_layer(layer) else "attention")
    if layer in spec.nope_layers:
        parts.append("nope")
    si = spec.sparse_indexer
    if si is not None and len(si.layers) < spec.num_layers:
        parts.append("indexed" if layer in si.layers else "shared")
    return " ".join(parts) or "layer"


def pick_layers(spec: ModelSpec, n: int) -> tuple[int, ...]:
    """The original indices of ``n`` layers that keep the kinds in proportion, in their original order."""
    if not 0 < n <= spec.num_layers:
        raise UsageError(f"--layers {n}: {spec.name} has {spec.num_layers} layers (choose 1..{spec.num_layers})")
    by_kind: dict[str, list[int]] = {}
    for i in range(spec.num_layers):
        by_kind.setdefault(layer_kind(spec, i), []).append(i)
    kinds = sorted(by_kind, key=lambda k: (-len(by_kind[k]), by_kind[k][0]))
    if n < len(kinds):  # too few layers for every kind: the most common kinds, one layer each
        counts = {k: int(k in kinds[:n]) for k in kinds}
    else:  # every kind once, the rest in proportion (largest remainder), never more than a kind has
        counts = dict.fromkeys(kinds, 1)
        quota = {k: max(n * len(by_kind[k]) / spec.num_layers - 1, 0.0) for k in kinds}
        total = sum(quota.values())
        quota = {k: q * (n - len(kinds)) / total if total else 0.0 for k, q in quota.items()}
        for k in kinds:
            counts[k] += min(math.floor(quota[k]), len(by_kind[k]) - 1)
        while sum(counts.values()) < n:
            k = max((k for k in kinds if counts[k] < len(by_kind[k])), key=lambda k: quota[k] - counts[k])
            counts[k] += 1
    kept = []
    for kind, count in counts.items():
        members = by_kind[kind]
        kept += [members[min(math.floor((j + 0.5) * len(members) / count), len(members) - 1)] for j in range(count)]
    return tuple(sorted(kept))


def keep_layers(spec: ModelSpec, layers: tuple[int, ...]) -> ModelSpec:
    """``spec`` with only the given original layers, in order (dense, sliding, linear-attention, NoPE, indexer,
    FFN-free, mixer-free and weight-exception layer lists renumbered; the first kept layer runs its own DSA indexer,
    no earlier one being left to share)."""
    moe = spec.moe
    if moe is not None:
        moe = replace(moe, dense_layers=tuple(i for i, old in enumerate(layers) if not spec.is_moe_layer(old)))
    sliding = tuple(i for i, old in enumerate(layers) if spec.is_sliding_layer(old))
    exceptions = tuple(replace(x, layers=tuple(i for i, old in enumerate(layers) if old in kept))
                       for x in spec.quantized_weight_exceptions for kept in [frozenset(x.layers)])
    linear = spec.linear_attention
    if linear is not None:
        linear = replace(linear, layers=tuple(i for i, old in enumerate(layers) if spec.is_linear_layer(old)))
    nope = tuple(i for i, old in enumerate(layers) if old in spec.nope_layers)
    indexer = spec.sparse_indexer
    if indexer is not None:
        indexer = replace(indexer, layers=tuple(i for i, old in enumerate(layers) if i == 0 or old in indexer.layers))
    ffn_free = tuple(i for i, old in enumerate(layers) if not spec.has_ffn(old))
    mixer_free = tuple(i for i, old in enumerate(layers) if not spec.has_mixer(old))
    widths = tuple(spec.layer_intermediate_sizes[old] for old in layers) if spec.layer_intermediate_sizes else ()
    return replace(spec, num_layers=len(layers), moe=moe, sliding_window_layers=sliding, linear_attention=linear,
                   layer_intermediate_sizes=widths,
                   sparse_indexer=indexer, ffn_free_layers=ffn_free, mixer_free_layers=mixer_free,
                   sliding_window=spec.sliding_window if sliding else None, quantized_weight_exceptions=exceptions,
                   local_attention=spec.local_attention if sliding else "sliding", nope_layers=nope)


def describe_layers(spec: ModelSpec, layers: tuple[int, ...]) -> str:
    """Which layers a scaled model kept, per kind: "dense 1 of 3, moe 1 of 58 (layers 1, 32 of 61)"."""
    total: dict[str, int] = {}
    kept: dict[str, int] = {}
    for i in range(spec.num_layers):
        total[layer_kind(spec, i)] = total.get(layer_kind(spec, i), 0) + 1
    for i in layers:
        kept[layer_kind(spec, i)] = kept.get(layer_kind(spec, i), 0) + 1
    parts = ", ".join(f"{kind} {kept.get(kind, 0)} of {count}" for kind, count in total.items())
    shown = ", ".join(map(str, layers)) if len(layers) <= 8 else f"{', '.join(map(str, layers[:8]))}, ..."
    return f"{parts} (layers {shown} of {spec.num_layers})"


def scale_spec(spec: ModelSpec, *, layers: int | None = None, hidden: int | None = None,
               heads: int | None = None, kv_heads: int | None = None, head_dim: int | None = None,
               intermediate: int | None = None, vocab: int | None = None, experts: int | None = None,
               experts_per_token: int | None = None, expert_intermediate: int | None = None) -> ModelSpec:
    """A scaled-down copy of ``spec``: ``layers`` by :func:`pick_layers`, the rest through ``with_overrides``.

    ``experts_per_token`` is capped at ``experts``; expert groups shrink to a divisor of ``experts``; a shared
    expert keeps its width unless ``expert_intermediate`` is given, which sets both; per-layer MLP widths scale with
    ``intermediate``. Values that cannot make a
    model (vocab below 2, more layers than the model has) are refused with a UsageError naming the option.
    """
    for name, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("kv-heads", kv_heads),
                        ("head-dim", head_dim), ("intermediate", intermediate), ("vocab", vocab),
                        ("experts", experts), ("experts-per-token", experts_per_token),
                        ("expert-intermediate", expert_intermediate)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise UsageError(f"invalid --{name} {value!r}: must be positive")
    if vocab is not None and vocab < 2:
        raise UsageError(f"invalid --vocab {vocab}: the profiler draws token ids from 1..vocab-1, so vocab >= 2")
    if experts is not None and spec.moe is None:
        raise UsageError(f"--experts {experts}: {spec.name} has no experts")
    names = {"hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
             "intermediate_size": intermediate, "vocab_size": vocab}
    changes: dict[str, object] = {k: v for k, v in names.items() if v is not None}
    if spec.mla is not None and heads is not None and kv_heads is None:
        changes["num_kv_heads"] = heads  # MLA's config field equals the head count; its cache is the latent
    scaled = keep_layers(spec, pick_layers(spec, layers)) if layers is not None else spec
    if intermediate is not None and scaled.layer_intermediate_sizes:  # per-layer widths shrink in proportion
        changes["layer_intermediate_sizes"] = tuple(max(1, w * intermediate // scaled.intermediate_size) if w else 0
                                                    for w in scaled.layer_intermediate_sizes)
    moe = scaled.moe
    if moe is not None and (experts or experts_per_token or expert_intermediate):
        e = experts or moe.num_experts
        # groups: the most that divide the experts with two or more per group (a group scores its top two)
        groups = max(g for g in range(1, moe.expert_groups + 1) if e % g == 0 and (e // g >= 2 or g == 1))
        k = min(experts_per_token or moe.experts_per_token, e)
        per_token = max(1, min(groups, round(moe.groups_per_token * groups / moe.expert_groups)))
        per_token = max(per_token, -(-k // (e // groups)))  # the kept groups must hold K experts
        moe = replace(moe, num_experts=e, experts_per_token=k,
                      expert_intermediate_size=expert_intermediate or moe.expert_intermediate_size,
                      shared_expert_intermediate_size=(expert_intermediate or moe.shared_expert_intermediate_size)
                      if moe.num_shared_experts else 0, expert_groups=groups, groups_per_token=per_token)
        changes["moe"] = moe
    return scaled.with_overrides(**changes) if changes else scaled
