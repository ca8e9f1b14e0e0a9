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


class LatentCache(nn.Module):
    """[B, S, R + Dr] per layer: [c, k_pe] of every position, written in place (static shape, capturable)."""

    def __init__(self, batch: int, max_len: int, rank: int, rope_dim: int, dtype: torch.dtype,
                 compute_dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.rank, self.length, self.compute_dtype = rank, max_len, compute_dtype
        self.chunked = False  # every position has its slot (no local layers with MLA)
        self.register_buffer("latent", torch.zeros(batch, max_len, rank + rope_dim, dtype=dtype, device=device),
                             persistent=False)

    @property
    def nbytes(self) -> int:
        return self.latent.nbytes

    def write(self, input_pos: Tensor, c: Tensor, k_pe: Tensor) -> None:
        """c [B, T, R], k_pe [B, T, Dr] at positions input_pos [T]."""
        self.latent[:c.shape[0], input_pos] = torch.cat([c, k_pe], dim=-1).to(self.latent.dtype)

    def read(self, batch: int, length: int | None = None) -> Tensor:
        return self.latent[:batch, :length].to(self.compute_dtype)

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


class MLAttention(nn.Module):
    """Multi-head latent attention of one layer (see the module docstring)."""

    def __init__(self, spec: ModelSpec) -> None:
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

    explicit = False  # SDPA runs every MLA call (no sinks, no soft-capping)

    def call_shapes(self, decode: bool) -> tuple[int, int, int, int]:
        """(query heads, KV heads, qk dim, v dim) of the SDPA call each phase makes."""
        if decode:
            return self.heads, 1, self.rank + self.rope_dim, self.rank
        return self.heads, self.heads, self.nope + self.rope_dim, self.v_dim

    def make_cache(self, batch: int, max_len: int, dtype: torch.dtype, compute_dtype: torch.dtype,
                   device: torch.device) -> LatentCache:
        return LatentCache(batch, max_len, self.rank, self.rope_dim, dtype, compute_dtype, device)

    def forward(self, x: Tensor, step: Step) -> Tensor:
        """x [B, T, hidden] at positions step.input_pos -> [B, T, hidden]; [c, k_pe] go into the cache."""
        assert self.kv_cache is not None, "call Transformer.setup_caches first"
        b, t, _ = x.shape
        hq = self.wq(self.q_norm(self.wq_a(x))) if self.wq_a is not None and self.q_norm is not None else self.wq(x)
        q_nope, q_pe = hq.view(b, t, self.heads, -1).split([self.nope, self.rope_dim], dim=-1)
        c, k_pe = self.wkv_a(x).split([self.rank, self.rope_dim], dim=-1)
        c = self.kv_norm(c)
        q_pe = apply_rope(q_pe, step.rope, interleaved=True)  # [B, T, H, Dr]
        k_pe = apply_rope(k_pe[:, :, None], step.rope, interleaved=True)[:, :, 0]  # [B, T, Dr]
        self.kv_cache.write(step.input_pos, c, k_pe)
        if step.mode in (FRESH, CHUNK):
            y = self._materialised(q_nope, q_pe, c, k_pe, step)
        else:
            y = self._absorbed(q_nope, q_pe, step)
        return self.wo(y.transpose(1, 2).reshape(b, t, self.heads * self.v_dim))

    def _materialised(self, q_nope: Tensor, q_pe: Tensor, c: Tensor, k_pe: Tensor, step: Step) -> Tensor:
        """Prefill: K/V of every key expanded from the latent, then SDPA over [B, H, L, qk] -> [B, H, T, v]."""
        b = c.shape[0]
        if step.mode == FRESH:
            how, mask = (CAUSAL, None) if step.causal_call else (MASKED, causal_mask(step.input_pos, step.input_pos))
        else:
            assert self.kv_cache is not None and step.start is not None
            live = step.start + step.t
            lat = self.kv_cache.read(b, live)
            c, k_pe = lat[..., :self.rank], lat[..., self.rank:]
            how, mask = MASKED, causal_mask(step.input_pos, torch.arange(live, device=lat.device))
        length = c.shape[1]
        k_nope, v = self.wkv_b(c).view(b, length, self.heads, -1).split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_pe[:, :, None].expand(-1, -1, self.heads, -1).to(k_nope.dtype)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1)
        keys = Keys(k.transpose(1, 2), v.transpose(1, 2), how, mask)
        return run_attention(q.transpose(1, 2), keys, self.scale)

    def _absorbed(self, q_nope: Tensor, q_pe: Tensor, step: Step) -> Tensor:
        """Decode: scores and values over the latent, W_UK and W_UV applied per head -> [B, H, T, v]."""
        assert self.kv_cache is not None
        w = self.absorb_weight if self.absorb_weight is not None else self.wkv_b.weight
        w = w.view(self.heads, self.nope + self.v_dim, self.rank)
        w_uk, w_uv = w[:, :self.nope], w[:, self.nope:]  # [H, nope, R], [H, v, R]
        q_lat = torch.einsum("bthn,hnr->bhtr", q_nope, w_uk)
        q = torch.cat([q_lat, q_pe.transpose(1, 2).to(q_lat.dtype)], dim=-1)  # [B, H, T, R + Dr]
        o_lat = run_attention(q, self.kv_cache.decode_keys(q.shape[0], step), self.scale)  # [B, H, T, R]
        return torch.einsum("bhtr,hvr->bhtv", o_lat, w_uv)
