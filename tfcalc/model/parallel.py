"""Tensor and expert parallelism for the bundled decoder: the same modules with their weights sharded Megatron-style.

The layout is the one the planner counts (``tfcalc.calc.shard``, ``tfcalc.calc.params.TPShape``), as Megatron-LM
(Shoeybi et al. 2019, arXiv:1909.08053, sec. 3) and vLLM's linear layers shard a decoder over ``tp`` ranks:

- attention: the fused QKV projection is column-parallel: a rank keeps H/tp query heads and their KV heads
  (Hkv/tp of them, or when tp > Hkv the one KV head its query heads share, held by tp/Hkv ranks); the output
  projection is row-parallel and one all-reduce sums the ranks' partial outputs. Sinks split by head; QK-norms
  replicated; the output bias replicated and added once (by tp rank 0, before the sum).
- Gated DeltaNet (Qwen3-Next, Qwen3.5; vLLM qwen3_next.py): split by key head, a rank keeping Hk/tp key heads and
  the Hv/tp value heads they serve: their q, k, v, z rows of the fused input projection, b and a rows, conv channels,
  A_log and dt_bias; out_proj row-parallel (one all-reduce), the gated norm over Dv replicated. The states shard
  alike (each rank holds its heads' conv channels and recurrent matrices).
- Mamba-2 (Nemotron-H; vLLM MambaMixer2): split by head, a rank keeping H/tp heads: their z, x and dt rows of
  in_proj, x conv channels, dt_bias, A_log, D and gated-norm columns; the B/C groups split over tp when tp divides
  them (a rank's heads read only its G/tp groups, and its norm groups are whole), else, where tp is a multiple of G,
  each rank keeps the one group its heads read (replicated over tp/G ranks) and the gated norm's sums of squares over
  that group are completed by one all-reduce (vLLM's Mixer2RMSNormGated does so for one group); out_proj
  row-parallel (one all-reduce). The conv and SSM states shard alike. Blocks holding only an MLP or MoE shard as
  those FFNs do; a block reduces only the half it holds.
- gated attention (Qwen3-Next): each query head's [query | gate] rows of the fused QKV projection go with it.
- MLA: q_b (or q) and kv_b split by head, o row-parallel; q_a, kv_a and their norms replicated, and so is the
  latent cache: every rank caches the whole latent. DSA's lightning indexer (wq_b, wk, k_norm, weights_proj; vLLM's
  Indexer: ReplicatedLinear) is replicated with its key cache: every rank scores every key from the same q_lora and
  hidden state and picks the same top-k, which its own heads then attend.
- FFN: gate and up column-parallel (a rank keeps its I/tp columns of both), down row-parallel; one all-reduce.
- MoE: the router replicated, so every rank routes every token alike. ep = 1: each routed expert sliced like an
  FFN; ep <= tp (ep divides tp): a rank holds E/ep experts sliced tp/ep ways (TensorRT-LLM's moe_tp x moe_ep = tp);
  shared experts sliced by tp; one all-reduce for the whole layer (routed and shared partial sums together).
  Where the router weights the experts' inputs (Llama 4) a pair's input is scaled before it is sent or sliced.
  ep > tp (data-parallel attention, ep/tp replicas, as SGLang and vLLM run DeepSeek): a rank holds E/ep whole
  experts; each tp rank of a replica routes its 1/tp share of the replica's tokens and sends every (token,
  expert) pair to the expert's rank by all-to-all (after an all-to-all of the counts), which sends the outputs
  back the same way; the pairs' expert ids travel as one extra column of the activations (exact integers).
- FP8 weights (``weights_dtype``): each matrix is quantized whole, then sliced like the float one, a rank keeping
  its rows / columns / experts of the FP8 weight with the matching scales (the same per-tensor scale, or its blocks'
  128x128 scales), as serving engines load a shard of an FP8 checkpoint (:meth:`FP8Weight.select`); block-scaled
  slices off 128-element boundaries are refused, as vLLM refuses them. MLA's dequantized W_kvb follows the head
  split. A row-parallel layer quantizes its activation slice (per token, or per token and 128 columns) on its
  rank: with block scales the groups are the one-rank model's, with per-tensor scales a token's scale is its
  slice's amax (vLLM's dynamic per-token quantization does the same), so there the ranks round activations
  differently from one rank.
- embedding vocab-parallel: ceil(V/tp) rows per rank (the last rank's tail zero), ids outside a rank's rows look
  up zero and an all-reduce sums the ranks; lm_head vocab-parallel, its logits all-gathered (the padding cut).

Every rank builds from the same spec and seed (``build_model(..., seed=, parallel=)``): the one-rank model's
construction runs block by block and each block keeps this rank's slices as soon as it is built, so the sharded
ranks compute the one-rank model's function (tests: logits equal in fp32) and the peak is one full block above
the shard. Collectives go through :class:`Collectives`, which times each one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from tfcalc.calc.shard import attention_ranks, check_parallelism, expert_tp
from tfcalc.errors import UsageError
from tfcalc.model.deltanet import GatedDeltaNet
from tfcalc.model.fp8 import FP8Linear, FP8Weight, select
from tfcalc.model.layers import Attention, FeedForward, HeadNorm, MoE, RMSNorm
from tfcalc.model.mamba import Mamba2Mixer
from tfcalc.model.mla import MLAttention
from tfcalc.spec.model import ModelSpec


def world_size(tp: int, ep: int) -> int:
    """Ranks of a tp x ep deployment: tp, times ep / tp data-parallel attention replicas when ep > tp."""
    return tp * attention_ranks(tp, ep)


def check_sharding(spec: ModelSpec, tp: int, ep: int) -> None:
    """Refuse, with the reason, a tp / ep the planner refuses or whose widths do not split evenly."""
    world = world_size(tp, ep)
    if ep > tp and ep % tp:
        raise UsageError(f"ep {ep} must divide tp {tp} or be a multiple of it")
    check_parallelism(spec, world, tp, 1, ep)
    for width, _ in spec.dense_mlp_widths:
        if width % tp:
            raise UsageError(f"tp {tp} does not divide the FFN width {width} of {spec.name}")
    moe = spec.moe
    if moe is not None and spec.num_moe_layers:
        slices = expert_tp(_parallelism(tp, ep))
        if moe.expert_intermediate_size % slices:
            raise UsageError(f"{spec.name}: each expert is sliced {slices} ways but its width "
                             f"{moe.expert_intermediate_size} is not a multiple of {slices}")
        shared = moe.num_shared_experts * moe.shared_expert_intermediate_size
        if shared % tp:
            raise UsageError(f"tp {tp} does not divide the shared-expert width {shared} of {spec.name}")


def _parallelism(tp: int, ep: int) -> Any:
    from tfcalc.calc.shard import Parallelism

    return Parallelism(tp=tp, ep=ep, dp=world_size(tp, ep) // tp)


class Collectives:
    """The decoder's collectives, each timed and counted: ``perf_counter`` around the blocking call on the CPU
    (gloo returns when the result is there), CUDA events around it on the current stream on a GPU (the call makes
    that stream wait for NCCL's). A call's time therefore includes waiting for the slowest peer, as a profiler's
    timeline shows it. :meth:`reset` starts a new tally; :meth:`seconds` reads it (synchronising on a GPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.calls = 0
        self._seconds = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def reset(self) -> None:
        self.calls, self._seconds, self._events = 0, 0.0, []

    def seconds(self) -> float:
        if self._events:
            self._events[-1][1].synchronize()
            self._seconds += sum(start.elapsed_time(end) for start, end in self._events) / 1e3
            self._events = []
        return self._seconds

    @contextmanager
    def _timed(self) -> Iterator[None]:
        self.calls += 1
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            begin = time.perf_counter()
            yield
            self._seconds += time.perf_counter() - begin

    def all_reduce(self, x: Tensor, group: Any) -> Tensor:
        """The sum of ``x`` over the group, in place."""
        x = x.contiguous()
        with self._timed():
            dist.all_reduce(x, group=group)
        return x

    def all_gather_last(self, x: Tensor, group: Any, ranks: int) -> Tensor:
        """The group's ``x`` concatenated along the last dimension, in rank order."""
        out = x.new_empty(ranks * x.shape[0], *x.shape[1:])  # gathered along dim 0 (gloo takes no stack)
        with self._timed():
            dist.all_gather_single(out, x.contiguous(), group=group)
        return out.view(ranks, *x.shape).movedim(0, -2).reshape(*x.shape[:-1], ranks * x.shape[-1])

    def all_to_all(self, x: Tensor, send: list[int], receive: list[int], group: Any) -> Tensor:
        """Rows ``x`` [sum(send), ...]: ``send[r]`` of them to rank r, ``receive[r]`` from it, in rank order."""
        out = x.new_empty(sum(receive), *x.shape[1:])
        with self._timed():
            dist.all_to_all_single(out, x.contiguous(), receive, send, group=group)
        return out


@dataclass(eq=False)
class Parallel:
    """This rank's place in a tp x ep deployment and the process groups its collectives use.

    Ranks are laid out replica by replica: global rank = replica x tp + tp rank; each replica's tp ranks form
    a tp group; with ep > tp all ranks form the expert-parallel group of the all-to-all."""

    tp: int
    ep: int
    rank: int
    world: int
    comm: Collectives
    tp_group: Any = None  # None: the default group (one replica)
    ep_group: Any = None
    _hooks: list[Any] = field(default_factory=list, repr=False)

    @classmethod
    def create(cls, tp: int, ep: int, device: torch.device) -> Parallel:
        """From the initialised default process group: the tp groups (every rank takes part in creating each)."""
        world, rank = dist.get_world_size(), dist.get_rank()
        if world != world_size(tp, ep):
            raise UsageError(f"tp {tp} x ep {ep} needs {world_size(tp, ep)} ranks, this run has {world}")
        tp_group = None
        if world > tp:
            for replica in range(world // tp):
                group = dist.new_group(list(range(replica * tp, (replica + 1) * tp)))
                if replica == rank // tp:
                    tp_group = group
        return cls(tp=tp, ep=ep, rank=rank, world=world, comm=Collectives(device), tp_group=tp_group, ep_group=None)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def dp(self) -> int:
        """Attention replicas (ep / tp when ep > tp, else 1)."""
        return self.world // self.tp

    @property
    def replica(self) -> int:
        return self.rank // self.tp

    @property
    def dispatch(self) -> bool:
        """Whether MoE tokens travel by all-to-all (ep > tp)."""
        return self.ep > self.tp

    def all_reduce(self, x: Tensor) -> Tensor:
        return self.comm.all_reduce(x, self.tp_group) if self.tp > 1 else x

    def total_expert_counts(self, counts: Tensor) -> Tensor:
        """Per-expert pair counts over the whole deployment: summed over the ranks when each routed its own tokens
        (ep > tp); as they are otherwise (every rank routes every token). For untimed probes only."""
        if not self.dispatch:
            return counts
        counts = counts.clone()
        dist.all_reduce(counts, group=self.ep_group)
        return counts

    # --- sharding, applied to each module as the one-rank construction builds it ------------------------------

    def shard_block(self, block: nn.Module) -> None:
        """Keep this rank's part of one TransformerBlock and hook its all-reduces (mixer, FFN: those it holds)."""
        attention = block.attention
        if isinstance(attention, GatedDeltaNet):
            self._shard_deltanet(attention)
        elif isinstance(attention, Mamba2Mixer):
            self._shard_mamba(attention)
        elif isinstance(attention, MLAttention):
            self._shard_mla(attention)
        elif attention is not None:
            assert isinstance(attention, Attention)
            self._shard_attention(attention)
        ffn = block.ffn
        if isinstance(ffn, MoE):
            self._shard_moe(ffn)
        elif ffn is not None:
            assert isinstance(ffn, FeedForward)
            _shard_ffn(ffn, self.tp, self.tp_rank, add_bias=self.tp_rank == 0)
        beside = [block.mlp] if block.mlp is not None else []  # Gemma 4's dense MLP, reduced on its own
        for mlp in beside:
            _shard_ffn(mlp, self.tp, self.tp_rank, add_bias=self.tp_rank == 0)
        if self.tp > 1:
            for module in (attention, ffn, *beside):
                if module is not None:
                    module.register_forward_hook(self._reduce_output)

    def _reduce_output(self, module: nn.Module, args: object, output: Tensor) -> Tensor:
        return self.comm.all_reduce(output, self.tp_group)

    def _shard_attention(self, attn: Attention) -> None:
        h, hkv, d, tp = attn.heads, attn.kv_heads, attn.head_dim, self.tp
        heads, kv_heads = h // tp, max(hkv // tp, 1)
        q0 = self.tp_rank * heads
        k0 = q0 // (h // hkv)  # the KV head of this rank's first query head
        q_rows = _span(q0 * d, (q0 + heads) * d)
        kv_rows = _span(k0 * d, (k0 + kv_heads) * d)
        qd = 2 * d if attn.output_gate else d  # a query head's rows of wqkv: [query | gate] when gated
        kv_start = h * qd
        values = [] if attn.k_eq_v else [kv_start + hkv * d + kv_rows]  # Gemma 4's global layers: no V rows
        gate_start = kv_start + (1 if attn.k_eq_v else 2) * hkv * d
        gates = [gate_start + _span(q0, q0 + heads)] if attn.head_gate else []  # Step-3.7: a gate row per query head
        _keep_rows(attn.wqkv, torch.cat([_span(q0 * qd, (q0 + heads) * qd), kv_start + kv_rows, *values, *gates]),
                   "attention.wqkv")
        attn.wo = RowParallelLinear(attn.wo, q_rows, add_bias=self.tp_rank == 0, name="attention.wo")
        if attn.sinks is not None:
            attn.sinks = nn.Parameter(attn.sinks.detach()[q0:q0 + heads].clone())
        if isinstance(attn.q_norm, HeadNorm) and isinstance(attn.k_norm, HeadNorm):  # this rank's heads' weights
            for norm, first, count in ((attn.q_norm, q0, heads), (attn.k_norm, k0, kv_heads)):
                norm.weight = nn.Parameter(norm.weight.detach()[first:first + count].clone())
                if norm.bias is not None:
                    norm.bias = nn.Parameter(norm.bias.detach()[first:first + count].clone())
        if attn.qk_norm_across_heads and self.tp > 1:
            assert isinstance(attn.q_norm, RMSNorm) and isinstance(attn.k_norm, RMSNorm) and not attn.q_norm.offset
            attn.qk_norm_over_ranks = RankedQKNorm(attn.q_norm, attn.k_norm, q_rows, kv_rows, self)
            attn.q_norm = attn.k_norm = None
        attn.heads, attn.kv_heads = heads, kv_heads

    def _shard_deltanet(self, net: GatedDeltaNet) -> None:
        hk, hv, dk, dv = net.key_heads, net.value_heads, net.key_dim, net.value_dim
        keys, values = hk // self.tp, hv // self.tp
        k0, v0 = self.tp_rank * keys, self.tp_rank * values  # key head j serves value heads j r .. j r + r - 1
        key_rows, value_rows = _span(k0 * dk, (k0 + keys) * dk), _span(v0 * dv, (v0 + values) * dv)
        channels = torch.cat([key_rows, hk * dk + key_rows, 2 * hk * dk + value_rows])  # q, k, v
        _keep_rows(net.wqkvz, torch.cat([channels, 2 * hk * dk + hv * dv + value_rows]), "attention.wqkvz")
        heads = _span(v0, v0 + values)
        _keep_rows(net.wba, torch.cat([heads, hv + heads]), "attention.wba")
        for name, kept in (("conv_weight", channels), ("A_log", heads), ("dt_bias", heads)):
            weight = getattr(net, name).detach()
            setattr(net, name, nn.Parameter(weight[kept.to(weight.device)].contiguous()))
        net.wo = RowParallelLinear(net.wo, value_rows, add_bias=self.tp_rank == 0, name="attention.wo")
        net.key_heads, net.value_heads = keys, values

    def _shard_mamba(self, net: Mamba2Mixer) -> None:
        h, p, g, n, tp = net.heads, net.head_dim, net.groups, net.state_size, self.tp
        if h % tp or (g % tp and tp % g):
            raise UsageError(f"tp {tp}: a Mamba-2 layer's {h} heads must split evenly and its {g} groups split "
                             f"evenly or each be held whole by tp / groups ranks")
        heads = h // tp
        h0 = self.tp_rank * heads
        groups = g // tp if g % tp == 0 else 1
        g0 = self.tp_rank * groups if g % tp == 0 else h0 // (h // g)  # replicated: the one group its heads read
        inner, bc = h * p, g * n
        head_rows, group_rows = _span(h0 * p, (h0 + heads) * p), _span(g0 * n, (g0 + groups) * n)
        channels = torch.cat([head_rows, inner + group_rows, inner + bc + group_rows])  # x, B, C
        dt = _span(h0, h0 + heads)
        _keep_rows(net.in_proj, torch.cat([head_rows, inner + channels, 2 * inner + 2 * bc + dt]), "attention.in_proj")
        kept = {"conv_weight": channels, "conv_bias": channels, "dt_bias": dt, "A_log": dt, "D": dt}
        for name, rows in kept.items():
            weight = getattr(net, name)
            if weight is not None:
                setattr(net, name, nn.Parameter(weight.detach()[rows.to(weight.device)].contiguous()))
        net.norm.weight = nn.Parameter(net.norm.weight.detach()[head_rows.to(net.norm.weight.device)].contiguous())
        if g % tp:
            net.norm.over_ranks = RankedGroupNorm(g0, g, net.norm.group_size, self)
        net.out_proj = RowParallelLinear(net.out_proj, head_rows, add_bias=self.tp_rank == 0, name="attention.out_proj")
        net.heads, net.groups = heads, groups

    def _shard_mla(self, attn: MLAttention) -> None:
        heads = attn.heads // self.tp
        h0 = self.tp_rank * heads
        qk = attn.nope + attn.rope_dim
        _keep_rows(attn.wq, _span(h0 * qk, (h0 + heads) * qk), "attention.wq")
        kv = attn.nope + attn.v_dim
        _keep_rows(attn.wkv_b, _span(h0 * kv, (h0 + heads) * kv), "attention.wkv_b")
        if isinstance(attn.wkv_b, FP8Linear):  # the absorbed decode's W_kvb: this rank's heads, dequantized
            attn.absorb_weight = attn.wkv_b.weight.dequantized()
        attn.wo = RowParallelLinear(attn.wo, _span(h0 * attn.v_dim, (h0 + heads) * attn.v_dim),
                                    add_bias=self.tp_rank == 0, name="attention.wo")
        attn.heads = heads

    def _shard_moe(self, moe: MoE) -> None:
        experts = moe.local_experts
        if self.dispatch:
            held, first, slices, index = experts // self.ep, self.rank * (experts // self.ep), 1, 0
            limit = 2 / torch.finfo(torch.get_default_dtype()).eps  # the largest id the activations hold exactly
            if held > limit:
                raise UsageError(f"{held} experts per rank: expert ids above {limit:.0f} do not travel exactly in "
                                 f"{torch.get_default_dtype()} activations")
            moe.dispatch = ExpertDispatch(self)
        else:
            slices = self.tp // self.ep
            held, index = experts // self.ep, self.tp_rank % slices
            first = (self.tp_rank // slices) * held
        width = moe.w_out.shape[-1] // slices
        cols = _span(index * width, (index + 1) * width)
        rows = _ffn_rows(moe.spec, moe.w_out.shape[-1], cols)
        stack = slice(first, first + held)
        moe.w_in = _slice(moe.w_in, "experts.w_in", rows=rows, stack=stack)
        moe.w_out = _slice(moe.w_out, "experts.w_out", cols=cols, stack=stack)
        if moe.b_in is not None and moe.b_out is not None:
            moe.b_in = nn.Parameter(moe.b_in.detach()[stack][:, rows].contiguous())
            moe.b_out = nn.Parameter(moe.b_out.detach()[stack].contiguous())
        moe.first_expert, moe.local_experts, moe.add_out_bias = first, held, index == 0
        if moe.shared is not None:
            _shard_ffn(moe.shared, self.tp, self.tp_rank, add_bias=self.tp_rank == 0)
        if moe.latent_out is not None and moe.latent_out.bias is not None and self.tp_rank:
            moe.latent_out.bias = None  # a partial sum's projection: its bias once, on rank 0, before the all-reduce

    def shard_vocabulary(self, model: nn.Module) -> None:
        """Vocab-parallel embedding and lm_head (a tied head shares the embedding's shard)."""
        if self.tp == 1:
            return
        tied = model.lm_head.weight is model.tok_embeddings.weight
        model.tok_embeddings = VocabParallelEmbedding(model.tok_embeddings.weight.detach(), self)
        head = model.tok_embeddings.weight if tied else _vocab_rows(model.lm_head.weight.detach(), self)
        model.lm_head = VocabParallelHead(head, model.spec.vocab_size, self)


def _span(start: int, stop: int) -> Tensor:
    """Indices start..stop-1, on the host whatever device the model is built on (the meta device included)."""
    return torch.arange(start, stop, device="cpu")


def _slice(weight: Tensor | FP8Weight, name: str, rows: Tensor | None = None, cols: Tensor | None = None,
           stack: slice | None = None) -> nn.Parameter | FP8Weight:
    """This rank's matrices ``stack``, rows and columns of a weight (or an expert stack): plain, or FP8 with the
    scales that go with them (:meth:`FP8Weight.select`, which refuses block-scaled slices off block boundaries)."""
    if isinstance(weight, FP8Weight):
        return weight.select(rows, cols, stack, name)
    return nn.Parameter(select(weight.detach(), rows, cols, stack))


def _keep_rows(linear: nn.Linear | FP8Linear, rows: Tensor, name: str) -> None:
    """Keep output rows ``rows`` of a column-parallel linear (weight [out, in]) and of its bias."""
    linear.weight = _slice(linear.weight, name, rows=rows)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.detach()[rows.to(linear.bias.device)].contiguous())
    linear.out_features = rows.numel()


def _ffn_rows(spec: ModelSpec, width: int, cols: Tensor) -> Tensor:
    """The first projection's rows that feed intermediate columns ``cols``: gate and up halves for a gated FFN."""
    return torch.cat([cols, width + cols]) if spec.ffn_kind == "gated" else cols


def _shard_ffn(ffn: FeedForward, tp: int, rank: int, add_bias: bool) -> None:
    width = ffn.w_out.in_features // tp
    cols = _span(rank * width, (rank + 1) * width)
    _keep_rows(ffn.w_in, _ffn_rows(ffn.spec, ffn.w_out.in_features, cols), "ffn.w_in")
    ffn.w_out = RowParallelLinear(ffn.w_out, cols, add_bias, "ffn.w_out")


def _vocab_rows(table: Tensor, par: Parallel) -> nn.Parameter:
    """This rank's ceil(V / tp) rows of a [V, hidden] table, the rows past V zero."""
    vocab, rows = table.shape[0], -(-table.shape[0] // par.tp)
    start = par.tp_rank * rows
    shard = table.new_zeros(rows, table.shape[1])
    take = max(0, min(vocab - start, rows))
    shard[:take] = table[start:start + take]
    return nn.Parameter(shard)


class RankedQKNorm(nn.Module):
    """This rank's columns of q and k norms whose means span every rank's (MiniMax-M2's QK-norm across heads): the
    two sums of squares go in one all-reduce and are divided by the ranks' total width, as vLLM's
    MiniMaxText01RMSNormTP.forward_qk does. KV heads replicated over ranks count once per copy in both sums."""

    def __init__(self, q_norm: RMSNorm, k_norm: RMSNorm, q_columns: Tensor, k_columns: Tensor, par: Parallel) -> None:
        super().__init__()
        self.eps, self.par = q_norm.eps, par
        self.q_weight = nn.Parameter(q_norm.weight.detach()[q_columns].clone())
        self.k_weight = nn.Parameter(k_norm.weight.detach()[k_columns].clone())

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        wide = torch.promote_types(q.dtype, torch.float32)
        qf, kf = q.to(wide), k.to(wide)
        squares = self.par.all_reduce(torch.cat([qf.pow(2).sum(-1, keepdim=True), kf.pow(2).sum(-1, keepdim=True)], -1))
        ranks = self.par.tp
        qf = qf * torch.rsqrt(squares[..., :1] / (q.shape[-1] * ranks) + self.eps)
        kf = kf * torch.rsqrt(squares[..., 1:] / (k.shape[-1] * ranks) + self.eps)
        return qf.to(q.dtype) * self.q_weight, kf.to(k.dtype) * self.k_weight


class RankedGroupNorm(nn.Module):
    """The RMS statistics of a Mamba-2 gated norm whose group ``group`` (of ``groups``, each ``group_size`` wide)
    spans several tp ranks (groups replicated: tp a multiple of them): each rank's sum of squares goes in its group's
    slot of a [..., groups] tensor, zeros elsewhere, and one all-reduce completes every group's sum, of which the rank
    takes its own: x / sqrt(sum / group_size + eps). vLLM's Mixer2RMSNormGated all-reduces the sums the same way
    for one group."""

    def __init__(self, group: int, groups: int, group_size: int, par: Parallel) -> None:
        super().__init__()
        self.group, self.groups, self.group_size, self.par = group, groups, group_size, par

    def forward(self, x: Tensor, eps: float) -> Tensor:
        sums = x.new_zeros(*x.shape[:-1], self.groups)
        sums[..., self.group] = x.pow(2).sum(-1)
        sums = self.par.all_reduce(sums)
        return x * torch.rsqrt(sums[..., self.group, None] / self.group_size + eps)


class RowParallelLinear(nn.Module):
    """This rank's input columns of a row-parallel linear: x_r W_r^T, plus the (replicated) bias where
    ``add_bias``; the sum over the ranks, an all-reduce after the layer, is the full x W^T + b."""

    def __init__(self, linear: nn.Linear | FP8Linear, columns: Tensor, add_bias: bool, name: str = "weight") -> None:
        super().__init__()
        self.weight = _slice(linear.weight, name, cols=columns)
        self.bias = linear.bias
        self.add_bias = add_bias
        self.in_features, self.out_features = columns.numel(), linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        bias = self.bias if self.add_bias else None
        if isinstance(self.weight, FP8Weight):
            return self.weight.linear(x, bias=bias)
        return F.linear(x, self.weight, bias)


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the embedding: ids outside them look up zero; the all-reduce sums the ranks."""

    def __init__(self, table: Tensor, par: Parallel) -> None:
        super().__init__()
        self.weight = _vocab_rows(table, par)
        self.rows = self.weight.shape[0]
        self.start = par.tp_rank * self.rows
        self.par = par

    def forward(self, tokens: Tensor) -> Tensor:
        local = tokens - self.start
        outside = (local < 0) | (local >= self.rows)
        x = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside[..., None], 0)
        return self.par.all_reduce(x)


class VocabParallelHead(nn.Module):
    """This rank's rows of the lm_head: its logits, all-gathered over the tp group, the padding rows cut."""

    def __init__(self, weight: nn.Parameter, vocab: int, par: Parallel) -> None:
        super().__init__()
        self.weight, self.vocab, self.par = weight, vocab, par

    def forward(self, h: Tensor) -> Tensor:
        z = F.linear(h, self.weight)
        return self.par.comm.all_gather_last(z, self.par.tp_group, self.par.tp)[..., :self.vocab]


class ExpertDispatch:
    """MoE tokens by all-to-all (ep > tp; module docstring): route this tp rank's share of the replica's tokens,
    exchange the per-rank pair counts, send each pair (its activations and local expert id) to the expert's
    rank, run the local experts, send the outputs back, combine with the routing weights. With tp > 1 the share
    lands in its rows of a zero tensor, and the layer's all-reduce over the tp group (with the shared experts'
    partial sums) completes every row."""

    def __init__(self, par: Parallel) -> None:
        self.par = par

    def __call__(self, moe: MoE, x: Tensor) -> Tensor:
        par = self.par
        n = x.shape[0]
        base, extra = divmod(n, par.tp)
        start = par.tp_rank * base + min(par.tp_rank, extra)
        stop = start + base + (par.tp_rank < extra)
        mine = x[start:stop]
        weights, experts = moe.route(mine)
        flat = experts.flatten()
        counts = torch.zeros_like(moe.expert_counts).index_add_(0, flat, torch.ones_like(flat))
        moe.expert_counts.copy_(counts)
        held = moe.local_experts
        order = flat.argsort(stable=True)  # pairs by expert, hence by the rank that holds it
        token, w = order // moe.top_k, weights.flatten()[order, None]
        per_rank = counts.view(par.world, held).sum(dim=1)
        comm = par.comm
        incoming = comm.all_to_all(per_rank, [1] * par.world, [1] * par.world, par.ep_group)
        send, receive = per_rank.tolist(), incoming.tolist()
        ids = (flat[order] - (flat[order] // held) * held).to(x.dtype)
        sent = moe.weigh_inputs(moe.expert_inputs(mine)[token], w)
        arrived = comm.all_to_all(torch.cat([sent, ids[:, None]], dim=1), send, receive, par.ep_group)
        local = arrived[:, -1].round().long()
        by_expert = local.argsort(stable=True)
        out = torch.empty_like(arrived[:, :-1])
        out[by_expert] = moe.run_experts(arrived[by_expert, :-1],
                                         torch.bincount(local, minlength=held).tolist())
        back = comm.all_to_all(out, receive, send, par.ep_group)
        y = mine.new_zeros(mine.shape[0], back.shape[-1]).index_add_(0, token, moe.weigh_outputs(back, w))
        if par.tp == 1:
            return y
        full = x.new_zeros(x.shape[0], back.shape[-1])  # a latent MoE's sums stay latent until fc2_latent_proj
        full[start:stop] = y
        return full


def parameter_count(model: nn.Module) -> int:
    """Parameters this rank holds (a tied table once; FP8 matrices, held as buffers, not counted)."""
    return sum(p.numel() for p in model.parameters())


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights this rank holds: its parameters (a tied table once) and its FP8 matrices with their
    scales."""
    fp8 = sum(m.q.nbytes + m.scale.nbytes for m in model.modules() if isinstance(m, FP8Weight))
    return sum(p.nbytes for p in model.parameters()) + fp8
