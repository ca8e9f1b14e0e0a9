"""The decoder's building blocks, one class per concept: norms, RoPE, KV caches, attention, FFN, MoE.

Shapes: B batch, T new tokens, S cache length (max_len), W a window's ring length, H query heads, Hkv KV heads,
D head_dim, E experts, K experts per token, N = B*T tokens. Every module is built from a
:class:`tfcalc.spec.model.ModelSpec`. MLA attention lives in :mod:`tfcalc.model.mla`, FP8 weights in
:mod:`tfcalc.model.fp8`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tfcalc.errors import SpecError, UsageError
from tfcalc.model.fp8 import FORMATS as FP8_FORMATS
from tfcalc.model.fp8 import FP8Weight, stacked_linear
from tfcalc.spec.model import ModelSpec

NORM_EPS = 1e-5  # Llama 3 norm_eps; the spec does not carry eps
LATENT_NORM_EPS = 1e-6  # MLA's q_a/kv_a norms: DeepSeek inference/model.py RMSNorm and transformers hard-code 1e-6

# --- norms ---------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * (offset + w) (Zhang & Sennrich 2019, arXiv:1910.07467).

    Computed in at least fp32 and cast back to the input dtype, as Llama 3's reference does (x.to(dtype) * w).
    ``offset`` 1 is Gemma's (1 + w) with w initialised at 0, multiplied in fp32 before the cast, as
    google/gemma_pytorch and transformers' Gemma2RMSNorm do.
    """

    def __init__(self, dim: int, eps: float = NORM_EPS, offset: float = 0.0) -> None:
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (xf * (self.offset + self.weight.to(xf.dtype))).to(x.dtype)
        return xf.to(x.dtype) * self.weight


def rms_normalize(x: Tensor, eps: float = NORM_EPS) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, no weight, in at least fp32 (Llama 4's QK norm,
    transformers Llama4TextL2Norm with rms_norm_eps)."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def make_norm(spec: ModelSpec, dim: int) -> nn.Module:
    """RMSNorm (weight) or LayerNorm (weight and bias; no bias without ``spec.norm_bias``, Cohere's), as
    ``spec.norm_kind`` says."""
    if spec.norm_kind == "rmsnorm":
        return RMSNorm(dim, offset=spec.norm_weight_offset)
    return nn.LayerNorm(dim, eps=NORM_EPS, bias=spec.norm_bias)


class HeadNorm(nn.Module):
    """A norm over each head's last dimension with a weight per head, [heads, head_dim] (Command R+'s q and k norms:
    transformers CohereLayerNorm((heads, head_dim)) normalises over head_dim): y = (x - mean) / sqrt(var + eps) x
    w_head (+ b_head) for a LayerNorm spec, x / sqrt(mean(x^2) + eps) x w_head for an RMSNorm one, in at least fp32
    (the weight applied before the cast back, as CohereLayerNorm does)."""

    def __init__(self, spec: ModelSpec, heads: int, head_dim: int) -> None:
        super().__init__()
        self.centred = spec.norm_kind == "layernorm"
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim)) if self.centred and spec.norm_bias else None

    def forward(self, x: Tensor) -> Tensor:
        """x [..., heads, head_dim] -> the same shape."""
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        if self.centred:
            xf = xf - xf.mean(-1, keepdim=True)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight.to(xf.dtype)
        if self.bias is not None:
            xf = xf + self.bias.to(xf.dtype)
        return xf.to(x.dtype)


# --- rotary position embeddings ------------------------------------------------------------------------


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """0.1 mscale ln(factor) + 1 for factor > 1 (YaRN, arXiv:2309.00071 eq. 8; DeepSeek-V2 inference/model.py)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(spec: ModelSpec, dim: int | None = None) -> Tensor:
    """Inverse frequencies theta^(-2i/D), i < D/2 (RoFormer, arXiv:2104.09864), in float64, for the ``dim``
    rotated dimensions (head_dim; MLA rotates qk_rope_head_dim).

    ``rope_type: llama3`` applies Llama 3.1's wavelength-dependent scaling (meta-llama/llama-models,
    models/llama3/model.py ``apply_scaling``): wavelengths shorter than original_len / high_freq_factor are
    kept, longer than original_len / low_freq_factor divided by ``factor``, the band in between interpolated.
    ``rope_type: yarn`` blends interpolated (theta^(-2i/D) / factor) and original frequencies with a linear ramp
    between the dimensions that turn beta_fast and beta_slow times over the original context, bounds floored and
    ceiled (YaRN; transformers ``_compute_yarn_parameters`` with truncate, DeepSeek-V3 inference/model.py
    ``precompute_freqs_cis``). ``rope_type: linear`` divides every frequency by ``factor`` (position
    interpolation, arXiv:2306.15595; Gemma 3's global layers). Dynamic and longrope are not applied: plain RoPE is
    exact within the original context and changes no shape or cost.
    """
    d = dim or spec.head_dim
    inv_freq = spec.rope_theta ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)  # [D/2]
    scaling = spec.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    old_len = scaling.original_max_position_embeddings or 8192
    if scaling.rope_type == "llama3":
        low, high = scaling.low_freq_factor or 1.0, scaling.high_freq_factor or 4.0
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old_len / wavelen - low) / (high - low)).clamp(0.0, 1.0)  # 0: long waves, 1: short waves
        return (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    if scaling.rope_type == "yarn":
        def correction_dim(rotations: float) -> float:
            return d * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(spec.rope_theta))

        low = max(math.floor(correction_dim(scaling.beta_fast or 32.0)), 0)
        high = min(math.ceil(correction_dim(scaling.beta_slow or 1.0)), d - 1)
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / ((high - low) or 0.001)).clamp(0.0, 1.0)
        return inv_freq / scaling.factor * ramp + inv_freq * (1 - ramp)
    return inv_freq


def rope_attention_factor(spec: ModelSpec) -> float:
    """YaRN's factor on cos and sin: mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are given
    (1 for DeepSeek-V3, whose softmax scale carries mscale_all_dim instead), else mscale(factor); 1 otherwise."""
    s = spec.rope_scaling
    if s is None or s.rope_type != "yarn":
        return 1.0
    if s.mscale and s.mscale_all_dim:
        return _yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim)
    return _yarn_mscale(s.factor)


def softmax_mscale(spec: ModelSpec) -> float:
    """The softmax-scale factor yarn models with ``mscale_all_dim`` take: mscale(factor, mscale_all_dim)^2
    (DeepSeek-V3 inference/model.py MLA.__init__; transformers ``yarn_apply_mscale``); 1 otherwise."""
    s = spec.rope_scaling
    if s is None or s.rope_type != "yarn" or not s.mscale_all_dim:
        return 1.0
    return _yarn_mscale(s.factor, s.mscale_all_dim) ** 2


def rope_table(spec: ModelSpec, max_len: int, dtype: torch.dtype, device: torch.device,
               dim: int | None = None) -> Tensor:
    """cos and sin of position x frequency (times yarn's attention factor): [max_len, 2, D/2]."""
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), rope_frequencies(spec, dim))  # [S, D/2]
    table = torch.stack([angles.cos(), angles.sin()], dim=1) * rope_attention_factor(spec)
    return table.to(device=device, dtype=dtype)


def global_rope_table(spec: ModelSpec, max_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The full-attention layers' cos / sin table (the only one, unless the sliding layers have their own base):
    ``rope_table`` over ``spec.rotary_dim``; Gemma 4's global layers (``full_attention.proportional_rope``,
    transformers ``_compute_proportional_rope_parameters``) over their whole head, frequencies theta^(-2i/D) for the
    first D x factor / 2 pairs and 0 for the rest (cos 1, sin 0: those dimensions pass through)."""
    fa = spec.full_attention
    if fa is None:
        return rope_table(spec, max_len, dtype, device, spec.rotary_dim)
    full = spec.full_layer_spec
    if not fa.proportional_rope:
        return rope_table(full, max_len, dtype, device, full.rotary_dim)
    inv_freq = rope_frequencies(full, fa.head_dim)
    inv_freq[int(fa.head_dim * fa.partial_rotary_factor) // 2:] = 0.0
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    return torch.stack([angles.cos(), angles.sin()], dim=1).to(device=device, dtype=dtype)


def apply_rope(x: Tensor, table: Tensor, interleaved: bool = False) -> Tensor:
    """Rotate pairs of x by the angles in ``table``: (x_i, x_{i+D/2}) ("rotate half", HF Llama), or with
    ``interleaved`` the adjacent pairs (x_2i, x_2i+1) of DeepSeek's MLA and Llama 4 (their complex view), written
    out as [rotated evens, rotated odds] like transformers' ``apply_rotary_pos_emb_interleave``: q and k are
    permuted alike (and cached so), so their dot products, and a per-head norm after RoPE, are the reference's.

    x: [B, T, heads, D]; table: [T, 2, Dr/2] gathered at the tokens' absolute positions. With partial RoPE
    (Dr < D: GLM-4.5, MiniMax-M2) the first Dr dimensions turn and the rest pass through, as transformers'
    ``apply_rotary_pos_emb`` splits them.
    """
    rotated = 2 * table.shape[-1]
    if rotated < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rotated], table, interleaved), x[..., rotated:]], dim=-1)
    cos, sin = table[:, None, 0], table[:, None, 1]  # [T, 1, D/2], broadcast over B and heads
    xf = x.to(table.dtype)
    x1, x2 = (xf[..., 0::2], xf[..., 1::2]) if interleaved else xf.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


# --- one forward call, as every layer sees it ----------------------------------------------------------

# Modes of a forward call (chosen by the Transformer):
FRESH = "fresh"    # prefill from an empty cache: attend over the new tokens themselves
CHUNK = "chunk"    # prefill of T > 1 tokens after what the cache holds
LIVE = "live"      # decode of one token, eager: attend over the live part of the cache only (sliced on the host)
STATIC = "static"  # decode of one token over the whole static cache with a mask (capturable, reads everything)
FLEX = "flex"      # decode of one token through flex_attention with a block mask of the live blocks (capturable)
DECODE_MODES = (LIVE, STATIC, FLEX)

# How a layer's keys are to be attended (what an attention call is given):
CAUSAL = "causal"      # SDPA is_causal over exactly the new keys (no mask)
MASKED = "masked"      # SDPA with a boolean mask [T, keys]
OPEN = "open"          # SDPA with no mask: every key given is visible (one query over the live keys)
EXPLICIT = "explicit"  # softmax written out: attention sinks or logit soft-capping, which SDPA lacks
FLEX_BLOCK = 128       # KV block of the live-block mask (flex_attention's default sparse block)


@dataclass
class Step:
    """What one forward call tells every layer: positions, mode and the RoPE rows, computed once."""

    input_pos: Tensor              # [T] absolute positions of the new tokens (on the device)
    start: int | None              # the host's copy of input_pos[0]; None in a compiled decode step
    mode: str                      # FRESH, CHUNK, LIVE, STATIC or FLEX
    rope: Tensor                   # [T, 2, Dr/2] cos/sin rows at input_pos
    rope_local: Tensor | None = None  # the sliding layers' rows where their base or head size differs (Gemma 3, 4)
    causal_call: bool = True       # FRESH: a backend runs SDPA's is_causal call, else explicit masks
    block_masks: dict[int, Any] = field(default_factory=dict)  # FLEX: cache length -> BlockMask of live slots
    chunk_block_masks: dict[int, Any] = field(default_factory=dict)  # FLEX: the same for chunked layers' rings
    # DSA (tfcalc.model.mla): the keys the last indexed layer chose, indices [B, T, k] into the call's keys and
    # whether each is visible [B, T, k]; the following shared layers attend the same ones
    topk: tuple[Tensor, Tensor] | None = None

    @property
    def t(self) -> int:
        return self.input_pos.shape[0]


@dataclass
class Keys:
    """What a cache hands to attention: K [B, Hkv, L, D], V [B, Hkv, L, Dv], how to attend, and the mask."""

    k: Tensor
    v: Tensor
    how: str                 # CAUSAL, MASKED, OPEN or FLEX
    mask: Any = None         # [T, L] (or per sequence [B, 1, T, L]) booleans (MASKED), or a BlockMask (FLEX)


def causal_mask(q_pos: Tensor, k_pos: Tensor, window: int | None = None, chunked: bool = False) -> Tensor:
    """[T, L] booleans: key at position j visible to the query at i when j <= i (and j > i - window, or with
    ``chunked`` j // window == i // window: Llama 4's chunks, transformers ``create_chunked_causal_mask``)."""
    allowed = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= 0)
    if window is not None and chunked:
        allowed &= k_pos[None, :] // window == q_pos[:, None] // window
    elif window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    return allowed


def live_block_mask(position: Tensor, length: int, device: torch.device) -> Any:
    """A flex_attention BlockMask for one query at ``position`` (a device scalar) over a cache of ``length``
    slots that holds it: slots 0..position are visible (all of them once a rolling buffer is full, since its
    slots are < length), so ceil(min(position + 1, length) / 128) KV blocks are listed, the rest never loaded, and
    the mask_mod cuts the last block. Built from device tensors only (no host read), so a captured decode step
    rebuilds it each replay; the mask_mod reads ``position`` itself (inductor's CPU template refuses a mask
    buffer computed inside the graph). Batch and head dims are 1 (broadcast)."""
    from torch.nn.attention.flex_attention import BlockMask

    blocks = -(-length // FLEX_BLOCK)
    live = (position + 1).clamp(max=length)
    kv_num_blocks = ((live + FLEX_BLOCK - 1) // FLEX_BLOCK).to(torch.int32).view(1, 1, 1)
    kv_indices = torch.arange(blocks, dtype=torch.int32, device=device).view(1, 1, 1, blocks)

    def visible(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= position

    return BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, BLOCK_SIZE=FLEX_BLOCK, mask_mod=visible,
                                    seq_lengths=(1, length), compute_q_blocks=False)


# --- KV cache ------------------------------------------------------------------------------------------


class KVCache(nn.Module):
    """K and V of one layer, [B, Hkv, L, D] each, preallocated and written in place (shapes stay static, so a
    decode step can be captured in a CUDA graph).

    A full-attention layer holds L = S slots, one per position. A sliding-window layer of window W holds a
    rolling buffer of L = min(W, S) slots: position p lives in slot p mod L, RoPE having been applied at the
    absolute position before the write, so the cache holds exactly the tokens the window can see and its bytes
    are the calculator's window-capped figure. A ``chunked`` layer (Llama 4, chunks of W tokens) keeps the same
    ring: a chunk starts at slot 0, so the query at p sees slots 0..p mod L (later slots hold the previous chunk's
    tail). ``dtype`` may be float8_e4m3fn (no scale), read back into the compute dtype.
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 compute_dtype: torch.dtype, device: torch.device, window: int | None = None,
                 v_dim: int | None = None, chunked: bool = False) -> None:
        super().__init__()
        self.window, self.chunked = window, chunked and window is not None
        self.length = min(window, max_len) if window is not None else max_len
        self.compute_dtype = compute_dtype
        self.register_buffer("k", torch.zeros(batch, kv_heads, self.length, head_dim, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("v", torch.zeros(batch, kv_heads, self.length, v_dim or head_dim, dtype=dtype,
                                              device=device), persistent=False)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def write(self, input_pos: Tensor, k: Tensor, v: Tensor) -> None:
        """Write k, v [B, Hkv, T, D] at ``input_pos`` [T] (slot p mod L on a ring; only the last L of T tokens,
        which are the only ones a later query can see). An index_put on the device: no host sync."""
        b = k.shape[0]
        if self.window is not None and k.shape[2] > self.length:
            k, v, input_pos = k[:, :, -self.length:], v[:, :, -self.length:], input_pos[-self.length:]
        slots = input_pos % self.length if self.window is not None else input_pos
        self.k[:b, :, slots] = k.to(self.k.dtype)
        self.v[:b, :, slots] = v.to(self.v.dtype)

    def read(self, batch: int, length: int | None = None) -> tuple[Tensor, Tensor]:
        """The first ``length`` slots (all by default) of the first ``batch`` sequences, in the compute dtype
        (a float8 cache is converted on every read: fp8 storage saves memory, not bandwidth)."""
        k, v = self.k[:batch, :, :length], self.v[:batch, :, :length]
        return k.to(self.compute_dtype), v.to(self.compute_dtype)

    def slot_positions(self, start: int) -> Tensor:
        """Absolute position held by each ring slot once positions < start are written (-1: empty)."""
        s = torch.arange(self.length, device=self.k.device)
        return (start - 1) - torch.remainder(start - 1 - s, self.length)

    def keys(self, k: Tensor, v: Tensor, step: Step) -> Keys:
        """Store the new k, v [B, Hkv, T, D] and return what the new queries attend (see the modes above)."""
        b, pos = k.shape[0], step.input_pos
        if step.mode == FRESH:
            self.write(pos, k, v)
            if step.causal_call and (self.window is None or step.t <= self.window):
                return Keys(k, v, CAUSAL)
            return Keys(k, v, MASKED, causal_mask(pos, pos, self.window, self.chunked))
        if step.mode == CHUNK:
            assert step.start is not None
            if self.window is None:
                self.write(pos, k, v)
                live = step.start + step.t
                ck, cv = self.read(b, live)
                return Keys(ck, cv, MASKED, causal_mask(pos, torch.arange(live, device=pos.device)))
            ck, cv = self.read(b)  # the ring before this chunk: its slots' positions, then the new keys
            k_pos = torch.cat([self.slot_positions(step.start), pos])
            keys = Keys(torch.cat([ck, k.to(ck.dtype)], dim=2), torch.cat([cv, v.to(cv.dtype)], dim=2), MASKED,
                        causal_mask(pos, k_pos, self.window, self.chunked))
            self.write(pos, k, v)
            return keys
        self.write(pos, k, v)  # one new token: write first, then every live slot (its own included) is visible
        if step.mode == LIVE:
            assert step.start is not None
            live = step.start % self.length + 1 if self.chunked else min(step.start + 1, self.length)
            ck, cv = self.read(b, live)
            return Keys(ck, cv, OPEN)
        ck, cv = self.read(b)
        if step.mode == FLEX:
            masks = step.chunk_block_masks if self.chunked else step.block_masks
            return Keys(ck, cv, FLEX, masks[self.length])
        slots = torch.arange(self.length, device=pos.device)
        if self.chunked:
            return Keys(ck, cv, MASKED, slots[None, :] <= pos[:, None] % self.length)
        return Keys(ck, cv, MASKED, slots[None, :] < (pos[:, None] + 1).clamp(max=self.length))


# --- attention kernels ---------------------------------------------------------------------------------

SDPA_BACKENDS: dict[str, SDPBackend] = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def sdpa_context(backend: str) -> AbstractContextManager[None]:
    """Restrict SDPA to one backend; ``auto`` lets torch choose per call."""
    return nullcontext() if backend == "auto" else sdpa_kernel([SDPA_BACKENDS[backend]])


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None = None,
           causal: bool = True) -> Tensor:
    """softmax(scale QK^T + mask)V for q [B, H, T, D] and k [B, Hkv, S, D], v [B, Hkv, S, Dv] -> [B, H, T, Dv],
    where query head h reads KV head h // (H/Hkv); scale defaults to D^-1/2. Three SDPA calls, so that a fused
    kernel takes each:

    - ``mask is None`` and ``causal`` (CAUSAL): prefill from an empty cache over exactly the T new keys (S == T),
      ``is_causal=True, enable_gqa=True``. Flash and cuDNN run it with native GQA and skip the blocks above the
      diagonal; no mask tensor is built or read.
    - otherwise the H/Hkv query heads that share a KV head are folded into the query length, q -> [B, Hkv,
      (H/Hkv)*T, D] (with the mask repeated per head of the group), which makes it plain multi-head attention:
      ``mask`` [T, S] booleans (MASKED: static-cache decode, chunked prefill, windows; [B, 1, T, S] where each
      sequence sees keys of its own, DSA's top-k) or no mask at all (OPEN: one
      query over the live keys). Flash takes no mask, and mem-efficient took no GQA before pytorch#191085 (2026),
      so a masked ``enable_gqa`` call that cuDNN declines (fp32, head_dim above its limit) fell to math, which
      materialises [B, H, T, S] scores and repeated K/V. Folded, mem-efficient and cuDNN run it (flash too when
      unmasked), and each KV head is read once for all of its queries.
    """
    if mask is None and causal:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=scale)
    b, h, t, _ = q.shape
    group = h // k.shape[1]
    folded = q.reshape(b, k.shape[1], group * t, q.shape[-1])  # row g*T + i is query i of head g of the group
    if mask is not None and group > 1:
        mask = mask.repeat(*(1,) * (mask.dim() - 2), group, 1)
    y = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, scale=scale)
    return y.reshape(b, h, t, v.shape[-1])


def attention_explicit(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None = None,
                       softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
    """The softmax written out, for what SDPA lacks: scores s = scale QK^T, soft-capped to c tanh(s / c)
    (Gemma 2, arXiv:2408.00118), masked, and softmaxed in at least fp32 with one learned sink logit per head
    joining the denominator, softmax([s_1..s_S, sink])[:S] (openai/gpt-oss gpt_oss/torch/model.py ``sdpa``).

    q [B, H, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv], mask [T, S] or None (all visible), sinks [H] or None
    -> [B, H, T, Dv]. Query head h uses KV head h // (H/Hkv); K/V are broadcast, not repeated.
    """
    b, h, t, d = q.shape
    hkv = k.shape[1]
    qg = q.view(b, hkv, h // hkv, t, d)
    scores = qg @ k.unsqueeze(2).transpose(-1, -2) * (d ** -0.5 if scale is None else scale)  # [B, Hkv, G, T, S]
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if sinks is None:
        probs = scores.softmax(dim=-1)
    else:
        sink = sinks.to(scores.dtype).view(1, hkv, h // hkv, 1, 1).expand(b, -1, -1, t, 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    return (probs.to(v.dtype) @ v.unsqueeze(2)).reshape(b, h, t, v.shape[-1])


def attention_with_sinks(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, sinks: Tensor) -> Tensor:
    """:func:`attention_explicit` with sinks and the default D^-1/2 scale."""
    return attention_explicit(q, k, v, mask, sinks=sinks)


def flex_attend(q: Tensor, k: Tensor, v: Tensor, block_mask: Any, scale: float | None = None,
                softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
    """Decode attention through ``torch.nn.attention.flex_attention`` over the live blocks of a static cache.

    Compiled (the captured decode step), inductor generates a split-KV flash-decoding kernel that loads only
    the blocks ``block_mask`` lists; eager it runs a reference that reads everything (correct, not fast).
    Soft-capping is a score_mod; sinks rescale the output by softmax's missing share,
    y = o x sigmoid(lse - sink), since o sums exp(s_j) v_j / sum exp(s_i) and the sink adds exp(sink) below.
    """
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    def capped(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return softcap * torch.tanh(score / softcap)

    gqa = q.shape[1] != k.shape[1]
    aux_request = None if sinks is None else AuxRequest(lse=True)
    if torch.compiler.is_compiling():
        result = flex_attention(q, k, v, score_mod=capped if softcap else None, block_mask=block_mask, scale=scale,
                                enable_gqa=gqa, return_aux=aux_request)
    else:
        with warnings.catch_warnings():  # eager flex warns that it is unfused; the profiler says which path ran
            warnings.simplefilter("ignore")
            result = flex_attention(q, k, v, score_mod=capped if softcap else None, block_mask=block_mask,
                                    scale=scale, enable_gqa=gqa, return_aux=aux_request)
    if sinks is None:
        return result
    out, aux = result
    share = torch.sigmoid(aux.lse - sinks.to(aux.lse.dtype).view(1, -1, 1))  # [B, H, T]
    return out * share[..., None].to(out.dtype)


def run_attention(q: Tensor, keys: Keys, scale: float | None, softcap: float | None = None,
                  sinks: Tensor | None = None) -> Tensor:
    """Attend q [B, H, T, D] over ``keys`` by the call they ask for (SDPA, explicit, or flex)."""
    if keys.how == FLEX:
        return flex_attend(q, keys.k, keys.v, keys.mask, scale, softcap, sinks)
    if softcap is not None or sinks is not None:
        mask = keys.mask
        if keys.how == CAUSAL:
            pos = torch.arange(q.shape[2], device=q.device)
            mask = causal_mask(pos, pos)
        return attention_explicit(q, keys.k, keys.v, mask, scale, softcap, sinks)
    return attend(q, keys.k, keys.v, keys.mask if keys.how == MASKED else None, scale, causal=keys.how == CAUSAL)


@functools.cache
def backend_works(backend: str, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                  device: torch.device, kind: str = MASKED, v_dim: int | None = None,
                  per_sequence: bool = False) -> bool:
    """Whether ``backend`` runs this model's ``kind`` of :func:`attend` call on ``device`` and ``dtype`` (probed
    once on tiny inputs: two new tokens for CAUSAL, one and two for MASKED as decode and prefill make it, one
    for OPEN); ``v_dim`` (default head_dim) is the value width (MLA's differs); with ``per_sequence`` a MASKED
    call's mask differs by sequence, [2, 1, T, S] (DSA's top-k choice)."""
    v_dim = v_dim or head_dim
    calls: list[tuple[int, Tensor | None, bool]]
    if kind == CAUSAL:
        calls = [(2, None, True)]
    elif kind == OPEN:
        calls = [(1, None, False)]
    else:
        calls = [(1, torch.ones(1, 4, dtype=torch.bool, device=device), False),
                 (2, torch.ones(2, 4, dtype=torch.bool, device=device).tril(2), False)]
        if per_sequence:  # the second sequence does not see key 0
            calls = [(t, torch.stack([mask, mask.index_fill(-1, torch.tensor([0], device=device), False)])[:, None],
                      causal) for t, mask, causal in calls if mask is not None]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about each rejected kernel before raising
            with sdpa_context(backend):
                for t, mask, causal in calls:
                    length, batch = t if causal else 4, mask.shape[0] if mask is not None and mask.dim() == 4 else 1
                    q = torch.randn(batch, heads, t, head_dim, dtype=dtype, device=device)
                    k = torch.randn(batch, kv_heads, length, head_dim, dtype=dtype, device=device)
                    v = torch.randn(batch, kv_heads, length, v_dim, dtype=dtype, device=device)
                    attend(q, k, v, mask, causal=causal)
    except RuntimeError:
        return False
    return True


def attention_temperature(positions: Tensor, floor_scale: int, scale: float, dtype: torch.dtype) -> Tensor:
    """1 + scale log(1 + floor((p + 1) / floor_scale)) per absolute position p [T] (Llama 4's NoPE layers:
    transformers Llama4TextAttention attn_temperature_tuning), the floor taken on integers."""
    return torch.log1p(torch.div(positions + 1, floor_scale, rounding_mode="floor").to(dtype)) * scale + 1.0


class Attention(nn.Module):
    """Multi-head attention with H query and Hkv KV heads (MHA H = Hkv, GQA, MQA Hkv = 1; Ainslie et al. 2023,
    arXiv:2305.13245): fused QKV projection, optional QK-norm per head (Qwen3; Command R+: a weight per head) or
    across heads (MiniMax-M2) and biases, RoPE (or partial RoPE), a KV cache (a rolling
    buffer on sliding-window layers) and :func:`run_attention`.

    Scores are scaled by query_pre_attn_scalar^-1/2 where the spec gives one (Gemma 2), else head_dim^-1/2.
    Llama 4 (transformers Llama4TextAttention): RoPE on adjacent pairs (``spec.rope_interleaved``), then q and k
    RMS-normalised per head without a weight (``spec.qk_l2_norm``); a ``nope`` layer applies neither and scales
    its queries by :func:`attention_temperature`; a ``sliding`` layer of a chunked spec attends within its chunk.
    ``spec.attention_output_gate`` (Qwen3-Next's gated attention, transformers Qwen3NextAttention): each query head's
    rows of wqkv are [query D | gate D] and the output becomes y * sigmoid(gate) before wo.
    ``spec.attention_head_gate`` (Step-3.7, transformers Step3p7Attention's g_proj): wqkv ends with one row per query
    head, g, and each head's output becomes y_head * sigmoid(g_head) before wo.
    Attention sinks (gpt-oss) and logit soft-capping (Gemma 2) have no SDPA form: those layers take the explicit
    softmax eagerly and flex_attention in a compiled decode step.
    Gemma 4 (transformers Gemma4TextAttention): a full layer takes ``spec.full_layer_spec``'s head_dim and KV heads;
    with ``attention_k_eq_v`` wqkv holds no V rows and the values are the k projection before its norm and RoPE;
    ``spec.v_norm`` RMS-normalises the values per head with no weight.
    """

    def __init__(self, spec: ModelSpec, sliding: bool = False, nope: bool = False) -> None:
        super().__init__()
        shape = spec.layer_kind_spec(sliding)
        self.heads, self.kv_heads, self.head_dim = spec.num_attention_heads, shape.num_kv_heads, shape.head_dim
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.output_gate, self.head_gate = spec.attention_output_gate, spec.attention_head_gate
        self.k_eq_v, self.v_norm = shape.attention_k_eq_v, spec.v_norm
        self.wqkv = nn.Linear(spec.hidden_size, q_out * (2 if self.output_gate else 1)
                              + (1 if self.k_eq_v else 2) * kv_out + (self.heads if self.head_gate else 0),
                              bias=spec.qkv_bias)
        self.wo = nn.Linear(q_out, spec.hidden_size, bias=spec.o_bias)
        self.qk_norm_across_heads = spec.qk_norm_across_heads
        # a sharded rank's q and k norms across heads, whose statistics span the ranks (tfcalc.model.parallel)
        self.qk_norm_over_ranks: nn.Module | None = None
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if spec.qk_norm and spec.qk_norm_weights_per_head:  # Command R+: a weight per head
            self.q_norm, self.k_norm = HeadNorm(spec, self.heads, self.head_dim), HeadNorm(spec, self.kv_heads,
                                                                                         self.head_dim)
        elif spec.qk_norm:
            self.q_norm = make_norm(spec, q_out if spec.qk_norm_across_heads else self.head_dim)
            self.k_norm = make_norm(spec, kv_out if spec.qk_norm_across_heads else self.head_dim)
        self.sinks = nn.Parameter(torch.randn(self.heads)) if spec.attention_sinks else None
        self.scale = (spec.query_pre_attn_scalar or self.head_dim) ** -0.5
        self.softcap = spec.attn_logit_softcapping
        self.window = spec.sliding_window if sliding else None
        self.chunked = sliding and spec.chunked_attention
        self.rotary, self.interleaved = not nope, spec.rope_interleaved
        self.qk_l2_norm = spec.qk_l2_norm and not nope
        floor = spec.attn_temperature_floor_scale
        self.temperature = (floor, spec.attn_temperature_scale) if nope and floor is not None else None
        self.kv_cache: KVCache | None = None

    @property
    def explicit(self) -> bool:
        """Whether SDPA cannot run this layer (sinks or soft-capping)."""
        return self.sinks is not None or self.softcap is not None

    def make_cache(self, batch: int, max_len: int, dtype: torch.dtype, compute_dtype: torch.dtype,
                   device: torch.device) -> KVCache:
        return KVCache(batch, self.kv_heads, max_len, self.head_dim, dtype, compute_dtype, device, self.window,
                       chunked=self.chunked)

    def forward(self, x: Tensor, step: Step) -> Tensor:
        """x [B, T, hidden] at positions step.input_pos -> [B, T, hidden]; the new K/V go into the cache."""
        assert self.kv_cache is not None, "call Transformer.setup_caches first"
        b, t, _ = x.shape
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        qkv = self.wqkv(x)
        head_gate = None
        if self.head_gate:  # Step-3.7: the last rows, one gate per query head
            qkv, head_gate = qkv.split([qkv.shape[-1] - self.heads, self.heads], dim=-1)
        if self.k_eq_v:
            q, k = qkv.split([q_out, kv_out], dim=-1)
            v = k
        else:
            q, k, v = qkv.split([q_out * (2 if self.output_gate else 1), kv_out, kv_out], dim=-1)
        gate = None
        if self.output_gate:  # per head [query | gate], as transformers views q_proj's output (heads, 2D)
            q, gate = q.view(b, t, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
            q = q.reshape(b, t, q_out)
        if self.qk_norm_over_ranks is not None:
            q, k = self.qk_norm_over_ranks(q, k)
        elif self.q_norm is not None and self.k_norm is not None and self.qk_norm_across_heads:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, t, self.heads, self.head_dim)
        k = k.view(b, t, self.kv_heads, self.head_dim)
        v = v.view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None and not self.qk_norm_across_heads:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm:
            v = rms_normalize(v)
        if self.rotary:
            rope = step.rope_local if self.window is not None and step.rope_local is not None else step.rope
            q, k = apply_rope(q, rope, self.interleaved), apply_rope(k, rope, self.interleaved)
        if self.qk_l2_norm:
            q, k = rms_normalize(q), rms_normalize(k)
        if self.temperature is not None:
            wide = torch.promote_types(q.dtype, torch.float32)
            q = (q.to(wide) * attention_temperature(step.input_pos, *self.temperature, wide)[:, None, None]).to(q.dtype)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [B, heads, T, D]
        y = run_attention(q, self.kv_cache.keys(k, v, step), self.scale, self.softcap, self.sinks)
        y = y.transpose(1, 2).reshape(b, t, q_out)
        if gate is not None:
            y = y * torch.sigmoid(gate.reshape(b, t, q_out))
        if head_gate is not None:
            y = (y.view(b, t, self.heads, self.head_dim) * torch.sigmoid(head_gate)[..., None]).reshape(b, t, q_out)
        return self.wo(y)


# --- feed-forward --------------------------------------------------------------------------------------

GPT_OSS_ALPHA, GPT_OSS_LIMIT = 1.702, 7.0  # openai/gpt-oss gpt_oss/torch/model.py swiglu()


def activate(spec: ModelSpec, h: Tensor) -> Tensor:
    """The FFN nonlinearity on the first projection's output h [..., 2I] (gated) or [..., I] (plain).

    Gated: act(gate) * up with gate, up = h.chunk(2): SwiGLU with silu, GeGLU for gelu* (Shazeer 2020,
    arXiv:2002.05202; ``gelu_tanh`` uses the tanh approximation), gpt-oss's clamped SwiGLU
    gate * sigmoid(1.702 gate) * (up + 1) with gate <= 7 and |up| <= 7 for ``swiglu_clamped``.
    ``relu2`` is relu(x)^2 (So et al. 2021, Primer, arXiv:2109.08668; Nemotron-H's plain MLPs and experts,
    transformers ACT2FN["relu2"]), on h itself (plain) or on the gate (gated).
    """
    name = spec.activation
    if spec.ffn_kind == "plain":
        if name == "relu2":
            return F.relu(h).square()
        return F.gelu(h, approximate="tanh" if "tanh" in name else "none") if name.startswith("gelu") else F.silu(h)
    gate, up = h.chunk(2, dim=-1)
    if name == "relu2":
        return F.relu(gate).square() * up
    if name == "swiglu_clamped":
        gate, up = gate.clamp(max=GPT_OSS_LIMIT), up.clamp(-GPT_OSS_LIMIT, GPT_OSS_LIMIT)
        return gate * torch.sigmoid(GPT_OSS_ALPHA * gate) * (up + 1)
    if name.startswith("gelu"):
        return F.gelu(gate, approximate="tanh" if "tanh" in name else "none") * up
    return F.silu(gate) * up


class FeedForward(nn.Module):
    """down(act(x W_in)): W_in fuses gate and up ([hidden, 2I]) for a gated FFN, [hidden, I] for a plain one."""

    def __init__(self, spec: ModelSpec, intermediate: int, bias: bool) -> None:
        super().__init__()
        self.spec = spec
        width = 2 * intermediate if spec.ffn_kind == "gated" else intermediate
        self.w_in = nn.Linear(spec.hidden_size, width, bias=bias)
        self.w_out = nn.Linear(intermediate, spec.hidden_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_out(activate(self.spec, self.w_in(x)))


class MoE(nn.Module):
    """Mixture of experts (Shazeer et al. 2017; Mixtral, arXiv:2401.04088): a router picks K of E experts per
    token and their outputs are summed with the routing weights, plus shared experts (DeepSeekMoE/Qwen-MoE),
    optionally scaled by sigmoid(x W_gate).

    Routing: softmax over the E router logits, top K, renormalised over the K when ``moe.normalize_top_k``
    (Mixtral, Qwen3). DeepSeek-V3 (``router_scoring: sigmoid``, transformers DeepseekV3TopkRouter): sigmoid
    scores; the choice adds the learned ``e_score_correction_bias`` and is limited to the best
    ``groups_per_token`` of ``expert_groups`` groups (a group scores the sum of its top two); the weights are the
    unbiased scores of the chosen experts, renormalised, times ``routed_scaling_factor``; ERNIE 4.5 biases the choice
    among its softmax scores the same way (transformers Ernie4_5_MoeTopKRouter's moe_statics). Llama 4
    (``moe.router_weights_input``, transformers Llama4TextMoe): each chosen expert's sigmoid score multiplies its
    input instead, y = sum_k expert_k(w_k x), not renormalised. Gemma 4 (``moe.router_scales``, transformers
    Gemma4TextRouter): the router sees x RMS-normalised without a weight, times a learned ``router_scale`` and
    hidden^-1/2; its top-k softmax weights, renormalised, are scaled by a learned ``per_expert_scale``; with
    ``moe.dense_mlp_beside`` the experts see ``input_norm(x)`` (pre_feedforward_layernorm_2) and the router x.

    A latent MoE (``moe.latent_size``, Nemotron 3 Super; transformers NemotronHMoE) runs its routed experts on
    fc1_latent_proj(x) and maps their weighted sum back with fc2_latent_proj; the router and the shared expert see x.

    Experts are stacked, w_in [E, 2I or I, hidden] and w_out [E, hidden, I] (hidden: the latent width where set).
    Dispatch sorts the N*K (token, expert) pairs by expert and runs each expert once on its contiguous slice; reading
    the per-expert counts back to the host is the one data-dependent step, so an MoE forward is not CUDA-graph
    capturable.
    ``expert_counts`` holds the tokens routed to each expert by the last forward.

    Sharded (``tfcalc.model.parallel``), a rank holds experts ``first_expert`` .. + ``local_experts`` (or a slice
    of each, adding ``b_out`` only where ``add_out_bias``) and runs only the pairs routed to them; ``dispatch``,
    when set, replaces the routing of :meth:`routed` (expert parallelism by all-to-all).
    """

    def __init__(self, spec: ModelSpec, weights_dtype: str | None = None) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        if moe.router_score_correction_bias and moe.router_scoring not in ("sigmoid", "softmax"):
            raise SpecError(f"{spec.name}: a router score-correction bias needs sigmoid (DeepSeek-V3) or softmax "
                            "(ERNIE 4.5) scoring")
        self.spec, self.top_k, self.normalize = spec, moe.experts_per_token, moe.normalize_top_k
        self.weights_input = moe.router_weights_input
        e, i = moe.num_experts, moe.expert_intermediate_size
        width = 2 * i if spec.ffn_kind == "gated" else i
        self.router = nn.Linear(spec.hidden_size, e, bias=moe.router_bias)
        self.latent_in = nn.Linear(spec.hidden_size, moe.latent_size, bias=spec.mlp_bias) if moe.latent_size else None
        self.latent_out = nn.Linear(moe.latent_size, spec.hidden_size, bias=spec.mlp_bias) if moe.latent_size else None
        h = moe.latent_size or spec.hidden_size  # the experts' width
        self.score_bias = nn.Parameter(torch.zeros(e)) if moe.router_score_correction_bias else None
        self.router_scale = nn.Parameter(torch.ones(spec.hidden_size)) if moe.router_scales else None
        self.per_expert_scale = nn.Parameter(torch.ones(e)) if moe.router_scales else None
        self.input_norm = make_norm(spec, spec.hidden_size) if moe.dense_mlp_beside else None
        if weights_dtype is None:
            self.w_in: Tensor | FP8Weight = nn.Parameter(torch.empty(e, width, h).uniform_(-h**-0.5, h**-0.5))
            self.w_out: Tensor | FP8Weight = nn.Parameter(torch.empty(e, h, i).uniform_(-i**-0.5, i**-0.5))
        else:  # FP8 experts drawn and quantized one at a time (tfcalc.model.fp8)
            block, dtype = FP8_FORMATS[weights_dtype] == "fp8_block", torch.get_default_dtype()
            self.w_in = FP8Weight.random_stack((e, width, h), h**-0.5, block, dtype)
            self.w_out = FP8Weight.random_stack((e, h, i), i**-0.5, block, dtype)
        self.b_in = nn.Parameter(torch.empty(e, width).uniform_(-h**-0.5, h**-0.5)) if moe.expert_bias else None
        self.b_out = nn.Parameter(torch.empty(e, h).uniform_(-i**-0.5, i**-0.5)) if moe.expert_bias else None
        shared_width = moe.num_shared_experts * moe.shared_expert_intermediate_size
        # n shared experts of width I_s act as one FFN of width n*I_s (their sum is the concatenation).
        self.shared = FeedForward(spec, shared_width, bias=spec.mlp_bias) if shared_width else None
        gated = shared_width and moe.shared_expert_gate
        self.shared_gate = nn.Linear(spec.hidden_size, 1, bias=False) if gated else None
        self.register_buffer("expert_counts", torch.zeros(e, dtype=torch.long), persistent=False)
        self.first_expert, self.local_experts, self.add_out_bias = 0, e, True
        self.dispatch: Callable[[MoE, Tensor], Tensor] | None = None

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [N, hidden] -> routing weights [N, K] (in x's dtype) and expert ids [N, K]."""
        moe = self.spec.moe
        assert moe is not None
        if self.router_scale is not None:
            x = rms_normalize(x) * self.router_scale * self.spec.hidden_size ** -0.5
        logits = self.router(x)  # [N, E]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if moe.router_scoring == "softmax":
            scores = logits.softmax(dim=-1)
        else:
            scores = logits.sigmoid()
        choice = scores if self.score_bias is None else scores + self.score_bias.to(scores.dtype)
        if moe.expert_groups > 1:
            n, g = choice.shape[0], moe.expert_groups
            group_scores = choice.view(n, g, -1).topk(2, dim=-1).values.sum(dim=-1)  # [N, G]
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(
                1, group_scores.topk(moe.groups_per_token, dim=-1).indices, True)
            choice = choice.masked_fill(~keep.repeat_interleave(moe.num_experts // g, dim=1), float("-inf"))
        experts = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if moe.router_scoring == "sigmoid" else 0))
        if self.per_expert_scale is not None:
            weights = weights * self.per_expert_scale[experts].to(weights.dtype)
        return (weights * moe.routed_scaling_factor).to(x.dtype), experts

    def expert_inputs(self, x: Tensor) -> Tensor:
        """What the experts see of x [N, hidden]: its own norm where the MoE sits beside a dense MLP (Gemma 4), its
        latent projection in a latent MoE (Nemotron 3 Super)."""
        x = x if self.input_norm is None else self.input_norm(x)
        return x if self.latent_in is None else self.latent_in(x)

    def expert(self, e: int, x: Tensor) -> Tensor:
        """Expert e (of this module's stack) on its tokens x [n, hidden] -> [n, hidden]."""
        b_in = None if self.b_in is None else self.b_in[e]
        b_out = None if self.b_out is None or not self.add_out_bias else self.b_out[e]
        return stacked_linear(activate(self.spec, stacked_linear(x, self.w_in, e, b_in)), self.w_out, e, b_out)

    def weigh_inputs(self, xs: Tensor, weights: Tensor) -> Tensor:
        """The pairs' expert inputs xs [P, hidden]: scaled by their routing weights [P, 1] where the router weights
        the input (Llama 4), else as they are."""
        return xs * weights if self.weights_input else xs

    def weigh_outputs(self, ys: Tensor, weights: Tensor) -> Tensor:
        """The pairs' expert outputs ys [P, hidden] scaled by their routing weights [P, 1], unless their inputs
        were."""
        return ys if self.weights_input else ys * weights

    def run_experts(self, xs: Tensor, counts: list[int]) -> Tensor:
        """xs [P, hidden] sorted by expert, ``counts[e]`` rows for expert e of the stack -> outputs [P, hidden]."""
        out = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if n:
                out[start:start + n] = self.expert(e, xs[start:start + n])
            start += n
        return out

    def routed(self, x: Tensor) -> Tensor:
        """The routed experts' weighted sum for x [N, hidden]: route, sort the N*K (token, expert) pairs by expert,
        run the experts this module holds on theirs (pairs of other experts contribute nothing here)."""
        weights, experts = self.route(x)  # [N, K]
        flat = experts.flatten()  # [N*K], pair j is token j // K
        counts = torch.zeros_like(self.expert_counts).index_add_(0, flat, torch.ones_like(flat))
        self.expert_counts.copy_(counts)
        first, held = self.first_expert, self.local_experts
        if held == counts.numel():
            pair = flat.argsort(stable=True)  # pairs grouped by expert
        else:
            local = (flat >= first) & (flat < first + held)
            pair = local.nonzero().squeeze(1)
            pair = pair[flat[pair].argsort(stable=True)]
        token, w = pair // self.top_k, weights.flatten()[pair, None]
        xs = self.expert_inputs(x)
        out = self.run_experts(self.weigh_inputs(xs[token], w), counts[first:first + held].tolist())
        return torch.zeros_like(xs).index_add_(0, token, self.weigh_outputs(out, w))

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, hidden]
        y = self.routed(x) if self.dispatch is None else self.dispatch(self, x)
        if self.latent_out is not None:
            y = self.latent_out(y)
        if self.shared is not None:
            shared = self.shared(x)
            y = y + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(x)) * shared)
        return y.view(shape)


def check_kv_dtype(dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a KV storage dtype this device cannot write into the cache or read back."""
    try:
        buf = torch.zeros(1, 1, 4, 8, dtype=dtype, device=device)
        buf[:, :, torch.tensor([1], device=device)] = torch.ones(1, 1, 1, 8, device=device).to(dtype)
        ok = bool(buf.float().sum().item() == 8.0)
    except (RuntimeError, TypeError):
        ok = False
    if not ok:
        raise UsageError(f"KV cache dtype {dtype} is not supported on {device} by torch {torch.__version__}")
