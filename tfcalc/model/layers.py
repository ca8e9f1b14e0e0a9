"""The decoder's building blocks, one class per concept: norms, RoPE, the static KV cache, attention, FFN, MoE.

Shapes: B batch, T new tokens, S cache length (max_len), H query heads, Hkv KV heads, D head_dim, E experts,
K experts per token, N = B*T tokens. Every module is built from a :class:`tfcalc.spec.model.ModelSpec`.
"""

from __future__ import annotations

import functools
import math
import warnings
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.model import ModelSpec

NORM_EPS = 1e-5  # Llama 3 norm_eps; the spec does not carry eps

# --- norms ---------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w (Zhang & Sennrich 2019, arXiv:1910.07467).

    Computed in at least fp32 and cast back to the input dtype, as Llama 3's reference does.
    """

    def __init__(self, dim: int, eps: float = NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def make_norm(spec: ModelSpec, dim: int) -> nn.Module:
    """RMSNorm (weight) or LayerNorm (weight and bias), as ``spec.norm_kind`` says."""
    return RMSNorm(dim) if spec.norm_kind == "rmsnorm" else nn.LayerNorm(dim, eps=NORM_EPS)


# --- rotary position embeddings ------------------------------------------------------------------------


def rope_frequencies(spec: ModelSpec) -> Tensor:
    """Inverse frequencies theta^(-2i/D), i < D/2 (RoFormer, arXiv:2104.09864), in float64.

    ``rope_type: llama3`` applies Llama 3.1's wavelength-dependent scaling (meta-llama/llama-models,
    models/llama3/model.py ``apply_scaling``): wavelengths shorter than original_len / high_freq_factor
    are kept, longer than original_len / low_freq_factor divided by ``factor``, and the band in between
    interpolated. Other scaling types (yarn, linear, dynamic, longrope) are NOT applied: the model uses plain
    RoPE with ``rope_theta``, which is exact within the original context and only changes long-context quality,
    never shapes, parameter counts or cost.
    """
    d = spec.head_dim
    inv_freq = spec.rope_theta ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)  # [D/2]
    scaling = spec.rope_scaling
    if scaling is None or scaling.rope_type != "llama3":
        return inv_freq
    old_len = scaling.original_max_position_embeddings or 8192
    low, high = scaling.low_freq_factor or 1.0, scaling.high_freq_factor or 4.0
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_len / wavelen - low) / (high - low)).clamp(0.0, 1.0)  # 0: long waves, 1: short waves
    return (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq


def rope_table(spec: ModelSpec, max_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """cos and sin of position x frequency: [max_len, 2, D/2]; row p rotates the token at position p."""
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), rope_frequencies(spec))  # [S, D/2]
    return torch.stack([angles.cos(), angles.sin()], dim=1).to(device=device, dtype=dtype)


def apply_rope(x: Tensor, table: Tensor) -> Tensor:
    """Rotate (x_i, x_{i+D/2}) pairs by the angles in ``table`` (the "rotate half" layout HF Llama uses).

    x: [B, T, heads, D]; table: [T, 2, D/2] gathered at the tokens' absolute positions.
    """
    cos, sin = table[:, None, 0], table[:, None, 1]  # [T, 1, D/2], broadcast over B and heads
    xf = x.to(table.dtype)
    x1, x2 = xf.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


# --- static KV cache -----------------------------------------------------------------------------------


class KVCache(nn.Module):
    """Preallocated K and V, [B, Hkv, S, D] each, written in place at the tokens' positions.

    Nothing is concatenated per step, so shapes stay static (CUDA-graph capturable). A sliding-window layer
    gets the full S as well and relies on its mask; its bytes are therefore the uncapped figure. ``dtype`` may
    be float8_e4m3fn (stored without a scale, read back into the compute dtype each step).
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 compute_dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        shape = (batch, kv_heads, max_len, head_dim)
        self.compute_dtype = compute_dtype
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def write(self, input_pos: Tensor, k: Tensor, v: Tensor) -> None:
        """Write k, v [B, Hkv, T, D] at ``input_pos`` [T] (an index_put on the device: no host sync)."""
        b = k.shape[0]
        self.k[:b, :, input_pos] = k.to(self.k.dtype)
        self.v[:b, :, input_pos] = v.to(self.v.dtype)

    def read(self, batch: int) -> tuple[Tensor, Tensor]:
        """The whole cache of the first ``batch`` sequences, [B, Hkv, S, D], in the compute dtype.

        A float8 cache is converted whole on every read (a copy of S slots), so fp8 storage saves memory, not
        bandwidth: the step reads the fp8 bytes, writes and reads them again at the compute width.
        """
        return self.k[:batch].to(self.compute_dtype), self.v[:batch].to(self.compute_dtype)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


# --- attention -----------------------------------------------------------------------------------------

SDPA_BACKENDS: dict[str, SDPBackend] = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# The two SDPA calls the decoder makes (see :func:`attend`).
CAUSAL, MASKED = "causal", "masked"


def sdpa_context(backend: str) -> AbstractContextManager[None]:
    """Restrict SDPA to one backend; ``auto`` lets torch choose per call."""
    return nullcontext() if backend == "auto" else sdpa_kernel([SDPA_BACKENDS[backend]])


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(QK^T/sqrt(D) + mask)V for q [B, H, T, D] and k, v [B, Hkv, S, D] -> [B, H, T, D], where query
    head h reads KV head h // (H/Hkv). Two SDPA calls, so that a fused CUDA kernel takes each:

    - ``mask is None`` (CAUSAL): prefill from an empty cache over exactly the T new keys (S == T),
      ``is_causal=True, enable_gqa=True``. Flash and cuDNN run it with native GQA and skip the blocks above the
      diagonal; no mask tensor is built or read.
    - ``mask`` [T, S] booleans (MASKED; decode, chunked prefill, sliding windows): the H/Hkv query heads that share
      a KV head are folded into the query length, q -> [B, Hkv, (H/Hkv)*T, D] with the mask repeated per head of
      the group, which makes it plain multi-head attention with a mask. Flash takes no mask at all, and
      mem-efficient took no GQA before pytorch#191085 (2026), so a masked ``enable_gqa`` call that cuDNN declines
      (fp32, head_dim above its limit) fell to math, which materialises [B, H, T, S] scores and repeated K/V.
      Folded, mem-efficient and cuDNN both run it, and each KV head is read once for all of its queries.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    b, h, t, d = q.shape
    group = h // k.shape[1]
    folded = q.reshape(b, k.shape[1], group * t, d)  # row g*T + i is query i of head g of the group
    y = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask.repeat(group, 1) if group > 1 else mask)
    return y.reshape(b, h, t, d)


@functools.cache
def backend_works(backend: str, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                  device: torch.device, kind: str = MASKED) -> bool:
    """Whether ``backend`` runs this model's ``kind`` of :func:`attend` call on ``device`` and ``dtype`` (probed
    once on tiny inputs: one and two new tokens for MASKED, as decode and prefill make it)."""
    calls = [(2, None)] if kind == CAUSAL else [(1, torch.ones(1, 4, dtype=torch.bool, device=device)),
                                                (2, torch.ones(2, 4, dtype=torch.bool, device=device).tril(2))]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about each rejected kernel before raising
            with sdpa_context(backend):
                for t, mask in calls:
                    q = torch.randn(1, heads, t, head_dim, dtype=dtype, device=device)
                    kv = torch.randn(1, kv_heads, t if mask is None else 4, head_dim, dtype=dtype, device=device)
                    attend(q, kv, kv, mask)
    except RuntimeError:
        return False
    return True


class Attention(nn.Module):
    """Multi-head attention with H query and Hkv KV heads (MHA H = Hkv, GQA, MQA Hkv = 1; Ainslie et al. 2023,
    arXiv:2305.13245): fused QKV projection, optional QK-norm (Qwen3) and biases, RoPE, static cache and SDPA
    through :func:`attend`, which reads each KV head once for its H/Hkv queries.

    Attention sinks (gpt-oss): one learned logit per head joins the softmax denominator,
    softmax([s_1..s_S, sink])[:S]. SDPA has no such term and does not return its log-sum-exp, so sink layers
    take an explicit math path (:func:`attention_with_sinks`) instead of SDPA.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.wqkv = nn.Linear(spec.hidden_size, q_out + 2 * kv_out, bias=spec.qkv_bias)
        self.wo = nn.Linear(q_out, spec.hidden_size, bias=spec.o_bias)
        self.q_norm = make_norm(spec, self.head_dim) if spec.qk_norm else None
        self.k_norm = make_norm(spec, self.head_dim) if spec.qk_norm else None
        self.sinks = nn.Parameter(torch.randn(self.heads)) if spec.attention_sinks else None
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, input_pos: Tensor, rope: Tensor, mask: Tensor | None,
                fresh: bool = False) -> Tensor:
        """x [B, T, hidden], input_pos [T], rope [T, 2, D/2] -> [B, T, hidden].

        The new K/V are written to the cache. ``fresh`` (a prefill from an empty cache): attend over the new
        keys themselves, causally when ``mask`` is None, else with mask [T, T]. Otherwise attend over the whole
        cache with mask [T, S] (True = attend).
        """
        assert self.kv_cache is not None, "call Transformer.setup_caches first"
        b, t, _ = x.shape
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_out, kv_out, kv_out], dim=-1)
        q = q.view(b, t, self.heads, self.head_dim)
        k = k.view(b, t, self.kv_heads, self.head_dim)
        v = v.view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [B, heads, T, D]
        self.kv_cache.write(input_pos, k, v)
        if not fresh:
            k, v = self.kv_cache.read(b)  # [B, Hkv, S, D]
        if self.sinks is None:
            y = attend(q, k, v, mask)
        else:
            assert mask is not None, "sink layers take the explicit path, which needs the mask"
            y = attention_with_sinks(q, k, v, mask, self.sinks)
        return self.wo(y.transpose(1, 2).reshape(b, t, q_out))


def attention_with_sinks(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, sinks: Tensor) -> Tensor:
    """softmax over [QK^T/sqrt(D) + mask, sink] with the sink column dropped, times V (openai/gpt-oss
    gpt_oss/torch/model.py ``sdpa``). q [B, H, T, D], k/v [B, Hkv, S, D], sinks [H] -> [B, H, T, D].

    Query head h uses KV head h // (H/Hkv), as SDPA's ``enable_gqa``; K/V are broadcast, not repeated.
    """
    b, h, t, d = q.shape
    hkv = k.shape[1]
    qg = q.view(b, hkv, h // hkv, t, d)
    scores = qg @ k.unsqueeze(2).transpose(-1, -2) / math.sqrt(d)  # [B, Hkv, H/Hkv, T, S]
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.to(scores.dtype).view(1, hkv, h // hkv, 1, 1).expand(b, -1, -1, t, 1)
    scores = torch.cat([scores, sink], dim=-1)
    probs = scores.to(torch.promote_types(scores.dtype, torch.float32)).softmax(dim=-1)[..., :-1].to(v.dtype)
    return (probs @ v.unsqueeze(2)).view(b, h, t, d)


# --- feed-forward --------------------------------------------------------------------------------------

GPT_OSS_ALPHA, GPT_OSS_LIMIT = 1.702, 7.0  # openai/gpt-oss gpt_oss/torch/model.py swiglu()


def activate(spec: ModelSpec, h: Tensor) -> Tensor:
    """The FFN nonlinearity on the first projection's output h [..., 2I] (gated) or [..., I] (plain).

    Gated: act(gate) * up with gate, up = h.chunk(2): SwiGLU with silu, GeGLU for gelu* (Shazeer 2020,
    arXiv:2002.05202; ``gelu_tanh`` uses the tanh approximation), gpt-oss's clamped SwiGLU
    gate * sigmoid(1.702 gate) * (up + 1) with gate <= 7 and |up| <= 7 for ``swiglu_clamped``.
    """
    name = spec.activation
    if spec.ffn_kind == "plain":
        return F.gelu(h, approximate="tanh" if "tanh" in name else "none") if name.startswith("gelu") else F.silu(h)
    gate, up = h.chunk(2, dim=-1)
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
    """Mixture of experts (Shazeer et al. 2017; Mixtral, arXiv:2401.04088): a softmax router picks K of E
    experts per token, their outputs are summed with the routing weights (renormalised over the K when
    ``moe.normalize_top_k``, as Mixtral and Qwen3 do), plus shared experts (DeepSeekMoE/Qwen-MoE), optionally
    scaled by sigmoid(x W_gate).

    Experts are stacked, w_in [E, 2I or I, hidden] and w_out [E, hidden, I]. Dispatch sorts the N*K
    (token, expert) pairs by expert and runs each expert once on its contiguous slice; reading the per-expert
    counts back to the host is the one data-dependent step, so an MoE forward is not CUDA-graph capturable.
    ``expert_counts`` holds the tokens routed to each expert by the last forward.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        if moe.router_score_correction_bias:
            raise SpecError(f"{spec.name}: sigmoid routing with a score-correction bias (DeepSeek-V3) is not "
                            "implemented in the bundled model")
        self.spec, self.top_k, self.normalize = spec, moe.experts_per_token, moe.normalize_top_k
        e, h, i = moe.num_experts, spec.hidden_size, moe.expert_intermediate_size
        width = 2 * i if spec.ffn_kind == "gated" else i
        self.router = nn.Linear(h, e, bias=moe.router_bias)
        self.w_in = nn.Parameter(torch.empty(e, width, h).uniform_(-h**-0.5, h**-0.5))
        self.w_out = nn.Parameter(torch.empty(e, h, i).uniform_(-i**-0.5, i**-0.5))
        self.b_in = nn.Parameter(torch.empty(e, width).uniform_(-h**-0.5, h**-0.5)) if moe.expert_bias else None
        self.b_out = nn.Parameter(torch.empty(e, h).uniform_(-i**-0.5, i**-0.5)) if moe.expert_bias else None
        shared_width = moe.num_shared_experts * moe.shared_expert_intermediate_size
        # n shared experts of width I_s act as one FFN of width n*I_s (their sum is the concatenation).
        self.shared = FeedForward(spec, shared_width, bias=False) if shared_width else None
        self.shared_gate = nn.Linear(h, 1, bias=False) if shared_width and moe.shared_expert_gate else None
        self.register_buffer("expert_counts", torch.zeros(e, dtype=torch.long), persistent=False)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [N, hidden] -> routing weights [N, K] (in x's dtype) and expert ids [N, K]."""
        logits = self.router(x)  # [N, E]
        probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def expert(self, e: int, x: Tensor) -> Tensor:
        """Expert e on its tokens x [n, hidden] -> [n, hidden]."""
        b_in = None if self.b_in is None else self.b_in[e]
        b_out = None if self.b_out is None else self.b_out[e]
        return F.linear(activate(self.spec, F.linear(x, self.w_in[e], b_in)), self.w_out[e], b_out)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, hidden]
        weights, experts = self.route(x)  # [N, K]
        flat = experts.flatten()  # [N*K], pair j is token j // K
        order = flat.argsort(stable=True)  # pairs grouped by expert
        token = order // self.top_k
        counts = torch.zeros_like(self.expert_counts).index_add_(0, flat, torch.ones_like(flat))
        self.expert_counts.copy_(counts)
        xs = x[token]  # [N*K, hidden], sorted by expert
        out = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                out[start:start + n] = self.expert(e, xs[start:start + n])
            start += n
        y = torch.zeros_like(x).index_add_(0, token, out * weights.flatten()[order, None])
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
