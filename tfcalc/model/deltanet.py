"""Gated DeltaNet token mixing (Yang, Kautz & Hatamizadeh 2024, arXiv:2412.06464), the linear-attention layers of
Qwen3-Next and Qwen3.5 (transformers Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet, vLLM qwen3_next.py).

Shapes: B batch, T new tokens, Hk key heads of Dk, Hv value heads of Dv (Hv a multiple of Hk: key head j serves
value heads j r .. j r + r - 1, r = Hv / Hk), C = 2 Hk Dk + Hv Dv conv channels, K conv taps.

Per token, after the projections: q, k, v through a causal depthwise conv and SiLU; q and k l2-normalised, q scaled
by Dk^-1/2; per value head a decay g = -exp(A_log) softplus(a + dt_bias) <= 0 and a write strength
beta = sigmoid(b). The state S [Dk, Dv] of each value head follows the gated delta rule

    S_t = exp(g_t) S_{t-1} + k_t beta_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,    o_t = S_t^T q_t,

and o goes through an RMSNorm over Dv gated by SiLU(z), then out_proj. A sequence holds no KV cache, only a fixed
state: the conv's last K - 1 input rows and S per value head (kept in float32, as transformers and vLLM do).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfcalc.model.layers import FRESH, NORM_EPS, Step
from tfcalc.spec.model import ModelSpec

L2_EPS = 1e-6  # q and k: x / sqrt(sum x^2 + 1e-6) (flash-linear-attention's l2norm, transformers' l2norm)
CHUNK = 64     # tokens per chunk of the chunked prefill (flash-linear-attention's chunk size)


class GatedRMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w * silu(z) over the last dimension (Dv), w initialised at 1 and used as is
    (no 1 + w, unlike the model's other norms): transformers Qwen3NextRMSNormGated, norm before gate. Normalised in
    float32, scaled by w in the input dtype, gated in float32."""

    def __init__(self, dim: int, eps: float = NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        wide = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(wide)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight * xf.to(x.dtype)
        return (y * F.silu(z.to(wide))).to(x.dtype)


class LinearState(nn.Module):
    """One layer's per-sequence state, preallocated like the KV cache (static shapes, written in place): the conv's
    last K - 1 input rows [B, K - 1, C] in the compute dtype and the delta-rule state [B, Hv, Dk, Dv] in float32
    (or wider), or in ``recurrent_dtype`` where given (Mamba-2's [B, H, P, N]: :mod:`tfcalc.model.mamba`)."""

    def __init__(self, batch: int, conv_rows: int, channels: int, value_heads: int, key_dim: int, value_dim: int,
                 dtype: torch.dtype, device: torch.device, recurrent_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.register_buffer("conv", torch.zeros(batch, conv_rows, channels, dtype=dtype, device=device),
                             persistent=False)
        wide = recurrent_dtype or torch.promote_types(dtype, torch.float32)
        self.register_buffer("recurrent", torch.zeros(batch, value_heads, key_dim, value_dim, device=device,
                                                      dtype=wide), persistent=False)

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.recurrent.nbytes

    def reset(self) -> None:
        self.conv.zero_()
        self.recurrent.zero_()


def causal_conv(x: Tensor, past: Tensor, weight: Tensor) -> Tensor:
    """Depthwise causal conv without bias: y_t = sum_j w[:, j] x_{t - K + 1 + j} over x [B, T, C] preceded by the
    ``past`` K - 1 rows [B, K - 1, C] (zeros at a sequence's start); weight [C, K]. transformers causal_conv1d_fn /
    causal_conv1d_update (a grouped Conv1d padded by K - 1)."""
    t, taps = x.shape[1], weight.shape[1]
    rows = torch.cat([past.to(x.dtype), x], dim=1)  # [B, K - 1 + T, C]
    return sum(rows[:, j:j + t] * weight[:, j] for j in range(taps))  # type: ignore[return-value]


def l2_normalize(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def delta_rule_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One token of the gated delta rule (the module docstring's recurrence) per value head: q, k [B, Hv, Dk],
    v [B, Hv, Dv], g, beta [B, Hv], state [B, Hv, Dk, Dv] -> output [B, Hv, Dv] and the new state."""
    state = state * g.exp()[..., None, None]
    delta = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", state, k))
    state = state + k[..., :, None] * delta[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", state, q), state


def delta_rule_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                       chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """The gated delta rule over T tokens, ``chunk`` at a time (arXiv:2412.06464 sec. 3.3, the WY / UT form of
    flash-linear-attention's chunk_gated_delta_rule). q, k [B, Hv, T, Dk], v [B, Hv, T, Dv], g, beta [B, Hv, T],
    state S0 [B, Hv, Dk, Dv] -> outputs [B, Hv, T, Dv] and the final state.

    Within a chunk with cumulative decays c_i = g_1 + ... + g_i, the writes u_i = beta_i (v_i - e^{c_i} S0^T k_i -
    sum_{j<i} e^{c_i - c_j} (k_i . k_j) u_j) solve the unit lower-triangular system (I + A) U = beta V - beta e^c K S0
    with A_ij = beta_i e^{c_i - c_j} k_i . k_j (j < i); then o_i = e^{c_i} S0^T q_i + sum_{j<=i} e^{c_i - c_j}
    (q_i . k_j) u_j and S = e^{c_last} S0 + sum_j e^{c_last - c_j} k_j u_j^T."""
    b, h, t, _ = k.shape
    chunk = min(chunk, t)  # a short prompt is one chunk of its own length, unpadded
    pad = -t % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))  # padded tokens: no decay, no write, after the real ones
    n = (t + pad) // chunk
    q, k, v = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v))
    c = g.reshape(b, h, n, chunk).cumsum(-1)  # [B, Hv, N, L]
    beta = beta.reshape(b, h, n, chunk)
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)  # j > i: not yet written
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(later, float("-inf")).exp()  # e^{c_i - c_j}, j <= i
    kk = k @ k.transpose(-1, -2)
    system = (beta[..., None] * kk * decay).tril(-1) + torch.eye(chunk, dtype=q.dtype, device=q.device)  # I + A
    writes = torch.linalg.solve_triangular(system, beta[..., None] * v, upper=False, unitriangular=True)
    reads = torch.linalg.solve_triangular(system, (beta * c.exp())[..., None] * k, upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay  # [B, Hv, N, L, L], zero above the diagonal
    q_decayed = q * c.exp()[..., None]
    k_to_end = k * (c[..., -1:] - c).exp()[..., None]
    out = torch.empty_like(v)
    for i in range(n):
        u = writes[:, :, i] - reads[:, :, i] @ state  # [B, Hv, L, Dv]
        out[:, :, i] = q_decayed[:, :, i] @ state + scores[:, :, i] @ u
        state = state * c[:, :, i, -1:, None].exp() + k_to_end[:, :, i].transpose(-1, -2) @ u
    return out.reshape(b, h, n * chunk, -1)[:, :, :t], state


class GatedDeltaNet(nn.Module):
    """A Gated DeltaNet layer (the module docstring): the token mixer of ``spec.is_linear_layer`` layers.

    Parameters (counted as ``tfcalc.calc.params.linear_attention_shape`` counts them): ``wqkvz`` [2 Hk Dk + 2 Hv Dv,
    hidden] with rows q (key heads), k, v (value heads), z, in Qwen3.5's order (in_proj_qkv then in_proj_z;
    Qwen3-Next's in_proj_qkvz interleaves them per key head); ``wba`` [2 Hv, hidden]: b then a; ``conv_weight``
    [C, K] over the q, k, v rows; ``A_log`` and ``dt_bias`` [Hv]; the gated norm's weight [Dv]; ``wo``
    (out_proj) [hidden, Hv Dv]. Sharded (``tfcalc.model.parallel``) a rank keeps whole key heads and their value
    heads; ``key_heads`` and ``value_heads`` are then this rank's.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        la = spec.linear_attention
        assert la is not None
        self.key_heads, self.value_heads = la.num_key_heads, la.num_value_heads
        self.key_dim, self.value_dim, self.taps = la.key_head_dim, la.value_head_dim, la.conv_kernel
        h = spec.hidden_size
        self.wqkvz = nn.Linear(h, 2 * la.key_dim + 2 * la.value_dim, bias=False)
        self.wba = nn.Linear(h, 2 * la.num_value_heads, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(la.conv_dim, la.conv_kernel).uniform_(-0.5, 0.5))
        self.A_log = nn.Parameter(torch.empty(la.num_value_heads).uniform_(0.01, 16).log())
        self.dt_bias = nn.Parameter(torch.ones(la.num_value_heads))
        self.norm = GatedRMSNorm(la.value_head_dim)
        self.wo = nn.Linear(la.value_dim, h, bias=False)
        self.state: LinearState | None = None

    @property
    def channels(self) -> int:
        """Conv channels (this rank's): q and k of the key heads, v of the value heads."""
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    def make_state(self, batch: int, dtype: torch.dtype, device: torch.device) -> LinearState:
        return LinearState(batch, self.taps - 1, self.channels, self.value_heads, self.key_dim, self.value_dim,
                           dtype, device)

    def forward(self, x: Tensor, step: Step) -> Tensor:
        """x [B, T, hidden] -> [B, T, hidden]; the layer's state advances by the T tokens. A FRESH prefill starts
        from a zero state whatever the buffers hold; every other call continues the state."""
        assert self.state is not None, "call Transformer.setup_caches first"
        b, t, _ = x.shape
        hk, hv, dk, dv = self.key_heads, self.value_heads, self.key_dim, self.value_dim
        qkv, z = self.wqkvz(x).split([self.channels, hv * dv], dim=-1)
        beta_in, a = self.wba(x).split([hv, hv], dim=-1)
        fresh = step.mode == FRESH
        conv_state, recurrent = self.state.conv[:b], self.state.recurrent[:b]
        past = torch.zeros_like(conv_state) if fresh else conv_state
        mixed = F.silu(causal_conv(qkv, past, self.conv_weight))
        rows = torch.cat([past.to(qkv.dtype), qkv], dim=1)[:, -(self.taps - 1):] if self.taps > 1 else past
        conv_state.copy_(rows)
        q, k, v = mixed.split([hk * dk, hk * dk, hv * dv], dim=-1)
        wide = recurrent.dtype
        # [B, T, heads, D] -> [B, Hv, T, D] in float32; each key head repeated for its Hv / Hk value heads
        q, k = (l2_normalize(y.reshape(b, t, hk, dk).to(wide)).repeat_interleave(hv // hk, dim=2).transpose(1, 2)
                for y in (q, k))
        q = q * dk ** -0.5
        v = v.reshape(b, t, hv, dv).to(wide).transpose(1, 2)
        beta = torch.sigmoid(beta_in).to(wide).transpose(1, 2)  # [B, Hv, T]
        g = (-self.A_log.to(wide).exp() * F.softplus(a.to(wide) + self.dt_bias)).transpose(1, 2)
        start = torch.zeros_like(recurrent) if fresh else recurrent
        if t == 1:
            out, final = delta_rule_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], g[..., 0], beta[..., 0], start)
            out = out[:, :, None]
        else:
            out, final = delta_rule_chunked(q, k, v, g, beta, start)
        recurrent.copy_(final)
        y = self.norm(out.transpose(1, 2).to(x.dtype), z.reshape(b, t, hv, dv))  # [B, T, Hv, Dv]
        return self.wo(y.reshape(b, t, hv * dv))
