"""Storage formats: bits per element *including* scale overhead, each with its source.

A block-scaled format stores ``element_bits`` per value plus ``scale_bits`` once per block of
``block_size`` values, so bits/element = element_bits + scale_bits / block_size. Per-tensor scales
(one fp32 per tensor, as FP8 with a per-tensor scale or NVFP4's second-level scale) add 32 bits per
tensor, under 0.0001 % of any real weight matrix, and are not counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from tfcalc.errors import UsageError

# The parts a parameter count is broken into (tfcalc.calc.params); weight formats may be chosen per part.
PARAM_COMPONENTS = ("embedding", "attention", "mlp", "experts", "shared_experts", "router", "norms", "lm_head",
                    "encoder")
# The formats GPU datasheets quote dense tensor throughput for (GPU presets' dense_tflops keys).
FLOP_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")


@dataclass(frozen=True)
class DType:
    name: str
    element_bits: int
    block_size: int = 1
    scale_bits: int = 0
    quantized: bool = False
    description: str = ""
    source: str = ""
    # (output, input) weights one tensor-parallel slice of a matrix must hold whole, where engines refuse a slice that
    # cuts a block of the checkpoint's scales (vLLM validate_fp8_block_shape, GPTQ/AWQ group alignment); None where
    # the format has no such tiles or engines pad the slice instead (MXFP4, NVFP4)
    whole_blocks: tuple[int, int] | None = None

    @property
    def bits_per_element(self) -> Fraction:
        """element_bits + scale_bits / block_size."""
        return Fraction(self.element_bits) + Fraction(self.scale_bits, self.block_size)

    def bytes_for(self, elements: int) -> Fraction:
        """Exact (possibly fractional) bytes for ``elements`` values; round once, at the total."""
        return elements * self.bits_per_element / 8


def _int_group(bits: int, group_size: int, zero_point: bool = True) -> DType:
    """int4-gN / int8-gN: ``bits``-bit integers, an fp16 scale and a packed ``bits``-bit zero point per group;
    int4-gN-sym / int8-gN-sym: symmetric, the scale alone (compressed-tensors stores no zero point for them)."""
    if not zero_point:
        return DType(
            f"int{bits}-g{group_size}-sym", bits, group_size, 16, True,
            f"{bits}-bit integer, symmetric: one 16-bit scale per {group_size} weights, no zero point",
            "compressed-tensors pack-quantized layout (weight_packed, weight_scale per group; weight_zero_point "
            "only for symmetric: false), e.g. moonshotai/Kimi-K2-Thinking's int4 experts", whole_blocks=(1, group_size),
        )
    return DType(
        f"int{bits}-g{group_size}", bits, group_size, 16 + bits, True,
        f"{bits}-bit integer, one fp16 scale and one packed {bits}-bit zero point per {group_size} weights",
        f"AutoGPTQ/AutoAWQ checkpoint layout: qweight ({bits}-bit packed), scales fp16 and qzeros ({bits}-bit "
        "packed) per group of group_size input channels", whole_blocks=(1, group_size),
    )


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("fp32", 32, description="IEEE 754 binary32", source="IEEE 754-2008"),
        DType("bf16", 16, description="bfloat16",
              source="Google Brain bfloat16 format (8-bit exponent, 7-bit mantissa)"),
        DType("fp16", 16, description="IEEE 754 binary16", source="IEEE 754-2008"),
        DType("fp8_e4m3", 8, quantized=True, description="FP8 E4M3 with a per-tensor scale",
              source="Micikevicius et al., FP8 Formats for Deep Learning, arXiv:2209.05433"),
        DType("fp8_e5m2", 8, quantized=True, description="FP8 E5M2 with a per-tensor scale",
              source="Micikevicius et al., FP8 Formats for Deep Learning, arXiv:2209.05433"),
        DType("fp8_block", 8, 128 * 128, 32, True,
              "FP8 E4M3 with one fp32 scale per 128x128 block (DeepSeek-V3 release format)",
              "deepseek-ai/DeepSeek-V3 README_WEIGHTS.md (weight_scale_inv, fp32, per 128x128 block)",
              whole_blocks=(128, 128)),
        DType("int8", 8, quantized=True, description="8-bit integer with per-tensor/per-channel scales (not counted)",
              source="LLM.int8() arXiv:2208.07339; SmoothQuant arXiv:2211.10438"),
        _int_group(4, 128),
        DType("nf4", 4, 64, 32, True,
              "4-bit NormalFloat, one fp32 absmax per 64 weights = 4.5 bits (bitsandbytes, as vLLM holds it)",
              "Dettmers et al., QLoRA, arXiv:2305.14314 (NF4, blocks of 64); vLLM BitsAndBytesModelLoader "
              "_dequantize_dq (a double-quantised absmax is expanded to fp32 at load)"),
        DType("mxfp4", 4, 32, 8, True, "FP4 E2M1, one E8M0 scale per 32 values = 4.25 bits",
              "OCP Microscaling Formats (MX) Specification v1.0, 2023 (block 32, E8M0 shared scale)"),
        DType("mxfp8", 8, 32, 8, True, "FP8 E4M3, one E8M0 scale per 32 values = 8.25 bits",
              "OCP Microscaling Formats (MX) Specification v1.0, 2023 (MXFP8: E4M3 elements, block 32, E8M0 scale)"),
        DType("nvfp4", 4, 16, 8, True,
              "FP4 E2M1, one FP8 E4M3 scale per 16 values (+ one fp32 per tensor) = 4.5 bits",
              "NVIDIA, Introducing NVFP4 for Efficient and Accurate Low-Precision Inference (2025)"),
    )
}

ALIASES: dict[str, str] = {
    "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "float8_e4m3fn": "fp8_e4m3",
    "int4": "int4-g128", "mxfp4-e2m1": "mxfp4",
}

_INT_GROUP = re.compile(r"int([48])-g(\d+)(-sym)?")


def dtype_names() -> list[str]:
    return [*DTYPES, "int4-gN", "int8-gN", "int4-gN-sym", "int8-gN-sym"]


def generic_name(name: str) -> str:
    """A format's name with its group size as N (``int4-g32-sym`` -> ``int4-gN-sym``): the family engines list."""
    return re.sub(r"-g\d+", "-gN", name) if _INT_GROUP.fullmatch(name) else name


def _key(name: str) -> str:
    """A name as looked up: any case, '-' and '_' alike (``fp8-e4m3`` is ``fp8_e4m3``), except in ``int4-gN`` and
    ``int8-gN``."""
    key = name.strip().lower()
    return key if key.startswith(("int4", "int8-")) else key.replace("-", "_")


_ALIAS_KEYS = {_key(alias): name for alias, name in ALIASES.items()}


def get_dtype(name: str) -> DType:
    """Look up a storage format by name or alias; ``int4-gN`` and ``int8-gN`` take a power-of-two group size from 8
    to 8,192 (GPTQ / AWQ use 32-128; a group wider than a matrix's input is per-channel)."""
    key = _key(name)
    key = _ALIAS_KEYS.get(key, key)
    if key in DTYPES:
        return DTYPES[key]
    match = _INT_GROUP.fullmatch(key)
    if match:
        bits, group = int(match.group(1)), int(match.group(2)) if len(match.group(2)) < 8 else 0
        if not (8 <= group <= 8192 and group & (group - 1) == 0):
            raise UsageError(f"invalid dtype '{name}': the int{bits} group size must be a power of two from 8 to "
                             "8,192")
        return _int_group(bits, group, zero_point=match.group(3) is None)
    if key == "fp4":
        raise UsageError("ambiguous dtype 'fp4': use mxfp4 (4.25 bits/element) or nvfp4 (4.5 bits/element)")
    import difflib

    hints = difflib.get_close_matches(key, [*DTYPES, *ALIASES], n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(hints)}?" if hints else ""
    raise UsageError(f"unknown dtype '{name}' (known: {', '.join(dtype_names())}){hint}")


def vector_dtype(matrix_dtype: DType) -> DType:
    """Biases and norm weights are not quantized: they stay 16-bit unless the matrices are fp32/fp16/bf16."""
    return DTYPES["bf16"] if matrix_dtype.quantized else matrix_dtype


# What quantized checkpoints leave in 16 bits unless a format is named for them: the embedding and lm_head (vLLM's
# VocabParallelEmbedding / ParallelLMHead are not LinearBase layers, so Fp8Config, compressed-tensors, GPTQ and AWQ
# give them no quantized method; HF quantization_config lists lm_head in modules_to_not_convert / ignore), the MoE
# router (vLLM models build the gate as ReplicatedLinear(quant_config=None); gpt-oss lists "router"), norms, and a
# multimodal checkpoint's vision encoder (ModelOpt and compressed-tensors checkpoints list vision_tower / the
# projector among the modules not converted).
KEPT_16_BIT = ("embedding", "lm_head", "norms", "router", "encoder")


@dataclass(frozen=True)
class WeightPrecision:
    """A storage format per weight component; components not named use ``default``, except that a quantized
    default leaves ``KEPT_16_BIT`` components in bf16, as quantized checkpoints ship."""

    default: DType
    per_component: tuple[tuple[str, DType], ...] = ()

    def for_component(self, component: str) -> DType:
        named = dict(self.per_component)
        if component in named:
            return named[component]
        if self.default.quantized and component in KEPT_16_BIT:
            return DTYPES["bf16"]
        return self.default

    @property
    def quantized(self) -> bool:
        """Whether any component is stored in a quantized format."""
        return self.default.quantized or any(d.quantized for _, d in self.per_component)

    @property
    def kept_16_bit(self) -> tuple[str, ...]:
        """The components this precision leaves in bf16 only because the default is quantized."""
        named = dict(self.per_component)
        return tuple(c for c in KEPT_16_BIT if c != "norms" and c not in named) if self.default.quantized else ()

    @property
    def label(self) -> str:
        if not self.per_component:
            return self.default.name
        parts = [f"{c}={d.name}" for c, d in self.per_component]
        return ",".join([*parts, f"default={self.default.name}"])


def parse_weight_precision(text: str) -> WeightPrecision:
    """``bf16`` or ``experts=mxfp4,default=bf16`` (keys: the parameter components and ``default``).

    A quantized format leaves the embedding, lm_head, router and norms in bf16 unless named:
    ``default=fp8,lm_head=fp8`` quantizes the lm_head too."""
    if "=" not in text:
        return WeightPrecision(get_dtype(text))
    mapping: dict[str, DType] = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise UsageError(f"invalid weights dtype '{text}': expected component=dtype pairs, e.g. "
                             "experts=mxfp4,default=bf16")
        if key not in (*PARAM_COMPONENTS, "default"):
            raise UsageError(f"invalid weights dtype '{text}': unknown component '{key}' "
                             f"(components: {', '.join(PARAM_COMPONENTS)}, default)")
        mapping[key] = get_dtype(value)
    default = mapping.pop("default", None)
    if default is None:
        raise UsageError(f"invalid weights dtype '{text}': name a default, e.g. {text},default=bf16")
    return WeightPrecision(default, tuple((c, mapping[c]) for c in PARAM_COMPONENTS if c in mapping))
