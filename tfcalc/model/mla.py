"""DeepSeek multi-head latent attention (MLA; DeepSeek-V2, arXiv:2405.04434 sec. 2.1) with its latent cache.

Per token and layer the cache holds what the calculator counts (``tfcalc.calc.kv_cache``): the normalised KV
latent c (kv_lora_rank R) and the shared RoPE key k_pe (qk_rope_head_dim Dr), R + Dr elements. Projections
follow transformers' DeepseekV3Attention weight for weight: q = W_qb norm(W_qa x) (or W_q x), [c, k_pe] = W_kva x,
[k_nope, v] per head = W_kvb c, o = W_o y.

- Prefill materialises the heads: K = [k_nope, k_pe] (qk_nope + Dr per head), V (v_head_dim) from the latent of
  every key, then SDPA; the FLOPs are the calculator's 2 H (qk + v) per query-key pair.
- Decode runs in the absorbed form (DeepSeek-V2 sec. 2.1.2 "absorb W_UK into W_Q"; vLLM's MLA decode): the query
  becomes q_lat = q_nope W_UK (R per head) next to q_pe, scores are taken against the latent itself,
  [q_lat, q_pe] . [c, k_pe], the output over the values c, and W_UV maps it back per head. That is MQA with one
  KV "head" of R + Dr (values: its first R), so decode reads each cached latent once for all H heads, and its
  FLOPs are the calculator's 2 H (R + Dr) + 2 H R per key.

The softmax scale is qk_head_dim^-1/2 times yarn's mscale(factor, mscale_all_dim)^2; RoPE rotates adjacent pairs
of the Dr rope dims (DeepSeek's complex view; transformers ``rope_interleave``).

DeepSeek Sparse Attention (``spec.sparse_indexer``; DeepSeek-V3.2, arXiv:2512.02556; GLM-5): on an indexed layer a
:class:`LightningIndexer` scores every key a query may see and the MLA attends only the top k of them; the layers
between (GLM-5.2's "shared" ones) attend the keys the previous indexed layer chose (``Step.topk``). The indexer's key,
one vector of its head_dim per token, is cached beside the latent (in the compute dtype; engines keep it in fp8 with
a scale). Prefill and chunked prefill mask the materialised keys with the choice (transformers' eager / SDPA path);
decode gathers the k chosen latents and attends only them (FlashMLA's sparse decode reads k entries, not L).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tfcalc.model.layers import (
    CAUSAL,
    CHUNK,
    FLEX,
    FRESH,
    LATENT_NORM_EPS,
    LIVE,
    MASKED,
    OPEN,
    Keys,
    RMSNorm,
    Step,
    apply_rope,
    causal_mask,
    run_attention,
    softmax_mscale,
)
from tfcalc.spec.model import ModelSpec

INDEXER_NORM_EPS = 1e-6  # the indexer's k_norm: transformers DeepseekV32Indexer nn.LayerNorm(head_dim, eps=1e-6)
# Checkpoints whose indexer turns adjacent pairs of its rope dims (transformers GlmMoeDsaIndexer:
# apply_rotary_pos_emb_interleave; GLM-5's config.json indexer_rope_interleave); DeepSeek-V3.2's DeepseekV32Indexer
# turns the two halves ("NON-interleaved (half-split) RoPE"). The spec names the family only by its architecture.
INTERLEAVED_INDEXER_ARCHITECTURES = frozenset({"GlmMoeDsaForCausalLM"})
SCORE_ELEMENTS = 1 << 26  # the indexer's per-head scores [B, rows, H, L] are taken this many elements at a time


class LatentCache(nn.Module):
    """[B, S, R + Dr] per layer: [c, k_pe] of every position, written in place (static shape, capturable); on a DSA
    layer with its own indexer also its keys [B, S, index_dim], in the compute dtype."""

    def __init__(self, batch: int, max_len: int, rank: int, rope_dim: int, dtype: torch.dtype,
                 compute_dtype: torch.dtype, device: torch.device, index_dim: int = 0) -> None:
        super().__init__()
        self.rank, self.length, self.compute_dtype = rank, max_len, compute_dtype
        self.chunked = False  # every position has its slot (no local layers with MLA)
        self.register_buffer("latent", torch.zeros(batch, max_len, rank + rope_dim, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("index_keys", torch.zeros(batch, max_len, index_dim, dtype=compute_dtype, device=device)
                             if index_dim else None, persistent=False)

    @property
    def nbytes(self) -> int:
        return self.latent.nbytes + (self.index_keys.nbytes if self.index_keys is not None else 0)

    def write(self, input_pos: Tensor, c: Tensor, k_pe: Tensor) -> None:
        """c [B, T, R], k_pe [B, T, Dr] at positions input_pos [T]."""
        self.latent[:c.shape[0], input_pos] = torch.cat([c, k_pe], dim=-1).to(self.latent.dtype)

    def write_index(self, input_pos: Tensor, k: Tensor) -> None:
        """The indexer's keys k [B, T, index_dim] at positions input_pos [T]."""
        assert self.index_keys is not None
        self.index_keys[:k.shape[0], input_pos] = k.to(self.index_keys.dtype)

    def read(self, batch: int, length: int | None = None) -> Tensor:
        return self.latent[:batch, :length].to(self.compute_dtype)

    def read_index(self, batch: int, length: int | None = None) -> Tensor:
        """The indexer's keys in the first ``length`` slots (all by default) -> [batch, length, index_dim]."""
        assert self.index_keys is not None
        return self.index_keys[:batch, :length]

    def gather(self, slots: Tensor) -> Tensor:
        """The latents at slots [B, k] of each sequence -> [B, k, R + Dr] (only those are read)."""
        rows = torch.arange(slots.shape[0], device=slots.device)[:, None]
        return self.latent[rows, slots].to(self.compute_dtype)

    def decode_keys(self, batch: int, step: Step) -> Keys:
        """Keys of the absorbed decode: K = the latent [B, 1, L, R + Dr], V = its first R columns (a view)."""
        if step.mode == LIVE:
            assert step.start is not None
            lat = self.read(batch, step.start + 1)[:, None]
            return Keys(lat, lat[..., :self.rank], OPEN)
        lat = self.read(batch)[:, None]
        if step.mode == FLEX:
            return Keys(lat, lat[..., :self.rank], FLEX, step.block_masks[self.length])
        positions = torch.arange(self.length, device=lat.device)
        return Keys(lat, lat[..., :self.rank], MASKED, causal_mask(step.input_pos, positions))


class LightningIndexer(nn.Module):
    """DSA's lightning indexer of one layer (DeepSeek-V3.2, arXiv:2512.02556 sec. 2.1; transformers
    DeepseekV32Indexer, weight for weight): from MLA's q_lora q_r = norm(W_qa x), queries q = W_qb^I q_r (H_I heads
    of D_I), one key per token k = LayerNorm(W_k x) (D_I) and per-head weights w = W_w x H_I^-1/2; RoPE turns the
    first Dr dims of q and k (halves, or adjacent pairs for GLM: ``INTERLEAVED_INDEXER_ARCHITECTURES``). The index
    score of query t and key s is I(t, s) = sum_h w_{t,h} relu(q_{t,h} . k_s D_I^-1/2), taken in at least fp32; each
    query keeps the min(topk, keys) best keys it may see (transformers: top-k over scores with the causal mask)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        si, m = spec.sparse_indexer, spec.mla
        assert si is not None and m is not None and m.q_lora_rank is not None
        self.heads, self.head_dim, self.topk = si.num_heads, si.head_dim, si.topk
        self.wq_b = nn.Linear(m.q_lora_rank, self.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(spec.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=INDEXER_NORM_EPS)
        self.weights_proj = nn.Linear(spec.hidden_size, self.heads, bias=False)
        self.scale = self.head_dim ** -0.5
        self.interleaved = spec.architecture in INTERLEAVED_INDEXER_ARCHITECTURES

    def keys(self, x: Tensor, rope: Tensor) -> Tensor:
        """x [B, T, hidden] -> the tokens' keys [B, T, D_I], RoPE applied (what the cache holds)."""
        k = self.k_norm(self.wk(x))
        return apply_rope(k[:, :, None], rope, self.interleaved)[:, :, 0]

    def select(self, x: Tensor, q_resid: Tensor, rope: Tensor, keys: Tensor,
               visible: Tensor | None) -> tuple[Tensor, Tensor]:
        """Queries from x [B, T, hidden] and q_resid [B, T, q_rank] over keys [B, L, D_I], each seeing those
        ``visible`` [T, L] (None: all) -> the chosen keys' indices [B, T, k] and whether each is visible [B, T, k]
        (k = min(topk, L): a query that sees fewer than k keys takes them all and some it does not see)."""
        b, t, _ = x.shape
        wide = torch.promote_types(x.dtype, torch.float32)
        q = apply_rope(self.wq_b(q_resid).view(b, t, self.heads, self.head_dim), rope, self.interleaved).to(wide)
        w = self.weights_proj(x).to(wide) * self.heads ** -0.5  # [B, T, H]
        k = keys.to(wide).transpose(1, 2)[:, None]  # [B, 1, D, L]
        rows = max(1, SCORE_ELEMENTS // (b * self.heads * keys.shape[1]))
        index = torch.cat([(w[:, i:i + rows, None] @ torch.relu(q[:, i:i + rows] @ k * self.scale))[:, :, 0]
                           for i in range(0, t, rows)], dim=1)  # [B, T, L]
        if visible is not None:
            index = index.masked_fill(~visible, float("-inf"))
        best, chosen = index.topk(min(self.topk, keys.shape[1]), dim=-1)
        return chosen, best > float("-inf")


class MLAttention(nn.Module):
    """Multi-head latent attention of one layer (see the module docstring); ``layer`` places it in a DSA model:
    with its own :class:`LightningIndexer` on ``spec.sparse_indexer.layers``, attending the previous one's choice
    elsewhere."""

    def __init__(self, spec: ModelSpec, layer: int = 0) -> None:
        super().__init__()
        m = spec.mla
        assert m is not None
        h, self.heads = spec.hidden_size, spec.num_attention_heads
        self.rank, self.nope, self.rope_dim, self.v_dim = (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
                                                           m.v_head_dim)
        q_out = self.heads * m.qk_head_dim
        if m.q_lora_rank is not None:
            self.wq_a: nn.Module | None = nn.Linear(h, m.q_lora_rank, bias=spec.qkv_bias)
            self.q_norm: nn.Module | None = RMSNorm(m.q_lora_rank, LATENT_NORM_EPS, spec.norm_weight_offset)
            self.wq = nn.Linear(m.q_lora_rank, q_out, bias=False)  # W_qb
        else:
            self.wq_a = self.q_norm = None
            self.wq = nn.Linear(h, q_out, bias=False)
        self.wkv_a = nn.Linear(h, self.rank + self.rope_dim, bias=spec.qkv_bias)
        self.kv_norm = RMSNorm(self.rank, LATENT_NORM_EPS, spec.norm_weight_offset)
        self.wkv_b = nn.Linear(self.rank, self.heads * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(self.heads * self.v_dim, h, bias=spec.o_bias)
        self.scale = m.qk_head_dim ** -0.5 * softmax_mscale(spec)
        self.softcap, self.sinks, self.window = None, None, None
        self.kv_cache: LatentCache | None = None
        # W_kvb in the compute dtype for the absorbed decode when wkv_b holds FP8 (vLLM keeps W_UK/W_UV in bf16)
        self.register_buffer("absorb_weight", None)
        si = spec.sparse_indexer
        self.sparse = si is not None  # DSA: attends the top-k keys of this layer's indexer or of an earlier one
        self.indexer = LightningIndexer(spec) if si is not None and layer in si.layers else None

    explicit = False  # SDPA runs every MLA call (no sinks, no soft-capping)

    def call_shapes(self, decode: bool) -> tuple[int, int, int, int]:
        """(query heads, KV heads, qk dim, v dim) of the SDPA call each phase makes."""
        if decode:
            return self.heads, 1, self.rank + self.rope_dim, self.rank
        return self.heads, self.heads, self.nope + self.rope_dim, self.v_dim

    def make_cache(self, batch: int, max_len: int, dtype: torch.dtype, compute_dtype: torch.dtype,
                   device: torch.device) -> LatentCache:
        return LatentCache(batch, max_len, self.rank, self.rope_dim, dtype, compute_dtype, device,
                           self.indexer.head_dim if self.indexer is not None else 0)

    def forward(self, x: Tensor, step: Step) -> Tensor:
        """x [B, T, hidden] at positions step.input_pos -> [B, T, hidden]; [c, k_pe] (and the indexer's keys) go
        into the cache."""
        assert self.kv_cache is not None, "call Transformer.setup_caches first"
        b, t, _ = x.shape
        q_resid = self.q_norm(self.wq_a(x)) if self.wq_a is not None and self.q_norm is not None else None
        hq = self.wq(q_resid if q_resid is not None else x)
        q_nope, q_pe = hq.view(b, t, self.heads, -1).split([self.nope, self.rope_dim], dim=-1)
        c, k_pe = self.wkv_a(x).split([self.rank, self.rope_dim], dim=-1)
        c = self.kv_norm(c)
        q_pe = apply_rope(q_pe, step.rope, interleaved=True)  # [B, T, H, Dr]
        k_pe = apply_rope(k_pe[:, :, None], step.rope, interleaved=True)[:, :, 0]  # [B, T, Dr]
        self.kv_cache.write(step.input_pos, c, k_pe)
        choice = self._choose(x, q_resid, step) if self.sparse else None
        if step.mode in (FRESH, CHUNK):
            y = self._materialised(q_nope, q_pe, c, k_pe, step, choice)
        else:
            y = self._absorbed(q_nope, q_pe, step, choice)
        return self.wo(y.transpose(1, 2).reshape(b, t, self.heads * self.v_dim))

    def _span(self, step: Step) -> tuple[int | None, Tensor | None]:
        """The keys a call attends: the first L cache slots (None: the new keys themselves, FRESH) and which of them
        each new query may see, [T, L] booleans (None: every one, a live decode step)."""
        pos = step.input_pos
        if step.mode == FRESH:
            return None, causal_mask(pos, pos)
        if step.mode == LIVE:
            assert step.start is not None
            return step.start + 1, None
        if step.mode == CHUNK:
            assert step.start is not None
            live = step.start + step.t
            return live, causal_mask(pos, torch.arange(live, device=pos.device))
        assert self.kv_cache is not None
        return self.kv_cache.length, causal_mask(pos, torch.arange(self.kv_cache.length, device=pos.device))

    def _choose(self, x: Tensor, q_resid: Tensor | None, step: Step) -> tuple[Tensor, Tensor]:
        """DSA: the keys of :meth:`_span` each query attends, indices and visibility [B, T, k]: this layer's
        indexer's choice (its new keys cached first, then every key scored), else the previous indexed layer's."""
        if self.indexer is None:
            assert step.topk is not None, "a shared DSA layer needs an indexed layer before it"
            return step.topk
        assert self.kv_cache is not None and q_resid is not None
        new_keys = self.indexer.keys(x, step.rope)
        self.kv_cache.write_index(step.input_pos, new_keys)
        length, visible = self._span(step)
        keys = new_keys if length is None else self.kv_cache.read_index(x.shape[0], length)
        step.topk = self.indexer.select(x, q_resid, step.rope, keys, visible)
        return step.topk

    def _materialised(self, q_nope: Tensor, q_pe: Tensor, c: Tensor, k_pe: Tensor, step: Step,
                      choice: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Prefill: K/V of every key expanded from the latent, then SDPA over [B, H, L, qk] -> [B, H, T, v]; with a
        DSA ``choice`` each query sees only its chosen keys (a [B, 1, T, L] mask)."""
        b = c.shape[0]
        if step.mode == FRESH:
            mask = None if step.causal_call and choice is None else causal_mask(step.input_pos, step.input_pos)
        else:
            assert self.kv_cache is not None and step.start is not None
            live = step.start + step.t
            lat = self.kv_cache.read(b, live)
            c, k_pe = lat[..., :self.rank], lat[..., self.rank:]
            mask = causal_mask(step.input_pos, torch.arange(live, device=lat.device))
        length = c.shape[1]
        if choice is not None and mask is not None:
            chosen, visible = choice
            keep = torch.zeros(b, step.t, length, dtype=torch.bool, device=mask.device).scatter_(-1, chosen, visible)
            mask = (mask & keep)[:, None]
        k_nope, v = self.wkv_b(c).view(b, length, self.heads, -1).split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_pe[:, :, None].expand(-1, -1, self.heads, -1).to(k_nope.dtype)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1)
        keys = Keys(k.transpose(1, 2), v.transpose(1, 2), CAUSAL if mask is None else MASKED, mask)
        return run_attention(q.transpose(1, 2), keys, self.scale)

    def _absorbed(self, q_nope: Tensor, q_pe: Tensor, step: Step,
                  choice: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Decode: scores and values over the latent, W_UK and W_UV applied per head -> [B, H, T, v]; with a DSA
        ``choice`` over the k chosen latents only, gathered from the cache (those not visible masked)."""
        assert self.kv_cache is not None
        w = self.absorb_weight if self.absorb_weight is not None else self.wkv_b.weight
        w = w.view(self.heads, self.nope + self.v_dim, self.rank)
        w_uk, w_uv = w[:, :self.nope], w[:, self.nope:]  # [H, nope, R], [H, v, R]
        q_lat = torch.einsum("bthn,hnr->bhtr", q_nope, w_uk)
        q = torch.cat([q_lat, q_pe.transpose(1, 2).to(q_lat.dtype)], dim=-1)  # [B, H, T, R + Dr]
        if choice is None:
            keys = self.kv_cache.decode_keys(q.shape[0], step)
        else:
            chosen, visible = choice  # [B, 1, k]: one new token
            lat = self.kv_cache.gather(chosen[:, 0])[:, None]  # [B, 1, k, R + Dr]
            keys = (Keys(lat, lat[..., :self.rank], OPEN) if step.mode == LIVE  # every live key is visible
                    else Keys(lat, lat[..., :self.rank], MASKED, visible[:, None]))
        o_lat = run_attention(q, keys, self.scale)  # [B, H, T, R]
        return torch.einsum("bhtr,hvr->bhtv", o_lat, w_uv)
