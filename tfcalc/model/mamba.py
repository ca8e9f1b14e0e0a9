"""Mamba-2 token mixing (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060), the mixer of Nemotron-H's "M"
blocks (transformers NemotronHMamba2Mixer, vLLM MambaMixer2).

Shapes: B batch, T new tokens, H heads of P channels (d_inner = H P), G groups of B/C (head j reads group
j // (H / G)), N the state size, C = d_inner + 2 G N conv channels, K conv taps.

in_proj gives z [d_inner], xBC [C] and dt [H]; xBC goes through a causal depthwise conv (with bias) and SiLU and
splits into x [H, P], B and C [G, N]. Per head, with dt = softplus(dt + dt_bias) and A = -exp(A_log), the state
h [P, N] follows the selective state-space recurrence

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,    y_t = h_t C_t + D x_t,

then y is gated and normed: RMSNorm over each of the G groups of d_inner / G channels of y * silu(z) (norm after
the gate, NemotronHRMSNormGated), times a weight [d_inner], and out_proj. The scan, the gate and the norm run in
the state's dtype (float32 or wider), the weight and out_proj in the model's. A sequence holds no KV cache, only a fixed
state: the conv's last K - 1 input rows and h per head, the latter in the spec's ``recurrent_state_dtype``
(Nemotron-H's mamba_ssm_cache_dtype float32, as vLLM keeps it) or the model's dtype where that is wider.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfcalc.model.deltanet import LinearState, causal_conv
from tfcalc.model.layers import FRESH, NORM_EPS, Step
from tfcalc.spec.model import ModelSpec

STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DT_MIN, DT_MAX = 1e-3, 0.1  # the initial dt range (NemotronHConfig time_step_min / time_step_max)


def segment_sum(a: Tensor) -> Tensor:
    """[..., L] log-decays -> [..., L, L] with entry (i, j) = a_{j+1} + ... + a_i for j <= i and -inf above the
    diagonal, summed directly rather than as a difference of cumulative sums (which cancels in float32): transformers'
    segment_sum (the Mamba-2 reference's segsum)."""
    length = a.shape[-1]
    rows = a[..., :, None].expand(*a.shape, length)  # [..., k, j] = a_k
    rows = rows.masked_fill(~torch.ones(length, length, dtype=torch.bool, device=a.device).tril(-1), 0)
    sums = rows.cumsum(dim=-2)  # [..., i, j] = sum of a_k over j < k <= i
    return sums.masked_fill(~torch.ones(length, length, dtype=torch.bool, device=a.device).tril(0), float("-inf"))


def ssd_step(x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One token of the recurrence (module docstring) per head, D aside: x [B, H, P], dt [B, H], A [H], B and C
    [B, H, N] (already per head), state [B, H, P, N] -> y [B, H, P] and the new state (transformers
    selective_state_update, vLLM selective_state_update)."""
    state = state * (dt * a).exp()[..., None, None] + (dt[..., None] * x)[..., :, None] * b[..., None, :]
    return torch.einsum("bhpn,bhn->bhp", state, c), state


def ssd_chunked(x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, state: Tensor,
                chunk: int) -> tuple[Tensor, Tensor]:
    """The recurrence over T tokens, ``chunk`` at a time (state space duality, arXiv:2405.21060 sec. 6; the torch
    reference of transformers' mamba2_chunk_scan). x [B, H, T, P], dt [B, H, T], A [H], B and C [B, H, T, N],
    state h0 [B, H, P, N] -> y [B, H, T, P] (D aside) and the final state.

    Within a chunk of log-decays a_i = dt_i A, with s(i, j) = a_{j+1} + ... + a_i (:func:`segment_sum`):
    y_i = e^{s(i, 0)} h0 C_i + sum_{j <= i} e^{s(i, j)} (C_i . B_j) dt_j x_j, and the state passed on is
    e^{s(L, 0)} h0 + sum_j e^{s(L, j)} dt_j x_j B_j^T (s(i, 0) counting a_1 too)."""
    bsz, heads, t, _ = x.shape
    chunk = min(chunk, t)  # a short prompt is one chunk of its own length, unpadded
    pad = -t % chunk
    if pad:  # padded tokens: dt 0, so no decay and no write, after the real ones
        x, b, c = (F.pad(y, (0, 0, 0, pad)) for y in (x, b, c))
        dt = F.pad(dt, (0, pad))
    n = (t + pad) // chunk
    x, b, c = (y.reshape(bsz, heads, n, chunk, y.shape[-1]) for y in (x, b, c))
    dt = dt.reshape(bsz, heads, n, chunk)
    log_decay = dt * a[:, None, None]  # [B, H, n, L]: n chunks of L
    within = segment_sum(log_decay).exp()  # [B, H, n, L, L]: e^{s(i, j)}, zero above the diagonal
    from_start = log_decay.cumsum(-1)  # s(i, 0)
    xdt = x * dt[..., None]
    y_local = ((c @ b.transpose(-1, -2)) * within) @ xdt  # [B, H, n, L, P]
    to_end = within[..., -1, :]  # e^{s(L, j)}
    writes = (xdt * to_end[..., None]).transpose(-1, -2) @ b  # [B, H, n, P, N]
    out = torch.empty_like(x)
    for i in range(n):
        out[:, :, i] = y_local[:, :, i] + from_start[:, :, i, :, None].exp() * (c[:, :, i] @ state.transpose(-1, -2))
        state = state * from_start[:, :, i, -1, None, None].exp() + writes[:, :, i]
    return out.reshape(bsz, heads, n * chunk, -1)[:, :, :t], state


class GroupedGatedRMSNorm(nn.Module):
    """y = w * rmsnorm_g(x * silu(z)): x gated first, then RMS-normalised over each group of ``group_size``
    channels, then scaled by w (initialised at 1, used as is): transformers NemotronHRMSNormGated (the Mamba-2
    reference's RMSNormGated with norm_before_gate=False). Gated and normalised in float32 (or wider), scaled in
    z's dtype (the model's). ``over_ranks``, set by :mod:`tfcalc.model.parallel` where a group spans tp ranks, completes
    the sums of squares across them."""

    def __init__(self, dim: int, group_size: int, eps: float = NORM_EPS) -> None:
        super().__init__()
        self.eps, self.group_size = eps, group_size
        self.weight = nn.Parameter(torch.ones(dim))
        self.over_ranks: nn.Module | None = None

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        wide = torch.promote_types(x.dtype, torch.float32)
        gated = x.to(wide) * F.silu(z.to(wide))
        if self.over_ranks is not None:
            normed = self.over_ranks(gated, self.eps)
        else:
            groups = gated.unflatten(-1, (-1, self.group_size))
            normed = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)
        return self.weight * normed.to(z.dtype)


class Mamba2Mixer(nn.Module):
    """A Mamba-2 mixer (the module docstring): the token mixer of a Nemotron-H "M" block (``spec.is_linear_layer``
    with ``linear_attention.kind`` mamba2).

    Parameters (counted as ``tfcalc.calc.params.linear_attention_shape`` counts them), named as transformers names
    them: ``in_proj`` [2 d_inner + 2 G N + H, hidden] with rows z, x, B, C, dt (bias where ``proj_bias``);
    ``conv_weight`` [C, K] and ``conv_bias`` [C] (``conv_bias``) over the x, B, C rows; ``dt_bias``, ``A_log`` and
    ``D`` [H]; the gated norm's weight [d_inner]; ``out_proj`` [hidden, d_inner]. Sharded
    (``tfcalc.model.parallel``) a rank keeps H / tp heads and the groups they read; ``heads`` and ``groups`` are then
    this rank's.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        la = spec.linear_attention
        assert la is not None and la.kind == "mamba2"
        self.heads, self.head_dim = la.num_value_heads, la.value_head_dim
        self.groups, self.state_size = la.num_key_heads, la.key_head_dim
        self.taps, self.chunk = la.conv_kernel, la.chunk_size
        self.state_dtype = STATE_DTYPES[la.recurrent_state_dtype or "fp32"]
        h, inner = spec.hidden_size, la.value_dim
        self.in_proj = nn.Linear(h, 2 * inner + 2 * la.key_dim + la.num_value_heads, bias=la.proj_bias)
        bound = la.conv_kernel ** -0.5  # nn.Conv1d's default bound for a depthwise conv of K taps
        self.conv_weight = nn.Parameter(torch.empty(la.conv_dim, la.conv_kernel).uniform_(-bound, bound))
        self.conv_bias = nn.Parameter(torch.empty(la.conv_dim).uniform_(-bound, bound)) if la.conv_bias else None
        dt = torch.empty(la.num_value_heads).uniform_(math.log(DT_MIN), math.log(DT_MAX)).exp()
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1 of dt in [DT_MIN, DT_MAX]
        self.A_log = nn.Parameter(torch.arange(1, la.num_value_heads + 1).to(torch.get_default_dtype()).log())
        self.D = nn.Parameter(torch.ones(la.num_value_heads))
        self.norm = GroupedGatedRMSNorm(inner, inner // la.num_key_heads)
        self.out_proj = nn.Linear(inner, h, bias=la.proj_bias)
        self.state: LinearState | None = None

    @property
    def inner(self) -> int:
        """d_inner (this rank's): heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def channels(self) -> int:
        """Conv channels (this rank's): x of the heads, B and C of the groups."""
        return self.inner + 2 * self.groups * self.state_size

    def make_state(self, batch: int, dtype: torch.dtype, device: torch.device) -> LinearState:
        """Conv rows [B, K - 1, C] in ``dtype`` and h [B, H, P, N] in the state dtype (or ``dtype`` if wider)."""
        return LinearState(batch, self.taps - 1, self.channels, self.heads, self.head_dim, self.state_size, dtype,
                           device, recurrent_dtype=torch.promote_types(dtype, self.state_dtype))

    def forward(self, x: Tensor, step: Step) -> Tensor:
        """x [B, T, hidden] -> [B, T, hidden]; the layer's state advances by the T tokens. A FRESH prefill starts
        from a zero state whatever the buffers hold; every other call continues the state."""
        assert self.state is not None, "call Transformer.setup_caches first"
        bsz, t, _ = x.shape
        heads, p, g, n = self.heads, self.head_dim, self.groups, self.state_size
        z, xbc, dt = self.in_proj(x).split([self.inner, self.channels, heads], dim=-1)
        fresh = step.mode == FRESH
        conv_state, recurrent = self.state.conv[:bsz], self.state.recurrent[:bsz]
        past = torch.zeros_like(conv_state) if fresh else conv_state
        mixed = causal_conv(xbc, past, self.conv_weight)
        mixed = F.silu(mixed if self.conv_bias is None else mixed + self.conv_bias)
        rows = torch.cat([past.to(xbc.dtype), xbc], dim=1)[:, -(self.taps - 1):] if self.taps > 1 else past
        conv_state.copy_(rows)
        xs, b, c = mixed.split([self.inner, g * n, g * n], dim=-1)
        wide = recurrent.dtype
        xs = xs.reshape(bsz, t, heads, p).to(wide).transpose(1, 2)  # [B, H, T, P]
        # [B, T, G, N] -> [B, H, T, N]: each group repeated for its H / G heads
        b, c = (y.reshape(bsz, t, g, n).to(wide).repeat_interleave(heads // g, dim=2).transpose(1, 2) for y in (b, c))
        dt = F.softplus(dt.to(wide) + self.dt_bias.to(wide)).transpose(1, 2)  # [B, H, T]
        a = -self.A_log.to(wide).exp()
        start = torch.zeros_like(recurrent) if fresh else recurrent
        if t == 1:
            y, final = ssd_step(xs[:, :, 0], dt[..., 0], a, b[:, :, 0], c[:, :, 0], start)
            y = y[:, :, None]
        else:
            y, final = ssd_chunked(xs, dt, a, b, c, start, self.chunk)
        recurrent.copy_(final)
        y = y + self.D.to(wide)[:, None, None] * xs  # the D skip
        y = self.norm(y.transpose(1, 2).reshape(bsz, t, self.inner), z)
        return self.out_proj(y)
