"""How a model is sharded over GPUs and what one GPU holds, by groups of identical layers.

Sharding follows what serving engines (vLLM, SGLang, TensorRT-LLM) do:

- tensor parallel (tp) splits query heads, the attention output and the FFN columns/rows, and the vocabulary of
  the embedding and lm_head (vocab-parallel); norms, row-parallel output biases and the MoE router are
  replicated (per-component layout: ``tfcalc.calc.params`` ``TPShape``);
- KV heads are split over tp ranks; when tp > kv_heads each rank keeps one KV head (K/V projections and cache
  replicated tp / kv_heads times), so tp must be a multiple or a divisor of kv_heads;
- DeepSeek MLA: q_b, kv_b and o are split by head; q_a and kv_a (ReplicatedLinear in vLLM) and the latent KV
  cache (kv_lora_rank + rope dims, shared by all heads) are *not* split: every tp rank caches the full latent;
- pipeline parallel (pp) gives each stage a contiguous run of layers; the num_layers % pp extra layers go to
  the stages just before the last, never to the last (vLLM ``get_pp_indices``: 61 layers over 4 stages are
  15/15/16/15); the embedding sits on the first stage, the final norm and lm_head on the last (a tied
  embedding is held on both); a multimodal checkpoint's vision encoder sits on the first stage, its blocks split
  over tp as vLLM's vision towers are (``params.encoder_shape``);
- expert parallel (ep) places num_experts / ep routed experts per GPU; when ep < tp each of them is still
  sliced tp / ep ways (TensorRT-LLM's moe_tp x moe_ep = tp), when ep >= tp they are whole (vLLM's EP over
  tp x dp ranks), so ep must divide tp or be a multiple of it; with ``redundant_experts`` R (EPLB: vLLM
  --enable-eplb, SGLang --ep-num-redundant-experts, TensorRT-LLM's load balancer slots) each GPU holds
  (num_experts + R) / ep, replicas of the busiest experts among them (DeepSeek-V3's 256 + 32 = 288 over ep 72);
- data parallel replicas: num_gpus / (tp x pp) copies of the model; concurrent sequences add up over them.

Per-layer work is done once per kind of layer (dense / MoE, full / sliding, per-layer format exceptions) and
multiplied by counts, so planning a model of 10^6 layers costs what planning one of 10 does. Pure math, no I/O.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from tfcalc.calc.params import (
    Params,
    attention_modules,
    attention_shape,
    compressor_norm_params,
    compressor_shape,
    encoder_shape,
    expert_shape,
    ffn_modules,
    ffn_shape,
    final_norm_params,
    hyper_connection_params,
    hyper_head_params,
    indexer_modules,
    indexer_norm_params,
    indexer_shape,
    latent_shape,
    linear_attention_shape,
    linear_norms_shape,
    mixer_free_norms,
    norms_shape,
    router_params,
    shared_experts_shape,
)
from tfcalc.dtypes import DType, WeightPrecision, get_dtype, vector_dtype
from tfcalc.errors import UsageError
from tfcalc.spec.model import ModelSpec, WeightException


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    redundant_experts: int = 0  # expert replicas beyond the model's experts, spread with them over ep (EPLB)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp


def attention_ranks(tp: int, ep: int) -> int:
    """Data-parallel attention ranks of a tp x ep layout: ep / tp when the experts span more GPUs than one tp group
    (each rank its own attention, the experts shared), else 1."""
    return ep // tp if ep > tp else 1


def layout_redundant_experts(redundant_experts: int, tp: int, ep: int) -> int:
    """The redundant experts (EPLB's replicas) a layout holds: all of them where every GPU holds whole experts
    (ep >= tp, ep >= 2), none where the experts are sliced or not spread."""
    return redundant_experts if ep >= max(tp, 2) else 0


def check_parallelism(spec: ModelSpec, num_gpus: int, tp: int, pp: int = 1, ep: int = 1,
                      redundant_experts: int = 0) -> Parallelism:
    """Validate tp / pp / ep (and redundant experts) against the model and the GPU count; UsageError with the reason
    otherwise."""
    n = spec.name
    if min(num_gpus, tp, pp, ep) < 1:
        raise UsageError("num_gpus, tp, pp and ep must be positive")
    if redundant_experts:
        if redundant_experts < 0 or spec.moe is None or ep < max(tp, 2):
            raise UsageError(f"redundant experts ({redundant_experts}) need an MoE model and whole experts per GPU "
                             f"(ep >= tp, ep >= 2; got ep {ep}, tp {tp})")
    if spec.num_attention_heads % tp:
        raise UsageError(f"tp {tp} does not divide the {spec.num_attention_heads} attention heads of {n}")
    if spec.mla is None and tp % spec.num_kv_heads and spec.num_kv_heads % tp:
        raise UsageError(f"tp {tp} is neither a multiple nor a divisor of the {spec.num_kv_heads} KV heads of {n}")
    full_kv = spec.full_layer_spec.num_kv_heads
    if spec.full_attention is not None and tp % full_kv and full_kv % tp:
        raise UsageError(f"tp {tp} is neither a multiple nor a divisor of the {full_kv} KV heads of {n}'s "
                         "full-attention layers")
    la = spec.linear_attention
    if la is not None and la.kind == "mamba2" and (la.num_key_heads % tp or la.num_value_heads % tp):
        raise UsageError(f"tp {tp} does not divide the {la.num_key_heads} B/C groups and {la.num_value_heads} heads "
                         f"of {n}'s Mamba-2 layers (groups replicated over more GPUs are not modelled)")
    if la is not None and (la.num_key_heads % tp or la.num_value_heads % tp):
        raise UsageError(f"tp {tp} does not divide the {la.num_key_heads} key and {la.num_value_heads} value heads "
                         f"of {n}'s Gated DeltaNet layers")
    if num_gpus % (tp * pp):
        raise UsageError(f"tp x pp = {tp * pp} does not divide the GPU count {num_gpus}")
    if pp > spec.num_layers:
        raise UsageError(f"pp {pp} exceeds the {spec.num_layers} layers of {n}")
    if ep > 1:
        if spec.moe is None:
            raise UsageError(f"ep {ep} given but {n} has no experts")
        if ep % tp and tp % ep:
            raise UsageError(f"ep {ep} must divide tp {tp} or be a multiple of it")
        slots = spec.moe.num_experts + redundant_experts
        if slots % ep:
            extra = f" + {redundant_experts} redundant" if redundant_experts else ""
            hint = "" if redundant_experts or ep < tp else " (redundant experts can make up the difference)"
            raise UsageError(f"ep {ep} does not divide the {spec.moe.num_experts}{extra} experts of {n}{hint}")
        if (num_gpus // pp) % ep:
            raise UsageError(f"ep {ep} does not divide the {num_gpus // pp} GPUs of one pipeline stage")
    return Parallelism(tp=tp, pp=pp, ep=ep, dp=num_gpus // (tp * pp), redundant_experts=redundant_experts)


@dataclass(frozen=True, kw_only=True)
class Shard:
    """Weight elements one GPU holds (per layer where marked) and its KV elements per token per layer."""

    embedding: Params
    lm_head: Params
    final_norm: Params
    attention: Params            # per attention layer (per sliding one where full ones differ: Gemma 4)
    norms: Params                # per attention layer (likewise)
    mlp: Params                  # per dense layer
    expert: Params               # one routed expert's part on this GPU
    experts_resident: int        # routed experts per MoE layer on this GPU
    expert_slots: int = 0        # routed experts of a layer over all its GPUs: the model's + redundant (EPLB)
    experts_active: Fraction     # routed experts one token uses on this GPU, on average
    shared_experts: Params       # per MoE layer
    router: Params               # per MoE layer
    encoder: Params              # a multimodal checkpoint's vision encoder and projector, on the first stage
    kv_elements: int             # per token per layer
    kv_heads: int                # KV heads per GPU (0 for MLA)
    query_heads: int
    linear_attention: Params = Params()  # per Gated DeltaNet layer
    linear_norms: Params = Params()      # per Gated DeltaNet layer
    state_conv_elements: int = 0         # one sequence's conv state in one Gated DeltaNet layer on this GPU
    state_recurrent_elements: int = 0    # one sequence's recurrent state in one Gated DeltaNet layer on this GPU
    # a full-attention layer's part where its shape differs from the sliding layers' (Gemma 4); else the same
    full_attention: Params = Params()
    full_norms: Params = Params()
    full_kv_elements: int = 0
    full_kv_heads: int = 0
    indexer: Params = Params()  # per layer running a DSA indexer (DeepSeek-V3.2, GLM-5), whole on every GPU
    # per MoE layer: a latent MoE's two projections (Nemotron 3 Super, Kimi K3), whole on every GPU, in
    # ``latent_dtype``
    latent: Params = Params()
    # DeepSeek-V4, whole on every GPU: a CSA and an HCA layer's compressor (with its norms; CSA: and its indexer),
    # every layer's hyper-connections, the final stream collapse, a hash-routed layer's router
    compressor_csa: Params = Params()
    compressor_hca: Params = Params()
    hyper: Params = Params()
    hyper_head: Params = Params()
    router_hashed: Params = Params()
    # per quantized_weight_exceptions entry naming modules: (their part of a layer's component, their part of its
    # DSA indexer) on this GPU; None for an entry covering whole components
    exception_parts: tuple[tuple[Params, Params] | None, ...] = ()
    # (width, one dense MLP of that width on this GPU) per width where the layers' widths differ (DeciLM)
    mlp_widths: tuple[tuple[int, Params], ...] = ()

    def mlp_of(self, width: int) -> Params:
        """A dense MLP of ``width`` on this GPU: ``mlp`` unless the layers' widths differ."""
        return dict(self.mlp_widths).get(width, self.mlp)


def expert_tp(par: Parallelism) -> int:
    """Ways one routed expert is sliced: tp / ep when ep < tp (moe_tp x moe_ep = tp), else whole."""
    return max(par.tp // par.ep, 1) if par.ep > 1 else par.tp


def check_weight_blocks(spec: ModelSpec, par: Parallelism, precision: WeightPrecision) -> None:
    """Every tensor-parallel slice of a block-scaled matrix holds whole blocks: a column-parallel output (q, k, v,
    gate, up) a multiple of the block's output side, a row-parallel input (o, down) of its input side, as engines
    require (vLLM: "... is not divisible by weight quantization block_n"); UsageError otherwise."""
    tp = par.tp
    slices: list[tuple[str, str, int, int, int]] = []   # (component, what, output width, input width, ways)
    if spec.mla is not None:
        heads = spec.num_attention_heads // tp
        slices.append(("attention", "query heads", heads * spec.mla.qk_head_dim, heads * spec.mla.v_head_dim, tp))
    else:
        heads = spec.num_attention_heads // tp
        slices.append(("attention", "query heads", heads * spec.head_dim, heads * spec.value_head_dim, tp))
        if spec.num_kv_heads >= tp:
            slices.append(("attention", "KV heads", spec.num_kv_heads // tp * spec.head_dim, 0, tp))
    for width, _ in spec.dense_mlp_widths:
        slices.append(("mlp", "the MLP", width // tp, width // tp, tp))
    if spec.moe is not None:
        moe, ways = spec.moe, expert_tp(par)
        slices.append(("experts", "each expert", moe.expert_intermediate_size // ways,
                       moe.expert_intermediate_size // ways, ways))
        shared = moe.num_shared_experts * moe.shared_expert_intermediate_size // tp
        if shared:
            slices.append(("shared_experts", "the shared experts", shared, shared, tp))
    for component, what, output, inner, ways in slices:
        dtype = precision.for_component(component)
        if ways == 1 or dtype.whole_blocks is None:
            continue
        for width, side in ((output, dtype.whole_blocks[0]), (inner, dtype.whole_blocks[1])):
            if width % side:
                hint = "expert parallelism or a smaller tp" if component == "experts" else "a smaller tp"
                raise UsageError(f"{what} of {spec.name} split {ways} ways is {width} wide, not a whole number of "
                                 f"{dtype.name}'s {side}-wide blocks (engines refuse it); use {hint}")


@lru_cache(maxsize=4096)
def shard(spec: ModelSpec, par: Parallelism, vocab_rows: int | None = None) -> Shard:
    """What one GPU holds, from the per-component layouts of ``tfcalc.calc.params``; ``vocab_rows``: the
    embedding / lm_head rows before the split (an engine's padded vocabulary; default the model's)."""
    tp = par.tp
    h = spec.hidden_size
    la = spec.linear_attention  # its heads split over tp (vLLM Qwen3NextGatedDeltaNet), and so its states
    kv_heads = 0 if spec.mla is not None else max(spec.num_kv_heads // tp, 1)
    attention = attention_shape(spec).per_rank(tp, kv_heads)
    kv_elements = spec.mla.latent_elements_per_token_per_layer if spec.mla is not None else \
        kv_heads * spec.head_kv_elements
    full = spec.full_layer_spec
    full_kv_heads = max(full.num_kv_heads // tp, 1) if full is not spec else kv_heads
    rows = -(-(vocab_rows or spec.vocab_size) // tp)
    table = Params(matrix=rows * h)
    expert, resident, active = Params(), 0, Fraction(0)
    shared = router = Params()
    if spec.moe is not None:
        moe = spec.moe
        expert = expert_shape(spec).per_rank(expert_tp(par))
        resident = (moe.num_experts + par.redundant_experts) // par.ep
        active = Fraction(moe.experts_per_token, par.ep)
        shared = shared_experts_shape(spec).per_rank(tp)
        router = router_params(spec)
    return Shard(
        embedding=table, lm_head=Params() if spec.tie_word_embeddings else table,
        final_norm=final_norm_params(spec), attention=attention, norms=norms_shape(spec).per_rank(tp, kv_heads),
        mlp=ffn_shape(spec, spec.intermediate_size, spec.mlp_bias).per_rank(tp), expert=expert,
        experts_resident=resident, experts_active=active, shared_experts=shared, router=router,
        expert_slots=spec.moe.num_experts + par.redundant_experts if spec.moe is not None else 0,
        encoder=encoder_shape(spec).per_rank(tp),
        kv_elements=kv_elements, kv_heads=kv_heads, query_heads=spec.num_attention_heads // tp,
        linear_attention=linear_attention_shape(spec).per_rank(tp), linear_norms=linear_norms_shape(spec).per_rank(tp),
        state_conv_elements=la.conv_state_elements // tp if la is not None else 0,
        state_recurrent_elements=la.recurrent_state_elements // tp if la is not None else 0,
        full_attention=attention_shape(full).per_rank(tp, full_kv_heads) if full is not spec else attention,
        full_norms=norms_shape(full).per_rank(tp, full_kv_heads),
        full_kv_elements=full_kv_heads * full.head_kv_elements if full is not spec else kv_elements,
        full_kv_heads=full_kv_heads, indexer=indexer_shape(spec).per_rank(tp) + indexer_norm_params(spec),
        latent=latent_shape(spec).per_rank(tp), exception_parts=_exception_parts(spec, tp, kv_heads),
        compressor_csa=compressor_shape(spec, True).per_rank(tp) + compressor_norm_params(spec, True),
        compressor_hca=compressor_shape(spec, False).per_rank(tp) + compressor_norm_params(spec, False),
        hyper=hyper_connection_params(spec), hyper_head=hyper_head_params(spec),
        router_hashed=router_params(spec, hashed=True) if spec.moe is not None and spec.moe.hash_layers else Params(),
        mlp_widths=tuple((width, ffn_shape(spec, width, spec.mlp_bias).per_rank(tp))
                         for width, _ in spec.dense_mlp_widths) if spec.layer_intermediate_sizes else ())


def _exception_parts(spec: ModelSpec, tp: int, kv_heads: int) -> tuple[tuple[Params, Params] | None, ...]:
    """``Shard.exception_parts``: the modules each exception names, as tensor parallelism lays them out."""
    parts: list[tuple[Params, Params] | None] = []
    for x in spec.quantized_weight_exceptions:
        if not x.modules:
            parts.append(None)
            continue
        modules = (attention_modules(spec) if x.components[0] == "attention"
                   else ffn_modules(spec, spec.intermediate_size, spec.mlp_bias))
        indexer = indexer_modules(spec)
        layer = sum((modules[m].per_rank(tp, kv_heads) for m in x.modules if m in modules), Params())
        own = sum((indexer[m].per_rank(tp) for m in x.modules if m in indexer), Params())
        parts.append((layer, own))
    return tuple(parts)


def param_bytes(p: Params, precision: WeightPrecision, component: str) -> Fraction:
    """Matrices in the component's format (scales included), 1-D tensors 16-bit when matrices are quantized."""
    return dtype_bytes(p, precision.for_component(component))


def latent_dtype(spec: ModelSpec, precision: WeightPrecision) -> DType:
    """A latent MoE's projections' storage format: bf16 beside quantized experts where ``MoESpec.latent_16_bit``
    (Kimi K3: SGLang kimi_k3.py KimiK3MoE and vLLM kimi_k3/nvidia/model.py KimiMoE build routed_expert_down_proj /
    up_proj as ReplicatedLinear(quant_config=None), the checkpoint stores their .weight in bf16), else the routed
    experts' (Nemotron 3 Super's fc1/fc2_latent_proj)."""
    experts = precision.for_component("experts")
    return get_dtype("bf16") if spec.moe is not None and spec.moe.latent_16_bit and experts.quantized else experts


@lru_cache(maxsize=4096)
def dtype_bytes(p: Params, dtype: DType) -> Fraction:
    """Exact bytes of ``p`` with its matrices in ``dtype`` (1-D tensors 16-bit when quantized)."""
    return dtype.bytes_for(p.matrix) + vector_dtype(dtype).bytes_for(p.vector)


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Contiguous layer runs as vLLM splits them: the num_layers % pp extra layers go one each to the stages
    before the last, counting back from the second-to-last (the last stage also runs the lm_head)."""
    base, extra = divmod(num_layers, pp)
    sizes = [base + (1 if pp - 1 - extra <= s < pp - 1 else 0) for s in range(pp)]
    starts = [sum(sizes[:s]) for s in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


# --- layers by kind --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _LayerIndex:
    dense: tuple[int, ...]              # sorted dense-MLP layers of an MoE model (every layer if not MoE)
    sliding: tuple[int, ...]            # sorted sliding-window layers
    linear: tuple[int, ...]             # sorted Gated DeltaNet layers
    indexer: tuple[int, ...]            # sorted layers running a DSA indexer
    ffn_free: tuple[int, ...]           # sorted layers without an FFN (Nemotron-H's mixer blocks)
    mixer_free: tuple[int, ...]         # sorted layers without a mixer (Nemotron-H's MLP and MoE blocks)
    exceptions: tuple[tuple[int, ...], ...]  # sorted layers of each quantized_weight_exceptions entry
    csa: tuple[int, ...] = ()           # sorted DeepSeek-V4 CSA, HCA and hash-routed layers
    hca: tuple[int, ...] = ()
    hashed: tuple[int, ...] = ()
    widths: tuple[tuple[int, tuple[int, ...]], ...] = ()  # per dense MLP width: its sorted layers (DeciLM)


@lru_cache(maxsize=64)
def _layer_index(spec: ModelSpec) -> _LayerIndex:
    dense = tuple(sorted(set(spec.moe.dense_layers))) if spec.moe is not None else ()
    linear = tuple(sorted(set(spec.linear_attention.layers))) if spec.linear_attention is not None else ()
    indexer = tuple(sorted(set(spec.sparse_indexer.layers))) if spec.sparse_indexer is not None else ()
    ca, moe = spec.compressed_attention, spec.moe
    hashed = tuple(i for i in range(spec.num_layers) if spec.is_moe_layer(i))[:moe.hash_layers] if moe else ()
    return _LayerIndex(dense=dense, sliding=tuple(sorted(set(spec.sliding_window_layers))), linear=linear,
                       indexer=indexer, ffn_free=tuple(sorted(set(spec.ffn_free_layers))),
                       mixer_free=tuple(sorted(set(spec.mixer_free_layers))),
                       exceptions=tuple(tuple(sorted(set(x.layers))) for x in spec.quantized_weight_exceptions),
                       csa=tuple(sorted(ca.csa_layers)) if ca else (), hca=tuple(sorted(ca.hca_layers)) if ca else (),
                       hashed=hashed,
                       widths=tuple((w, tuple(i for i, x in enumerate(spec.layer_intermediate_sizes) if x == w))
                                    for w, _ in spec.dense_mlp_widths) if spec.layer_intermediate_sizes else ())


def _count(sorted_layers: tuple[int, ...], layers: range) -> int:
    return bisect.bisect_left(sorted_layers, layers.stop) - bisect.bisect_left(sorted_layers, layers.start)


def _slice(sorted_layers: tuple[int, ...], layers: range) -> tuple[int, ...]:
    return sorted_layers[bisect.bisect_left(sorted_layers, layers.start):bisect.bisect_left(sorted_layers,
                                                                                             layers.stop)]


@dataclass(frozen=True, kw_only=True)
class StageCensus:
    """How many layers of each kind one pipeline stage runs."""

    layers: int
    moe_layers: int
    sliding_layers: int
    linear_layers: int = 0
    indexer_layers: int = 0
    ffn_free_layers: int = 0     # Nemotron-H's mixer blocks: no FFN
    mixer_free_layers: int = 0   # Nemotron-H's MLP and MoE blocks: no mixer, no cache
    csa_layers: int = 0          # DeepSeek-V4's CSA and HCA layers (the others attend their window alone)
    hca_layers: int = 0
    hash_layers: int = 0         # DeepSeek-V4's hash-routed MoE layers
    mlp_widths: tuple[tuple[int, int], ...] = ()  # (width, dense MLP layers) where the widths differ (DeciLM)

    @property
    def dense_layers(self) -> int:
        """Layers with a dense MLP: all but the MoE ones and those without an FFN."""
        return self.layers - self.moe_layers - self.ffn_free_layers

    @property
    def attention_layers(self) -> int:
        """Layers with a KV cache: all but the Gated DeltaNet / Mamba-2 ones and those without a mixer."""
        return self.layers - self.linear_layers - self.mixer_free_layers

    @property
    def full_layers(self) -> int:
        """Attention layers without a window."""
        return self.attention_layers - self.sliding_layers


def stage_census(spec: ModelSpec, layers: range) -> StageCensus:
    index = _layer_index(spec)
    moe = 0 if spec.moe is None else len(layers) - _count(index.dense, layers)
    sliding = _count(index.sliding, layers) if spec.sliding_window is not None else 0
    return StageCensus(layers=len(layers), moe_layers=moe, sliding_layers=sliding,
                       linear_layers=_count(index.linear, layers), indexer_layers=_count(index.indexer, layers),
                       ffn_free_layers=_count(index.ffn_free, layers),
                       mixer_free_layers=_count(index.mixer_free, layers), csa_layers=_count(index.csa, layers),
                       hca_layers=_count(index.hca, layers), hash_layers=_count(index.hashed, layers),
                       mlp_widths=tuple((w, n) for w, of in index.widths if (n := _count(of, layers))))


def _layer_parts(sh: Shard) -> dict[str, Params]:
    return {"attention": sh.attention, "norms": sh.norms, "mlp": sh.mlp,
            "experts": sh.expert * sh.experts_resident, "shared_experts": sh.shared_experts, "router": sh.router}


def exception_counts(spec: ModelSpec, layers: range) -> tuple[tuple[int, int, int, int, int], ...]:
    """Per quantized_weight_exceptions entry: (its layers in this stage, how many of them are dense-MLP layers, how
    many full-attention layers of a shape of their own, Gemma 4's, how many linear-attention layers, how many run
    their own DSA indexer)."""
    if not spec.quantized_weight_exceptions:
        return ()
    index = _layer_index(spec)
    dense = frozenset(index.dense) - frozenset(index.ffn_free) if spec.moe is not None else None
    local = frozenset(index.sliding) if spec.sliding_window is not None else frozenset()
    counts = []
    for sorted_layers in index.exceptions:
        in_stage = _slice(sorted_layers, layers)
        full = sum(1 for i in in_stage if i not in local) if spec.full_attention is not None else 0
        counts.append((len(in_stage), len(in_stage) if dense is None else sum(1 for i in in_stage if i in dense),
                       full, len(set(in_stage) & set(index.linear)) if index.linear else 0,
                       len(set(in_stage) & set(index.indexer)) if index.indexer else 0))
    return tuple(counts)


def exception_applies(x: WeightException, chosen: DType) -> bool:
    """Whether exception ``x`` holds for a component served in ``chosen``: a quantized format, and one ``x`` names
    (any quantized one where it names none)."""
    return chosen.quantized and (not x.formats or chosen.name in {get_dtype(f).name for f in x.formats})


def exception_deltas(spec: ModelSpec, sh: Shard, precision: WeightPrecision,
                     counts: tuple[tuple[int, int, int, int, int], ...]) -> dict[str, Fraction]:
    """Bytes per component the quantized_weight_exceptions add (or remove): their layers keep the exception's
    format when the chosen one is quantized (and one the exception names); a linear-attention layer's attention
    and norms weigh its own shape."""
    parts, deltas = _layer_parts(sh), {}
    full_parts = {"attention": sh.full_attention, "norms": sh.full_norms}
    linear_parts = {"attention": sh.linear_attention, "norms": sh.linear_norms}
    beside = spec.moe is not None and spec.moe.dense_mlp_beside
    for x, (in_stage, dense, full, linear, indexed), modules in zip(spec.quantized_weight_exceptions, counts,
                                                                    sh.exception_parts, strict=True):
        kept = get_dtype(x.dtype)
        for component in x.components:
            chosen = precision.for_component(component)
            if not in_stage or not exception_applies(x, chosen):
                continue
            count = {"mlp": in_stage if beside else dense, "experts": in_stage - dense,
                     "shared_experts": in_stage - dense, "router": in_stage - dense}.get(component, in_stage)
            if modules is not None:  # only these modules of the component (and of its layers' indexers)
                layer, own = modules
                deltas[component] = deltas.get(component, Fraction(0)) + count * (
                    dtype_bytes(layer, kept) - dtype_bytes(layer, chosen)) + indexed * (
                    dtype_bytes(own, kept) - dtype_bytes(own, chosen))
                continue
            delta = count * (dtype_bytes(parts[component], kept) - dtype_bytes(parts[component], chosen))
            if full and component in full_parts:  # the full layers among them weigh their own shape
                part = full_parts[component]
                delta += full * (dtype_bytes(part, kept) - dtype_bytes(part, chosen)
                                 - dtype_bytes(parts[component], kept) + dtype_bytes(parts[component], chosen))
            if linear and component in linear_parts:
                part = linear_parts[component]
                delta += linear * (dtype_bytes(part, kept) - dtype_bytes(part, chosen)
                                   - dtype_bytes(parts[component], kept) + dtype_bytes(parts[component], chosen))
            deltas[component] = deltas.get(component, Fraction(0)) + delta
    return deltas


def stage_weight_bytes(spec: ModelSpec, sh: Shard, precision: WeightPrecision, layers: range, first: bool,
                       last: bool) -> int:
    """Weights of one stage: per-layer bytes x layers of each kind + the per-layer format exceptions + the
    embedding and a vision encoder (first stage), final norm and lm_head (last stage; a tied embedding there too)."""
    return census_weight_bytes(spec, sh, precision, stage_census(spec, layers), exception_counts(spec, layers),
                               first, last)


@lru_cache(maxsize=4096)
def census_weight_bytes(spec: ModelSpec, sh: Shard, precision: WeightPrecision, c: StageCensus,
                        exceptions: tuple[tuple[int, int, int, int, int], ...], first: bool, last: bool) -> int:
    """``stage_weight_bytes`` from the stage's layer counts (stages alike in counts weigh alike)."""
    per_layer = param_bytes(sh.attention, precision, "attention") + param_bytes(sh.norms, precision, "norms")
    per_linear = (param_bytes(sh.linear_attention, precision, "attention")
                  + param_bytes(sh.linear_norms, precision, "norms"))
    per_full = param_bytes(sh.full_attention, precision, "attention") + param_bytes(sh.full_norms, precision, "norms")
    moe = (param_bytes(sh.expert * sh.experts_resident, precision, "experts")
           + dtype_bytes(sh.latent, latent_dtype(spec, precision))
           + param_bytes(sh.shared_experts, precision, "shared_experts") + param_bytes(sh.router, precision, "router"))
    dense_mlps = c.layers if spec.moe is not None and spec.moe.dense_mlp_beside else c.dense_layers
    total = (c.sliding_layers * per_layer + c.full_layers * per_full + c.linear_layers * per_linear
             + c.indexer_layers * param_bytes(sh.indexer, precision, "attention")
             + c.mixer_free_layers * param_bytes(mixer_free_norms(spec), precision, "norms")
             + (sum((n * param_bytes(sh.mlp_of(w), precision, "mlp") for w, n in c.mlp_widths), Fraction(0))
                if spec.layer_intermediate_sizes else dense_mlps * param_bytes(sh.mlp, precision, "mlp"))
             + c.moe_layers * moe
             + sum(exception_deltas(spec, sh, precision, exceptions).values(), Fraction(0)))
    # DeepSeek-V4's hyper-connections, Kimi K3's attention residuals (none elsewhere)
    total += c.layers * param_bytes(sh.hyper, precision, "norms")
    if last:
        total += param_bytes(sh.hyper_head, precision, "norms")
    if spec.compressed_attention is not None:  # DeepSeek-V4's compressors, hash tables
        total += (c.csa_layers * param_bytes(sh.compressor_csa, precision, "attention")
                  + c.hca_layers * param_bytes(sh.compressor_hca, precision, "attention")
                  + c.hash_layers * (param_bytes(sh.router_hashed, precision, "router")
                                     - param_bytes(sh.router, precision, "router")))
    if first:
        total += param_bytes(sh.embedding, precision, "embedding") + param_bytes(sh.encoder, precision, "encoder")
    if last:
        total += param_bytes(sh.final_norm, precision, "norms")
        if spec.tie_word_embeddings:
            if not first:
                total += param_bytes(sh.embedding, precision, "embedding")
        else:
            total += param_bytes(sh.lm_head, precision, "lm_head")
    return math.ceil(total)
