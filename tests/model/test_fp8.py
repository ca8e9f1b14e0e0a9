"""FP8 weights: quantization against float references with stated bounds, DeepSeek-shaped block scales, the
scaled GEMM against its dequantized form, and whole models that hold FP8 matrices."""

from __future__ import annotations

import pytest
import torch

from tfcalc.calc.params import count_params
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.model import build_model
from tfcalc.model.fp8 import (
    DEQUANTIZED,
    E4M3_MAX,
    SCALED_MM,
    FP8Linear,
    FP8Weight,
    dequantize_activation,
    dequantize_weight,
    fp8_gemms,
    native_gemm_works,
    quantize_activation,
    quantize_block,
    quantize_weight,
    scaled_gemm,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize("block", [False, True], ids=["per-tensor", "block"])
def test_quantization_error_within_e4m3_rounding(block: bool) -> None:
    """Each element rounds to E4M3 in units of its scale: relative error <= 2^-4 (3 mantissa bits, round to
    nearest) above the smallest normal 2^-6, absolute <= 2^-10 (half the subnormal step 2^-9) below it; the
    largest magnitude of each tensor or block maps to 448 exactly."""
    torch.manual_seed(0)
    w = torch.randn(300, 200, dtype=torch.float64) * torch.logspace(-3, 1, 200, dtype=torch.float64)
    q, scale = quantize_weight(w, block)
    units = w / dequantize_weight(torch.ones_like(q, dtype=torch.float64), scale, block, torch.float64)
    err = (units - q.double()).abs()
    assert (err <= torch.maximum(units.abs() * 2**-4, torch.full_like(units, 2**-10)) * (1 + 1e-9)).all()
    assert q.double().abs().max() == E4M3_MAX
    relative = float((dequantize_weight(q, scale, block, torch.float64) - w).norm() / w.norm())
    assert relative < 0.03  # measured 0.026 for both on this input (Frobenius)


def test_block_scales_are_shaped_like_deepseek_weight_scale_inv() -> None:
    """[ceil(N/128), ceil(K/128)] fp32, one amax/448 per 128x128 block (README_WEIGHTS.md), K blocks padded
    with 1.0 to a multiple of 4 for cuBLAS."""
    torch.manual_seed(0)
    w = torch.randn(300, 200)
    q, scale = quantize_weight(w, block=True)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (300, 200)
    assert scale.dtype == torch.float32 and scale.shape == (3, 4)
    assert scale[:, 2:].eq(1.0).all()
    assert scale[1, 1] == pytest.approx(float(w[128:256, 128:200].abs().max()) / 448)
    assert scale[2, 0] == pytest.approx(float(w[256:300, 0:128].abs().max()) / 448)
    deepseek_like = quantize_weight(torch.randn(7, 512, 7168), block=True)[1]  # a stack of 7 experts [N, K]
    assert deepseek_like.shape == (7, 4, 56)


@pytest.mark.parametrize("block", [False, True], ids=["per-token", "per-token-and-128"])
def test_activations_quantize_per_token(block: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 300) * torch.tensor([1e-3, 1.0, 10.0, 100.0, 0.0])[:, None]
    q, scale = quantize_activation(x, block)
    assert scale.shape == ((5, 3) if block else (5, 1))
    back = dequantize_activation(q, scale, block, torch.float32)
    assert ((back - x).abs() <= x.abs() * 2**-4 + 1e-9 + (scale.amax(-1, keepdim=True) * 2**-10)).all()
    assert back[4].eq(0).all()  # an all-zero token stays zero (scale clamped, not divided by zero)


@pytest.mark.parametrize("block", [False, True], ids=["per-tensor", "block"])
def test_dequantized_gemm_is_the_float_gemm_of_the_dequantized_operands(block: bool) -> None:
    """The CPU (dequantized) path is exactly x_q W_q^T in the compute dtype; against the unquantized float GEMM
    it is off by the FP8 rounding of both operands: measured 3.7 % (Frobenius) on Gaussian data, bound 6 %."""
    torch.manual_seed(0)
    w, x = torch.randn(256, 384, dtype=torch.float64), torch.randn(7, 384, dtype=torch.float64)
    fp8 = FP8Weight(w, block, torch.float64)
    fp8.gemm = DEQUANTIZED
    xq, xs = quantize_activation(x, block)
    expected = dequantize_activation(xq, xs, block, torch.float64) @ fp8.dequantized().t()
    torch.testing.assert_close(fp8.linear(x), expected, atol=1e-12, rtol=1e-12)
    exact = x @ w.t()
    assert float((fp8.linear(x) - exact).norm() / exact.norm()) < 0.06


def test_scaled_mm_equals_the_dequantized_gemm_where_it_runs() -> None:
    """The RowWise scaled_mm recipe (torch runs it on the CPU too, as a reference loop) gives the dequantized
    product; the model never picks it on the CPU, where it would time a reference loop."""
    torch.manual_seed(0)
    w, x = torch.randn(256, 384), torch.randn(7, 384)
    wq, ws = quantize_weight(w, False)
    xq, xs = quantize_activation(x, False)
    expected = dequantize_activation(xq, xs, False, torch.float32) @ dequantize_weight(wq, ws, False, torch.float32).t()
    try:
        got = scaled_gemm(xq, xs, wq, ws, False, torch.float32)
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"torch.nn.functional.scaled_mm RowWise does not run on this CPU: {exc}")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    assert not native_gemm_works(CPU, False, torch.float32)
    assert FP8Weight(w, False, torch.float32).gemm == DEQUANTIZED


def test_unaligned_shapes_fall_back_to_dequantizing(monkeypatch) -> None:
    monkeypatch.setattr("tfcalc.model.fp8.native_gemm_works", lambda *args: True)  # as on an H100
    assert FP8Weight(torch.randn(256, 256), False, torch.float32).gemm == SCALED_MM
    assert FP8Weight(torch.randn(300, 200), False, torch.float32).gemm == DEQUANTIZED  # 300 % 16 != 0
    assert FP8Weight(torch.randn(256, 192), True, torch.float32).gemm == DEQUANTIZED  # 192 % 128 != 0


@pytest.mark.parametrize("fmt", ["fp8", "fp8_block"])
@pytest.mark.parametrize("preset", ["llama3-70b", "deepseek-v3"])
def test_fp8_model_holds_fp8_matrices_and_stays_close_to_float(make_spec, preset: str, fmt: str) -> None:
    """Every attention/FFN/expert matrix becomes FP8 (routers, norms, embedding and lm_head stay in the compute
    dtype). Against the float model whose weights were quantized, over prefill and decode, the logits differ by
    2 % (Frobenius, relative; measured 1.9-2.1 % over 5 seeds) for the dense model, bound 5 %; by 3-9 % for
    DeepSeek-V3, whose top-2 routing flips where FP8 rounding reorders two near-tied experts, bound 15 %."""
    import copy

    torch.manual_seed(0)
    spec = make_spec(preset)
    reference = build_model(spec)
    tokens = torch.randint(0, spec.vocab_size, (2, 10))
    model = copy.deepcopy(reference)
    for block in model.layers:
        quantize_block(block, fmt)
    built = build_model(spec, weights_dtype=fmt)  # what the profiler builds: experts drawn straight into FP8
    assert {type(m).__name__ for m in built.modules()} == {type(m).__name__ for m in model.modules()}
    assert sum(b.nbytes for b in built.buffers()) == sum(b.nbytes for b in model.buffers())
    fp8 = [m for m in model.modules() if isinstance(m, FP8Weight)]
    linears = [m for m in model.modules() if isinstance(m, FP8Linear)]
    assert fp8 and all(lin.weight in fp8 for lin in linears)
    assert {type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)} == {"Linear"}
    plain = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert all(n.endswith(("router", "lm_head")) for n in plain), plain
    assert fp8_gemms(model) == DEQUANTIZED  # on the CPU
    for m in (reference, model):
        m.setup_caches(batch=2, max_len=16)
    with torch.inference_mode():
        expected = reference.prefill(tokens)
        got = torch.cat([model.prefill(tokens[:, :6]), *(model.decode_step(tokens[:, i:i + 1]) for i in range(6, 10))],
                        dim=1)
    assert float((got - expected).norm() / expected.norm()) < (0.15 if spec.moe else 0.05)


def test_fp8_weight_bytes_equal_the_calculator(make_spec) -> None:
    """The FP8 model's quantized bytes (E4M3 + fp32 block scales) equal `tfcalc memory`'s fp8_block count for the
    same components, at widths that are multiples of 512 (DeepSeek-V3's own are)."""
    from tfcalc.calc.memory import weights_bytes

    spec = make_spec("llama3-70b").with_overrides(hidden_size=512, intermediate_size=1024, num_attention_heads=4,
                                                  num_kv_heads=1, head_dim=128)
    model = build_model(spec, layers=2, weights_dtype="fp8_block")
    held = sum(m.q.nbytes + m.scale.nbytes for m in model.modules() if isinstance(m, FP8Weight))
    counts = count_params(model.spec)
    precision = parse_weight_precision("fp8_block")
    quantized = sum(count_params(model.spec).total[c].matrix for c in ("attention", "mlp"))
    assert held == get_dtype("fp8_block").bytes_for(quantized)
    assert weights_bytes(counts, precision) > held  # the calculator adds embedding, lm_head and 16-bit vectors


@pytest.mark.parametrize("block", [False, True])
def test_a_shard_keeps_its_slice_and_the_matching_scales(block: bool) -> None:
    """A rank's rows / columns / experts of a matrix quantized whole dequantize to exactly the same slice of the
    whole matrix's dequantized weight (brute force), with the same per-tensor scale or the kept blocks' scales;
    a row-parallel pair of block-scaled column halves sums to the whole product (fp64: the 1x128 activation groups
    are the same), and column-parallel rows give the whole product's columns (to fp64 rounding)."""
    torch.manual_seed(0)
    w = torch.randn(3, 448, 300, dtype=torch.float64)  # a partial last block in both dimensions
    stack = FP8Weight(w, block, torch.float64)
    full = stack.dequantized()
    rows = torch.cat([torch.arange(128, 256), torch.arange(384, 448)])  # two runs, the last to the edge
    cols = torch.arange(128, 300)
    part = stack.select(rows, cols, slice(1, 3), "experts.w_in")
    assert torch.equal(part.dequantized(), full[1:3][:, rows][:, :, cols])
    if block:
        assert part.scale.shape == (2, 2, 4)  # blocks 1 and 3 of the rows; 2 column blocks padded to 4
        assert torch.equal(part.scale[..., :2], stack.scale[1:3][:, [1, 3]][:, :, 1:3])
    else:
        assert torch.equal(part.scale, stack.scale[1:3])
    matrix = FP8Weight(torch.randn(256, 512, dtype=torch.float64), block, torch.float64)
    x = torch.randn(5, 512, dtype=torch.float64)
    whole = matrix.linear(x)
    halves = [torch.arange(0, 256), torch.arange(256, 512)]
    # the same products and sums; only the BLAS kernel's blocking, which varies with the CPU and the width, may
    # order the fp64 sums differently
    torch.testing.assert_close(torch.cat([matrix.select(rows=torch.arange(0, 128)).linear(x),
                                          matrix.select(rows=torch.arange(128, 256)).linear(x)], dim=-1), whole,
                               rtol=1e-12, atol=1e-12)
    summed = sum(matrix.select(cols=c).linear(x[:, c]) for c in halves)
    if block:
        torch.testing.assert_close(summed, whole, rtol=1e-12, atol=1e-12)
    else:  # each half quantizes its activations with its own per-token amax (as vLLM's dynamic per-token does)
        assert not torch.allclose(summed, whole, rtol=1e-12, atol=1e-12)
        assert float((summed - whole).norm() / whole.norm()) < 0.05


def test_a_block_scaled_slice_off_the_blocks_is_refused_in_one_line() -> None:
    from tfcalc.errors import UsageError

    weight = FP8Weight(torch.randn(256, 256), True, torch.float32)
    for rows, cols, message in [(torch.arange(64, 192), None, "attention.wo would keep rows 64..192 (128 wide) of 256"),
                                (None, torch.arange(0, 96), "attention.wo would keep columns 0..96 (96 wide) of 256")]:
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
            weight.select(rows, cols, name="attention.wo")
        assert "\n" not in str(err.value)
    assert FP8Weight(torch.randn(256, 256), False, torch.float32).select(rows=torch.arange(64, 100)).shape == (36, 256)
