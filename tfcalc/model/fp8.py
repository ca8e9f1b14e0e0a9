"""FP8 (E4M3) weights with per-tensor or 128x128 block scales, and GEMMs with activations quantized per token.

Formats (``tfcalc.dtypes``): ``fp8_e4m3`` keeps one fp32 scale per weight matrix (Llama-3.3-70B-FP8-style
checkpoints); ``fp8_block`` one fp32 scale per 128x128 block, shaped like DeepSeek-V3's ``weight_scale_inv``
[ceil(N/128), ceil(K/128)] (README_WEIGHTS.md). A scale is the dequantisation multiplier: w = q x scale, with
scale = amax / 448 (E4M3's largest finite value) over the tensor or block.

Activations are quantized on the fly: per token (one scale per row) against per-tensor weights, per token and
128-column group (DeepSeek-V3's 1x128 activation tiles) against block weights. The GEMM then runs as

- ``scaled_mm``: ``torch.nn.functional.scaled_mm`` (torch's public FP8 GEMM) with RowWise x RowWise scales, or
  BlockWise1x128 x BlockWise128x128 (the "DeepSeek recipe", cuBLASLt >= 12.9 on SM90 only); the layouts follow
  aten/src/ATen/native/cuda/ScaledBlas.cpp: A [M, K] row-major with 1x128 scales M-major (strides 1, M), B = W^T
  column-major with 128x128 scales [round_up(K/128, 4), N/128] of strides (1, round_up(K/128, 4)), M padded to
  a multiple of 4.
- ``dequantized``: where the device has no such kernel (the CPU, GPUs before SM89, block scales off SM90, or
  shapes the kernels refuse), the same quantized activations and weights are dequantized to the compute dtype
  and multiplied
  there: numerically the scaled GEMM (up to summation order), but reading the FP8 weight and writing and reading a
  compute-dtype copy. Rows say which ran.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfcalc.errors import UsageError

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # largest finite float8_e4m3fn (OCP FP8 spec; torch.finfo(torch.float8_e4m3fn).max)
BLOCK = 128
SCALED_MM, DEQUANTIZED = "scaled_mm", "dequantized"
FORMATS = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_block": "fp8_block"}  # --weights-dtype -> dtypes name


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def quantize_weight(w: Tensor, block: bool) -> tuple[Tensor, Tensor]:
    """w [..., N, K] -> (q E4M3 [..., N, K], scale fp32): per matrix [...], or per block [..., Nb, round_up(Kb, 4)]
    (the K-block columns past ceil(K/128) hold 1.0: cuBLAS wants 16-byte aligned scale rows)."""
    wf = w.float()
    if not block:
        scale = (wf.abs().amax(dim=(-2, -1)) / E4M3_MAX).clamp(min=1e-12)
        return (wf / scale[..., None, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale
    n, k = w.shape[-2:]
    nb, kb = _ceil(n, BLOCK), _ceil(k, BLOCK)
    padded = F.pad(wf, (0, kb * BLOCK - k, 0, nb * BLOCK - n))
    blocks = padded.unflatten(-1, (kb, BLOCK)).unflatten(-3, (nb, BLOCK))  # [..., Nb, 128, Kb, 128]
    scale = (blocks.abs().amax(dim=(-3, -1)) / E4M3_MAX).clamp(min=1e-12)  # [..., Nb, Kb]
    q = (blocks / scale[..., :, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    q = q.flatten(-4, -3).flatten(-2, -1)[..., :n, :k].contiguous()
    return q, F.pad(scale, (0, -kb % 4), value=1.0).contiguous()


def dequantize_weight(q: Tensor, scale: Tensor, block: bool, dtype: torch.dtype) -> Tensor:
    """The inverse of :func:`quantize_weight`: q x scale in ``dtype`` (each block times its own scale)."""
    if not block:
        return (q.float() * scale[..., None, None]).to(dtype)
    n, k = q.shape[-2:]
    nb, kb = _ceil(n, BLOCK), _ceil(k, BLOCK)
    blocks = F.pad(q.float(), (0, kb * BLOCK - k, 0, nb * BLOCK - n)).unflatten(-1, (kb, BLOCK))
    blocks = blocks.unflatten(-3, (nb, BLOCK)) * scale[..., :kb, None].unsqueeze(-3)  # [.., Nb, 128, Kb, 128]
    return blocks.flatten(-4, -3).flatten(-2, -1)[..., :n, :k].to(dtype)


def quantize_activation(x: Tensor, block: bool) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (E4M3 [M, K], fp32 scale [M, 1] per token, or [M, ceil(K/128)] per token and 128 columns)."""
    xf = x.float()
    if not block:
        scale = (xf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=1e-12)
        return (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale
    m, k = x.shape
    kb = _ceil(k, BLOCK)
    groups = F.pad(xf, (0, kb * BLOCK - k)).view(m, kb, BLOCK)
    scale = (groups.abs().amax(dim=-1) / E4M3_MAX).clamp(min=1e-12)  # [M, Kb]
    q = (groups / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).view(m, kb * BLOCK)[:, :k]
    return q, scale


def dequantize_activation(q: Tensor, scale: Tensor, block: bool, dtype: torch.dtype) -> Tensor:
    if not block:
        return (q.float() * scale).to(dtype)
    return (q.float() * scale.repeat_interleave(BLOCK, dim=-1)[:, :q.shape[-1]]).to(dtype)


def scaled_gemm(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, block: bool, out_dtype: torch.dtype,
                bias: Tensor | None = None) -> Tensor:
    """y [M, N] = (xq x_scale) (wq w_scale)^T through ``torch.nn.functional.scaled_mm`` (layouts: module docstring).
    ``w_scale``: per-tensor scalar, or the padded block scales of :func:`quantize_weight`."""
    m, n = xq.shape[0], wq.shape[0]
    if not block:
        ones = torch.ones(1, n, dtype=torch.float32, device=wq.device)
        y = F.scaled_mm(xq, wq.t(), x_scale.contiguous(), F.ScalingType.RowWise, ones * w_scale,
                        F.ScalingType.RowWise, output_dtype=out_dtype)
    else:
        pad = -m % 4
        if pad:
            xq = torch.cat([xq, torch.zeros(pad, xq.shape[1], dtype=xq.dtype, device=xq.device)])
            x_scale = torch.cat([x_scale, torch.ones(pad, x_scale.shape[1], device=x_scale.device)])
        y = F.scaled_mm(xq, wq.t(), x_scale.t().contiguous().t(), F.ScalingType.BlockWise1x128, w_scale.t(),
                        F.ScalingType.BlockWise128x128, output_dtype=out_dtype)[:m]
    return y if bias is None else y + bias


def select(w: Tensor, rows: Tensor | None = None, cols: Tensor | None = None,
           stack: slice | None = None) -> Tensor:
    """Matrices ``stack`` of w [E, N, K] (or w [N, K]), their output rows ``rows`` and input columns ``cols``
    (index tensors), contiguous: a rank's part of a matrix (tfcalc.model.parallel) or of its block scales."""
    if stack is not None:
        w = w[stack]
    if rows is not None:
        w = w[..., rows.to(w.device), :]
    if cols is not None:
        w = w[..., cols.to(w.device)]
    return w.contiguous()


def whole_blocks(index: Tensor, size: int, name: str, what: str) -> Tensor:
    """The 128-blocks that indices ``index`` (of ``size`` rows or columns) cover, when they are whole blocks: each
    run of consecutive indices starts on a block boundary and ends on one, the last run possibly at ``size`` (a
    partial last block). Else UsageError naming the matrix and the widths: a rank cannot hold part of a block with
    the block's scale. vLLM refuses such shards the same way: "Weight output_partition_size = 576 is not divisible
    by weight quantization block_n = 128" (input_size_per_partition / block_k for row-parallel layers;
    ``validate_fp8_block_shape``, vllm/model_executor/layers/quantization/utils/fp8_utils.py; for experts "The
    output_size of gate's and up's weight = 320 is not divisible by ...", quantization/fp8.py)."""
    idx = index.tolist()
    breaks = [0, *(i for i in range(1, len(idx)) if idx[i] != idx[i - 1] + 1), len(idx)]
    blocks: list[int] = []
    for a, b in zip(breaks, breaks[1:], strict=False):
        first, stop = idx[a], idx[b - 1] + 1
        if first % BLOCK or (stop % BLOCK and not (b == len(idx) and stop == size)):
            raise UsageError(f"fp8_block: {name} would keep {what} {first}..{stop} ({stop - first} wide) of {size}, "
                             f"not whole {BLOCK}x{BLOCK} scale blocks; choose a --tp / --ep whose slices are "
                             f"multiples of {BLOCK}, or fp8 (per-tensor scales)")
        blocks.extend(range(first // BLOCK, _ceil(stop, BLOCK)))
    return torch.tensor(blocks, dtype=torch.long)


@functools.cache
def native_gemm_works(device: torch.device, block: bool, out_dtype: torch.dtype) -> bool:
    """Whether this GPU runs :func:`scaled_gemm` for the recipe (probed once on a 256 x 256 x 256 product,
    checked against the dequantized product). Never on the CPU: torch runs the RowWise recipe there too, but as
    a reference loop (measured 1.4 s a decode step for 2 llama3.2-1b layers, slower than dequantizing), so
    timing it would say nothing about FP8 GEMMs; the CPU dequantizes, and the tests call scaled_gemm directly."""
    if device.type != "cuda":
        return False
    try:
        generator = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(8, 256, generator=generator).to(device)
        w = torch.randn(256, 256, generator=generator).to(device)
        xq, xs = quantize_activation(x, block)
        wq, ws = quantize_weight(w, block)
        y = scaled_gemm(xq, xs, wq, ws, block, out_dtype).float()
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
    expected = dequantize_activation(xq, xs, block, torch.float32) @ dequantize_weight(wq, ws, block, torch.float32).t()
    return bool(torch.allclose(y, expected, rtol=2e-2, atol=2e-2 * float(expected.abs().max())))


class FP8Weight(nn.Module):
    """One FP8 weight matrix [N, K], or a stack of them [E, N, K] (MoE experts), with its scales (buffers).

    ``linear(x, index)`` computes x W^T (of matrix ``index`` of a stack) by :data:`SCALED_MM` where the device
    runs the recipe and the shape suits the kernel (N and K multiples of 16; of 128 for block scales), else by
    :data:`DEQUANTIZED`; ``gemm`` says which.
    """

    def __init__(self, weight: Tensor | None, block: bool, compute_dtype: torch.dtype,
                 quantized: tuple[Tensor, Tensor] | None = None) -> None:
        super().__init__()
        self.block, self.compute_dtype = block, compute_dtype
        q, scale = quantized if quantized is not None else quantize_weight(weight, block)
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        n, k = q.shape[-2:]
        aligned = (n % BLOCK == 0 and k % BLOCK == 0) if block else (n % 16 == 0 and k % 16 == 0)
        self.gemm = SCALED_MM if aligned and native_gemm_works(q.device, block, compute_dtype) else DEQUANTIZED

    @classmethod
    def random_stack(cls, shape: tuple[int, int, int], bound: float, block: bool,
                     compute_dtype: torch.dtype) -> FP8Weight:
        """A stack of E random matrices uniform in (-bound, bound), drawn and quantized one matrix at a time:
        the compute-dtype stack (22 GB for one DeepSeek-V3 layer's 256 bf16 experts) never exists."""
        e, n, k = shape
        q = torch.empty(shape, dtype=E4M3)
        scale = torch.empty((e,) if not block else (e, _ceil(n, BLOCK), 4 * _ceil(_ceil(k, BLOCK), 4)),
                            dtype=torch.float32)
        for i in range(e):
            q[i], scale[i] = quantize_weight(torch.empty(n, k, dtype=compute_dtype).uniform_(-bound, bound), block)
        return cls(None, block, compute_dtype, (q, scale))

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def select(self, rows: Tensor | None = None, cols: Tensor | None = None, stack: slice | None = None,
               name: str = "weight") -> FP8Weight:
        """A rank's part (matrices ``stack``, rows ``rows``, columns ``cols``) of the matrix quantized whole, with
        its scales, as serving engines load a shard of an FP8 checkpoint: the same per-matrix scale, or the scales
        of the blocks kept (:func:`whole_blocks`; refused unless the slice is whole blocks). Its dequantized
        weight is the same slice of the full matrix's, exactly."""
        q = select(self.q, rows, cols, stack)
        scale = self.scale if stack is None else self.scale[stack]
        if self.block:
            n, k = self.q.shape[-2:]
            block_rows = None if rows is None else whole_blocks(rows, n, name, "rows")
            block_cols = None if cols is None else whole_blocks(cols, k, name, "columns")
            scale = select(scale[..., :_ceil(k, BLOCK)], block_rows, block_cols)
            scale = F.pad(scale, (0, -scale.shape[-1] % 4), value=1.0)  # the cuBLAS row alignment, as quantized
        return FP8Weight(None, self.block, self.compute_dtype, (q, scale.contiguous()))

    def dequantized(self, dtype: torch.dtype | None = None) -> Tensor:
        return dequantize_weight(self.q, self.scale, self.block, dtype or self.compute_dtype)

    def linear(self, x: Tensor, index: int | None = None, bias: Tensor | None = None) -> Tensor:
        """x [..., K] -> [..., N] in x's dtype."""
        q = self.q if index is None else self.q[index]
        scale = self.scale if index is None else self.scale[index]
        shape = x.shape
        xq, x_scale = quantize_activation(x.reshape(-1, shape[-1]), self.block)
        if self.gemm == SCALED_MM:
            y = scaled_gemm(xq, x_scale, q, scale, self.block, x.dtype, bias)
        else:
            y = F.linear(dequantize_activation(xq, x_scale, self.block, x.dtype),
                         dequantize_weight(q, scale, self.block, x.dtype), bias)
        return y.view(*shape[:-1], q.shape[-2])


class FP8Linear(nn.Module):
    """nn.Linear with an :class:`FP8Weight` (the bias stays in the compute dtype)."""

    def __init__(self, linear: nn.Linear, block: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = FP8Weight(linear.weight.detach(), block, linear.weight.dtype)
        self.bias = linear.bias

    def forward(self, x: Tensor) -> Tensor:
        return self.weight.linear(x, bias=self.bias)


def stacked_linear(x: Tensor, weight: Tensor | FP8Weight, index: int, bias: Tensor | None = None) -> Tensor:
    """x W[index]^T for a stack of expert matrices, plain or FP8."""
    if isinstance(weight, FP8Weight):
        return weight.linear(x, index, bias)
    return F.linear(x, weight[index], bias)


KEEP = ("router", "shared_gate")  # routers stay in the compute dtype (DeepSeek-V3's gate, Llama FP8 has none)


def quantize_block(block: nn.Module, weights_dtype: str) -> None:
    """Replace the matrices of one decoder block by FP8 in place: every attention and FFN Linear and the stacked
    experts; routers, norms and biases keep the compute dtype (as DeepSeek-V3's and Llama-3.x-FP8 checkpoints
    do; the embedding and lm_head, outside the blocks, too). MLA keeps W_kvb in the compute dtype as well for the
    absorbed decode (vLLM's W_UK / W_UV). Each matrix is quantized as soon as it is visited, so the peak is one
    compute-dtype matrix above the FP8 model."""
    from tfcalc.model.mla import MLAttention

    block_scales = FORMATS[weights_dtype] == "fp8_block"
    for module in list(block.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and name not in KEEP:
                setattr(module, name, FP8Linear(child, block_scales))
        for name in ("w_in", "w_out"):  # expert stacks built in the compute dtype (MoE(spec) without fp8)
            stack = getattr(module, name, None)
            if isinstance(stack, nn.Parameter) and stack.dim() == 3:
                delattr(module, name)
                fp8 = FP8Weight(stack.detach(), block_scales, stack.dtype)
                del stack
                setattr(module, name, fp8)
        if isinstance(module, MLAttention) and isinstance(module.wkv_b, FP8Linear):
            module.absorb_weight = module.wkv_b.weight.dequantized()


def fp8_gemms(model: nn.Module) -> str | None:
    """How the FP8 GEMMs of a model run: "scaled_mm", "dequantized", or "scaled_mm + dequantized" (mixed shapes);
    None when nothing is FP8."""
    kinds = sorted({m.gemm for m in model.modules() if isinstance(m, FP8Weight)}, reverse=True)
    return " + ".join(kinds) if kinds else None
